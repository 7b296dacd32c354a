//! Sub-2 MiB allocations packed into shared 2 MiB pages at 512-byte alignment, as the H200's
//! driver does: a request goes to the page whose largest free run fits it most tightly (lowest
//! address among equals), first fit inside that page; a page is returned when its last
//! allocation is freed. A half-used page is lost to every request that does not fit its holes,
//! which is how N × 1 MiB with every other one freed leaves no room for 2 MiB.

use std::collections::{BTreeMap, BTreeSet};

use simcuda_core::GRANULARITY;

/// Allocation unit and alignment inside a shared page.
pub const UNIT: u64 = 512;
const UNITS_PER_PAGE: u32 = (GRANULARITY / UNIT) as u32;

#[derive(Debug)]
struct Page {
    /// Free runs (start unit, length in units), sorted by start.
    free: Vec<(u32, u32)>,
}

impl Page {
    fn max_run(&self) -> u32 {
        self.free.iter().map(|&(_, len)| len).max().unwrap_or(0)
    }
}

/// The shared pages of one device.
#[derive(Debug, Default)]
pub struct SmallPages {
    pages: BTreeMap<u64, Page>,
    by_room: BTreeSet<(u32, u64)>,
}

/// Units (512-byte) a request of `size` bytes occupies.
pub fn units_for(size: u64) -> u32 {
    size.div_ceil(UNIT) as u32
}

impl SmallPages {
    /// Places `units` in an existing page; None when no page has a large enough hole.
    pub fn alloc(&mut self, units: u32) -> Option<u64> {
        let &(room, va) = self.by_room.range((units, 0)..).next()?;
        let page = self.pages.get_mut(&va)?;
        let i = page.free.iter().position(|&(_, len)| len >= units)?;
        let (start, len) = page.free[i];
        if len == units {
            page.free.remove(i);
        } else {
            page.free[i] = (start + units, len - units);
        }
        self.by_room.remove(&(room, va));
        self.by_room.insert((page.max_run(), va));
        Some(va + u64::from(start) * UNIT)
    }

    /// Adds an empty page at `va` (a fresh 2 MiB range backed by a fresh physical page).
    pub fn add_page(&mut self, va: u64) {
        self.pages.insert(va, Page { free: vec![(0, UNITS_PER_PAGE)] });
        self.by_room.insert((UNITS_PER_PAGE, va));
    }

    /// Frees `units` at `addr`; returns the page's address when the page became empty (and was
    /// removed: the caller returns its range and its physical page).
    pub fn free(&mut self, addr: u64, units: u32) -> Option<u64> {
        let va = addr - addr % GRANULARITY;
        let page = self.pages.get_mut(&va)?;
        let room = page.max_run();
        let start = ((addr - va) / UNIT) as u32;
        let i = page.free.partition_point(|&(s, _)| s < start);
        page.free.insert(i, (start, units));
        if i + 1 < page.free.len() && start + units == page.free[i + 1].0 {
            page.free[i].1 += page.free[i + 1].1;
            page.free.remove(i + 1);
        }
        if i > 0 && page.free[i - 1].0 + page.free[i - 1].1 == start {
            page.free[i - 1].1 += page.free[i].1;
            page.free.remove(i);
        }
        self.by_room.remove(&(room, va));
        if page.free == [(0, UNITS_PER_PAGE)] {
            self.pages.remove(&va);
            return Some(va);
        }
        self.by_room.insert((page.max_run(), va));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mib_pages_hold_two_one_mib_allocations() {
        let mut sp = SmallPages::default();
        let mib = units_for(1 << 20);
        assert_eq!(sp.alloc(mib), None);
        sp.add_page(0x100_0000_0000);
        let a = sp.alloc(mib).expect("a");
        let b = sp.alloc(mib).expect("b");
        assert_eq!(b - a, 1 << 20);
        assert_eq!(sp.alloc(1), None, "page full");
        assert_eq!(sp.free(a, mib), None, "b still lives");
        assert_eq!(sp.alloc(units_for(2 << 20)), None, "half a page is not 2 MiB");
        assert_eq!(sp.alloc(units_for(700)), Some(a), "512-byte aligned, first fit");
        assert_eq!(sp.free(a, units_for(700)), None);
        assert_eq!(sp.free(b, mib), Some(0x100_0000_0000), "page empty");
        assert!(sp.pages.is_empty() && sp.by_room.is_empty());
    }
}
