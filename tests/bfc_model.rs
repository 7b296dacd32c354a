//! XLA's BFC allocator model (`gpufrag::sim::bfc::BfcAllocator`, binned best fit) against a
//! deliberately naive one written here (a `Vec` of chunks in address order, every search a linear
//! scan for the smallest chunk that fits, merges by looking left and right), and the address map
//! placing the same blocks from the requested sizes alone with `Framework::XLA`'s rules.
//!
//! Random sequences of allocations and frees (sizes from 1 byte to a few MiB, limits of a few
//! dozen MiB so that the pool grows, fills and fails) run through all three; after every step the
//! returned address, every chunk, every statistic `memory_stats()` reports and the map's figures
//! must agree. Options vary: preallocated or growing, regions coalescing (VMM) or not, touching or
//! apart, a device that runs out (BFC backs off by 10 %), a small `fragmentation_fraction` so that
//! the padding cap matters. The map's stranded and releasable bytes must follow BFC's rule (a
//! region with a live chunk strands its free bytes; only a wholly free region is releasable), as
//! the naive model counts them region by region.

use gpufrag::alloc::Framework;
use gpufrag::map::{AddressSpace, SegmentKind};
use gpufrag::sim::bfc::{BfcAllocator, BfcOptions, BfcStats, BumpDevice, Chunk};
use proptest::prelude::*;

const BASE: u64 = 0x7f00_0000_0000;
const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
struct NChunk {
    addr: u64,
    size: u64,
    used: Option<u64>,
    region: usize,
}

/// The naive model: same policy, no bins, no maps.
#[derive(Clone, Debug)]
struct NaiveBfc {
    limit: u64,
    cap: u64,
    coalesce: bool,
    next_region: u64,
    regions: Vec<(u64, u64)>,
    chunks: Vec<NChunk>,
    num_allocs: u64,
    peak: u64,
    largest_alloc: u64,
    peak_pool: u64,
}

impl NaiveBfc {
    fn new(o: &BfcOptions) -> NaiveBfc {
        let first = if o.allow_growth { o.memory_limit.min(2 * MIB) } else { o.memory_limit };
        let cap = if o.fragmentation_fraction > 0.0 { (o.fragmentation_fraction * o.memory_limit as f64) as u64 } else { 128 * MIB };
        NaiveBfc {
            limit: o.memory_limit,
            cap,
            coalesce: o.coalesce_regions,
            next_region: first.div_ceil(256) * 256,
            regions: vec![],
            chunks: vec![],
            num_allocs: 0,
            peak: 0,
            largest_alloc: 0,
            peak_pool: 0,
        }
    }

    fn pool(&self) -> u64 {
        self.regions.iter().map(|r| r.1).sum()
    }

    fn in_use(&self) -> u64 {
        self.chunks.iter().filter(|c| c.used.is_some()).map(|c| c.size).sum()
    }

    fn stats(&self) -> BfcStats {
        BfcStats {
            bytes_in_use: self.in_use(),
            peak_bytes_in_use: self.peak,
            num_allocs: self.num_allocs,
            largest_alloc_size: self.largest_alloc,
            bytes_limit: self.limit,
            pool_bytes: self.pool(),
            peak_pool_bytes: self.peak_pool,
            largest_free_block_bytes: self.chunks.iter().filter(|c| c.used.is_none()).map(|c| c.size).max().unwrap_or(0),
        }
    }

    fn try_fit(&mut self, rounded: u64, requested: u64) -> Option<u64> {
        let mut best: Option<usize> = None;
        for (i, c) in self.chunks.iter().enumerate() {
            if c.used.is_none() && c.size >= rounded && best.is_none_or(|b| (c.size, c.addr) < (self.chunks[b].size, self.chunks[b].addr)) {
                best = Some(i);
            }
        }
        let i = best?;
        let c = self.chunks[i].clone();
        if c.size >= 2 * rounded || c.size - rounded >= self.cap {
            self.chunks[i].size = rounded;
            self.chunks.insert(i + 1, NChunk { addr: c.addr + rounded, size: c.size - rounded, used: None, region: c.region });
        }
        self.chunks[i].used = Some(requested);
        self.num_allocs += 1;
        self.peak = self.peak.max(self.in_use());
        self.largest_alloc = self.largest_alloc.max(self.chunks[i].size);
        Some(c.addr)
    }

