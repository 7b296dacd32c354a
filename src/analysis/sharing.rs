//! An OOM's verdict and words on a shared GPU: the allocator-level verdict of
//! [`OomInputs`](super::OomInputs), unless the process passed its sharing layer's limit
//! (`crate::limits`: then `sharing_limit`, judged against the limit, never a true OOM of the
//! device), with who else held the device (`crate::ingest::holders`) added to the explanation and,
//! when the memory was missing, to the fix.

use super::{OomInputs, Verdict};
use crate::ingest::OomRecord;
use crate::limits::LimitHit;

/// The limit `o` is judged against, judged with the OOM's final figures (a MIG instance's
/// device free may arrive after the failure was applied: `crate::limits::LimitHit::judge_oom`).
pub fn limit(o: &OomRecord) -> Option<LimitHit> {
    o.shared.limit.as_ref().map(|l| LimitHit::judge_oom(&l.limit, o.figures.reserved, o.device_free, o.requested))
}

/// The verdict of `o`.
pub fn verdict(o: &OomRecord) -> Verdict {
    match &limit(o) {
        Some(l) if l.hit() => Verdict::SharingLimit,
        _ => OomInputs::of(o).verdict(),
    }
}

/// The explanation of `o` (`inputs`: its numbers).
pub fn explanation(o: &OomRecord, inputs: &OomInputs) -> String {
    let base = match &limit(o) {
        Some(l) if l.hit() => l.explanation(),
        _ => inputs.explanation(),
    };
    o.shared.holders.explain(base)
}

/// The fix of `o`: the limit's, or the allocator's with the largest holder first when the
/// memory was missing (a true OOM).
pub fn fix(o: &OomRecord, inputs: &OomInputs) -> String {
    match &limit(o) {
        Some(l) if l.hit() => l.fix(),
        _ if inputs.verdict() == Verdict::TrueOom => o.shared.holders.fix(inputs.fix()),
        _ => inputs.fix(),
    }
}
