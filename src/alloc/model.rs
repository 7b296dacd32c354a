//! The one trait every caching allocator model implements ([`AllocatorModel`]), and the plain
//! values it speaks in: the settings blocks are placed under ([`Rules`]), a segment's free bytes
//! split by what a release could return ([`RegionFree`]), and an out-of-memory failure's figures
//! ([`OomFigures`], [`OomKind`]). The address map asks a model how large a block is and what its
//! segment's free bytes are worth; the analysis asks it what an OOM means in its terms and what
//! to do about it; the outputs ask its name. Nothing here knows any one allocator: each
//! implements the trait in its own file and is listed once in `REGISTRY` (src/alloc/mod.rs).

use super::bfc::BfcRules;
use super::pytorch::AllocatorRules;

/// The settings a process's blocks are placed under: one field per allocator that has settings
/// of its own which change a block's extent (PyTorch's `PYTORCH_CUDA_ALLOC_CONF`, BFC's
/// `fragmentation_fraction`); allocators without any read none of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// PyTorch's rounding and split rules.
    pub pytorch: AllocatorRules,
    /// XLA BFC's chunk rules.
    pub bfc: BfcRules,
}

/// Where a block lands: the free run it starts (its bytes from the block's address to the run's
/// end) and whether that run lies in a mapped (VMM) range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeRun {
    /// Bytes from the block's address to the end of its free run.
    pub avail: u64,
    /// The run lies in a mapped range (PyTorch's expandable segments, XLA's VMM pool).
    pub mapped: bool,
}

/// A segment's free bytes, split by what a release could return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionFree {
    /// Free bytes no call of the allocator gives back while its live blocks pin them.
    pub stranded: u64,
    /// Free bytes a cache release could return to the driver.
    pub releasable: u64,
}

/// The two verdicts an allocator words for itself; anything else it leaves to the analysis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomKind {
    /// More was asked than is free, cache included.
    TrueOom,
    /// Enough is free, none of it in one piece.
    Fragmentation,
    /// The traced figures say it should have fit.
    Inconclusive,
}

/// An out-of-memory failure's figures, as the address map computed them at the failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomFigures {
    /// Bytes asked for.
    pub requested: u64,
    /// Device free bytes counted for this allocator (0 where it does not count them).
    pub device_free: u64,
    /// Free bytes pinned by live blocks.
    pub stranded: u64,
    /// Free bytes a cache release returns.
    pub releasable: u64,
    /// The largest free block.
    pub largest_free_block: u64,
}

impl OomFigures {
    /// Everything free to this allocator: device free, stranded and releasable.
    pub fn total_free(&self) -> u64 {
        self.device_free.saturating_add(self.stranded).saturating_add(self.releasable)
    }
}

/// One caching allocator: how it carves a request out of a free run, what its segments' free
/// bytes are worth, what an OOM is in its terms, its names and its flag bits on the wire.
/// Methods with a default are the caching allocator's common case (PyTorch's): a model says only
/// where its allocator differs.
pub trait AllocatorModel: Sync {
    /// The name in JSON, metric attributes and on screen (`pytorch`): a bounded set of values.
    fn name(&self) -> &'static str;

    /// The allocator's own name, for sentences (`PyTorch's caching allocator`).
    fn allocator(&self) -> &'static str;

    /// Flag bits of its own that name it on block and adopt events (`crate::event::F_ALLOC_XLA_BFC`,
    /// `F_ALLOC_CUPY`: the allocators older sources knew). The default, 0, names it by its place
    /// in the registration table in the allocator field (`F_ALLOC_ID_MASK`, `Framework::flags`);
    /// for the first place, PyTorch's, 0 is what every source without allocator bits meant.
    fn flags(&self) -> u32 {
        0
    }

    /// The extent of the block a request of `requested` bytes gets at the start of `run`, where
    /// an event carries the request alone: the allocator's rounding and its split rule. A value
    /// over `run.avail` (or 0) is refused by the map as a block that does not fit.
    fn block_size(&self, rules: &Rules, run: FreeRun, requested: u64) -> u64;

    /// Its own rule for a segment's free bytes, where it differs from the caching rule
    /// (stranded while a block is live, releasable when none is, a mapped segment's free pages
    /// releasable one by one); `None` keeps that rule. The map marks a segment with the model of
    /// the first block placed in it when this is `Some`.
    fn region_free(&self, _free: u64, _live_blocks: u64) -> Option<RegionFree> {
        None
    }

    /// Whether the device's free bytes count as room for it: `false` for a pool that never grows
    /// past what it holds (XLA's preallocated pool), whose OOM is in the pool's terms.
    fn counts_device_free(&self) -> bool {
        true
    }

    /// Whether it refuses requests over an allowed-bytes cap of its own (PyTorch's
    /// `set_per_process_memory_fraction`): then an OOM over the cap is `allowed_limit`.
    fn has_allowed_limit(&self) -> bool {
        false
    }

    /// Whether it retries a failed upstream (driver) allocation at a smaller size before giving
    /// up (RMM's `try_to_expand` halves down to the request): then a failed driver allocation
    /// followed by a smaller failed one of the same thread is one of its tries, not an OOM of
    /// its own.
    fn retries_smaller(&self) -> bool {
        false
    }

    /// The keys of its own report (the framework's Python statistics) shown on one line, in order.
    fn report_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// The keys of its own report read right after an OOM that give the failure's figures, as
    /// (pool bytes, bytes in use, largest free block), where the map cannot see inside its pool.
    fn oom_report_keys(&self) -> Option<[&'static str; 3]> {
        None
    }

    /// The verdict in its own words, where it has them.
    fn oom_explanation(&self, _kind: OomKind, _f: &OomFigures) -> Option<String> {
        None
    }

    /// What to do about an OOM of this kind, where it has its own fixes; `None` leaves the fix to
    /// the analysis (PyTorch's settings, the driver level).
    fn oom_fix(&self, _kind: OomKind, _f: &OomFigures) -> Option<String> {
        None
    }

    /// The fix as one shell command to copy, where it is a setting of the allocator.
    fn fix_command(&self, _kind: OomKind) -> Option<&'static str> {
        None
    }
}
