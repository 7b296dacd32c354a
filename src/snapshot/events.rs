//! A snapshot as wire [`Event`]s, the only input the core ingests: the trace forward
//! ([`Snapshot::events`]), backward ([`Snapshot::reverse_events`]), and the final state as a seed
//! ([`Snapshot::seed_events`]).
//!
//! Every event has `F_SRC_SNAPSHOT`, pid 0, the trace's device and `ts_ns = time_us × 1000`.
//! Block events carry the requested size and leave `size` 0: the block's real extent follows the
//! caching allocator's rounding and split rules, which the map applies. Only seed events, which
//! come from the snapshot's final block list, know the extent (`F_BLOCK_SIZE_KNOWN`).
//!
//! Segment events (`MemAlloc`, `Map`, and the inverses that recreate them) carry
//! `F_FRAMEWORK_OWNED`: every segment a PyTorch snapshot lists, and every `segment_*` entry of
//! its trace, is the caching allocator's, whether or not a block was ever seen in it (a snapshot
//! taken without history recording has no trace at all, and the segments `empty_cache()` would
//! return hold no block). Only what gpufrag's own export marks `driver_only` is plain driver
//! memory.

use crate::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_DEVICE_FREE_KNOWN, F_FAILED, F_FRAMEWORK_OWNED, F_SRC_SNAPSHOT};

use super::model::{Action, Snapshot, TraceEntry};

/// `F_FRAMEWORK_OWNED` unless the entry or segment is driver memory.
fn owner_flags(driver_only: bool) -> u32 {
    if driver_only {
        0
    } else {
        F_FRAMEWORK_OWNED
    }
}

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;

fn base(kind: EventKind, device: i16, time_us: u64, stream: u64) -> Event {
    let mut e = Event::new(kind, 0, device);
    e.ts_ns = time_us.saturating_mul(1000);
    e.stream = stream;
    e.flags = F_SRC_SNAPSHOT;
    e
}

impl TraceEntry {
    /// The event this entry means on `device`, `None` for entries that change no memory state
    /// (`free_requested`, `snapshot`, `user_defined`, unknown actions).
    ///
    /// `free_requested` produces nothing because the block stays live until `free_completed`:
    /// PyTorch reuses it only then (the two differ when a block was used on another stream).
    pub fn to_event(&self, device: i16) -> Option<Event> {
        let (kind, addr, size, requested) = match self.action {
            Action::Alloc => (EventKind::BlockAlloc, self.addr, 0, self.size),
            Action::FreeCompleted => (EventKind::BlockFree, self.addr, 0, self.size),
            Action::SegmentAlloc => (EventKind::MemAlloc, self.addr, self.size, 0),
            Action::SegmentFree => (EventKind::MemFree, self.addr, self.size, 0),
            Action::SegmentMap => (EventKind::Map, self.addr, self.size, 0),
            Action::SegmentUnmap => (EventKind::Unmap, self.addr, self.size, 0),
            Action::Oom => {
                let mut e = base(EventKind::AllocFailed, device, self.time_us, self.stream);
                e.requested = self.size;
                e.rc = CUDA_ERROR_OUT_OF_MEMORY;
                e.op = EventKind::BlockAlloc as u16;
                e.flags |= F_FAILED;
                if let Some(free) = self.device_free {
                    e.device_free = free;
                    e.flags |= F_DEVICE_FREE_KNOWN;
                }
                return Some(e);
            }
            Action::FreeRequested | Action::Snapshot | Action::UserDefined | Action::Unknown => return None,
        };
        let mut e = base(kind, device, self.time_us, self.stream);
        e.addr = addr;
        e.size = size;
        e.requested = requested;
        if matches!(kind, EventKind::MemAlloc | EventKind::Map) {
            e.flags |= owner_flags(self.driver_only);
        }
        Some(e)
    }

