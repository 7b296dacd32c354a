//! The framework layer of `simcuda-workload`: a small caching allocator with PyTorch's rules
//! (`CachingAllocator`), so that the workload strands memory inside segments the way a real
//! training job does, plus PyTorch's size formatting for its out-of-memory message. It talks to
//! the device through the `Device` trait (the binary plugs in `cudaMalloc`/`cudaFree`), so the
//! rules are unit-tested here without any library.
//!
//! The rules, as in `c10/cuda/CUDACachingAllocator.cpp` (and tests/fixtures/README.md): sizes
//! round up to 512 bytes; requests of 1 MiB or less use the small pool (2 MiB segments), larger
//! ones the large pool (20 MiB segments below 10 MiB, else the size rounded up to 2 MiB); a
//! request takes the smallest free block of its pool that fits (lowest address among equals) and
//! splits it when the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool);
//! freed blocks merge with free neighbours of the same segment only; segments are cached, never
//! returned, except that when the device refuses a new segment the allocator frees its wholly free
//! segments and tries once more before reporting out of memory.

use std::collections::{BTreeMap, BTreeSet};

const MIB: u64 = 1 << 20;
const SMALL_SIZE: u64 = MIB;
const SMALL_BUFFER: u64 = 2 * MIB;
const LARGE_BUFFER: u64 = 20 * MIB;
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
const ROUND_LARGE: u64 = 2 * MIB;
const MIN_BLOCK: u64 = 512;

/// Where segments come from.
pub trait Device {
    /// A new segment of `size` bytes, or the CUDA error code.
    fn malloc(&mut self, size: u64) -> Result<u64, i32>;
    /// Returns a segment.
    fn free(&mut self, addr: u64) -> Result<(), i32>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PoolKind {
    Small,
    Large,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    /// Some(requested bytes) while allocated.
    requested: Option<u64>,
}

#[derive(Debug)]
struct Segment {
    size: u64,
    pool: PoolKind,
    blocks: BTreeMap<u64, Block>,
}

/// What the allocator did, for whoever traces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorEvent {
    SegmentAlloc {
        addr: u64,
        size: u64,
    },
    SegmentFree {
        addr: u64,
        size: u64,
    },
    BlockAlloc {
        addr: u64,
        size: u64,
        requested: u64,
    },
    BlockFree {
        addr: u64,
        size: u64,
    },
    /// A request that failed: the segment size asked of the device and its error.
    Oom {
        requested: u64,
        segment_size: u64,
        rc: i32,
    },
}

/// The allocator's figures, with PyTorch's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes in segments (`reserved_bytes`).
    pub reserved: u64,
    /// Bytes in allocated blocks (`allocated_bytes`).
    pub allocated: u64,
    /// Free bytes in segments that hold at least one allocated block (`inactive_split_bytes`).
    pub stranded: u64,
    /// Bytes of segments with no allocated block (what `empty_cache()` returns).
    pub releasable: u64,
    /// The largest free block.
    pub largest_free_block: u64,
    pub segments: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
}

/// A failed request: the size asked for and the device's error for the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    pub requested: u64,
    pub segment_size: u64,
    pub rc: i32,
}

/// The caching allocator.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    segments: BTreeMap<u64, Segment>,
    free_blocks: BTreeSet<(PoolKind, u64, u64)>,
    /// Allocated block address → its segment's base.
    live: BTreeMap<u64, u64>,
    num_alloc_retries: u64,
    num_ooms: u64,
    /// Events since the caller last drained them.
    pub events: Vec<AllocatorEvent>,
}

/// The block size for a request (PyTorch's `round_size` without power-of-two divisions).
pub fn round_size(size: u64) -> u64 {
    size.max(MIN_BLOCK).next_multiple_of(MIN_BLOCK)
}

fn pool_of(size: u64) -> PoolKind {
    if size <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// The segment size for a block size (PyTorch's `get_allocation_size`).
pub fn segment_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.next_multiple_of(ROUND_LARGE)
    }
}

impl CachingAllocator {
    pub fn new() -> CachingAllocator {
        CachingAllocator::default()
    }