    fn grow(&mut self, rounded: u64, dev: &mut BumpDevice) -> bool {
        let available = (self.limit - self.pool()) / 256 * 256;
        if rounded > available {
            return false;
        }
        let doubled = rounded > self.next_region;
        while rounded > self.next_region {
            self.next_region *= 2;
        }
        let mut bytes = self.next_region.min(available);
        let addr = loop {
            if bytes <= dev.capacity {
                dev.capacity -= bytes;
                let a = dev.next;
                dev.next += bytes + dev.gap;
                break a;
            }
            let mut b = ((bytes as f64 * 0.9) as u64).div_ceil(256) * 256;
            if b >= bytes {
                b = bytes - 256;
            }
            bytes = b;
            if bytes < rounded {
                return false;
            }
        };
        if !doubled {
            self.next_region *= 2;
        }
        let joins = self.coalesce && self.regions.last().is_some_and(|&(a, s)| a + s == addr);
        let region = if joins {
            let last = self.regions.len() - 1;
            self.regions[last].1 += bytes;
            last
        } else {
            self.regions.push((addr, bytes));
            self.regions.len() - 1
        };
        let pos = self.chunks.iter().position(|c| c.addr > addr).unwrap_or(self.chunks.len());
        self.chunks.insert(pos, NChunk { addr, size: bytes, used: None, region });
        self.merge_around(pos);
        self.peak_pool = self.peak_pool.max(self.pool());
        true
    }

    fn allocate(&mut self, requested: u64, dev: &mut BumpDevice) -> Option<u64> {
        if requested == 0 {
            return None;
        }
        let rounded = requested.div_ceil(256) * 256;
        if let Some(p) = self.try_fit(rounded, requested) {
            return Some(p);
        }
        if self.grow(rounded, dev) {
            return self.try_fit(rounded, requested);
        }
        None
    }

    fn merge_around(&mut self, mut i: usize) {
        let joinable = |a: &NChunk, b: &NChunk| a.used.is_none() && b.used.is_none() && a.region == b.region && a.addr + a.size == b.addr;
        if i + 1 < self.chunks.len() && joinable(&self.chunks[i], &self.chunks[i + 1]) {
            self.chunks[i].size += self.chunks[i + 1].size;
            self.chunks.remove(i + 1);
        }
        if i > 0 && joinable(&self.chunks[i - 1], &self.chunks[i]) {
            self.chunks[i - 1].size += self.chunks[i].size;
            self.chunks.remove(i);
            i -= 1;
        }
        let _ = i;
    }

    fn deallocate(&mut self, ptr: u64) -> bool {
        let Some(i) = self.chunks.iter().position(|c| c.addr == ptr && c.used.is_some()) else { return false };
        self.chunks[i].used = None;
        self.merge_around(i);
        true
    }

    /// Free bytes by region: (stranded, releasable). A region with a chunk in use never goes
    /// back to the driver, so all its free bytes are stranded; a wholly free region is releasable.
    fn free_split(&self) -> (u64, u64) {
        let (mut stranded, mut releasable) = (0, 0);
        for (r, &(_, size)) in self.regions.iter().enumerate() {
            let used: Vec<u64> = self.chunks.iter().filter(|c| c.region == r && c.used.is_some()).map(|c| c.size).collect();
            let free = size - used.iter().sum::<u64>();
            if used.is_empty() {
                releasable += free;
            } else {
                stranded += free;
            }
        }
        (stranded, releasable)
    }

    fn chunks(&self) -> Vec<Chunk> {
        self.chunks.iter().map(|c| Chunk { addr: c.addr, size: c.size, requested: c.used }).collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..4096).prop_map(Op::Alloc),
        3 => (4096u64..(3 * MIB)).prop_map(Op::Alloc),
        1 => prop::sample::select(vec![MIB, 2 * MIB, 4 * MIB, 8 * MIB, 3 * MIB + 1]).prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
    ]
}

