//! The naive model of the address map: what `gpufrag::map::AddressSpace` must compute, written the
//! dumbest way that is obviously right, so that the two can be compared op by op
//! (`tests/map_model.rs`) and their ingest throughput set side by side (`benches/ingest.rs`).
//!
//! Everything is a `Vec` scanned linearly; nothing derived is stored. Free runs are the gaps
//! between the blocks of a framework segment, found by sorting that segment's blocks; live bytes,
//! page occupancy, mapped bytes and every figure are recomputed from scratch when asked for. The
//! only state is what the events said: segments, blocks, reservations, physical handles, pools.
//! What each event kind does to the model is its own table ([`MEANINGS`]), read from the wire
//! format's documentation of the kind, not copied from `State::apply`'s dispatch.
//!
//! It lives under `tests/` and is pulled in with `#[path]` by the test and the bench, so it is
//! compiled only there: it never becomes part of the library's public API, needs no feature flag,
//! and the test and the bench measure exactly the same code.
#![allow(dead_code)]

use gpufrag::alloc::pytorch::{AllocatorRules, DRIVER_PAGE};
use gpufrag::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_FRAMEWORK_OWNED, F_SRC_EBPF, F_SRC_SHIM};
use gpufrag::map::{Anomaly, Block, Figures, Segment, SegmentKind};

/// A segment as the model keeps it: no counters, only what the driver said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NaiveSegment {
    pub start: u64,
    pub size: u64,
    pub kind: SegmentKind,
    pub framework: bool,
    pub owner: u64,
    pub stream: u64,
}

/// No range of no bytes, or one past 2^64, is ever kept: an anomaly, nothing changes.
fn bad_range(addr: u64, size: u64) -> Result<(), Anomaly> {
    if size == 0 || u128::from(addr) + u128::from(size) > u128::from(u64::MAX) {
        return Err(Anomaly::BadRange { addr, size });
    }
    Ok(())
}

impl NaiveSegment {
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
    fn holds(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end()
    }
}

/// A stream-ordered pool: bytes in live allocations and bytes kept after frees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NaivePool {
    pub id: u64,
    pub used: u64,
    pub cached: u64,
}

/// The model of one (process, device).
#[derive(Clone, Debug, Default)]
pub struct NaiveSpace {
    pub rules: AllocatorRules,
    /// In no particular order; never overlapping.
    pub segments: Vec<NaiveSegment>,
    /// In no particular order; each lies inside one framework segment.
    pub blocks: Vec<Block>,
    /// `(start, size)`; a new one at the same start replaces the old.
    pub reservations: Vec<(u64, u64)>,
    /// `(handle, size)`.
    pub handles: Vec<(u64, u64)>,
    /// `(start, size)` of each mapping as the program made it; the driver unmaps only whole ones.
    pub extents: Vec<(u64, u64)>,
    pub pools: Vec<NaivePool>,
    pub framework_seen: bool,
    /// A pool allocation was seen.
    pub pools_seen: bool,
}

impl NaiveSpace {
    pub fn new(rules: AllocatorRules) -> NaiveSpace {
        NaiveSpace { rules, ..NaiveSpace::default() }
    }

    fn segment_index_at(&self, addr: u64) -> Option<usize> {
        self.segments.iter().position(|s| s.holds(addr))
    }

    fn pool(&mut self, id: u64) -> &mut NaivePool {
        match self.pools.iter().position(|p| p.id == id) {
            Some(i) => &mut self.pools[i],
            None => {
                self.pools.push(NaivePool { id, ..NaivePool::default() });
                self.pools.last_mut().expect("just pushed")
            }
        }
    }

    /// The blocks inside `s`, sorted by address.
    fn blocks_of(&self, s: &NaiveSegment) -> Vec<Block> {
        let mut b: Vec<Block> = self.blocks.iter().filter(|b| s.holds(b.addr)).copied().collect();
        b.sort_by_key(|b| b.addr);
        b
    }

