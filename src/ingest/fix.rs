//! The fix the simulation computed for a trace's first OOM (`crate::sim::verdict` computes it;
//! the live pipeline sets it in the state, so every view of that state shows the same sentence;
//! `crate::analysis::summary::put_fix` puts it into a summary): plain data, with the sweep's
//! summary as the summary JSON carries it.

use serde::{Deserialize, Serialize};

/// The simulated sweep of allocator settings for a trace that ran out of memory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WhatIfSummary {
    /// Whether the simulation reproduced the trace under its own settings.
    pub faithful: bool,
    /// Settings simulated, the baseline included.
    pub scenarios: usize,
    /// The trace's own settings.
    pub baseline: ScenarioBrief,
    /// The best setting of the sweep.
    pub best: ScenarioBrief,
    /// The sentence.
    pub recommendation: String,
}

/// One simulated setting, briefly.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ScenarioBrief {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    /// Whether a request failed.
    pub oom: bool,
    /// The first failing request's size.
    pub first_oom_requested: Option<u64>,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// `num_alloc_retries`.
    pub num_alloc_retries: u64,
}

/// The fix the simulation computed, for the OOMs of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputedFix {
    /// The device simulated: the fix is that of its OOMs.
    pub device: i16,
    /// The sentence of the sweep (under the allowed bytes, when the first OOM had some).
    pub sentence: String,
    /// The allowed bytes it ran under.
    pub allowed: Option<u64>,
    /// The baseline and the best setting.
    pub whatif: WhatIfSummary,
}
