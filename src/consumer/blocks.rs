//! Block-level figures without root: turning a PyTorch allocator snapshot, sent by the Python
//! start-up hook, into the events that bring a process's map to the same blocks.
//!
//! The shim sees segments; PyTorch's blocks live in unexported code. The hook sends
//! `torch.cuda.memory._snapshot()` periodically, on PyTorch's out-of-memory observer, and at exit.
//! [`sync_events`] compares each snapshot segment's blocks with the map and emits the difference:
//! `BlockFree` for blocks that are gone or changed, `Adopt` for segments the caching allocator owns,
//! `BlockAlloc` (with the exact extent, the requested size and the segment's stream) for new
//! blocks. The events go into the record like any other (`run --record`), so a replay
//! reproduces the live figures and the block events are there for a replay of the allocator's
//! decisions; between two snapshots they are the difference, not every allocation.

use crate::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_FRAMEWORK_OWNED, F_SRC_SNAPSHOT};
use crate::ingest::State;
use crate::snapshot::Snapshot;
use std::collections::BTreeMap;

/// The events that make `pid`'s maps hold exactly the snapshot's live blocks.
pub fn sync_events(state: &State, pid: u32, snap: &Snapshot, ts_ns: u64) -> Vec<Event> {
    let mut out = Vec::new();
    let mut devices: Vec<i16> = snap.segments.iter().map(|s| s.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for device in devices {
        let ev = |kind| Event { ts_ns, ..Event::new(kind, pid, device) };
        // Each live block's extent, requested size and its segment's stream.
        let mut want: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
        for seg in snap.segments.iter().filter(|s| s.device == device) {
            for b in seg.blocks.iter().filter(|b| b.state.is_active()) {
                want.insert(b.address, (b.size, b.requested_size, seg.stream));
            }
        }
        let space = state.spaces.get(&(pid, device));
        if let Some(space) = space {
            for b in space.map.blocks() {
                if want.get(&b.addr).is_none_or(|&(size, _, _)| size != b.size) {
                    out.push(Event { addr: b.addr, ..ev(EventKind::BlockFree) });
                }
            }
        }
        for seg in snap.segments.iter().filter(|s| s.device == device) {
            match space.and_then(|s| s.map.segment_at(seg.address)) {
                Some(known) if known.framework => {}
                Some(_) => out.push(Event { addr: seg.address, ..ev(EventKind::Adopt) }),
                None => {
                    // The driver event was never seen (traced late, or lost): take the
                    // snapshot's word for the segment.
                    let kind = if seg.is_expandable { EventKind::Map } else { EventKind::MemAlloc };
                    out.push(Event { addr: seg.address, size: seg.total_size, flags: F_FRAMEWORK_OWNED, ..ev(kind) });
                }
            }
        }
        for (&addr, &(size, requested, stream)) in &want {
            let same = space.and_then(|s| s.map.block_at(addr)).is_some_and(|b| b.size == size);
            if !same {
                out.push(Event { addr, size, requested, stream, flags: F_BLOCK_SIZE_KNOWN | F_SRC_SNAPSHOT, ..ev(EventKind::BlockAlloc) });
            }
        }
    }
    out
}
