//! Sharing layers as limits (issue 25, Build item 2), under `run` on one simulated 16 GiB GPU:
//! a process holding 3 GiB asks 2 GiB more under a 4 GiB limit. The device has some 12 GiB free,
//! so the device is not what refuses it: simcuda's driver models the layer (MPS's pinned memory
//! limit; HAMi-core's quota when `libvgpu.so` is preloaded, built here as an empty library), and
//! the OOM must be judged against the layer's limit (`sharing_limit`, the layer, the limit, 1 GiB
//! over), never as a true OOM of the device. A quota variable that does not parse leaves the limit
//! unknown, counted in the notes, and the OOM is then judged by the device alone. The MPS control
//! daemon's default limit (a client with no limit of its own) is read through its control client
//! (simcuda's stand-in, `simcuda/mps/nvidia-cuda-mps-control`): judged as the limit, its source
//! named; a client that hangs or answers garbage is a counted note and no limit.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Command, Stdio};
use support::*;

const GIB: u64 = 1 << 30;

/// Runs `cuda_prog oomhold HOLD_MIB ASK_MIB` with `env` under `gpufrag run`; the summary and
/// the program's output.
fn run_with(env: &str, hold_mib: u64, ask_mib: u64) -> (Value, String) {
    run_with_env(env, hold_mib, ask_mib, &[])
}

