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
    /// The ranking over `outcomes`.
    pub ranked: Vec<Ranked>,
    /// The sentence.
    pub recommendation: String,
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
        return Driven { check, limits, outcomes: Vec::new(), ranked: Vec::new(), recommendation: String::new() };
    }
    let own = stream.conf.clone();
    let mut outcomes = vec![simulate(stream, &Scenario { alloc_conf: own.conf.clone(), conf: own.clone(), limits: limits.clone() }, true)];
    for (s, c) in &ask.confs {
        outcomes.push(simulate(stream, &Scenario { alloc_conf: s.clone(), conf: c.clone(), limits: limits.clone() }, false));
    }
    let ranked = rank(&outcomes);
    let recommendation = recommendation(&outcomes);
    Driven { check, limits, outcomes, ranked, recommendation }
}
