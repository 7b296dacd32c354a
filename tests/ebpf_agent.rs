//! `gpufrag agent` against the simcuda stand-in: every process that uses a probed libcuda is
//! traced without being named, two processes at once stay apart, a process that exits has its
//! maps dropped (unless `--keep-exited`), and the agent stops cleanly on SIGINT with a summary.
//! Other tests' processes run at the same time; assertions look only at this test's pids.

#[path = "common/story.rs"]
mod story;
#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;

struct Agent {
    child: Child,
    err: Lines,
    summary: std::path::PathBuf,
}

fn start_agent(m: &Machine, extra: &[&str]) -> Agent {
    let summary = unique("agent.json");
    let mut cmd = agent_command(&summary, extra);
    m.env(&mut cmd);
    let (child, err) = start_tracing(cmd);
    Agent { child, err, summary }
}

fn stop_agent(mut a: Agent) -> Value {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    assert_eq!(rc, 0);
    let st = wait_timeout(&mut a.child, Duration::from_secs(60));
    let log = a.err.rest();
    assert!(st.success(), "agent: {st}\n{log}");
    serde_json::from_str(&std::fs::read_to_string(&a.summary).unwrap_or_else(|e| panic!("{e}\n{log}"))).expect("json")
}

/// Runs a fixture to its end; returns its pid and output.
fn run_prog(m: &Machine, args: &[&str]) -> (u32, String) {
    let mut cmd = Command::new(&fixtures().prog);
    cmd.args(args).stdout(Stdio::piped());
    m.env(&mut cmd);
    let child = cmd.spawn().expect("cuda_prog");
    let pid = child.id();
    let out = child.wait_with_output().expect("cuda_prog");
    assert!(out.status.success());
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn process(s: &Value, pid: u32) -> Option<&Value> {
    s["processes"].as_array()?.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
}

/// Starts `cuda_prog wait GO` and waits for its READY (24 MiB allocated).
fn start_holder(m: &Machine) -> (Child, std::path::PathBuf) {
    let go = unique("go");
    let mut cmd = Command::new(&fixtures().prog);
    cmd.arg("wait").arg(&go).stdout(Stdio::piped());
    m.env(&mut cmd);
    let mut c = cmd.spawn().expect("holder");
    let mut out = Lines::new(c.stdout.take().expect("stdout"));
    assert!(out.wait_for("READY", Duration::from_secs(60)));
    (c, go)
}

#[test]
fn two_processes_at_once_stay_apart() {
    require_ebpf!();
    let m = Machine::new(2);
    let agent = start_agent(&m, &["--keep-exited"]);
    // A holds 24 MiB on device 0 while B allocates on devices 0 and 1 and exits.
    let (mut a, go) = start_holder(&m);
    let mut cmd = Command::new(&fixtures().prog);
    cmd.arg("devices").stdout(Stdio::null());
    m.env(&mut cmd);
    let mut b = cmd.spawn().expect("b");
    let b_pid = b.id();
    assert!(wait_timeout(&mut b, Duration::from_secs(60)).success());
    std::fs::write(&go, b"go").expect("go");
    assert!(wait_timeout(&mut a, Duration::from_secs(60)).success());
    std::thread::sleep(Duration::from_millis(500));
    let s = stop_agent(agent);
    let pa = process(&s, a.id()).unwrap_or_else(|| panic!("no process {} in {s:#}", a.id()));
    assert_eq!((pa["device"].as_i64(), u(pa, "reserved")), (Some(0), 28 * MIB), "{pa:#}");
    let b_devs: Vec<(i64, u64)> = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(u64::from(b_pid)))
        .map(|p| (p["device"].as_i64().unwrap_or(-9), u(p, "reserved")))
        .collect();
    assert_eq!(b_devs, vec![(0, 10 * MIB), (1, 20 * MIB)], "{s:#}");
    // Both started after the agent: traced from their start.
    let cov = s["coverage"].as_array().expect("coverage");
    for pid in [a.id(), b_pid] {
        assert!(cov.iter().filter(|c| c["pid"].as_u64() == Some(u64::from(pid))).all(|c| c["exact"] == Value::Bool(true)), "{cov:#?}");
    }
}

#[test]
fn an_exited_process_is_dropped_and_a_live_one_kept() {
    require_ebpf!();
    let m = Machine::new(1);
    let agent = start_agent(&m, &[]);
    let (gone, out) = run_prog(&m, &["basic"]);
    assert!(out.contains("FIGURES"));
    let (mut holder, go) = start_holder(&m);
    // Let the agent notice the first one's exit.
    std::thread::sleep(Duration::from_millis(800));
    let s = stop_agent(agent);
    std::fs::write(&go, b"go").expect("go");
    assert!(wait_timeout(&mut holder, Duration::from_secs(60)).success());
    let h = process(&s, holder.id()).unwrap_or_else(|| panic!("the live holder is missing: {s:#}"));
    assert_eq!(u(h, "reserved"), 24 * MIB);
    // The exited one's maps are gone.
    assert!(process(&s, gone).is_none(), "the exited process still has maps in the agent's state: {s:#}");
}