    /// The free runs of one segment: the gaps between its blocks (none unless framework-owned).
    pub fn free_runs_of(&self, s: &NaiveSegment) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        if !s.framework {
            return runs;
        }
        let mut at = s.start;
        for b in self.blocks_of(s) {
            if b.addr > at {
                runs.push((at, b.addr - at));
            }
            at = at.max(b.addr + b.size);
        }
        if at < s.end() {
            runs.push((at, s.end() - at));
        }
        runs
    }

    fn sorted_segments(&self) -> Vec<&NaiveSegment> {
        let mut s: Vec<&NaiveSegment> = self.segments.iter().collect();
        s.sort_by_key(|s| s.start);
        s
    }

    /// Every free run `(start, len)` in address order.
    pub fn free_runs(&self) -> Vec<(u64, u64)> {
        self.sorted_segments().into_iter().flat_map(|s| self.free_runs_of(s)).collect()
    }

    /// The segments as the map reports them, in address order.
    pub fn segment_list(&self) -> Vec<Segment> {
        self.sorted_segments()
            .into_iter()
            .map(|s| {
                let blocks = self.blocks_of(s);
                Segment {
                    start: s.start,
                    size: s.size,
                    kind: s.kind,
                    framework: s.framework,
                    free_rule: None,
                    live_blocks: blocks.len() as u64,
                    live_bytes: blocks.iter().map(|b| b.size).sum(),
                    owner: s.owner,
                    stream: s.stream,
                }
            })
            .collect()
    }

    /// The live blocks in address order.
    pub fn block_list(&self) -> Vec<Block> {
        let mut b = self.blocks.clone();
        b.sort_by_key(|b| b.addr);
        b
    }

    /// Free bytes of every 2 MiB page touched by a live sub-2 MiB driver or pitch allocation.
    pub fn page_stranded(&self) -> u64 {
        let mut pages: Vec<(u64, u64)> = Vec::new(); // (page index, live bytes)
        for s in self.segments.iter().filter(|s| matches!(s.kind, SegmentKind::Driver | SegmentKind::Pitch) && s.size < DRIVER_PAGE) {
            for page in s.start / DRIVER_PAGE..=(s.end() - 1) / DRIVER_PAGE {
                let lo = s.start.max(page * DRIVER_PAGE);
                let hi = s.end().min((page + 1).saturating_mul(DRIVER_PAGE));
                match pages.iter_mut().find(|(p, _)| *p == page) {
                    Some((_, live)) => *live += hi - lo,
                    None => pages.push((page, hi - lo)),
                }
            }
        }
        pages.iter().map(|(_, live)| DRIVER_PAGE - live).sum()
    }

    /// Every figure, from scratch.
    pub fn figures(&self) -> Figures {
        let pool_cached: u64 = self.pools.iter().fold(0u64, |a, p| a.saturating_add(p.cached));
        let mut f = Figures { pool_cached, framework_seen: self.framework_seen, ..Figures::default() };
        let (mut raw, mut live) = (0, 0);
        for s in self.segment_list() {
            f.reserved += s.size;
            f.segments += 1;
            f.blocks += s.live_blocks;
            let mapped = s.kind == SegmentKind::Mapped;
            if !s.framework {
                raw += s.size;
                if s.kind == SegmentKind::Pool {
                    f.framework_reserved += s.size;
                    f.framework_segments += 1;
                } else {
                    f.non_framework += s.size;
                }
            } else {
                f.framework_reserved += s.size;
                f.framework_segments += 1;
                live += s.live_bytes;
                if s.live_blocks > 0 && !mapped {
                    f.stranded += s.size - s.live_bytes;
                } else {
                    f.releasable += s.size - s.live_bytes;
                }
            }
        }
        let pool_used: u64 = self.pools.iter().fold(0u64, |a, p| a.saturating_add(p.used));
        f.allocated = if self.framework_seen || self.pools_seen { u64::saturating_add(live, pool_used) } else { raw };
        // Totals that pass 2^64 (absurd input) saturate.
        f.reserved = f.reserved.saturating_add(pool_cached);
        f.releasable = f.releasable.saturating_add(pool_cached);
        f.framework_reserved = f.framework_reserved.saturating_add(pool_cached);
        f.largest_free_block = self.free_runs().iter().map(|&(_, l)| l).max().unwrap_or(0);
        f.page_stranded = self.page_stranded();
        let physical: u64 = self.handles.iter().map(|&(_, l)| l).sum();
        let mapped: u64 = self.segments.iter().filter(|s| s.kind == SegmentKind::Mapped).map(|s| s.size).sum();
        f.unmapped_physical = physical.saturating_sub(mapped);
        f
    }

    /// Takes segment `i` out with the blocks inside it; a pool allocation stops being in use.
    /// Returns the segment and the number of live blocks that went with it.
    fn take_segment(&mut self, i: usize) -> (NaiveSegment, u64) {
        let s = self.segments.swap_remove(i);
        let before = self.blocks.len();
        self.blocks.retain(|b| !s.holds(b.addr));
        if s.kind == SegmentKind::Pool {
            let p = self.pool(s.owner);
            p.used = p.used.saturating_sub(s.size);
        }
        let dropped = (before - self.blocks.len()) as u64;
        (s, dropped)
    }

    /// A new segment; any it overlaps are forgotten (their frees were lost).
    fn insert(&mut self, seg: NaiveSegment) -> Result<(), Anomaly> {
        bad_range(seg.start, seg.size)?;
        let mut result = Ok(());
        while let Some(i) = self.segments.iter().position(|s| s.start < seg.end() && seg.start < s.end()) {
            let (old, _) = self.take_segment(i);
            self.extents.retain(|&(a, l)| !(a < old.end() && old.start < a + l));
            result = Err(Anomaly::SegmentOverlap(seg.start));
        }
        self.framework_seen |= seg.framework;
        self.segments.push(seg);
        result
    }

    pub fn driver_alloc(&mut self, addr: u64, size: u64, kind: SegmentKind, framework: bool, stream: u64) -> Result<(), Anomaly> {
        self.insert(NaiveSegment { start: addr, size, kind, framework, owner: 0, stream })
    }

    /// Frees the segment starting at `addr`, whatever its kind; a pool's bytes go to its cache.
    pub fn driver_free(&mut self, addr: u64) -> Result<(), Anomaly> {
        let i = self.segments.iter().position(|s| s.start == addr).ok_or(Anomaly::FreeUnknown(addr))?;
        let (s, dropped) = self.take_segment(i);
        if s.kind == SegmentKind::Pool {
            self.pool(s.owner).cached += s.size;
        }
        if dropped > 0 {
            return Err(Anomaly::LiveBlocksDropped { addr, blocks: dropped });
        }
        Ok(())
    }

    /// The same as [`NaiveSpace::driver_free`]: a free is a free.
    pub fn pool_free(&mut self, addr: u64) -> Result<(), Anomaly> {
        self.driver_free(addr)
    }

    pub fn reserve(&mut self, addr: u64, size: u64) -> Result<(), Anomaly> {
        bad_range(addr, size)?;
        self.reservations.retain(|&(s, _)| s != addr);
        self.reservations.push((addr, size));
        Ok(())
    }

    /// The range goes, unless a segment starts inside it (the driver refuses: nothing changes).
    pub fn reserve_free(&mut self, addr: u64) -> Result<(), Anomaly> {
        let i = self.reservations.iter().position(|&(s, _)| s == addr).ok_or(Anomaly::UnknownHandle(addr))?;
        let (_, size) = self.reservations[i];
        if self.segments.iter().any(|s| addr <= s.start && s.start < addr.saturating_add(size)) {
            return Err(Anomaly::FreeMapped(addr));
        }
        self.reservations.swap_remove(i);
        self.extents.retain(|&(a, l)| !(a < addr.saturating_add(size) && addr < a + l));
        Ok(())
    }

    pub fn phys_create(&mut self, handle: u64, size: u64) {
        self.handles.retain(|&(h, _)| h != handle);
        self.handles.push((handle, size));
    }

    pub fn phys_release(&mut self, handle: u64) -> Result<(), Anomaly> {
        let i = self.handles.iter().position(|&(h, _)| h == handle).ok_or(Anomaly::UnknownHandle(handle))?;
        self.handles.swap_remove(i);
        Ok(())
    }

    /// The reserved range a mapping at `addr` belongs to: the one starting last at or before
    /// `addr`, if it reaches `addr`; 0 otherwise.
    fn reservation_of(&self, addr: u64) -> u64 {
        match self.reservations.iter().filter(|&&(s, _)| s <= addr).max_by_key(|&&(s, _)| s) {
            Some(&(s, l)) if addr < s + l => s,
            _ => 0,
        }
    }

    /// A mapping joins the mapped segments of the same range that touch it on either side.
    /// `one_call`: the range is one driver call, unmapped only whole (a snapshot's may be many).
    pub fn map(&mut self, addr: u64, size: u64, framework: bool, one_call: bool) -> Result<(), Anomaly> {
        bad_range(addr, size)?;
        self.extents.retain(|&(a, l)| !(a < addr + size && addr < a + l));
        if one_call {
            self.extents.push((addr, size));
        }
        let owner = self.reservation_of(addr);
        let result = self.insert(NaiveSegment { start: addr, size, kind: SegmentKind::Mapped, framework, owner, stream: 0 });
        let joins = |s: &NaiveSegment| s.kind == SegmentKind::Mapped && s.owner == owner;
        let mut me = self.segments.len() - 1;
        if let Some(l) = self.segments.iter().position(|s| s.end() == addr && joins(s)) {
            let right = self.segments.swap_remove(me);
            self.segments[l].size += right.size;
            self.segments[l].framework |= right.framework;
            me = l;
        }
        let end = self.segments[me].end();
        if let Some(r) = self.segments.iter().position(|s| s.start == end && joins(s)) {
            let right = self.segments[r].clone();
            self.segments[me].size += right.size;
            self.segments[me].framework |= right.framework;
            self.segments.swap_remove(r);
        }
        result
    }

    /// Unmaps `[addr, addr + size)`: mapped segments are cut, blocks touching the cut are dropped;
    /// bytes not mapped (a hole, a driver segment) make it an anomaly.
    pub fn unmap(&mut self, addr: u64, size: u64) -> Result<(), Anomaly> {
        bad_range(addr, size)?;
        let end = addr + size;
        // A mapping the range overlaps without holding whole: the driver refuses, nothing changes.
        let cut = self.extents.iter().filter(|&&(a, l)| a < end && addr < a + l && (a < addr || a + l > end)).map(|&(a, _)| a).min();
        if let Some(mapping) = cut {
            return Err(Anomaly::UnmapPartial { addr, size, mapping });
        }
        self.extents.retain(|&(a, l)| !(a < end && addr < a + l));
        let mut anomaly = false;
        // Holes: any byte of the range that no segment holds.
        let mut covered: Vec<(u64, u64)> =
            self.segments.iter().filter(|s| s.start < end && addr < s.end()).map(|s| (s.start.max(addr), s.end().min(end))).collect();
        covered.sort();
        let mut at = addr;
        for &(lo, hi) in &covered {
            anomaly |= lo > at;
            at = at.max(hi);
        }
        anomaly |= at < end;
        // Cut every mapped segment the range touches; anything else is not ours to unmap.
        let touched: Vec<NaiveSegment> = self.segments.iter().filter(|s| s.start < end && addr < s.end()).cloned().collect();
        for s in touched {
            if s.kind != SegmentKind::Mapped {
                anomaly = true;
                continue;
            }
            let (lo, hi) = (s.start.max(addr), s.end().min(end));
            let before = self.blocks.len();
            self.blocks.retain(|b| !(b.addr < hi && lo < b.addr + b.size));
            anomaly |= self.blocks.len() != before;
            self.segments.retain(|x| x.start != s.start);
            if lo > s.start {
                self.segments.push(NaiveSegment { size: lo - s.start, ..s.clone() });
            }
            if hi < s.end() {
                self.segments.push(NaiveSegment { start: hi, size: s.end() - hi, ..s.clone() });
            }
        }
        if anomaly {
            Err(Anomaly::UnmapUnknown(addr))
        } else {
            Ok(())
        }
    }

    pub fn pool_alloc(&mut self, addr: u64, size: u64, pool: u64, stream: u64) -> Result<(), Anomaly> {
        bad_range(addr, size)?;
        self.pools_seen = true;
        let r = self.insert(NaiveSegment { start: addr, size, kind: SegmentKind::Pool, framework: false, owner: pool, stream });
        let p = self.pool(pool);
        let reuse = p.cached.min(size);
        p.cached -= reuse;
        p.used = p.used.saturating_add(size);
        r
    }

    pub fn pool_trim(&mut self, pool: u64, keep: u64) {
        let p = self.pool(pool);
        p.cached = p.cached.min(keep.saturating_sub(p.used));
    }

    pub fn pool_reserved(&mut self, pool: u64, reserved: u64) {
        let p = self.pool(pool);
        p.cached = reserved.saturating_sub(p.used);
    }

    /// A block at `addr` inside a segment (which becomes framework-owned): its extent is the known
    /// size, else the rounded request, or the whole rest of the free run when the allocator would
    /// not split that rest off.
    pub fn block_alloc(&mut self, addr: u64, requested: u64, known_size: Option<u64>) -> Result<u64, Anomaly> {
        let i = self.segment_index_at(addr).ok_or(Anomaly::BlockOutsideSegment(addr))?;
        if !self.segments[i].framework {
            self.segments[i].framework = true;
            self.framework_seen = true;
        }
        let runs = self.free_runs_of(&self.segments[i]);
        let &(run, len) = runs.iter().find(|&&(s, l)| s <= addr && addr < s + l).ok_or(Anomaly::BlockOverlap(addr))?;
        let avail = run + len - addr;
        let expandable = self.segments[i].kind == SegmentKind::Mapped;
        let size = match known_size {
            Some(s) => s,
            None => {
                let rounded = self.rules.round_size(requested);
                if rounded <= avail && !self.rules.should_split(avail, rounded, expandable) {
                    avail
                } else {
                    rounded
                }
            }
        };
        if size == 0 || size > avail {
            return Err(Anomaly::BlockTooLarge { addr, size, run: avail });
        }
        self.blocks.push(Block { addr, size, requested });
        Ok(size)
    }

    /// A caching allocator claims the segment holding `addr`: all its free space is cache.
    pub fn adopt_at(&mut self, addr: u64) -> Result<(), Anomaly> {
        let i = self.segment_index_at(addr).ok_or(Anomaly::BlockOutsideSegment(addr))?;
        self.segments[i].framework = true;
        self.framework_seen = true;
        Ok(())
    }

    pub fn block_free(&mut self, addr: u64) -> Result<Block, Anomaly> {
        let i = self.blocks.iter().position(|b| b.addr == addr).ok_or(Anomaly::FreeUnknown(addr))?;
        Ok(self.blocks.swap_remove(i))
    }
}

