//! whatif: replaying a trace's request stream through a faithful simulation of PyTorch 2.11's
//! `CUDACachingAllocator` under other settings and memory limits.
//!
//! Files: `allocator.rs` (the simulated allocator, one device), `stream.rs` (a trace → the
//! requests, which do not depend on the settings, and the driver calls the trace recorded),
//! `check.rs` (the self-check: the trace under its own settings must reproduce itself),
//! `sweep.rs` (the settings people try, and the ranking), `verdict.rs` (the sweep's answer in the
//! OOM verdicts of `analyze` and the report). The rules the simulator applies are
//! `crate::alloc::pytorch`, the same functions replay and live capture use.

mod allocator;
mod check;
mod stream;
mod sweep;
mod verdict;

pub use allocator::{Addresses, Allocator, Counters, DeviceOp, Figures, Limits, Oom, OomLimit, DEFAULT_DEVICE_TOTAL};
pub use check::{self_check, Check, Divergence};
pub use stream::{
    from_events, from_events_with_texts, from_snapshot, snapshot_conf, stream_of_file, Request, RequestStream, StreamError, TraceFinal,
};
pub use sweep::{rank, recommendation, sweep_confs, Ranked};
pub use verdict::apply_to_summary;

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

/// Runs `stream` under `scenario`. A request that fails where the trace's did not ends the run
/// (the program would have raised there); one that failed in the trace too is passed over, as
/// the program did. A request that failed in the trace but succeeds here keeps its block to the
/// end (the trace cannot say when the program would have freed it).
///
/// `replay`: take the driver's addresses from the trace where the simulation asks the driver
/// for what the trace did (the baseline); otherwise they are the simulator's own.
pub fn simulate(stream: &RequestStream, scenario: &Scenario, replay: bool) -> Outcome {
    let addresses = if replay { Addresses::Replay } else { Addresses::Model };
    let mut a = Allocator::new(scenario.conf.clone(), scenario.limits.clone(), addresses);
    let mut ptrs: Vec<u64> = Vec::with_capacity(stream.requests.len() / 2 + 1);
    let mut first_oom = None;
    let mut simulated = 0;
    for (r, req) in stream.requests.iter().enumerate() {
        simulated = r + 1;
        if replay {
            a.set_replay_hint(stream.ops_of(r));
        }
        match *req {
            Request::Alloc { size, stream: s, entry, traced } => match a.malloc(size, s) {
                Ok(p) => ptrs.push(p),
                Err(oom) => {
                    ptrs.push(0);
                    if first_oom.is_none() {
                        first_oom = Some(FirstOom { request: r, entry, oom });
                    }
                    if traced.is_some() {
                        break;
                    }
                }
            },
            Request::FreeRequested { .. } | Request::FreeCompleted { .. } | Request::EmptyCache { .. } => release(&mut a, &ptrs, req),
        }
        a.clear_ops();
    }
    Outcome {
        alloc_conf: scenario.alloc_conf.clone(),
        memory_limit: scenario.limits.memory_limit,
        first_oom,
        simulated,
        counters: a.counters().clone(),
        figures: a.figures(),
    }
}
