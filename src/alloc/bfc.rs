//! XLA's BFC allocator (`tsl::BFCAllocator`, used by JAX, and by TensorFlow for GPU memory): its
//! rules and its [`AllocatorModel`] (the whole allocator, built on these rules, is the simulator's:
//! `crate::sim::bfc`).
//!
//! The rules are those of `xla/tsl/framework/bfc_allocator.{h,cc}` (openxla/xla, read at commit
//! 00df9eefeb544aab362c8934848ba94cdf262394):
//! - a request is rounded up to a multiple of 256 bytes (`RoundedBytes`, `kMinAllocationSize`);
//! - free chunks sit in 21 bins, bin `b` holding chunks of `256 << b` up to twice that, the last
//!   everything from 256 MiB up (`BinNumForSize`); a bin is ordered by (size, address), so the
//!   search (`FindChunkPtr`, from the request's bin upward, first chunk that fits) takes the
//!   smallest free chunk that fits, the lowest address among equals: best fit;
//! - the chosen chunk is split (`SplitChunk`) when it is at least twice the rounded size or
//!   exceeds it by at least the internal-fragmentation cap (128 MiB unless
//!   `fragmentation_fraction` sets it to a share of the limit); otherwise the whole chunk is
//!   handed out and its rest is padding (`ShouldSplitChunk`);
//! - a freed chunk merges with its free neighbours inside its region, never across regions
//!   (`TryToCoalesce`), unless the sub-allocator coalesces regions (VMM: a region that extends
//!   the previous one continues its chunk list);
//! - when nothing fits, the pool grows (`Extend`): a region of `curr_region_allocation_bytes`,
//!   doubled until it covers the request, capped by what is left under the limit; the size for
//!   the next region doubles after each growth that did not need doubling. With `allow_growth`
//!   (JAX's `XLA_PYTHON_CLIENT_PREALLOCATE=false`) the first region is 2 MiB; without it (JAX's
//!   default) the first region is the whole limit: one region, the preallocated pool. A failed
//!   driver allocation backs off by 10 % steps down to the request;
//! - the figures are BFC's own (`GetStats`, JAX's `memory_stats()`): `bytes_in_use` (chunk sizes,
//!   padding included), `pool_bytes` (regions), `largest_free_block_bytes` (`LargestFreeChunk`)
//!   and its fragmentation, `(pool_bytes − bytes_in_use − largest free chunk) / (pool_bytes −
//!   bytes_in_use)` (`GetFragmentation`).
//!
//! - what a pool's free bytes are worth (`region_free`): BFC gives a region back to the driver
//!   only when it holds no chunk in use, and only from `DeallocateFreeRegions`, which runs when an
//!   allocation fails with `allow_growth` (JAX's `XLA_PYTHON_CLIENT_PREALLOCATE=false`); the
//!   preallocated pool (JAX's default) stays mapped until the process ends. So the free bytes of a
//!   region that holds a live chunk are stranded (PyTorch's rule: free space in a segment pinned
//!   by a live block; no BFC call frees it), and only a wholly free region is releasable. The
//!   whole pool is framework memory (`framework_reserved` = `pool_bytes`). This is the rule live
//!   capture, replay and the OOM verdict all use (the address map calls it for every segment
//!   that holds a BFC chunk), not the mapped-segment one (VMM pages unmapped one by one), which
//!   XLA never does.
//!
//! Not modelled: alignments above 256 bytes (JAX asks for 256 at most; a larger one would split
//! off an aligned prefix), spatial partitioning (off by default), freed-at timestamps (off in
//! JAX), garbage collection of free regions (TensorFlow's `TF_ENABLE_GPU_GARBAGE_COLLECTION`).
//!
//! The address map places BFC blocks with [`BfcRules`] alone (a block starts at its free chunk's
//! start, which is a free run of the map, so the split rule decides its extent); `BfcAllocator`
//! (src/sim/bfc.rs) is the whole allocator, for replaying requests under other settings and as the
//! model the property test checks against a naive one.

use super::model::{AllocatorModel, FreeRun, OomFigures, OomKind, RegionFree, Rules};
use crate::units::human_bytes;

/// The rounding unit and smallest chunk: 256 bytes (`kMinAllocationSize`).
pub const MIN_ALLOCATION: u64 = 256;
/// Number of bins (`kNumBins`).
pub const NUM_BINS: usize = 21;
/// The default cap on a chunk's padding before it is split: 128 MiB.
pub const DEFAULT_MAX_INTERNAL_FRAGMENTATION: u64 = 128 << 20;
/// The first region with `allow_growth`: 2 MiB (or the limit, when smaller).
pub const GROWTH_FIRST_REGION: u64 = 2 << 20;

