//! MIG instances as devices of their own (issue 25, item 2, MIG): one simulated 16 GiB GPU split
//! by simcuda into a 4 GiB and an 8 GiB instance (`SIMCUDA_MIG=0:4GiB+8GiB`). A process started
//! with `CUDA_VISIBLE_DEVICES=MIG-<the 4 GiB instance>` holds 3 GiB and asks 2 GiB more. The GPU
//! as a whole has some 12 GiB free, so an OOM judged against the GPU would be wrong: it must be
//! judged against the instance (`sharing_limit`, layer `mig`, the instance's 4 GiB, 1 GiB over,
//! the words naming the instance and its GPU), and the process filed under the instance (node
//! device 1: GPU 0, then the instances; `hw_id` the MIG UUID, `mig_parent` the GPU's). Under `run`
//! (the shim: the driver's `cuDeviceGetUuid` gives the MIG UUID) and under `agent` (eBPF: NVML's
//! MIG handles' process lists, the environment as fallback).
//!
//! Bad input: a process on a MIG instance that gpufrag's NVML does not list (its `SIMCUDA_MIG` is
//! the process's alone, so gpufrag's NVML sees no MIG): a counted note, no limit, no crash.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const GIB: u64 = 1 << 30;
const SPLIT: &str = "0:4GiB+8GiB";

fn machine() -> Machine {
    Machine::new(1).with_env("SIMCUDA_MIG", SPLIT)
}

/// (GPU UUID, [(MIG UUID, total)]) as simcuda's NVML lists them through its MIG handles.
fn nvml_view(m: &Machine) -> (String, Vec<(String, u64)>) {
    let mut cmd = Command::new(gpufrag().parent().expect("dir").join("simcuda-workload"));
    cmd.arg("nvml");
    m.env(&mut cmd);
    let out = cmd.output().expect("simcuda-workload nvml");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let field = |l: &str, k: &str| l.split(' ').find_map(|f| f.strip_prefix(&format!("{k}="))).map(str::to_string);
    let gpu = text.lines().find(|l| l.starts_with("RESULT test=nvml")).and_then(|l| field(l, "uuid")).expect("GPU line");
    let migs: Vec<(String, u64)> = text
        .lines()
        .filter(|l| l.starts_with("MIG "))
        .map(|l| {
            assert_eq!((field(l, "parent_match").as_deref(), field(l, "is_mig").as_deref()), (Some("1"), Some("1")), "{l}");
            (field(l, "uuid").expect("uuid"), field(l, "total").and_then(|t| t.parse().ok()).expect("total"))
        })
        .collect();
    assert_eq!(migs.iter().map(|m| m.1).collect::<Vec<_>>(), vec![4 * GIB, 8 * GIB], "{text}");
    assert!(migs.iter().all(|m| m.0.starts_with("MIG-")), "{text}");
    (gpu, migs)
}

fn notes(s: &Value) -> Vec<String> {
    s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).map(str::to_string).collect()
}

/// The OOM of the process `pid` (`None`: the only one traced) on the 4 GiB instance is the
/// instance's. The agent sees the whole node (other tests' processes too): only `pid`'s are read.
fn check_on_instance(s: &Value, gpu: &str, mig: &str, out: &str, pid: Option<u32>) {
    assert!(out.starts_with("OOM rc=2 "), "the instance refuses past its 4 GiB: {out}");
    assert!(out.contains(&format!("device_free={}", GIB)), "the process's driver reports the instance's free: {out}");
    let mine = |v: &&Value| pid.is_none_or(|p| v["pid"].as_u64() == Some(u64::from(p)));
    let ooms: Vec<&Value> = s["ooms"].as_array().unwrap_or_else(|| panic!("{s:#}")).iter().filter(mine).collect();
    assert_eq!(ooms.len(), 1, "{s:#}");
    let o = ooms[0];
    assert_eq!((o["device"].as_i64(), o["hw_id"].as_str()), (Some(1), Some(mig)), "filed under the instance: {o:#}");
    assert_eq!(o["verdict"].as_str(), Some("sharing_limit"), "{o:#}");
    let l = &o["limit"];
    assert_eq!(
        (l["limit"]["layer"].as_str(), l["limit"]["variable"].as_str(), l["limit"]["parent"].as_str(), l["limit"]["bytes"].as_u64()),
        (Some("mig"), Some(mig), Some(gpu), Some(4 * GIB)),
        "{o:#}"
    );
    assert_eq!((l["used"].as_u64(), l["requested"].as_u64(), l["over"].as_u64()), (Some(3 * GIB), Some(2 * GIB), Some(GIB)), "{o:#}");
    let e = o["explanation"].as_str().unwrap_or_default();
    assert!(e.contains(&format!("MIG instance {mig} (4.00 GiB of {gpu})")) && e.contains("1024.00 MiB over the limit"), "{e}");
    assert!(!e.contains("true OOM"), "never a true OOM of the GPU: {e}");
    assert!(o["fix"].as_str().is_some_and(|f| f.starts_with("run on a larger MIG instance")), "{o:#}");
    let d = s["devices"].as_array().expect("devices").iter().find(|d| d["device"].as_i64() == Some(1)).unwrap_or_else(|| panic!("{s:#}"));
    assert_eq!((d["hw_id"].as_str(), d["mig_parent"].as_str()), (Some(mig), Some(gpu)), "{d:#}");
    assert!(d["device_total"].as_u64().is_none_or(|t| t == 4 * GIB), "the device's total is the instance's: {d:#}");
    let procs: Vec<&Value> = s["processes"].as_array().expect("processes").iter().filter(mine).collect();
    assert!(!procs.is_empty() && procs.iter().all(|p| p["device"].as_i64() == Some(1)), "no process filed under the whole GPU: {s:#}");
}

