//! The address map of one process on one device: driver segments, VMM mappings, stream-ordered
//! pool allocations, the framework blocks carved out of segments, and the driver's 2 MiB pages.
//!
//! Segments never overlap, so an ordered map keyed by start address answers "which segment holds
//! this address" in O(log n) (`range(..=addr).next_back()`); that is the interval query this map
//! needs. The segments themselves sit in a slab of slots, so that a block's segment is one index
//! away. Inside framework segments, blocks and free runs are kept by `tiling.rs`: per segment a
//! linked list of entries in address order, found by start address through a hash map, free runs
//! also by end address (B-tree) and by length (max-heap, the largest is its top, O(1)). Placing a
//! block at a free run's start and freeing a block cost O(1) hash operations and at most two
//! B-tree updates (benches/ingest.rs). Totals (reserved, stranded, releasable, ...) are
//! maintained incrementally: every update subtracts a segment's contribution, changes it, and
//! adds it back.
//!
//! Why no crate: `rangemap` coalesces touching ranges (driver segments must never merge with a
//! neighbour even when their addresses touch) and keeps no per-range aggregates; interval-tree
//! crates (`rust-lapper`, `iset`, `intervaltree`) answer overlap queries but keep neither the
//! free-run order, the neighbour links nor the incremental totals. Every update is O(log n)
//! (hash operations expected O(1)); cutting and joining mapped (VMM) segments relabels the
//! entries of the shorter side, amortised O(log n) per entry (small-to-large). Only an unmap
//! through live blocks (an anomaly) re-lays the whole segment.
//!
//! Robustness: every range the map keeps is non-empty and ends below 2^64 (`check_range`; others
//! are the `BadRange` anomaly), so no loop over segments, entries or pages can stall and no end
//! wraps. Figures taken from input that are not ranges (pool reserved bytes, physical handle
//! sizes) add up saturating: an absurd figure gives an absurd total, never a panic.
//! `check_invariants` recounts everything; debug builds run it after updates of small maps.
//!
//! A segment is *framework-owned* once a caching allocator is known to own it (the event says so,
//! or a framework block was placed in it). Only there is free space "cache": stranded when the
//! segment still holds a live block, releasable when it holds none. A segment no framework ever
//! touched is in use in full (a raw `cudaMalloc`, a JAX mapping, a balloon).

mod pages;
mod tiling;

pub use pages::PageOccupancy;

use crate::alloc::bfc::BfcRules;
use crate::alloc::pytorch::{AllocatorRules, DRIVER_PAGE};
use crate::alloc::Framework;
use crate::alloc::{FreeRun, Rules};
use crate::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_FRAMEWORK_OWNED};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::Excluded;
use tiling::{Spot, Tiling};

/// How the driver handed a segment out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// `cuMemAlloc` / `cudaMalloc`.
    Driver,
    /// `cuMemAllocPitch` / `cudaMallocPitch` / `cudaMalloc3D`.
    Pitch,
    /// `cuMemAllocManaged` / `cudaMallocManaged`.
    Managed,
    /// A maximal run of `cuMemMap`ped memory inside one reserved range.
    Mapped,
    /// A stream-ordered allocation from a memory pool.
    Pool,
}

impl SegmentKind {
    /// The name the summary, the report and the live feed write (the serde name).
    pub fn name(self) -> &'static str {
        match self {
            SegmentKind::Driver => "driver",
            SegmentKind::Pitch => "pitch",
            SegmentKind::Managed => "managed",
            SegmentKind::Mapped => "mapped",
            SegmentKind::Pool => "pool",
        }
    }
}

/// One segment: memory the process holds from the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
    /// How it was obtained.
    pub kind: SegmentKind,
    /// Owned by a caching allocator: its free space is cache.
    pub framework: bool,
    /// The allocator whose own rule decides this segment's free bytes
    /// ([`crate::alloc::AllocatorModel::region_free`]: XLA's BFC pool, once a BFC chunk was placed
    /// in it), instead of the caching and mapped-segment one; `None` keeps that rule.
    pub free_rule: Option<Framework>,
    /// Live framework blocks inside.
    pub live_blocks: u64,
    /// Bytes of those blocks.
    pub live_bytes: u64,
    /// The pool (for [`SegmentKind::Pool`]) or the reserved range's start (for
    /// [`SegmentKind::Mapped`], 0 when unknown).
    pub owner: u64,
    /// The stream it was allocated on.
    pub stream: u64,
}

impl Segment {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
    /// The free bytes by the rule of the allocator that owns this segment's rule, if any.
    fn own_free(&self) -> Option<crate::alloc::RegionFree> {
        self.free_rule.and_then(|f| f.model().region_free(self.size - self.live_bytes, self.live_blocks))
    }
    /// Free bytes held hostage by live blocks. In a mapped (VMM) segment free pages can be
    /// unmapped one by one, so nothing there is held hostage: it is releasable (PyTorch's
    /// `inactive_split` is 0 under expandable segments for the same reason).
    pub fn stranded(&self) -> u64 {
        if let Some(r) = self.own_free() {
            return r.stranded;
        }
        if self.framework && self.live_blocks > 0 && self.kind != SegmentKind::Mapped {
            self.size - self.live_bytes
        } else {
            0
        }
    }
    /// Bytes a cache release (`empty_cache()`) would return: a whole segment with no live block,
    /// or the free bytes of a mapped segment (unmapped page by page; the partial pages at the
    /// edges of live blocks are counted too, an overestimate of at most 2 MiB per free run).
    pub fn releasable(&self) -> u64 {
        if let Some(r) = self.own_free() {
            return r.releasable;
        }
        if self.framework && (self.live_blocks == 0 || self.kind == SegmentKind::Mapped) {
            self.size - self.live_bytes
        } else {
            0
        }
    }
    /// Bytes of the allocator's cache, pools included: what `torch.cuda.memory_reserved()` counts.
    pub fn cache(&self) -> u64 {
        if self.framework || self.kind == SegmentKind::Pool {
            self.size
        } else {
            0
        }
    }
    /// Bytes in use outside any framework.
    pub fn raw(&self) -> u64 {
        if self.framework {
            0
        } else {
            self.size
        }
    }
}

/// A live framework block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// First byte.
    pub addr: u64,
    /// The block's extent (rounded, with any swallowed remainder).
    pub size: u64,
    /// What the program asked for.
    pub requested: u64,
}