fn options() -> impl Strategy<Value = (BfcOptions, u64, u64)> {
    (
        prop::sample::select(vec![8 * MIB, 24 * MIB, 40 * MIB + 768]),
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![0.0, 0.02, 0.1]),
        prop::sample::select(vec![0u64, 4096]),
        prop::sample::select(vec![u64::MAX / 4, 20 * MIB]),
    )
        .prop_map(|(limit, allow_growth, coalesce_regions, fragmentation_fraction, gap, capacity)| {
            (BfcOptions { memory_limit: limit, allow_growth, fragmentation_fraction, coalesce_regions }, gap, capacity)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bfc_model_matches_the_naive_model_and_the_map((opts, gap, capacity) in options(), ops in prop::collection::vec(op(), 1..120)) {
        let mut dev = BumpDevice { next: BASE, capacity, gap };
        let mut naive_dev = dev.clone();
        let mut bfc = BfcAllocator::new(opts);
        let mut naive = NaiveBfc::new(&opts);
        let mut map = AddressSpace::default();
        map.set_bfc_rules(bfc.rules());
        if opts.coalesce_regions {
            map.reserve(BASE, 1 << 40).expect("a fresh map takes the reservation");
        }
        let mut regions_fed = 0u64;
        let mut live: Vec<u64> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc(n) => {
                    let got = bfc.allocate(n, &mut dev);
                    let want = naive.allocate(n, &mut naive_dev);
                    prop_assert_eq!(got, want, "step {} alloc {}: model {:x?} naive {:x?}", step, n, got, want);
                    // New regions reach the map as the driver events would.
                    let pool = bfc.stats().pool_bytes;
                    if pool != regions_fed {
                        let fresh: Vec<(u64, u64)> = naive.regions.iter().copied().filter(|&(a, _)| map.segment_at(a).is_none()).collect();
                        for (a, s) in fresh {
                            let _ = if opts.coalesce_regions { map.map(a, s, true) } else { map.driver_alloc(a, s, SegmentKind::Driver, true, 0) };
                        }
                        // a coalesced region grew: map its new tail
                        if opts.coalesce_regions {
                            let mapped: u64 = map.segments().map(|s| s.size).sum();
                            if mapped < pool {
                                let (a, s) = *naive.regions.last().expect("a region");
                                let end = a + s;
                                let _ = map.map(end - (pool - mapped), pool - mapped, true);
                            }
                        }
                        regions_fed = pool;
                    }
                    if let Some(p) = got {
                        let chunk = bfc.chunks().find(|c| c.addr == p).expect("chunk at the pointer");
                        let placed = map.block_alloc_by(p, n, None, Framework::XLA);
                        prop_assert_eq!(placed, Ok(chunk.size), "step {} map placed {:x} of {} bytes", step, p, n);
                        live.push(p);
                    }
                }
                Op::Free(i) => {
                    if live.is_empty() {
                        continue;
                    }
                    let p = live.swap_remove(i % live.len());
                    prop_assert!(bfc.deallocate(p).is_ok());
                    prop_assert!(naive.deallocate(p));
                    prop_assert!(map.block_free(p).is_ok());
                }
            }
            prop_assert_eq!(bfc.chunks().collect::<Vec<_>>(), naive.chunks(), "step {} chunks", step);
            let s = bfc.stats();
            prop_assert_eq!(s, naive.stats(), "step {} stats", step);
            let f = map.figures();
            if s.pool_bytes > 0 {
                prop_assert_eq!(f.reserved, s.pool_bytes, "step {} reserved vs pool_bytes", step);
                prop_assert_eq!(f.allocated, s.bytes_in_use, "step {} allocated vs bytes_in_use", step);
                prop_assert_eq!(f.largest_free_block, s.largest_free_block_bytes, "step {} largest free", step);
                prop_assert_eq!(f.stranded + f.releasable, s.pool_bytes - s.bytes_in_use, "step {} free", step);
                let split = bfc.free_split();
                prop_assert_eq!((split.stranded, split.releasable), naive.free_split(), "step {} model's stranded/releasable", step);
                prop_assert_eq!((f.stranded, f.releasable), naive.free_split(), "step {} map's stranded/releasable vs BFC's rule", step);
                prop_assert_eq!(f.framework_reserved, s.pool_bytes, "step {} framework_reserved vs pool_bytes", step);
            }
        }
        prop_assert!(bfc.deallocate(BASE + 1).is_err());
    }
}
