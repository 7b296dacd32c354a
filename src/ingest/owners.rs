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
    bytes: [u64; Owner::ALL.len()],
    unattributed: u64,
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
        match owner {
            Some(o) => self.bytes[o as usize - 1] += size,
            None => self.unattributed += size,
        }
    }

    fn take(&mut self, old: Option<(Option<Owner>, u64)>) {
        if let Some((owner, size)) = old {
            let slot = match owner {
                Some(o) => &mut self.bytes[o as usize - 1],
                None => &mut self.unattributed,
            };
            *slot = slot.saturating_sub(size);
        }
    }

    /// Live bytes of each owner that holds some, in wire order.
    pub fn by_owner(&self) -> Vec<(Owner, u64)> {
        Owner::ALL.iter().copied().zip(self.bytes).filter(|&(_, b)| b > 0).collect()
    }

    /// Live driver bytes whose owner no source said.
    pub fn unattributed(&self) -> u64 {
        self.unattributed
    }

    /// Whether any allocation had its owner said.
    pub fn any_known(&self) -> bool {
        self.bytes.iter().any(|&b| b > 0)
    }
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
}
