//! The shim sees every entry-point route to the driver: each test runs one route of
//! `simcuda-workload routes` (allocate A, allocate B, free A, free B, each route with its own
//! sizes) under `LD_PRELOAD` and asserts the exact event sequence, addresses paired with what the
//! workload printed, and the workload's output unchanged from a run without the shim.

mod preload_common;

use gpufrag_wire::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_SRC_SHIM};
use gpufrag_wire::hello::{HELLO_F_FORKED, SOURCE_SHIM};
use preload_common::*;

/// Runs one route and checks everything a route must give; returns the events for more checks.
fn check_route(route: &str, alloc: EventKind, free: EventKind) -> Vec<Event> {
    let run = traced_run(&["routes", route], &[]);
    assert!(run.output.status.success(), "workload failed: {:?}\n{}", run.output, run.stdout());
    let bare = bare_run(&["routes", route]);
    assert_eq!(normalized(&run.output.stdout), normalized(&bare.stdout), "the shim changed the workload's output");

    let ops = lines_with(&run.stdout(), "OP");
    assert_eq!(ops.len(), 4, "{}", run.stdout());
    let (a1, s1) = (addr(field(&ops[0], "addr")), num(&ops[0], "size"));
    let (a2, s2) = (addr(field(&ops[1], "addr")), num(&ops[1], "size"));
    assert_eq!((addr(field(&ops[2], "addr")), addr(field(&ops[3], "addr"))), (a1, a2));

    let t = run.only();
    assert_eq!(t.hello.source, SOURCE_SHIM);
    assert_eq!(t.hello.flags & HELLO_F_FORKED, 0);
    assert_eq!(t.hello.exe_name(), "simcuda-workloa", "comm is truncated to 15 bytes by the kernel");
    assert!(t.eof, "the connection ends with the process");
    assert_eq!(t.dropped, 0);
    // A pool's reserved bytes, sampled by the shim from the driver at the pool's first
    // allocation and at exit, stand beside the calls: checked apart.
    let (pool_samples, events): (Vec<Event>, Vec<Event>) = t.events.iter().partition(|e| e.kind() == Some(EventKind::PoolReserved));
    if alloc == EventKind::PoolAlloc {
        let pool = events[0].handle;
        assert!(pool_samples.len() >= 2, "first allocation and exit: {pool_samples:#?}");
        assert!(pool_samples.iter().all(|p| p.handle == pool && p.device == 0), "{pool_samples:#?}");
        assert!(pool_samples[0].size >= s1, "the pool holds at least the first allocation: {pool_samples:#?}");
        assert!(pool_samples[0].ts_ns > events[0].ts_ns, "sampled after the allocation it follows");
    } else {
        assert!(pool_samples.is_empty(), "{pool_samples:#?}");
    }
    let got: Vec<_> = events.iter().map(brief).collect();
    let want = vec![
        (alloc, a1, s1),
        (EventKind::DeviceInfo, 0, got.get(1).map_or(0, |g| g.2)),
        (alloc, a2, s2),
        (free, a1, 0),
        (free, a2, 0),
        (EventKind::ProcessExit, 0, 0),
    ];
    assert_eq!(got, want, "route {route}: events\n{:#?}", t.events);

    for e in &events {
        assert_eq!(e.pid, t.hello.pid);
        assert_ne!(e.tid, 0);
        assert_eq!(e.rc, 0);
        assert_ne!(e.flags & F_SRC_SHIM, 0);
        assert!(e.ts_ns > 0);
    }
    assert!(t.events.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns), "timestamps go forward");
    let (e1, info, e2, f1, f2) = (&events[0], &events[1], &events[2], &events[3], &events[4]);
    assert_eq!((e1.device, e2.device), (0, 0), "allocations name the current device");
    assert_eq!((e1.requested, e2.requested), (s1, s2));
    assert_eq!((f1.device, f2.device), (-1, -1), "frees leave the device to the consumer");
    assert_eq!(info.device, 0);
    assert!(info.size > 0 && info.flags & F_DEVICE_FREE_KNOWN != 0 && info.device_free < info.size);
    events
}

#[test]
fn direct_link() {
    check_route("direct", EventKind::MemAlloc, EventKind::MemFree);
}

#[test]
fn dlsym_on_a_dlopen_handle() {
    check_route("dlsym", EventKind::MemAlloc, EventKind::MemFree);
}

#[test]
fn cu_get_proc_address_v2() {
    check_route("getproc", EventKind::MemAlloc, EventKind::MemFree);
}

#[test]
fn cu_get_proc_address_v1() {
    check_route("getproc-v1", EventKind::MemAlloc, EventKind::MemFree);
}

#[test]
fn cuda_get_driver_entry_point_by_version() {
    check_route("entrypoint", EventKind::MemAlloc, EventKind::MemFree);
}

#[test]
fn cuda_get_driver_entry_point_without_version() {
    check_route("entrypoint-noversion", EventKind::MemAlloc, EventKind::MemFree);
}

#[test]
fn ptsz_direct_link() {
    let ev = check_route("ptsz", EventKind::PoolAlloc, EventKind::PoolFree);
    // cuMemAllocAsync names no pool: the shim records the device's current pool.
    assert_ne!(ev[0].handle, 0);
    assert_eq!(ev[0].handle, ev[2].handle);
    assert_eq!(ev[0].stream, 0);
}

#[test]
fn ptsz_through_cu_get_proc_address() {
    let ev = check_route("getproc-ptsz", EventKind::PoolAlloc, EventKind::PoolFree);
    assert_ne!(ev[0].handle, 0);
}

/// cudaMalloc reaches the driver through the runtime's own dlopen + cuGetProcAddress table, which
/// the shim has swapped too: the allocation must still be recorded once, not twice.
#[test]
fn runtime_cuda_malloc_is_recorded_once() {
    check_route("runtime", EventKind::MemAlloc, EventKind::MemFree);
}

/// Every lookup route and plain dlsym agree under the shim, for tracked names (all give the
/// wrapper) and untracked ones (all give the driver's function).
#[test]
fn lookup_routes_agree_with_dlsym_under_the_shim() {
    let run = traced_run(&["procaddr"], &[]);
    assert!(run.output.status.success(), "{}\n{}", run.stdout(), String::from_utf8_lossy(&run.output.stderr));
    let bare = bare_run(&["procaddr"]);
    assert_eq!(normalized(&run.output.stdout), normalized(&bare.stdout));
    let result = &lines_with(&run.stdout(), "RESULT")[0];
    assert_eq!(field(result, "mismatches"), "0");
}

/// All nine routes in one process: eighteen allocations and eighteen frees, nothing twice.
#[test]
fn all_routes_in_one_process() {
    let run = traced_run(&["routes"], &[]);
    assert!(run.output.status.success());
    let ops = lines_with(&run.stdout(), "OP");
    let t = run.only();
    let mem = t.memory_events();
    assert_eq!(mem.len(), ops.len() + 1, "{:#?}", mem);
    for (op, e) in ops.iter().zip(&mem) {
        assert_eq!(e.addr, addr(field(op, "addr")), "{op:?} vs {e:?}");
        if let Some((_, size)) = op.iter().find(|(k, _)| k == "size") {
            assert_eq!(e.size.to_string(), *size);
        }
    }
    assert_eq!(t.events.iter().filter(|e| e.kind() == Some(EventKind::DeviceInfo)).count(), 1);
}
