//! The real GPU of each process (issue 12, Must show (c)): on 4 simulated GPUs, two processes
//! started with `CUDA_VISIBLE_DEVICES=2` and `=3` each see their GPU as device 0. Each must be
//! filed under its own GPU (the node's index, the UUID simcuda's NVML and driver agree on) and
//! its OOM judged with that GPU's free memory, not GPU 0's: under `run` (the shim) and under
//! `agent` (eBPF). The GPUs are made to differ (6 GiB held on GPU 2, 10 GiB on GPU 3, GPU 0
//! untouched) so that a verdict taken with another GPU's figures cannot pass: each request is
//! more than its own GPU has free (a true OOM) but less than GPU 0 has (inconclusive there).

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
    let mut cmd = Command::new(gpufrag());
    cmd.args(["agent", "--keep-exited", "--summary-json"]).arg(&summary).stderr(Stdio::piped()).stdout(Stdio::null());
    m.env(&mut cmd);
    let mut agent = cmd.spawn().expect("agent");
    let mut err = Lines::new(agent.stderr.take().expect("stderr"));
    assert!(err.wait_for("agent: tracing", Duration::from_secs(120)), "{}", err.rest());
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
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGINT) }, 0);
    let st = wait_timeout(&mut agent, Duration::from_secs(60));
    let log = err.rest();
    assert!(st.success(), "agent: {st}\n{log}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("{e}\n{log}"))).expect("json");
    for (pid, text, visible, req) in seen {
        let gpu: i64 = visible.parse().expect("index");
        check(&s, pid, gpu, &ids[gpu as usize], own_free(&text), req);
    }
}
