//! The agent's health as Kubernetes probes see it, served by the Prometheus endpoint as
//! `/healthz` (liveness) and `/readyz` (readiness). Liveness is the endpoint answering at all: its
//! thread is the process's, and it answers without touching the metric store. Readiness is two
//! facts the live loop reports here: the capture is in place ([`Health::capture_started`]: the
//! eBPF session attached, or `run`'s program started under the shim) and the loop still turns
//! ([`Health::beat`], once a tick, every 500 ms); ready while both hold, not ready before the
//! first and when the beats stop for [`STALL_AFTER`] (the loop is stuck: a probe reading
//! `/proc` of a hung process, a blocked output). Two atomics, written by the loop, read by the
//! endpoint's thread: no lock between them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the loop may go without a tick before `/readyz` says it stalled: 20 ticks. A tick
/// comes every 500 ms; a scan of `/proc` or the attaching of a newly mapped library delays one by
/// well under a second on a busy node.
pub const STALL_AFTER: Duration = Duration::from_secs(10);

/// The health the live loop reports; shared with the endpoint.
#[derive(Debug)]
pub struct Health {
    since: Instant,
    stall_after: Duration,
    started: AtomicBool,
    /// Milliseconds after `since` of the last beat, plus one (0: none yet).
    beat: AtomicU64,
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The capture is not in place yet (the eBPF session is attaching).
    NotAttached,
    /// The capture is in place and the loop has not ticked yet.
    NotRunning,
    /// The loop ticked this long ago, within the stall bound.
    Ready(Duration),
    /// The loop has not ticked for this long, past the stall bound.
    Stalled(Duration),
}

impl Default for Health {
    fn default() -> Health {
        Health::with_stall_after(STALL_AFTER)
    }
}

impl Health {
    /// A health whose loop counts as stalled after `stall_after` without a beat.
    pub fn with_stall_after(stall_after: Duration) -> Health {
        Health { since: Instant::now(), stall_after, started: AtomicBool::new(false), beat: AtomicU64::new(0) }
    }

    /// The capture is in place.
    pub fn capture_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// The loop ticked.
    pub fn beat(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.beat.store(ms + 1, Ordering::Release);
    }

    /// Readiness now.
    pub fn readiness(&self) -> Readiness {
        if !self.started.load(Ordering::Acquire) {
            return Readiness::NotAttached;
        }
        let beat = self.beat.load(Ordering::Acquire);
        if beat == 0 {
            return Readiness::NotRunning;
        }
        let age = self.since.elapsed().saturating_sub(Duration::from_millis(beat - 1));
        if age > self.stall_after {
            Readiness::Stalled(age)
        } else {
            Readiness::Ready(age)
        }
    }

    /// `/readyz`'s answer: whether ready, and the line that says why.
    pub fn answer(&self) -> (bool, String) {
        match self.readiness() {
            Readiness::NotAttached => (false, "not ready: the capture is not in place yet (attaching the eBPF probes)\n".into()),
            Readiness::NotRunning => (false, "not ready: attached; the pipeline has not run yet\n".into()),
            Readiness::Ready(age) => (true, format!("ready: attached, pipeline ran {} ms ago\n", age.as_millis())),
            Readiness::Stalled(age) => (
                false,
                format!(
                    "not ready: the pipeline stalled: no tick for {} ms (more than {} ms)\n",
                    age.as_millis(),
                    self.stall_after.as_millis()
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_the_capture_started_and_the_loop_beat_and_until_it_stalls() {
        let h = Health::with_stall_after(Duration::from_millis(150));
        assert_eq!(h.readiness(), Readiness::NotAttached);
        h.beat();
        assert_eq!(h.readiness(), Readiness::NotAttached, "a beat before the capture is in place is not readiness");
        h.capture_started();
        assert!(matches!(h.readiness(), Readiness::Ready(_)), "{:?}", h.readiness());
        std::thread::sleep(Duration::from_millis(250));
        match h.readiness() {
            Readiness::Stalled(age) => assert!(age >= Duration::from_millis(250), "{age:?}"),
            r => panic!("no beat for 250 ms with a 150 ms bound: {r:?}"),
        }
        h.beat();
        assert!(h.answer().0, "{}", h.answer().1);
    }
}
