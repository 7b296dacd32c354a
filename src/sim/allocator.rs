//! The simulated `DeviceCachingAllocator` of PyTorch 2.11 for one device: blocks in segments, the
//! small and large pools ordered as PyTorch orders them (stream, size, address), and the `malloc`
//! path in PyTorch's order: best-fit cached block, garbage collection (memory fraction and
//! `garbage_collection_threshold` set), `alloc_block`, `release_available_cached_blocks` and
//! retry, `release_cached_blocks` and retry, OOM. Expandable segments are one reserved range per
//! (stream, pool) mapped in 2 MiB (small) or 20 MiB (large) pages at the lowest fitting address
//! and unmapped page by page on release. Two limits refuse memory: the allowed bytes of
//! `set_per_process_memory_fraction` (checked against the allocator's own total, as PyTorch does)
//! and the device's capacity for this process (a `cudaMalloc` or `cuMemCreate` that would exceed
//! it fails).
//!
//! The rules themselves (rounding, split, oversize checks, segment sizes) are `crate::alloc::pytorch`.
//!
//! Addresses. Under the trace's own settings the driver's addresses come from the trace
//! ([`Addresses::Replay`]), so every tie is broken as it was. Under other settings the driver's
//! addresses are the simulator's own ([`Addresses`]'s model): the order between equal-sized free
//! blocks of different segments is the one place where they matter (the pool's last sort key);
//! the model gives each new `cudaMalloc` the highest free 2 MiB-aligned range below the previous
//! ones (first fit from the top, reusing freed ranges), as the H200's driver was seen to do for
//! large allocations, so that a newer segment wins a tie against an older one.

use crate::alloc::pytorch::{AllocConf, AllocatorRules, LARGE_BUFFER, MIN_BLOCK, ROUND_LARGE, SMALL_BUFFER};
use std::collections::{BTreeMap, BTreeSet, HashMap};

const NONE: u32 = u32::MAX;

/// What the driver was asked to do: the trace's `segment_*` entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    /// `cudaMalloc` of a segment.
    SegmentAlloc {
        /// Start.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// `cudaFree` of a segment.
    SegmentFree {
        /// Start.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// Pages mapped into an expandable segment.
    Map {
        /// Start of the pages.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// Pages unmapped from an expandable segment.
    Unmap {
        /// Start of the pages.
        addr: u64,
        /// Bytes.
        size: u64,
    },
}

impl DeviceOp {
    /// The trace's name for the op.
    pub fn name(&self) -> &'static str {
        match self {
            DeviceOp::SegmentAlloc { .. } => "segment_alloc",
            DeviceOp::SegmentFree { .. } => "segment_free",
            DeviceOp::Map { .. } => "segment_map",
            DeviceOp::Unmap { .. } => "segment_unmap",
        }
    }
    /// Address and size.
    pub fn extent(&self) -> (u64, u64) {
        match *self {
            DeviceOp::SegmentAlloc { addr, size }
            | DeviceOp::SegmentFree { addr, size }
            | DeviceOp::Map { addr, size }
            | DeviceOp::Unmap { addr, size } => (addr, size),
        }
    }
}

/// Where new driver addresses come from.
#[derive(Clone, Debug)]
pub enum Addresses {
    /// The simulator's own model of the driver's virtual addresses (see the module header).
    Model,
    /// The trace's own: a `cudaMalloc` (or a new expandable reservation) takes the address of the
    /// recorded op in the same position of the same request, when that op matches.
    Replay,
}

/// The limits one scenario runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Allowed bytes of `set_per_process_memory_fraction` (fraction × total); `None` = unset.
    pub memory_limit: Option<u64>,
    /// Bytes the driver can give this allocator in all (device memory less what others hold);
    /// `None` = unlimited.
    pub device_capacity: Option<u64>,
    /// The device's total memory, which sizes an expandable segment's reservation (1 1/8 of it).
    pub device_total: u64,
}

/// The default device total when none is known: an H200's `cudaMemGetInfo` total (PyTorch 2.11, driver 580).
pub const DEFAULT_DEVICE_TOTAL: u64 = 150_109_880_320;

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_limit: None, device_capacity: None, device_total: DEFAULT_DEVICE_TOTAL }
    }
}