/// What an event of one kind does to the model. Each kind's meaning is taken from its doc
/// comment in `wire/src/event.rs` (quoted beside it in [`MEANINGS`]), never from
/// `gpufrag::ingest::State::apply`: the model test compares the two, so a kind wired to the wrong
/// map operation in the state shows as a difference instead of being copied into the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// A new segment of this kind at `addr` of `size` bytes; `F_FRAMEWORK_OWNED` says a caching
    /// allocator made it.
    Segment(SegmentKind),
    /// The segment at `addr` is given back to the driver.
    SegmentFree,
    /// A virtual range at `addr` of `size` bytes, no memory behind it.
    Reserve,
    /// The virtual range at `addr` goes.
    ReserveFree,
    /// Physical memory `handle` of `size` bytes, not mapped anywhere yet.
    PhysCreate,
    /// Physical memory `handle` goes.
    PhysRelease,
    /// `size` bytes mapped at `addr`: a mapped segment; `F_FRAMEWORK_OWNED` says whose.
    Map,
    /// `[addr, addr + size)` unmapped.
    Unmap,
    /// A pool allocation at `addr` of `size` bytes from pool `handle`.
    PoolAlloc,
    /// The pool allocation at `addr` freed: its bytes stay in the pool, cached, until trimmed.
    PoolFree,
    /// Pool `handle` trimmed to `size` bytes.
    PoolTrim,
    /// Pool `handle` holds `size` bytes as the driver counts them.
    PoolReserved,
    /// A caching allocator's block at `addr` for `requested` bytes (`size` its extent with
    /// `F_BLOCK_SIZE_KNOWN`).
    BlockAlloc,
    /// The block at `addr` back in the cache (its segment stays).
    BlockFree,
    /// A caching allocator claims the segment holding `addr`; with `addr` 0 it manages the
    /// process's memory (no segment changes).
    Adopt,
    /// An allocation failed: the figures at that moment are what the OOM is judged by.
    Failure,
    /// A measurement or bookkeeping that places nothing in the map.
    Nothing,
}

