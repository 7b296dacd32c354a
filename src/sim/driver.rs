//! The whatif driver, one for every caller: the self-check under the trace's own settings and
//! limits, the baseline (the trace's own settings, the driver's addresses replayed), one scenario
//! per setting asked for, the ranking and the sentence. `gpufrag whatif` calls it with the
//! settings given (or the sweep), the verdict of `analyze` and the report with the sweep under
//! the cap the failure ran into.

use super::{rank, recommendation, self_check, simulate, sweep_confs, Check, Limits, Outcome, Ranked, RequestStream, Scenario};
use crate::alloc::pytorch::AllocConf;

/// What to simulate.
#[derive(Clone, Debug, Default)]
pub struct Ask {
    /// The settings, as given and parsed, in order (the baseline is added in front).
    pub confs: Vec<(String, AllocConf)>,
    /// The allowed bytes of `set_per_process_memory_fraction`, for the self-check and every scenario.
    pub memory_limit: Option<u64>,
    /// A card of this size: the scenarios (not the self-check, which runs as the trace ran) get
    /// its bytes less the trace's memory outside the caching allocator.
    pub device_memory: Option<u64>,
    /// Stop after the self-check when it fails (no scenario is run).
    pub stop_unfaithful: bool,
}

/// Everything the driver computed.
#[derive(Clone, Debug)]
pub struct Driven {
    /// The self-check.
    pub check: Check,
    /// The limits the scenarios ran under.
    pub limits: Limits,
    /// The baseline first, then the scenarios (empty when the check failed and `stop_unfaithful`).
    pub outcomes: Vec<Outcome>,
    /// The ranking over the outcomes that may be recommended (indices into `outcomes`; a setting
    /// left out has no rank).
    pub ranked: Vec<Ranked>,
    /// The sentence: always a setting that was simulated and not left out.
    pub recommendation: String,
    /// Settings simulated but never recommended, by index into `outcomes`, with why.
    pub left_out: Vec<(usize, String)>,
}

/// Why a setting must not be recommended for this trace, if it must not: the advice checks the
/// trace for what the setting would break (docs/whatif.md, "Advice that does not break the
/// program", gives the sources).
pub fn refusal(stream: &RequestStream, conf: &AllocConf) -> Option<String> {
    if conf.expandable_segments && !stream.conf.expandable_segments {
        if let Some(&(event, addr)) = stream.ipc_exports.first() {
            return Some(format!(
                "left out: the process exports the caching allocator's memory over legacy CUDA IPC ({} cuIpcGetMemHandle/cudaIpcGetMemHandle call{} seen, the first of {addr:#x} at record event {event}); expandable segments map memory with cuMemCreate/cuMemMap, which the legacy IPC calls cannot export, so the program's export would fail",
                stream.ipc_exports.len(),
                if stream.ipc_exports.len() == 1 { "" } else { "s" }
            ));
        }
    }
    None
}

/// Parses settings; the error names the one that is wrong in PyTorch's words.
pub fn parse_confs(confs: &[String]) -> Result<Vec<(String, AllocConf)>, String> {
    confs.iter().map(|c| AllocConf::parse(c).map(|p| (c.clone(), p)).map_err(|e| format!("--alloc-conf {c:?}: {e}"))).collect()
}

/// The sweep of `sweep_confs` without the trace's own settings (the baseline runs them).
pub fn sweep_for(stream: &RequestStream) -> Vec<(String, AllocConf)> {
    sweep_confs()
        .into_iter()
        .filter(|c| *c != stream.conf.conf)
        .map(|c| (c.to_string(), AllocConf::parse(c).expect("the sweep's settings parse")))
        .collect()
}

/// The limits the trace ran under (its cap if known, the capacity its first OOM implies).
pub fn trace_limits(stream: &RequestStream, memory_limit: Option<u64>) -> Limits {
    Limits { memory_limit, device_capacity: stream.device_capacity_hint, ..Limits::default() }
}

/// The limits of a card of `device_memory` bytes for this trace's allocator.
pub fn card_limits(stream: &RequestStream, memory_limit: Option<u64>, device_memory: u64) -> Limits {
    Limits { memory_limit, device_capacity: Some(device_memory.saturating_sub(stream.non_framework_peak)), device_total: device_memory }
}

/// Runs the self-check, the baseline and every scenario of `ask`.
pub fn drive(stream: &RequestStream, ask: &Ask) -> Driven {
    let mut limits = trace_limits(stream, ask.memory_limit);
    let check = self_check(stream, &limits);
    if let Some(dm) = ask.device_memory {
        limits = card_limits(stream, ask.memory_limit, dm);
    }
    if !check.faithful && ask.stop_unfaithful {
        return Driven { check, limits, outcomes: Vec::new(), ranked: Vec::new(), recommendation: String::new(), left_out: Vec::new() };
    }
    let own = stream.conf.clone();
    let mut outcomes = vec![simulate(stream, &Scenario { alloc_conf: own.conf.clone(), conf: own.clone(), limits: limits.clone() }, true)];
    for (s, c) in &ask.confs {
        outcomes.push(simulate(stream, &Scenario { alloc_conf: s.clone(), conf: c.clone(), limits: limits.clone() }, false));
    }
    let mut left_out = Vec::new();
    for (i, (_, c)) in ask.confs.iter().enumerate() {
        if let Some(why) = refusal(stream, c) {
            left_out.push((i + 1, why));
        }
    }
    // rank and recommend among the settings that may be recommended only
    let allowed: Vec<usize> = (0..outcomes.len()).filter(|i| !left_out.iter().any(|(j, _)| j == i)).collect();
    let kept: Vec<Outcome> = allowed.iter().map(|&i| outcomes[i].clone()).collect();
    let ranked = rank(&kept).into_iter().map(|r| Ranked { index: allowed[r.index], rank: r.rank }).collect::<Vec<_>>();
    let mut recommendation = recommendation(&kept);
    for (i, why) in &left_out {
        recommendation.push_str(&format!(" {} was simulated and {why}.", outcomes[*i].alloc_conf));
    }
    let best = &outcomes[ranked[0].index];
    if !stream.sees_ipc && ranked[0].index != 0 && ask.confs.iter().any(|(s, c)| *s == best.alloc_conf && c.expandable_segments) {
        recommendation
            .push_str(" (This trace cannot show CUDA IPC exports, which expandable segments break: a record of gpufrag run shows them.)");
    }
    Driven { check, limits, outcomes, ranked, recommendation, left_out }
}
