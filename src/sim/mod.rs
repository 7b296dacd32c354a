//! whatif: replaying a trace's request stream through a faithful simulation of PyTorch 2.11's
//! `CUDACachingAllocator` under other settings and memory limits.
//!
//! Files: `allocator.rs` (the simulated allocator, one device), `stream.rs` (a trace → the
//! requests, which do not depend on the settings, and the driver calls the trace recorded),
//! `check.rs` (the self-check: the trace under its own settings must reproduce itself),
//! `sweep.rs` (the settings people try, and the ranking), `capacity.rs` (the least memory each setting needs; two traces on one card), `driver.rs` (self-check → baseline →
//! scenarios → ranking, the one driver of the CLI and the verdict), `verdict.rs` (the sweep's answer in the
//! OOM verdicts of `analyze`, the report and the live pipeline). The rules the simulator applies are
//! `crate::alloc::pytorch`, the same functions replay and live capture use. Next to it, `bfc.rs`:
//! the whole of XLA's BFC allocator on the rules of `crate::alloc::bfc`, checked against a naive
//! model and the address map by tests/bfc_model.rs.

mod allocator;
pub mod bfc;
mod capacity;
mod check;
mod driver;
mod stream;
mod sweep;
mod verdict;

pub use allocator::{Addresses, Allocator, Counters, DeviceOp, Figures, Limits, Oom, OomLimit, DEFAULT_DEVICE_TOTAL};
pub use capacity::{
    min_memory, min_memory_of, min_memory_sentence, peak_live_requested, plain_name, survives, together, together_lines, MinMemory,
    Together, GRANULE,
};
pub use check::{self_check, Check, Divergence};
pub use driver::{card_limits, drive, parse_confs, refusal, sweep_for, trace_limits, Ask, Driven};
pub use stream::{
    from_events, from_events_upto, from_events_with_texts, from_snapshot, snapshot_conf, stream_of, Request, RequestStream, StreamError,
    TraceFinal,
};
pub use sweep::{rank, recommendation, sweep_confs, Ranked};
pub use verdict::{apply_to_summary, compute as compute_fix, put as put_fix, ComputedFix, FixInput};

use crate::alloc::pytorch::AllocConf;

/// One setting and limit to simulate.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string, as given.
    pub alloc_conf: String,
    /// It, parsed.
    pub conf: AllocConf,
    /// The limits.
    pub limits: Limits,
}

/// Where a scenario's first OOM happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstOom {
    /// Index of the request in the stream.
    pub request: usize,
    /// The trace entry (or record event) of that request.
    pub entry: usize,
    /// What failed.
    pub oom: Oom,
}

/// What one scenario gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    /// The memory limit (allowed bytes), if any.
    pub memory_limit: Option<u64>,
    /// The first request that failed, if one did.
    pub first_oom: Option<FirstOom>,
    /// Requests simulated (all of them, or up to the first OOM the trace did not have).
    pub simulated: usize,
    /// Counters at the end (at the OOM when the run stopped there).
    pub counters: Counters,
    /// Figures at the end.
    pub figures: Figures,
}

/// Applies a request that returns memory (a free requested or completed, an `empty_cache()`) to
/// `a`, with `ptrs` the address each earlier allocation got (0: it failed): the same in the
/// simulation and in both self-checks. An allocation is each caller's own (what it does with a
/// refusal differs).
pub(crate) fn release(a: &mut Allocator, ptrs: &[u64], req: &Request) {
    let ptr = |alloc: u32| ptrs.get(alloc as usize).copied().filter(|&p| p != 0);
    match *req {
        Request::FreeRequested { alloc, .. } => {
            if let Some(p) = ptr(alloc) {
                a.free_requested(p);
            }
        }
        Request::FreeCompleted { alloc, .. } => {
            if let Some(p) = ptr(alloc) {
                a.free_completed(p);
            }
        }
        Request::EmptyCache { .. } => a.empty_cache(),
        Request::Alloc { .. } => {}
    }
}

/// One simulated allocator stepping through a stream, request by request: the loop of
/// [`simulate`], and of the capacity questions that run two processes side by side.
pub struct Stepper<'a> {
    stream: &'a RequestStream,
    /// The simulated allocator.
    pub allocator: Allocator,
    replay: bool,
    ptrs: Vec<u64>,
    next: usize,
    /// The first request that failed, if one did.
    pub first_oom: Option<FirstOom>,
    /// True once a request failed that the trace's did not (the program would have raised).
    pub dead: bool,
}

impl<'a> Stepper<'a> {
    /// A fresh allocator under `scenario` at the stream's start.
    pub fn new(stream: &'a RequestStream, scenario: &Scenario, replay: bool) -> Stepper<'a> {
        let addresses = if replay { Addresses::Replay } else { Addresses::Model };
        Stepper {
            stream,
            allocator: Allocator::new(scenario.conf.clone(), scenario.limits.clone(), addresses),
            replay,
            ptrs: Vec::with_capacity(stream.requests.len() / 2 + 1),
            next: 0,
            first_oom: None,
            dead: false,
        }
    }

    /// Requests run so far.
    pub fn done(&self) -> usize {
        self.next
    }

    /// True when every request ran or the program died.
    pub fn finished(&self) -> bool {
        self.dead || self.next >= self.stream.requests.len()
    }

    /// Runs the next request; false when there was none to run.
    pub fn step(&mut self) -> bool {
        if self.finished() {
            return false;
        }
        let r = self.next;
        self.next += 1;
        let req = &self.stream.requests[r];
        if self.replay {
            self.allocator.set_replay_hint(self.stream.ops_of(r));
        }
        match *req {
            Request::Alloc { size, stream: s, entry, traced } => match self.allocator.malloc(size, s) {
                Ok(p) => self.ptrs.push(p),
                Err(oom) => {
                    self.ptrs.push(0);
                    if self.first_oom.is_none() {
                        self.first_oom = Some(FirstOom { request: r, entry, oom });
                    }
                    if traced.is_some() {
                        self.dead = true;
                    }
                }
            },
            Request::FreeRequested { .. } | Request::FreeCompleted { .. } | Request::EmptyCache { .. } => {
                release(&mut self.allocator, &self.ptrs, req)
            }
        }
        self.allocator.clear_ops();
        true
    }

    /// What the run gave, under the name `alloc_conf`.
    pub fn outcome(&self, alloc_conf: &str, memory_limit: Option<u64>) -> Outcome {
        Outcome {
            alloc_conf: alloc_conf.to_string(),
            memory_limit,
            first_oom: self.first_oom.clone(),
            simulated: self.next,
            counters: self.allocator.counters().clone(),
            figures: self.allocator.figures(),
        }
    }
}

/// Runs `stream` under `scenario`. A request that fails where the trace's did not ends the run
/// (the program would have raised there); one that failed in the trace too is passed over, as
/// the program did. A request that failed in the trace but succeeds here keeps its block to the
/// end (the trace cannot say when the program would have freed it).
///
/// `replay`: take the driver's addresses from the trace where the simulation asks the driver
/// for what the trace did (the baseline); otherwise they are the simulator's own.
pub fn simulate(stream: &RequestStream, scenario: &Scenario, replay: bool) -> Outcome {
    let mut s = Stepper::new(stream, scenario, replay);
    while s.step() {}
    s.outcome(&scenario.alloc_conf, scenario.limits.memory_limit)
}