/// Every kind, the doc comment `wire/src/event.rs` gives it (checked to be word for word that
/// file's, so the table is rewritten when the wire format changes), and what it means to the
/// model. Beside these, the `rc` field's doc ("0 on success") makes a call that returned non-zero
/// change nothing, except the failure record itself.
pub const MEANINGS: [(EventKind, &str, Meaning); 30] = [
    (EventKind::MemAlloc, "`cuMemAlloc` / `cudaMalloc`: a driver segment at `addr` of `size` bytes.", Meaning::Segment(SegmentKind::Driver)),
    (EventKind::MemAllocPitch, "`cuMemAllocPitch` / `cudaMallocPitch` / `cudaMalloc3D`: `size` = pitch × height (× depth).", Meaning::Segment(SegmentKind::Pitch)),
    (EventKind::MemAllocManaged, "`cuMemAllocManaged` / `cudaMallocManaged`.", Meaning::Segment(SegmentKind::Managed)),
    (EventKind::MemFree, "`cuMemFree` / `cudaFree` of `addr`.", Meaning::SegmentFree),
    (EventKind::AddressReserve, "`cuMemAddressReserve`: a virtual range, no memory behind it yet.", Meaning::Reserve),
    (EventKind::AddressFree, "`cuMemAddressFree` of the range at `addr`.", Meaning::ReserveFree),
    (EventKind::PhysCreate, "`cuMemCreate`: physical memory `handle` of `size` bytes.", Meaning::PhysCreate),
    (EventKind::PhysRelease, "`cuMemRelease` of `handle`.", Meaning::PhysRelease),
    (EventKind::Map, "`cuMemMap`: `size` bytes of `handle` (from offset `requested`) at `addr`.", Meaning::Map),
    (EventKind::Unmap, "`cuMemUnmap` of `[addr, addr + size)`.", Meaning::Unmap),
    (EventKind::PoolAlloc, "`cuMemAllocAsync` / `cuMemAllocFromPoolAsync`: `addr`, `size`, pool in `handle`.", Meaning::PoolAlloc),
    (EventKind::PoolFree, "`cuMemFreeAsync` of `addr`: the bytes stay in the pool until trimmed.", Meaning::PoolFree),
    (EventKind::PoolTrim, "`cuMemPoolTrimTo(handle, size)`.", Meaning::PoolTrim),
    (EventKind::BlockAlloc, "A framework (caching allocator) block at `addr`; `requested` = the size asked for.", Meaning::BlockAlloc),
    (EventKind::BlockFree, "A framework block at `addr` freed (returned to the cache, not to the driver).", Meaning::BlockFree),
    (EventKind::AllocFailed, "An allocation that failed: `requested`, `rc`, `op` (the kind that failed), device free if known; with [`F_ALLOWED_KNOWN`], `size` = the allocator's allowed bytes; with [`F_ALLOCATOR_OOM`], `handle` = the allocator's own reserved bytes.", Meaning::Failure),
    (EventKind::DeviceInfo, "Device totals: `size` = total bytes, `device_free` = free bytes.", Meaning::Nothing),
    (EventKind::ProcessExec, "A traced process started or exec'd.", Meaning::Nothing),
    (EventKind::ProcessExit, "A traced process ended.", Meaning::Nothing),
    (EventKind::Dropped, "The source lost `size` events before this one.", Meaning::Nothing),
    (EventKind::PoolReserved, "A stream-ordered pool's reserved bytes as the driver reports them (`handle` = pool).", Meaning::PoolReserved),
    (
        EventKind::Adopt,
        "A caching allocator claims the segment or mapped range holding `addr`: its free space is cache from now on, stranded or releasable. With `addr` 0: a caching allocator manages the process's memory on `device` (its failed driver calls are retries, not final OOMs).",
        Meaning::Adopt,
    ),
    (
        EventKind::RecordEnd,
        "The end of a record file (never on a ring): its writer stopped cleanly here. `ts_ns` is when, `size` the events written before it. A record without one was cut (the writer was killed or its disk filled) and is never called exact.",
        Meaning::Nothing,
    ),
    // The settings change how later blocks are sized; the model's own maps follow its fixed rules,
    // and the model tests send no settings.
    (
        EventKind::AllocSettings,
        "A process's caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax) in the event's text: those it started with (its environment at exec), and each later change (`torch.cuda.memory._set_allocator_settings`: the keys given replace those keys). Blocks whose events carry only the requested size are sized by them from here on.",
        Meaning::Nothing,
    ),
    (
        EventKind::MemoryFraction,
        "`torch.cuda.set_per_process_memory_fraction` on `device`: `size` = the allowed bytes (fraction × the device's total), the text the fraction as set.",
        Meaning::Nothing,
    ),
    (
        EventKind::FrameworkInfo,
        "The framework managing a process's memory: its allocator in `flags` (as a block's), its name and version in the text.",
        Meaning::Nothing,
    ),
    (
        EventKind::FrameworkFigures,
        "A framework's own figures at its OOM on `device` (XLA's `memory_stats()` read right after the failure): `size` = pool bytes, `requested` = bytes in use, `handle` = largest free chunk; they are the figures of the process's latest OOM there.",
        Meaning::Nothing,
    ),
    (
        EventKind::Forecast,
        "gpufrag's own prediction of a process's coming peak on `device` (`crate::foresight`, made after a step of its requests): `size` = the predicted peak reserved bytes, `requested` = the bytes it may hold (device free + what it holds, or its cap), `handle` = how many steps ahead a step does not fit (0: every step simulated fits), `addr` = the steps simulated, `requested`'s source in `op` (1: its cap); a warning's text is the setting that would fit. Recorded like any event, so that a record replays to the warnings the live run gave.",
        Meaning::Nothing,
    ),
    (
        EventKind::DeviceUuid,
        "The driver's UUID of CUDA ordinal `device` in this process (`cuDeviceGetUuid`, asked once per ordinal before its first allocation is recorded): the 16 bytes in `addr` (bytes 0..8, big-endian) and `size` (bytes 8..16). The GPU a process's memory is on, whatever its environment said when it started.",
        Meaning::Nothing,
    ),
    (EventKind::IpcExport, "A legacy CUDA IPC export (`cuIpcGetMemHandle` / `cudaIpcGetMemHandle`) of the allocation holding `addr`; `rc` is the call's result. Memory of expandable segments (VMM) cannot be exported this way.", Meaning::Nothing),
];

