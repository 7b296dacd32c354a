//! The point of one OOM in three parts, the same wherever it is shown (the demo's last lines, the
//! report's headline and cards): the headline (the verdict and the request), free in all against
//! the largest free piece (the two numbers that make a fragmentation OOM), and the fix as a
//! command to copy where the fix is a setting (`export ...`), else its first clause.

use crate::analysis::summary::OomSummary;
use crate::analysis::{largest_allocatable, Verdict};
use crate::units::human_bytes;

/// "Fragmentation OOM" / "True OOM" / ..., with the driver level named where it applies.
pub fn headline(o: &OomSummary) -> String {
    let what = match o.verdict {
        Verdict::Fragmentation if driver_level(o) => "Fragmentation OOM at the driver level",
        Verdict::Fragmentation => "Fragmentation OOM",
        Verdict::TrueOom => "True OOM",
        Verdict::AllowedLimit => "OOM at the allocator's limit",
        Verdict::SharingLimit => "OOM at a sharing layer's limit (MPS, a quota)",
        Verdict::Inconclusive => "OOM, cause not traced",
    };
    format!("{what}: {} requested", human_bytes(o.requested))
}

/// Whether the failed request went to the driver with no caching allocator in between (sub-2 MiB
/// allocations packed into shared pages).
fn driver_level(o: &OomSummary) -> bool {
    o.framework.is_none() && o.map.page_stranded > 0
}

/// Free in all and the largest free piece one request could get, at the failure: inside the
/// caching allocator, its free blocks (stranded and releasable) plus the device's free memory;
/// at the driver level, the device's free memory plus the free halves of shared 2 MiB pages.
pub fn free_pieces(o: &OomSummary) -> (u64, u64) {
    let device = if o.device_free_known { o.device_free } else { 0 };
    if driver_level(o) {
        (device + o.map.page_stranded, largest_allocatable(0, device, o.map.releasable))
    } else {
        (device + o.map.stranded + o.map.releasable, largest_allocatable(o.map.largest_free_block, device, o.map.releasable))
    }
}

/// The fix as one command to copy, where it is a setting of the allocator.
pub fn fix_command(o: &OomSummary) -> Option<String> {
    let kind = match o.verdict {
        Verdict::Fragmentation => Some(crate::alloc::OomKind::Fragmentation),
        Verdict::TrueOom => Some(crate::alloc::OomKind::TrueOom),
        _ => None,
    };
    if let Some(cmd) = o.framework.zip(kind).and_then(|(f, k)| f.model().fix_command(k)) {
        return Some(cmd.into());
    }
    o.fix
        .starts_with("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        .then(|| "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into())
}

/// The fix's first clause (up to its first `:` or `;`), for where there is no command.
pub fn fix_short(o: &OomSummary) -> String {
    o.fix.split([':', ';']).next().unwrap_or(&o.fix).trim().to_string()
}

/// The fix in one line (`top`): the simulation's sentence where it computed one
/// (crate::sim::verdict, "With expandable_segments:True this run peaks at ..."), else the
/// fix's first clause.
pub fn fix_line(o: &OomSummary) -> String {
    match o.fix.find(" (simulated over ") {
        Some(end) => o.fix[..end].to_string(),
        None => fix_short(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag() -> OomSummary {
        let mut o: OomSummary = serde_json::from_value(serde_json::json!({
            "device": 0, "pid": 7, "ts_ns": 0, "requested": 2_684_354_560u64, "device_free": 2_398_224_384u64,
            "device_free_known": true, "stranded": 2_097_152_000u64, "releasable": 0, "largest_free_block": 209_715_200,
            "reserved": 10_485_760_000u64, "allocated": 8_388_608_000u64, "rc": 2, "op": "cuMemAlloc", "page_stranded": 0,
            "verdict": "fragmentation", "explanation": "", "fix": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that ...",
            "driver_failures_before": 0, "framework": "pytorch"
        }))
        .expect("an OomSummary");
        o.framework = Some(crate::alloc::Framework::PYTORCH);
        o
    }

    /// frag_oom.pickle's OOM (docs/metrics.md's worked example): 4.18 GiB free in all, the
    /// largest piece the device's 2.23 GiB less the driver's 4 MiB slack.
    #[test]
    fn the_worked_example_reads_free_in_all_against_the_largest_piece() {
        let o = frag();
        assert_eq!(free_pieces(&o), (2_398_224_384 + 2_097_152_000, 2_398_224_384 - (4 << 20)));
        assert_eq!(headline(&o), "Fragmentation OOM: 2.50 GiB requested");
        assert_eq!(fix_command(&o).as_deref(), Some("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    }

    #[test]
    fn a_driver_level_oom_counts_half_used_pages_and_has_no_command() {
        let mib = 1u64 << 20;
        let o = OomSummary {
            framework: None,
            requested: 2 * mib,
            device_free: 5 * mib,
            map: crate::map::Figures { stranded: 0, largest_free_block: 0, page_stranded: 900 * mib, ..frag().map },
            fix: "pool the small allocations: a caching allocator ...; or ...".into(),
            ..frag()
        };
        assert_eq!(free_pieces(&o), (905 * mib, mib));
        assert_eq!(headline(&o), "Fragmentation OOM at the driver level: 2.00 MiB requested");
        assert_eq!(fix_command(&o), None);
        assert_eq!(fix_short(&o), "pool the small allocations");
        assert_eq!(fix_line(&o), "pool the small allocations");
        let computed = OomSummary {
            fix: "With expandable_segments:True this run peaks at 10.31 GiB reserved and the 2.50 GiB request that fails under PyTorch's defaults fits. (simulated over 12 allocator settings: gpufrag whatif FILE)".into(),
            ..frag()
        };
        assert_eq!(
            fix_line(&computed),
            "With expandable_segments:True this run peaks at 10.31 GiB reserved and the 2.50 GiB request that fails under PyTorch's defaults fits."
        );
    }
}