/// Issue 13: an OOM that PyTorch's caching allocator raises without any failed driver call (a
/// `set_per_process_memory_fraction` cap) was invisible to the agent. The uprobe on
/// `c10::reportOutOfMemoryToProfiler` in the libc10.so beside libc10_cuda.so sees it: the verdict
/// names the allocator's own limit, with its allowed bytes from the fraction setter's probe.
#[test]
fn regression_an_oom_pytorch_raises_without_a_driver_call_is_an_allowed_limit_verdict() {
    require_ebpf!();
    let m = Machine::new(1);
    let lib = fixtures().symbols_lib.display().to_string();
    let record = unique("fraction.rec");
    let agent = start_agent(&m, &["--keep-exited", "--lib", &lib, "--record", record.to_str().expect("utf-8")]);
    let (pid, out) = run_prog(&m, &["torchoom", &lib, "limit"]);
    assert!(out.contains("OOM requested"), "{out}");
    std::thread::sleep(Duration::from_millis(300));
    let s = stop_agent(agent);
    let ooms: Vec<&Value> = s["ooms"].as_array().expect("ooms").iter().filter(|o| o["pid"].as_u64() == Some(u64::from(pid))).collect();
    assert_eq!(ooms.len(), 1, "one GPU OOM (the CPU-side report is not one): {s:#}");
    let o = ooms[0];
    assert_eq!(o["verdict"], "allowed_limit", "{o:#}");
    assert_eq!(u(o, "requested"), 30 * MIB, "PyTorch's rounded request: {o:#}");
    assert_eq!(u(o, "reserved"), 20 * MIB, "{o:#}");
    assert_eq!(o["op"], "block_alloc", "{o:#}");
    let why = o["explanation"].as_str().expect("explanation");
    assert!(why.contains("without asking the driver") && why.contains("set_per_process_memory_fraction"), "{why}");
    // Issue 22 item 3: the fraction set before (the uprobe on THCPModule_setMemoryFraction in
    // the libtorch_python.so beside) gives the allowed bytes, and the fix the fraction to ask for.
    let allowed: u64 = out.lines().find_map(|l| l.strip_prefix("FRACTION allowed=")).and_then(|v| v.trim().parse().ok()).expect("FRACTION");
    assert_eq!(o["allowed"].as_u64(), Some(allowed), "PyTorch's allowed bytes: {o:#}");
    let fix = o["fix"].as_str().expect("fix");
    assert!(fix.contains("set_per_process_memory_fraction(0.0032)") && fix.contains("50.00 MiB"), "reserved 20 MiB + 30 MiB: {o:#}");
    let notes = s["notes"].to_string();
    assert!(notes.contains("PyTorch's OOMs: a uprobe on c10::reportOutOfMemoryToProfiler"), "{notes}");
    // The agent's record tells the same story: the OOM, its verdict and allowed bytes.
    story::assert_replays(&s, &record);
}

/// One GET on a connection of its own: the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("request");
    let mut buf = String::new();
    s.read_to_string(&mut buf).expect("answer");
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {buf:?}"));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status line {head:?}"));
    (code, body.to_string())
}

/// Issue 27 (the DaemonSet's probes): the agent's endpoint answers `/healthz` from the moment it
/// is up, and `/readyz` 503 while the eBPF session is not attached (held here at a gate for over
/// a second) and 200 once it is and the live loop turns; the paths are the ones
/// deploy/kubernetes/base/daemonset.yaml probes (tests/export_deploy.rs reads them).
#[test]
fn health_endpoints_answer_before_and_after_attach() {
    require_ebpf!();
    use gpufrag::export::prometheus::{HEALTHZ, READYZ};
    let m = Machine::new(1);
    let gate = unique("attach-gate");
    let summary = unique("agent.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["agent", "--prometheus", "127.0.0.1:0", "--summary-json"]).arg(&summary).arg("--attach-gate").arg(&gate);
    cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    m.env(&mut cmd);
    let mut child = cmd.spawn().expect("agent");
    let mut err = Lines::new(child.stderr.take().expect("stderr"));
    assert!(err.wait_for("Prometheus metrics at http://", Duration::from_secs(60)), "{}", err.rest());
    let line = err.seen.last().unwrap().clone();
    let addr = line.split("http://").nth(1).and_then(|r| r.strip_suffix("/metrics")).unwrap_or_else(|| panic!("{line}")).to_string();

    // Before the session attaches: alive, not ready, for as long as the gate holds.
    let held = std::time::Instant::now();
    while held.elapsed() < Duration::from_millis(1200) {
        assert_eq!(http_get(&addr, HEALTHZ), (200, "ok\n".to_string()));
        let (code, body) = http_get(&addr, READYZ);
        assert_eq!(code, 503, "ready before the eBPF session attached: {body}");
        assert!(body.contains("not in place"), "{body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(&gate, b"").unwrap();
    assert!(err.wait_for("agent: tracing", Duration::from_secs(120)), "{}", err.rest());
    // Attached: ready within a tick or two (500 ms each).
    let attached = std::time::Instant::now();
    let (code, body) = loop {
        let (code, body) = http_get(&addr, READYZ);
        if code == 200 || attached.elapsed() > Duration::from_secs(10) {
            break (code, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, 200, "not ready {:?} after attaching: {body}\n{}", attached.elapsed(), err.rest());
    assert!(body.starts_with("ready: attached"), "{body}");
    assert_eq!(http_get(&addr, HEALTHZ).0, 200);
    assert_eq!(http_get(&addr, "/metrics").0, 200);
    let s = stop_agent(Agent { child, err, summary });
    assert!(s["processes"].is_array(), "{s}");
}
