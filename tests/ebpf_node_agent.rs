//! `gpufrag agent` as a DaemonSet runs it, against the simcuda stand-in: started in a clean
//! environment (no CUDA library on its own path, no NVML), it finds the node's driver under
//! `--host-root` or `--lib`, traces processes started after it from their first call, and judges
//! a process that exits right after its OOM the way `gpufrag run` does, with the device free of
//! the failure's moment. The workload's caching allocator is seen through the USDT probes of
//! `include/gpufrag_annotate.h`, so each verdict is checked against the workload's own figures.
//! Tests skip (printing why) only where the kernel refuses eBPF.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// What issue 12 measured for `frag-oom` (the H200 run of frag_oom.py, reproduced by simcuda).
const FRAG_REQUESTED: u64 = 2_684_354_560;
const FRAG_STRANDED: u64 = 2_097_152_000;
const FRAG_LARGEST_FREE_BLOCK: u64 = 209_715_200;

fn workload() -> PathBuf {
    let p = gpufrag().parent().expect("binary dir").join("simcuda-workload");
    assert!(p.exists(), "{} is missing: build the workspace (cargo build --workspace --release)", p.display());
    p
}

struct Agent {
    child: Child,
    err: Lines,
    summary: PathBuf,
}

/// Starts `gpufrag agent` with nothing in its environment but PATH: no LD_LIBRARY_PATH, so
/// neither simcuda's libcuda nor its NVML is reachable except through the arguments.
fn start_clean_agent(args: &[&str]) -> Agent {
    let summary = unique("node-agent.json");
    let (child, err) = start_tracing(clean_agent_command(&summary, args));
    Agent { child, err, summary }
}

fn stop(mut a: Agent) -> (Value, String) {
    // Let the last process's exit and events through the reorder window and the scan.
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) }, 0);
    let st = wait_timeout(&mut a.child, Duration::from_secs(60));
    let log = a.err.rest();
    assert!(st.success(), "agent: {st}\n{log}");
    let text = std::fs::read_to_string(&a.summary).unwrap_or_else(|e| panic!("{e}\n{log}"));
    (serde_json::from_str(&text).expect("json"), log)
}

/// A node's root file system with the driver where a distribution keeps it: simcuda's
/// libraries copied (not linked) into `usr/lib/x86_64-linux-gnu`, as the NVIDIA container
/// toolkit bind-mounts the host's driver into a workload's container.
fn host_root() -> PathBuf {
    let root = unique("host-root");
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).expect("host root");
    for name in ["libcuda.so.1", "libcudart.so.13", "libnvidia-ml.so.1"] {
        std::fs::copy(simcuda_dir().join(name), lib.join(name)).unwrap_or_else(|e| panic!("copying {name}: {e}"));
    }
    root
}

/// Runs the workload with `lib_dir` first on its library path and a fresh simulated device.
fn run_workload(args: &[&str], lib_dir: &Path) -> (u32, String) {
    let state = unique("simcuda-state");
    std::fs::create_dir_all(&state).expect("state");
    let child = Command::new(workload())
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("SIMCUDA_DEVICES", "1")
        .env("SIMCUDA_STATE_DIR", &state)
        .stdout(Stdio::piped())
        .spawn()
        .expect("workload");
    let pid = child.id();
    let out = child.wait_with_output().expect("workload");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "simcuda-workload {args:?}: {}\n{stdout}", out.status);
    (pid, stdout)
}