    /// Allocates a block for `requested` bytes.
    pub fn malloc(&mut self, dev: &mut dyn Device, requested: u64) -> Result<u64, OutOfMemory> {
        let size = round_size(requested);
        let pool = pool_of(size);
        let found = self.free_blocks.range((pool, size, 0)..).next().copied().filter(|&(p, _, _)| p == pool);
        let key = match found {
            Some(key) => key,
            None => self.new_segment(dev, pool, size, requested)?,
        };
        self.free_blocks.remove(&key);
        let addr = key.2;
        let base = self.segment_base(addr);
        let seg = self.segments.get_mut(&base).expect("a free block lies in a segment");
        let block = seg.blocks.get_mut(&addr).expect("indexed free block exists");
        let rest = block.size - size;
        let split = match pool {
            PoolKind::Small => rest >= MIN_BLOCK,
            PoolKind::Large => rest > SMALL_SIZE,
        };
        if split {
            block.size = size;
            seg.blocks.insert(addr + size, Block { size: rest, requested: None });
            self.free_blocks.insert((pool, rest, addr + size));
        }
        let block = seg.blocks.get_mut(&addr).expect("indexed free block exists");
        block.requested = Some(requested);
        let size = block.size;
        self.live.insert(addr, base);
        self.events.push(AllocatorEvent::BlockAlloc { addr, size, requested });
        Ok(addr)
    }

    fn segment_base(&self, addr: u64) -> u64 {
        *self.segments.range(..=addr).next_back().expect("address inside a segment").0
    }

    /// A new segment for a block of `size`; returns its free block's index key.
    fn new_segment(
        &mut self,
        dev: &mut dyn Device,
        pool: PoolKind,
        size: u64,
        requested: u64,
    ) -> Result<(PoolKind, u64, u64), OutOfMemory> {
        let seg_size = segment_size(size);
        let addr = match dev.malloc(seg_size) {
            Ok(a) => a,
            Err(_) => {
                self.release_cached(dev);
                self.num_alloc_retries += 1;
                match dev.malloc(seg_size) {
                    Ok(a) => a,
                    Err(rc) => {
                        self.num_ooms += 1;
                        self.events.push(AllocatorEvent::Oom { requested, segment_size: seg_size, rc });
                        return Err(OutOfMemory { requested, segment_size: seg_size, rc });
                    }
                }
            }
        };
        let mut blocks = BTreeMap::new();
        blocks.insert(addr, Block { size: seg_size, requested: None });
        self.segments.insert(addr, Segment { size: seg_size, pool, blocks });
        self.free_blocks.insert((pool, seg_size, addr));
        self.events.push(AllocatorEvent::SegmentAlloc { addr, size: seg_size });
        Ok((pool, seg_size, addr))
    }

    /// Frees every wholly free segment (PyTorch's `release_cached_blocks`, `empty_cache()`).
    pub fn release_cached(&mut self, dev: &mut dyn Device) {
        let idle: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.blocks.len() == 1 && s.blocks.values().all(|b| b.requested.is_none()))
            .map(|(&a, _)| a)
            .collect();
        for addr in idle {
            if dev.free(addr).is_ok() {
                if let Some(seg) = self.segments.remove(&addr) {
                    self.free_blocks.remove(&(seg.pool, seg.size, addr));
                    self.events.push(AllocatorEvent::SegmentFree { addr, size: seg.size });
                }
            }
        }
    }

    /// Frees the block at `addr` (false when there is none); it merges with free neighbours of
    /// its segment and stays cached.
    pub fn free(&mut self, addr: u64) -> bool {
        let Some(base) = self.live.remove(&addr) else {
            return false;
        };
        let Some(seg) = self.segments.get_mut(&base) else {
            return false;
        };
        let pool = seg.pool;
        let Some(block) = seg.blocks.get_mut(&addr) else {
            return false;
        };
        block.requested = None;
        let freed = block.size;
        self.events.push(AllocatorEvent::BlockFree { addr, size: freed });
        let (mut start, mut size) = (addr, freed);
        if let Some((&next, &nb)) = seg.blocks.range(addr + 1..).next() {
            if nb.requested.is_none() {
                seg.blocks.remove(&next);
                self.free_blocks.remove(&(pool, nb.size, next));
                size += nb.size;
            }
        }
        if let Some((&prev, &pb)) = seg.blocks.range(..addr).next_back() {
            if pb.requested.is_none() {
                seg.blocks.remove(&addr);
                self.free_blocks.remove(&(pool, pb.size, prev));
                start = prev;
                size += pb.size;
            }
        }
        seg.blocks.insert(start, Block { size, requested: None });
        self.free_blocks.insert((pool, size, start));
        true
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats {
            segments: self.segments.len() as u64,
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            ..Stats::default()
        };
        for seg in self.segments.values() {
            s.reserved += seg.size;
            let allocated: u64 = seg.blocks.values().filter(|b| b.requested.is_some()).map(|b| b.size).sum();
            s.allocated += allocated;
            if allocated == 0 {
                s.releasable += seg.size;
            } else {
                s.stranded += seg.size - allocated;
            }
            for b in seg.blocks.values().filter(|b| b.requested.is_none()) {
                s.largest_free_block = s.largest_free_block.max(b.size);
            }
        }
        s
    }
}

