//! The Python start-up hook's plumbing under `gpufrag run`: the import hook wraps
//! `torch.cuda._lazy_init`, the hook says a caching allocator is in charge, attaches the OOM
//! observer, sends allocator snapshots and the OOM, and the consumer turns them into block-level
//! figures and a fragmentation verdict. CI has no PyTorch: tests/python_hook/torch is a stand-in
//! for the handful of torch functions the hook calls, returning the real frag_oom snapshot
//! recorded on the H200. The real PyTorch path is checked on the GPU (docs/gpu-validation.md).

use gpufrag::event::EventKind;
use gpufrag::ingest::State;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

#[test]
fn hook_brings_blocks_and_the_oom_verdict() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("gpufrag-pyhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let summary = dir.join("summary.json");
    let preload = Path::new(env!("CARGO_BIN_EXE_gpufrag")).with_file_name("libgpufrag_preload.so");
    if !preload.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "gpufrag-preload"])
            .arg(if cfg!(debug_assertions) { "--profile=dev" } else { "--release" })
            .status()
            .expect("cargo build");
        assert!(st.success());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "-q", "--no-report", "--no-feed", "--python-interval", "0.05", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg("python3")
        .arg(root.join("tests/python_hook/train.py"))
        .env("PYTHONPATH", root.join("tests/python_hook"))
        .env("FAKE_TORCH_SNAPSHOT", root.join("tests/fixtures/frag_oom.pickle"))
        .output()
        .expect("run gpufrag");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "gpufrag run failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("TRAIN done 1"), "the OOM observer was not attached at lazy init: {stdout}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let p = &s["processes"][0];
    assert_eq!(p["level"], "block", "{s:#}");
    assert_eq!(p["stranded"].as_u64(), Some(2_097_152_000), "{s:#}");
    assert_eq!(p["largest_free_block"].as_u64(), Some(209_715_200));
    assert_eq!(p["allocated"].as_u64(), Some(8_388_608_000));
    let ooms = s["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{s:#}");
    assert_eq!(ooms[0]["verdict"], "fragmentation");
    assert_eq!(ooms[0]["requested"].as_u64(), Some(2_684_354_560));
    assert_eq!(ooms[0]["device_free"].as_u64(), Some(2_398_224_384));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13: a program capped with `set_per_process_memory_fraction` got `inconclusive` under