/// The workload's `RESULT ... step=STEP` line as key → value.
fn result_line(stdout: &str, step: &str) -> BTreeMap<String, String> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT ") && l.contains(&format!(" step={step}")))
        .unwrap_or_else(|| panic!("no RESULT step={step} in\n{stdout}"));
    line.split_whitespace().skip(1).filter_map(|t| t.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn num(r: &BTreeMap<String, String>, k: &str) -> u64 {
    r.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number {k} in {r:?}"))
}

/// The one final OOM of `pid` in a summary.
fn oom_of(s: &Value, pid: u32) -> Value {
    let ooms: Vec<&Value> = s["ooms"].as_array().expect("ooms").iter().filter(|o| o["pid"].as_u64() == Some(u64::from(pid))).collect();
    assert_eq!(ooms.len(), 1, "pid {pid} should have one final OOM: {s:#}");
    ooms[0].clone()
}

/// The figures an OOM verdict rests on, for comparing two summaries.
fn verdict_figures(o: &Value) -> (String, u64, u64, u64, u64, u64) {
    (
        o["verdict"].as_str().unwrap_or("").to_string(),
        u(o, "requested"),
        u(o, "device_free"),
        u(o, "stranded"),
        u(o, "releasable"),
        u(o, "largest_free_block"),
    )
}

/// `gpufrag run` on the same workload: the reference the agent must agree with.
fn under_run(args: &[&str]) -> (Value, String) {
    let state = unique("simcuda-state");
    std::fs::create_dir_all(&state).expect("state");
    let summary = unique("run.json");
    let out = Command::new(gpufrag())
        .args(["run", "-q", "--no-report", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg(workload())
        .args(args)
        .env("LD_LIBRARY_PATH", simcuda_dir())
        .env("SIMCUDA_STATE_DIR", &state)
        .output()
        .expect("gpufrag run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "gpufrag run: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    (serde_json::from_str(&std::fs::read_to_string(&summary).expect("run summary")).expect("json"), stdout)
}

/// Must show (a): frag-oom exits right after its OOM; the agent's verdict and figures are those
/// of `gpufrag run` and of the workload itself, device free being the process's own reading.
fn check_frag_oom(agent: Agent, lib_dir: &Path) {
    let (pid, stdout) = run_workload(&["frag-oom"], lib_dir);
    let (s, log) = stop(agent);
    let own = result_line(&stdout, "oom");
    let o = oom_of(&s, pid);
    assert_eq!(o["verdict"].as_str(), Some("fragmentation"), "{o:#}\n{log}");
    assert_eq!(u(&o, "requested"), FRAG_REQUESTED, "{o:#}");
    assert_eq!(u(&o, "stranded"), FRAG_STRANDED, "{o:#}");
    assert_eq!(u(&o, "largest_free_block"), FRAG_LARGEST_FREE_BLOCK, "{o:#}");
    assert_eq!(u(&o, "device_free"), num(&own, "device_free"), "device free must be the process's own reading at its OOM: {o:#}\n{stdout}");
    assert_eq!(o["device_free_source"].as_str(), Some("failure_event"), "{o:#}");
    let (r, _) = under_run(&["frag-oom"]);
    let ro = r["ooms"].as_array().and_then(|a| a.first()).cloned().unwrap_or_else(|| panic!("run gave no OOM: {r:#}"));
    assert_eq!(verdict_figures(&o), verdict_figures(&ro), "agent vs run\nagent: {o:#}\nrun: {ro:#}");
    // Traced from its first call: nothing missing, nothing lost.
    assert_exact(&s, pid, &log);
}

/// `pid` was traced from its first call with nothing lost or out of place (other tests' processes
/// run at the same time: only this pid is looked at).
fn assert_exact(s: &Value, pid: u32, log: &str) {
    let cov: Vec<&Value> =
        s["coverage"].as_array().expect("coverage").iter().filter(|c| c["pid"].as_u64() == Some(u64::from(pid))).collect();
    assert!(!cov.is_empty() && cov.iter().all(|c| c["exact"] == Value::Bool(true)), "pid {pid} not exact: {cov:#?}\n{log}");
    let mine = format!(": pid {pid} ");
    let notes: Vec<&str> = s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).filter(|n| n.contains(&mine)).collect();
    assert!(notes.is_empty(), "anomalies of pid {pid}: {notes:#?}");
    assert_eq!(u(s, "dropped"), 0, "{:#}", s["notes"]);
}

#[test]
fn a_clean_agent_finds_the_driver_under_host_root_and_judges_frag_oom_as_run_does() {
    require_ebpf!();
    let root = host_root();
    let w = workload().display().to_string();
    let agent = start_clean_agent(&["--host-root", &root.display().to_string(), "--lib", &w, "--keep-exited"]);
    check_frag_oom(agent, &root.join("usr/lib/x86_64-linux-gnu"));
}

#[test]
fn a_clean_agent_given_the_driver_by_lib_judges_frag_oom_as_run_does() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let w = workload().display().to_string();
    let agent = start_clean_agent(&["--lib", &lib, "--lib", &w, "--keep-exited"]);
    check_frag_oom(agent, &simcuda_dir());
}

/// Must show (e), true OOM: more than free plus the whole cache, on the eBPF path, against the
/// workload's own figures (and the same as `gpufrag run`).
#[test]
fn ebpf_true_oom_verdict_matches_the_workloads_own_figures() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let w = workload().display().to_string();
    let agent = start_clean_agent(&["--lib", &lib, "--lib", &w, "--keep-exited"]);
    let (pid, stdout) = run_workload(&["true-oom"], &simcuda_dir());
    let (s, log) = stop(agent);
    let own = result_line(&stdout, "oom");
    let o = oom_of(&s, pid);
    assert_eq!(o["verdict"].as_str(), Some("true_oom"), "{o:#}\n{log}");
    for (field, key) in [
        ("requested", "requested"),
        ("device_free", "device_free"),
        ("stranded", "stranded"),
        ("releasable", "releasable"),
        ("largest_free_block", "largest_free_block"),
    ] {
        assert_eq!(u(&o, field), num(&own, key), "{field}: agent {o:#}\nworkload {own:?}");
    }
    let (r, _) = under_run(&["true-oom"]);
    let ro = r["ooms"].as_array().and_then(|a| a.first()).cloned().unwrap_or_else(|| panic!("run gave no OOM: {r:#}"));
    assert_eq!(verdict_figures(&o), verdict_figures(&ro), "agent vs run\nagent: {o:#}\nrun: {ro:#}");
    assert_exact(&s, pid, &log);
}

/// Must show (e), fragmentation, on the eBPF path against the workload's own figures.
#[test]
fn ebpf_fragmentation_verdict_matches_the_workloads_own_figures() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let w = workload().display().to_string();
    let agent = start_clean_agent(&["--lib", &lib, "--lib", &w, "--keep-exited"]);
    let (pid, stdout) = run_workload(&["frag-oom"], &simcuda_dir());
    let (s, log) = stop(agent);
    let own = result_line(&stdout, "oom");
    let o = oom_of(&s, pid);
    assert_eq!(o["verdict"].as_str(), Some("fragmentation"), "{o:#}\n{log}");
    for (field, key) in [
        ("requested", "requested"),
        ("device_free", "device_free"),
        ("stranded", "stranded"),
        ("releasable", "releasable"),
        ("largest_free_block", "largest_free_block"),
    ] {
        assert_eq!(u(&o, field), num(&own, key), "{field}: agent {o:#}\nworkload {own:?}");
    }
    // The driver's two refusals (first try, retry after releasing the cache) fold into it.
    assert_eq!(u(&o, "driver_failures_before"), num(&own, "num_alloc_retries") + 1, "{o:#}");
    assert_exact(&s, pid, &log);
}

