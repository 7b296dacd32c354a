//! RMM's `pool_memory_resource` (src/alloc/rmm.rs) in the address map against a naive pool
//! written here from RMM's sources (a `Vec` of blocks in address order, each marked as the head
//! of its upstream allocation or not; best fit by a linear scan; always split; merges that never
//! cross a head; growth by `max(size, pool)` or half of what remains under a maximum, halved on an
//! upstream failure down to the request).
//!
//! Random sequences of allocations and frees run through the naive pool, which picks every
//! address; the map is given only what a trace gives (each upstream allocation as a framework
//! segment, each block as its address and requested size) and must place every block with the
//! extent the pool chose, and agree after every step with the pool's own count: bytes in use,
//! the pool's size, its free bytes all stranded (nothing is returned to the driver while the
//! pool lives, `release()` runs in its destructor), none releasable, and its largest free block.

use gpufrag::alloc::Framework;
use gpufrag::map::{AddressSpace, SegmentKind};
use proptest::prelude::*;

const BASE: u64 = 0x7f00_0000_0000;
const KIB: u64 = 1 << 10;

#[derive(Clone, Debug)]
struct Block {
    addr: u64,
    size: u64,
    used: bool,
    head: bool,
}

/// The naive pool, and the device it grows from (addresses handed out upward, `gap` bytes apart).
#[derive(Clone, Debug)]
struct NaivePool {
    blocks: Vec<Block>,
    pool: u64,
    maximum: Option<u64>,
    device_next: u64,
    device_left: u64,
    gap: u64,
    /// Upstream allocations made by the last call, for the map.
    grown: Vec<(u64, u64)>,
}

fn align(n: u64) -> u64 {
    n.div_ceil(256) * 256
}

impl NaivePool {
    fn upstream(&mut self, size: u64) -> Option<u64> {
        if size > self.device_left {
            return None;
        }
        self.device_left -= size;
        let at = self.device_next;
        self.device_next += size + self.gap;
        Some(at)
    }

    fn grow(&mut self, size: u64) -> bool {
        let mut want = match self.maximum {
            None => size.max(self.pool),
            Some(max) => {
                let remaining = align(max - self.pool);
                if size > remaining {
                    return false;
                }
                size.max(remaining / 2)
            }
        };
        while want >= size {
            if let Some(at) = self.upstream(want) {
                self.pool += want;
                self.grown.push((at, want));
                let i = self.blocks.partition_point(|b| b.addr < at);
                self.blocks.insert(i, Block { addr: at, size: want, used: false, head: true });
                return true;
            }
            if want == size {
                return false;
            }
            want = size.max(want / 2);
        }
        false
    }

    fn allocate(&mut self, requested: u64) -> Option<u64> {
        self.grown.clear();
        let size = align(requested);
        if size == 0 {
            return None;
        }
        let fit = |blocks: &[Block]| {
            let mut best: Option<usize> = None;
            for (i, b) in blocks.iter().enumerate() {
                if !b.used && b.size >= size && best.is_none_or(|j| b.size < blocks[j].size) {
                    best = Some(i);
                }
            }
            best
        };
        let i = match fit(&self.blocks) {
            Some(i) => i,
            None if self.grow(size) => fit(&self.blocks).expect("the new upstream block fits"),
            None => return None,
        };
        let b = self.blocks[i].clone();
        self.blocks[i] = Block { addr: b.addr, size, used: true, head: b.head };
        if b.size > size {
            self.blocks.insert(i + 1, Block { addr: b.addr + size, size: b.size - size, used: false, head: false });
        }
        Some(b.addr)
    }

    fn free(&mut self, addr: u64) {
        let i = self.blocks.iter().position(|b| b.addr == addr && b.used).expect("a live block");
        self.blocks[i].used = false;
        if i + 1 < self.blocks.len() {
            let n = self.blocks[i + 1].clone();
            if !n.used && !n.head && self.blocks[i].addr + self.blocks[i].size == n.addr {
                self.blocks[i].size += n.size;
                self.blocks.remove(i + 1);
            }
        }
        if i > 0 {
            let p = self.blocks[i - 1].clone();
            if !p.used && !self.blocks[i].head && p.addr + p.size == self.blocks[i].addr {
                self.blocks[i - 1].size += self.blocks[i].size;
                self.blocks.remove(i);
            }
        }
    }

