//! The simulation in the verdict: for a trace that ran out of memory and holds its full
//! allocation history, the sweep of `sweep.rs` replaces the advice of every OOM verdict of the
//! simulated device with what the simulation computed ("with expandable_segments:True this run
//! peaks at 10.31 GiB reserved and the 2.50 GiB request fits", or that no setting tried avoids
//! it), and the summary carries the baseline and the best setting side by side for the report.
//! A trace whatif cannot use, or whose self-check fails, leaves the verdicts as they were, with a
//! note saying why. A failure whose allowed bytes (`set_per_process_memory_fraction`) were seen
//! is simulated under that cap: the sweep says which setting fits under it, beside the cap's own
//! fix.
//!
//! One computation for every caller ([`compute`], then [`put`]): `analyze` and the report run it
//! on a file, the live pipeline (`crate::live`) on the events it applied, both over the trace up
//! to and including the failure of the first OOM ([`FixInput::cut`]): what happened after a
//! caught OOM is what the program did because it failed, so the fix is about reaching past the
//! failure. A record of the live run therefore replays to the same sentence.

use super::{drive, sweep_for, Ask, Outcome, RequestStream};
use crate::analysis::summary::{ScenarioBrief, Summary, WhatIfSummary};

fn brief(o: &Outcome) -> ScenarioBrief {
    ScenarioBrief {
        alloc_conf: o.alloc_conf.clone(),
        oom: o.first_oom.is_some(),
        first_oom_requested: o.first_oom.as_ref().map(|f| f.oom.requested),
        peak_reserved: o.counters.peak_reserved,
        peak_allocated: o.counters.peak_allocated,
        num_alloc_retries: o.counters.num_alloc_retries,
    }
}

/// What the computation needs of a trace's OOMs: the first one's (in the order decided: the
/// summary's order), and whether any is another allocator's than PyTorch's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixInput {
    /// The first OOM's device.
    pub device: i16,
    /// Its allowed bytes (`set_per_process_memory_fraction`), when seen.
    pub allowed: Option<u64>,
    /// The index of its failure's event in the stream (a record's event index): the trace is
    /// simulated up to and including it. `None`: the whole trace (a snapshot's).
    pub cut: Option<u64>,
    /// An OOM of another allocator (XLA's BFC pool, CuPy's pool), if any.
    pub other_allocator: Option<crate::alloc::Framework>,
    /// What was missing from the first OOM's process's trace (`crate::ingest::partial`): the
    /// simulation needs every request from its start, so there is no computed fix.
    pub missing: Option<String>,
}

impl FixInput {
    /// The input of `summary`'s OOMs; `None` when it has none.
    pub fn of(summary: &Summary) -> Option<FixInput> {
        let first = summary.ooms.first()?;
        Some(FixInput {
            device: first.device,
            allowed: first.allowed,
            cut: first.event,
            other_allocator: summary.ooms.iter().find_map(|o| o.framework.filter(|f| *f != crate::alloc::Framework::PYTORCH)),
            missing: first.missing.clone(),
        })
    }
}

pub use crate::ingest::fix::ComputedFix;

/// Runs the sweep for the OOMs `input` describes; `stream` gives the trace's requests up to
/// `input.cut`, or why they cannot be had. `Err` is the note saying why there is no computed fix.
pub fn compute(input: &FixInput, stream: impl FnOnce() -> Result<RequestStream, String>) -> Result<ComputedFix, String> {
    // The simulation is PyTorch's caching allocator: an OOM of XLA's BFC pool or CuPy's pool keeps
    // the advice in its own allocator's terms.
    if let Some(f) = input.other_allocator {
        return Err(format!(
            "no simulated fix: the simulation models PyTorch's caching allocator, and this trace's OOM is {}'s",
            f.allocator()
        ));
    }
    if let Some(m) = &input.missing {
        return Err(format!("no simulated fix: the simulation replays every request from the process's start, and {m}"));
    }
    let stream = stream().map_err(|why| format!("no simulated fix: {why}"))?;
    // A failure under set_per_process_memory_fraction whose allowed bytes were seen (PyTorch's
    // OOM observer under `run`): the trace ran under that cap, so the self-check and every
    // scenario do too, and the answer is whether a setting fits under it.
    let allowed = input.allowed.filter(|_| input.device == stream.device);
    let d = drive(&stream, &Ask { confs: sweep_for(&stream), memory_limit: allowed, device_memory: None, stop_unfaithful: true });
    if !d.check.faithful {
        let d = d.check.divergence.map(|d| d.what).unwrap_or_default();
        return Err(format!("no simulated fix: the simulation does not reproduce this trace under its own settings ({d})"));
    }
    let best = d.ranked[0].index;
    let mut sentence = d.recommendation;
    if let Some(a) = allowed {
        sentence = format!("Under the allowed {} (set_per_process_memory_fraction): {sentence}", crate::units::human_bytes(a));
    }
    let whatif = WhatIfSummary {
        faithful: true,
        scenarios: d.outcomes.len(),
        baseline: brief(&d.outcomes[0]),
        best: brief(&d.outcomes[best]),
        recommendation: sentence.clone(),
    };
    Ok(ComputedFix { device: stream.device, sentence, allowed, whatif })
}

pub use crate::analysis::summary::put_fix as put;

/// Puts the simulated sweep into `summary`'s OOM verdicts; `stream` gives the trace's requests
/// up to the event index it is given (the first OOM's failure; `None`: all of them), or why they
/// cannot be had (called only when there is an OOM).
pub fn apply_to_summary(summary: &mut Summary, stream: impl FnOnce(Option<u64>) -> Result<RequestStream, String>) {
    let Some(input) = FixInput::of(summary) else { return };
    let fix = compute(&input, || stream(input.cut));
    put(summary, &fix);
}
