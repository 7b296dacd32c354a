//! The simulation in the verdict: for a trace that ran out of memory and holds its full
//! allocation history, the sweep of `sweep.rs` replaces the advice of every OOM verdict of the
//! simulated device with what the simulation computed ("with expandable_segments:True this run
//! peaks at 10.31 GiB reserved and the 2.50 GiB request fits", or that no setting tried avoids
//! it), and the summary carries the baseline and the best setting side by side for the report.
//! A trace whatif cannot use, or whose self-check fails, leaves the verdicts as they were, with a
//! note saying why. A failure whose allowed bytes (`set_per_process_memory_fraction`) were seen
//! is simulated under that cap: the sweep says which setting fits under it, beside the cap's own
//! fix.

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

/// Puts the simulated sweep into `summary`'s OOM verdicts; `stream` gives the trace's requests,
/// or why they cannot be had (called only when there is an OOM).
pub fn apply_to_summary(summary: &mut Summary, stream: impl FnOnce() -> Result<RequestStream, String>) {
    if summary.ooms.is_empty() {
        return;
    }
    // The simulation is PyTorch's caching allocator: an OOM of XLA's BFC pool or CuPy's pool keeps
    // the advice in its own allocator's terms.
    if let Some(f) = summary.ooms.iter().find_map(|o| o.framework.filter(|f| *f != crate::alloc::Framework::Pytorch)) {
        summary.notes.push(format!(
            "no simulated fix: the simulation models PyTorch's caching allocator, and this trace's OOM is {}'s",
            f.allocator()
        ));
        return;
    }
    let stream = match stream() {
        Ok(s) => s,
        Err(why) => {
            summary.notes.push(format!("no simulated fix: {why}"));
            return;
        }
    };
    // A failure under set_per_process_memory_fraction whose allowed bytes were seen (PyTorch's
    // OOM observer under `run`): the trace ran under that cap, so the self-check and every
    // scenario do too, and the answer is whether a setting fits under it.
    let allowed = summary.ooms.iter().filter(|o| o.device == stream.device).find_map(|o| o.allowed);
    let d = drive(&stream, &Ask { confs: sweep_for(&stream), memory_limit: allowed, device_memory: None, stop_unfaithful: true });
    if !d.check.faithful {
        let d = d.check.divergence.map(|d| d.what).unwrap_or_default();
        summary.notes.push(format!("no simulated fix: the simulation does not reproduce this trace under its own settings ({d})"));
        return;
    }
    let outcomes = d.outcomes;
    let best = d.ranked[0].index;
    let mut sentence = d.recommendation;
    if let Some(a) = allowed {
        sentence = format!("Under the allowed {} (set_per_process_memory_fraction): {sentence}", crate::units::human_bytes(a));
    }
    for o in summary.ooms.iter_mut().filter(|o| o.device == stream.device) {
        let simulated = format!(
            "{sentence} (simulated over {} allocator settings: gpufrag whatif FILE{})",
            outcomes.len(),
            allowed.map_or(String::new(), |a| format!(" --memory-limit {a}"))
        );
        // The cap's own fix (the fraction that would allow the request) stays beside the simulated one.
        o.fix = if o.verdict == crate::analysis::Verdict::AllowedLimit { format!("{simulated}; or {}", o.fix) } else { simulated };
    }
    summary.whatif = Some(WhatIfSummary {
        faithful: true,
        scenarios: outcomes.len(),
        baseline: brief(&outcomes[0]),
        best: brief(&outcomes[best]),
        recommendation: sentence,
    });
}
