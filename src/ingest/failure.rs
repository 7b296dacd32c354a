//! A failed allocation (`AllocFailed`) applied to the state: a failed call that was no OOM is
//! counted (the first few kept); an OOM becomes an [`OomRecord`] holding the figures of its
//! (process, device) at the failure, the device free it is judged against (its own event's, else
//! the process's recent reading, else one that arrives later: [`DeviceFreeSource`]), the bytes the
//! allocator was allowed, and the driver failures that came before it.

use super::{
    holders, DeviceFreeSource, FailedCall, OomOutcome, OomRecord, State, AMEND_WINDOW_NS, KEPT_ANOMALIES, MAX_SPACES, RC_OUT_OF_MEMORY,
};
use crate::alloc::Framework;
use crate::event::{Event, EventKind, F_ALLOCATOR_OOM, F_ALLOWED_KNOWN};
use crate::map::Figures;

impl State {
    /// Applies one `AllocFailed` event (not an amendment of an earlier OOM's allowed bytes).
    pub(super) fn apply_failure(&mut self, ev: &Event, pid: u32, device: i16) {
        if let Some(free) = ev.device_free() {
            self.devices.entry(device).or_default().free = Some(free);
        }
        if ev.rc != RC_OUT_OF_MEMORY {
            self.failed_call_count += 1;
            if self.failed_calls.len() < KEPT_ANOMALIES {
                let (ts_ns, requested, rc, op) = (ev.ts_ns, ev.requested, ev.rc, ev.failed_op());
                self.failed_calls.push(FailedCall { ts_ns, pid, device, requested, rc, op });
            }
            return;
        }
        self.record_oom(ev, pid, device);
    }

    /// The OOM record of an out-of-memory failure, pushed, and handed to the OOM rule.
    fn record_oom(&mut self, ev: &Event, pid: u32, device: i16) {
        let figures = match self.spaces.get(&(pid, device)) {
            Some(s) => s.map.figures(),
            None if self.spaces.len() >= MAX_SPACES => Figures::default(),
            None => self.space(pid, device).map.figures(),
        };
        let space_framework = self.spaces.get(&(pid, device)).and_then(|s| s.framework);
        let block = ev.failed_op() == Some(EventKind::BlockAlloc);
        let framework = if block { Some(Framework::from_flags(ev.flags)) } else { space_framework };
        let traced = figures.reserved + figures.unmapped_physical;
        let (device_free, device_free_source, device_free_age_ns) = self.free_at_failure(ev, pid, device, traced);
        let driver_failures_before = if block {
            self.driver_failures.remove(&(pid, device)).unwrap_or(0)
        } else {
            *self.driver_failures.entry((pid, device)).or_default() += 1;
            0
        };
        let allocator_oom = ev.flags & F_ALLOCATOR_OOM != 0;
        let allowed = self.allowed_at_failure(ev, pid, device, block);
        self.ooms.push(OomRecord {
            allowed,
            allocator_oom,
            allocator_reserved: (allocator_oom && ev.handle != 0).then_some(ev.handle),
            driver_failures_before,
            device_total: self.devices.get(&device).and_then(|d| d.total),
            framework,
            ts_ns: ev.ts_ns,
            pid,
            device,
            requested: ev.requested,
            rc: ev.rc,
            op: ev.failed_op(),
            device_free,
            device_free_source,
            device_free_age_ns,
            device_free_after_ns: None,
            figures,
            shared: holders::Shared { holders: holders::Holders::traced(self, pid, device), limit: None },
            outcome: OomOutcome::Pending,
            tid: ev.tid,
            partial: self.partial.get(&pid).copied(),
            event: self.events - 1,
        });
        self.on_failure(self.ooms.len() - 1, ev);
    }

    /// The device free an OOM is judged against, where it came from and how old it was: the
    /// failure event's own, else the process's recent reading. Without either the OOM (the next
    /// to be pushed) awaits a reading that arrives after it.
    fn free_at_failure(&mut self, ev: &Event, pid: u32, device: i16, traced: u64) -> (Option<u64>, DeviceFreeSource, Option<i64>) {
        let found = match ev.device_free() {
            Some(free) => (Some(free), DeviceFreeSource::FailureEvent, Some(0)),
            None => match self.reading_before(pid, device, ev.ts_ns, traced) {
                Some((free, age)) => (Some(free), DeviceFreeSource::ProcessReading, Some(age)),
                None => (None, DeviceFreeSource::NotMeasured, None),
            },
        };
        if found.1 != DeviceFreeSource::FailureEvent {
            if self.awaiting.back().is_some_and(|&b| self.ooms[b].ts_ns > ev.ts_ns) {
                self.awaiting_unordered = true;
            }
            self.awaiting.push_back(self.ooms.len());
        }
        found
    }

    /// The bytes the allocator was allowed at an OOM: the event's own, else (a block allocation's)
    /// an amendment that came just before it, else what the process's limits say.
    fn allowed_at_failure(&mut self, ev: &Event, pid: u32, device: i16, block: bool) -> Option<u64> {
        let pending = if block {
            self.pending_allowed.remove(&(pid, device)).filter(|&(t, _)| t.abs_diff(ev.ts_ns) <= AMEND_WINDOW_NS).map(|(_, a)| a)
        } else {
            None
        };
        (ev.flags & F_ALLOWED_KNOWN != 0).then_some(ev.size).or(pending).or_else(|| if block { self.allowed_of(pid, device) } else { None })
    }
}
