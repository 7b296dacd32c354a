//! The framework annotation API (`include/gpufrag_annotate.h`): a caching allocator gpufrag cannot
//! see into says what it does with its blocks, and each call becomes one event in the ring.
//! Programs look these up with `dlsym(RTLD_DEFAULT, ...)` and call them only when found, so they
//! run unchanged without the shim.
//!
//! | call | event |
//! |---|---|
//! | `gpufrag_annotate_segment(addr, device)` | `Adopt{addr}`: the allocator owns the segment holding `addr` |
//! | `gpufrag_annotate_block_alloc(addr, size, requested, device)` | `BlockAlloc{addr, size, requested}`, `F_BLOCK_SIZE_KNOWN` when `size` > 0 |
//! | `gpufrag_annotate_block_alloc_on_stream(addr, size, requested, device, stream)` | the same, with the block's `stream` |
//! | `gpufrag_annotate_block_free(addr, device)` | `BlockFree{addr}` |
//! | `gpufrag_annotate_oom(requested, device_free, device)` | `AllocFailed{requested, rc = 2, op = BlockAlloc}`, device free when not `UINT64_MAX` |
//! | `gpufrag_annotate_segment_by`, `_block_alloc_by`, `_oom_by` (`..., allocator`) | the same, the allocator id in the allocator field (bits 16–19, `allocator_field`) |
//!
//! The plain calls name no allocator (the default, PyTorch's caching rules: what a program built
//! before the `_by` calls meant); their signatures are an ABI and stay as they are.
//! Like every hook they never block, never allocate and never fail; with tracing off they do
//! nothing. `gpufrag_annotate_block_free` is recorded when it is called, so an allocator must
//! call it before the block can be handed out again (before it returns the block to its free
//! lists), for the same reason the shim records a `cudaFree` before making it. A device outside `i16` (or negative) is recorded as -1 (unknown).

use gpufrag_wire::event::{allocator_field, EventKind, F_BLOCK_SIZE_KNOWN, F_DEVICE_FREE_KNOWN, F_FAILED};

use crate::hook::{self, Call};

/// `CUDA_ERROR_OUT_OF_MEMORY`, the code an allocator's final failure is recorded with.
const OUT_OF_MEMORY: i32 = 2;

fn device(d: i32) -> i16 {
    i16::try_from(d).ok().filter(|&d| d >= 0).unwrap_or(-1)
}

#[no_mangle]
pub extern "C" fn gpufrag_annotate_segment(addr: u64, dev: i32) {
    gpufrag_annotate_segment_by(addr, dev, 0);
}

/// `gpufrag_annotate_segment` of the allocator `allocator` (a `GPUFRAG_ALLOCATOR_*` id).
#[no_mangle]
pub extern "C" fn gpufrag_annotate_segment_by(addr: u64, dev: i32, allocator: i32) {
    if let Some(g) = hook::enter() {
        let flags = allocator_field(allocator.into());
        g.record(|| hook::annotation(Call { addr, ..Call::new(EventKind::Adopt, 0) }, device(dev), flags, 0, None));
    }
}

#[no_mangle]
pub extern "C" fn gpufrag_annotate_block_alloc(addr: u64, size: u64, requested: u64, dev: i32) {
    gpufrag_annotate_block_alloc_by(addr, size, requested, dev, 0);
}

/// `gpufrag_annotate_block_alloc` of the allocator `allocator` (a `GPUFRAG_ALLOCATOR_*` id).
#[no_mangle]
pub extern "C" fn gpufrag_annotate_block_alloc_by(addr: u64, size: u64, requested: u64, dev: i32, allocator: i32) {
    if let Some(g) = hook::enter() {
        g.record(|| {
            let flags = allocator_field(allocator.into()) | if size > 0 { F_BLOCK_SIZE_KNOWN } else { 0 };
            hook::annotation(Call { addr, size, requested, ..Call::new(EventKind::BlockAlloc, 0) }, device(dev), flags, 0, None)
        });
    }
}

/// `gpufrag_annotate_block_alloc` with the stream the block was allocated on (PyTorch's trace
/// tracker, python/torch_tracker.cpp: its pools are per stream, and the whatif replay keeps them
/// apart).
#[no_mangle]
pub extern "C" fn gpufrag_annotate_block_alloc_on_stream(addr: u64, size: u64, requested: u64, dev: i32, stream: u64) {
    if let Some(g) = hook::enter() {
        g.record(|| {
            let flags = if size > 0 { F_BLOCK_SIZE_KNOWN } else { 0 };
            hook::annotation(Call { addr, size, requested, stream, ..Call::new(EventKind::BlockAlloc, 0) }, device(dev), flags, 0, None)
        });
    }
}

#[no_mangle]
pub extern "C" fn gpufrag_annotate_block_free(addr: u64, dev: i32) {
    if let Some(g) = hook::enter() {
        g.record(|| hook::annotation(Call { addr, ..Call::new(EventKind::BlockFree, 0) }, device(dev), 0, 0, None));
    }
}

#[no_mangle]
pub extern "C" fn gpufrag_annotate_oom(requested: u64, device_free: u64, dev: i32) {
    gpufrag_annotate_oom_by(requested, device_free, dev, 0);
}

/// `gpufrag_annotate_oom` of the allocator `allocator` (a `GPUFRAG_ALLOCATOR_*` id).
#[no_mangle]
pub extern "C" fn gpufrag_annotate_oom_by(requested: u64, device_free: u64, dev: i32, allocator: i32) {
    if let Some(g) = hook::enter() {
        g.record(|| {
            let known = device_free != u64::MAX;
            let flags = F_FAILED | allocator_field(allocator.into()) | if known { F_DEVICE_FREE_KNOWN } else { 0 };
            let c = Call { requested, ..Call::new(EventKind::AllocFailed, OUT_OF_MEMORY) };
            let free = if known { device_free } else { 0 };
            hook::annotation(c, device(dev), flags, free, Some(EventKind::BlockAlloc));
        });
    }
}
