//! `gpufrag attach` against the simcuda stand-in driver, through real uprobes and USDT probes:
//! traced from the start, the trace must give the figures the program itself computed; attached
//! mid-run, the summary must say it is partial; children, OOMs, lost events and missing
//! privileges are each checked the way a user would meet them. Tests skip (printing why) only
//! where the kernel refuses eBPF.

#[path = "common/story.rs"]
mod story;
#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

/// Every device the program printed figures for has those figures in the summary and in the
/// replay of the record file; the trace is exact.
fn assert_matches_printed(t: &Traced) {
    let printed = printed_figures(&t.stdout);
    assert!(!printed.is_empty(), "the program printed no FIGURES:\n{}", t.stdout);
    let replay = analyze(&t.record);
    for (dev, want) in &printed {
        for (name, s) in [("summary", &t.summary), ("replayed record", &replay)] {
            let got = device(s, *dev);
            assert_eq!(u(got, "reserved"), want["reserved"], "device {dev} reserved in the {name}\n{}", t.stderr);
            if let Some(&segs) = want.get("segments") {
                assert_eq!(u(got, "segments"), segs, "device {dev} segments in the {name}\n{}", t.stderr);
            }
        }
    }
    assert_eq!(t.summary["exact"], Value::Bool(true), "{}", t.stderr);
    // The record tells the live run's story: figures per process, OOMs and verdicts, retries.
    story::assert_replays(&t.summary, &t.record);
    assert_eq!(u(&t.summary, "anomalies"), 0, "{}", t.stderr);
    assert_eq!(u(&t.summary, "dropped"), 0, "{}", t.stderr);
    let cov = t.summary["coverage"].as_array().expect("coverage");
    assert!(cov.iter().all(|c| c["exact"] == Value::Bool(true)), "{cov:?}");
}

#[test]
fn traced_from_the_start_plain_allocations_match_the_programs_figures() {
    require_ebpf!();
    let t = attach_from_start(&["basic"], 1, &[]);
    assert_matches_printed(&t);
    let dev = device(&t.summary, 0);
    assert_eq!(dev["alloc_sizes"]["count"].as_u64(), Some(8), "{dev:#}");
}

#[test]
fn traced_from_the_start_vmm_mappings_match() {
    require_ebpf!();
    assert_matches_printed(&attach_from_start(&["vmm"], 1, &[]));
}

#[test]
fn traced_from_the_start_stream_ordered_pool_matches_and_trims() {
    require_ebpf!();
    let t = attach_from_start(&["async"], 1, &[]);
    assert_matches_printed(&t);
    assert_eq!(u(device(&t.summary, 0), "pool_cached"), 0, "cuMemPoolTrimTo(pool, 0) empties the default pool");
}

#[test]
fn allocations_land_on_the_device_of_the_threads_context() {
    require_ebpf!();
    // Thread A makes device 0's context current, thread B device 1's (cuCtxSetCurrent).
    assert_matches_printed(&attach_from_start(&["devices"], 2, &[]));
}

#[test]
fn threads_reusing_addresses_leave_no_anomaly() {
    require_ebpf!();
    // 4 threads x 300 alloc/free pairs of 1 MiB: the driver hands a freed address straight to
    // another thread, so a free reported after its return would land after the reuse.
    let t = attach_from_start(&["threads", "300"], 1, &[]);
    assert_matches_printed(&t);
    let p = &t.summary["processes"][0];
    assert_eq!((u(p, "allocs"), u(p, "frees")), (1200, 1200), "{p:#}");
}

#[test]
fn pytorch_blocks_through_usdt() {
    require_ebpf!();
    let lib = fixtures().usdt_lib.display().to_string();
    let t = attach_from_start(&["torch", &lib], 1, &["--lib", &lib]);
    assert_matches_printed(&t);
    let d = device(&t.summary, 0);
    // 4 MiB + 2 MiB (freed) + (1 MiB + 1 rounded to 512), then through raw_alloc 3 MiB and
    // through raw_alloc_with_stream 1 MiB (freed by raw_delete): three live blocks. The USDT
    // probes fire only in allocate() and local_raw_delete (issue 22: the agent's resnet50 was
    // short by the raw blocks, ~19.5 MB on the H200).
    assert_eq!((u(d, "blocks"), u(d, "allocated")), (3, 4 * MIB + MIB + 512 + 3 * MIB), "{d:#}");
    let notes = t.summary["notes"].to_string();
    assert!(notes.contains("USDT probes pytorch:malloc/free"), "{notes}");
    assert!(notes.contains("uprobes on NativeCachingAllocator::raw_alloc, raw_alloc_with_stream, raw_delete"), "{notes}");
}