/// PyTorch's `format_size`: bytes, KiB, MiB or GiB with two decimals.
pub fn format_size(size: u64) -> String {
    let s = size as f64;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", s / 1024.0)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", s / 1048576.0)
    } else {
        format!("{:.2} GiB", s / 1073741824.0)
    }
}

/// The out-of-memory message, worded as PyTorch's.
pub fn oom_message(requested: u64, device: i32, total: u64, free: u64, stats: &Stats) -> String {
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU {device} has a total capacity of {} of which {} is free. \
         Including non-PyTorch memory, this process has {} memory in use. Of the allocated memory {} is allocated \
         by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try \
         setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        format_size(requested),
        format_size(total),
        format_size(free),
        format_size(total.saturating_sub(free)),
        format_size(stats.allocated),
        format_size(stats.reserved - stats.allocated),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with `free` bytes that hands out ascending addresses.
    struct FakeDevice {
        free: u64,
        next: u64,
        sizes: BTreeMap<u64, u64>,
    }

    impl Device for FakeDevice {
        fn malloc(&mut self, size: u64) -> Result<u64, i32> {
            if size > self.free {
                return Err(2);
            }
            self.free -= size;
            let a = self.next;
            self.next += size;
            self.sizes.insert(a, size);
            Ok(a)
        }
        fn free(&mut self, addr: u64) -> Result<(), i32> {
            self.free += self.sizes.remove(&addr).ok_or(1)?;
            Ok(())
        }
    }

    #[test]
    fn frag_oom_scenario_strands_what_the_h200_trace_shows() {
        // tests/fixtures/README.md: frag_oom, reserved 10,485,760,000, allocated 8,388,608,000,
        // inactive_split 2,097,152,000, then 2.5 GiB fails although 2.23 GiB + 1.95 GiB are free.
        let mut dev = FakeDevice { free: 12 << 30, next: 1 << 40, sizes: BTreeMap::new() };
        let mut a = CachingAllocator::new();
        let blocks: Vec<u64> = (0..20).map(|_| a.malloc(&mut dev, 500 * MIB).expect("fits")).collect();
        for b in blocks.iter().step_by(2) {
            assert!(a.free(*b));
        }
        for _ in 0..10 {
            a.malloc(&mut dev, 300 * MIB).expect("reuses a cached segment");
        }
        let s = a.stats();
        assert_eq!((s.reserved, s.allocated, s.stranded, s.releasable), (10_485_760_000, 8_388_608_000, 2_097_152_000, 0));
        assert_eq!(s.largest_free_block, 200 * MIB);
        let err = a.malloc(&mut dev, 2560 * MIB).expect_err("fragmentation OOM");
        assert_eq!((err.segment_size, err.rc), (2560 * MIB, 2));
        assert_eq!((a.stats().num_alloc_retries, a.stats().num_ooms), (1, 1));
        assert_eq!(format_size(dev.free), "2.23 GiB");
    }

    #[test]
    fn rounding_splitting_and_merging() {
        let mut dev = FakeDevice { free: 1 << 30, next: 0x1000, sizes: BTreeMap::new() };
        let mut a = CachingAllocator::new();
        let x = a.malloc(&mut dev, 1).expect("small");
        let y = a.malloc(&mut dev, 1000).expect("small");
        assert_eq!(y - x, 512, "512-byte blocks carved from one 2 MiB segment");
        let big = a.malloc(&mut dev, 3 * MIB).expect("large");
        assert_eq!(a.stats().reserved, 2 * MIB + 20 * MIB);
        assert!(a.free(x) && a.free(y) && a.free(big));
        assert!(!a.free(big), "double free refused");
        let s = a.stats();
        assert_eq!((s.allocated, s.releasable, s.largest_free_block), (0, 22 * MIB, 20 * MIB));
        a.release_cached(&mut dev);
        assert_eq!(a.stats(), Stats { num_alloc_retries: 0, ..Stats::default() });
        assert_eq!(dev.free, 1 << 30);
    }

    #[test]
    fn retry_after_releasing_cached_segments() {
        let mut dev = FakeDevice { free: 40 * MIB, next: 0x1000, sizes: BTreeMap::new() };
        let mut a = CachingAllocator::new();
        let b = a.malloc(&mut dev, 30 * MIB).expect("fits");
        a.free(b);
        // 30 MiB cached, 10 MiB left on the device: 36 MiB needs the cache released first.
        a.malloc(&mut dev, 36 * MIB).expect("fits after release");
        assert_eq!(a.stats().num_alloc_retries, 1);
        assert!(a.events.contains(&AllocatorEvent::SegmentFree { addr: b, size: 30 * MIB }));
    }
}
