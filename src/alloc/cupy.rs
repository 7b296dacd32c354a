//! CuPy's device memory pool (`cupy.cuda.memory.MemoryPool`, `SingleDeviceMemoryPool` in
//! cupy/cuda/memory.pyx): its rules, and the fixes that go with its out-of-memory error.
//!
//! A request is rounded up to 512 bytes (`_round_size`, `ALLOCATION_UNIT_SIZE`); free chunks sit
//! in bins by size (`bin_index_from_size`: size / 512 − 1) and the smallest bin with a free chunk
//! that fits serves it; the chunk is split at the rounded size and the rest, a multiple of 512
//! bytes, stays a free chunk; a freed chunk merges with its free neighbours inside the same
//! driver allocation (`Memory`), never across two. When nothing fits the pool calls
//! `cudaMalloc` for exactly the rounded size, and on failure frees its unused driver allocations
//! (`free_all_blocks`) and tries once more before raising `OutOfMemoryError`.
//! The pool's figures: `used_bytes()` (chunks in use), `total_bytes()` (driver allocations held),
//! `free_bytes()` (their difference). The Python hook's `MemoryHook` sends exact chunk sizes, so
//! the address map needs only [`chunk_size`] where a source knows the request alone.

use super::model::{AllocatorModel, FreeRun, OomFigures, OomKind, Rules};
use crate::units::human_bytes;

/// The rounding unit: 512 bytes.
pub const ALLOCATION_UNIT: u64 = 512;

/// `_round_size`: the chunk a request of `requested` bytes gets.
pub fn round_size(requested: u64) -> u64 {
    requested.div_ceil(ALLOCATION_UNIT).saturating_mul(ALLOCATION_UNIT)
}

/// The extent of the chunk served from a free chunk of `chunk` bytes: the pool always splits at
/// the rounded size. `None` when it does not fit (or asks for 0 bytes, which CuPy serves with no
/// memory at all).
pub fn chunk_size(chunk: u64, requested: u64) -> Option<u64> {
    let r = round_size(requested);
    (r != 0 && r <= chunk).then_some(r)
}

/// What to do about a CuPy out-of-memory error, and what each costs.
pub const FIXES: &[&str] = &[
    "cupy.get_default_memory_pool().free_all_blocks() at a phase change: returns the pool's unused driver allocations (the next allocations pay cudaMalloc again)",
    "a pool limit, cupy.get_default_memory_pool().set_limit(size=...) or CUPY_GPU_MEMORY_LIMIT: the pool frees its cache before it reaches the card's end (other libraries keep their share; a request above the limit fails early)",
    "cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc): the driver's stream-ordered pool, which can map free pages together (a driver call per allocation)",
];

/// CuPy's pool as the map, the analysis and the outputs see it.
pub struct Cupy;

/// The one instance, listed in the registration table.
pub static MODEL: Cupy = Cupy;

impl AllocatorModel for Cupy {
    fn name(&self) -> &'static str {
        "cupy"
    }

    fn allocator(&self) -> &'static str {
        "CuPy's memory pool"
    }

    fn flags(&self) -> u32 {
        crate::event::F_ALLOC_CUPY
    }

    fn block_size(&self, _rules: &Rules, _run: FreeRun, requested: u64) -> u64 {
        round_size(requested)
    }

    fn report_keys(&self) -> &'static [&'static str] {
        &["used_bytes", "total_bytes", "free_bytes"]
    }

    fn oom_fix(&self, kind: OomKind, f: &OomFigures) -> Option<String> {
        let h = human_bytes;
        match kind {
            OomKind::Fragmentation => Some(format!(
                "CuPy's pool holds {} free, {} of it in unused driver allocations, the largest free chunk {}: {}",
                h(f.stranded + f.releasable),
                h(f.releasable),
                h(f.largest_free_block),
                FIXES.join("; or ")
            )),
            OomKind::TrueOom => Some(format!(
                "the request is larger than all free memory, CuPy's cache included (short by {}): make arrays smaller or fewer; {}",
                h(f.requested.saturating_sub(f.total_free())),
                FIXES[0]
            )),
            OomKind::Inconclusive => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_512_byte_units_and_the_rest_is_always_split() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(chunk_size(4096, 513), Some(1024));
        assert_eq!(chunk_size(1024, 1025), None);
        assert_eq!(chunk_size(1024, 0), None);
    }
}
