//! Device virtual address space: one region per device (allocations, pool chunks, small-page
//! pages) and one for `cuMemAddressReserve` ranges, each handing out granularity-aligned ranges
//! best-fit (smallest free run that fits, lowest address among equals), coalescing on free.
//! O(log n) per operation except aligned-above-granularity requests, which scan by address.

use std::collections::{BTreeMap, BTreeSet};

use simcuda_core::GRANULARITY;

/// Free ranges of one address region.
#[derive(Debug)]
pub struct VaSpace {
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl VaSpace {
    /// A region `[base, base + len)`, all free.
    pub fn new(base: u64, len: u64) -> VaSpace {
        let mut va = VaSpace { by_addr: BTreeMap::new(), by_size: BTreeSet::new() };
        va.insert(base, len);
        va
    }

    fn insert(&mut self, start: u64, len: u64) {
        if len > 0 {
            self.by_addr.insert(start, len);
            self.by_size.insert((len, start));
        }
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_addr.remove(&start);
        self.by_size.remove(&(len, start));
    }

    /// A range of `size` bytes (a multiple of the granularity) aligned to `align` (a power of two,
    /// at least the granularity), or None when no free run fits.
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        debug_assert!(size > 0 && size.is_multiple_of(GRANULARITY));
        if align <= GRANULARITY {
            let &(len, start) = self.by_size.range((size, 0)..).next()?;
            self.remove(start, len);
            self.insert(start + size, len - size);
            return Some(start);
        }
        let (start, len, at) = self.by_addr.iter().find_map(|(&start, &len)| {
            let at = start.checked_next_multiple_of(align)?;
            (at.checked_add(size)? <= start + len).then_some((start, len, at))
        })?;
        self.carve(start, len, at, size);
        Some(at)
    }

    /// Takes exactly `[at, at + size)` if it is free.
    pub fn alloc_at(&mut self, at: u64, size: u64) -> bool {
        let Some((&start, &len)) = self.by_addr.range(..=at).next_back() else {
            return false;
        };
        if at.checked_add(size).is_none_or(|end| end > start + len) {
            return false;
        }
        self.carve(start, len, at, size);
        true
    }

    fn carve(&mut self, start: u64, len: u64, at: u64, size: u64) {
        self.remove(start, len);
        self.insert(start, at - start);
        self.insert(at + size, start + len - (at + size));
    }

    /// Returns `[start, start + size)` to the free runs, merging with its neighbours.
    pub fn free(&mut self, mut start: u64, mut size: u64) {
        if let Some((&p, &plen)) = self.by_addr.range(..start).next_back() {
            if p + plen == start {
                self.remove(p, plen);
                start = p;
                size += plen;
            }
        }
        if let Some(&nlen) = self.by_addr.get(&(start + size)) {
            self.remove(start + size, nlen);
            size += nlen;
        }
        self.insert(start, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = GRANULARITY;

    #[test]
    fn best_fit_reuse_and_coalescing() {
        let mut va = VaSpace::new(0x1000_0000, 100 * G);
        let a = va.alloc(2 * G, G).expect("a");
        let b = va.alloc(3 * G, G).expect("b");
        let c = va.alloc(G, G).expect("c");
        assert_eq!((a, b, c), (0x1000_0000, 0x1000_0000 + 2 * G, 0x1000_0000 + 5 * G));
        va.free(b, 3 * G);
        // A 2-page request takes the 3-page hole (smallest fit), not the big tail.
        assert_eq!(va.alloc(2 * G, G), Some(b));
        va.free(b, 2 * G);
        va.free(a, 2 * G);
        va.free(c, G);
        assert_eq!(va.by_addr.len(), 1, "all merged back: {:?}", va.by_addr);
    }

    #[test]
    fn aligned_and_fixed_allocations() {
        let mut va = VaSpace::new(G, 64 * G);
        let x = va.alloc(G, 16 * G).expect("aligned");
        assert_eq!(x % (16 * G), 0);
        assert!(va.alloc_at(G, G));
        assert!(!va.alloc_at(G, G), "taken");
        assert!(!va.alloc_at(x, G), "taken");
        assert!(!va.alloc_at(64 * G, 2 * G), "runs past the end");
    }
}
