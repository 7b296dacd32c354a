//! The inside of framework-owned segments: how their bytes are tiled into live blocks and free
//! runs, and which free run is the largest.
//!
//! Every framework segment is tiled, from its first byte to its last, by a doubly linked list of
//! entries in address order, each a live block or a maximal free run (two free runs never touch:
//! they merge). The entries live in a slab and are found three ways:
//!
//! - by start address, in a hash map: a block's free, and a block placed at the start of a free
//!   run (what caching allocators do: they split the rest off the end), find their entry in O(1);
//!   the entry's neighbours are its list links, so merging a freed block with free neighbours
//!   needs no search at all, and never crosses a segment boundary (each segment has its own list);
//! - free runs by end address, in a B-tree: the free run holding any address (a block placed
//!   inside a run), and the runs in address order. Keyed by end because a block placed at a run's
//!   start leaves the run's end, and so the B-tree, untouched;
//! - free runs by length, in a max-heap with lazy deletion: the largest is its top, O(1). An
//!   update pushes one entry; entries of runs since changed are popped when they reach the top,
//!   and the heap is rebuilt once it holds four times as many entries as there are runs (plus 256).
//!
//! The common events cost O(1) hash operations and at most two B-tree updates (none for a block
//! placed at a run's start that leaves a rest, or for a free whose right neighbour is free),
//! instead of the five to eight B-tree searches and updates of one map of blocks and one of free
//! runs by start (benches/ingest.rs, docs/benchmarks.md).
//!
//! Why no crate: interval crates (`rangemap`, `iset`, `rust-lapper`) keep ranges but no per-range
//! links to merge neighbours in O(1), no largest-run order, and `rangemap` coalesces touching
//! ranges (blocks must stay distinct); the allocators' own design (PyTorch's
//! `CUDACachingAllocator` links each block to its neighbours in the segment and keeps free blocks
//! in a set ordered by size) is what this module follows, plus the by-end index for addresses
//! that fall inside a run.

use super::Block;
use std::collections::hash_map::Entry as HashEntry;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Bound::{Excluded, Unbounded};

/// No entry (the end of a list).
const NIL: u32 = u32::MAX;

/// Hashes an address: a folded 64 × 64 → 128-bit multiply, so that the low bits (the bucket
/// index) depend on all bits of the address; addresses are 512-byte aligned, so the identity or a
/// plain multiply would leave the low bits zero. std's SipHash costs several times as much.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let p = u128::from(x ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// One entry: a live block, or a free run (`free`, with `block.requested` 0).
#[derive(Clone, Copy, Debug)]
struct Node {
    block: Block,
    free: bool,
    /// The segment's slot (the list it is in).
    seg: u32,
    prev: u32,
    next: u32,
}

impl Node {
    fn end(&self) -> u64 {
        self.block.addr + self.block.size
    }
}

/// One segment's list.
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };

/// The entries of every framework segment of one address space; segments are named by their
/// slot number in [`super::AddressSpace`].
#[derive(Clone, Debug, Default)]
pub(super) struct Tiling {
    nodes: Vec<Node>,
    spare: Vec<u32>,
    lists: Vec<List>,
    /// Start of every entry → entry.
    at: AddrMap<u32>,
    /// End of every free run → entry.
    runs: BTreeMap<u64, u32>,
    /// `(len, start)` of every free run, and of runs since changed or removed (see [`Tiling::settle`]).
    by_len: BinaryHeap<(u64, u64)>,
    /// A run whose entry was the top of `by_len` changed: settle before answering.
    top_stale: bool,
}

/// What [`Tiling::split`] moved to the new slot: which side, and its live blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Split {
    /// The left side (below the cut) moved; else the right side did.
    pub(super) moved_left: bool,
    /// Live blocks of the side that moved.
    pub(super) blocks: u64,
    /// Their bytes.
    pub(super) bytes: u64,
}

