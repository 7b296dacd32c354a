//! The real GPU of each process (issue 12, Must show (c)): on 4 simulated GPUs, two processes
//! started with `CUDA_VISIBLE_DEVICES=2` and `=3` each see their GPU as device 0. Each must be
//! filed under its own GPU (the node's index, the UUID simcuda's NVML and driver agree on) and
//! its OOM judged with that GPU's free memory, not GPU 0's: under `run` (the shim) and under
//! `agent` (eBPF). The GPUs are made to differ (6 GiB held on GPU 2, 10 GiB on GPU 3, GPU 0
//! untouched) so that a verdict taken with another GPU's figures cannot pass: each request is
//! more than its own GPU has free (a true OOM) but less than GPU 0 has (inconclusive there).
//!
//! Below them, placement from the driver (issue 25): a program that changes its own
//! `CUDA_VISIBLE_DEVICES` before its first call, and a driver whose order is not NVML's
//! (`SIMCUDA_FASTEST_FIRST`), so that a placement read from the environment in NVML's order fails.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

/// (CUDA_VISIBLE_DEVICES, MiB held, MiB requested) of the two processes.
const JOBS: [(&str, u64, u64); 2] = [("2", 6144, 12288), ("3", 10240, 8192)];

/// The UUIDs of the simulated GPUs, as simcuda's NVML prints them (`simcuda-workload nvml`).
fn uuids(m: &Machine) -> Vec<String> {
    let mut cmd = Command::new(gpufrag().parent().expect("dir").join("simcuda-workload"));
    cmd.arg("nvml");
    m.env(&mut cmd);
    let out = cmd.output().expect("simcuda-workload nvml");
    let text = String::from_utf8_lossy(&out.stdout);
    let list: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("RESULT test=nvml"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("uuid=")).map(str::to_string))
        .collect();
    assert_eq!(list.len(), m.devices as usize, "{text}");
    list
}

/// `OOM rc=.. requested=.. device_free=..` of a cuda_prog oomhold run.
fn own_free(out: &str) -> u64 {
    let line = out.lines().find(|l| l.starts_with("OOM ")).unwrap_or_else(|| panic!("no OOM line in {out}"));
    line.split(' ').find_map(|f| f.strip_prefix("device_free=")).and_then(|v| v.parse().ok()).expect("device_free")
}

fn oom_of(s: &Value, pid: u32) -> &Value {
    s["ooms"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["pid"].as_u64() == Some(u64::from(pid))))
        .unwrap_or_else(|| panic!("no OOM of pid {pid} in {s:#}"))
}

/// Checks one process's OOM and series against its own GPU.
fn check(s: &Value, pid: u32, gpu: i64, uuid: &str, free: u64, requested: u64) {
    let o = oom_of(s, pid);
    assert_eq!(o["device"].as_i64(), Some(gpu), "pid {pid} filed under the wrong GPU: {o:#}");
    assert_eq!(o["hw_id"].as_str(), Some(uuid), "pid {pid}: {o:#}");
    assert_eq!(o["requested"].as_u64(), Some(requested * MIB), "{o:#}");
    assert_eq!(
        o["device_free"].as_u64(),
        Some(free),
        "pid {pid}: the OOM must be judged with GPU {gpu}'s free memory (the process read {free}): {o:#}"
    );
    assert_eq!(o["verdict"].as_str(), Some("true_oom"), "{o:#}");
    let procs: Vec<&Value> =
        s["processes"].as_array().expect("processes").iter().filter(|p| p["pid"].as_u64() == Some(u64::from(pid))).collect();
    assert_eq!(procs.len(), 1, "{s:#}");
    assert_eq!((procs[0]["device"].as_i64(), procs[0]["hw_id"].as_str()), (Some(gpu), Some(uuid)), "{:#}", procs[0]);
}

const MIB: u64 = 1 << 20;