#[test]
fn pytorch_blocks_through_symtab_uprobes_without_usdt() {
    require_ebpf!();
    let lib = fixtures().symbols_lib.display().to_string();
    let t = attach_from_start(&["torch", &lib], 1, &["--lib", &lib]);
    assert_matches_printed(&t);
    let d = device(&t.summary, 0);
    // raw_alloc's blocks reach the malloc uprobe; raw_delete has its own.
    assert_eq!((u(d, "blocks"), u(d, "allocated")), (3, 4 * MIB + MIB + 512 + 3 * MIB), "{d:#}");
    let notes = t.summary["notes"].to_string();
    assert!(notes.contains("no USDT probes") && notes.contains(".symtab"), "{notes}");
    assert!(notes.contains("uprobes on NativeCachingAllocator::raw_delete"), "{notes}");
}

/// The pool is one VMM mapping as JAX's is, and a second BFC instance (XLA's pinned-host
/// allocator) hands out chunks outside every device segment: only the pool's chunks count, its
/// free bytes are stranded (a preallocated BFC pool never goes back to the driver), the whole pool
/// is framework memory, and the OOM inside it is a fragmentation one.
#[test]
fn xla_bfc_chunks_through_symtab_uprobes_match_the_allocators_own_stats() {
    require_ebpf!();
    let lib = fixtures().xla_lib.display().to_string();
    let t = attach_from_start(&["xla", &lib], 1, &["--lib", &lib]);
    assert_matches_printed(&t);
    let want = &printed_figures(&t.stdout)[&0];
    let d = device(&t.summary, 0);
    assert_eq!(u(d, "allocated"), want["bfc_bytes_in_use"], "bytes_in_use\n{d:#}");
    assert_eq!(u(d, "largest_free_block"), want["bfc_largest_free_block"], "largest_free_block_bytes\n{d:#}");
    assert_eq!(u(d, "reserved"), want["bfc_pool_bytes"], "pool_bytes\n{d:#}");
    assert_eq!(u(d, "blocks"), 5, "{d:#}");
    assert_eq!(u(d, "framework_reserved"), want["bfc_pool_bytes"], "the pool is framework memory\n{d:#}");
    assert_eq!((u(d, "stranded"), u(d, "releasable")), (want["bfc_stranded"], 0), "a preallocated pool's free chunks are stranded\n{d:#}");
    let replay = analyze(&t.record);
    let rd = device(&replay, 0);
    assert_eq!(
        (u(rd, "allocated"), u(rd, "stranded"), u(rd, "releasable")),
        (want["bfc_bytes_in_use"], want["bfc_stranded"], 0),
        "replayed record\n{rd:#}"
    );
    let notes = t.summary["notes"].to_string();
    let host = format!("handed out {} chunk(s) at {:#x}", want["host_chunks"], want["host_base"]);
    assert!(
        notes.contains(&host) && notes.contains("not counted in the device figures"),
        "the host instance is named and left out: {host}\n{notes}"
    );
    assert!(
        notes.contains("XLA BFC blocks: uprobes on tsl::BFCAllocator::AllocateRaw (both overloads) and DeallocateRaw from .symtab"),
        "{notes}"
    );
    let p = &t.summary["processes"][0];
    assert_eq!(p["framework"], "xla", "{p:#}");
    let o = &t.summary["ooms"][0];
    assert_eq!(u(o, "requested"), 20 * MIB, "{o:#}");
    assert_eq!(o["verdict"], "fragmentation", "{o:#}");
    assert_eq!(
        (u(o, "stranded"), u(o, "releasable"), u(o, "largest_free_block")),
        (want["bfc_stranded"], 0, want["bfc_largest_free_block"]),
        "BFC's figures at the failure (the last call)\n{o:#}"
    );
    assert_eq!(o["framework"], "xla", "{o:#}");
    assert!(o["fix"].to_string().contains("XLA_PYTHON_CLIENT_PREALLOCATE=false"), "{o:#}");
}

