//! Which processes' traces are partial, and why: a process first seen after its start, or whose
//! probes came in after it started (a `ProcessExec` with [`F_PARTIAL`]), or whose events the
//! capture dropped (a `Dropped` naming it, or one of the whole capture while it ran). An OOM of
//! such a process is judged from half the facts: its blocks (or segments) before the gap are
//! missing, so stranded, releasable and the largest free block are lower bounds and its verdict
//! is `inconclusive`, naming what is missing and giving the driver-level figures
//! (crate::analysis), never `true_oom` or `fragmentation`. Every reason is an event, so a replay
//! of the record gives the same verdict.

use super::State;
use crate::event::{Event, F_PARTIAL};

/// What is missing from a process's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partial {
    /// It was first seen after its start (attached mid-run), or probes it used were attached
    /// after it started: what it allocated before is missing.
    NotFromStart,
    /// The capture dropped events while it ran (`n` in all, its own or the whole capture's).
    Dropped(u64),
}

impl Partial {
    /// What is missing, in words.
    pub fn missing(self) -> String {
        match self {
            Partial::NotFromStart => "the process was not traced from its start (attached after it started, or its probes came in after it): the segments and blocks it allocated before are missing".to_string(),
            Partial::Dropped(n) => format!("the capture dropped {n} event(s) while the process ran: some of its allocations and frees are missing"),
        }
    }
}

impl State {
    /// A `ProcessExec`: with [`F_PARTIAL`] the process's trace is partial from now; without it,
    /// a process traced from its start (a new image).
    pub(super) fn process_exec(&mut self, ev: &Event) {
        if self.execs.len() < super::MAX_SPACES {
            self.execs.insert(ev.pid);
        }
        if ev.flags & F_PARTIAL != 0 {
            self.partial.insert(ev.pid, Partial::NotFromStart);
        } else {
            self.partial.remove(&ev.pid);
        }
    }

    /// A `Dropped` marker: the process it names (or, with pid 0, every process with a map, the
    /// whole capture having lost events) has a partial trace. Not traced from its start stays the
    /// reason where it was one already.
    pub(super) fn dropped_for(&mut self, ev: &Event) {
        if ev.size == 0 {
            return;
        }
        let pids: Vec<u32> = if ev.pid != 0 {
            vec![ev.pid]
        } else {
            let mut p: Vec<u32> = self.spaces.keys().map(|&(p, _)| p).filter(|p| !self.exited.contains_key(p)).collect();
            p.dedup();
            p
        };
        for pid in pids {
            let e = self.partial.entry(pid).or_insert(Partial::Dropped(0));
            if let Partial::Dropped(n) = e {
                *n = n.saturating_add(ev.size);
            }
        }
    }

    /// Whether any event told of `pid` before: its start, a map, settings, an OOM.
    pub(super) fn seen(&self, pid: u32) -> bool {
        self.execs.contains(&pid)
            || self.spaces.range((pid, i16::MIN)..=(pid, i16::MAX)).next().is_some()
            || self.settings_of(pid).is_some()
            || self.ooms.iter().any(|o| o.pid == pid)
    }

    /// What is missing from `pid`'s trace, if anything.
    pub fn partial_of(&self, pid: u32) -> Option<Partial> {
        self.partial.get(&pid).copied()
    }
}