    fn in_use(&self) -> u64 {
        self.blocks.iter().filter(|b| b.used).map(|b| b.size).sum()
    }

    fn free_bytes(&self) -> u64 {
        self.blocks.iter().filter(|b| !b.used).map(|b| b.size).sum()
    }

    fn largest_free(&self) -> u64 {
        self.blocks.iter().filter(|b| !b.used).map(|b| b.size).max().unwrap_or(0)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (1u64..96 * KIB).prop_map(Op::Alloc),
        1 => (1u64..600 * KIB).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
    ];
    prop::collection::vec(op, 1..160)
}

fn run(ops: &[Op], maximum: Option<u64>, device: u64, gap: u64) -> Result<(), TestCaseError> {
    let rmm = Framework::by_name("rmm").expect("RMM is registered");
    let mut pool = NaivePool { blocks: vec![], pool: 0, maximum, device_next: BASE, device_left: device, gap, grown: vec![] };
    let mut map = AddressSpace::default();
    let mut live: Vec<u64> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc(n) => {
                let got = pool.allocate(n);
                for &(at, size) in &pool.grown {
                    map.driver_alloc(at, size, SegmentKind::Driver, true, 0).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                }
                if let Some(p) = got {
                    let placed = map.block_alloc_by(p, n, None, rmm);
                    prop_assert_eq!(placed, Ok(align(n)), "step {}: block at {:#x} for {} B", step, p, n);
                    live.push(p);
                }
            }
            Op::Free(i) if !live.is_empty() => {
                let p = live.swap_remove(i % live.len());
                pool.free(p);
                map.block_free(p).map_err(|e| TestCaseError::fail(format!("step {step}: free {p:#x}: {e:?}")))?;
            }
            Op::Free(_) => {}
        }
        let f = map.figures();
        let want = (pool.in_use(), pool.pool, pool.pool, pool.free_bytes(), 0, pool.largest_free());
        let got = (f.allocated, f.reserved, f.framework_reserved, f.stranded, f.releasable, f.largest_free_block);
        prop_assert_eq!(
            got,
            want,
            "step {} ({:?}): (allocated, reserved, framework reserved, stranded, releasable, largest free) map vs pool; blocks {:?}",
            step,
            op,
            pool.blocks
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// No maximum: the pool doubles; upstream allocations touch or lie apart.
    #[test]
    fn the_map_follows_rmms_pool(ops in ops(), gap in prop_oneof![Just(0u64), Just(4096u64)]) {
        run(&ops, None, 1 << 30, gap)?;
    }

    /// A maximum pool size and a small device: growth by half of what remains, halving on failure,
    /// and out-of-memory failures.
    #[test]
    fn the_map_follows_rmms_pool_under_a_maximum(ops in ops(), max_kib in 512u64..4096, device_kib in 256u64..4096) {
        run(&ops, Some(max_kib * KIB), device_kib * KIB, 0)?;
    }
}

/// A worked case: two upstream allocations that touch; a block freed in each leaves free space
/// on both sides of the boundary, which RMM never merges: the largest free block is the larger
/// side, and all of it is stranded.
#[test]
fn free_space_never_merges_across_upstream_allocations() {
    let rmm = Framework::by_name("rmm").expect("RMM is registered");
    let mut map = AddressSpace::default();
    map.driver_alloc(BASE, 1 << 20, SegmentKind::Driver, true, 0).expect("first upstream block");
    map.driver_alloc(BASE + (1 << 20), 1 << 20, SegmentKind::Driver, true, 0).expect("second, touching");
    assert_eq!(map.block_alloc_by(BASE, (1 << 20) - 1000, None, rmm), Ok((1 << 20) - 768));
    assert_eq!(map.block_alloc_by(BASE + (1 << 20), 100, None, rmm), Ok(256));
    map.block_free(BASE).expect("live");
    let f = map.figures();
    assert_eq!((f.stranded, f.releasable, f.largest_free_block), ((2 << 20) - 256, 0, 1 << 20), "{f:?}");
}