/// Something the event stream says that the map cannot square with what it knows: a lost event,
/// a trace that starts mid-way, or a bug in a source. Counted, never fatal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Anomaly {
    /// A free of an address the map does not hold.
    #[error("free of unknown address {0:#x}")]
    FreeUnknown(u64),
    /// A block placed where no segment is.
    #[error("block at {0:#x} lies inside no segment")]
    BlockOutsideSegment(u64),
    /// A block placed on top of a live block.
    #[error("block at {0:#x} overlaps a live block")]
    BlockOverlap(u64),
    /// A block larger than the free run it starts in.
    #[error("block at {addr:#x} of {size} bytes runs past its free run of {run} bytes")]
    BlockTooLarge {
        /// Block start.
        addr: u64,
        /// Block size.
        size: u64,
        /// Free bytes from `addr` to the end of its run.
        run: u64,
    },
    /// A new segment on top of known ones (their frees were lost); the old ones were dropped.
    #[error("segment at {0:#x} overlaps known segments, which were dropped")]
    SegmentOverlap(u64),
    /// An unmap of a range that is not mapped.
    #[error("unmap of {0:#x} covers unmapped memory")]
    UnmapUnknown(u64),
    /// A segment or range released while blocks in it were live.
    #[error("range at {addr:#x} released with {blocks} live blocks")]
    LiveBlocksDropped {
        /// Start of the range released.
        addr: u64,
        /// Live blocks dropped with it.
        blocks: u64,
    },
    /// A VMM handle or reservation the map never saw created.
    #[error("unknown handle or range {0:#x}")]
    UnknownHandle(u64),
    /// An unmap that cuts a mapping (the driver unmaps only whole mappings and refuses it): the
    /// map is left as it was.
    #[error("unmap of {addr:#x} ({size} bytes) cuts the mapping at {mapping:#x}, which the driver refuses; nothing changed")]
    UnmapPartial {
        /// Start of the range asked.
        addr: u64,
        /// Its length.
        size: u64,
        /// Start of the mapping it cuts.
        mapping: u64,
    },
    /// A reserved range freed while memory is still mapped in it (the driver refuses it): the
    /// range and its mappings stay.
    #[error("address free of {0:#x} with memory still mapped in it, which the driver refuses; nothing changed")]
    FreeMapped(u64),
    /// An event kind this map does not apply.
    #[error("event kind {0} does not change the address map")]
    NotAMapEvent(u16),
    /// An event of a new (process, device) when [`crate::ingest::MAX_SPACES`] maps exist already:
    /// not tracked (a hostile record file of 300,000 processes would otherwise take gigabytes).
    #[error("more than {0} process × device address maps; events of further ones are not tracked")]
    TooManySpaces(usize),
    /// A segment, mapping, reservation or unmap of no bytes, or one whose end is 2^64 or more: no
    /// driver hands such a range out, so the event is corrupt; it is ignored.
    #[error("range at {addr:#x} of {size} bytes is empty or wraps past 2^64; ignored")]
    BadRange {
        /// Start of the range.
        addr: u64,
        /// Its length.
        size: u64,
    },
}

/// `Err(BadRange)` unless `[addr, addr + size)` holds at least one byte and its end is a u64
/// (below 2^64).
/// Every range the map keeps passes this check first, so `start + size` never wraps inside it.
fn check_range(addr: u64, size: u64) -> Result<(), Anomaly> {
    if size == 0 || addr.checked_add(size).is_none() {
        return Err(Anomaly::BadRange { addr, size });
    }
    Ok(())
}

/// The figures of one address space, all in bytes: the one list of them. Every output carries
/// this struct as it is (the summary's device, process and OOM entries flatten it; the export's
/// device views and `top`'s rows hold it), combined across processes by [`Figures::merge`] only;
/// the figures derived from it (fragmentation, largest allocatable) are computed in
/// `crate::analysis`. Serialized under these names, `framework_seen` as `level` (`block` or
/// `segment`); `unmapped_physical` is kept out of the summary (a cross-check of the map, in no view).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Figures {
    /// Held from the driver: segments, mapped VMM memory, pool caches.
    pub reserved: u64,
    /// What the caching allocators hand out once one is seen: live framework blocks plus live
    /// stream-ordered pool allocations (what `torch.cuda.memory_allocated()` counts, whichever
    /// backend); the rest of the driver memory is `non_framework`. Before any caching allocator
    /// is seen, every segment (the driver's view: all of it is in use).
    pub allocated: u64,
    /// Held by caching allocators and stream-ordered pools: framework-owned segments, pool
    /// allocations and pool caches. What `torch.cuda.memory_reserved()` reports.
    pub framework_reserved: u64,
    /// Driver memory no caching allocator owns (a raw `cudaMalloc`, a library's workspace, a
    /// JAX/XLA mapping): `reserved − framework_reserved`.
    pub non_framework: u64,
    /// Segments the caching allocators and pools hold (PyTorch's snapshot lists these).
    pub framework_segments: u64,
    /// Free inside framework segments that hold a live block.
    pub stranded: u64,
    /// Framework segments with no live block, plus pool caches.
    pub releasable: u64,
    /// The largest free run inside one framework segment.
    pub largest_free_block: u64,
    /// Number of segments (mapped runs count one each).
    pub segments: u64,
    /// Number of live framework blocks.
    pub blocks: u64,
    /// Free bytes in 2 MiB driver pages held by live sub-2 MiB allocations.
    pub page_stranded: u64,
    /// Bytes stream-ordered pools keep after frees, until trimmed.
    pub pool_cached: u64,
    /// Physical VMM memory created but not mapped.
    #[serde(skip)]
    pub unmapped_physical: u64,
    /// Whether any framework-owned segment was ever seen: the figures are at block level (inside
    /// the caching allocators' segments), else at segment level (the driver's view).
    #[serde(rename = "level", with = "level")]
    pub framework_seen: bool,
}

impl Figures {
    /// Adds another address space's figures to these (a device's from its processes'): bytes and
    /// counts are summed, saturating (the figures come from input, and sums may pass 2^64); the
    /// largest free block is the larger one, since no request spans two address spaces.
    pub fn merge(&mut self, o: &Figures) {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut self.reserved, o.reserved);
        add(&mut self.allocated, o.allocated);
        add(&mut self.framework_reserved, o.framework_reserved);
        add(&mut self.non_framework, o.non_framework);
        add(&mut self.framework_segments, o.framework_segments);
        add(&mut self.stranded, o.stranded);
        add(&mut self.releasable, o.releasable);
        self.largest_free_block = self.largest_free_block.max(o.largest_free_block);
        add(&mut self.segments, o.segments);
        add(&mut self.blocks, o.blocks);
        add(&mut self.page_stranded, o.page_stranded);
        add(&mut self.pool_cached, o.pool_cached);
        add(&mut self.unmapped_physical, o.unmapped_physical);
        self.framework_seen |= o.framework_seen;
    }

    /// `block` when a caching allocator's blocks were seen, else `segment`: the summary's `level`.
    pub fn level(&self) -> &'static str {
        level::name(self.framework_seen)
    }
}

/// `framework_seen` as the summary writes it: `level`, `block` or `segment`.
mod level {
    pub fn name(framework_seen: bool) -> &'static str {
        if framework_seen {
            "block"
        } else {
            "segment"
        }
    }
    pub fn serialize<S: serde::Serializer>(seen: &bool, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name(*seen))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        use serde::Deserialize;
        match String::deserialize(d)?.as_str() {
            "block" => Ok(true),
            "segment" => Ok(false),
            other => Err(serde::de::Error::custom(format!("level is `block` or `segment`, not `{other}`"))),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    segment_bytes: u64,
    cache_bytes: u64,
    cache_segments: u64,
    raw: u64,
    live_bytes: u64,
    live_blocks: u64,
    stranded: u64,
    releasable: u64,
}