fn run(m: &Machine, script: &str) -> Value {
    let summary = unique("mig.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(["--", "sh", "-c", script]);
    m.env(&mut cmd);
    let res = cmd.stderr(Stdio::piped()).output().expect("gpufrag run");
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json")
}

#[test]
fn a_mig_instance_oom_under_run_is_judged_against_the_instance_with_the_layer_named() {
    let m = machine();
    let (gpu, migs) = nvml_view(&m);
    let done = unique("done");
    std::fs::write(&done, b"go").expect("done");
    let out = unique("prog.out");
    let script = format!(
        "CUDA_VISIBLE_DEVICES={} {} oomhold 3072 2048 {} > {}",
        migs[0].0,
        fixtures().prog.display(),
        done.display(),
        out.display()
    );
    let s = run(&m, &script);
    check_on_instance(&s, &gpu, &migs[0].0, &std::fs::read_to_string(&out).expect("output"), None);
}

#[test]
fn a_mig_instance_oom_under_the_agent_is_judged_against_the_instance() {
    require_ebpf!();
    let m = machine();
    let (gpu, migs) = nvml_view(&m);
    let summary = unique("agent-mig.json");
    let mut cmd = agent_command(&summary, &["--keep-exited"]);
    m.env(&mut cmd);
    let (mut agent, mut err) = start_tracing(cmd);
    let go = unique("go");
    let mut c = Command::new(&fixtures().prog);
    c.args(["oomhold", "3072", "2048"]).arg(&go).env("CUDA_VISIBLE_DEVICES", &migs[0].0).stdout(Stdio::piped());
    m.env(&mut c);
    let mut child = c.spawn().expect("cuda_prog");
    let mut out = Lines::new(child.stdout.take().expect("stdout"));
    assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
    // It holds its memory while the agent applies its OOM (its reorder window and NVML's list).
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, b"go").expect("go");
    assert!(wait_timeout(&mut child, Duration::from_secs(60)).success());
    let pid = child.id();
    let text = out.rest();
    std::thread::sleep(Duration::from_millis(500));
    let (s, _) = stop_agent(&mut agent, &mut err, &summary);
    check_on_instance(&s, &gpu, &migs[0].0, &text, Some(pid));
}

#[test]
fn a_mig_uuid_nvml_lists_no_instance_for_is_a_counted_note_and_no_limit() {
    // gpufrag's NVML sees one whole GPU; the process's own driver sees the split (its variable only).
    let m = Machine::new(1);
    let mig = nvml_view(&machine()).1[0].0.clone();
    let done = unique("done");
    std::fs::write(&done, b"go").expect("done");
    let out = unique("prog.out");
    let script = format!(
        "SIMCUDA_MIG={SPLIT} CUDA_VISIBLE_DEVICES={mig} {} oomhold 3072 2048 {} > {}",
        fixtures().prog.display(),
        done.display(),
        out.display()
    );
    let s = run(&m, &script);
    let text = std::fs::read_to_string(&out).expect("output");
    assert!(text.starts_with("OOM rc=2 "), "the process's driver still refuses past its instance: {text}");
    let ooms = s["ooms"].as_array().unwrap_or_else(|| panic!("{s:#}"));
    assert_eq!(ooms.len(), 1, "{s:#}");
    let o = &ooms[0];
    assert!(o.get("limit").is_none(), "no limit invented: {o:#}");
    assert_ne!(o["verdict"].as_str(), Some("sharing_limit"), "{o:#}");
    assert_eq!(o["device"].as_i64(), Some(0), "kept under its ordinal, as said: {o:#}");
    let n = notes(&s);
    assert!(n.iter().any(|l| l.contains("MIG instance unmatched 1")), "{n:#?}");
    assert!(
        n.iter().any(|l| l.contains(&format!("MIG instance {mig}: NVML lists no such instance")) && l.contains("limit are unknown")),
        "{n:#?}"
    );
}