/// TensorFlow's BFC (docs/design.md, "Adding an allocator": a registration only): a library named
/// `libtensorflow_framework.so.2` whose `tsl::BFCAllocator` symbols are exported in `.dynsym` (no
/// `.symtab`) is probed as XLA's BFC by its name alone, and its chunks are modelled by BFC's rules:
/// the figures are the allocator's own, as the driving program prints them.
#[test]
fn tensorflow_bfc_found_by_its_dynsym_in_libtensorflow_framework() {
    require_ebpf!();
    let lib = fixtures().tf_lib.display().to_string();
    let t = attach_from_start(&["xla", &lib], 1, &["--lib", &lib]);
    assert_matches_printed(&t);
    let want = &printed_figures(&t.stdout)[&0];
    let d = device(&t.summary, 0);
    assert_eq!(
        (u(d, "allocated"), u(d, "largest_free_block"), u(d, "reserved"), u(d, "blocks")),
        (want["bfc_bytes_in_use"], want["bfc_largest_free_block"], want["bfc_pool_bytes"], 5),
        "bytes_in_use, largest free chunk, pool bytes, chunks\n{d:#}"
    );
    assert_eq!((u(d, "stranded"), u(d, "releasable")), (want["bfc_stranded"], 0), "{d:#}");
    let notes = t.summary["notes"].to_string();
    let how = format!("XLA BFC blocks: uprobes on tsl::BFCAllocator::AllocateRaw (both overloads) and DeallocateRaw from .dynsym of {lib}");
    assert!(notes.contains(&how), "{how}\n{notes}");
    assert_eq!(t.summary["processes"][0]["framework"], "xla", "{:#}", t.summary["processes"][0]);
    let o = &t.summary["ooms"][0];
    assert_eq!((o["verdict"].as_str(), o["framework"].as_str()), (Some("fragmentation"), Some("xla")), "{o:#}");
    assert_eq!(u(o, "largest_free_block"), want["bfc_largest_free_block"], "{o:#}");
}

#[test]
fn a_failed_allocation_is_an_oom_with_its_request() {
    require_ebpf!();
    let t = attach_from_start(&["oom"], 1, &[]);
    assert_matches_printed(&t);
    let o = &t.summary["ooms"][0];
    assert_eq!(u(o, "requested"), 1 << 50, "{o:#}");
    assert_eq!(o["rc"].as_i64(), Some(2), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(o["op"].as_str(), Some("mem_alloc"));
    assert!(t.stderr.contains("OOM in pid"), "the verdict is printed live:\n{}", t.stderr);
    // The program reads no device free of its own: NVML was read at the failure, while the
    // program still held its 64 MiB (the simulated device: 16 GiB, 615 MiB reserve).
    assert_eq!(o["device_free_source"].as_str(), Some("nvml_at_failure"), "{o:#}");
    assert_eq!(u(o, "device_free"), (16u64 << 30) - 615 * MIB - 64 * MIB, "{o:#}");
    assert_eq!(o["device_free_age_ns"].as_i64(), Some(0), "read after the failure: age 0, never negative: {o:#}");
    assert!(o["device_free_after_ns"].as_u64().is_some(), "read after the failure: how long after: {o:#}");
}

/// Issue 13: PyTorch's OOM report (`c10::reportOutOfMemoryToProfiler`, in the libc10.so beside
/// libc10_cuda.so) with no failed driver call before it is the allocator's own cap:
/// `allowed_limit`; after a failed driver call of the same request it is the driver's OOM, the
/// failed call folded into it.
#[test]
fn regression_pytorchs_oom_report_tells_the_allocators_cap_from_the_drivers_refusal() {
    require_ebpf!();
    for lib in [fixtures().usdt_lib.display().to_string(), fixtures().symbols_lib.display().to_string()] {
        // limit: the setter reads cuMemGetInfo (PyTorch before 2.9); limitlazy: it multiplies a
        // total read before, and the program reads the device after (2.9 and later, the H200's).
        for mode in ["limit", "limitlazy"] {
            let t = attach_from_start(&["torchoom", &lib, mode], 1, &["--lib", &lib]);
            let ooms = t.summary["ooms"].as_array().expect("ooms");
            assert_eq!(ooms.len(), 1, "the CPU-side report is no GPU OOM: {:#}", t.summary);
            let o = &ooms[0];
            assert_eq!(o["verdict"], "allowed_limit", "{o:#}");
            // Issue 22 item 3: the fraction setter's probe (libtorch_python.so beside) gives the
            // verdict PyTorch's allowed bytes, fraction x the device total it read.
            let allowed: u64 =
                t.stdout.lines().find_map(|l| l.strip_prefix("FRACTION allowed=")).and_then(|v| v.trim().parse().ok()).expect("FRACTION");
            assert_eq!(o["allowed"].as_u64(), Some(allowed), "{o:#}");
            assert!(
                t.summary["notes"].to_string().contains("memory fractions: a uprobe on THCPModule_setMemoryFraction"),
                "{}",
                t.summary["notes"]
            );
            story::assert_replays(&t.summary, &t.record);
            assert_eq!(u(o, "requested"), 30 * MIB, "{o:#}");
            assert_eq!(u(o, "reserved"), 20 * MIB, "{o:#}");
            // The fraction's own cuMemGetInfo, just before, is the process's reading of the device.
            assert_eq!(o["device_free_source"], "process_reading", "{o:#}");
            assert!(t.stderr.contains("allowed_limit"), "the verdict is printed live:\n{}", t.stderr);
        }

        let t = attach_from_start(&["torchoom", &lib, "driver"], 1, &["--lib", &lib]);
        let ooms = t.summary["ooms"].as_array().expect("ooms");
        assert_eq!(ooms.len(), 1, "the failed driver call folds into PyTorch's OOM: {:#}", t.summary);
        let o = &ooms[0];
        assert_eq!(o["op"], "block_alloc", "{o:#}");
        assert_eq!(u(o, "driver_failures_before"), 1, "{o:#}");
        assert_eq!(o["verdict"], "true_oom", "2^50 bytes: {o:#}");
    }
}

#[test]
fn follow_traces_a_forked_child_as_its_own_process() {
    require_ebpf!();
    let t = attach_from_start(&["fork"], 1, &["--follow"]);
    let child: u32 = t.stdout.lines().find_map(|l| l.strip_prefix("CHILD pid=")).and_then(|p| p.trim().parse().ok()).expect("child pid");
    let procs = t.summary["processes"].as_array().expect("processes");
    let reserved = |pid: u32| procs.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid))).map(|p| u(p, "reserved"));
    assert_eq!(reserved(t.pid), Some(2 * MIB), "{procs:#?}");
    assert_eq!(reserved(child), Some(4 * MIB), "{procs:#?}");
}