/// Must show (b): 50 processes of a few ms each, started after the agent, every one traced from
/// its first call: its one allocation and its free, exact, nothing lost.
#[test]
fn fifty_short_processes_started_after_the_agent_are_all_traced_from_their_first_call() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let w = workload().display().to_string();
    let agent = start_clean_agent(&["--lib", &lib, "--lib", &w, "--keep-exited"]);
    let mut pids = Vec::new();
    let mut longest = Duration::ZERO;
    for _ in 0..50 {
        let t = Instant::now();
        let (pid, out) = run_workload(&["basic", "1MiB"], &simcuda_dir());
        longest = longest.max(t.elapsed());
        assert!(out.contains("test=basic"), "{out}");
        pids.push(pid);
    }
    let (s, log) = stop(agent);
    let procs = s["processes"].as_array().expect("processes");
    let cov = s["coverage"].as_array().expect("coverage");
    let mut missing = Vec::new();
    for &pid in &pids {
        let p = procs.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid)));
        let c = cov.iter().find(|c| c["pid"].as_u64() == Some(u64::from(pid)));
        match (p, c) {
            (Some(p), Some(c)) if u(p, "allocs") == 1 && u(p, "frees") == 1 && c["exact"] == Value::Bool(true) => {}
            _ => missing.push((pid, p.cloned(), c.cloned())),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of 50 processes (each at most {longest:?}) not traced exactly from their first call: {missing:#?}\n{log}",
        missing.len()
    );
    for &pid in &pids {
        assert_exact(&s, pid, &log);
    }
    // Each is named, though most are gone before /proc could be read (the kernel's comm at the
    // exit: the issue found such processes named '').
    let unnamed: Vec<&Value> = procs
        .iter()
        .filter(|p| pids.iter().any(|&q| p["pid"].as_u64() == Some(u64::from(q))))
        .filter(|p| p["exe"].as_str().is_none_or(|n| n.is_empty() || n == "unknown"))
        .collect();
    assert!(unnamed.is_empty(), "{} of 50 short processes have no name: {unnamed:#?}", unnamed.len());
}