/// Counters as `torch.cuda.memory_stats()` names them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved: u64,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated: u64,
    /// `num_alloc_retries`.
    pub num_alloc_retries: u64,
    /// `num_device_alloc` (cudaMalloc calls and page mappings).
    pub num_device_alloc: u64,
    /// `num_device_free`.
    pub num_device_free: u64,
    /// `num_ooms`.
    pub num_ooms: u64,
}

/// Why a `malloc` failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oom {
    /// The size asked for.
    pub requested: u64,
    /// `round_size` of it (what the trace's `oom` entry records).
    pub rounded: u64,
    /// The segment the allocator asked for (what PyTorch's message says it "tried to allocate").
    pub alloc_size: u64,
    /// Which limit refused it: the memory fraction, the device, or both tried.
    pub limit: OomLimit,
    /// Reserved and allocated bytes at the failure.
    pub reserved: u64,
    /// Allocated bytes at the failure.
    pub allocated: u64,
}

/// The limit a failed request ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomLimit {
    /// The allowed bytes of `set_per_process_memory_fraction`.
    MemoryFraction,
    /// The device's memory.
    Device,
}

#[derive(Clone, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    requested: u64,
    stream: u64,
    small: bool,
    allocated: bool,
    mapped: bool,
    prev: u32,
    next: u32,
    gc_base: i64,
    es: u32,
}

#[derive(Default, Clone, Debug)]
struct Pool {
    /// (stream, size, ptr) → block: `BlockComparatorSize`.
    blocks: BTreeMap<(u64, u64, u64), u32>,
    /// (stream, ptr) → block: `BlockComparatorAddress`, unmapped ranges of expandable segments.
    unmapped: BTreeMap<(u64, u64), u32>,
    get_free_blocks_call_count: i64,
}

#[derive(Clone, Debug)]
struct Expandable {
    base: u64,
    page: u64,
    pages: Vec<bool>,
    max_pages: u64,
}

/// One simulated device allocator.
#[derive(Clone, Debug)]
pub struct Allocator {
    conf: AllocConf,
    limits: Limits,
    addresses: Addresses,
    arena: Vec<Block>,
    free_slots: Vec<u32>,
    pools: [Pool; 2],
    segments: Vec<Expandable>,
    counters: Counters,
    /// Driver VA: the ranges in use, start → end (for the model).
    va: BTreeMap<u64, u64>,
    next_reservation: u64,
    ops: Vec<DeviceOp>,
    replay_hint: Vec<DeviceOp>,
    /// Live blocks by address (allocated, or freed but not yet completed).
    live: HashMap<u64, u32>,
    /// Addresses whose free was requested but not completed.
    pending: BTreeSet<u64>,
}

/// The top of the modelled driver address space, and the base of modelled reservations.
const VA_TOP: u64 = 0x7f00_0000_0000;
const RESERVE_BASE: u64 = 0x3_0000_0000;

/// Figures of the allocator's state, gpufrag's names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Bytes held from the driver.
    pub reserved: u64,
    /// Bytes in live blocks.
    pub allocated: u64,
    /// Free bytes inside segments (mapped ranges) that hold a live block and cannot be returned
    /// while it lives (in an expandable segment: the free parts of pages that are partly used).
    pub stranded: u64,
    /// Free bytes that `empty_cache()` would return: segments with no live block, and the whole
    /// free pages of expandable segments.
    pub releasable: u64,
    /// The largest free block.
    pub largest_free_block: u64,
    /// PyTorch's `inactive_split_bytes`: free split blocks outside expandable segments.
    pub inactive_split: u64,
    /// Segments (mapped ranges).
    pub segments: u64,
}

impl Allocator {
    /// An empty allocator.
    pub fn new(conf: AllocConf, limits: Limits, addresses: Addresses) -> Allocator {
        Allocator {
            conf,
            limits,
            addresses,
            arena: Vec::new(),
            free_slots: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            segments: Vec::new(),
            counters: Counters::default(),
            va: BTreeMap::new(),
            next_reservation: RESERVE_BASE,
            ops: Vec::new(),
            replay_hint: Vec::new(),
            live: HashMap::new(),
            pending: BTreeSet::new(),
        }
    }

