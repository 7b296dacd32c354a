//! Issue 28 item 1, the second allocator's capture path: a C++ program whose own pool follows
//! RAPIDS RMM's `pool_memory_resource` rules (tests/ebpf_fixtures/rmm_pool.cpp, written apart from
//! src/alloc/rmm.rs) announces its upstream allocations, its blocks (requested sizes only: gpufrag
//! applies RMM's rules) and its final failure as RMM's through include/gpufrag_annotate.h's `_by`
//! calls, and drives itself to a fragmentation OOM: 24 MiB asked, 36 MiB free in the pool in two
//! upstream allocations (20 MiB − 256 at most in one block, free space never merging across
//! them), 8 MiB free on the device. Under `gpufrag run` (the shim's `gpufrag_annotate_*_by`
//! exports), `gpufrag attach` and `gpufrag agent` (the USDT probes' allocator argument) the
//! summary names the allocator `rmm` and its figures equal the pool's own accounting (printed by
//! the program); under `run` and the agent the OOM is judged by RMM's rules: `fragmentation`, the
//! fix in RMM's terms (its initial pool size), not PyTorch's settings (under `attach` the
//! process is partial, see that test). The same program announcing with the plain calls
//! (no allocator id) is the default allocator's, as every program built before the id was.

#[path = "common/story.rs"]
mod story;
#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

/// One device with 72 MiB usable: the pool takes 64 MiB, its last growth fails with 8 MiB free.
fn machine() -> Machine {
    Machine::new(1).with_mem("136MiB").with_env("SIMCUDA_RESERVE", "64MiB")
}

/// The program's `OOM key=value ...` line: the request it failed and the device free it read.
fn printed_oom(stdout: &str) -> BTreeMap<String, u64> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("OOM ")).unwrap_or_else(|| panic!("the program printed no OOM line:\n{stdout}"));
    line.split_whitespace().filter_map(|t| t.split_once('=')).map(|(k, v)| (k.to_string(), v.parse().expect("a number"))).collect()
}

/// [`assert_named_rmm_with_its_figures`], and the OOM judged by RMM's rules.
fn assert_judged_as_rmm(s: &Value, pid: u32, stdout: &str, how: &str) {
    let o = assert_named_rmm_with_its_figures(s, pid, stdout, how);
    assert_eq!(o["verdict"], "fragmentation", "{how}: 24 MiB asked, 36 MiB free in the pool, 20 MiB at most in one block: {o:#}");
    let fix = o["fix"].as_str().unwrap_or_else(|| panic!("{how}: no fix: {o:#}"));
    assert!(fix.contains("initial_pool_size") && fix.contains("RMM"), "{how}: the fix in RMM's terms: {fix}");
    assert!(
        !fix.contains("PYTORCH_CUDA_ALLOC_CONF") && !fix.contains("expandable_segments"),
        "{how}: PyTorch's settings in RMM's fix: {fix}"
    );
}

/// The allocator named `rmm` and the pool's own figures in the process `pid` of the summary `s`
/// (its output `stdout`) and in its one OOM (returned), as captured by `how`.
fn assert_named_rmm_with_its_figures<'a>(s: &'a Value, pid: u32, stdout: &str, how: &str) -> &'a Value {
    let want = &printed_figures(stdout)[&0];
    let oom = printed_oom(stdout);
    let p = s["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid))))
        .unwrap_or_else(|| panic!("{how}: no process {pid}: {s:#}"));
    assert_eq!(p["framework"], "rmm", "{how}: the allocator named: {p:#}");
    for k in ["reserved", "segments", "blocks", "allocated", "stranded", "releasable", "largest_free_block"] {
        assert_eq!(u(p, k), want[k], "{how}: {k}, the pool's own figure {} vs the trace's\n{p:#}", want[k]);
    }
    let ooms: Vec<&Value> = s["ooms"].as_array().expect("ooms").iter().filter(|o| o["pid"].as_u64() == Some(u64::from(pid))).collect();
    assert_eq!(ooms.len(), 1, "{how}: one OOM, the pool's (its failed upstream tries are no OOMs of their own): {ooms:#?}");
    let o = ooms[0];
    assert_eq!((o["framework"].as_str(), o["op"].as_str()), (Some("rmm"), Some("block_alloc")), "{how}: {o:#}");
    assert_eq!((u(o, "requested"), u(o, "device_free")), (oom["requested"], oom["device_free"]), "{how}: request, device free: {o:#}");
    for k in ["reserved", "allocated", "stranded", "largest_free_block"] {
        assert_eq!(u(o, k), want[k], "{how}: {k} at the failure, the pool's own figure {} vs the trace's\n{o:#}", want[k]);
    }
    o
}