/// NVML absent: the clean agent says so, and an OOM it could not measure a device free for is
/// not judged on a made-up 0 (here the allocator's own figure is there, so it is measured).
#[test]
fn without_nvml_the_gap_is_a_note_and_no_figure_is_invented() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let agent = start_clean_agent(&["--lib", &lib]);
    // Driver level only (the annotations are not probed up front): the driver's refusal of the
    // 2.5 GiB segment takes the process's own cudaMemGetInfo reading next to it.
    let (pid, stdout) = run_workload(&["frag-oom"], &simcuda_dir());
    let (s, _) = stop(agent);
    let notes = s["notes"].to_string();
    assert!(notes.contains("NVML unavailable"), "{notes}");
    let own = result_line(&stdout, "oom");
    for o in s["ooms"].as_array().expect("ooms").iter().filter(|o| o["pid"].as_u64() == Some(u64::from(pid))) {
        match o["device_free_source"].as_str() {
            Some("process_reading" | "failure_event") => assert_eq!(u(o, "device_free"), num(&own, "device_free"), "{o:#}"),
            Some("not_measured") => assert_eq!(o["verdict"].as_str(), Some("inconclusive"), "{o:#}"),
            other => panic!("device free from {other:?} without NVML: {o:#}"),
        }
    }
}

/// A fresh copy of the workload: an annotated executable no agent has probed or looked at.
fn fresh_workload(name: &str) -> PathBuf {
    let exe = unique(name);
    std::fs::copy(workload(), &exe).expect("copy the workload");
    exe
}

