//! Who held the GPU at an OOM (issue 25, Build item 1): on one simulated 16 GiB GPU a process
//! holds 12 GiB (12,290 MiB: 12 GiB and one 2 MiB page), a second asks 8 GiB and fails. The
//! failing process's OOM must name the first as its holder, with the bytes it reserved (traced)
//! and NVML's used bytes for it (what PyTorch prints as "Process N has X GiB memory in use"), in
//! `ooms[].holders`, the explanation and the fix; under `run` a third process that `run` does not
//! trace (started beside it) holds 1 GiB and must be listed from NVML's process list as not traced.
//! The report `run` writes at the OOM lists the holder (pid and bytes as in the summary), and
//! `top --once` of the run's record shows the OOM line with it.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const MIB: u64 = 1 << 20;
/// What the holder takes: 12 GiB and a 2 MiB page (whole pages: NVML's figure is the same).
const HOLD_MIB: [u64; 2] = [12288, 2];
const ASK_MIB: u64 = 8192;

fn the_oom(s: &Value) -> &Value {
    let ooms = s["ooms"].as_array().unwrap_or_else(|| panic!("no ooms: {s:#}"));
    ooms.iter().find(|o| o["requested"].as_u64() == Some(ASK_MIB * MIB)).unwrap_or_else(|| panic!("no OOM of 8 GiB: {s:#}"))
}

fn holder(o: &Value, pid: u64) -> &Value {
    o["holders"]["list"]
        .as_array()
        .and_then(|l| l.iter().find(|h| h["pid"].as_u64() == Some(pid)))
        .unwrap_or_else(|| panic!("pid {pid} is not among the holders: {o:#}"))
}

/// The holder is named with its 12 GiB: traced bytes, NVML's bytes, and in the words.
fn check_traced_holder(o: &Value, pid: u64) {
    let held = (HOLD_MIB[0] + HOLD_MIB[1]) * MIB;
    let h = holder(o, pid);
    assert_eq!(h["traced"].as_bool(), Some(true), "{h:#}");
    assert_eq!(h["reserved"].as_u64(), Some(held), "the holder's traced bytes: {h:#}");
    assert_eq!(h["nvml_used"].as_u64(), Some(held), "NVML's used bytes for it: {h:#}");
    assert_eq!(h["exe"].as_str(), Some("cuda_prog"), "{h:#}");
    let words = format!("process {pid} (cuda_prog) holds 12.00 GiB");
    assert!(o["explanation"].as_str().is_some_and(|e| e.contains(&words)), "explanation must name the holder ({words}): {o:#}");
    assert!(o["fix"].as_str().is_some_and(|e| e.starts_with(&words)), "the fix must name the holder first: {o:#}");
    assert_eq!(o["verdict"].as_str(), Some("true_oom"), "{o:#}");
}

/// The shell script both `run` tests trace: a holder of `HOLD_MIB` starts and, once it is ready,
/// an asker of `ASK_MIB` fails beside it; then the holder is released. With the holder's and the
/// asker's output files (the holder's pid is in `HOLDER_OUT.pid`).
fn holder_then_asker(prog: &str) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let (go, done) = (unique("holder-go"), unique("asker-done"));
    std::fs::write(&done, b"go").expect("done");
    let (hout, aout) = (unique("holder.out"), unique("asker.out"));
    let script = format!(
        "{prog} oomhold {} {} {go} > {h} & echo $! > {h}.pid; while ! grep -q READY {h}; do sleep 0.05; done; {prog} oomhold 64 {ASK_MIB} {done} > {a}; sleep 1; touch {go}; wait",
        HOLD_MIB[0],
        HOLD_MIB[1],
        go = go.display(),
        done = done.display(),
        h = hout.display(),
        a = aout.display(),
    );
    (script, hout, aout)
}