/// `gpufrag run --record` of the fixture program `prog` on the machine: (summary, record, the
/// program's stdout, its pid as the summary names it, gpufrag's stderr).
fn under_run(prog: &std::path::Path) -> (Value, std::path::PathBuf, String, u32, String) {
    let m = machine();
    let summary = unique("run-summary.json");
    let record = unique("run.rec");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).arg("--record").arg(&record).arg("--").arg(prog);
    m.env(&mut cmd);
    let out = cmd.output().expect("gpufrag run");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    let text = std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("no summary: {e}\n{stdout}\n{stderr}"));
    let s: Value = serde_json::from_str(&text).expect("summary JSON");
    let pid = s["processes"][0]["pid"].as_u64().unwrap_or_else(|| panic!("no process: {s:#}\n{stderr}")) as u32;
    (s, record, stdout, pid, stderr)
}

#[test]
fn under_run_the_shim_names_rmm_and_judges_its_oom_by_rmms_rules() {
    let (s, record, stdout, pid, stderr) = under_run(&fixtures().rmm_prog);
    assert_eq!(u(&s, "anomalies"), 0, "{s:#}\n{stderr}");
    assert_judged_as_rmm(&s, pid, &stdout, "gpufrag run");
    assert_eq!(s["exact"], Value::Bool(true), "{s:#}");
    story::assert_replays(&s, &record);
    assert_judged_as_rmm(&analyze(&record), pid, &stdout, "the run's record replayed");
}

/// `attach` to the program held at its gate: the USDT probes' allocator argument names RMM and
/// the figures are the pool's. No verdict is asserted: an annotated executable found running is
/// marked partial (src/ebpf/session.rs: it may have announced blocks before its probes were in),
/// even one that had no driver segment yet, so its OOM is `inconclusive` under `attach`; the
/// agent's exec hold traces it from its start (the agent test below judges it).
#[test]
fn under_attach_the_usdt_probes_name_rmm_with_the_pools_figures() {
    require_ebpf!();
    let t = attach_prog_from_start(&fixtures().rmm_prog, &[], &machine(), &[]);
    assert_named_rmm_with_its_figures(&t.summary, t.pid, &t.stdout, "gpufrag attach");
    assert_eq!((u(&t.summary, "anomalies"), u(&t.summary, "dropped")), (0, 0), "{}", t.stderr);
    story::assert_replays(&t.summary, &t.record);
    assert_named_rmm_with_its_figures(&analyze(&t.record), t.pid, &t.stdout, "the attach record replayed");
}

#[test]
fn under_the_agent_a_new_rmm_program_is_named_and_judged_by_rmms_rules() {
    require_ebpf!();
    let m = machine();
    let summary = unique("agent.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["agent", "--keep-exited", "--summary-json"]).arg(&summary).stderr(Stdio::piped()).stdout(Stdio::null());
    m.env(&mut cmd);
    let mut agent = cmd.spawn().expect("agent");
    let mut err = Lines::new(agent.stderr.take().expect("stderr"));
    assert!(err.wait_for("agent: tracing", Duration::from_secs(120)), "{}", err.rest());
    let mut prog = Command::new(&fixtures().rmm_prog);
    prog.stdout(Stdio::piped());
    m.env(&mut prog);
    let child = prog.spawn().expect("rmm_pool");
    let pid = child.id();
    let out = child.wait_with_output().expect("rmm_pool");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "rmm_pool: {}\n{stdout}", out.status);
    std::thread::sleep(Duration::from_millis(500));
    let (s, _) = stop_agent(&mut agent, &mut err, &summary);
    assert_judged_as_rmm(&s, pid, &stdout, "gpufrag agent");
}

/// A program built with the header from before the allocator id (tests/ebpf_fixtures/annotate_v1/:
/// USDT probes without the argument, calls to the plain shim exports) names no allocator: its
/// blocks are the default allocator's, PyTorch's, under `run` and `attach` alike, as before.
/// (PyTorch's rules do not place RMM's blocks, so that trace has anomalies: what the id is for.)
#[test]
fn a_program_built_before_the_allocator_id_stays_the_default_allocator() {
    let (s, _, _, pid, stderr) = under_run(&fixtures().rmm_prog_v1);
    assert_the_default_allocator(&s, pid, "gpufrag run", &stderr);
    require_ebpf!();
    let t = attach_prog_from_start(&fixtures().rmm_prog_v1, &[], &machine(), &[]);
    assert_the_default_allocator(&t.summary, t.pid, "gpufrag attach", &t.stderr);
}

fn assert_the_default_allocator(s: &Value, pid: u32, how: &str, stderr: &str) {
    let p = s["processes"].as_array().and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid))));
    let p = p.unwrap_or_else(|| panic!("{how}: no process {pid}: {s:#}\n{stderr}"));
    assert_eq!(p["framework"], "pytorch", "{how}: the default allocator: {p:#}");
    assert!(u(p, "blocks") > 0, "{how}: the blocks were seen: {p:#}");
    let ooms: Vec<&Value> = s["ooms"].as_array().expect("ooms").iter().filter(|o| o["op"] == "block_alloc").collect();
    assert_eq!(ooms.len(), 1, "{how}: the allocator's OOM: {ooms:#?}");
    assert_eq!(ooms[0]["framework"], "pytorch", "{how}: {:#}", ooms[0]);
}