/// The meaning of `kind` in [`MEANINGS`].
pub fn meaning(kind: EventKind) -> Meaning {
    MEANINGS.iter().find(|(k, _, _)| *k == kind).map_or(Meaning::Nothing, |m| m.2)
}

/// The model of [`gpufrag::ingest::State`]'s map side: one [`NaiveSpace`] per (pid, device), found by
/// a linear scan, and the anomalies counted.
#[derive(Clone, Debug, Default)]
pub struct NaiveState {
    pub rules: AllocatorRules,
    pub spaces: Vec<((u32, i16), NaiveSpace)>,
    pub anomalies: u64,
    pub events: u64,
    /// Figures at each failed allocation.
    pub ooms: Vec<Figures>,
}

impl NaiveState {
    pub fn new(rules: AllocatorRules) -> NaiveState {
        NaiveState { rules, ..NaiveState::default() }
    }

    pub fn space(&mut self, pid: u32, device: i16) -> &mut NaiveSpace {
        let i = match self.spaces.iter().position(|(k, _)| *k == (pid, device)) {
            Some(i) => i,
            None => {
                self.spaces.push(((pid, device), NaiveSpace::new(self.rules.clone())));
                self.spaces.len() - 1
            }
        };
        &mut self.spaces[i].1
    }

    /// Applies one event the way the wire format defines it: its kind's [`Meaning`].
    pub fn apply(&mut self, ev: &Event) {
        self.events += 1;
        let Some(kind) = ev.kind() else { return };
        let meaning = meaning(kind);
        if meaning == Meaning::Failure {
            let f = self.space(ev.pid, ev.device).figures();
            self.ooms.push(f);
            return;
        }
        if ev.rc != 0 || meaning == Meaning::Nothing {
            return;
        }
        let framework = ev.flags & F_FRAMEWORK_OWNED != 0;
        let m = self.space(ev.pid, ev.device);
        let r = match meaning {
            Meaning::Segment(kind) => m.driver_alloc(ev.addr, ev.size, kind, framework, ev.stream),
            Meaning::SegmentFree => m.driver_free(ev.addr),
            Meaning::Reserve => m.reserve(ev.addr, ev.size),
            Meaning::ReserveFree => m.reserve_free(ev.addr),
            Meaning::PhysCreate => {
                m.phys_create(ev.handle, ev.size);
                Ok(())
            }
            Meaning::PhysRelease => m.phys_release(ev.handle),
            Meaning::Map => m.map(ev.addr, ev.size, framework, ev.flags & (F_SRC_SHIM | F_SRC_EBPF) != 0),
            Meaning::Unmap => m.unmap(ev.addr, ev.size),
            Meaning::PoolAlloc => m.pool_alloc(ev.addr, ev.size, ev.handle, ev.stream),
            Meaning::PoolFree => m.pool_free(ev.addr),
            Meaning::PoolTrim => {
                m.pool_trim(ev.handle, ev.size);
                Ok(())
            }
            Meaning::PoolReserved => {
                m.pool_reserved(ev.handle, ev.size);
                Ok(())
            }
            Meaning::BlockAlloc => {
                let known = (ev.flags & F_BLOCK_SIZE_KNOWN != 0).then_some(ev.size);
                m.block_alloc(ev.addr, ev.requested, known).map(|_| ())
            }
            Meaning::BlockFree => m.block_free(ev.addr).map(|_| ()),
            Meaning::Adopt if ev.addr == 0 => {
                m.framework_seen = true;
                Ok(())
            }
            Meaning::Adopt => m.adopt_at(ev.addr),
            Meaning::Failure | Meaning::Nothing => Ok(()),
        };
        if r.is_err() {
            self.anomalies += 1;
        }
    }
}
