//! Sharing layers as limits (issue 25, Build item 2), under `run` on one simulated 16 GiB GPU:
//! a process holding 3 GiB asks 2 GiB more under a 4 GiB limit. The device has some 12 GiB free,
//! so the device is not what refuses it: simcuda's driver models the layer (MPS's pinned memory
//! limit; HAMi-core's quota when `libvgpu.so` is preloaded, built here as an empty library), and
//! the OOM must be judged against the layer's limit (`sharing_limit`, the layer, the limit, 1 GiB
//! over), never as a true OOM of the device. A quota variable that does not parse leaves the limit
//! unknown, counted in the notes, and the OOM is then judged by the device alone.

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
    let m = Machine::new(1);
    let done = unique("done");
    std::fs::write(&done, b"go").expect("done");
    let out = unique("prog.out");
    let script = format!("{env} {} oomhold {hold_mib} {ask_mib} {} > {}", fixtures().prog.display(), done.display(), out.display());
    let summary = unique("limits.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).args(["--", "sh", "-c", &script]);
    m.env(&mut cmd);
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