impl Totals {
    /// Segment `s` gains (`gained`) or loses one live block of `size` bytes: only the live,
    /// stranded and releasable totals move, so the rest of `sub` and `add` is skipped.
    fn live_change(&mut self, s: &mut Segment, gained: bool, size: u64) {
        let (stranded, releasable) = (s.stranded(), s.releasable());
        if gained {
            s.live_blocks += 1;
            s.live_bytes += size;
            self.live_blocks += 1;
            self.live_bytes += size;
        } else {
            s.live_blocks -= 1;
            s.live_bytes -= size;
            self.live_blocks -= 1;
            self.live_bytes -= size;
        }
        self.stranded = self.stranded - stranded + s.stranded();
        self.releasable = self.releasable - releasable + s.releasable();
    }
    fn add(&mut self, s: &Segment) {
        self.segment_bytes += s.size;
        self.cache_bytes += s.cache();
        self.cache_segments += u64::from(s.cache() > 0);
        self.raw += s.raw();
        self.live_bytes += s.live_bytes;
        self.live_blocks += s.live_blocks;
        self.stranded += s.stranded();
        self.releasable += s.releasable();
    }
    fn sub(&mut self, s: &Segment) {
        self.segment_bytes -= s.size;
        self.cache_bytes -= s.cache();
        self.cache_segments -= u64::from(s.cache() > 0);
        self.raw -= s.raw();
        self.live_bytes -= s.live_bytes;
        self.live_blocks -= s.live_blocks;
        self.stranded -= s.stranded();
        self.releasable -= s.releasable();
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Pool {
    used: u64,
    cached: u64,
}

/// Whether a segment occupies shared 2 MiB driver pages: a sub-2 MiB `cuMemAlloc` or pitch
/// allocation (managed memory migrates by its own pages; mappings and pools are whole pages).
fn shares_pages(kind: SegmentKind, size: u64) -> bool {
    size < DRIVER_PAGE && matches!(kind, SegmentKind::Driver | SegmentKind::Pitch)
}

/// The map of one (process, device).
#[derive(Clone, Debug, Default)]
pub struct AddressSpace {
    rules: Rules,
    /// Segment start → slot in `slots`.
    index: BTreeMap<u64, u32>,
    /// Segments by slot; a slot's number also names its list of blocks and free runs in `tiling`.
    /// Slots of removed segments are reused (`spare_slots`).
    slots: Vec<Segment>,
    spare_slots: Vec<u32>,
    /// Blocks and free runs of the framework segments.
    tiling: Tiling,
    pages: PageOccupancy,
    reservations: BTreeMap<u64, u64>,
    /// Each `cuMemMap`'s own range (start → size), kept apart from the segments (which join
    /// touching mappings): the driver unmaps only whole mappings, so an unmap that cuts one is
    /// refused, and the map must refuse it too to stay what the driver holds.
    extents: BTreeMap<u64, u64>,
    handles: HashMap<u64, u64>,
    physical_bytes: u64,
    mapped_bytes: u64,
    pools: HashMap<u64, Pool>,
    pool_cached: u64,
    /// Bytes of live pool allocations, all pools.
    pool_used: u64,
    /// A stream-ordered pool allocation was seen: a caching allocator (the driver's) is in use.
    pools_seen: bool,
    totals: Totals,
    framework_seen: bool,
}

impl AddressSpace {
    /// An empty map whose blocks follow `rules`.
    pub fn new(rules: AllocatorRules) -> AddressSpace {
        AddressSpace { rules: Rules { pytorch: rules, ..Rules::default() }, ..AddressSpace::default() }
    }

    /// The allocator rules block events follow.
    pub fn rules(&self) -> &AllocatorRules {
        &self.rules.pytorch
    }

    /// Replaces XLA BFC's chunk rules (a `fragmentation_fraction` other than the default).
    pub fn set_bfc_rules(&mut self, rules: BfcRules) {
        self.rules.bfc = rules;
    }

    /// Replaces the allocator rules (for blocks placed from now on).
    pub fn set_rules(&mut self, rules: AllocatorRules) {
        self.rules.pytorch = rules;
    }

    /// The current figures, O(1).
    pub fn figures(&self) -> Figures {
        let t = &self.totals;
        Figures {
            reserved: t.segment_bytes.saturating_add(self.pool_cached),
            allocated: if self.framework_seen || self.pools_seen { t.live_bytes.saturating_add(self.pool_used) } else { t.raw },
            framework_reserved: t.cache_bytes.saturating_add(self.pool_cached),
            non_framework: t.segment_bytes - t.cache_bytes,
            framework_segments: t.cache_segments,
            stranded: t.stranded,
            releasable: t.releasable.saturating_add(self.pool_cached),
            largest_free_block: self.largest_free_run(),
            segments: self.index.len() as u64,
            blocks: t.live_blocks,
            page_stranded: self.pages.stranded(),
            pool_cached: self.pool_cached,
            unmapped_physical: self.physical_bytes.saturating_sub(self.mapped_bytes),
            framework_seen: self.framework_seen,
        }
    }

    /// The largest free run inside one framework segment, O(1).
    pub fn largest_free_run(&self) -> u64 {
        self.tiling.largest()
    }

    /// Segments in address order.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.index.values().map(|&i| &self.slots[i as usize])
    }

    /// Live blocks in address order.
    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.index.values().flat_map(|&i| self.tiling.blocks_of(i))
    }

    /// The live block starting at `addr`.
    pub fn block_at(&self, addr: u64) -> Option<&Block> {
        self.tiling.block_at(addr)
    }