#[test]
fn two_visible_device_remaps_are_placed_on_their_own_gpus_under_run() {
    let m = Machine::new(4);
    let ids = uuids(&m);
    let go = unique("go-now");
    std::fs::write(&go, b"go").expect("go");
    let summary = unique("run-placement.json");
    let outs: Vec<std::path::PathBuf> = (0..2).map(|i| unique(&format!("out{i}"))).collect();
    let script = format!(
        "CUDA_VISIBLE_DEVICES={} {prog} oomhold {} {} {go} > {o0} & CUDA_VISIBLE_DEVICES={} {prog} oomhold {} {} {go} > {o1}; wait",
        JOBS[0].0,
        JOBS[0].1,
        JOBS[0].2,
        JOBS[1].0,
        JOBS[1].1,
        JOBS[1].2,
        prog = fixtures().prog.display(),
        go = go.display(),
        o0 = outs[0].display(),
        o1 = outs[1].display(),
    );
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(["--", "sh", "-c", &script]);
    m.env(&mut cmd);
    let out = cmd.stderr(Stdio::piped()).output().expect("gpufrag run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let devices: Vec<i64> = s["devices"].as_array().expect("devices").iter().filter_map(|d| d["device"].as_i64()).collect();
    assert_eq!(devices, vec![2, 3], "two GPUs, neither of them GPU 0: {s:#}");
    for (i, (visible, _, requested)) in JOBS.iter().enumerate() {
        let gpu: i64 = visible.parse().expect("index");
        // The pid of job i: the process filed under its GPU.
        let p = s["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["device"].as_i64() == Some(gpu))
            .unwrap_or_else(|| panic!("nothing on GPU {gpu}: {s:#}"));
        let pid = p["pid"].as_u64().expect("pid") as u32;
        let text = std::fs::read_to_string(&outs[i]).expect("job output");
        check(&s, pid, gpu, &ids[gpu as usize], own_free(&text), *requested);
    }
}

#[test]
fn two_visible_device_remaps_are_placed_on_their_own_gpus_under_the_agent() {
    require_ebpf!();
    let m = Machine::new(4);
    let ids = uuids(&m);
    let summary = unique("agent-placement.json");
    let mut cmd = agent_command(&summary, &["--keep-exited"]);
    m.env(&mut cmd);
    let (mut agent, mut err) = start_tracing(cmd);
    let go = unique("go");
    let mut jobs = Vec::new();
    for (visible, hold, req) in JOBS {
        let mut c = Command::new(&fixtures().prog);
        c.args(["oomhold", &hold.to_string(), &req.to_string()]).arg(&go).env("CUDA_VISIBLE_DEVICES", visible).stdout(Stdio::piped());
        m.env(&mut c);
        let mut child = c.spawn().expect("cuda_prog");
        let mut out = Lines::new(child.stdout.take().expect("stdout"));
        assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
        jobs.push((child, out, visible, req));
    }
    // Both hold their memory while the agent applies their OOMs (its reorder window and poll).
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, b"go").expect("go");
    let mut seen = Vec::new();
    for (mut child, mut out, visible, req) in jobs {
        assert!(wait_timeout(&mut child, Duration::from_secs(60)).success());
        seen.push((child.id(), out.rest(), visible, req));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (s, _) = stop_agent(&mut agent, &mut err, &summary);
    for (pid, text, visible, req) in seen {
        let gpu: i64 = visible.parse().expect("index");
        check(&s, pid, gpu, &ids[gpu as usize], own_free(&text), req);
    }
}

// ---- Placement from the driver (issue 25, Build item 4) ----
//
// What the driver says an ordinal is comes first; the environment is the fallback. Two cases the
// environment gets wrong: a program that sets CUDA_VISIBLE_DEVICES itself before its first call
// (its /proc/PID/environ and the shim's hello still show the old value), and a machine whose
// driver enumerates GPUs in another order than NVML (CUDA_DEVICE_ORDER unset on GPUs that are not
// alike: simcuda's SIMCUDA_FASTEST_FIRST), where the environment's index counts in the driver's
// order and names another GPU in NVML's.

/// One job of a placement case: the program's arguments before `oomhold` (its own `setenv`),
/// the `CUDA_VISIBLE_DEVICES` it starts with, MiB held, MiB requested, and the NVML index of
/// the GPU its memory is really on.
struct Job {
    setenv: Option<&'static str>,
    visible: Option<&'static str>,
    hold: u64,
    req: u64,
    gpu: i64,
}

fn job_args(j: &Job, go: &std::path::Path) -> Vec<String> {
    let mut a = Vec::new();
    if let Some(kv) = j.setenv {
        a.extend(["setenv".to_string(), kv.to_string()]);
    }
    a.extend(["oomhold".to_string(), j.hold.to_string(), j.req.to_string(), go.display().to_string()]);
    a
}

/// Runs the jobs one after another under `gpufrag run` and checks each on its GPU.
fn placed_under_run(m: &Machine, jobs: &[Job]) {
    let ids = uuids(m);
    let go = unique("go-now");
    std::fs::write(&go, b"go").expect("go");
    let summary = unique("run-driver-placement.json");
    let outs: Vec<std::path::PathBuf> = (0..jobs.len()).map(|i| unique(&format!("drv-out{i}"))).collect();
    let mut script = String::new();
    for (j, o) in jobs.iter().zip(&outs) {
        let env = j.visible.map(|v| format!("CUDA_VISIBLE_DEVICES={v} ")).unwrap_or_default();
        script.push_str(&format!("{env}{} {} > {}; ", fixtures().prog.display(), job_args(j, &go).join(" "), o.display()));
    }
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(["--", "sh", "-c", &script]);
    m.env(&mut cmd);
    let out = cmd.stderr(Stdio::piped()).output().expect("gpufrag run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let procs = s["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), jobs.len(), "{s:#}");
    for (j, o) in jobs.iter().zip(&outs) {
        let text = std::fs::read_to_string(o).expect("job output");
        // The processes ran one after another: the OOM with this job's own free is its.
        let free = own_free(&text);
        let oom = s["ooms"]
            .as_array()
            .and_then(|v| v.iter().find(|o| o["requested"].as_u64() == Some(j.req * MIB) && o["device_free"].as_u64() == Some(free)))
            .unwrap_or_else(|| panic!("no OOM of {} MiB with device free {free}: {s:#}", j.req));
        let pid = oom["pid"].as_u64().expect("pid") as u32;
        check(&s, pid, j.gpu, &ids[j.gpu as usize], free, j.req);
    }
}

/// Runs the jobs side by side under `gpufrag agent` and checks each on its GPU.
fn placed_under_agent(m: &Machine, jobs: &[Job]) {
    let ids = uuids(m);
    let summary = unique("agent-driver-placement.json");
    let mut cmd = agent_command(&summary, &["--keep-exited"]);
    m.env(&mut cmd);
    let (mut agent, mut err) = start_tracing(cmd);
    let go = unique("go");
    let mut running = Vec::new();
    for j in jobs {
        let mut c = Command::new(&fixtures().prog);
        c.args(job_args(j, &go)).stdout(Stdio::piped());
        m.env(&mut c);
        if let Some(v) = j.visible {
            c.env("CUDA_VISIBLE_DEVICES", v);
        }
        let mut child = c.spawn().expect("cuda_prog");
        let mut out = Lines::new(child.stdout.take().expect("stdout"));
        assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
        running.push((child, out, j));
    }
    // Each holds its memory while the agent applies its events (reorder window, NVML's list).
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, b"go").expect("go");
    let mut seen = Vec::new();
    for (mut child, mut out, j) in running {
        assert!(wait_timeout(&mut child, Duration::from_secs(60)).success());
        seen.push((child.id(), out.rest(), j));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (s, _) = stop_agent(&mut agent, &mut err, &summary);
    for (pid, text, j) in seen {
        check(&s, pid, j.gpu, &ids[j.gpu as usize], own_free(&text), j.req);
    }
}

/// Started on GPU 0's environment, it sets CUDA_VISIBLE_DEVICES=3 itself: its memory is on GPU 3.
const LATE: [Job; 1] = [Job { setenv: Some("CUDA_VISIBLE_DEVICES=3"), visible: None, hold: 10240, req: 8192, gpu: 3 }];

/// The driver enumerates 3,2,1,0 (NVML 0,1,2,3): `CUDA_VISIBLE_DEVICES=1` is NVML's GPU 2, and a
/// process with no variable at all has ordinal 0 on NVML's GPU 3.
const REORDERED: [Job; 2] = [
    Job { setenv: None, visible: Some("1"), hold: 6144, req: 12288, gpu: 2 },
    Job { setenv: None, visible: None, hold: 10240, req: 8192, gpu: 3 },
];

fn reordered_machine() -> Machine {
    Machine::new(4).with_env("SIMCUDA_FASTEST_FIRST", "3,2,1,0")
}

#[test]
fn a_program_that_sets_cuda_visible_devices_itself_is_placed_by_its_driver_under_run() {
    placed_under_run(&Machine::new(4), &LATE);
}

#[test]
fn a_driver_order_unlike_nvmls_is_placed_by_the_driver_under_run() {
    placed_under_run(&reordered_machine(), &REORDERED);
}

#[test]
fn a_program_that_sets_cuda_visible_devices_itself_is_placed_by_its_driver_under_the_agent() {
    require_ebpf!();
    placed_under_agent(&Machine::new(4), &LATE);
}

#[test]
fn a_driver_order_unlike_nvmls_is_placed_by_the_driver_under_the_agent() {
    require_ebpf!();
    placed_under_agent(&reordered_machine(), &REORDERED);
}