/// The per-chunk rules: rounding, bins, the split decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfcRules {
    /// A chunk whose rest (beyond the rounded request) reaches this is split even when it is
    /// less than twice the request.
    pub max_internal_fragmentation: u64,
}

impl Default for BfcRules {
    fn default() -> Self {
        BfcRules { max_internal_fragmentation: DEFAULT_MAX_INTERNAL_FRAGMENTATION }
    }
}

impl BfcRules {
    /// The rules of an allocator with this limit and `fragmentation_fraction` (0 = unset).
    pub fn with_fraction(memory_limit: u64, fragmentation_fraction: f64) -> BfcRules {
        let cap = if fragmentation_fraction > 0.0 {
            (fragmentation_fraction * memory_limit as f64) as u64
        } else {
            DEFAULT_MAX_INTERNAL_FRAGMENTATION
        };
        BfcRules { max_internal_fragmentation: cap }
    }

    /// `RoundedBytes`: the request rounded up to 256 bytes (0 stays 0: BFC refuses it).
    pub fn round_bytes(bytes: u64) -> u64 {
        bytes.div_ceil(MIN_ALLOCATION).saturating_mul(MIN_ALLOCATION)
    }

    /// `BinNumForSize`: the bin of a chunk of `bytes`.
    pub fn bin_for_size(bytes: u64) -> usize {
        let v = bytes.max(MIN_ALLOCATION) >> 8;
        ((63 - v.leading_zeros()) as usize).min(NUM_BINS - 1)
    }

    /// `BinNumToSize`: the smallest chunk bin `b` holds.
    pub fn bin_size(b: usize) -> u64 {
        MIN_ALLOCATION << b
    }

    /// `ShouldSplitChunk`: whether a free chunk of `chunk` bytes serving `rounded` bytes is split
    /// (the rest becomes a free chunk) or handed out whole.
    pub fn should_split(&self, chunk: u64, rounded: u64) -> bool {
        chunk >= rounded.saturating_mul(2) || chunk.saturating_sub(rounded) >= self.max_internal_fragmentation
    }

    /// The extent of the chunk a request of `requested` bytes gets from a free chunk of `chunk`
    /// bytes at whose start it lands; `None` when it does not fit (or asks for 0 bytes).
    pub fn chunk_size(&self, chunk: u64, requested: u64) -> Option<u64> {
        let rounded = Self::round_bytes(requested);
        if rounded == 0 || rounded > chunk {
            return None;
        }
        Some(if self.should_split(chunk, rounded) { rounded } else { chunk })
    }
}

/// BFC's rule for the `free` bytes of a region holding `live_chunks` chunks in use: all stranded
/// while one chunk is live (the region stays mapped), all releasable when none is (a wholly free
/// region is the one thing BFC gives back). A preallocated pool is one region.
pub fn region_free(free: u64, live_chunks: u64) -> RegionFree {
    if live_chunks > 0 {
        RegionFree { stranded: free, releasable: 0 }
    } else {
        RegionFree { stranded: 0, releasable: free }
    }
}

/// XLA's BFC allocator as the map, the analysis and the outputs see it.
pub struct Bfc;

/// The one instance, listed in the registration table.
pub static MODEL: Bfc = Bfc;