    /// The event that undoes this entry on `device`, for replaying a trace backwards from the
    /// final state: `alloc` ↔ `free_completed`, `segment_alloc` ↔ `segment_free`, `segment_map`
    /// ↔ `segment_unmap`; `None` for the rest (an `oom` changed nothing).
    ///
    /// The inverse of `free_completed` is a `BlockAlloc` of the requested size with `size` 0: the
    /// extent the block had is not in the trace, only the rules that made it.
    pub fn reverse_event(&self, device: i16) -> Option<Event> {
        let (kind, size, requested) = match self.action {
            Action::Alloc => (EventKind::BlockFree, 0, self.size),
            Action::FreeCompleted => (EventKind::BlockAlloc, 0, self.size),
            Action::SegmentAlloc => (EventKind::MemFree, self.size, 0),
            Action::SegmentFree => (EventKind::MemAlloc, self.size, 0),
            Action::SegmentMap => (EventKind::Unmap, self.size, 0),
            Action::SegmentUnmap => (EventKind::Map, self.size, 0),
            Action::FreeRequested | Action::Snapshot | Action::UserDefined | Action::Oom | Action::Unknown => return None,
        };
        let mut e = base(kind, device, self.time_us, self.stream);
        e.addr = self.addr;
        e.size = size;
        e.requested = requested;
        if matches!(kind, EventKind::MemAlloc | EventKind::Map) {
            e.flags |= owner_flags(self.driver_only);
        }
        Some(e)
    }
}

impl Snapshot {
    /// Every trace entry that changes memory state, as events: device by device in index order,
    /// each device's entries in trace order.
    pub fn events(&self) -> Vec<Event> {
        let mut out = Vec::with_capacity(self.entry_count());
        for t in &self.traces {
            out.extend(t.entries.iter().filter_map(|e| e.to_event(t.device)));
        }
        out
    }

    /// One device's trace as events, in trace order; empty for a device with no trace.
    pub fn device_events(&self, device: i16) -> Vec<Event> {
        self.trace(device).map(|t| t.entries.iter().filter_map(|e| e.to_event(device)).collect()).unwrap_or_default()
    }

    /// One device's trace undone: the inverse of each entry's event, newest first. Applied to the
    /// final state ([`Snapshot::seed_events`]) it rebuilds the state at the start of the trace
    /// ring, which is what a truncated ring (history recording started late, or the ring wrapped)
    /// needs before it can be replayed forward.
    pub fn reverse_events(&self, device: i16) -> Vec<Event> {
        self.trace(device).map(|t| t.entries.iter().rev().filter_map(|e| e.reverse_event(device)).collect()).unwrap_or_default()
    }

    /// The final state described by `segments`, as events: first one per segment (a `MemAlloc` of
    /// `total_size` for an ordinary segment, a `Map` for each mapped range of an expandable one;
    /// the caching allocator's, see the module notes), then a `BlockAlloc` with its real extent
    /// (`F_BLOCK_SIZE_KNOWN`) for each active block (allocated or pending free) of the caching
    /// allocator's segments (a `driver_only` segment's one block only says it is in use). Time
    /// stamps are the last trace entry's time on that device (the snapshot itself is later), 0
    /// when the device has no trace.
    pub fn seed_events(&self) -> Vec<Event> {
        let ts = |device: i16| self.trace(device).and_then(|t| t.entries.last()).map_or(0, |e| e.time_us);
        let mut out = Vec::with_capacity(self.segments.len());
        for s in &self.segments {
            let kind = if s.is_expandable { EventKind::Map } else { EventKind::MemAlloc };
            let mut e = base(kind, s.device, ts(s.device), s.stream);
            e.addr = s.address;
            e.size = s.total_size;
            e.flags |= owner_flags(s.driver_only);
            out.push(e);
        }
        for s in self.segments.iter().filter(|s| !s.driver_only) {
            for b in s.blocks.iter().filter(|b| b.state.is_active()) {
                let mut e = base(EventKind::BlockAlloc, s.device, ts(s.device), s.stream);
                e.addr = b.address;
                e.size = b.size;
                e.requested = b.requested_size;
                e.flags |= F_BLOCK_SIZE_KNOWN;
                out.push(e);
            }
        }
        out
    }
}
