//! The settings people try after an OOM, and how whatif ranks them: a run that finishes beats
//! one that runs out of memory; among those that finish, the lower peak reserved wins; among
//! those that fail, the one that gets further wins. The recommendation is one sentence.

use super::Outcome;
use crate::units::human_bytes;

/// The sweep run when no `--alloc-conf` is given: PyTorch's defaults and the settings of
/// PyTorch's memory-management notes, alone and combined (12 scenarios).
pub fn sweep_confs() -> Vec<&'static str> {
    vec![
        "",
        "expandable_segments:True",
        "max_split_size_mb:512",
        "max_split_size_mb:256",
        "max_split_size_mb:128",
        "max_split_size_mb:64",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "garbage_collection_threshold:0.8",
        "max_split_size_mb:256,garbage_collection_threshold:0.6",
        "expandable_segments:True,roundup_power2_divisions:4",
        "expandable_segments:True,garbage_collection_threshold:0.8",
    ]
}

/// A scenario's place in the ranking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranked {
    /// Index into the outcomes.
    pub index: usize,
    /// 1 = best.
    pub rank: usize,
}

/// Ranks outcomes (the best first).
pub fn rank(outcomes: &[Outcome]) -> Vec<Ranked> {
    let mut idx: Vec<usize> = (0..outcomes.len()).collect();
    idx.sort_by_key(|&i| {
        let o = &outcomes[i];
        match &o.first_oom {
            None => (0u8, o.counters.peak_reserved, 0usize, i),
            Some(f) => (1u8, u64::MAX - f.request as u64, 0, i),
        }
    });
    idx.into_iter().enumerate().map(|(r, index)| Ranked { index, rank: r + 1 }).collect()
}

fn name(conf: &str) -> String {
    if conf.is_empty() {
        "PyTorch's defaults".to_string()
    } else {
        conf.to_string()
    }
}

/// The recommendation in one sentence; `outcomes[0]` is the baseline.
pub fn recommendation(outcomes: &[Outcome]) -> String {
    let Some(base) = outcomes.first() else { return String::new() };
    let ranked = rank(outcomes);
    let best = &outcomes[ranked[0].index];
    match (&base.first_oom, &best.first_oom) {
        (Some(b), None) => format!(
            "With {} this run peaks at {} reserved and the {} request that fails under {} fits.",
            name(&best.alloc_conf),
            human_bytes(best.counters.peak_reserved),
            human_bytes(b.oom.requested),
            name(&base.alloc_conf)
        ),
        (Some(b), Some(_)) => {
            let need = b.oom.allocated + b.oom.rounded;
            let limit = b.oom.reserved.max(base.memory_limit.unwrap_or(0));
            format!(
                "No setting tried avoids the OOM: at the failing request {} is allocated and {} more is asked for, a true OOM under this limit; save at least {} or give the run more memory.",
                human_bytes(b.oom.allocated),
                human_bytes(b.oom.rounded),
                human_bytes(need.saturating_sub(limit.min(need)).max(1))
            )
        }
        (None, _) if ranked[0].index == 0 => format!(
            "{} already gives the lowest peak ({} reserved); no setting tried does better.",
            name(&base.alloc_conf),
            human_bytes(base.counters.peak_reserved)
        ),
        (None, _) => format!(
            "With {} this run peaks at {} reserved, {} less than {} ({}).",
            name(&best.alloc_conf),
            human_bytes(best.counters.peak_reserved),
            human_bytes(base.counters.peak_reserved - best.counters.peak_reserved),
            name(&base.alloc_conf),
            human_bytes(base.counters.peak_reserved)
        ),
    }
}