#[test]
fn attaching_mid_run_declares_partial_coverage() {
    require_ebpf!();
    // The program allocates 3 x 8 MiB, says READY, waits; gpufrag attaches; 2 x 2 MiB follow.
    let machine = Machine::new(1);
    let go = unique("go");
    let mut cmd = Command::new(&fixtures().prog);
    cmd.arg("wait").arg(&go).stdout(Stdio::piped());
    machine.env(&mut cmd);
    let mut prog = cmd.spawn().expect("start");
    let mut out = Lines::new(prog.stdout.take().expect("stdout"));
    assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
    let summary = unique("mid.json");
    let mut cmd = Command::new(gpufrag());
    cmd.args(["attach", &prog.id().to_string(), "--summary-json"]).arg(&summary).stderr(Stdio::piped());
    machine.env(&mut cmd);
    let mut gf = cmd.spawn().expect("attach");
    let mut err = Lines::new(gf.stderr.take().expect("stderr"));
    assert!(err.wait_for("attached to pid", Duration::from_secs(120)), "{}", err.rest());
    // Let one NVML sample see the 24 MiB allocated before attaching.
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&go, b"go").expect("gate");
    assert!(wait_timeout(&mut prog, Duration::from_secs(60)).success());
    assert!(wait_timeout(&mut gf, Duration::from_secs(60)).success(), "{}", err.rest());
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    assert_eq!(s["exact"], Value::Bool(false), "attached mid-run: not exact");
    let c = &s["coverage"][0];
    assert_eq!(c["exact"], Value::Bool(false), "{c:#}");
    assert_eq!(u(c, "traced"), 4 * MIB, "only what came after attaching: {c:#}");
    assert_eq!(u(c, "nvml_used"), 24 * MIB, "NVML saw the process's memory before the new allocations: {c:#}");
    assert_eq!(u(c, "unattributed"), 24 * MIB, "{c:#}");
    assert!(s["notes"].to_string().contains("attached mid-run"), "{:#}", s["notes"]);
}

#[test]
fn lost_events_are_counted_when_the_ring_overflows() {
    require_ebpf!();
    // One page of ring (46 records) drained every 300 ms against 4 threads x 400 pairs.
    let t = attach_from_start(&["threads", "400"], 1, &["--ring-bytes", "4096", "--drain-delay-ms", "300"]);
    let dropped = u(&t.summary, "dropped");
    assert!(dropped > 0, "nothing was lost with a one-page ring:\n{}", t.stderr);
    assert_eq!(t.summary["exact"], Value::Bool(false));
    let events = u(&t.summary, "events");
    eprintln!("lost {dropped} of {} probe events", 3200 + 4);
    assert!(events < 3200, "{events}");
}

#[test]
fn attach_without_privileges_names_the_capabilities_and_run() {
    // As nobody, with no capabilities: refused before anything is loaded.
    if !std::path::Path::new("/usr/bin/setpriv").exists() || unsafe_euid() != 0 {
        tool_support::missing("root with /usr/bin/setpriv (to drop privileges)", "run as root; setpriv is in util-linux");
        return;
    }
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(gpufrag())
        .args(["attach", "1"])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("CAP_BPF") && err.contains("CAP_PERFMON"), "{err}");
    assert!(err.contains("gpufrag run"), "{err}");
}

fn unsafe_euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").and_then(|v| v.split_whitespace().nth(1)?.parse().ok())))
        .unwrap_or(u32::MAX)
}