/// Starts `exe ARGS` on simcuda with a fresh simulated device, stdout piped.
fn spawn_on_simcuda(exe: &Path, args: &[&str]) -> Child {
    let state = unique("simcuda-state");
    std::fs::create_dir_all(&state).expect("state");
    Command::new(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", simcuda_dir())
        .env("SIMCUDA_DEVICES", "1")
        .env("SIMCUDA_STATE_DIR", &state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("workload")
}

fn coverage_exact(s: &Value, pid: u32) -> Option<bool> {
    let cov: Vec<&Value> =
        s["coverage"].as_array().expect("coverage").iter().filter(|c| c["pid"].as_u64() == Some(u64::from(pid))).collect();
    (!cov.is_empty()).then(|| cov.iter().all(|c| c["exact"] == Value::Bool(true)))
}

/// The agent's exec-hold note, as (kind, count, mean µs): `first_probed`, `first_plain`, `repeated`.
fn hold_figures(s: &Value) -> BTreeMap<&'static str, (u64, f64)> {
    let note = s["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.starts_with("exec hold (fanotify"))
        .unwrap_or_else(|| panic!("no exec hold note: {:#}", s["notes"]))
        .to_string();
    let mut out = BTreeMap::new();
    for (key, label) in [("first_probed", "held until probed "), ("first_plain", "other first execs "), ("repeated", "repeated execs ")] {
        let rest = &note[note.find(label).unwrap_or_else(|| panic!("{label:?} in {note}")) + label.len()..];
        let count: u64 = rest.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{note}"));
        let mean: f64 = rest
            .split("mean ")
            .nth(1)
            .and_then(|m| m.split_whitespace().next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{note}"));
        out.insert(key, (count, mean));
    }
    out
}

/// Must show: the agent with only the driver named (no workload executable), then frag-oom
/// (whose allocator announces its blocks through the annotation header's USDT probes): its
/// first exec is held until those probes are in, so the verdict and figures are run's and the
/// process is exact from its first call.
#[test]
fn an_agent_given_only_the_driver_judges_frag_oom_from_its_first_call() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let agent = start_clean_agent(&["--lib", &lib, "--keep-exited"]);
    let (pid, stdout) = run_workload(&["frag-oom"], &simcuda_dir());
    let (s, log) = stop(agent);
    let own = result_line(&stdout, "oom");
    let o = oom_of(&s, pid);
    assert_eq!(o["verdict"].as_str(), Some("fragmentation"), "{o:#}\n{log}");
    for (field, key) in
        [("requested", "requested"), ("stranded", "stranded"), ("releasable", "releasable"), ("largest_free_block", "largest_free_block")]
    {
        assert_eq!(u(&o, field), num(&own, key), "{field}: agent {o:#}\nworkload {own:?}");
    }
    assert_eq!(u(&o, "stranded"), FRAG_STRANDED, "{o:#}");
    let (r, _) = under_run(&["frag-oom"]);
    let ro = r["ooms"].as_array().and_then(|a| a.first()).cloned().unwrap_or_else(|| panic!("run gave no OOM: {r:#}"));
    assert_eq!(verdict_figures(&o), verdict_figures(&ro), "agent vs run\nagent: {o:#}\nrun: {ro:#}");
    assert_exact(&s, pid, &log);
    let h = hold_figures(&s);
    assert!(h["first_probed"].0 >= 1, "the workload's exec was not held until probed: {h:?}");
}

/// An executable with gpufrag's annotation probes that nobody named: its first exec is held
/// until it is probed, so every process of it, the first included, is traced from its first
/// call, blocks included (the stranded bytes and largest free block are those the blocks make).
#[test]
fn an_annotated_executable_nobody_named_is_held_at_its_first_exec_and_every_process_is_exact() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let exe = fresh_workload("annotated-workload");
    let agent = start_clean_agent(&["--lib", &lib, "--keep-exited"]);
    let mut pids = Vec::new();
    for _ in 0..4 {
        let child = spawn_on_simcuda(&exe, &["frag-oom"]);
        pids.push(child.id());
        assert!(child.wait_with_output().expect("workload copy").status.success());
    }
    let (s, log) = stop(agent);
    let notes = s["notes"].to_string();
    assert!(notes.contains("gpufrag annotation USDT probes") && notes.contains("annotated-workload"), "{notes}\n{log}");
    for &pid in &pids {
        assert_eq!(coverage_exact(&s, pid), Some(true), "pid {pid} of 4: {:#}\n{log}", s["coverage"]);
        let o = oom_of(&s, pid);
        assert_eq!(
            (o["verdict"].as_str(), u(&o, "stranded"), u(&o, "largest_free_block")),
            (Some("fragmentation"), FRAG_STRANDED, FRAG_LARGEST_FREE_BLOCK),
            "pid {pid}: {o:#}"
        );
        assert_exact(&s, pid, &log);
    }
    let h = hold_figures(&s);
    assert!(h["first_probed"].0 >= 1, "{h:?}");
}

/// Must show: 50 processes of a new annotated executable started in a burst (all exec'ing the
/// unprobed file at once): all wait on the one probe request and all 50 are exact, their one
/// allocation and free seen.
#[test]
fn fifty_processes_of_a_new_annotated_executable_started_in_a_burst_are_all_exact() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let exe = fresh_workload("burst-workload");
    let agent = start_clean_agent(&["--lib", &lib, "--keep-exited"]);
    let children: Vec<Child> = (0..50).map(|_| spawn_on_simcuda(&exe, &["basic", "1MiB"])).collect();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    for c in children {
        let out = c.wait_with_output().expect("burst child");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    }
    let (s, log) = stop(agent);
    let procs = s["processes"].as_array().expect("processes");
    let mut bad = Vec::new();
    for &pid in &pids {
        let p = procs.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid)));
        let ok = p.is_some_and(|p| u(p, "allocs") == 1 && u(p, "frees") == 1) && coverage_exact(&s, pid) == Some(true);
        if !ok {
            bad.push((pid, p.cloned(), coverage_exact(&s, pid)));
        }
    }
    assert!(bad.is_empty(), "{} of 50 burst processes not exact from their first call: {bad:#?}\n{log}", bad.len());
    for &pid in &pids {
        assert_exact(&s, pid, &log);
    }
    let h = hold_figures(&s);
    println!("burst: exec hold figures {h:?}");
    assert!(h["first_probed"].0 >= 1, "{h:?}");
}