/// Where [`Tiling::run_at`] found an address.
pub(super) enum Spot {
    /// In the free run with this entry.
    Run(u32),
    /// In a live block, or in no framework segment.
    NotFree,
}

impl Tiling {
    fn new_node(&mut self, n: Node) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = n;
                i
            }
            None => {
                self.nodes.push(n);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn list_mut(&mut self, seg: u32) -> &mut List {
        let s = seg as usize;
        if s >= self.lists.len() {
            self.lists.resize(s + 1, EMPTY);
        }
        &mut self.lists[s]
    }

    fn list(&self, seg: u32) -> List {
        self.lists.get(seg as usize).copied().unwrap_or(EMPTY)
    }

    /// Links entry `i` into its segment's list after `after` (`NIL`: at the head).
    fn link(&mut self, after: u32, i: u32) {
        let seg = self.nodes[i as usize].seg;
        let next = if after == NIL { self.list_mut(seg).head } else { self.nodes[after as usize].next };
        let n = &mut self.nodes[i as usize];
        n.prev = after;
        n.next = next;
        if after == NIL {
            self.list_mut(seg).head = i;
        } else {
            self.nodes[after as usize].next = i;
        }
        if next == NIL {
            self.list_mut(seg).tail = i;
        } else {
            self.nodes[next as usize].prev = i;
        }
        self.list_mut(seg).len += 1;
    }

    /// Unlinks entry `i` and returns it to the slab.
    fn unlink(&mut self, i: u32) {
        let Node { seg, prev, next, .. } = self.nodes[i as usize];
        if prev == NIL {
            self.lists[seg as usize].head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.lists[seg as usize].tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        self.lists[seg as usize].len -= 1;
        self.spare.push(i);
    }

    /// The free run `(len, start)` now exists: one heap push (or a rebuild, O(n) once per n pushes,
    /// when the heap is mostly stale entries).
    fn push_len(&mut self, len: u64, start: u64) {
        if self.by_len.len() > 4 * self.runs.len() + 256 {
            let nodes = &self.nodes;
            self.by_len = self.runs.values().map(|&i| (nodes[i as usize].block.size, nodes[i as usize].block.addr)).collect();
        } else {
            self.by_len.push((len, start));
        }
    }

    /// The free run that started at `start` changed or went: if the heap's top is its entry, the
    /// top has to be settled.
    fn gone(&mut self, start: u64) {
        if self.by_len.peek().is_some_and(|&(_, s)| s == start) {
            self.top_stale = true;
        }
    }

    /// Pops stale entries (runs removed or changed since they were pushed) off the top of the
    /// heap, so that its top is the largest free run again. The top was live before, so only a
    /// change to its run ([`Tiling::gone`]) can stale it. Amortised O(log n): every entry is
    /// pushed once and popped at most once.
    fn settle(&mut self) {
        if !self.top_stale {
            return;
        }
        self.top_stale = false;
        while let Some(&(len, start)) = self.by_len.peek() {
            let live = self.at.get(&start).is_some_and(|&i| {
                let n = &self.nodes[i as usize];
                n.free && n.block.size == len
            });
            if live {
                break;
            }
            self.by_len.pop();
        }
    }

    /// The largest free run, O(1).
    pub(super) fn largest(&self) -> u64 {
        self.by_len.peek().map_or(0, |&(len, _)| len)
    }

    /// A new framework segment `seg` of `[start, start + len)` with no block: one free run.
    pub(super) fn cover(&mut self, seg: u32, start: u64, len: u64) {
        self.rebuild(seg, start, start + len, std::iter::empty());
    }

    /// Tiles the empty list of segment `seg`, `[start, end)`, with `blocks` (in address order, each
    /// inside) and free runs in the gaps between them.
    pub(super) fn rebuild(&mut self, seg: u32, start: u64, end: u64, blocks: impl IntoIterator<Item = Block>) {
        debug_assert_eq!(self.list(seg).len, 0);
        *self.list_mut(seg) = EMPTY;
        let mut at = start;
        let mut last = NIL;
        let mut add = |t: &mut Tiling, block: Block, free: bool| {
            let i = t.new_node(Node { block, free, seg, prev: NIL, next: NIL });
            t.link(last, i);
            t.at.insert(block.addr, i);
            if free {
                t.runs.insert(block.addr + block.size, i);
                t.push_len(block.size, block.addr);
            }
            last = i;
        };
        for b in blocks {
            if b.addr > at {
                add(self, Block { addr: at, size: b.addr - at, requested: 0 }, true);
            }
            add(self, b, false);
            at = b.addr + b.size;
        }
        if at < end {
            add(self, Block { addr: at, size: end - at, requested: 0 }, true);
        }
    }

    /// Removes every entry of segment `seg`; returns its blocks in address order.
    pub(super) fn take(&mut self, seg: u32) -> Vec<Block> {
        let mut blocks = Vec::new();
        let mut i = self.list(seg).head;
        while i != NIL {
            let n = self.nodes[i as usize];
            self.at.remove(&n.block.addr);
            if n.free {
                self.runs.remove(&n.end());
                self.gone(n.block.addr);
            } else {
                blocks.push(n.block);
            }
            self.spare.push(i);
            i = n.next;
        }
        if let Some(l) = self.lists.get_mut(seg as usize) {
            *l = EMPTY;
        }
        self.settle();
        blocks
    }

    /// The entry starting exactly at `addr`: `Some(true)` a free run, `Some(false)` a block.
    pub(super) fn starts_at(&self, addr: u64) -> Option<(u32, bool)> {
        self.at.get(&addr).map(|&i| (i, self.nodes[i as usize].free))
    }

    /// The free run holding `addr`, O(log n).
    pub(super) fn run_at(&self, addr: u64) -> Spot {
        if let Some((i, free)) = self.starts_at(addr) {
            return if free { Spot::Run(i) } else { Spot::NotFree };
        }
        match self.runs.range((Excluded(addr), Unbounded)).next() {
            Some((_, &i)) if self.nodes[i as usize].block.addr <= addr => Spot::Run(i),
            _ => Spot::NotFree,
        }
    }

    /// The run of entry `i`: `(start, len, segment)`.
    pub(super) fn run(&self, i: u32) -> (u64, u64, u32) {
        let n = &self.nodes[i as usize];
        (n.block.addr, n.block.size, n.seg)
    }

    /// Places a block `[addr, addr + size)` inside the free run of entry `i` (the caller checked
    /// that it fits); the rest of the run on either side stays free.
    pub(super) fn place(&mut self, i: u32, addr: u64, size: u64, requested: u64) {
        let n = self.nodes[i as usize];
        let (rs, re, seg) = (n.block.addr, n.end(), n.seg);
        let after = addr + size;
        self.gone(rs);
        if addr == rs && after == re {
            // The whole run.
            self.runs.remove(&re);
            let n = &mut self.nodes[i as usize];
            n.free = false;
            n.block.requested = requested;
        } else if addr == rs {
            // At the run's start: the run keeps its end (and its by-end key), the block goes
            // before it.
            let b = self.new_node(Node { block: Block { addr, size, requested }, free: false, seg, prev: NIL, next: NIL });
            self.link(n.prev, b);
            self.nodes[i as usize].block = Block { addr: after, size: re - after, requested: 0 };
            if let Some(slot) = self.at.get_mut(&addr) {
                *slot = b;
            }
            self.at.insert(after, i);
            self.push_len(re - after, after);
        } else {
            // Inside the run: the run keeps `[rs, addr)`, a new run takes what follows the block.
            self.runs.remove(&re);
            self.nodes[i as usize].block.size = addr - rs;
            self.runs.insert(addr, i);
            self.push_len(addr - rs, rs);
            let b = self.new_node(Node { block: Block { addr, size, requested }, free: false, seg, prev: NIL, next: NIL });
            self.link(i, b);
            self.at.insert(addr, b);
            if after < re {
                let r = self.new_node(Node {
                    block: Block { addr: after, size: re - after, requested: 0 },
                    free: true,
                    seg,
                    prev: NIL,
                    next: NIL,
                });
                self.link(b, r);
                self.at.insert(after, r);
                self.runs.insert(re, r);
                self.push_len(re - after, after);
            }
        }
        self.settle();
    }

    /// Frees the block starting at `addr`, merging it with free neighbours in its segment.
    /// Returns the block and its segment, or `None` when no block starts there.
    pub(super) fn free(&mut self, addr: u64) -> Option<(Block, u32)> {
        let HashEntry::Occupied(entry) = self.at.entry(addr) else { return None };
        let i = *entry.get();
        let n = self.nodes[i as usize];
        if n.free {
            return None;
        }
        let free_at = |j: u32| j != NIL && self.nodes[j as usize].free;
        let (left, right) = (free_at(n.prev), free_at(n.next));
        let after = n.end();
        match (left, right) {
            (true, true) => {
                // The right run takes in the left run and the block; the left run goes.
                entry.remove();
                let (p, x) = (n.prev, n.next);
                let (ps, ne) = (self.nodes[p as usize].block.addr, self.nodes[x as usize].end());
                self.gone(ps);
                self.gone(after);
                self.runs.remove(&addr);
                self.nodes[x as usize].block = Block { addr: ps, size: ne - ps, requested: 0 };
                if let Some(slot) = self.at.get_mut(&ps) {
                    *slot = x;
                }
                self.at.remove(&after);
                self.unlink(p);
                self.unlink(i);
                self.push_len(ne - ps, ps);
            }
            (false, true) => {
                // The right run grows down over the block (its end, the by-end key, stays).
                let x = n.next;
                *entry.into_mut() = x;
                self.gone(after);
                let ne = self.nodes[x as usize].end();
                self.nodes[x as usize].block = Block { addr, size: ne - addr, requested: 0 };
                self.at.remove(&after);
                self.unlink(i);
                self.push_len(ne - addr, addr);
            }
            (true, false) => {
                // The left run grows up over the block: its end moves.
                entry.remove();
                let p = n.prev;
                let ps = self.nodes[p as usize].block.addr;
                self.gone(ps);
                self.runs.remove(&addr);
                self.nodes[p as usize].block.size = after - ps;
                self.runs.insert(after, p);
                self.unlink(i);
                self.push_len(after - ps, ps);
            }
            (false, false) => {
                let m = &mut self.nodes[i as usize];
                m.free = true;
                m.block.requested = 0;
                self.runs.insert(after, i);
                self.push_len(n.block.size, addr);
            }
        }
        self.settle();
        Some((n.block, n.seg))
    }

    /// Joins segment `r`'s list onto the end of segment `l`'s (their segments touch); the free
    /// runs meeting at the seam merge. The entries of the shorter list are relabelled into the
    /// other's slot, O(min(len l, len r)); returns the slot that now holds both.
    pub(super) fn concat(&mut self, l: u32, r: u32) -> u32 {
        let (ll, rl) = (self.list(l), self.list(r));
        let (keep, moved) = if ll.len >= rl.len { (l, rl) } else { (r, ll) };
        let mut i = moved.head;
        while i != NIL {
            self.nodes[i as usize].seg = keep;
            i = self.nodes[i as usize].next;
        }
        let joined = match (ll.tail, rl.head) {
            (NIL, _) => rl,
            (_, NIL) => ll,
            (t, h) => {
                self.nodes[t as usize].next = h;
                self.nodes[h as usize].prev = t;
                List { head: ll.head, tail: rl.tail, len: ll.len + rl.len }
            }
        };
        *self.list_mut(l) = EMPTY;
        *self.list_mut(r) = EMPTY;
        *self.list_mut(keep) = joined;
        let (t, h) = (ll.tail, rl.head);
        if t != NIL && h != NIL && self.nodes[t as usize].free && self.nodes[h as usize].free {
            // The right run takes in the left one.
            let (ts, seam, he) = (self.nodes[t as usize].block.addr, self.nodes[h as usize].block.addr, self.nodes[h as usize].end());
            self.gone(ts);
            self.gone(seam);
            self.runs.remove(&seam);
            self.nodes[h as usize].block = Block { addr: ts, size: he - ts, requested: 0 };
            if let Some(slot) = self.at.get_mut(&ts) {
                *slot = h;
            }
            self.at.remove(&seam);
            self.unlink(t);
            self.push_len(he - ts, ts);
        }
        self.settle();
        keep
    }

    /// Cuts `[lo, hi)` out of segment `seg` when one free run holds all of it (an unmap of free
    /// pages, what PyTorch's expandable segments do): the entries left of the cut stay in one
    /// list, those right of it form another, and what the run had outside the cut stays free on
    /// its side. The side with fewer entries is relabelled into slot `new`, the other keeps `seg`.
    /// Both sides are walked in step until the shorter one ends, so the cost is
    /// O(min(left, right)) plus O(log n) index updates: over any sequence of cuts and joins
    /// ([`Tiling::concat`] relabels the shorter list too) an entry is relabelled O(log n) times,
    /// the small-to-large argument. `None`, with nothing changed, when no single free run of
    /// `seg` holds the cut (a live block lies in it).
    pub(super) fn split(&mut self, seg: u32, lo: u64, hi: u64, new: u32) -> Option<Split> {
        let Spot::Run(i) = self.run_at(lo) else { return None };
        let run = self.nodes[i as usize];
        if run.seg != seg || run.end() < hi || lo >= hi {
            return None;
        }
        let list = self.list(seg);
        let (before, after) = (run.prev, run.next);
        // In step from the run outwards: the first side to end is the shorter.
        let (mut a, mut b, mut n) = (before, after, 0u32);
        while a != NIL && b != NIL {
            a = self.nodes[a as usize].prev;
            b = self.nodes[b as usize].next;
            n += 1;
        }
        let moved_left = a == NIL;
        let (left_len, right_len) = if moved_left { (n, list.len - 1 - n) } else { (list.len - 1 - n, n) };
        // Take the run out and part the list at its place.
        self.at.remove(&run.block.addr);
        self.runs.remove(&run.end());
        self.gone(run.block.addr);
        self.spare.push(i);
        if before != NIL {
            self.nodes[before as usize].next = NIL;
        }
        if after != NIL {
            self.nodes[after as usize].prev = NIL;
        }
        let left = if before == NIL { EMPTY } else { List { head: list.head, tail: before, len: left_len } };
        let right = if after == NIL { EMPTY } else { List { head: after, tail: list.tail, len: right_len } };
        let (left_slot, right_slot) = if moved_left { (new, seg) } else { (seg, new) };
        *self.list_mut(seg) = EMPTY;
        *self.list_mut(new) = EMPTY;
        *self.list_mut(left_slot) = left;
        *self.list_mut(right_slot) = right;
        // Relabel the shorter side and count its blocks.
        let mut moved = Split { moved_left, blocks: 0, bytes: 0 };
        let mut j = if moved_left { left.head } else { right.head };
        while j != NIL {
            let node = &mut self.nodes[j as usize];
            node.seg = new;
            if !node.free {
                moved.blocks += 1;
                moved.bytes += node.block.size;
            }
            j = node.next;
        }
        // What the run had outside the cut stays free, at the end of the left side and the start
        // of the right one.
        let add_run = |t: &mut Tiling, slot: u32, after: u32, start: u64, end: u64| {
            let k = t.new_node(Node {
                block: Block { addr: start, size: end - start, requested: 0 },
                free: true,
                seg: slot,
                prev: NIL,
                next: NIL,
            });
            t.link(after, k);
            t.at.insert(start, k);
            t.runs.insert(end, k);
            t.push_len(end - start, start);
        };
        if run.block.addr < lo {
            add_run(self, left_slot, left.tail, run.block.addr, lo);
        }
        if hi < run.end() {
            add_run(self, right_slot, NIL, hi, run.end());
        }
        self.settle();
        Some(moved)
    }

    /// Checks the list of segment `seg` tiles `[start, end)`: it ends within as many steps as there
    /// are entries, links both ways, entries touch, two free runs never touch, every entry is
    /// found by its start and every run by its end. Returns its live blocks and their bytes.
    pub(super) fn check(&self, seg: u32, start: u64, end: u64) -> Result<(u64, u64), String> {
        let list = self.list(seg);
        let (mut i, mut prev, mut at, mut steps) = (list.head, NIL, start, 0usize);
        let (mut blocks, mut bytes, mut prev_free) = (0u64, 0u64, false);
        while i != NIL {
            steps += 1;
            if steps > self.nodes.len() {
                return Err(format!("segment slot {seg}: its list does not end"));
            }
            let n = &self.nodes[i as usize];
            if n.seg != seg || n.prev != prev || n.block.addr != at || n.block.size == 0 {
                return Err(format!(
                    "segment slot {seg}: entry {i} {:?} (seg {}, prev {}) breaks the tiling at {at:#x}",
                    n.block, n.seg, n.prev
                ));
            }
            if self.at.get(&n.block.addr) != Some(&i) {
                return Err(format!("segment slot {seg}: entry at {:#x} not indexed by start", n.block.addr));
            }
            if n.free {
                if prev_free {
                    return Err(format!("segment slot {seg}: two free runs touch at {at:#x}"));
                }
                if self.runs.get(&n.end()) != Some(&i) {
                    return Err(format!("segment slot {seg}: free run at {:#x} not indexed by end", n.block.addr));
                }
            } else {
                blocks += 1;
                bytes += n.block.size;
            }
            prev_free = n.free;
            at = n.end();
            prev = i;
            i = n.next;
        }
        if at != end || list.tail != prev || steps != list.len as usize {
            return Err(format!("segment slot {seg}: list ends at {at:#x}, not {end:#x} (len {} of {steps})", list.len));
        }
        Ok((blocks, bytes))
    }

    /// Entries in all lists and free runs indexed: what [`Tiling::check`] over every segment
    /// must account for.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.at.len(), self.runs.len())
    }

    /// The live block starting at `addr`.
    pub(super) fn block_at(&self, addr: u64) -> Option<&Block> {
        let n = &self.nodes[*self.at.get(&addr)? as usize];
        (!n.free).then_some(&n.block)
    }

    /// The live blocks of segment `seg`, in address order.
    pub(super) fn blocks_of(&self, seg: u32) -> impl Iterator<Item = &Block> + '_ {
        let nodes = &self.nodes;
        std::iter::successors(Some(self.list(seg).head).filter(|&i| i != NIL), move |&i| Some(nodes[i as usize].next).filter(|&j| j != NIL))
            .map(move |i| &nodes[i as usize])
            .filter(|n| !n.free)
            .map(|n| &n.block)
    }

    /// Free runs `(start, len)` in address order.
    pub(super) fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.values().map(|&i| (self.nodes[i as usize].block.addr, self.nodes[i as usize].block.size))
    }

    /// Free runs `(start, len)` starting in `[lo, hi)`, O(log n + runs).
    pub(super) fn runs_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs
            .range((Excluded(lo), Unbounded))
            .map(|(_, &i)| (self.nodes[i as usize].block.addr, self.nodes[i as usize].block.size))
            .take_while(move |&(s, _)| s < hi)
            .filter(move |&(s, _)| s >= lo)
    }
}
