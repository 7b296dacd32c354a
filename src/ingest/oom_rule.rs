//! The one rule for what an OOM is. Every output (the live line, the summary, the report, `top`,
//! OTLP, Prometheus) reads [`OomRecord::outcome`] and nothing else.
//!
//! - A framework's own OOM report (PyTorch's observer or its trace's OOM entry, XLA's
//!   `RESOURCE_EXHAUSTED`, CuPy's `OutOfMemoryError`, the annotation API: a failed `BlockAlloc`)
//!   decides: it is an [`OomOutcome::Oom`], and the failed driver calls of its process and device
//!   still undecided are its tries ([`OomOutcome::Folded`] into it), as are those that reach the
//!   state after it but happened up to [`OOM_HOLD_NS`] before it (the Python hook's socket can
//!   overtake the shim's ring: CuPy's pool fails its cudaMalloc, frees, fails again, raises).
//! - A failed driver allocation is undecided ([`OomOutcome::Pending`]) until the same thread's
//!   next driver allocation: one of the same size that succeeds after memory was released on the
//!   device (PyTorch's, CuPy's and XLA's release-and-retry) makes it a [`OomOutcome::Retry`],
//!   counted per process and never an OOM; another failure of the same size folds the earlier
//!   one into it (or of a smaller size, for an allocator that retries smaller:
//!   `AllocatorModel::retries_smaller`, RMM's pool); anything else (another size, the process's exit, [`OOM_HOLD_NS`] of events
//!   without a decision, the end of the trace) makes it an OOM.
//!
//! The rule reads only events, so a replay of a record decides as the live run did. The live
//! front end also settles by the wall clock ([`State::settle`]) so that a process that hangs
//! after its failure still gets its verdict on screen; a retry that succeeded later than
//! [`OOM_HOLD_NS`] after its failure is then an OOM in both.

use super::{OomRecord, State};
use crate::event::{Event, EventKind};

/// How long a failed driver allocation waits for its retry or its framework's report, in event
/// time: PyTorch's release-and-retry takes microseconds to milliseconds.
pub const OOM_HOLD_NS: u64 = 500_000_000;

/// What a failed allocation turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomOutcome {
    /// A failed driver allocation whose retry or report has not come yet (the summary of a trace
    /// that ends here counts it as an OOM: nothing recovered it).
    Pending,
    /// An out-of-memory error: counted and given a verdict everywhere.
    Oom,
    /// Recovered: the same thread's next allocation of that size succeeded after memory was
    /// released.
    Retry,
    /// One of the tries of a later OOM (the framework's report, or the same request's next
    /// failure), counted in its `driver_failures_before`.
    Folded,
}

impl OomOutcome {
    /// The name outputs use.
    pub fn name(self) -> &'static str {
        match self {
            OomOutcome::Pending => "pending",
            OomOutcome::Oom => "oom",
            OomOutcome::Retry => "retry",
            OomOutcome::Folded => "folded",
        }
    }
}

/// A failed driver allocation not yet decided.
#[derive(Clone, Copy, Debug)]
pub(super) struct Undecided {
    /// Index in `State::ooms`.
    pub index: usize,
    /// The failing thread.
    pub tid: u32,
    /// `State::releases` when it failed.
    pub releases: u64,
}

impl OomRecord {
    /// Whether every output counts this failure as an OOM now: decided so, or undecided at the
    /// end of what was seen (nothing recovered it).
    pub fn counts_as_oom(&self) -> bool {
        matches!(self.outcome, OomOutcome::Oom | OomOutcome::Pending)
    }
}

/// Whether a successful event is a driver allocation (what a retry of a failed one is).
pub(super) fn is_driver_alloc(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::MemAllocManaged | EventKind::PoolAlloc | EventKind::PhysCreate
    )
}

/// Whether a successful event gives device memory back (what a retry waits for).
pub(super) fn is_release(kind: EventKind) -> bool {
    matches!(kind, EventKind::MemFree | EventKind::PoolFree | EventKind::PhysRelease | EventKind::PoolTrim | EventKind::Unmap)
}