/// Bad input, bounded: a hold the session never answers (the test hook stalls it) is released
/// at the timeout: the process runs, late by the timeout, and is declared not exact with a note;
/// its OOM, seen at segment level only, is `inconclusive` (issue 22 item 6).
#[test]
fn a_hold_nobody_answers_is_released_at_its_timeout_and_the_process_is_declared_not_exact() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let exe = fresh_workload("stalled-workload");
    let name = exe.file_name().expect("name").to_string_lossy().into_owned();
    let agent = start_clean_agent(&["--lib", &lib, "--keep-exited", "--exec-hold-ms", "400", "--exec-hold-stall", &name]);
    let t = Instant::now();
    let child = spawn_on_simcuda(&exe, &["frag-oom"]);
    let pid = child.id();
    assert!(child.wait_with_output().expect("workload").status.success());
    let took = t.elapsed();
    let (s, log) = stop(agent);
    assert!(took >= Duration::from_millis(400), "the exec was not held: the process took {took:?}");
    assert!(took < Duration::from_secs(20), "the hold was not bounded: {took:?}");
    assert_eq!(coverage_exact(&s, pid), Some(false), "released unprobed but claimed exact: {:#}\n{log}", s["coverage"]);
    let notes = s["notes"].to_string();
    assert!(notes.contains(&format!("pid {pid}: its exec of")) && notes.contains("1 hold(s) released by the 400 ms timeout"), "{notes}");
    // Issue 22 item 6: seen at segment level only (its blocks unseen), the agent said `true_oom`
    // (stranded 0, largest free block 0) for what `run` calls `fragmentation`. A verdict from half
    // the facts says so: `inconclusive`, naming what is missing, with the driver-level figures,
    // and no computed fix.
    let o = oom_of(&s, pid);
    assert_eq!(o["verdict"].as_str(), Some("inconclusive"), "blocks unseen, yet a sure verdict: {o:#}\n{log}");
    assert_eq!(u(&o, "requested"), FRAG_REQUESTED, "{o:#}");
    let missing = o["missing"].as_str().unwrap_or_else(|| panic!("what is missing is not named: {o:#}"));
    assert!(missing.contains("not traced from its start"), "{missing}");
    let e = o["explanation"].as_str().expect("explanation");
    assert!(e.starts_with("inconclusive: ") && e.contains("At the driver level: 2.50 GiB requested"), "{e}");
    assert!(notes.contains("no simulated fix"), "{notes}");
}

