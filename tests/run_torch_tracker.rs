//! PyTorch's allocator trace tracker under `gpufrag run` (issue 15): the hook's choice and the
//! tracker's translation, end to end. CI has no PyTorch, so tests/python_hook/tracker holds a
//! stand-in torch (version, ABI flag, cpp_extension's include and library paths, the lazy init)
//! with a stand-in `c10/cuda/CUDACachingAllocator.h` (the real header's names and TraceEntry
//! fields) and a stand-in libc10_cuda.so that calls the attached trackers; the hook builds the
//! real python/torch_tracker.cpp against them with the system C++ compiler, loads it and attaches
//! it, and its events go through the real shim (on simcuda) and consumer. The workload
//! (tests/python_hook/tracker/sequence.py) replays a short allocator trace in PyTorch's order;
//! its figures, worked out below from PyTorch's rules, are what the summary must show. The real
//! PyTorch path is checked on the GPU (gpu/validate_tracker.sh, docs/gpu-validation.md).

use gpufrag::event::EventKind;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

use tracker::root;

#[path = "common/tracker.rs"]
mod tracker;

/// The stand-ins' scratch folder (tests/common/tracker.rs) and this test's runs in it.
struct Scratch(tracker::Scratch);

impl std::ops::Deref for Scratch {
    type Target = tracker::Scratch;
    fn deref(&self) -> &tracker::Scratch {
        &self.0
    }
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(tracker::Scratch::new("tracker", name))
    }

    fn cache(&self) -> PathBuf {
        self.dir.join("cache/gpufrag")
    }

    /// `gpufrag run` of the sequence with these extra arguments and environment: (summary, output).
    fn run(&self, tag: &str, extra: &[&str], env: &[(&str, &std::ffi::OsStr)], oom: bool) -> (Value, Output) {
        self.run_mode(tag, extra, env, if oom { "oom" } else { "" }, true)
    }

    /// `gpufrag run` of the sequence in `mode` (its first argument: `oom`, `retry`, `driver_oom`
    /// or none); `quiet` passes `-q` (no live line).
    fn run_mode(&self, tag: &str, extra: &[&str], env: &[(&str, &std::ffi::OsStr)], mode: &str, quiet: bool) -> (Value, Output) {
        let args: Vec<&str> = if mode.is_empty() { Vec::new() } else { vec![mode] };
        self.run_script(tag, extra, env, &root().join("tests/python_hook/tracker/sequence.py"), &args, quiet)
    }

    /// `gpufrag run` of a stand-in torch `script` with its arguments (sequence.py's environment:
    /// `env` adds to it or overrides it).
    fn run_script(
        &self,
        tag: &str,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
        script: &Path,
        args: &[&str],
        quiet: bool,
    ) -> (Value, Output) {
        let bin = Path::new(env!("CARGO_BIN_EXE_gpufrag"));
        let simcuda = bin.with_file_name("simcuda");
        assert!(simcuda.join("libcuda.so.1").exists(), "{} has no libcuda.so.1: build the workspace", simcuda.display());
        let summary = self.dir.join(format!("{tag}.json"));
        let mut cmd = Command::new(bin);
        cmd.arg("run");
        if quiet {
            cmd.arg("-q");
        }
        cmd.args(["--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(extra).arg("--").arg("python3");
        cmd.arg(script).args(args);
        cmd.env("PYTHONPATH", root().join("tests/python_hook/tracker"))
            .env("FAKE_TORCH_LIB", self.dir.join("lib"))
            .env("XDG_CACHE_HOME", self.dir.join("cache"))
            .env("LD_LIBRARY_PATH", &simcuda)
            .env("SIMCUDA_MEM", "64MiB")
            .env("SIMCUDA_RESERVE", "16MiB")
            .env("SIMCUDA_STATE_DIR", self.dir.join("state"))
            .env_remove("CXX");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run gpufrag");
        let text = std::fs::read_to_string(&summary).unwrap_or_else(|e| {
            panic!("no summary: {e}\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        });
        (serde_json::from_str(&text).expect("summary json"), out)
    }

    fn library(&self) -> Option<PathBuf> {
        std::fs::read_dir(self.cache()).ok()?.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "so"))
    }
}

fn notes(s: &Value) -> String {
    s["notes"].as_array().map(|n| n.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n")).unwrap_or_default()
}

/// The sequence's own figures, from PyTorch's rules (tests/python_hook/tracker/sequence.py):
/// segments A (2 MiB, small pool) and B (20 MiB, a 5 MiB request's kLargeBuffer); live blocks A
/// (512 B: the freed 1024 B block, split for a 512 B request), A+1024 (3000 B rounded to 3072)
/// and B (5 MiB). Every free byte is in a segment with a live block: stranded, nothing
/// releasable; the largest free block is B's 15 MiB remainder.
struct Want {
    reserved: u64,
    allocated: u64,
    stranded: u64,
    largest_free_block: u64,
}

const WANT: Want =
    Want { reserved: 22 * MIB, allocated: 512 + 3072 + 5 * MIB, stranded: 22 * MIB - (512 + 3072 + 5 * MIB), largest_free_block: 15 * MIB };

fn assert_tracker_figures(s: &Value, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("trackers=1"), "the tracker was not attached before the first entry: {stdout}\n{s:#}");
    let p = &s["processes"][0];
    assert_eq!(p["level"], "block", "{s:#}");
    assert_eq!(s["exact"], Value::Bool(true), "{s:#}");
    let got = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {s:#}"));
    assert_eq!(got("framework_reserved"), WANT.reserved, "{s:#}");
    assert_eq!(got("allocated"), WANT.allocated, "{s:#}");
    assert_eq!(got("stranded"), WANT.stranded, "{s:#}");
    assert_eq!(got("largest_free_block"), WANT.largest_free_block, "{s:#}");
    assert!(notes(s).contains("PyTorch blocks: trace tracker (event level)"), "{}", notes(s));
}

#[test]
fn built_tracker_brings_every_block_up_to_exit_not_the_teardowns_frees_and_the_run_record_replays_faithfully_in_whatif() {
    let sc = Scratch::new("build");
    let rec = sc.dir.join("run.rec");
    let (s, out) = sc.run("build", &["--torch-tracker=build", "--record", rec.to_str().expect("utf-8 path")], &[], false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_tracker_figures(&s, &out);
    assert!(notes(&s).contains("built in"), "build mode builds before the first allocation: {}", notes(&s));
    assert!(sc.library().is_some(), "the library is cached for the next run");
    // The record holds one BlockAlloc per ALLOC entry, requested size only (the map applies the
    // rules), with the entry's stream; one BlockFree per FREE_COMPLETED (none for FREE_REQUESTED).
    let events = gpufrag::record::read(&rec).expect("the record").events;
    let allocs: Vec<(u64, u64, u64)> =
        events.iter().filter(|e| e.kind() == Some(EventKind::BlockAlloc)).map(|e| (e.size, e.requested, e.stream)).collect();
    assert_eq!(allocs, vec![(0, 1000, 0x5000), (0, 3000, 0x5000), (0, 512, 0x5000), (0, 5 * MIB, 0x5000)]);
    assert_eq!(events.iter().filter(|e| e.kind() == Some(EventKind::BlockFree)).count(), 1);
    let w = Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(["whatif", "--json"]).arg(&rec).output().expect("whatif");
    assert!(w.status.success(), "whatif on the run record: {}", String::from_utf8_lossy(&w.stderr));
    let j: Value = serde_json::from_slice(&w.stdout).expect("whatif json");
    assert_eq!(j["faithful"], Value::Bool(true), "{j:#}");
    assert_eq!((j["check"]["ops_compared"].as_u64(), j["check"]["blocks_compared"].as_u64()), (Some(2), Some(4)), "{j:#}");
    assert_eq!(j["trace"]["peak_reserved"].as_u64(), Some(WANT.reserved), "{j:#}");
    assert_eq!(j["trace"]["requests"].as_u64(), Some(6), "4 allocations, and the free as requested and as reusable: {j:#}");
}

#[test]
fn uncached_auto_run_takes_snapshots_and_builds_in_the_background_for_the_next_run() {
    let sc = Scratch::new("auto");
    let (s, out) = sc.run("first", &[], &[], false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let n = notes(&s);
    assert!(n.contains("PyTorch blocks from snapshots every 1 s; the trace tracker is being built for the next run (cached in"), "{n}");
    assert!(!n.contains("trace tracker (event level)"), "{n}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("trackers=0"), "nothing attached in the first run");
    // The detached build finishes on its own (temp file + rename: never a half-written library).
    let t0 = std::time::Instant::now();
    while sc.library().is_none() {
        assert!(
            t0.elapsed().as_secs() < 120,
            "no library after 2 minutes; log: {:?}",
            std::fs::read_dir(sc.cache()).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (s, out) = sc.run("second", &[], &[], true);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_tracker_figures(&s, &out);
    assert!(!notes(&s).contains("built in"), "the second run loads the cached library: {}", notes(&s));
    // The OOM entry (addr_ = device free, size_ = the request) is the verdict's request and free.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let free: u64 = stdout.split("free=").nth(1).and_then(|t| t.trim().parse().ok()).unwrap_or_else(|| panic!("{stdout}"));
    let o = s["ooms"]
        .as_array()
        .expect("ooms")
        .iter()
        .find(|o| o["op"] == "block_alloc")
        .cloned()
        .unwrap_or_else(|| panic!("no allocator OOM: {s:#}"));
    assert_eq!((o["requested"].as_u64(), o["device_free"].as_u64()), (Some(30 * MIB), Some(free)), "{o:#}");
    assert_eq!(o["verdict"], "fragmentation", "{o:#}");
    assert_eq!((o["stranded"].as_u64(), o["largest_free_block"].as_u64()), (Some(WANT.stranded), Some(WANT.largest_free_block)), "{o:#}");
}

#[test]
fn no_compiler_falls_back_to_snapshots_and_says_why() {
    let sc = Scratch::new("nocc");
    // A PATH with python3 and nothing else: no c++, g++ or clang++.
    let bin = sc.dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    // (the interpreter itself: python3 on PATH may be a shell shim, e.g. pyenv's)
    let py =
        Command::new("python3").args(["-c", "import os, sys; print(os.path.realpath(sys.executable))"]).output().expect("python3").stdout;
    let py = String::from_utf8(py).expect("utf-8");
    std::os::unix::fs::symlink(py.trim(), bin.join("python3")).expect("symlink");
    let (s, out) = sc.run("nocc", &["--torch-tracker=build"], &[("PATH", bin.as_os_str())], false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let n = notes(&s);
    assert!(n.contains("PyTorch blocks from snapshots every 1 s: the trace tracker is unavailable: no C++ compiler"), "{n}");
    assert!(!n.contains("trace tracker (event level)"), "{n}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("trackers=0"));
    assert!(sc.library().is_none());
}

#[test]
fn torch_tracker_off_takes_snapshots_even_when_the_library_is_cached() {
    let sc = Scratch::new("off");
    let (s, out) = sc.run("build", &["--torch-tracker=build"], &[], false);
    assert_tracker_figures(&s, &out);
    let (s, out) = sc.run("off", &["--torch-tracker=off"], &[], false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let n = notes(&s);
    assert!(n.contains("PyTorch blocks from snapshots every 1 s (--torch-tracker=off)"), "{n}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("trackers=0"), "off attaches nothing");
}

/// The tracker's entries carry requested sizes, so the consumer sizes blocks by the process's own
/// `PYTORCH_CUDA_ALLOC_CONF` (read from its environment when the shim connects): under
/// `roundup_power2_divisions:2` the 5 MiB request is rounded to the next half of [4 MiB, 8 MiB),
/// a 6 MiB block (PyTorch's `round_size`), where the defaults give 5 MiB; the other requests are
/// unchanged (1000 B and 512 B round to 512 multiples, 3000 B to 3072 either way).
#[test]
fn regression_tracker_blocks_follow_the_processs_own_alloc_conf() {
    let sc = Scratch::new("conf");
    let conf = std::ffi::OsStr::new("roundup_power2_divisions:2");
    let (s, out) = sc.run("conf", &["--torch-tracker=build"], &[("PYTORCH_CUDA_ALLOC_CONF", conf)], false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let p = &s["processes"][0];
    let got = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {s:#}"));
    assert_eq!(got("allocated"), 512 + 3072 + 6 * MIB, "{s:#}");
    assert_eq!(got("stranded"), 22 * MIB - (512 + 3072 + 6 * MIB), "{s:#}");
    assert_eq!(got("largest_free_block"), 14 * MIB, "{s:#}");
    assert!(notes(&s).contains("PyTorch blocks: trace tracker (event level)"), "{}", notes(&s));
}

mod export_support;
mod tool_support;

#[path = "common/story.rs"]
mod story;
use story::{analyze, assert_replays};

/// One OOM story in every output: the summary, the live line (the verdict printed on stderr), the
/// record's replay (`analyze`), the report, Prometheus and OTLP: `ooms` OOMs and `retries` retries.
fn assert_every_output(sc: &Scratch, mode: &str, ooms: u64, retries: u64) {
    let record = sc.dir.join(format!("{mode}.gpufrag"));
    let (s, out) = sc.run_mode(mode, &["--torch-tracker=build", "--record", record.to_str().expect("utf-8")], &[], mode, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("trackers=1"), "the tracker was attached: {s:#}");
    let counts = (s["ooms"].as_array().map_or(0, Vec::len) as u64, s["retries"].as_u64().unwrap_or(u64::MAX));
    assert_eq!(counts, (ooms, retries), "summary (OOMs, retries): {s:#}\n{stderr}");
    assert_eq!(s["processes"][0]["retries"].as_u64(), Some(retries), "{s:#}");
    assert_eq!(stderr.matches("[gpufrag] OOM in pid").count() as u64, ooms, "the live line: {stderr}");
    assert_replays(&s, &record);
    // The report of the record.
    let html = sc.dir.join(format!("{mode}.html"));
    let rep = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("report").arg(&record).arg("-o").arg(&html).output().expect("report");
    assert!(rep.status.success(), "{}", String::from_utf8_lossy(&rep.stderr));
    let html = std::fs::read_to_string(&html).expect("report html");
    assert_eq!(html.matches("<tr data-verdict=").count() as u64, ooms, "report OOM rows");
    assert!(
        html.contains(&format!("not OOMs): {retries}")),
        "report retries: {}",
        &html[html.find("id=\"retries\"").unwrap_or(0)..][..300]
    );
    // The exporters.
    let (prom, otlp) = export_support::exported(&record, &sc.dir);
    assert_eq!(
        (export_support::prom_sum(&prom, "gpufrag_ooms_total"), export_support::prom_sum(&prom, "gpufrag_alloc_retries_total")),
        (ooms, retries),
        "{prom}"
    );
    if let Some(got) = otlp {
        assert_eq!(
            (export_support::otlp_sum(&got, "gpufrag.ooms"), export_support::otlp_sum(&got, "gpufrag.alloc_retries")),
            (ooms, retries),
            "OTLP"
        );
    }
}

/// Issue 22: a cudaMalloc that fails once, after which PyTorch releases its cache and the retry
/// succeeds (`memory_stats()`: `num_alloc_retries` 1, `num_ooms` 0) was an OOM in the summary and
/// the live line, and not in Prometheus. One rule: 0 OOMs and 1 retry in every output.
#[test]
fn regression_a_recovered_allocation_is_one_retry_and_no_oom_in_every_output() {
    let sc = Scratch::new("retry");
    assert_every_output(&sc, "retry", 0, 1);
}

/// Issue 22: a failed cudaMalloc nobody reports or retries was 1 OOM in the summary and the live
/// line and 0 in Prometheus. One rule: 1 OOM in every output, no retry.
#[test]
fn regression_an_unrecovered_driver_failure_is_one_oom_in_every_output() {
    let sc = Scratch::new("driver-oom");
    assert_every_output(&sc, "driver_oom", 1, 0);
}

/// Issue 22: under `roundup_power2_divisions:2` the live run said allocated 6,295,040 B and its
/// own record replayed to 5,246,464 B: the settings travelled beside the events. They are events
/// now (the environment at exec, each change at run time), so a run's record replays to its live
/// summary (figures, OOMs, verdicts, retries) under the defaults, `roundup_power2_divisions:2`,
/// `max_split_size_mb:128` and a change at run time, and whatif takes the record's own settings.
#[test]
fn regression_a_record_replays_to_its_live_summary_under_its_settings_and_a_change_at_run_time() {
    let sc = Scratch::new("replay");
    let cases: [(&str, Option<&str>, &str, u64); 4] = [
        ("defaults", None, "", 512 + 3072 + 5 * MIB),
        ("div2", Some("roundup_power2_divisions:2"), "", 512 + 3072 + 6 * MIB),
        ("split128", Some("max_split_size_mb:128"), "", 512 + 3072 + 5 * MIB),
        // 5 MiB before the change, a further 5 MiB request after it in a 6 MiB block.
        ("change", None, "change", 512 + 3072 + 5 * MIB + 6 * MIB),
    ];
    for (tag, conf, mode, allocated) in cases {
        let record = sc.dir.join(format!("{tag}.gpufrag"));
        let env: Vec<(&str, &std::ffi::OsStr)> = conf.iter().map(|c| ("PYTORCH_CUDA_ALLOC_CONF", std::ffi::OsStr::new(*c))).collect();
        let (s, out) = sc.run_mode(tag, &["--torch-tracker=build", "--record", record.to_str().expect("utf-8")], &env, mode, true);
        assert!(out.status.success(), "{tag}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(s["processes"][0]["allocated"].as_u64(), Some(allocated), "{tag}: {s:#}");
        assert_replays(&s, &record);
        // whatif's self-check under the record's own settings.
        let w = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("whatif").arg("--json").arg(&record).output().expect("whatif");
        let w: Value =
            serde_json::from_slice(&w.stdout).unwrap_or_else(|e| panic!("{tag}: whatif json: {e}: {}", String::from_utf8_lossy(&w.stderr)));
        assert_eq!(w["trace"]["alloc_conf"].as_str(), Some(conf.unwrap_or("")), "{tag}: whatif's own settings: {w:#}");
    }
}

/// Issue 22 item 5: the live verdict carries the fix `analyze` computes. frag_oom's trace (the
/// H200 snapshot, tests/fixtures/frag_oom.pickle) replayed through the stand-in tracker under
/// `gpufrag run` (its segments real driver calls on simcuda): the live line, the live summary,
/// `analyze` of the run's record and `analyze` of the snapshot itself give the one sentence the
/// simulation computes ("With expandable_segments:True this run peaks at 10.31 GiB reserved and
/// the 2.50 GiB request that fails under PyTorch's defaults fits"), not the standing advice (the
/// snapshot's adds that it cannot show CUDA IPC exports).
#[test]
fn regression_the_frag_oom_fixtures_live_fix_is_analyzes_computed_fix() {
    let sc = Scratch::new("livefix");
    let record = sc.dir.join("frag.gpufrag");
    let fixture = root().join("tests/fixtures/frag_oom.pickle");
    let env: [(&str, &std::ffi::OsStr); 2] = [("SIMCUDA_MEM", "16GiB".as_ref()), ("SIMCUDA_RESERVE", "615MiB".as_ref())];
    let script = root().join("tests/python_hook/tracker/replay_trace.py");
    let (s, out) = sc.run_script(
        "livefix",
        &["--torch-tracker=build", "--record", record.to_str().expect("utf-8")],
        &env,
        &script,
        &[fixture.to_str().expect("utf-8")],
        false,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("REPLAYED 71 entries"), "{}", String::from_utf8_lossy(&out.stdout));
    let want = "With expandable_segments:True this run peaks at 10.31 GiB reserved and the 2.50 GiB request that fails under PyTorch's defaults fits.";
    let ooms = s["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{s:#}");
    assert_eq!(ooms[0]["verdict"], "fragmentation", "{s:#}");
    let live_fix = ooms[0]["fix"].as_str().expect("fix").to_string();
    assert!(live_fix.starts_with(want), "the live summary's fix is not the computed one: {live_fix}\n{}", notes(&s));
    assert_eq!(s["whatif"]["recommendation"].as_str(), Some(want), "{:#}", s["whatif"]);
    // The live line printed at the OOM carries it.
    let line = stderr.lines().find(|l| l.contains("fix: ")).unwrap_or_else(|| panic!("no live fix line: {stderr}"));
    assert_eq!(line.trim_start_matches("[gpufrag]").trim(), format!("fix: {live_fix}"), "{stderr}");
    // One computation: the record's replay and the snapshot's analysis give the same fix.
    let replay = analyze(&record);
    assert_eq!(replay["ooms"][0]["fix"].as_str(), Some(live_fix.as_str()), "analyze of the run's record: {replay:#}");
    assert_eq!(replay["whatif"], s["whatif"], "the record's whatif brief against the live one");
    // The snapshot computes the same sweep; it cannot show CUDA IPC exports (the run's shim can:
    // none here), so its sentence adds that caveat.
    let snap = analyze(&fixture);
    let snap_fix = snap["ooms"][0]["fix"].as_str().expect("the snapshot's fix");
    assert!(snap_fix.starts_with(want) && snap_fix.contains("cannot show CUDA IPC exports"), "analyze of frag_oom.pickle: {snap_fix}");
    assert_eq!(
        (&snap["whatif"]["baseline"], &snap["whatif"]["best"]),
        (&s["whatif"]["baseline"], &s["whatif"]["best"]),
        "the sweep's outcomes"
    );
    assert_replays(&s, &record);
}
