//! What the shim records for each family of calls, against the workloads that exercise them:
//! VMM (`vmm`: reserve, create, map, unmap, release, and the invalid arguments the driver
//! refuses), stream-ordered pools (`async`: runtime and driver forms, trims, the default pool's
//! handle), the out-of-memory evidence (`frag-oom`: the failed 2.5 GiB request with the device
//! free bytes measured right then), and the framework annotation API (`frag-oom`'s caching
//! allocator announcing its segments and blocks).

mod preload_common;

use gpufrag_wire::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FAILED};
use preload_common::*;

use EventKind::*;

/// The events other than device samples and ProcessExit, after checking those.
fn calls(t: &Traced) -> Vec<Event> {
    assert_eq!(t.events.last().and_then(Event::kind), Some(ProcessExit));
    for e in t.events.iter().filter(|e| e.kind() == Some(DeviceInfo)) {
        assert!(e.size > 0 && e.flags & F_DEVICE_FREE_KNOWN != 0 && e.device_free <= e.size, "{e:?}");
    }
    t.events.iter().filter(|e| !matches!(e.kind(), Some(DeviceInfo | ProcessExit))).copied().collect()
}

#[test]
fn vmm_reserve_create_map_unmap_release() {
    let run = traced_run(&["vmm"], &[]);
    assert!(run.output.status.success(), "{}", run.stdout());
    let results = lines_with(&run.stdout(), "RESULT");
    let base = addr(field(&results[0], "addr"));
    let got = calls(run.only());

    const C: u64 = 20 * MIB;
    const RANGE: u64 = 1 << 30;
    // (kind, address offset from the reserved base (or absolute 0), size, n-th handle created
    // (1-based, 0 = none), failed)
    let ok = false;
    let bad = true;
    #[rustfmt::skip]
    let want: Vec<(EventKind, Option<u64>, u64, usize, bool)> = vec![
        (AddressReserve, Some(0), RANGE, 0, ok),
        (PhysCreate, None, C, 1, ok), (Map, Some(0), C, 1, ok),
        (PhysCreate, None, C, 2, ok), (Map, Some(C), C, 2, ok),
        (PhysCreate, None, C, 3, ok), (Map, Some(2 * C), C, 3, ok),
        (PhysCreate, None, C, 4, ok), (Map, Some(3 * C), C, 4, ok),
        (PhysCreate, None, C, 5, ok), (Map, Some(4 * C), C, 5, ok),
        (Unmap, Some(4 * C), C, 0, ok), (PhysRelease, None, 0, 5, ok),
        (Unmap, Some(C), C, 0, ok), (PhysRelease, None, 0, 2, ok),
        (PhysCreate, None, C, 6, ok), (Map, Some(C), C, 6, ok), (PhysRelease, None, 0, 6, ok), (Unmap, Some(C), C, 0, ok),
        (PhysCreate, None, 2 * C, 7, ok), (Map, Some(10 * C), C, 7, ok), (Map, Some(12 * C), C, 7, ok),
        (PhysRelease, None, 0, 7, ok), (Unmap, Some(10 * C), C, 0, ok), (Unmap, Some(12 * C), C, 0, ok),
        // invalid arguments: recorded with their rc, changing nothing
        (Map, Some(4096), C, 1, bad), (Map, Some(20 * C), C + 4096, 1, bad), (Map, Some(RANGE), C, 1, bad),
        (Map, Some(0), C, 1, bad), (Map, Some(30 * C), C, 1, bad), (Map, Some(30 * C), C, 5, bad),
        (AllocFailed, None, 0, 0, bad), // cuMemCreate of a size that is not a multiple of the granularity
        // a release is recorded before the real call, and once more with its rc when it fails
        (Unmap, Some(40 * C), C, 0, ok), (Unmap, Some(40 * C), C, 0, bad),
        (Unmap, Some(0), 2 * MIB, 0, ok), (Unmap, Some(0), 2 * MIB, 0, bad),
        (PhysRelease, None, 0, 5, ok), (PhysRelease, None, 0, 5, bad),
        (AllocFailed, None, 0, 0, bad), // cuMemAddressReserve of 4 KiB
        (AddressFree, Some(0), RANGE, 0, ok), (AddressFree, Some(0), RANGE, 0, bad),
        // cleanup
        (Unmap, Some(0), C, 0, ok), (PhysRelease, None, 0, 1, ok),
        (Unmap, Some(2 * C), C, 0, ok), (PhysRelease, None, 0, 3, ok),
        (Unmap, Some(3 * C), C, 0, ok), (PhysRelease, None, 0, 4, ok),
        (AddressFree, Some(0), RANGE, 0, ok),
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    let mut handles = Vec::new();
    for (i, (e, w)) in got.iter().zip(&want).enumerate() {
        let (kind, off, size, handle, failed) = *w;
        assert_eq!(e.kind(), Some(kind), "event {i}: {e:?}");
        assert_eq!(e.rc != 0, failed, "event {i}: {e:?}");
        assert_eq!(e.flags & F_FAILED != 0, failed, "event {i}: {e:?}");
        if kind == PhysCreate {
            handles.push(e.handle);
            assert_eq!(e.device, 0, "the device of the allocation properties");
        }
        if let Some(off) = off {
            assert_eq!(e.addr, base + off, "event {i}: {e:?}");
        }
        if kind != AllocFailed {
            assert_eq!(e.size, size, "event {i}: {e:?}");
        }
        if handle > 0 {
            assert_eq!(e.handle, handles[handle - 1], "event {i}: {e:?}");
        }
        if kind == Map {
            let offset = if i == 21 || i == 29 { C } else { 0 };
            assert_eq!(e.requested, offset, "Map.requested is the offset into the handle: event {i}");
        }
    }
    let fails: Vec<_> = got.iter().filter(|e| e.kind() == Some(AllocFailed)).collect();
    assert_eq!((fails[0].failed_op(), fails[0].requested), (Some(PhysCreate), C + 4096));
    assert_eq!((fails[1].failed_op(), fails[1].requested), (Some(AddressReserve), 4096));
    assert!(fails.iter().all(|f| f.device_free().is_some()));
}

#[test]
fn pools_runtime_and_driver_forms() {
    let run = traced_run(&["async"], &[]);
    assert!(run.output.status.success(), "{}", run.stdout());
    let all = calls(run.only());
    let (reserved, got): (Vec<Event>, Vec<Event>) = all.iter().partition(|e| e.kind() == Some(PoolReserved));
    let kinds: Vec<EventKind> = got.iter().filter_map(Event::kind).collect();
    #[rustfmt::skip]
    assert_eq!(kinds, [
        PoolAlloc, PoolAlloc, PoolAlloc, PoolFree, PoolFree, PoolFree, // three 64 MiB, freed
        PoolAlloc, PoolFree,                                             // reuse
        PoolTrim, PoolTrim,                                              // keep 64 MiB, then 0
        PoolAlloc, PoolFree, PoolAlloc, PoolFree, PoolTrim,             // release threshold
        PoolAlloc, PoolAlloc, PoolFree, PoolFree, PoolTrim,             // driver forms, own pool
    ]);
    let default_pool = got[0].handle;
    assert_ne!(default_pool, 0, "cudaMallocAsync records the device's current pool");
    for i in [0, 1, 2, 6, 10, 12] {
        assert_eq!((got[i].handle, got[i].size, got[i].device), (default_pool, 64 * MIB, 0), "event {i}");
    }
    // The trims of the default pool name the same handle as its allocations.
    assert_eq!((got[8].handle, got[8].size), (default_pool, 64 * MIB));
    assert_eq!((got[9].handle, got[9].size), (default_pool, 0));
    assert_eq!(got[14].handle, default_pool);
    // Frees pair with allocations by address.
    for (a, f) in [(0, 3), (1, 4), (2, 5), (6, 7), (10, 11), (12, 13), (15, 17), (16, 18)] {
        assert_eq!(got[a].addr, got[f].addr, "alloc {a} / free {f}");
        assert_eq!(got[f].device, -1);
    }
    // The driver forms on a created pool.
    let own = got[15].handle;
    assert!(own != 0 && own != default_pool);
    assert_eq!((got[15].size, got[16].size, got[16].handle), (10 * MIB, 1000, own));
    assert_eq!((got[19].handle, got[19].size), (own, 0));

    // Pool reserved bytes as the driver reports them: every value the workload read through
    // cudaMemPoolGetAttribute / cuMemPoolGetAttribute was recorded, in order, for its pool.
    let results = lines_with(&run.stdout(), "RESULT");
    let step = |name: &str| results.iter().find(|l| field(l, "step") == name).unwrap_or_else(|| panic!("no {name} line"));
    let read_by_program = [
        (default_pool, num(step("alloc"), "pool_reserved")),
        (default_pool, num(step("free"), "pool_reserved")),
        (default_pool, num(step("reuse"), "pool_reserved")),
        (default_pool, num(step("trim_keep"), "pool_reserved")),
        (default_pool, num(step("trim"), "pool_reserved")),
        (default_pool, num(step("sync"), "pool_reserved_before_sync")),
        (default_pool, num(step("sync"), "pool_reserved_after_sync")),
        (default_pool, num(step("sync"), "pool_reserved_after_sync_threshold_max")),
        (own, num(step("driver_pool"), "pool_reserved")),
    ];
    let seen: Vec<(u64, u64)> = reserved.iter().map(|e| (e.handle, e.size)).collect();
    let mut rest = seen.as_slice();
    for want in read_by_program {
        let at = rest.iter().position(|&r| r == want).unwrap_or_else(|| panic!("{want:?} not recorded in order: {seen:?}"));
        rest = &rest[at + 1..];
    }
    // The shim's own samples: the default pool at its first allocation (64 MiB in use), and each
    // pool after each trim.
    assert_eq!(reserved[0].handle, default_pool);
    assert!(reserved[0].size >= 64 * MIB, "{:?}", reserved[0]);
    assert!(reserved.iter().all(|e| e.device == 0), "{reserved:?}");
    assert!(seen.contains(&(own, 0)), "own pool sampled after its trim to 0: {seen:?}");
}

#[test]
fn fragmentation_oom_is_recorded_with_the_device_free_bytes() {
    let run = traced_run(&["frag-oom"], &[]);
    assert!(run.output.status.success(), "{}", run.stdout());
    let oom = lines_with(&run.stdout(), "RESULT").into_iter().find(|l| field(l, "step") == "oom").expect("oom line");
    let requested = num(&oom, "requested");
    let free_at_oom = num(&oom, "device_free");
    let retries = num(&oom, "num_alloc_retries") as usize;
    let t = run.only();
    let fails: Vec<&Event> = t.events.iter().filter(|e| e.kind() == Some(AllocFailed) && e.failed_op() == Some(MemAlloc)).collect();
    assert_eq!(fails.len(), 1 + retries, "one failed cudaMalloc per attempt");
    for f in &fails {
        assert_eq!(f.failed_op(), Some(MemAlloc));
        assert_eq!(f.requested, requested);
        assert_eq!(f.rc, 2, "cudaErrorMemoryAllocation");
        assert_eq!(f.device_free(), Some(free_at_oom), "device free measured at the failure");
        assert_eq!(f.device, 0);
    }
    // The allocator's own final failure, through the annotation API, after its retries.
    let last = t.events.iter().rev().find(|e| e.kind() == Some(AllocFailed)).expect("annotated OOM");
    assert_eq!((last.failed_op(), last.requested, last.rc), (Some(BlockAlloc), requested, 2));
    assert_eq!(last.device_free(), Some(free_at_oom));
    // Every failed driver call is followed by a device sample of the same measurement.
    for (i, e) in t.events.iter().enumerate() {
        if e.kind() == Some(AllocFailed) && e.failed_op() == Some(MemAlloc) {
            let next = &t.events[i + 1];
            assert_eq!((next.kind(), next.device_free), (Some(DeviceInfo), e.device_free));
        }
    }
    // The balloon (cuMemAlloc_v2, direct) and the 20 segments (cudaMalloc), once each.
    let allocs = t.events.iter().filter(|e| e.kind() == Some(MemAlloc)).count();
    assert_eq!(allocs, 1 + 20);
}

/// The framework annotation API: the workload's caching allocator announces each segment it
/// owns and each block it hands out or takes back (printed as `EVENT` lines), and the shim turns
/// each call into one event, in order, with the allocator's own sizes.
#[test]
fn framework_annotations_become_block_events() {
    let run = traced_run(&["frag-oom"], &[]);
    assert!(run.output.status.success(), "{}", run.stdout());
    let announced: Vec<(EventKind, u64, u64, u64)> = lines_with(&run.stdout(), "EVENT")
        .iter()
        .filter_map(|l| {
            let a = || addr(field(l, "addr"));
            let num = |k: &str| field(l, k).parse::<u64>().unwrap_or(0);
            match field(l, "kind") {
                "segment_alloc" => Some((Adopt, a(), 0, 0)),
                "block_alloc" => Some((BlockAlloc, a(), num("size"), num("requested"))),
                "block_free" => Some((BlockFree, a(), 0, 0)),
                _ => None,
            }
        })
        .collect();
    let t = run.only();
    let got: Vec<(EventKind, u64, u64, u64)> = t
        .events
        .iter()
        .filter(|e| matches!(e.kind(), Some(Adopt | BlockAlloc | BlockFree)))
        .map(|e| (e.kind().expect("known"), e.addr, e.size, e.requested))
        .collect();
    assert_eq!(got, announced);
    assert!(got.len() > 40, "20 segments, 30 blocks, 10 frees: {}", got.len());
    for e in t.events.iter().filter(|e| e.kind() == Some(BlockAlloc)) {
        assert_ne!(e.flags & gpufrag_wire::event::F_BLOCK_SIZE_KNOWN, 0);
        assert_eq!(e.device, 0);
    }
    // Each segment is adopted right after the cudaMalloc that made it.
    for (i, e) in t.events.iter().enumerate().filter(|(_, e)| e.kind() == Some(Adopt)) {
        let seg = t.events[..i].iter().rev().find(|p| p.kind() == Some(MemAlloc)).expect("a segment before");
        assert_eq!(seg.addr, e.addr);
    }
}
