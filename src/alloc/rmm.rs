//! RAPIDS RMM's `pool_memory_resource` (cuDF, cuML, cuGraph; `rmm.reinitialize(pool_allocator=True)`
//! in Python): its rules and its [`AllocatorModel`].
//!
//! The rules are those of rapidsai/rmm (read at cpp/src/mr/detail/pool_memory_resource_impl.cpp,
//! commit eae1048a1ae414f16067e60a8fb124a9de1f576e, cpp/include/rmm/mr/detail/coalescing_free_list.hpp
//! at 0059816216e838bfbf3146461e5139bebe3cc664, and stream_ordered_memory_resource.hpp):
//! - a request is aligned up to 256 bytes (`rmm::align_up(size, CUDA_ALLOCATION_ALIGNMENT)` in
//!   `stream_ordered_memory_resource::do_allocate`); 0 bytes get no block;
//! - the free list is searched best fit (`coalescing_free_list::get_block`: the smallest free
//!   block that fits, the first in address order among equals) and the block found is always
//!   split at the aligned size (`allocate_from_block`: the rest, any size, stays a free block);
//! - a freed block merges with its free neighbours unless the later one is the head of an
//!   upstream allocation (`is_contiguous_before`: `not b.is_head()`): free space never merges
//!   across two upstream (driver) allocations, even when their addresses touch;
//! - when nothing fits the pool grows (`expand_pool`, `size_to_grow`): by `max(size, pool size)`
//!   (it doubles) without a maximum; with `maximum_pool_size` by `max(size, remaining / 2)` if the
//!   request fits in what remains, else it fails; a failed upstream allocation is retried at half
//!   the size down to the request (`try_to_expand`), then `rmm::out_of_memory`;
//! - nothing goes back to the driver while the pool lives: `release()` (every upstream block) runs
//!   only in the destructor. So every free byte of the pool is stranded, a wholly free upstream
//!   block's too, and nothing is releasable: the rule [`AllocatorModel::region_free`] gives here.
//!
//! Not modelled: per-stream free lists (a block freed on one stream is found by another only
//! after a synchronisation, `get_block_from_other_stream`): the map sees one free list, which is
//! what a single-stream program has.

use super::model::{AllocatorModel, FreeRun, OomFigures, OomKind, RegionFree, Rules};
use crate::units::human_bytes;

/// The alignment of every block: 256 bytes (`rmm::CUDA_ALLOCATION_ALIGNMENT`).
pub const ALIGNMENT: u64 = 256;

/// `align_up(requested, 256)`: the block a request gets (0 stays 0: no block).
pub fn block_size(requested: u64) -> u64 {
    requested.div_ceil(ALIGNMENT).saturating_mul(ALIGNMENT)
}

/// `size_to_grow`: the upstream allocation the pool asks for when no free block fits `size`
/// (aligned) bytes, with `pool` bytes held and `maximum` the pool's cap; 0 = it cannot grow.
pub fn size_to_grow(size: u64, pool: u64, maximum: Option<u64>) -> u64 {
    let aligned = block_size(size);
    match maximum {
        Some(max) => {
            let remaining = block_size(max.saturating_sub(pool));
            if aligned <= remaining {
                aligned.max(remaining / 2)
            } else {
                0
            }
        }
        None => aligned.max(pool),
    }
}

/// RMM's pool as the map, the analysis and the outputs see it.
pub struct RmmPool;

/// The one instance, listed in the registration table.
pub static MODEL: RmmPool = RmmPool;

impl AllocatorModel for RmmPool {
    fn name(&self) -> &'static str {
        "rmm"
    }

    fn allocator(&self) -> &'static str {
        "RMM's pool_memory_resource"
    }

    fn block_size(&self, _rules: &Rules, _run: FreeRun, requested: u64) -> u64 {
        block_size(requested)
    }

    /// `try_to_expand`: a failed upstream allocation is retried at half the size down to the
    /// request.
    fn retries_smaller(&self) -> bool {
        true
    }

    /// Nothing is given back while the pool lives: all its free bytes are stranded.
    fn region_free(&self, free: u64, _live_blocks: u64) -> Option<RegionFree> {
        Some(RegionFree { stranded: free, releasable: 0 })
    }

    fn oom_fix(&self, kind: OomKind, f: &OomFigures) -> Option<String> {
        let h = human_bytes;
        match kind {
            OomKind::Fragmentation => Some(format!(
                "RMM's pool holds {} free, the largest free block {}: free blocks merge only inside one upstream allocation and the pool returns nothing until it is destroyed. Give it one upstream block for the whole run (initial_pool_size of the peak, rmm.reinitialize(pool_allocator=True, initial_pool_size=...)), so that every free byte can merge; or use rmm.mr.CudaAsyncMemoryResource (the driver's pool, which maps free pages together); or allocate the large buffers first",
                h(f.stranded + f.releasable),
                h(f.largest_free_block)
            )),
            OomKind::TrueOom => Some(format!(
                "the request is larger than all free memory, RMM's pool included (short by {}): make the data smaller or split it (cuDF: fewer rows per partition), or spill to host (rmm.mr.ManagedMemoryResource, cudf's spilling)",
                h(f.requested.saturating_sub(f.total_free()))
            )),
            OomKind::Inconclusive => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_256_byte_aligned_and_the_pool_doubles_or_halves_what_remains() {
        assert_eq!((block_size(0), block_size(1), block_size(256), block_size(257)), (0, 256, 256, 512));
        assert_eq!(size_to_grow(1000, 0, None), 1024);
        assert_eq!(size_to_grow(1000, 4096, None), 4096);
        assert_eq!(size_to_grow(1000, 0, Some(1 << 20)), 1 << 19);
        assert_eq!(size_to_grow(700 << 10, 0, Some(1 << 20)), 700 << 10);
        assert_eq!(size_to_grow(2 << 20, 0, Some(1 << 20)), 0);
    }
}
