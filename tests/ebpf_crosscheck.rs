//! The eBPF path against the LD_PRELOAD shim on the same workloads: each `simcuda-workload`
//! scenario runs once under `gpufrag run` (the shim) and once under `gpufrag attach --follow`
//! from its start (uprobes), and both summaries must give the same figures: per device reserved,
//! allocated, stranded, releasable, segments, pool cache and page stranding, the same failed
//! requests, the same per-process counts, and no anomaly on the eBPF side.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

fn workload() -> std::path::PathBuf {
    let p = gpufrag().parent().expect("dir").join("simcuda-workload");
    assert!(p.exists(), "{} missing: build the workspace", p.display());
    p
}

fn shim_available() -> bool {
    gpufrag().parent().is_some_and(|d| d.join("libgpufrag_preload.so").exists())
}

fn under_shim(args: &[&str], m: &Machine) -> Value {
    let summary = unique("shim.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "-q", "--no-python-hook", "--summary-json"]).arg(&summary).arg("--").arg(workload()).args(args);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    m.env(&mut cmd);
    // The shim also reads each stream-ordered pool's reserved bytes from the driver (at its first
    // allocation, periodically, after trims, at exit), which no probe can do: off here, so that
    // both sides see the same calls (tests/preload_kinds.rs checks those samples).
    cmd.env("GPUFRAG_POOL_SAMPLES", "0");
    let out = cmd.output().expect("gpufrag run");
    assert!(out.status.success(), "gpufrag run {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(&summary).expect("shim summary")).expect("json")
}

fn under_ebpf(args: &[&str], m: &Machine) -> (Value, String) {
    // A shell waits at a gate, then execs the workload: attached before its first instruction.
    let gate = unique("gate");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.01; done; exec \"$0\" \"$@\"", gate.display());
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).arg(workload()).args(args).stdout(Stdio::null()).stderr(Stdio::null());
    m.env(&mut cmd);
    let mut child = cmd.spawn().expect("sh");
    let summary = unique("ebpf.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["attach", &child.id().to_string(), "--follow", "--summary-json"]).arg(&summary).stderr(Stdio::piped()).stdout(Stdio::null());
    m.env(&mut cmd);
    let mut gf = cmd.spawn().expect("attach");
    let mut err = Lines::new(gf.stderr.take().expect("stderr"));
    assert!(err.wait_for("attached to pid", Duration::from_secs(120)), "{}", err.rest());
    std::fs::write(&gate, b"go").expect("gate");
    let st = wait_timeout(&mut child, Duration::from_secs(180));
    assert!(st.success(), "workload {args:?}: {st}");
    assert!(wait_timeout(&mut gf, Duration::from_secs(60)).success(), "{}", err.rest());
    let s = serde_json::from_str(&std::fs::read_to_string(&summary).expect("ebpf summary")).expect("json");
    (s, err.rest())
}

const DEVICE_FIGURES: &[&str] =
    &["reserved", "allocated", "stranded", "releasable", "largest_free_block", "segments", "blocks", "pool_cached", "page_stranded"];
const SEGMENT_FIGURES: &[&str] = &["reserved", "segments", "pool_cached", "page_stranded"];

fn compare(args: &[&str]) {
    // small-pages fills the device with 1 MiB allocations: a 2 GiB device keeps that short.
    let m = if args[0] == "small-pages" { Machine::new(1).with_mem("2GiB") } else { Machine::new(1) };
    let shim = under_shim(args, &m);
    let (ebpf, log) = under_ebpf(args, &m);
    let ctx = format!("scenario {args:?}\nshim: {shim:#}\nebpf: {ebpf:#}\n{log}");
    assert_eq!(u(&ebpf, "anomalies"), 0, "{ctx}");
    assert_eq!(u(&ebpf, "dropped"), 0, "{ctx}");
    assert_eq!(ebpf["exact"], Value::Bool(true), "{ctx}");
    // The shim stamps a free before the real call (the fenced TSC stamp), so no other thread's
    // allocation of the same address can overtake it: an anomaly on either side is a defect.
    assert_eq!(u(&shim, "anomalies"), 0, "the shim's trace has anomalies: {}\n{ctx}", shim["notes"]);
    let devs = |s: &Value| s["devices"].as_array().map(|d| d.iter().map(|x| x["device"].as_i64()).collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(devs(&shim), devs(&ebpf), "{ctx}");
    // simcuda-workload's own caching allocator reports its blocks through the annotation API
    // that only the shim exports (include/gpufrag_annotate.h): with eBPF that workload is seen at
    // the segment level only, so block-level figures are compared only when both saw blocks.
    let blocks = |s: &Value| s["devices"].as_array().is_some_and(|d| d.iter().any(|x| x["blocks"].as_u64() > Some(0)));
    let block_level = blocks(&shim) == blocks(&ebpf);
    if !block_level {
        eprintln!("NOTE: {args:?}: the shim saw annotated framework blocks, eBPF cannot: comparing segment-level figures");
    }
    let figures: &[&str] = if block_level { DEVICE_FIGURES } else { SEGMENT_FIGURES };
    for d in devs(&shim).into_iter().flatten() {
        let (a, b) = (device(&shim, d), device(&ebpf, d));
        for f in figures {
            assert_eq!(a[f], b[f], "device {d} {f}: shim {} ebpf {}\n{ctx}", a[f], b[f]);
        }
    }
    // Driver-level failed requests (an annotated framework OOM exists only under the shim).
    let ooms = |s: &Value| {
        s["ooms"]
            .as_array()
            .map(|o| {
                o.iter()
                    .filter(|x| x["op"] != "block_alloc")
                    .map(|x| (x["requested"].clone(), x["op"].clone(), x["reserved"].clone()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    if block_level {
        assert_eq!(ooms(&shim), ooms(&ebpf), "{ctx}");
    } else {
        // With the framework's blocks the summary keeps the framework's own OOM and drops the
        // driver-level failures it retried; without them the driver-level failures are the OOMs.
        let any = |s: &Value| s["ooms"].as_array().is_some_and(|o| !o.is_empty());
        assert_eq!(any(&shim), any(&ebpf), "{ctx}");
    }
    // Per process (pids differ): the multiset of (device, reserved, allocs, frees).
    let procs = |s: &Value| {
        let counts = |x: &Value| if block_level { (x["allocs"].as_u64(), x["frees"].as_u64()) } else { (None, None) };
        let mut v: Vec<_> = s["processes"]
            .as_array()
            .map(|p| p.iter().map(|x| (x["device"].as_i64(), x["reserved"].as_u64(), counts(x))).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    assert_eq!(procs(&shim), procs(&ebpf), "{ctx}");
}

macro_rules! scenario {
    ($name:ident, $($arg:expr),+) => {
        #[test]
        fn $name() {
            require_ebpf!();
            if !shim_available() {
                tool_support::missing("libgpufrag_preload.so next to gpufrag (the shim)", "build it with `cargo build --workspace --release`");
                return;
            }
            compare(&[$($arg),+]);
        }
    };
}

scenario!(basic_matches_the_shim, "basic", "16MiB");
scenario!(frag_oom_matches_the_shim, "frag-oom");
scenario!(small_pages_match_the_shim, "small-pages");
scenario!(threads_match_the_shim, "threads", "4", "50");
scenario!(vmm_matches_the_shim, "vmm");
scenario!(async_pools_match_the_shim, "async");
scenario!(every_driver_route_matches_the_shim, "routes");