    /// Free runs `(start, len)` in address order.
    pub fn free_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.tiling.runs()
    }

    /// Free runs `(start, len)` starting in `[lo, hi)`.
    pub fn free_runs_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.tiling.runs_in(lo, hi)
    }

    /// The segment holding `addr`, O(log n).
    pub fn segment_at(&self, addr: u64) -> Option<&Segment> {
        self.slot_at(addr).map(|i| &self.slots[i as usize])
    }

    /// Checks every invariant the map keeps incrementally against a recount: each segment is a
    /// valid range (non-empty, not past 2^64), segments do not overlap, each framework segment's
    /// list tiles it exactly and ends, its live counters match its blocks, and the totals match
    /// the segments. O(entries); the property tests call it after every step and debug builds
    /// after every update of a small map (`debug_check`). `Err` says what broke.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut totals = Totals::default();
        let mut last_end = 0u64;
        let (mut entries, mut runs) = (0usize, 0usize);
        for (&start, &slot) in &self.index {
            let s = self.slots.get(slot as usize).ok_or_else(|| format!("segment at {start:#x}: no slot {slot}"))?;
            if s.start != start || check_range(s.start, s.size).is_err() {
                return Err(format!("segment at {start:#x}: slot {slot} holds {s:?}"));
            }
            if s.start < last_end {
                return Err(format!("segment at {start:#x} overlaps the one before (ends {last_end:#x})"));
            }
            last_end = s.end();
            if s.framework {
                let (blocks, bytes) = self.tiling.check(slot, s.start, s.end())?;
                if (blocks, bytes) != (s.live_blocks, s.live_bytes) {
                    return Err(format!(
                        "segment at {start:#x}: counts {} blocks / {} B, its list {blocks} / {bytes} B",
                        s.live_blocks, s.live_bytes
                    ));
                }
                entries += self.tiling.blocks_of(slot).count();
                runs += self.tiling.runs_in(s.start, s.end()).count();
            } else if s.live_blocks != 0 || s.live_bytes != 0 {
                return Err(format!("segment at {start:#x}: not framework-owned but counts {} live blocks", s.live_blocks));
            }
            totals.add(s);
        }
        if self.tiling.counts() != (entries + runs, runs) {
            return Err(format!("tiling holds {:?} entries/runs, segments account for {:?}", self.tiling.counts(), (entries + runs, runs)));
        }
        let t = &self.totals;
        let (a, b) = (
            (t.segment_bytes, t.cache_bytes, t.cache_segments, t.raw, t.live_bytes, t.live_blocks, t.stranded, t.releasable),
            (
                totals.segment_bytes,
                totals.cache_bytes,
                totals.cache_segments,
                totals.raw,
                totals.live_bytes,
                totals.live_blocks,
                totals.stranded,
                totals.releasable,
            ),
        );
        if a != b {
            return Err(format!("totals {a:?}, recounted {b:?}"));
        }
        Ok(())
    }

    /// In debug builds, [`AddressSpace::check_invariants`] after an update while the map is small
    /// (bounded cost per event; the property tests check every size in release builds too).
    #[inline]
    pub(crate) fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if self.index.len() + self.tiling.counts().0 <= 512 {
            if let Err(e) = self.check_invariants() {
                panic!("address map invariant broken: {e}");
            }
        }
    }

    fn slot_at(&self, addr: u64) -> Option<u32> {
        self.index.range(..=addr).next_back().map(|(_, &i)| i).filter(|&i| addr < self.slots[i as usize].end())
    }

    fn new_slot(&mut self, seg: Segment) -> u32 {
        match self.spare_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = seg;
                i
            }
            None => {
                self.slots.push(seg);
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Whether `addr` falls in anything this map holds: a segment or a reserved range.
    pub fn holds(&self, addr: u64) -> bool {
        self.segment_at(addr).is_some() || self.reservations.range(..=addr).next_back().is_some_and(|(&s, &l)| addr < s + l)
    }

    /// Whether this map holds the physical handle.
    pub fn holds_handle(&self, handle: u64) -> bool {
        self.handles.contains_key(&handle)
    }

    /// A caching allocator manages this address space (its driver failures are retries), before
    /// any of its segments is known.
    pub fn note_framework(&mut self) {
        self.framework_seen = true;
    }

    /// A caching allocator claims the segment holding `addr`.
    pub fn adopt_at(&mut self, addr: u64) -> Result<(), Anomaly> {
        let slot = self.slot_at(addr).ok_or(Anomaly::BlockOutsideSegment(addr))?;
        self.adopt(slot);
        Ok(())
    }

    /// Makes a segment framework-owned: all of it becomes one free run (it holds no block).
    fn adopt(&mut self, slot: u32) {
        let seg = &mut self.slots[slot as usize];
        if seg.framework {
            return;
        }
        self.totals.sub(seg);
        seg.framework = true;
        self.totals.add(seg);
        self.framework_seen = true;
        let (s, len) = (seg.start, seg.size);
        self.tiling.cover(slot, s, len);
    }

    /// Inserts a new segment, dropping any it overlaps (their frees were lost).
    fn insert_segment(&mut self, seg: Segment) -> Result<(), Anomaly> {
        let mut result = Ok(());
        let overlapping: Vec<u64> = self
            .index
            .range(..seg.end())
            .rev()
            .map(|(&a, &i)| (a, &self.slots[i as usize]))
            .take_while(|(_, s)| s.end() > seg.start)
            .map(|(a, _)| a)
            .collect();
        if !overlapping.is_empty() {
            result = Err(Anomaly::SegmentOverlap(seg.start));
            for a in overlapping {
                if let Some((old, _)) = self.remove_segment(a) {
                    self.drop_extents(old.start, old.end());
                }
            }
        }
        let (start, size, framework) = (seg.start, seg.size, seg.framework);
        self.totals.add(&seg);
        let slot = self.new_slot(seg);
        if framework {
            self.framework_seen = true;
            self.tiling.cover(slot, start, size);
        }
        self.index.insert(start, slot);
        result
    }

    /// Removes the segment starting at `start` with everything inside it, whichever way it goes
    /// (freed, or dropped under a newer segment): its blocks, free runs, share of the 2 MiB pages
    /// and bytes in use in its pool. Returns it with the number of live blocks that went with it.
    fn remove_segment(&mut self, start: u64) -> Option<(Segment, u64)> {
        let slot = self.index.remove(&start)?;
        let seg = self.slots[slot as usize].clone();
        self.spare_slots.push(slot);
        self.totals.sub(&seg);
        let blocks = if seg.framework { self.tiling.take(slot).len() as u64 } else { 0 };
        if seg.kind == SegmentKind::Mapped {
            self.mapped_bytes -= seg.size;
        }
        if shares_pages(seg.kind, seg.size) {
            self.pages.remove(seg.start, seg.size);
        }
        if seg.kind == SegmentKind::Pool {
            let p = self.pools.entry(seg.owner).or_default();
            let used = p.used.saturating_sub(seg.size);
            self.pool_used -= p.used - used;
            p.used = used;
        }
        Some((seg, blocks))
    }

    /// The map as events that rebuild it from empty: reservations, physical handles, segments
    /// (framework-owned ones flagged), then every live block with its exact extent. Pool caches
    /// are not carried over (their contiguity is unknown); they follow as [`EventKind::PoolReserved`].
    pub fn to_events(&self, pid: u32, device: i16) -> Vec<Event> {
        // Capacity from the map's own lengths, never from a counter (a counter gone wrong must not
        // ask for an absurd allocation).
        let mut out = Vec::with_capacity(self.index.len() + self.reservations.len() + self.handles.len());
        let ev = |kind| Event::new(kind, pid, device);
        for (&addr, &size) in &self.reservations {
            out.push(Event { addr, size, ..ev(EventKind::AddressReserve) });
        }
        for (&handle, &size) in &self.handles {
            out.push(Event { handle, size, ..ev(EventKind::PhysCreate) });
        }
        for s in self.segments() {
            let kind = match s.kind {
                SegmentKind::Driver => EventKind::MemAlloc,
                SegmentKind::Pitch => EventKind::MemAllocPitch,
                SegmentKind::Managed => EventKind::MemAllocManaged,
                SegmentKind::Mapped => EventKind::Map,
                SegmentKind::Pool => EventKind::PoolAlloc,
            };
            let flags = if s.framework { F_FRAMEWORK_OWNED } else { 0 };
            let handle = if s.kind == SegmentKind::Pool { s.owner } else { 0 };
            // A mapped segment goes back as the mappings it was made of, so that a later unmap of
            // one of them is whole in the rebuilt map too (they join again as they are applied).
            let pieces = if kind == EventKind::Map { self.extents_tiling(s.start, s.end()) } else { None };
            match pieces {
                Some(pieces) => {
                    out.extend(pieces.into_iter().map(|(addr, size)| Event { addr, size, stream: s.stream, flags, ..ev(kind) }))
                }
                None => out.push(Event { addr: s.start, size: s.size, stream: s.stream, handle, flags, ..ev(kind) }),
            }
        }
        for b in self.blocks() {
            let own = self.segment_at(b.addr).and_then(|s| s.free_rule);
            let flags = F_BLOCK_SIZE_KNOWN | own.map_or(0, Framework::flags);
            out.push(Event { addr: b.addr, size: b.size, requested: b.requested, flags, ..ev(EventKind::BlockAlloc) });
        }
        for (&pool, p) in &self.pools {
            if p.cached > 0 {
                out.push(Event { handle: pool, size: p.used + p.cached, ..ev(EventKind::PoolReserved) });
            }
        }
        out
    }

    /// `cuMemAlloc` and friends: a new driver segment. Sub-2 MiB ones occupy shared 2 MiB pages.
    pub fn driver_alloc(&mut self, addr: u64, size: u64, kind: SegmentKind, framework: bool, stream: u64) -> Result<(), Anomaly> {
        check_range(addr, size)?;
        let seg = Segment { start: addr, size, kind, framework, free_rule: None, live_blocks: 0, live_bytes: 0, owner: 0, stream };
        let r = self.insert_segment(seg);
        if shares_pages(kind, size) {
            self.pages.add(addr, size);
        }
        r
    }

    /// `cuMemFree`: the segment starting at `addr` goes back to the driver; a pool allocation
    /// goes back to its pool, which keeps the bytes until it is trimmed.
    pub fn driver_free(&mut self, addr: u64) -> Result<(), Anomaly> {
        let (seg, blocks) = self.remove_segment(addr).ok_or(Anomaly::FreeUnknown(addr))?;
        if seg.kind == SegmentKind::Pool {
            let p = self.pools.entry(seg.owner).or_default();
            p.cached = p.cached.saturating_add(seg.size);
            self.pool_cached = self.pool_cached.saturating_add(seg.size);
        }
        if blocks > 0 {
            // The segment is gone either way; report the blocks that went with it.
            return Err(Anomaly::LiveBlocksDropped { addr, blocks });
        }
        Ok(())
    }

    /// `cuMemAddressReserve`: a virtual range with nothing behind it.
    pub fn reserve(&mut self, addr: u64, size: u64) -> Result<(), Anomaly> {
        check_range(addr, size)?;
        self.reservations.insert(addr, size);
        Ok(())
    }

    /// `cuMemAddressFree`: the range goes. With memory still mapped in it the driver refuses the
    /// call, and the map keeps the range and its mappings (an anomaly).
    pub fn reserve_free(&mut self, addr: u64) -> Result<(), Anomaly> {
        let &size = self.reservations.get(&addr).ok_or(Anomaly::UnknownHandle(addr))?;
        if self.index.range(addr..addr.saturating_add(size)).next().is_some() {
            return Err(Anomaly::FreeMapped(addr));
        }
        self.reservations.remove(&addr);
        self.drop_extents(addr, addr.saturating_add(size));
        Ok(())
    }

    /// The mappings' own ranges that tile `[lo, hi)` exactly, in order; None if they do not.
    fn extents_tiling(&self, lo: u64, hi: u64) -> Option<Vec<(u64, u64)>> {
        let mut at = lo;
        let mut pieces = Vec::new();
        for (&a, &l) in self.extents.range(lo..hi) {
            if a != at {
                return None;
            }
            pieces.push((a, l));
            at = a + l;
        }
        (at == hi).then_some(pieces)
    }

    /// Forgets the mappings' own ranges that overlap `[lo, hi)`.
    fn drop_extents(&mut self, lo: u64, hi: u64) {
        let gone: Vec<u64> = self.extents.range(..hi).rev().take_while(|(&a, &l)| a + l > lo).map(|(&a, _)| a).collect();
        for a in gone {
            self.extents.remove(&a);
        }
    }

    /// The lowest mapping whose own range `[addr, addr + size)` cuts (overlaps without holding it
    /// whole), if any.
    fn cut_extent(&self, addr: u64, size: u64) -> Option<u64> {
        let end = addr + size;
        self.extents
            .range(..end)
            .rev()
            .take_while(|(&a, &l)| a + l > addr)
            .filter(|(&a, &l)| a < addr || a + l > end)
            .last()
            .map(|(&a, _)| a)
    }

    /// `cuMemCreate`: physical memory behind `handle`.
    pub fn phys_create(&mut self, handle: u64, size: u64) {
        if let Some(old) = self.handles.insert(handle, size) {
            self.physical_bytes = self.physical_bytes.saturating_sub(old);
        }
        self.physical_bytes = self.physical_bytes.saturating_add(size);
    }

    /// `cuMemRelease` of `handle`.
    pub fn phys_release(&mut self, handle: u64) -> Result<(), Anomaly> {
        let size = self.handles.remove(&handle).ok_or(Anomaly::UnknownHandle(handle))?;
        self.physical_bytes = self.physical_bytes.saturating_sub(size);
        Ok(())
    }

    fn reservation_of(&self, addr: u64) -> u64 {
        self.reservations.range(..=addr).next_back().filter(|(&s, &l)| addr < s + l).map_or(0, |(&s, _)| s)
    }

    /// `cuMemMap`: `[addr, addr + size)` becomes mapped. Mapped memory that touches other mapped
    /// memory of the same reserved range joins it into one segment (expandable segments grow in
    /// place); driver segments never join.
    pub fn map(&mut self, addr: u64, size: u64, framework: bool) -> Result<(), Anomaly> {
        self.map_as(addr, size, framework, true)
    }

    /// [`AddressSpace::map`] of a range that may be several driver calls (a PyTorch snapshot's
    /// `segment_map` entry covers pages mapped one call each): its parts may be unmapped apart.
    pub fn map_pages(&mut self, addr: u64, size: u64, framework: bool) -> Result<(), Anomaly> {
        self.map_as(addr, size, framework, false)
    }

    fn map_as(&mut self, addr: u64, size: u64, framework: bool, one_call: bool) -> Result<(), Anomaly> {
        check_range(addr, size)?;
        self.drop_extents(addr, addr + size);
        if one_call {
            self.extents.insert(addr, size);
        }
        let owner = self.reservation_of(addr);
        let seg = Segment {
            start: addr,
            size,
            kind: SegmentKind::Mapped,
            framework,
            free_rule: None,
            live_blocks: 0,
            live_bytes: 0,
            owner,
            stream: 0,
        };
        let r = self.insert_segment(seg);
        self.mapped_bytes += size;
        let left = self.index.range(..addr).next_back().map(|(_, &i)| self.slots[i as usize].clone());
        let mut start = addr;
        if let Some(l) = left {
            if l.end() == addr && l.kind == SegmentKind::Mapped && l.owner == owner {
                self.join(l.start, addr);
                start = l.start;
            }
        }
        if let Some(&ri) = self.index.get(&(addr + size)) {
            let rs = &self.slots[ri as usize];
            if rs.kind == SegmentKind::Mapped && rs.owner == owner {
                let right = rs.start;
                self.join(start, right);
            }
        }
        r
    }

    /// Joins two touching mapped segments into the left one. Their lists of blocks and free runs
    /// are joined too: O(min(entries left, entries right)), the shorter one is relabelled.
    fn join(&mut self, left: u64, right: u64) {
        let (li, ri) = match (self.index.get(&left), self.index.get(&right)) {
            (Some(&l), Some(&r)) => (l, r),
            _ => return,
        };
        let (lf, rf) = (self.slots[li as usize].framework, self.slots[ri as usize].framework);
        if lf && !rf {
            self.adopt(ri);
        } else if rf && !lf {
            self.adopt(li);
        }
        let r = self.slots[ri as usize].clone();
        let l = self.slots[li as usize].clone();
        self.totals.sub(&r);
        self.totals.sub(&l);
        let joined = Segment {
            size: l.size + r.size,
            live_blocks: l.live_blocks + r.live_blocks,
            live_bytes: l.live_bytes + r.live_bytes,
            free_rule: l.free_rule.or(r.free_rule),
            ..l
        };
        let keep = if joined.framework { self.tiling.concat(li, ri) } else { li };
        self.spare_slots.push(if keep == li { ri } else { li });
        self.totals.add(&joined);
        self.slots[keep as usize] = joined;
        self.index.remove(&right);
        self.index.insert(left, keep);
    }

    /// `cuMemUnmap` of `[addr, addr + size)`: cuts the mapped segments it covers, possibly in two.
    ///
    /// Free pages (the cut lies in one free run): the segment's list parts at that run and the
    /// shorter side moves to a new slot, O(min(left, right)) (see `Tiling::split`). A cut through
    /// live blocks drops them (an anomaly) and re-lays the pieces, O(entries of the segment).
    ///
    /// Terminates on any input: every turn of the loop moves `at` strictly forward (to the end of
    /// the segment holding it, or to the next segment start above it).
    pub fn unmap(&mut self, addr: u64, size: u64) -> Result<(), Anomaly> {
        check_range(addr, size)?;
        if let Some(mapping) = self.cut_extent(addr, size) {
            return Err(Anomaly::UnmapPartial { addr, size, mapping });
        }
        self.drop_extents(addr, addr + size);
        let end = addr + size;
        let mut at = addr;
        let mut result = Ok(());
        while at < end {
            let Some(slot) = self.slot_at(at) else {
                result = Err(Anomaly::UnmapUnknown(at));
                match self.index.range((Excluded(at), Excluded(end))).next() {
                    Some((&next, _)) => {
                        at = next;
                        continue;
                    }
                    None => break,
                }
            };
            let seg = &self.slots[slot as usize];
            let hi = end.min(seg.end());
            if seg.kind != SegmentKind::Mapped {
                result = Err(Anomaly::UnmapUnknown(at));
                at = hi;
                continue;
            }
            if let Err(e) = self.cut(slot, at, hi) {
                result = Err(e);
            }
            at = hi;
        }
        result
    }

    fn cut(&mut self, slot: u32, lo: u64, hi: u64) -> Result<(), Anomaly> {
        let old = self.slots[slot as usize].clone();
        if old.framework {
            // Free pages unmapped (the common case): the tiling parts in O(shorter side).
            let new = self.new_slot(old.clone());
            match self.tiling.split(slot, lo, hi, new) {
                Some(moved) => {
                    self.totals.sub(&old);
                    self.mapped_bytes -= hi - lo;
                    self.index.remove(&old.start);
                    let (left_slot, right_slot) = if moved.moved_left { (new, slot) } else { (slot, new) };
                    let (kept_blocks, kept_bytes) = (old.live_blocks - moved.blocks, old.live_bytes - moved.bytes);
                    let (left_live, right_live) = if moved.moved_left {
                        ((moved.blocks, moved.bytes), (kept_blocks, kept_bytes))
                    } else {
                        ((kept_blocks, kept_bytes), (moved.blocks, moved.bytes))
                    };
                    for (s, start, end, (live_blocks, live_bytes)) in
                        [(left_slot, old.start, lo, left_live), (right_slot, hi, old.end(), right_live)]
                    {
                        if end > start {
                            let piece = Segment { start, size: end - start, live_blocks, live_bytes, ..old.clone() };
                            self.totals.add(&piece);
                            self.slots[s as usize] = piece;
                            self.index.insert(start, s);
                        } else {
                            self.spare_slots.push(s);
                        }
                    }
                    return Ok(());
                }
                None => self.spare_slots.push(new),
            }
        }
        self.index.remove(&old.start);
        self.spare_slots.push(slot);
        self.totals.sub(&old);
        self.mapped_bytes -= hi - lo;
        let blocks = if old.framework { self.tiling.take(slot) } else { Vec::new() };
        // A live block that crosses `lo` or `hi` goes with the cut too, its bytes that stay
        // mapped becoming free space of their piece (never a block over a hole); blocks inside
        // the cut go; the others stay in their piece.
        let mut dropped = 0;
        let (mut left, mut right) = (Vec::new(), Vec::new());
        for b in blocks {
            let end = b.addr + b.size;
            if end <= lo {
                left.push(b);
            } else if b.addr >= hi {
                right.push(b);
            } else {
                dropped += 1;
            }
        }
        for (start, end, blocks) in [(old.start, lo, left), (hi, old.end(), right)] {
            if end > start {
                let piece = Segment {
                    start,
                    size: end - start,
                    live_blocks: blocks.len() as u64,
                    live_bytes: blocks.iter().map(|b| b.size).sum(),
                    ..old.clone()
                };
                self.totals.add(&piece);
                let s = self.new_slot(piece);
                if old.framework {
                    self.tiling.rebuild(s, start, end, blocks);
                }
                self.index.insert(start, s);
            }
        }
        if dropped > 0 {
            return Err(Anomaly::LiveBlocksDropped { addr: lo, blocks: dropped });
        }
        Ok(())
    }

    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`: served from `pool`'s cache when it can.
    pub fn pool_alloc(&mut self, addr: u64, size: u64, pool: u64, stream: u64) -> Result<(), Anomaly> {
        check_range(addr, size)?;
        // The segments it overlaps go first, so that bytes in use never count twice (the sum of
        // live pool allocations then never passes 2^64: they do not overlap).
        let seg = Segment {
            start: addr,
            size,
            kind: SegmentKind::Pool,
            framework: false,
            free_rule: None,
            live_blocks: 0,
            live_bytes: 0,
            owner: pool,
            stream,
        };
        let r = self.insert_segment(seg);
        let p = self.pools.entry(pool).or_default();
        let reuse = p.cached.min(size);
        p.cached -= reuse;
        p.used = p.used.saturating_add(size);
        self.pool_cached = self.pool_cached.saturating_sub(reuse);
        self.pool_used = self.pool_used.saturating_add(size);
        self.pools_seen = true;
        r
    }

    /// `cuMemFreeAsync`: the bytes stay in their pool until it is trimmed. The same as
    /// [`AddressSpace::driver_free`]: the segment found at `addr` says where its bytes go.
    pub fn pool_free(&mut self, addr: u64) -> Result<(), Anomaly> {
        self.driver_free(addr)
    }

    /// `cuMemPoolTrimTo(pool, keep)`: the pool releases unused bytes until it holds at most `keep`.
    pub fn pool_trim(&mut self, pool: u64, keep: u64) {
        let p = self.pools.entry(pool).or_default();
        let cached = p.cached.min(keep.saturating_sub(p.used));
        self.pool_cached = self.pool_cached.saturating_sub(p.cached - cached);
        p.cached = cached;
    }

    /// The driver's own figure for a pool's reserved bytes (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn pool_reserved(&mut self, pool: u64, reserved: u64) {
        let p = self.pools.entry(pool).or_default();
        let cached = reserved.saturating_sub(p.used);
        self.pool_cached = self.pool_cached.saturating_sub(p.cached).saturating_add(cached);
        p.cached = cached;
    }

    /// A framework block at `addr`. With `known_size` the extent is taken as given; otherwise it is
    /// `round_size(requested)`, or the whole rest of its free run when the allocator would not
    /// split that rest off (in a mapped range, an expandable segment, any rest of 512 bytes or
    /// more is split off).
    ///
    /// A block placed at the start of a free run (what caching allocators do) finds the run with
    /// one hash lookup and no segment search: the run's entry names its segment.
    pub fn block_alloc(&mut self, addr: u64, requested: u64, known_size: Option<u64>) -> Result<u64, Anomaly> {
        self.block_alloc_by(addr, requested, known_size, Framework::PYTORCH)
    }

    /// [`AddressSpace::block_alloc`] for a block of `framework`'s allocator: without `known_size`
    /// the extent follows that allocator's rules (PyTorch's [`AllocatorRules`], XLA's
    /// [`BfcRules`]: 256-byte rounding, the whole free chunk unless it is twice the request or
    /// 128 MiB more; CuPy's: 512-byte rounding, always split). A BFC or CuPy block lands at the
    /// start of a free chunk, and a free chunk is a free run of this map (both allocators merge
    /// free neighbours inside one driver allocation), so the extent is the allocator's own.
    pub fn block_alloc_by(&mut self, addr: u64, requested: u64, known_size: Option<u64>, framework: Framework) -> Result<u64, Anomaly> {
        let run = match self.tiling.starts_at(addr) {
            Some((i, true)) => i,
            Some((_, false)) => return Err(Anomaly::BlockOverlap(addr)),
            None => {
                let slot = self.slot_at(addr).ok_or(Anomaly::BlockOutsideSegment(addr))?;
                self.adopt(slot);
                match self.tiling.run_at(addr) {
                    Spot::Run(i) => i,
                    Spot::NotFree => return Err(Anomaly::BlockOverlap(addr)),
                }
            }
        };
        let (run_start, run_len, slot) = self.tiling.run(run);
        let seg = &mut self.slots[slot as usize];
        let avail = run_start + run_len - addr;
        let size = match known_size {
            Some(s) => s,
            None => framework.model().block_size(&self.rules, FreeRun { avail, mapped: seg.kind == SegmentKind::Mapped }, requested),
        };
        if size > avail || size == 0 {
            return Err(Anomaly::BlockTooLarge { addr, size, run: avail });
        }
        if seg.free_rule.is_none() && framework.model().region_free(0, 0).is_some() {
            self.totals.sub(seg);
            seg.free_rule = Some(framework);
            self.totals.add(seg);
        }
        self.totals.live_change(seg, true, size);
        self.tiling.place(run, addr, size, requested);
        Ok(size)
    }

    /// A framework block at `addr` goes back to the cache; it merges with free neighbours inside
    /// its segment, never across a segment boundary. Returns the block. One hash lookup, no
    /// segment search.
    pub fn block_free(&mut self, addr: u64) -> Result<Block, Anomaly> {
        let (block, slot) = self.tiling.free(addr).ok_or(Anomaly::FreeUnknown(addr))?;
        self.totals.live_change(&mut self.slots[slot as usize], false, block.size);
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const BASE: u64 = 0x7f00_0000_0000;

    /// Issue 16's H200 case: JAX's preallocated pool is one VMM mapping; filled with 256 MiB
    /// chunks and every other one freed, its free half is stranded (BFC never unmaps a region
    /// holding a live chunk), not releasable as the free pages of a PyTorch expandable segment
    /// would be; so the 11.85 GiB request is a fragmentation OOM, not an inconclusive one.
    #[test]
    fn a_preallocated_bfc_pool_strands_its_free_chunks_and_its_oom_is_fragmentation() {
        use crate::analysis::{OomInputs, Verdict};
        let pool = 420 * 256 * MIB;
        let mut m = AddressSpace::default();
        m.reserve(BASE, pool).unwrap();
        m.map(BASE, pool, false).unwrap();
        let bufs: Vec<u64> = (0..420).map(|i| BASE + i * 256 * MIB).collect();
        for &a in &bufs {
            assert_eq!(m.block_alloc_by(a, 256 * MIB, None, Framework::XLA), Ok(256 * MIB));
        }
        for &a in bufs.iter().step_by(2) {
            m.block_free(a).unwrap();
        }
        let f = m.figures();
        assert_eq!((f.framework_reserved, f.framework_segments, f.allocated), (pool, 1, 210 * 256 * MIB));
        assert_eq!((f.stranded, f.releasable, f.largest_free_block), (210 * 256 * MIB, 0, 256 * MIB));
        let oom = OomInputs {
            requested: 12_723_840_612,
            device_free: 0,
            device_free_known: true,
            stranded: f.stranded,
            releasable: f.releasable,
            largest_free_block: f.largest_free_block,
            framework: true,
            allocator: Some(Framework::XLA),
            page_stranded: f.page_stranded,
            allowed: None,
            allocator_refused: false,
            reserved: f.reserved,
            device_total: None,
            partial: None,
        };
        assert_eq!(oom.verdict(), Verdict::Fragmentation, "{}", oom.explanation());
        for &a in bufs.iter().skip(1).step_by(2) {
            m.block_free(a).unwrap();
        }
        let f = m.figures();
        assert_eq!((f.stranded, f.releasable, f.largest_free_block), (0, pool, pool), "a wholly free region is releasable");
    }

    #[test]
    fn frag_oom_shape_strands_the_split_remainders() {
        let mut m = AddressSpace::default();
        let mut segs = vec![];
        for i in 0..20 {
            let a = BASE + i * 600 * MIB;
            m.driver_alloc(a, 500 * MIB, SegmentKind::Driver, true, 0).unwrap();
            m.block_alloc(a, 500 * MIB, None).unwrap();
            segs.push(a);
        }
        for a in segs.iter().step_by(2) {
            m.block_free(*a).unwrap();
        }
        assert_eq!(m.figures().releasable, 10 * 500 * MIB);
        for a in segs.iter().step_by(2) {
            assert_eq!(m.block_alloc(*a, 300 * MIB, None).unwrap(), 300 * MIB);
        }
        let f = m.figures();
        assert_eq!(f.reserved, 10_485_760_000);
        assert_eq!(f.allocated, 8_388_608_000);
        assert_eq!(f.stranded, 2_097_152_000);
        assert_eq!(f.releasable, 0);
        assert_eq!(f.largest_free_block, 209_715_200);
        assert_eq!(f.segments, 20);
    }

    #[test]
    fn a_remainder_of_one_mib_or_less_is_swallowed_in_the_large_pool() {
        let mut m = AddressSpace::default();
        m.driver_alloc(BASE, 20 * MIB, SegmentKind::Driver, true, 0).unwrap();
        assert_eq!(m.block_alloc(BASE, 19 * MIB, None).unwrap(), 20 * MIB);
        assert_eq!(m.figures().largest_free_block, 0);
    }

    #[test]
    fn blocks_never_merge_across_touching_segments() {
        let mut m = AddressSpace::default();
        m.driver_alloc(BASE, 20 * MIB, SegmentKind::Driver, true, 0).unwrap();
        m.driver_alloc(BASE + 20 * MIB, 20 * MIB, SegmentKind::Driver, true, 0).unwrap();
        m.block_alloc(BASE, 4 * MIB, None).unwrap();
        m.block_alloc(BASE + 20 * MIB, 4 * MIB, None).unwrap();
        let f = m.figures();
        assert_eq!(f.largest_free_block, 16 * MIB);
        assert_eq!(f.stranded, 32 * MIB);
        m.block_free(BASE).unwrap();
        assert_eq!(m.figures().largest_free_block, 20 * MIB);
        assert_eq!(m.figures().releasable, 20 * MIB);
        assert_eq!(m.figures().stranded, 16 * MIB);
    }

    #[test]
    fn raw_segments_count_as_allocated_and_never_as_cache() {
        let mut m = AddressSpace::default();
        m.driver_alloc(BASE, 100 * MIB, SegmentKind::Driver, false, 0).unwrap();
        let f = m.figures();
        assert_eq!((f.reserved, f.allocated, f.releasable, f.stranded), (100 * MIB, 100 * MIB, 0, 0));
        assert!(!f.framework_seen);
    }

    #[test]
    fn expandable_mappings_grow_in_place_and_unmap_cuts_them_in_two() {
        let mut m = AddressSpace::default();
        m.reserve(BASE, 1 << 30).unwrap();
        m.map(BASE, 100 * MIB, true).unwrap();
        m.block_alloc(BASE, 100 * MIB, None).unwrap();
        m.map(BASE + 100 * MIB, 100 * MIB, true).unwrap();
        m.block_alloc(BASE + 100 * MIB, 50 * MIB, None).unwrap();
        m.map(BASE + 200 * MIB, 100 * MIB, true).unwrap();
        m.block_alloc(BASE + 200 * MIB, 100 * MIB, None).unwrap();
        let f = m.figures();
        assert_eq!(f.segments, 1);
        assert_eq!(f.reserved, 300 * MIB);
        assert_eq!(f.largest_free_block, 50 * MIB);
        m.block_free(BASE + 100 * MIB).unwrap();
        m.unmap(BASE + 100 * MIB, 100 * MIB).unwrap();
        let f = m.figures();
        assert_eq!(f.segments, 2);
        assert_eq!((f.reserved, f.allocated, f.stranded, f.largest_free_block), (200 * MIB, 200 * MIB, 0, 0));
    }

    /// Seen on the H200 under `expandable_segments:True` with the USDT probes, which carry only
    /// the requested size: a 21.5 MiB block at the start of a 22 MiB mapping leaves 512 KiB. The
    /// large pool's rule (split only above 1 MiB) would hand the block the whole mapping and the
    /// next block, which PyTorch placed in that rest, would overlap it.
    #[test]
    fn expandable_segments_split_small_remainders_of_large_blocks() {
        let mut m = AddressSpace::default();
        m.reserve(BASE, 1 << 30).unwrap();
        m.map(BASE, 22 * MIB, true).unwrap();
        let big = 21 * MIB + MIB / 2;
        assert_eq!(m.block_alloc(BASE, big, None), Ok(big));
        assert_eq!(m.block_alloc(BASE + big, 4096, None), Ok(4096));
        assert_eq!(m.figures().allocated, big + 4096);
        // the same request in a plain driver segment swallows the rest
        m.driver_alloc(BASE + (1 << 30), 22 * MIB, SegmentKind::Driver, true, 0).unwrap();
        assert_eq!(m.block_alloc(BASE + (1 << 30), big, None), Ok(22 * MIB));
    }

    /// Unmapping free pages parts the tiling at the cut (the shorter side moves): blocks on both
    /// sides keep their extents, the free rest of the cut run stays free on its side, and the two
    /// pieces join again when the hole is mapped back.
    #[test]
    fn unmapping_free_pages_parts_the_segment_and_mapping_them_joins_it() {
        let mut m = AddressSpace::default();
        m.reserve(BASE, 1 << 30).unwrap();
        // three mappings, joined into one segment (the driver unmaps only whole mappings)
        for (at, len) in [(0, 4 * MIB), (4 * MIB, 2 * MIB), (6 * MIB, 4 * MIB)] {
            m.map(BASE + at, len, true).unwrap();
        }
        assert_eq!(m.figures().segments, 1);
        for i in 0..3 {
            m.block_alloc(BASE + i * MIB, MIB, Some(MIB)).unwrap();
        }
        m.block_alloc(BASE + 8 * MIB, MIB, Some(MIB)).unwrap();
        // free run [3, 8) MiB; cut [4, 6): left keeps 3 blocks + [3, 4), right 1 block + [6, 8)
        m.unmap(BASE + 4 * MIB, 2 * MIB).unwrap();
        let f = m.figures();
        assert_eq!((f.segments, f.blocks, f.allocated, f.reserved), (2, 4, 4 * MIB, 8 * MIB));
        assert_eq!((f.largest_free_block, f.releasable, f.stranded), (2 * MIB, 4 * MIB, 0));
        let segs: Vec<(u64, u64, u64)> = m.segments().map(|s| (s.start - BASE, s.size, s.live_blocks)).collect();
        assert_eq!(segs, vec![(0, 4 * MIB, 3), (6 * MIB, 4 * MIB, 1)]);
        // blocks on both sides free and merge within their piece only
        m.block_free(BASE + 2 * MIB).unwrap();
        m.block_free(BASE + 8 * MIB).unwrap();
        assert_eq!(m.figures().largest_free_block, 4 * MIB, "[6, 10) MiB");
        // mapped back, the hole joins both pieces into one run [2, 10)
        m.map(BASE + 4 * MIB, 2 * MIB, true).unwrap();
        let f = m.figures();
        assert_eq!((f.segments, f.blocks, f.largest_free_block), (1, 2, 8 * MIB));
        // an unmap that cuts a mapping is refused, as the driver refuses it: nothing changes
        assert_eq!(m.unmap(BASE, MIB), Err(Anomaly::UnmapPartial { addr: BASE, size: MIB, mapping: BASE }));
        assert_eq!(m.figures().blocks, 2);
        // a whole mapping unmapped under live blocks drops them (an anomaly), as before
        assert!(matches!(m.unmap(BASE, 4 * MIB), Err(Anomaly::LiveBlocksDropped { .. })));
        assert_eq!((m.figures().blocks, m.figures().segments), (0, 1), "[4, 10) MiB stays, without blocks");
    }

    #[test]
    fn an_address_free_with_memory_mapped_is_refused_and_rebuilds_keep_the_mappings() {
        let mut m = AddressSpace::default();
        m.reserve(BASE, 1 << 30).unwrap();
        m.map(BASE, 2 * MIB, false).unwrap();
        m.map(BASE + 2 * MIB, 2 * MIB, false).unwrap();
        assert_eq!(m.reserve_free(BASE), Err(Anomaly::FreeMapped(BASE)));
        assert_eq!(m.figures().reserved, 4 * MIB, "the range and its mappings stay");
        // a map rebuilt from its events still unmaps one mapping of the joined segment whole
        let mut r = AddressSpace::default();
        for e in m.to_events(1, 0) {
            match e.kind() {
                Some(EventKind::AddressReserve) => r.reserve(e.addr, e.size).unwrap(),
                Some(EventKind::Map) => r.map(e.addr, e.size, false).unwrap(),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(r.figures().segments, 1);
        r.unmap(BASE + 2 * MIB, 2 * MIB).unwrap();
        r.unmap(BASE, 2 * MIB).unwrap();
        r.reserve_free(BASE).unwrap();
        assert_eq!(r.figures().reserved, 0);
    }

    #[test]
    fn pools_keep_freed_bytes_until_trimmed() {
        let mut m = AddressSpace::default();
        m.pool_alloc(BASE, 64 * MIB, 1, 0).unwrap();
        m.pool_alloc(BASE + 64 * MIB, 64 * MIB, 1, 0).unwrap();
        m.pool_free(BASE).unwrap();
        let f = m.figures();
        assert_eq!((f.reserved, f.allocated, f.releasable), (128 * MIB, 64 * MIB, 64 * MIB));
        m.pool_alloc(BASE, 32 * MIB, 1, 0).unwrap();
        assert_eq!(m.figures().reserved, 128 * MIB);
        m.pool_trim(1, 0);
        assert_eq!(m.figures().reserved, 96 * MIB);
    }

    #[test]
    fn to_events_rebuilds_the_same_map() {
        let mut m = AddressSpace::default();
        m.driver_alloc(BASE, 20 * MIB, SegmentKind::Driver, true, 0).unwrap();
        m.block_alloc(BASE, 3 * MIB, None).unwrap();
        m.driver_alloc(BASE + 20 * MIB, MIB, SegmentKind::Driver, false, 0).unwrap();
        m.reserve(BASE + (1 << 30), 1 << 30).unwrap();
        m.map(BASE + (1 << 30), 40 * MIB, false).unwrap();
        m.pool_alloc(BASE + (4 << 30), 8 * MIB, 9, 0).unwrap();
        m.pool_alloc(BASE + (5 << 30), 8 * MIB, 9, 0).unwrap();
        m.pool_free(BASE + (5 << 30)).unwrap();
        let mut state = crate::ingest::State::default();
        state.apply_all(&m.to_events(1, 0));
        assert!(state.exact());
        assert_eq!(state.spaces[&(1, 0)].map.figures(), m.figures());
    }

    #[test]
    fn anomalies_are_reported_not_fatal() {
        let mut m = AddressSpace::default();
        assert_eq!(m.block_free(BASE), Err(Anomaly::FreeUnknown(BASE)));
        assert_eq!(m.block_alloc(BASE, 512, None), Err(Anomaly::BlockOutsideSegment(BASE)));
        m.driver_alloc(BASE, 4 * MIB, SegmentKind::Driver, true, 0).unwrap();
        m.block_alloc(BASE, 4 * MIB, None).unwrap();
        assert_eq!(m.block_alloc(BASE, 512, None), Err(Anomaly::BlockOverlap(BASE)));
        assert!(matches!(m.driver_free(BASE), Err(Anomaly::LiveBlocksDropped { blocks: 1, .. })));
        assert_eq!(m.figures(), Figures { framework_seen: true, ..Figures::default() });
    }
}