#[test]
fn the_neighbour_holding_12_of_16_gib_is_named_at_the_oom_under_run() {
    let m = Machine::new(1);
    let prog = fixtures().prog.display().to_string();
    // An untraced neighbour, started here (not under run): NVML lists it, the capture does not.
    let outside_go = unique("outside-go");
    let mut outside = Command::new(&fixtures().prog);
    outside.args(["oomhold", "1024", "2"]).arg(&outside_go).stdout(Stdio::piped());
    m.env(&mut outside);
    let mut outside = outside.spawn().expect("untraced neighbour");
    let mut out = Lines::new(outside.stdout.take().expect("stdout"));
    assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
    let (script, hout, aout) = holder_then_asker(&prog);
    let summary = unique("holders-run.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(["--", "sh", "-c", &script]);
    m.env(&mut cmd);
    let res = cmd.stderr(Stdio::piped()).output().expect("gpufrag run");
    std::fs::write(&outside_go, b"go").expect("release the neighbour");
    assert!(wait_timeout(&mut outside, Duration::from_secs(30)).success());
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let holder_pid: u64 = std::fs::read_to_string(format!("{}.pid", hout.display())).expect("pid").trim().parse().expect("pid");
    let asked = std::fs::read_to_string(&aout).expect("asker output");
    assert!(asked.starts_with("OOM rc=2 "), "the 8 GiB request must fail: {asked}");
    let o = the_oom(&s);
    check_traced_holder(o, holder_pid);
    let n = holder(o, u64::from(outside.id()));
    assert_eq!(n["traced"].as_bool(), Some(false), "{n:#}");
    assert_eq!(n["nvml_used"].as_u64(), Some(1026 * MIB), "NVML's figure for the untraced neighbour: {n:#}");
    assert_eq!(n["reserved"].as_u64(), Some(0), "{n:#}");
    assert!(
        o["explanation"].as_str().is_some_and(|e| e.contains(&format!("process {} (cuda_prog, not traced) holds 1.00 GiB", outside.id()))),
        "{o:#}"
    );
    assert_eq!(o["holders"]["nvml_read"].as_bool(), Some(true), "{o:#}");
}

#[test]
fn the_neighbour_holding_12_of_16_gib_is_named_at_the_oom_under_the_agent() {
    require_ebpf!();
    let m = Machine::new(1);
    let summary = unique("holders-agent.json");
    let mut cmd = agent_command(&summary, &["--keep-exited"]);
    m.env(&mut cmd);
    let (mut agent, mut err) = start_tracing(cmd);
    let go = unique("go");
    let mut running = Vec::new();
    for (hold, req) in [(HOLD_MIB[0].to_string(), HOLD_MIB[1].to_string()), ("64".to_string(), ASK_MIB.to_string())] {
        let mut c = Command::new(&fixtures().prog);
        c.args(["oomhold", &hold, &req]).arg(&go).stdout(Stdio::piped());
        m.env(&mut c);
        let mut child = c.spawn().expect("cuda_prog");
        let mut out = Lines::new(child.stdout.take().expect("stdout"));
        assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
        running.push((child, out));
    }
    // Both hold their memory while the agent applies the OOM (its reorder window).
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, b"go").expect("go");
    let mut pids = Vec::new();
    for (mut child, _) in running {
        assert!(wait_timeout(&mut child, Duration::from_secs(60)).success());
        pids.push(u64::from(child.id()));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (s, _) = stop_agent(&mut agent, &mut err, &summary);
    // The agent traces every GPU process of the node (the test beside this one's too): this
    // asker's OOM, by pid.
    let o = s["ooms"]
        .as_array()
        .and_then(|v| v.iter().find(|o| o["pid"].as_u64() == Some(pids[1]) && o["requested"].as_u64() == Some(ASK_MIB * MIB)))
        .unwrap_or_else(|| panic!("no 8 GiB OOM of pid {}: {s:#}", pids[1]));
    check_traced_holder(o, pids[0]);
}

/// The holder's pid and bytes as the report lists them (`<li data-pid data-holds data-traced>`).
fn report_holders(html: &str) -> Vec<(u64, u64, String)> {
    let list = &html[html.find("<ul class=\"holders\"").unwrap_or_else(|| panic!("no holders list in the report"))..];
    let list = &list[..list.find("</ul>").expect("the list ends")];
    let attr = |li: &str, k: &str| -> u64 {
        let at = li.find(&format!("{k}=\"")).unwrap_or_else(|| panic!("no {k} in {li}")) + k.len() + 2;
        li[at..li[at..].find('"').map(|e| at + e).expect("quote")].parse().unwrap_or_else(|e| panic!("{k} in {li}: {e}"))
    };
    list.split("<li ").skip(1).map(|li| (attr(li, "data-pid"), attr(li, "data-holds"), li.to_string())).collect()
}

#[test]
fn the_report_and_top_name_the_holder_as_the_summary_does() {
    let m = Machine::new(1);
    let prog = fixtures().prog.display().to_string();
    let (script, hout, _) = holder_then_asker(&prog);
    let (summary, report, record) = (unique("holders-report.json"), unique("holders-report.html"), unique("holders.gfrec"));
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-feed", "--summary-json"]).arg(&summary).arg("--report").arg(&report).arg("--record").arg(&record);
    cmd.args(["--", "sh", "-c", &script]);
    m.env(&mut cmd);
    let res = cmd.stderr(Stdio::piped()).output().expect("gpufrag run");
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let holder_pid: u64 = std::fs::read_to_string(format!("{}.pid", hout.display())).expect("pid").trim().parse().expect("pid");
    let o = the_oom(&s);
    check_traced_holder(o, holder_pid);
    let h = holder(o, holder_pid);
    let holds = h["nvml_used"].as_u64().or(h["reserved"].as_u64()).expect("bytes");

    // The report: the same holders, in the summary's order, the holder with the summary's bytes.
    let html = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("no report {}: {e}", report.display()));
    let listed = report_holders(&html);
    let want: Vec<u64> = o["holders"]["list"].as_array().expect("list").iter().filter_map(|h| h["pid"].as_u64()).collect();
    assert_eq!(listed.iter().map(|l| l.0).collect::<Vec<_>>(), want, "the report lists the summary's holders: {listed:?}");
    let (_, bytes, li) = listed.iter().find(|l| l.0 == holder_pid).expect("the holder is listed");
    assert_eq!(*bytes, holds, "the report's bytes for the holder are the summary's: {li}");
    assert!(li.contains(&format!("process {holder_pid} (cuda_prog) holds 12.00 GiB")), "{li}");
    assert!(li.contains("data-traced=\"true\""), "{li}");

    // top --once of the run's record: the OOM line names the asker and, after it, the holder.
    let top = Command::new(gpufrag()).args(["top", "--once", "--width", "1000", "--replay"]).arg(&record).output().expect("gpufrag top");
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    let frame = String::from_utf8_lossy(&top.stdout);
    let asker = o["pid"].as_u64().expect("pid");
    let line = frame
        .lines()
        .find(|l| l.contains(&format!("OOM pid {asker} ")))
        .unwrap_or_else(|| panic!("no OOM line for pid {asker} in top's frame:\n{frame}"));
    assert!(line.contains("8.00 GiB requested"), "{line}");
    // The record carries the holder's pid and bytes; its name is the live summary's only (a replay
    // has no /proc to read it from), so the line says `process N holds ...` there.
    assert!(
        line.contains(&format!("; process {holder_pid} holds 12.00 GiB"))
            || line.contains(&format!("; process {holder_pid} (cuda_prog) holds 12.00 GiB")),
        "top's OOM line names the holder and its bytes: {line}"
    );
}