/// `run` with 132 GB free on the device. The OOM observer's third argument is the allowed bytes
/// when a fraction is set: the verdict names the cap, the bytes over it and the fraction to set.
#[test]
fn regression_a_capped_program_gets_the_allowed_limit_verdict_with_the_allowed_bytes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("gpufrag-pyhook-capped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let summary = dir.join("summary.json");
    let allowed: u64 = 16 << 30;
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "-q", "--no-report", "--no-feed", "--python-interval", "0.05", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg("python3")
        .arg(root.join("tests/python_hook/capped.py"))
        .env("PYTHONPATH", root.join("tests/python_hook"))
        .env("FAKE_TORCH_SNAPSHOT", root.join("tests/fixtures/frag_oom.pickle"))
        .env("FAKE_TORCH_FRACTION", "0.1144")
        .env("FAKE_TORCH_ALLOWED", allowed.to_string())
        .output()
        .expect("run gpufrag");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "gpufrag run failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("CAPPED done 1"), "{stdout}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let o = &s["ooms"][0];
    assert_eq!(o["verdict"], "allowed_limit", "{o:#}");
    assert_eq!(o["allowed"].as_u64(), Some(allowed), "{o:#}");
    let reserved = o["reserved"].as_u64().expect("reserved");
    assert_eq!(reserved, 10_485_760_000, "the frag_oom snapshot's segments: {o:#}");
    let why = o["explanation"].as_str().expect("explanation");
    assert!(why.contains("at most 16.00 GiB") && why.contains("over the allowed bytes"), "{why}");
    let over = reserved + (20u64 << 30) - allowed;
    assert!(why.contains(&gpufrag::units::human_bytes(over)), "{why} should name the {over} bytes over the cap");
    assert!(o["fix"].as_str().expect("fix").contains("set_per_process_memory_fraction"), "{o:#}");
    // Without a fraction (hook_brings_blocks_and_the_oom_verdict: the third argument is then the
    // device total) the verdict is the figures' own.
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpufrag run` of a Python program with the stand-in driver (simcuda) on LD_LIBRARY_PATH and
/// the stand-in modules of tests/python_hook on PYTHONPATH: (summary, stdout, exit status).
fn run_python(script: &str, mem: &str, reserve: &str) -> (Value, String, std::process::ExitStatus) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(env!("CARGO_BIN_EXE_gpufrag"));
    let simcuda = bin.with_file_name("simcuda");
    assert!(simcuda.join("libcuda.so.1").exists(), "{} has no libcuda.so.1: build the workspace", simcuda.display());
    let dir = std::env::temp_dir().join(format!("gpufrag-pyhook-{}-{}", std::process::id(), script.replace('.', "_")));
    std::fs::create_dir_all(dir.join("state")).expect("temp dir");
    let summary = dir.join("summary.json");
    let out = Command::new(bin)
        .args(["run", "-q", "--no-report", "--no-feed", "--python-interval", "0.05", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg("python3")
        .arg(root.join("tests/python_hook").join(script))
        .env("PYTHONPATH", root.join("tests/python_hook"))
        .env("LD_LIBRARY_PATH", &simcuda)
        .env("SIMCUDA_MEM", mem)
        .env("SIMCUDA_RESERVE", reserve)
        .env("SIMCUDA_STATE_DIR", dir.join("state"))
        .output()
        .expect("run gpufrag");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text =
        std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("no summary: {e}\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let _ = std::fs::remove_dir_all(&dir);
    (serde_json::from_str(&text).expect("json"), stdout, out.status)
}

/// `KEY=number` pairs of the line of `stdout` that starts with `tag`.
fn printed(stdout: &str, tag: &str) -> std::collections::BTreeMap<String, u64> {
    let line = stdout.lines().find(|l| l.starts_with(tag)).unwrap_or_else(|| panic!("no {tag} line in {stdout}"));
    line.split_whitespace().filter_map(|t| t.split_once('=')).filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?))).collect()
}

#[test]
fn jax_memory_stats_and_the_resource_exhausted_oom_reach_the_summary_in_xlas_terms() {
    let (s, stdout, status) = run_python("jax_oom.py", "16GiB", "615MiB");
    assert_eq!(status.code(), Some(1), "the program dies of its uncaught RESOURCE_EXHAUSTED\n{stdout}");
    let want = printed(&stdout, "STATS");
    let stats = s["framework_stats"].as_array().expect("framework_stats");
    let oom_read =
        stats.iter().find(|r| r["framework"] == "xla" && r["when"] == "oom").unwrap_or_else(|| panic!("no stats read at the OOM: {s:#}"));
    assert_eq!(oom_read["source"], "jax.Device.memory_stats()");
    for k in ["bytes_in_use", "largest_free_block_bytes", "pool_bytes"] {
        assert_eq!(oom_read["stats"][k].as_u64(), Some(want[k]), "{k}: {s:#}");
    }
    let o = &s["ooms"][0];
    assert_eq!(o["framework"], "xla", "{s:#}");
    assert_eq!(o["requested"].as_u64(), Some(20 << 20), "{o:#}");
    assert_eq!(o["verdict"], "fragmentation", "{o:#}");
    assert_eq!(o["largest_free_block"].as_u64(), Some(want["largest_free_block_bytes"]), "{o:#}");
    assert_eq!(o["stranded"].as_u64(), Some(want["pool_bytes"] - want["bytes_in_use"]), "{o:#}");
    let fix = o["fix"].as_str().expect("fix");
    for k in ["XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR=platform"] {
        assert!(fix.contains(k), "{fix}");
    }
    assert!(s["notes"].to_string().contains("memory_stats() read right after the failure"), "{s:#}");
    // XLA writes the size rounded ("20.00MiB"): the figure says so.
    assert!(s["notes"].to_string().contains("parsed from the error message's \\\"20.00MiB\\\", which is rounded"), "{:#}", s["notes"]);
}

#[test]
fn cupy_memory_hook_chunks_give_the_pools_used_total_and_free_bytes() {
    // 128 MiB card, 64 MiB kept by the driver: 64 MiB free at start.
    let (s, stdout, status) = run_python("cupy_work.py", "128MiB", "64MiB");
    assert_eq!(status.code(), Some(1), "the program dies of its uncaught OutOfMemoryError\n{stdout}");
    let want = printed(&stdout, "POOL");
    let p = &s["processes"][0];
    assert_eq!(p["framework"], "cupy", "{s:#}");
    assert_eq!(p["level"], "block", "{s:#}");
    assert_eq!(s["exact"], Value::Bool(true), "{s:#}");
    // At the failure (the figures the program printed just before it): the map built from the
    // MemoryHook's chunks equals the pool's own used / total / free bytes. (The pool's failed
    // cudaMalloc calls are its tries whichever of the hook's socket and the shim's ring reaches
    // the consumer first; but this program dies of its error at once, and under load the hook's
    // report was once stamped 71 ms after the failures, which had been decided by then (most
    // likely by the process's exit reaching the state first) as an OOM of their own, listed
    // before it. A program that catches its error: tests/run_caught_oom.rs.)
    let o = s["ooms"].as_array().expect("ooms").iter().find(|o| o["op"] == "block_alloc").unwrap_or_else(|| panic!("no CuPy OOM: {s:#}"));
    assert_eq!(o["allocated"].as_u64(), Some(want["used"]), "used_bytes: {s:#}");
    assert_eq!(o["reserved"].as_u64(), Some(want["total"]), "total_bytes: {s:#}");
    assert_eq!(o["stranded"].as_u64().unwrap_or(0) + o["releasable"].as_u64().unwrap_or(0), want["free"], "free_bytes: {s:#}");
    let read = s["framework_stats"]
        .as_array()
        .expect("framework_stats")
        .iter()
        .find(|r| r["framework"] == "cupy" && r["when"] == "oom")
        .cloned()
        .expect("cupy stats at the OOM");
    assert_eq!(read["source"], "cupy.get_default_memory_pool()");
    for (k, w) in [("used_bytes", "used"), ("total_bytes", "total"), ("free_bytes", "free")] {
        assert_eq!(read["stats"][k].as_u64(), Some(want[w]), "{k}: {read:#}");
    }
    assert_eq!((o["framework"].as_str(), o["requested"].as_u64()), (Some("cupy"), Some(30 << 20)), "{s:#}");
    assert_eq!(o["device_free"].as_u64(), Some(24 << 20), "memGetInfo's free at the failure: {o:#}");
    assert_eq!(o["verdict"], "fragmentation", "{o:#}");
    assert!(o["fix"].as_str().is_some_and(|f| f.contains("free_all_blocks") && f.contains("set_limit")), "{o:#}");
}

/// `run --record` with the hook: the record holds the hook's block events (each with its
/// requested size and its segment's stream), and replaying it gives exactly the snapshot's live
/// blocks (issue 15: a replay of the allocator's decisions reads block events from `run` records).
#[test]
fn a_run_record_holds_the_hooks_blocks_and_replays_to_the_snapshots_blocks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("gpufrag-pyhook-rec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rec = dir.join("run.rec");
    let fixture = root.join("tests/fixtures/frag_oom.pickle");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "-q", "--no-report", "--no-feed", "--python-interval", "0.05", "--record"])
        .arg(&rec)
        .arg("--")
        .arg("python3")
        .arg(root.join("tests/python_hook/train.py"))
        .env("PYTHONPATH", root.join("tests/python_hook"))
        .env("FAKE_TORCH_SNAPSHOT", &fixture)
        .output()
        .expect("run gpufrag");
    assert!(out.status.success(), "gpufrag run failed: {}", String::from_utf8_lossy(&out.stderr));
    let events = gpufrag::record::read(&rec).expect("the record").events;
    let snap = gpufrag::snapshot::load(&fixture).expect("the fixture");
    // The snapshot's live blocks: (address, extent, requested size, its segment's stream).
    let want: BTreeSet<(u64, u64, u64, u64)> = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().filter(|b| b.state.is_active()).map(move |b| (b.address, b.size, b.requested_size, s.stream)))
        .collect();
    assert!(!want.is_empty());
    let allocs: BTreeSet<(u64, u64, u64, u64)> =
        events.iter().filter(|e| e.kind() == Some(EventKind::BlockAlloc)).map(|e| (e.addr, e.size, e.requested, e.stream)).collect();
    assert_eq!(allocs, want, "the record's BlockAlloc events are not the snapshot's blocks");
    let mut state = State::default();
    state.apply_all(&events);
    let got: BTreeSet<(u64, u64, u64)> =
        state.spaces.values().flat_map(|s| s.map.blocks().map(|b| (b.addr, b.size, b.requested))).collect();
    let want3: BTreeSet<(u64, u64, u64)> = want.iter().map(|&(a, s, r, _)| (a, s, r)).collect();
    assert_eq!(got.len(), want3.len(), "replayed {} blocks, the snapshot has {}", got.len(), want3.len());
    assert_eq!(got, want3, "the replayed blocks differ from the snapshot's");
    let _ = std::fs::remove_dir_all(&dir);
}
