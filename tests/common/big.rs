//! Big inputs made on the spot (issue 23, item 4: cost bounded by size): a record file of any
//! length whose figures are known without replaying it, for the tests that read it under a small
//! `ulimit -v` (tests/big_inputs.rs) and the hand-run at 4 GB (examples/big_record.rs).
//!
//! The record: one process (pid 7, device 0) under PyTorch's default settings allocating 20 MiB
//! blocks, `live` of them alive at a time (block i is freed right before block i + live takes
//! its place), and every `oom_every`-th allocation a driver allocation of 1 TiB that fails and is
//! never recovered (an OOM). A 20 MiB request is a large-pool block of its own 20 MiB segment, so
//! the first `live` allocations each `cudaMalloc` one and every later one reuses the segment the
//! block before it freed: what PyTorch's allocator does, so that `whatif`'s self-check holds.
//! Events are 1 µs apart.

#![allow(dead_code)]

use gpufrag::event::{Event, EventKind, F_FAILED, F_FRAMEWORK_OWNED, F_SRC_SHIM};
use std::path::Path;

/// The first segment's address.
pub const BASE: u64 = 0x7f00_0000_0000;
/// Each block's size, and its segment's.
pub const BLOCK: u64 = 20 << 20;
/// Address distance between segments.
pub const STRIDE: u64 = 32 << 20;

/// What a record of [`write_record`] must analyse to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// Entries in the file (the end marker left out).
    pub events: u64,
    /// Reserved bytes at the end.
    pub reserved: u64,
    /// Allocated bytes at the end.
    pub allocated: u64,
    /// Failed driver allocations written (the OOM rule groups a run of them into one OOM).
    pub failures: u64,
    /// Requests of the caching allocator (an allocation, its free requested, its free completed).
    pub requests: u64,
}

/// Writes a record of `allocs` block allocations, `live` (1 to 4096) alive at a time, an OOM
/// every `oom_every` allocations (0: none).
pub fn write_record(path: &Path, allocs: u64, live: u64, oom_every: u64) -> std::io::Result<Expect> {
    assert!(live > 0 && live <= 4096);
    let mut w = gpufrag::record::Writer::create(path)?;
    let mut ts = 1_000u64;
    let mut tick = || {
        ts += 1_000;
        ts
    };
    let (mut events, mut ooms, mut frees) = (0u64, 0u64, 0u64);
    for i in 0..allocs {
        let slot = BASE + (i % live) * STRIDE;
        if i < live {
            let seg = Event {
                addr: slot,
                size: BLOCK,
                requested: BLOCK,
                flags: F_FRAMEWORK_OWNED | F_SRC_SHIM,
                ts_ns: tick(),
                ..Event::new(EventKind::MemAlloc, 7, 0)
            };
            w.write(&seg)?;
            events += 1;
        } else {
            w.write(&Event { addr: slot, size: BLOCK, ts_ns: tick(), flags: F_SRC_SHIM, ..Event::new(EventKind::BlockFree, 7, 0) })?;
            events += 1;
            frees += 1;
        }
        if oom_every > 0 && i % oom_every == oom_every - 1 {
            w.write(&Event {
                size: 1 << 40,
                requested: 1 << 40,
                ts_ns: tick(),
                flags: F_FAILED | F_SRC_SHIM,
                op: EventKind::MemAlloc as u16,
                rc: 2,
                tid: 7,
                ..Event::new(EventKind::AllocFailed, 7, 0)
            })?;
            events += 1;
            ooms += 1;
        }
        w.write(&Event {
            addr: slot,
            size: BLOCK,
            requested: BLOCK,
            ts_ns: tick(),
            flags: F_SRC_SHIM,
            ..Event::new(EventKind::BlockAlloc, 7, 0)
        })?;
        events += 1;
    }
    w.finish()?;
    Ok(Expect {
        events,
        failures: ooms,
        reserved: allocs.min(live) * BLOCK,
        allocated: allocs.min(live) * BLOCK,
        requests: allocs + 2 * frees,
    })
}