    /// Bytes the device still has for this allocator, when its capacity is known.
    pub fn device_free(&self) -> Option<u64> {
        self.limits.device_capacity.map(|c| c.saturating_sub(self.counters.reserved))
    }

    /// Changes what the driver can give this allocator from now on (another process on the same
    /// device took or returned memory).
    pub fn set_device_capacity(&mut self, capacity: Option<u64>) {
        self.limits.device_capacity = capacity;
    }

    /// Changes the allowed bytes of `set_per_process_memory_fraction` from now on.
    pub fn set_memory_limit(&mut self, limit: Option<u64>) {
        self.limits.memory_limit = limit;
    }

    /// The configuration simulated.
    pub fn conf(&self) -> &AllocConf {
        &self.conf
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The driver ops since the last call, oldest first.
    pub fn take_ops(&mut self) -> Vec<DeviceOp> {
        std::mem::take(&mut self.ops)
    }

    /// Drops the driver ops recorded so far (when nobody compares them).
    pub fn clear_ops(&mut self) {
        self.ops.clear();
    }

    /// Under [`Addresses::Replay`]: the recorded driver ops of the request about to run.
    pub fn set_replay_hint(&mut self, ops: &[DeviceOp]) {
        self.replay_hint.clear();
        self.replay_hint.extend_from_slice(ops);
    }

    fn rules(&self) -> &AllocatorRules {
        &self.conf.rules
    }

    fn fraction_set(&self) -> bool {
        self.limits.memory_limit.is_some()
    }

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.arena[i as usize] = b;
            i
        } else {
            self.arena.push(b);
            (self.arena.len() - 1) as u32
        }
    }

    fn delete(&mut self, i: u32) {
        self.free_slots.push(i);
    }

    fn b(&self, i: u32) -> &Block {
        &self.arena[i as usize]
    }

    fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.arena[i as usize]
    }

    fn pool_of(small: bool) -> usize {
        usize::from(small)
    }

    fn insert_into_blocks(&mut self, i: u32) {
        let (stream, size, ptr, small) = {
            let b = self.b(i);
            (b.stream, b.size, b.ptr, b.small)
        };
        let p = Self::pool_of(small);
        let count = self.pools[p].get_free_blocks_call_count;
        self.bm(i).gc_base = count;
        self.pools[p].blocks.insert((stream, size, ptr), i);
    }

    fn remove_from_blocks(&mut self, i: u32) {
        let b = self.b(i);
        let key = (b.stream, b.size, b.ptr);
        let p = Self::pool_of(b.small);
        self.pools[p].blocks.remove(&key);
    }

    fn insert_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let (key, p) = ((b.stream, b.ptr), Self::pool_of(b.small));
        self.pools[p].unmapped.insert(key, i);
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let (key, p) = ((b.stream, b.ptr), Self::pool_of(b.small));
        self.pools[p].unmapped.remove(&key);
    }

    fn is_split(&self, i: u32) -> bool {
        let b = self.b(i);
        b.prev != NONE || b.next != NONE
    }

    fn grow_reserved(&mut self, by: u64) {
        self.counters.reserved += by;
        self.counters.peak_reserved = self.counters.peak_reserved.max(self.counters.reserved);
    }

    /// `malloc(orig_size, stream)`: the block's address, or why it failed.
    pub fn malloc(&mut self, orig_size: u64, stream: u64) -> Result<u64, Oom> {
        let size = self.rules().round_size(orig_size);
        let small = AllocatorRules::is_small(size);
        let alloc_size = AllocatorRules::segment_size(size);
        let mut found = self.get_free_block(small, stream, size);
        let mut limit = OomLimit::Device;
        if found.is_none() {
            if self.conf.collects_garbage(self.fraction_set()) {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(small, stream, size, alloc_size, false, &mut limit);
            if found.is_none() && self.release_available_cached_blocks(small, stream, size) {
                found = self.alloc_block(small, stream, size, alloc_size, false, &mut limit);
            }
            if found.is_none() {
                self.complete_pending_frees();
                self.release_cached_blocks();
                found = self.alloc_block(small, stream, size, alloc_size, true, &mut limit);
            }
        }
        let Some(block) = found else {
            self.counters.num_ooms += 1;
            return Err(Oom {
                requested: orig_size,
                rounded: size,
                alloc_size,
                limit,
                reserved: self.counters.reserved,
                allocated: self.counters.allocated,
            });
        };
        let remaining = self.b(block).size - size;
        let split = if small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.rules().max_split_size && remaining > crate::alloc::pytorch::SMALL_SIZE
        };
        Ok(self.alloc_found_block(block, size, orig_size, split))
    }

    fn get_free_block(&mut self, small: bool, stream: u64, size: u64) -> Option<u32> {
        let p = Self::pool_of(small);
        if self.conf.collects_garbage(self.fraction_set()) {
            self.pools[p].get_free_blocks_call_count += 1;
        }
        let mut it = self.pools[p].blocks.range((stream, size, 0)..);
        let (&(s, _, _), &first) = it.next()?;
        if s != stream {
            return None;
        }
        let mut chosen = first;
        if self.b(first).es != NONE {
            if self.conf.expandable_segments {
                let expandable_size = |a: &Allocator, i: u32| {
                    let b = a.b(i);
                    b.size + if b.next != NONE && !a.b(b.next).mapped { a.b(b.next).size } else { 0 }
                };
                for (&(s2, _, _), &next) in it {
                    if self.b(chosen).es == NONE || s2 != stream || expandable_size(self, next) >= expandable_size(self, chosen) {
                        break;
                    }
                    chosen = next;
                }
            } else {
                let mut found = None;
                for (&(s2, _, _), &next) in it {
                    if s2 != stream {
                        break;
                    }
                    if self.b(next).es == NONE {
                        found = Some(next);
                        break;
                    }
                }
                chosen = found?;
            }
        }
        if !self.conf.cached_block_serves(self.b(chosen).size, size) {
            return None;
        }
        self.remove_from_blocks(chosen);
        Some(chosen)
    }

    fn garbage_collect_cached_blocks(&mut self) {
        let allowed = self.limits.memory_limit.unwrap_or(0);
        let gc_threshold = (self.conf.garbage_collection_threshold * allowed as f64) as u64;
        if self.counters.reserved <= gc_threshold {
            return;
        }
        let target = self.counters.reserved - gc_threshold;
        let large = Self::pool_of(false);
        let calls = self.pools[large].get_free_blocks_call_count;
        let age = |a: &Allocator, i: u32| (calls - a.b(i).gc_base) as i32 as i64 as u64;
        let mut total_age: u64 = 0;
        let mut count: i64 = 0;
        for &i in self.pools[large].blocks.values() {
            if !self.is_split(i) {
                total_age += age(self, i);
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            let order: Vec<u32> = self.pools[large].blocks.values().copied().collect();
            for i in order {
                if !self.is_split(i) && self.b(i).es == NONE && age(self, i) as f64 >= threshold {
                    freed = true;
                    reclaimed += self.b(i).size;
                    total_age -= age(self, i);
                    count -= 1;
                    self.release_block(i);
                }
            }
        }
    }

    fn alloc_block(&mut self, small: bool, stream: u64, size: u64, alloc_size: u64, retry: bool, limit: &mut OomLimit) -> Option<u32> {
        if retry {
            self.counters.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.limits.memory_limit {
            if self.counters.reserved + alloc_size > allowed {
                *limit = OomLimit::MemoryFraction;
                return None;
            }
        }
        if self.conf.expandable_segments {
            let b = self.try_allocate_expandable_block(small, stream, size);
            if b.is_none() {
                *limit = OomLimit::Device;
            }
            return b;
        }
        if let Some(cap) = self.limits.device_capacity {
            if self.counters.reserved + alloc_size > cap {
                *limit = OomLimit::Device;
                return None;
            }
        }
        let ptr = self.driver_malloc(alloc_size);
        let i = self.new_block(Block {
            ptr,
            size: alloc_size,
            requested: 0,
            stream,
            small,
            allocated: false,
            mapped: true,
            prev: NONE,
            next: NONE,
            gc_base: 0,
            es: NONE,
        });
        self.grow_reserved(alloc_size);
        self.counters.num_device_alloc += 1;
        self.ops.push(DeviceOp::SegmentAlloc { addr: ptr, size: alloc_size });
        Some(i)
    }

    /// The recorded op at the position the next op of this request will take, under replay.
    fn replay_op(&self) -> Option<DeviceOp> {
        match self.addresses {
            Addresses::Replay => self.replay_hint.get(self.ops.len()).copied(),
            Addresses::Model => None,
        }
    }

    fn driver_malloc(&mut self, size: u64) -> u64 {
        if let Some(DeviceOp::SegmentAlloc { addr, size: s }) = self.replay_op() {
            if s == size && !self.va_overlaps(addr, size) {
                self.va.insert(addr, addr + size);
                return addr;
            }
        }
        // first fit from the top: the highest gap below VA_TOP that holds `size`, 2 MiB aligned
        let size_al = size.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        let mut hi = VA_TOP;
        let mut chosen = None;
        for (&start, &end) in self.va.range(..VA_TOP).rev() {
            if end <= hi && hi - end >= size_al {
                chosen = Some(hi - size_al);
                break;
            }
            hi = hi.min(start);
        }
        let addr = chosen.unwrap_or_else(|| hi - size_al);
        self.va.insert(addr, addr + size_al);
        addr
    }

    fn va_overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr + size;
        if let Some((_, &e)) = self.va.range(..end).next_back() {
            return e > addr;
        }
        false
    }

    fn release_available_cached_blocks(&mut self, small: bool, stream: u64, size: u64) -> bool {
        let mss = self.rules().max_split_size;
        if mss == u64::MAX {
            return false;
        }
        let p = Self::pool_of(small);
        let key = size.max(mss);
        let hit = self.pools[p].blocks.range((stream, key, 0)..).next().map(|(&(s, _, _), &i)| (s, i));
        match hit {
            Some((s, i)) if s == stream && self.b(i).es == NONE => {
                self.release_block(i);
                true
            }
            _ => {
                // no single block is large enough: free oversize blocks, the largest first
                let below: Vec<((u64, u64, u64), u32)> =
                    self.pools[p].blocks.range(..(stream, key, 0)).rev().map(|(k, &i)| (*k, i)).collect();
                if below.is_empty() {
                    return false;
                }
                let mut released = 0u64;
                for ((s, bsize, _), i) in below {
                    if released >= key || bsize < mss || s != stream {
                        break;
                    }
                    if self.b(i).es == NONE {
                        released += bsize;
                        self.release_block(i);
                    }
                }
                released >= key
            }
        }
    }

    /// `release_blocks` of both pools: return every whole free segment (and every free page of
    /// expandable segments) to the driver. Pending frees must be completed first
    /// ([`Allocator::complete_pending_frees`]); [`Allocator::empty_cache`] does both.
    pub fn release_cached_blocks(&mut self) {
        for p in [Self::pool_of(false), Self::pool_of(true)] {
            let order: Vec<u32> = self.pools[p].blocks.values().copied().collect();
            let mut to_unmap = Vec::new();
            for i in order {
                if self.b(i).es != NONE {
                    to_unmap.push(i);
                } else if !self.is_split(i) {
                    self.release_block(i);
                }
            }
            for i in to_unmap {
                self.unmap_block(i);
                if !self.is_split(i) && !self.b(i).mapped {
                    self.release_expandable_segment(i);
                }
            }
        }
    }

    fn release_block(&mut self, i: u32) {
        let (ptr, size) = (self.b(i).ptr, self.b(i).size);
        self.counters.num_device_free += 1;
        self.ops.push(DeviceOp::SegmentFree { addr: ptr, size });
        self.counters.reserved -= size;
        self.remove_from_blocks(i);
        self.va.remove(&ptr);
        self.delete(i);
    }

    fn release_expandable_segment(&mut self, i: u32) {
        self.remove_unmapped(i);
        let es = self.b(i).es as usize;
        self.segments[es].pages.clear();
        self.delete(i);
    }

    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NONE {
            return 0;
        }
        let s = self.b(src).clone();
        if s.allocated || s.mapped != self.b(dst).mapped {
            return 0;
        }
        if s.mapped {
            self.remove_from_blocks(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.b(dst).prev == src {
            let d = self.bm(dst);
            d.ptr = s.ptr;
            d.prev = s.prev;
            if s.prev != NONE {
                self.bm(s.prev).next = dst;
            }
        } else {
            self.bm(dst).next = s.next;
            if s.next != NONE {
                self.bm(s.next).prev = dst;
            }
        }
        self.bm(dst).size += s.size;
        self.delete(src);
        s.size
    }

    fn alloc_found_block(&mut self, block: u32, size: u64, orig: u64, split: bool) -> u64 {
        let mut b = block;
        if split {
            let r = self.b(block).clone();
            let nb = self.new_block(Block { size, allocated: false, requested: 0, next: block, ..r.clone() });
            if r.prev != NONE {
                self.bm(r.prev).next = nb;
            }
            let rem = self.bm(block);
            rem.prev = nb;
            rem.ptr += size;
            rem.size -= size;
            self.insert_into_blocks(block);
            b = nb;
        }
        let bb = self.bm(b);
        bb.allocated = true;
        bb.requested = orig;
        let (ptr, bsize) = (bb.ptr, bb.size);
        self.counters.allocated += bsize;
        self.counters.peak_allocated = self.counters.peak_allocated.max(self.counters.allocated);
        self.live.insert(ptr, b);
        ptr
    }

    /// `free` of the live block at `ptr` (the trace's `free_requested` and `free_completed`
    /// together: the block goes back to its pool, merged with free neighbours).
    pub fn free(&mut self, ptr: u64) -> bool {
        if !self.free_requested(ptr) {
            return false;
        }
        self.free_completed(ptr)
    }

    /// The allocated-bytes half of `free` (`free_requested`): the block stops counting as
    /// allocated; it becomes reusable at [`Allocator::free_completed`].
    pub fn free_requested(&mut self, ptr: u64) -> bool {
        let Some(&i) = self.live.get(&ptr) else { return false };
        if self.pending.contains(&ptr) {
            return false;
        }
        self.counters.allocated -= self.b(i).size;
        self.pending.insert(ptr);
        true
    }

    /// `free_block`: the block at `ptr`, already requested free, goes back to its pool.
    pub fn free_completed(&mut self, ptr: u64) -> bool {
        if !self.pending.remove(&ptr) {
            return false;
        }
        let Some(i) = self.live.remove(&ptr) else { return false };
        self.bm(i).allocated = false;
        self.bm(i).requested = 0;
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_into_blocks(i);
        true
    }

    /// Completes every free that was requested but not yet completed (what
    /// `synchronize_and_free_events` does before `release_cached_blocks`).
    pub fn complete_pending_frees(&mut self) -> Vec<u64> {
        let ptrs: Vec<u64> = self.pending.iter().copied().collect();
        for &p in &ptrs {
            self.free_completed(p);
        }
        ptrs
    }

    /// `emptyCache()`.
    pub fn empty_cache(&mut self) {
        self.complete_pending_frees();
        self.release_cached_blocks();
    }

    fn find_expandable_block(&mut self, small: bool, stream: u64, size: u64) -> u32 {
        let p = Self::pool_of(small);
        let cands: Vec<u32> = self.pools[p].unmapped.range((stream, 0)..).take_while(|(k, _)| k.0 == stream).map(|(_, &i)| i).collect();
        let allocatable = |a: &Allocator, i: u32| i != NONE && !a.b(i).allocated;
        for u in cands {
            let mut c = u;
            let prev = self.b(c).prev;
            if allocatable(self, prev) {
                c = prev;
            }
            let mut bytes = 0;
            let mut x = c;
            while bytes < size && allocatable(self, x) {
                bytes += self.b(x).size;
                x = self.b(x).next;
            }
            if bytes >= size {
                return c;
            }
        }
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let total = self.limits.device_total;
        let max_pages = (total + total / 8).div_ceil(page);
        let base = match self.replay_op() {
            Some(DeviceOp::Map { addr, .. }) if !self.reservation_overlaps(addr, max_pages * page) => addr,
            _ => self.next_reservation,
        };
        self.next_reservation = self.next_reservation.max(base + max_pages * page).div_ceil(1 << 30) * (1 << 30);
        self.segments.push(Expandable { base, page, pages: Vec::new(), max_pages });
        let es = (self.segments.len() - 1) as u32;
        let i = self.new_block(Block {
            ptr: base,
            size: max_pages * page,
            requested: 0,
            stream,
            small,
            allocated: false,
            mapped: false,
            prev: NONE,
            next: NONE,
            gc_base: 0,
            es,
        });
        self.insert_unmapped(i);
        i
    }

    fn reservation_overlaps(&self, addr: u64, size: u64) -> bool {
        self.segments.iter().any(|s| addr < s.base + s.max_pages * s.page && s.base < addr + size)
    }

    /// `ExpandableSegment::map`: pages covering `[ptr, ptr + size)`; 0 when the device is full.
    fn es_map(&mut self, es: u32, ptr: u64, size: u64) -> (u64, u64) {
        let (base, page) = (self.segments[es as usize].base, self.segments[es as usize].page);
        let begin = (ptr - base) / page;
        let end = (ptr + size - base).div_ceil(page);
        if begin == end {
            return (base + begin * page, 0);
        }
        if let Some(cap) = self.limits.device_capacity {
            if self.counters.reserved + (end - begin) * page > cap {
                return (base + begin * page, 0);
            }
        }
        let seg = &mut self.segments[es as usize];
        if seg.pages.len() < end as usize {
            seg.pages.resize(end as usize, false);
        }
        for p in begin..end {
            seg.pages[p as usize] = true;
        }
        (base + begin * page, (end - begin) * page)
    }

    /// `ExpandableSegment::unmap`: the whole pages inside `[ptr, ptr + size)`.
    fn es_unmap(&mut self, es: u32, ptr: u64, size: u64) -> (u64, u64) {
        let seg = &mut self.segments[es as usize];
        let begin = (ptr - seg.base).div_ceil(seg.page);
        let end = (ptr + size - seg.base) / seg.page;
        if begin >= end {
            return (ptr, 0);
        }
        for p in begin..end {
            if let Some(x) = seg.pages.get_mut(p as usize) {
                *x = false;
            }
        }
        while seg.pages.last() == Some(&false) {
            seg.pages.pop();
        }
        (seg.base + begin * seg.page, (end - begin) * seg.page)
    }

    fn map_block(&mut self, to_map: u32, size: u64) -> bool {
        let (es, ptr, bsize) = (self.b(to_map).es, self.b(to_map).ptr, self.b(to_map).size);
        let (mptr, msize) = self.es_map(es, ptr, size);
        if msize == 0 {
            return false;
        }
        debug_assert_eq!(mptr, ptr);
        self.remove_unmapped(to_map);
        self.bm(to_map).mapped = true;
        if msize < bsize {
            let t = self.b(to_map).clone();
            let rem = self.new_block(Block { ptr: ptr + msize, size: bsize - msize, mapped: false, prev: to_map, ..t.clone() });
            if t.next != NONE {
                self.bm(t.next).prev = rem;
            }
            self.bm(to_map).next = rem;
            self.bm(to_map).size = msize;
            self.insert_unmapped(rem);
        }
        let (prev, next) = (self.b(to_map).prev, self.b(to_map).next);
        self.try_merge(to_map, prev);
        self.try_merge(to_map, next);
        self.insert_into_blocks(to_map);
        self.grow_reserved(msize);
        self.counters.num_device_alloc += 1;
        self.ops.push(DeviceOp::Map { addr: mptr, size: msize });
        true
    }

    fn try_allocate_expandable_block(&mut self, small: bool, stream: u64, size: u64) -> Option<u32> {
        let mut c = self.find_expandable_block(small, stream, size);
        if !self.b(c).mapped {
            let s = self.b(c).size.min(size);
            if !self.map_block(c, s) {
                return None;
            }
        }
        while self.b(c).size < size {
            let remaining = size - self.b(c).size;
            let nc = self.b(c).next;
            let s = remaining.min(self.b(nc).size);
            if !self.map_block(nc, s) {
                return None;
            }
            c = nc;
        }
        self.remove_from_blocks(c);
        Some(c)
    }

    fn unmap_block(&mut self, i: u32) {
        let (es, ptr, size) = (self.b(i).es, self.b(i).ptr, self.b(i).size);
        let (uptr, usize_) = self.es_unmap(es, ptr, size);
        if usize_ == 0 {
            return;
        }
        self.remove_from_blocks(i);
        let before = uptr - ptr;
        let t = self.b(i).clone();
        if before > 0 {
            let bf = self.new_block(Block { ptr, size: before, mapped: true, allocated: false, next: i, ..t.clone() });
            if t.prev != NONE {
                self.bm(t.prev).next = bf;
            }
            self.bm(i).prev = bf;
            self.insert_into_blocks(bf);
        }
        let after = size - before - usize_;
        if after > 0 {
            let t = self.b(i).clone();
            let af = self.new_block(Block { ptr: uptr + usize_, size: after, mapped: true, allocated: false, prev: i, ..t.clone() });
            if t.next != NONE {
                self.bm(t.next).prev = af;
            }
            self.bm(i).next = af;
            self.insert_into_blocks(af);
        }
        {
            let b = self.bm(i);
            b.ptr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_unmapped(i);
        self.counters.reserved -= usize_;
        self.counters.num_device_free += 1;
        self.ops.push(DeviceOp::Unmap { addr: uptr, size: usize_ });
    }

    /// The figures of the state now.
    pub fn figures(&self) -> Figures {
        let mut f = Figures { reserved: self.counters.reserved, allocated: self.counters.allocated, ..Figures::default() };
        let live: BTreeSet<u32> = self.live.values().copied().collect();
        // walk every chain from its head; a run of mapped blocks is one segment (mapped range)
        let mut heads = Vec::new();
        for p in &self.pools {
            heads.extend(p.blocks.values().copied());
            heads.extend(p.unmapped.values().copied());
        }
        heads.extend(live.iter().copied());
        let mut seen_heads = BTreeSet::new();
        for mut h in heads {
            while self.b(h).prev != NONE {
                h = self.b(h).prev;
            }
            if !seen_heads.insert(h) {
                continue;
            }
            let mut x = h;
            // per mapped run: free bytes that a live block strands, free bytes always releasable
            // (whole pages of an expandable segment, which empty_cache() unmaps), a live block
            let (mut free, mut pages, mut has_live, mut in_run) = (0u64, 0u64, false, false);
            let close = |f: &mut Figures, free: &mut u64, pages: &mut u64, has_live: &mut bool, in_run: &mut bool| {
                if *in_run {
                    f.segments += 1;
                    if *has_live {
                        f.stranded += *free;
                        f.releasable += *pages;
                    } else {
                        f.releasable += *free + *pages;
                    }
                }
                (*free, *pages, *has_live, *in_run) = (0, 0, false, false);
            };
            while x != NONE {
                let b = self.b(x);
                if b.mapped {
                    in_run = true;
                    if b.allocated {
                        has_live = true;
                    } else {
                        f.largest_free_block = f.largest_free_block.max(b.size);
                        if b.es == NONE {
                            free += b.size;
                            if b.prev != NONE || b.next != NONE {
                                f.inactive_split += b.size;
                            }
                        } else {
                            let seg = &self.segments[b.es as usize];
                            let first = (b.ptr - seg.base).div_ceil(seg.page);
                            let last = (b.ptr + b.size - seg.base) / seg.page;
                            let whole = last.saturating_sub(first) * seg.page;
                            pages += whole;
                            free += b.size - whole;
                        }
                    }
                } else {
                    close(&mut f, &mut free, &mut pages, &mut has_live, &mut in_run);
                }
                x = b.next;
            }
            close(&mut f, &mut free, &mut pages, &mut has_live, &mut in_run);
        }
        f
    }
}