/// [`run_with`], `gpufrag_env` set on gpufrag itself.
fn run_with_env(env: &str, hold_mib: u64, ask_mib: u64, gpufrag_env: &[(&str, &std::path::Path)]) -> (Value, String) {
    let m = Machine::new(1);
    let done = unique("done");
    std::fs::write(&done, b"go").expect("done");
    let out = unique("prog.out");
    let script = format!("{env} {} oomhold {hold_mib} {ask_mib} {} > {}", fixtures().prog.display(), done.display(), out.display());
    let summary = unique("limits.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(["--", "sh", "-c", &script]);
    m.env(&mut cmd);
    for (k, v) in gpufrag_env {
        cmd.env(k, v);
    }
    let res = cmd.stderr(Stdio::piped()).output().expect("gpufrag run");
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    (s, std::fs::read_to_string(&out).expect("output"))
}

fn only_oom(s: &Value) -> &Value {
    let ooms = s["ooms"].as_array().unwrap_or_else(|| panic!("{s:#}"));
    assert_eq!(ooms.len(), 1, "{s:#}");
    &ooms[0]
}

/// The OOM is the layer's: its verdict, limit, and 1 GiB over, in the words too.
fn check_at_limit(o: &Value, layer: &str, variable: &str) {
    assert_eq!(o["verdict"].as_str(), Some("sharing_limit"), "{o:#}");
    let l = &o["limit"];
    assert_eq!(l["limit"]["layer"].as_str(), Some(layer), "{o:#}");
    assert_eq!(l["limit"]["variable"].as_str(), Some(variable), "{o:#}");
    assert_eq!(l["limit"]["bytes"].as_u64(), Some(4 * GIB), "{o:#}");
    assert_eq!(l["used"].as_u64(), Some(3 * GIB), "{o:#}");
    assert_eq!(l["requested"].as_u64(), Some(2 * GIB), "{o:#}");
    assert_eq!(l["over"].as_u64(), Some(GIB), "{o:#}");
    let e = o["explanation"].as_str().unwrap_or_default();
    assert!(e.contains("1024.00 MiB over the limit") && e.contains(variable), "{e}");
    assert!(!e.contains("true OOM"), "never a true OOM of the device: {e}");
    assert!(o["device_free"].as_u64().is_some_and(|f| f > 10 * GIB), "the device had room: {o:#}");
}

#[test]
fn an_mps_pinned_memory_limit_is_judged_as_the_limit() {
    let (s, out) = run_with("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G", 3072, 2048);
    assert!(out.starts_with("OOM rc=2 "), "simcuda's MPS model refuses past 4 GiB: {out}");
    let o = only_oom(&s);
    check_at_limit(o, "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    assert!(o["fix"].as_str().is_some_and(|f| f.starts_with("raise CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")), "{o:#}");
}

/// An empty shared library named as HAMi-core's (the quota is enforced by simcuda's model of it).
fn libvgpu() -> std::path::PathBuf {
    let dir = unique("vgpu");
    std::fs::create_dir_all(&dir).expect("dir");
    let src = dir.join("vgpu.c");
    std::fs::write(&src, "int gpufrag_test_vgpu_marker;\n").expect("src");
    let lib = dir.join("libvgpu.so");
    let st = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&src).status().expect("cc");
    assert!(st.success());
    lib
}

#[test]
fn a_quota_preload_is_judged_as_its_limit_and_named() {
    let lib = libvgpu();
    let (s, out) = run_with(&format!("LD_PRELOAD=\"$LD_PRELOAD:{}\" CUDA_DEVICE_MEMORY_LIMIT=4g", lib.display()), 3072, 2048);
    assert!(out.starts_with("OOM rc=2 "), "{out}");
    let o = only_oom(&s);
    assert_eq!(o["limit"]["limit"]["library"].as_str(), Some("HAMi-core (libvgpu.so)"), "{o:#}");
    // HAMi-core's cuMemGetInfo shows the quota: device free is what is left of it.
    assert_eq!(o["device_free"].as_u64(), Some(GIB), "{o:#}");
    assert_eq!(o["verdict"].as_str(), Some("sharing_limit"), "{o:#}");
    let l = &o["limit"];
    assert_eq!(
        (l["limit"]["layer"].as_str(), l["limit"]["bytes"].as_u64(), l["over"].as_u64()),
        (Some("quota"), Some(4 * GIB), Some(GIB)),
        "{o:#}"
    );
    assert!(o["explanation"].as_str().is_some_and(|e| e.contains("through HAMi-core (libvgpu.so)")), "{o:#}");
}

#[test]
fn a_quota_that_does_not_parse_leaves_the_limit_unknown_and_says_so() {
    let lib = libvgpu();
    // 12 GiB held, 8 GiB asked: a true OOM of the device, with no limit invented.
    let (s, out) = run_with(&format!("LD_PRELOAD=\"$LD_PRELOAD:{}\" CUDA_DEVICE_MEMORY_LIMIT=lots", lib.display()), 12288, 8192);
    assert!(out.starts_with("OOM rc=2 "), "{out}");
    let o = only_oom(&s);
    assert!(o.get("limit").is_none(), "no limit: {o:#}");
    assert_eq!(o["verdict"].as_str(), Some("true_oom"), "{o:#}");
    let notes: Vec<&str> = s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).collect();
    assert!(notes.iter().any(|n| n.contains("sharing limit unreadable 1")), "{notes:#?}");
    assert!(notes.iter().any(|n| n.contains("CUDA_DEVICE_MEMORY_LIMIT=\"lots\"") && n.contains("no limit assumed")), "{notes:#?}");
}

/// A pipe folder served by a (stand-in) MPS daemon: its `control` pipe, and the defaults file
/// simcuda's driver enforces and its stand-in control client answers (`lines`).
fn mps_pipe_dir(lines: &str) -> std::path::PathBuf {
    let dir = unique("nvidia-mps");
    std::fs::create_dir_all(&dir).expect("dir");
    let st = Command::new("mkfifo").arg(dir.join("control")).status().expect("mkfifo");
    assert!(st.success());
    std::fs::write(dir.join("simcuda-mps-defaults"), lines).expect("defaults");
    dir
}

/// [`run_with`] under an MPS daemon's pipe folder, the stand-in client found by gpufrag; the
/// summary, the output and how long `run` took.
fn run_under_daemon(dir: &std::path::Path, hold_mib: u64, ask_mib: u64) -> (Value, String, std::time::Duration) {
    let client = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("simcuda/mps");
    let t = std::time::Instant::now();
    let (s, out) =
        run_with_env(&format!("CUDA_MPS_PIPE_DIRECTORY={}", dir.display()), hold_mib, ask_mib, &[("GPUFRAG_MPS_CONTROL_DIRS", &client)]);
    (s, out, t.elapsed())
}

#[test]
fn the_mps_daemons_default_limit_is_read_from_its_control_client() {
    let dir = mps_pipe_dir("0=4G\n");
    let (s, out, _) = run_under_daemon(&dir, 3072, 2048);
    assert!(out.starts_with("OOM rc=2 "), "simcuda enforces the daemon's 4 GiB default: {out}");
    let o = only_oom(&s);
    check_at_limit(o, "mps", "the MPS control daemon's default (get_default_device_pinned_mem_limit)");
}

#[test]
fn an_mps_control_client_that_hangs_or_babbles_gives_a_note_and_no_limit() {
    for (mode, why) in [("hang", "no answer within 2000 ms (killed)"), ("garbage", "which is no size")] {
        // The driver still enforces 4 GiB; gpufrag cannot know it: judged by the device alone.
        let dir = mps_pipe_dir(&format!("mode={mode}\n0=4G\n"));
        let (s, out, took) = run_under_daemon(&dir, 3072, 2048);
        assert!(out.starts_with("OOM rc=2 "), "{mode}: {out}");
        let o = only_oom(&s);
        assert!(o.get("limit").is_none(), "{mode}: no limit invented: {o:#}");
        assert_ne!(o["verdict"].as_str(), Some("sharing_limit"), "{mode}: {o:#}");
        let notes: Vec<&str> = s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).collect();
        assert!(notes.iter().any(|n| n.contains("sharing limit unreadable 1")), "{mode}: {notes:#?}");
        assert!(
            notes.iter().any(|n| n.contains("the MPS control daemon's default limit") && n.contains(why) && n.contains("no limit assumed")),
            "{mode}: {notes:#?}"
        );
        assert!(took < std::time::Duration::from_secs(30), "{mode}: bounded by the client's timeout: {took:?}");
    }
}