/// How many of the latest OOM records a driver failure that arrives after a framework's report
/// looks back through for that report (a report overtakes its failures by a few events, never by
/// this many OOMs).
const REPORT_LOOKBACK: usize = 64;

impl State {
    /// Decides record `index` (once: a decided record keeps its outcome) and logs an OOM.
    pub(super) fn decide(&mut self, index: usize, outcome: OomOutcome) {
        let o = &mut self.ooms[index];
        if o.outcome != OomOutcome::Pending {
            return;
        }
        o.outcome = outcome;
        match outcome {
            OomOutcome::Oom => self.oom_log.push(index),
            OomOutcome::Retry => *self.retries.entry((o.pid, o.device)).or_default() += 1,
            _ => {}
        }
        self.undecided.retain(|u| u.index != index);
    }

    /// Before an event is applied: failures older than [`OOM_HOLD_NS`] in event time are OOMs.
    pub(super) fn settle_by_event(&mut self, ts_ns: u64) {
        self.settle(ts_ns);
    }

    /// Decides as OOMs the undecided failures more than [`OOM_HOLD_NS`] before `now_ns` (the live
    /// front end calls this with the clock of the events, `CLOCK_MONOTONIC`).
    pub fn settle(&mut self, now_ns: u64) {
        let due: Vec<usize> =
            self.undecided.iter().filter(|u| now_ns > self.ooms[u.index].ts_ns.saturating_add(OOM_HOLD_NS)).map(|u| u.index).collect();
        for i in due {
            self.decide(i, OomOutcome::Oom);
        }
    }

    /// Decides every undecided failure as an OOM: the trace ended and nothing recovered them.
    pub fn settle_all(&mut self) {
        let due: Vec<usize> = self.undecided.iter().map(|u| u.index).collect();
        for i in due {
            self.decide(i, OomOutcome::Oom);
        }
    }

    /// The undecided failures of `pid` become OOMs (its process ended).
    pub(super) fn settle_pid(&mut self, pid: u32) {
        let due: Vec<usize> = self.undecided.iter().filter(|u| self.ooms[u.index].pid == pid).map(|u| u.index).collect();
        for i in due {
            self.decide(i, OomOutcome::Oom);
        }
    }

