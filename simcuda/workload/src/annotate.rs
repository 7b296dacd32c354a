//! Tells a tracer what the workload's caching allocator does, through gpufrag's framework
//! annotation API (`include/gpufrag_annotate.h`), compiled in from `src/annotate.c` exactly as a C
//! allocator would use it: each call fires a USDT probe `gpufrag:*` (seen by `gpufrag attach` and
//! `gpufrag agent`) and calls the LD_PRELOAD shim's function when the shim is loaded (`gpufrag
//! run`); without either it is a load and a branch.

extern "C" {
    fn simcuda_announce_segment(addr: u64, device: i32);
    fn simcuda_announce_block_alloc(addr: u64, size: u64, requested: u64, device: i32);
    fn simcuda_announce_block_free(addr: u64, device: i32);
    fn simcuda_announce_oom(requested: u64, device_free: u64, device: i32);
}

/// The allocator owns the segment at `addr`.
pub fn segment(addr: u64) {
    // SAFETY: a C function of src/annotate.c taking plain integers.
    unsafe { simcuda_announce_segment(addr, 0) }
}

/// A block was handed out.
pub fn block_alloc(addr: u64, size: u64, requested: u64) {
    // SAFETY: as above.
    unsafe { simcuda_announce_block_alloc(addr, size, requested, 0) }
}

/// A block went back to the cache.
pub fn block_free(addr: u64) {
    // SAFETY: as above.
    unsafe { simcuda_announce_block_free(addr, 0) }
}

/// A request failed for good.
pub fn oom(requested: u64, device_free: u64) {
    // SAFETY: as above.
    unsafe { simcuda_announce_oom(requested, device_free, 0) }
}
