//! Non-framework memory by owner (issue 25, item 3): a process's live driver allocations on one
//! device, by the library that took them ([`Owner`]: cuBLAS, cuDNN, NCCL, the CUDA runtime, the
//! framework, other), as the consumer resolved each one's caller (`F_OWNER_KNOWN`).
//!
//! Plain state, fed the events the map accepted: a segment (`MemAlloc*`, by address) or a
//! physical handle (`PhysCreate`, by handle) is filed at its allocation and taken back at its
//! release. An allocation with no owner (a source that takes no caller: snapshots, a seed
//! rebuilt from the map) is counted apart, so the owners' sum plus it is the driver's total.
//! Memory: one entry per live allocation, as the address map itself holds.

use crate::event::{Event, EventKind};
use crate::owner::Owner;
use std::collections::HashMap;

/// A process's live driver bytes on one device, by owner.
#[derive(Clone, Debug, Default)]
pub struct OwnerBytes {
    segments: HashMap<u64, (Option<Owner>, u64)>,
    handles: HashMap<u64, (Option<Owner>, u64)>,
    /// Exact sums (a record's sizes are its own to claim: a hostile one's live allocations may
    /// sum past 2^64 − 1 bytes), each said as a `u64`, saturated, only when read.
    bytes: [u128; Owner::ALL.len()],
    unattributed: u128,
}

impl OwnerBytes {
    /// Notes an event the address map accepted.
    pub fn apply(&mut self, kind: EventKind, ev: &Event) {
        match kind {
            EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::MemAllocManaged => {
                let old = self.segments.insert(ev.addr, (ev.owner(), ev.size));
                self.take(old);
                self.add(ev.owner(), ev.size);
            }
            EventKind::PhysCreate => {
                let old = self.handles.insert(ev.handle, (ev.owner(), ev.size));
                self.take(old);
                self.add(ev.owner(), ev.size);
            }
            EventKind::MemFree => {
                let old = self.segments.remove(&ev.addr);
                self.take(old);
            }
            EventKind::PhysRelease => {
                let old = self.handles.remove(&ev.handle);
                self.take(old);
            }
            _ => {}
        }
    }

    fn add(&mut self, owner: Option<Owner>, size: u64) {
        *self.slot(owner) += u128::from(size);
    }

    fn take(&mut self, old: Option<(Option<Owner>, u64)>) {
        if let Some((owner, size)) = old {
            // Exact: every size taken was added when its allocation was filed.
            let slot = self.slot(owner);
            *slot = slot.saturating_sub(u128::from(size));
        }
    }

    fn slot(&mut self, owner: Option<Owner>) -> &mut u128 {
        match owner {
            Some(o) => &mut self.bytes[o as usize - 1],
            None => &mut self.unattributed,
        }
    }

    /// Live bytes of each owner that holds some, in wire order.
    pub fn by_owner(&self) -> Vec<(Owner, u64)> {
        Owner::ALL.iter().copied().zip(self.bytes).filter(|&(_, b)| b > 0).map(|(o, b)| (o, saturated(b))).collect()
    }

    /// Live driver bytes whose owner no source said.
    pub fn unattributed(&self) -> u64 {
        saturated(self.unattributed)
    }

    /// Whether any allocation had its owner said.
    pub fn any_known(&self) -> bool {
        self.bytes.iter().any(|&b| b > 0)
    }
}

/// A sum as a byte count: past 2^64 − 1, that.
fn saturated(b: u128) -> u64 {
    u64::try_from(b).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::F_OWNER_KNOWN;

    fn alloc(kind: EventKind, key: u64, size: u64, owner: Option<Owner>) -> Event {
        let mut e = Event { size, ..Event::new(kind, 1, 0) };
        if kind == EventKind::PhysCreate {
            e.handle = key;
        } else {
            e.addr = key;
        }
        if let Some(o) = owner {
            e.op = o as u16;
            e.flags |= F_OWNER_KNOWN;
        }
        e
    }

    #[test]
    fn allocations_are_filed_by_owner_and_taken_back_at_release() {
        let mut o = OwnerBytes::default();
        for e in [
            alloc(EventKind::MemAlloc, 0x1000, 100, Some(Owner::Cublas)),
            alloc(EventKind::MemAlloc, 0x2000, 30, Some(Owner::Nccl)),
            alloc(EventKind::MemAllocPitch, 0x3000, 7, None),
            alloc(EventKind::PhysCreate, 9, 50, Some(Owner::Nccl)),
        ] {
            o.apply(e.kind().unwrap_or(EventKind::MemAlloc), &e);
        }
        assert_eq!(o.by_owner(), vec![(Owner::Cublas, 100), (Owner::Nccl, 80)]);
        assert_eq!(o.unattributed(), 7);
        o.apply(EventKind::MemFree, &Event { addr: 0x2000, ..Event::new(EventKind::MemFree, 1, -1) });
        o.apply(EventKind::PhysRelease, &Event { handle: 9, ..Event::new(EventKind::PhysRelease, 1, -1) });
        o.apply(EventKind::MemFree, &Event { addr: 0x3000, ..Event::new(EventKind::MemFree, 1, -1) });
        assert_eq!(o.by_owner(), vec![(Owner::Cublas, 100)]);
        assert_eq!(o.unattributed(), 0);
    }

    /// Found by the record fuzz target (fuzz/regressions/record_owner_sizes_past_2_64.rec): live
    /// allocations summing past 2^64 overflowed the owner's sum (a panic with overflow checks, a
    /// wrapped small figure without). The sum stays exact and is said saturated.
    #[test]
    fn sizes_summing_past_2_64_stay_exact_and_read_saturated() {
        let big = (1u64 << 63) + 1;
        let mut o = OwnerBytes::default();
        for (addr, owner) in [(0x1000, Some(Owner::Nccl)), (0x2000, Some(Owner::Nccl)), (0x3000, None), (0x4000, None)] {
            let e = alloc(EventKind::MemAlloc, addr, big, owner);
            o.apply(EventKind::MemAlloc, &e);
        }
        assert_eq!(o.by_owner(), vec![(Owner::Nccl, u64::MAX)], "2 × (2^63 + 1) read saturated, not wrapped to 2");
        assert_eq!(o.unattributed(), u64::MAX);
        o.apply(EventKind::MemFree, &Event { addr: 0x1000, ..Event::new(EventKind::MemFree, 1, -1) });
        o.apply(EventKind::MemFree, &Event { addr: 0x3000, ..Event::new(EventKind::MemFree, 1, -1) });
        assert_eq!(o.by_owner(), vec![(Owner::Nccl, big)], "the one left, exactly");
        assert_eq!(o.unattributed(), big);
    }
}
