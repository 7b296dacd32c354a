//! The caching allocator's rules: how PyTorch's `CUDACachingAllocator` turns a requested size
//! into a block and decides whether the rest of a free run is split off or swallowed.
//!
//! These are the rules of c10/cuda/CUDACachingAllocator.cpp (`round_size`, `should_split`,
//! `get_allocation_size`) and CUDAAllocatorConfig (`roundup_power2_divisions`,
//! `max_split_size`). The address map applies them when a block event carries only the requested
//! size (snapshot `alloc` entries, USDT `pytorch:malloc`), so that replayed block extents are the
//! allocator's own, byte for byte.

/// Smallest block, and the rounding unit: 512 bytes.
pub const MIN_BLOCK: u64 = 512;
/// Requests of at most 1 MiB are served from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Small-pool segments are 2 MiB.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Large requests under 10 MiB get a 20 MiB segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// The segment size for large requests under [`MIN_LARGE_ALLOC`].
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Larger segments are rounded up to 2 MiB.
pub const ROUND_LARGE: u64 = 2 << 20;
/// The driver's page: sub-2 MiB driver allocations share these.
pub const DRIVER_PAGE: u64 = 2 << 20;
/// Number of power-of-two intervals (1 MiB .. 64 GiB) for `roundup_power2_divisions`.
pub const ROUNDUP_INTERVALS: usize = 16;

/// One allocator configuration (`PYTORCH_CUDA_ALLOC_CONF`), as the snapshot's
/// `allocator_settings` records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorRules {
    /// Blocks of this size or more are never split (`max_split_size_mb`); `u64::MAX` = unlimited.
    pub max_split_size: u64,
    /// Divisions per power-of-two interval starting at 1 MiB (index 0) up to 32 GiB (index 15);
    /// 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
}

impl Default for AllocatorRules {
    fn default() -> Self {
        AllocatorRules { max_split_size: u64::MAX, roundup_power2_divisions: [0; ROUNDUP_INTERVALS] }
    }
}

fn floor_log2(v: u64) -> u32 {
    63 - v.max(1).leading_zeros()
}

impl AllocatorRules {
    /// `roundup_power2_divisions(size)`: the divisions configured for the interval holding `size`.
    fn divisions(&self, size: u64) -> u64 {
        let log = floor_log2(size) as i64;
        let start = floor_log2(1 << 20) as i64;
        let idx = (log - start).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }

    /// `round_size(size)`: the block size the allocator carves for a request of `size` bytes.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions(size);
        if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
            return roundup_power2_next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }

    /// Whether a (rounded) block size is served from the small pool.
    pub fn is_small(rounded: u64) -> bool {
        rounded <= SMALL_SIZE
    }

    /// `should_split`: whether a free run of `run` bytes serving a block of `rounded` bytes is
    /// split (the rest stays a free block) or handed out whole (the block swallows the rest).
    ///
    /// `expandable`: the run lies in an expandable segment (a mapped range). PyTorch then splits
    /// any remainder of 512 bytes or more in both pools and ignores `max_split_size`
    /// (`block->pool->is_small || CUDAAllocatorConfig::expandable_segments()`).
    pub fn should_split(&self, run: u64, rounded: u64, expandable: bool) -> bool {
        let remaining = run.saturating_sub(rounded);
        if Self::is_small(rounded) || expandable {
            remaining >= MIN_BLOCK
        } else {
            rounded < self.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `get_allocation_size`: the segment the allocator asks the driver for, for a rounded size.
    pub fn segment_size(rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
        }
    }
}

/// `roundup_power2_next_division`: round up to the next of `divisions` steps between two powers
/// of two.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << floor_log2(size);
    let division = floor >> floor_log2(divisions);
    if division == 0 {
        return floor << 1;
    }
    let round_floor = size & !(division - 1);
    if round_floor == size {
        size
    } else {
        round_floor + division
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_size_is_512_multiples_with_512_minimum() {
        let r = AllocatorRules::default();
        assert_eq!(r.round_size(0), 512);
        assert_eq!(r.round_size(1), 512);
        assert_eq!(r.round_size(512), 512);
        assert_eq!(r.round_size(513), 1024);
        assert_eq!(r.round_size(314_572_800), 314_572_800);
    }

    #[test]
    fn split_thresholds_differ_by_pool() {
        let r = AllocatorRules::default();
        // small pool: a remainder of 512 bytes or more is split off
        assert!(r.should_split(2 << 20, 1024, false));
        assert!(!r.should_split(1024 + 511, 1024, false));
        // large pool: only a remainder above 1 MiB is split off
        assert!(r.should_split(500 << 20, 300 << 20, false));
        assert!(!r.should_split((300 << 20) + (1 << 20), 300 << 20, false));
        assert!(r.should_split((300 << 20) + (1 << 20) + 512, 300 << 20, false));
    }

    #[test]
    fn expandable_segments_split_any_remainder_of_512_bytes() {
        let r = AllocatorRules { max_split_size: 200 << 20, ..Default::default() };
        assert!(r.should_split((300 << 20) + 512, 300 << 20, true));
        assert!(!r.should_split((300 << 20) + 511, 300 << 20, true));
        assert!(r.should_split((2 << 20) + 512, 2 << 20, true));
    }

    #[test]
    fn max_split_size_stops_splitting_big_blocks() {
        let r = AllocatorRules { max_split_size: 200 << 20, ..Default::default() };
        assert!(!r.should_split(500 << 20, 300 << 20, false));
        assert!(r.should_split(500 << 20, 100 << 20, false));
    }

    #[test]
    fn power2_divisions_round_to_the_next_division() {
        let r = AllocatorRules { roundup_power2_divisions: [4; ROUNDUP_INTERVALS], ..AllocatorRules::default() };
        // 1200 MiB lies in [1 GiB, 2 GiB): quarters of 256 MiB → 1280 MiB
        assert_eq!(r.round_size(1200 << 20), 1280 << 20);
        assert_eq!(r.round_size(1 << 30), 1 << 30);
        // at or below 512 × divisions the plain rounding applies
        assert_eq!(r.round_size(1500), 1536);
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(AllocatorRules::segment_size(512), 2 << 20);
        assert_eq!(AllocatorRules::segment_size(3 << 20), 20 << 20);
        assert_eq!(AllocatorRules::segment_size((10 << 20) + 1), 12 << 20);
    }
}
