//! Occupancy of the driver's 2 MiB pages by sub-2 MiB driver allocations.
//!
//! Measured on the H200: allocations under 2 MiB share 2 MiB pages at 512-byte alignment, and a
//! half-used page is lost to every request of another size. This module keeps, per page, the bytes
//! live in it and maintains the page-stranded total (free bytes in pages that hold at least one
//! live small allocation) incrementally: O(1) hash updates per allocation.

use crate::alloc::pytorch::DRIVER_PAGE;
use std::collections::HashMap;

/// Live bytes per 2 MiB page, and the derived stranded total.
#[derive(Clone, Debug, Default)]
pub struct PageOccupancy {
    live: HashMap<u64, u64>,
    stranded: u64,
}

impl PageOccupancy {
    /// Free bytes inside pages that hold at least one live sub-2 MiB allocation.
    pub fn stranded(&self) -> u64 {
        self.stranded
    }

    /// Pages holding at least one live small allocation.
    pub fn pages_in_use(&self) -> u64 {
        self.live.len() as u64
    }

    /// Calls `f(page_index, start, len)` for each page piece of `[addr, addr + size)`.
    fn pieces(addr: u64, size: u64, mut f: impl FnMut(u64, u64)) {
        let mut at = addr;
        let end = addr.saturating_add(size);
        while at < end {
            let page = at / DRIVER_PAGE;
            let page_end = (page + 1).saturating_mul(DRIVER_PAGE);
            let piece = end.min(page_end) - at;
            f(page, piece);
            at += piece;
        }
    }

    /// A small allocation `[addr, addr + size)` became live.
    pub fn add(&mut self, addr: u64, size: u64) {
        Self::pieces(addr, size, |page, piece| {
            let live = self.live.entry(page).or_insert(0);
            let before = if *live > 0 { DRIVER_PAGE - *live } else { 0 };
            *live = (*live + piece).min(DRIVER_PAGE);
            let after = DRIVER_PAGE - *live;
            self.stranded = self.stranded - before + after;
        });
    }

    /// A small allocation `[addr, addr + size)` was freed.
    pub fn remove(&mut self, addr: u64, size: u64) {
        Self::pieces(addr, size, |page, piece| {
            if let Some(live) = self.live.get_mut(&page) {
                let before = DRIVER_PAGE - *live;
                *live = live.saturating_sub(piece);
                if *live == 0 {
                    self.live.remove(&page);
                    self.stranded -= before;
                } else {
                    self.stranded = self.stranded - before + (DRIVER_PAGE - *live);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_used_pages_strand_their_other_half() {
        let mut p = PageOccupancy::default();
        let mib = 1 << 20;
        let base = 0x7f00_0000_0000u64;
        for i in 0..8 {
            p.add(base + i * mib, mib);
        }
        assert_eq!(p.stranded(), 0);
        for i in (0..8).step_by(2) {
            p.remove(base + i * mib, mib);
        }
        assert_eq!(p.pages_in_use(), 4);
        assert_eq!(p.stranded(), 4 * mib);
        for i in (1..8).step_by(2) {
            p.remove(base + i * mib, mib);
        }
        assert_eq!(p.stranded(), 0);
        assert_eq!(p.pages_in_use(), 0);
    }

    #[test]
    fn an_allocation_straddling_two_pages_counts_in_both() {
        let mut p = PageOccupancy::default();
        p.add(DRIVER_PAGE - 512, 1024);
        assert_eq!(p.pages_in_use(), 2);
        assert_eq!(p.stranded(), 2 * DRIVER_PAGE - 1024);
        p.remove(DRIVER_PAGE - 512, 1024);
        assert_eq!(p.stranded(), 0);
    }
}