/// Must show: the agent killed while it holds an exec: the exec proceeds (the kernel answers
/// every pending permission event when the fanotify descriptor closes).
#[test]
fn an_exec_held_when_the_agent_is_killed_proceeds() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let exe = fresh_workload("killed-hold-workload");
    let name = exe.file_name().expect("name").to_string_lossy().into_owned();
    let mut agent = start_clean_agent(&["--lib", &lib, "--exec-hold-ms", "120000", "--exec-hold-stall", &name]);
    // Through a shell that execs it: spawn() itself waits until its exec went through.
    let state = unique("simcuda-state");
    std::fs::create_dir_all(&state).expect("state");
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec '{}' basic 1MiB", exe.display()))
        .env("LD_LIBRARY_PATH", simcuda_dir())
        .env("SIMCUDA_STATE_DIR", &state)
        .stdout(Stdio::null())
        .spawn()
        .expect("sh");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().expect("wait").is_none(), "the exec was not held (the process ended before the agent was killed)");
    let killed = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(agent.child.id() as i32, libc::SIGKILL) }, 0);
    let _ = agent.child.wait();
    let st = wait_timeout(&mut child, Duration::from_secs(20));
    assert!(st.success(), "the held process: {st}");
    println!("held exec went on {:?} after the agent was killed", killed.elapsed());
}

/// The cost of the hold per exec, first and repeated, as the agent measures it (from reading
/// the event to answering it) and as the exec'ing side sees it (fork+exec+wait of a small
/// program, with and without the agent). Figures in docs/benchmarks.md; run alone
/// (`--test-threads=1`) for figures without other tests' agents.
#[test]
fn the_exec_hold_cost_per_exec_is_measured_first_and_repeated() {
    require_ebpf!();
    let lib = simcuda_dir().join("libcuda.so.1").display().to_string();
    let run_all = |paths: &[PathBuf]| {
        let t = Instant::now();
        for p in paths {
            assert!(Command::new(p).status().expect("exec").success());
        }
        t.elapsed().as_secs_f64() * 1e6 / paths.len() as f64
    };
    let copies = |tag: &str, n: usize| -> Vec<PathBuf> {
        (0..n)
            .map(|i| {
                let p = unique(&format!("true-{tag}-{i}"));
                std::fs::copy("/bin/true", &p).expect("copy /bin/true");
                p
            })
            .collect()
    };
    let same = vec![PathBuf::from("/bin/true"); 200];
    let without_first = run_all(&copies("a", 40));
    let without_repeated = run_all(&same);
    let agent = start_clean_agent(&["--lib", &lib]);
    let fresh = copies("b", 40);
    let with_first = run_all(&fresh);
    let with_repeated = run_all(&same);
    let annotated: Vec<PathBuf> = (0..5).map(|i| fresh_workload(&format!("cost-annotated-{i}"))).collect();
    for a in &annotated {
        let out = spawn_on_simcuda(a, &["basic", "1MiB"]).wait_with_output().expect("annotated");
        assert!(out.status.success());
    }
    let (s, _) = stop(agent);
    let h = hold_figures(&s);
    println!(
        "exec cost (fork+exec+wait, µs): first exec of a new file {without_first:.0} without the agent, {with_first:.0} with it; \
         repeated {without_repeated:.0} without, {with_repeated:.0} with; agent's hold (µs, mean): first plain {:.1} over {}, \
         repeated {:.1} over {}, annotated until probed {:.1} over {}",
        h["first_plain"].1, h["first_plain"].0, h["repeated"].1, h["repeated"].0, h["first_probed"].1, h["first_probed"].0
    );
    assert!(h["first_plain"].0 >= 40 && h["repeated"].0 >= 200, "the hold did not see the execs: {h:?}");
    assert!(h["first_probed"].0 >= 5, "{h:?}");
}