    /// A new failure record (just pushed at `index`): a framework's report decides at once and
    /// takes the undecided driver failures of its process and device as its tries; a driver
    /// failure waits, and folds an undecided earlier failure of the same thread and size.
    pub(super) fn on_failure(&mut self, index: usize, ev: &Event) {
        let (pid, device, requested) = (self.ooms[index].pid, self.ooms[index].device, self.ooms[index].requested);
        if self.ooms[index].op == Some(EventKind::BlockAlloc) {
            let tries: Vec<usize> = self
                .undecided
                .iter()
                .filter(|u| self.ooms[u.index].pid == pid && self.ooms[u.index].device == device)
                .map(|u| u.index)
                .collect();
            for i in tries {
                self.decide(i, OomOutcome::Folded);
            }
            self.decide(index, OomOutcome::Oom);
            return;
        }
        // A driver failure that happened before a framework's report already applied (the Python
        // hook's socket overtook the shim's ring): one of that report's tries as well.
        // Only the latest REPORT_LOOKBACK records are looked at: the bookkeeping stays linear in
        // the OOMs (100,000 of them in a trace were quadratic here).
        let ts = self.ooms[index].ts_ns;
        let report = self.ooms[..index].iter().enumerate().rev().take(REPORT_LOOKBACK).find_map(|(i, o)| {
            (o.pid == pid
                && o.device == device
                && o.op == Some(EventKind::BlockAlloc)
                && o.outcome == OomOutcome::Oom
                && o.ts_ns >= ts
                && o.ts_ns - ts <= OOM_HOLD_NS)
                .then_some(i)
        });
        if let Some(r) = report {
            self.ooms[r].driver_failures_before += 1;
            // Counted for the report it belongs to, not left for the next one.
            if let Some(n) = self.driver_failures.get_mut(&(pid, device)) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.driver_failures.remove(&(pid, device));
                }
            }
            self.decide(index, OomOutcome::Folded);
            return;
        }
        // The same request again, or (an allocator that retries smaller, RMM's halving growth) a
        // smaller one: the earlier failure was a try of this one.
        let smaller = self.ooms[index].framework.is_some_and(|f| f.model().retries_smaller());
        let same: Vec<(usize, bool)> = self
            .undecided
            .iter()
            .filter(|u| self.ooms[u.index].pid == pid && u.tid == ev.tid)
            .map(|u| (u.index, self.ooms[u.index].requested == requested || (smaller && self.ooms[u.index].requested > requested)))
            .collect();
        for (i, a_try) in same {
            if a_try {
                self.ooms[index].driver_failures_before += self.ooms[i].driver_failures_before + 1;
                self.decide(i, OomOutcome::Folded);
            } else {
                self.decide(i, OomOutcome::Oom);
            }
        }
        self.undecided.push(Undecided { index, tid: ev.tid, releases: self.releases });
    }

    /// A successful driver allocation of `pid` on thread `tid`: the thread's undecided failure is
    /// a retry when this one has its size and memory was released since, else an OOM.
    pub(super) fn on_driver_alloc(&mut self, ev: &Event) {
        if self.undecided.is_empty() {
            return;
        }
        let mine: Vec<(usize, bool)> = self
            .undecided
            .iter()
            .filter(|u| self.ooms[u.index].pid == ev.pid && u.tid == ev.tid)
            .map(|u| {
                let want = self.ooms[u.index].requested;
                (u.index, (ev.size == want || ev.requested == want) && self.releases > u.releases)
            })
            .collect();
        for (i, recovered) in mine {
            self.decide(i, if recovered { OomOutcome::Retry } else { OomOutcome::Oom });
        }
    }

    /// Recovered failures of (pid, device) ([`OomOutcome::Retry`]), counted.
    pub fn retries_of(&self, pid: u32, device: i16) -> u64 {
        self.retries.get(&(pid, device)).copied().unwrap_or(0)
    }

    /// Recovered failures of every process and device.
    pub fn retries_total(&self) -> u64 {
        self.retries.values().sum()
    }

    /// The records decided as OOMs, in the order they were decided (indices into `ooms`): what
    /// the live line prints and the exporters count.
    pub fn oom_log(&self) -> &[usize] {
        &self.oom_log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::summary::Summary;
    use crate::event::{F_FAILED, F_FRAMEWORK_OWNED};
    use crate::ingest::RC_OUT_OF_MEMORY;

    const MIB: u64 = 1 << 20;
    const MS: u64 = 1_000_000;

    fn seg(ts_ns: u64, tid: u32, addr: u64, size: u64) -> Event {
        Event { ts_ns, tid, addr, size, requested: size, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 7, 0) }
    }
    fn free(ts_ns: u64, addr: u64) -> Event {
        Event { ts_ns, addr, ..Event::new(EventKind::MemFree, 7, -1) }
    }
    fn failed(ts_ns: u64, tid: u32, requested: u64, op: EventKind) -> Event {
        Event { ts_ns, tid, requested, rc: RC_OUT_OF_MEMORY, op: op as u16, flags: F_FAILED, ..Event::new(EventKind::AllocFailed, 7, 0) }
    }

    fn counts(s: &State) -> (usize, u64) {
        let sum = Summary::from_state(s, "t");
        (sum.ooms.len(), sum.retries)
    }

    /// PyTorch's release-and-retry: cudaMalloc of 30 MiB fails, the cache's segment is freed,
    /// the same thread's cudaMalloc of 30 MiB succeeds. A retry, not an OOM, in the state and
    /// the summary alike.
    #[test]
    fn a_recovered_allocation_is_one_retry_and_no_oom() {
        let mut s = State::default();
        s.apply(&seg(MS, 5, 1 << 30, 20 * MIB));
        s.apply(&failed(2 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        assert_eq!(s.ooms[0].outcome, OomOutcome::Pending);
        s.apply(&free(3 * MS, 1 << 30));
        s.apply(&seg(4 * MS, 5, 2 << 30, 30 * MIB));
        assert_eq!(s.ooms[0].outcome, OomOutcome::Retry);
        assert_eq!(counts(&s), (0, 1));
        s.settle_all();
        assert_eq!(counts(&s), (0, 1), "a decided retry stays one");
        assert_eq!(s.retries_of(7, 0), 1);
        assert!(s.oom_log().is_empty());
    }

    #[test]
    fn an_unrecovered_driver_failure_is_one_oom() {
        let mut s = State::default();
        s.apply(&seg(MS, 5, 1 << 30, 20 * MIB));
        s.apply(&failed(2 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        assert_eq!(counts(&s), (1, 0), "undecided at the end of the trace: nothing recovered it");
        s.settle_all();
        assert_eq!(s.oom_log(), &[0]);
        assert_eq!(counts(&s), (1, 0));
    }

    /// The same size succeeding with nothing released is not the allocator's retry; another
    /// size next on the thread means the program moved on: both OOMs.
    #[test]
    fn without_a_release_or_with_another_size_the_failure_is_an_oom() {
        let mut s = State::default();
        s.apply(&failed(MS, 5, 30 * MIB, EventKind::MemAlloc));
        s.apply(&seg(2 * MS, 5, 2 << 30, 30 * MIB));
        assert_eq!(s.ooms[0].outcome, OomOutcome::Oom);
        s.apply(&seg(3 * MS, 5, 3 << 30, MIB));
        s.apply(&failed(4 * MS, 5, 40 * MIB, EventKind::MemAlloc));
        s.apply(&free(5 * MS, 3 << 30));
        s.apply(&seg(6 * MS, 5, 4 << 30, 2 * MIB));
        assert_eq!(s.ooms[1].outcome, OomOutcome::Oom);
        // Another thread's success decides nothing for thread 5.
        s.apply(&failed(7 * MS, 5, 50 * MIB, EventKind::MemAlloc));
        s.apply(&free(8 * MS, 4 << 30));
        s.apply(&seg(9 * MS, 6, 5 << 30, 50 * MIB));
        assert_eq!(s.ooms[2].outcome, OomOutcome::Pending);
        assert_eq!(counts(&s), (3, 0));
    }

    /// The framework's report decides: PyTorch's two failed cudaMalloc calls of one request (before
    /// and after releasing its cache), then its OOM: one OOM after 2 driver failures, no retry.
    #[test]
    fn the_frameworks_report_is_the_oom_and_takes_the_driver_failures_as_its_tries() {
        let mut s = State::default();
        s.apply(&seg(MS, 5, 1 << 30, 20 * MIB));
        s.apply(&failed(2 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        s.apply(&free(3 * MS, 1 << 30));
        s.apply(&failed(4 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        s.apply(&failed(5 * MS, 5, 30 * MIB, EventKind::BlockAlloc));
        let outcomes: Vec<_> = s.ooms.iter().map(|o| o.outcome).collect();
        assert_eq!(outcomes, vec![OomOutcome::Folded, OomOutcome::Folded, OomOutcome::Oom]);
        let sum = Summary::from_state(&s, "t");
        assert_eq!((sum.ooms.len(), sum.retries, sum.driver_failures), (1, 0, 2));
        assert_eq!(sum.ooms[0].op, "block_alloc");
    }

    /// RMM's pool grows by retrying a failed upstream allocation at half the size down to the
    /// request (`try_to_expand`): 64, 32, then 24 MiB fail, then its OOM. Those are its tries,
    /// one OOM; the same failures in a process whose blocks are PyTorch's (which never retries
    /// smaller) stay OOMs of their own, as a program that moved on to another size.
    #[test]
    fn an_allocator_that_retries_smaller_has_its_smaller_failures_folded_into_its_oom() {
        let rmm = crate::alloc::Framework::by_name("rmm").expect("registered").flags();
        for (flags, want) in [(rmm, (1, 3)), (0, (3, 1))] {
            let mut s = State::default();
            s.apply(&seg(MS, 5, 1 << 30, 32 * MIB));
            s.apply(&Event { ts_ns: 2 * MS, tid: 5, addr: 1 << 30, requested: 20 * MIB, flags, ..Event::new(EventKind::BlockAlloc, 7, 0) });
            for (i, mib) in [64, 32, 24].into_iter().enumerate() {
                s.apply(&failed((3 + i as u64) * MS, 5, mib * MIB, EventKind::MemAlloc));
            }
            s.apply(&failed(7 * MS, 5, 24 * MIB, EventKind::BlockAlloc));
            s.settle_all();
            let sum = Summary::from_state(&s, "t");
            assert_eq!((sum.ooms.len(), sum.driver_failures), want, "flags {flags:#x}: {:?}", s.ooms);
            assert_eq!(sum.ooms.last().map(|o| o.op.as_str()), Some("block_alloc"));
        }
    }

    /// A caught CuPy OOM under `run` was two OOMs now and then: the hook's report (its socket)
    /// reached the state before the pool's failed cudaMalloc calls (the shim's ring), which then
    /// waited and became an OOM of their own. Failures that happened before the report are its
    /// tries in whatever order they arrive; one after it is not.
    #[test]
    fn regression_driver_failures_that_arrive_after_their_frameworks_report_are_its_tries() {
        let mut s = State::default();
        s.apply(&seg(MS, 5, 1 << 30, 20 * MIB));
        s.apply(&failed(5 * MS, 5, 30 * MIB, EventKind::BlockAlloc));
        s.apply(&failed(2 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        s.apply(&failed(4 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        let outcomes: Vec<_> = s.ooms.iter().map(|o| o.outcome).collect();
        assert_eq!(outcomes, vec![OomOutcome::Oom, OomOutcome::Folded, OomOutcome::Folded]);
        s.settle_all();
        let sum = Summary::from_state(&s, "t");
        assert_eq!((sum.ooms.len(), sum.retries, sum.driver_failures), (1, 0, 2), "{:?}", s.ooms);
        assert_eq!(sum.ooms[0].op, "block_alloc");
        // The next report does not count the folded tries again.
        s.apply(&failed(7 * MS, 5, 8 * MIB, EventKind::BlockAlloc));
        assert_eq!(s.ooms[3].driver_failures_before, 0, "{:?}", s.ooms[3]);
        // A failure after the reports is its own (here: an OOM at the end of the trace).
        s.apply(&failed(8 * MS, 5, 30 * MIB, EventKind::MemAlloc));
        s.settle_all();
        assert_eq!(s.ooms[4].outcome, OomOutcome::Oom);
    }

    /// A failure whose retry never comes is decided by event time after OOM_HOLD_NS, and by the
    /// process's exit.
    #[test]
    fn hold_and_exit_decide_an_undecided_failure() {
        let mut s = State::default();
        s.apply(&failed(MS, 5, 30 * MIB, EventKind::MemAlloc));
        s.apply(&Event { ts_ns: MS + OOM_HOLD_NS + 1, ..Event::new(EventKind::ProcessExec, 8, -1) });
        assert_eq!(s.ooms[0].outcome, OomOutcome::Oom);
        s.apply(&failed(2 * OOM_HOLD_NS, 5, 30 * MIB, EventKind::MemAlloc));
        s.apply(&Event { ts_ns: 2 * OOM_HOLD_NS + 1, ..Event::new(EventKind::ProcessExit, 7, -1) });
        assert_eq!(s.ooms[1].outcome, OomOutcome::Oom);
        assert_eq!(s.oom_log(), &[0, 1]);
    }
}