impl AllocatorModel for Bfc {
    fn name(&self) -> &'static str {
        "xla"
    }

    fn allocator(&self) -> &'static str {
        "XLA's BFC allocator"
    }

    fn flags(&self) -> u32 {
        crate::event::F_ALLOC_XLA_BFC
    }

    fn block_size(&self, rules: &Rules, run: FreeRun, requested: u64) -> u64 {
        rules.bfc.chunk_size(run.avail, requested).unwrap_or_else(|| BfcRules::round_bytes(requested))
    }

    fn region_free(&self, free: u64, live_blocks: u64) -> Option<RegionFree> {
        Some(region_free(free, live_blocks))
    }

    /// The pool is what it holds: device free bytes are no room for it (preallocated, or capped
    /// by its limit), so its OOM is in the pool's terms.
    fn counts_device_free(&self) -> bool {
        false
    }

    fn report_keys(&self) -> &'static [&'static str] {
        &["bytes_in_use", "largest_free_block_bytes", "pool_bytes", "bytes_limit", "peak_bytes_in_use", "num_allocs"]
    }

    fn oom_report_keys(&self) -> Option<[&'static str; 3]> {
        Some(["pool_bytes", "bytes_in_use", "largest_free_block_bytes"])
    }

    fn oom_explanation(&self, kind: OomKind, f: &OomFigures) -> Option<String> {
        let h = human_bytes;
        Some(match kind {
            OomKind::TrueOom => format!("true OOM inside XLA's BFC pool: {} requested, {} free in the pool in all", h(f.requested), h(f.total_free())),
            OomKind::Fragmentation => format!(
                "fragmentation OOM inside XLA's BFC pool: {} requested and {} free in the pool, but its largest free chunk is {}",
                h(f.requested),
                h(f.total_free()),
                h(f.largest_free_block)
            ),
            OomKind::Inconclusive => format!(
                "inconclusive: {} requested and by the traced figures XLA's pool has a free chunk of {}; the failure comes from outside what was traced",
                h(f.requested),
                h(f.largest_free_block)
            ),
        })
    }

    fn oom_fix(&self, kind: OomKind, f: &OomFigures) -> Option<String> {
        let h = human_bytes;
        match kind {
            OomKind::Fragmentation => Some(format!(
                "XLA's BFC pool has {} free but not in one piece (largest free chunk {}). For JAX: XLA_PYTHON_CLIENT_PREALLOCATE=false lets the pool grow region by region from 2 MiB instead of one preallocated block (free chunks still merge only inside a region, the first steps pay driver allocations, and other processes can take what JAX has not claimed yet); XLA_PYTHON_CLIENT_MEM_FRACTION above the default .75 gives the pool more room (less for cuDNN/cuBLAS workspaces, NCCL and other processes); XLA_PYTHON_CLIENT_ALLOCATOR=platform drops the pool (every buffer its own driver allocation, freed at once: no fragmentation inside a pool, but a cuMemAlloc/cuMemFree per buffer, much slower; for debugging); or allocate the large buffer first, before smaller ones pin the space around it",
                h(f.stranded + f.releasable),
                h(f.largest_free_block)
            )),
            OomKind::TrueOom => Some(format!(
                "the request is larger than all free memory in XLA's BFC pool (short by {}): reduce the batch, donate buffers (jax.jit donate_argnums), rematerialise (jax.checkpoint), or raise XLA_PYTHON_CLIENT_MEM_FRACTION (less left for other libraries and processes)",
                h(f.requested.saturating_sub(f.stranded + f.releasable))
            )),
            OomKind::Inconclusive => None,
        }
    }

    fn fix_command(&self, kind: OomKind) -> Option<&'static str> {
        (kind == OomKind::Fragmentation).then_some("export XLA_PYTHON_CLIENT_PREALLOCATE=false")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn rounding_and_bins_follow_bfc() {
        assert_eq!(BfcRules::round_bytes(1), 256);
        assert_eq!(BfcRules::round_bytes(256), 256);
        assert_eq!(BfcRules::round_bytes(257), 512);
        assert_eq!(BfcRules::bin_for_size(1), 0);
        assert_eq!(BfcRules::bin_for_size(511), 0);
        assert_eq!(BfcRules::bin_for_size(512), 1);
        assert_eq!(BfcRules::bin_for_size(256 * MIB - 1), 19);
        assert_eq!(BfcRules::bin_for_size(256 * MIB), 20);
        assert_eq!(BfcRules::bin_for_size(100 * GIB), 20);
        for b in 0..NUM_BINS {
            let s = BfcRules::bin_size(b);
            assert_eq!(BfcRules::bin_for_size(s), b);
            assert_eq!(BfcRules::bin_for_size(s * 2 - 1), b);
        }
    }

    #[test]
    fn a_chunk_under_twice_the_request_is_handed_out_whole_unless_the_rest_reaches_128_mib() {
        let r = BfcRules::default();
        assert_eq!(r.chunk_size(1024, 600), Some(1024)); // rounded 768, 1024 < 1536
        assert_eq!(r.chunk_size(1536, 600), Some(768)); // exactly twice: split
        assert_eq!(r.chunk_size(300 * MIB, 200 * MIB), Some(300 * MIB)); // rest 100 MiB: kept as padding
        assert_eq!(r.chunk_size(400 * MIB, 272 * MIB), Some(272 * MIB)); // rest 128 MiB: split
        assert_eq!(r.chunk_size(100, 0), None);
        assert_eq!(r.chunk_size(512, 513), None);
    }
}
