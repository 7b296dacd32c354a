//! Turns address maps into the figures of docs/metrics.md (the facts behind them: docs/design.md)
//! and failed allocations into verdicts.
//!
//! The figures themselves are kept incrementally by the map ([`crate::map::Figures`]); this module
//! adds what needs the device's view (device free, largest allocatable, fragmentation), the OOM
//! verdict with the numbers that prove it and the fix, the size distributions, and the
//! [`summary::Summary`] that `analyze --json`, `run` and `attach` all write.

pub mod render;
pub mod sharing;
pub mod summary;

use crate::alloc::Framework;
use crate::units::human_bytes;

/// What the driver keeps back from the largest single request: measured on the H200, the largest
/// request that succeeds is about `free − 4 MiB`.
pub const DRIVER_SLACK: u64 = 4 << 20;

/// `max(largest free block, device free − slack + releasable)`: what one request can get now.
pub fn largest_allocatable(largest_free_block: u64, device_free: u64, releasable: u64) -> u64 {
    largest_free_block.max(device_free.saturating_sub(DRIVER_SLACK).saturating_add(releasable))
}

/// `1 − largest allocatable / (device free + stranded + releasable)`: the share of free memory no
/// single request can use; 0 when nothing is free.
pub fn fragmentation(largest_free_block: u64, device_free: u64, stranded: u64, releasable: u64) -> f64 {
    let free = device_free as f64 + stranded as f64 + releasable as f64;
    if free <= 0.0 {
        return 0.0;
    }
    let one = largest_allocatable(largest_free_block, device_free, releasable) as f64;
    (1.0 - one / free).clamp(0.0, 1.0)
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// More was asked than is free in total, counting the cache: only less demand helps.
    TrueOom,
    /// Enough is free in total, but no single run holds the request.
    Fragmentation,
    /// By the traced figures the request should have fit: the cause lies outside what was traced
    /// (another process, a driver limit, or lost events).
    Inconclusive,
    /// A limit inside the allocator refused the request while the device may have had room:
    /// PyTorch's `set_per_process_memory_fraction` caps what its caching allocator may reserve
    /// (the allowed bytes), and the allocator refuses a segment that would pass the cap without
    /// asking the driver.
    AllowedLimit,
    /// A sharing layer's limit refused the request (MPS's pinned memory limit, a preload quota
    /// such as HAMi-core's: `crate::limits`): the process passed its share, not the device.
    SharingLimit,
}

impl Verdict {
    /// Every verdict, in the order exported counts list them ([`Verdict::index`]).
    pub const ALL: [Verdict; 5] =
        [Verdict::TrueOom, Verdict::Fragmentation, Verdict::Inconclusive, Verdict::AllowedLimit, Verdict::SharingLimit];

    /// This verdict's place in [`Verdict::ALL`].
    pub fn index(self) -> usize {
        match self {
            Verdict::TrueOom => 0,
            Verdict::Fragmentation => 1,
            Verdict::Inconclusive => 2,
            Verdict::AllowedLimit => 3,
            Verdict::SharingLimit => 4,
        }
    }

    /// The JSON / display name.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::TrueOom => "true_oom",
            Verdict::Fragmentation => "fragmentation",
            Verdict::Inconclusive => "inconclusive",
            Verdict::AllowedLimit => "allowed_limit",
            Verdict::SharingLimit => "sharing_limit",
        }
    }
}

/// The numbers an OOM verdict compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomInputs {
    /// Bytes requested.
    pub requested: u64,
    /// Device free at the failure (0 when unknown).
    pub device_free: u64,
    /// Whether `device_free` was measured: without it no verdict but `inconclusive` is given
    /// (0 free would make a true OOM of anything the cache cannot hold).
    pub device_free_known: bool,
    /// Stranded bytes in the process's segments.
    pub stranded: u64,
    /// Releasable bytes in the process's cache.
    pub releasable: u64,
    /// The largest free run inside one segment.
    pub largest_free_block: u64,
    /// Whether a caching allocator was seen (the fix names its setting).
    pub framework: bool,
    /// Which one, when known: the explanation and the fixes are in its terms. For XLA's BFC
    /// allocator the device's free memory is not counted: the pool is capped by its limit
    /// (`XLA_PYTHON_CLIENT_MEM_FRACTION` of the card, all of it preallocated by default), so what
    /// lies outside it cannot serve the request.
    pub allocator: Option<Framework>,
    /// Free bytes in 2 MiB driver pages held by live sub-2 MiB driver allocations: usable by
    /// small requests only (the driver-level fragmentation of a process without a caching
    /// allocator).
    pub page_stranded: u64,
    /// The allocator's allowed bytes (`set_per_process_memory_fraction`), when its OOM report
    /// carried them.
    pub allowed: Option<u64>,
    /// The allocator refused without asking the driver: its own OOM path reported the failure in
    /// a capture that traces the driver calls, and no driver call failed before it.
    pub allocator_refused: bool,
    /// The allocator's reserved bytes at the failure (its own figure when it reported one).
    pub reserved: u64,
    /// The device's total bytes (`cuMemGetInfo`), when known: what a memory fraction multiplies.
    pub device_total: Option<u64>,
    /// What was missing from the process's trace at the failure (`crate::ingest::partial`): the
    /// figures above are lower bounds and the verdict is `inconclusive`.
    pub partial: Option<crate::ingest::Partial>,
}

/// `n` rounded up to whole 2 MiB driver pages: what a driver allocation that no partly used page
/// can hold takes from the device.
fn driver_pages(n: u64) -> u64 {
    n.div_ceil(crate::alloc::pytorch::DRIVER_PAGE).saturating_mul(crate::alloc::pytorch::DRIVER_PAGE)
}

impl OomInputs {
    /// The numbers of a recorded failure: its request, the device free bytes it saw (0 when
    /// unknown, and not counted for XLA's pool), its process's figures at that moment, and the
    /// allocator that failed.
    pub fn of(o: &crate::ingest::OomRecord) -> OomInputs {
        let pool_only = o.framework.is_some_and(|f| !f.model().counts_device_free());
        OomInputs {
            requested: o.requested,
            device_free: if pool_only { 0 } else { o.device_free.unwrap_or(0) },
            device_free_known: o.device_free.is_some() || pool_only,
            stranded: o.figures.stranded,
            releasable: o.figures.releasable,
            largest_free_block: o.figures.largest_free_block,
            framework: o.figures.framework_seen,
            allocator: o.framework,
            page_stranded: o.figures.page_stranded,
            allowed: o.allowed,
            allocator_refused: o.allocator_oom && o.op == Some(crate::event::EventKind::BlockAlloc) && o.driver_failures_before == 0,
            reserved: o.allocator_reserved.unwrap_or(o.figures.reserved),
            device_total: o.device_total,
            partial: o.partial,
        }
    }

    /// The verdict as an allocator words it (`crate::alloc::OomKind`).
    fn oom_kind(&self) -> crate::alloc::OomKind {
        match self.verdict() {
            Verdict::TrueOom => crate::alloc::OomKind::TrueOom,
            Verdict::Fragmentation => crate::alloc::OomKind::Fragmentation,
            Verdict::Inconclusive | Verdict::AllowedLimit | Verdict::SharingLimit => crate::alloc::OomKind::Inconclusive,
        }
    }

    /// The failure's figures as an allocator's model reads them.
    fn oom_figures(&self) -> crate::alloc::OomFigures {
        crate::alloc::OomFigures {
            requested: self.requested,
            device_free: self.device_free,
            stranded: self.stranded,
            releasable: self.releasable,
            largest_free_block: self.largest_free_block,
        }
    }

    /// A process without a caching allocator: its failure is the driver's, in 2 MiB pages.
    fn driver_level(&self) -> bool {
        !self.framework && self.allocator.is_none()
    }

    /// What a request needs from the device in new pages: at the driver level, whole 2 MiB pages.
    fn need(&self) -> u64 {
        if self.driver_level() {
            driver_pages(self.requested)
        } else {
            self.requested
        }
    }

    /// The request passed the allocator's allowed bytes: `Some(allowed)` when they are known,
    /// `Some(None)` when only the allocator's refusal without a driver call shows it.
    fn allowed_limit(&self) -> Option<Option<u64>> {
        if self.allocator.is_some_and(|f| !f.model().has_allowed_limit()) {
            return None;
        }
        match self.allowed {
            Some(a) if self.reserved.saturating_add(self.requested) > a => Some(Some(a)),
            Some(_) => None,
            None => self.allocator_refused.then_some(None),
        }
    }

    /// The verdict: `true_oom` when the request exceeds device free + stranded + releasable,
    /// `fragmentation` when that sum covers it but no single run does; `inconclusive` when the
    /// traced figures say it should have fit, or device free was not measured.
    pub fn verdict(&self) -> Verdict {
        if self.allowed_limit().is_some() {
            return Verdict::AllowedLimit;
        }
        // From half the facts no sure verdict: what the trace missed may be the stranded bytes.
        if !self.device_free_known || self.partial.is_some() {
            return Verdict::Inconclusive;
        }
        if self.driver_level() {
            // The driver hands out 2 MiB pages: a request no partly used page can hold needs
            // whole new pages, and the free bytes in partly used pages serve small requests only.
            let one = largest_allocatable(0, self.device_free, self.releasable);
            return if self.need() <= one {
                Verdict::Inconclusive
            } else if self.page_stranded > 0
                && self.requested <= self.device_free.saturating_add(self.releasable).saturating_add(self.page_stranded)
            {
                Verdict::Fragmentation
            } else {
                Verdict::TrueOom
            };
        }
        let total = self.device_free.saturating_add(self.stranded).saturating_add(self.releasable);
        if self.requested > total {
            Verdict::TrueOom
        } else if self.requested > largest_allocatable(self.largest_free_block, self.device_free, self.releasable) {
            Verdict::Fragmentation
        } else {
            Verdict::Inconclusive
        }
    }

    /// The verdict in plain words, with the numbers.
    pub fn explanation(&self) -> String {
        let total = self.device_free.saturating_add(self.stranded).saturating_add(self.releasable);
        let h = human_bytes;
        if let (Some(p), None) = (self.partial, self.allowed_limit()) {
            return self.partial_explanation(p);
        }
        if let Some(words) = self.allocator.and_then(|f| f.model().oom_explanation(self.oom_kind(), &self.oom_figures())) {
            return words;
        }
        if let Some(limit) = self.allowed_limit() {
            return self.allowed_explanation(limit);
        }
        if self.driver_level() && self.verdict() != Verdict::Inconclusive {
            return self.driver_explanation();
        }
        match self.verdict() {
            // A sharing layer's limit is judged by crate::analysis::sharing, never here.
            Verdict::AllowedLimit | Verdict::SharingLimit => unreachable_verdict(),
            Verdict::TrueOom => format!(
                "true OOM: {} requested, but only {} is free in all (device free {} + stranded {} + releasable {})",
                h(self.requested), h(total), h(self.device_free), h(self.stranded), h(self.releasable)
            ),
            Verdict::Fragmentation => format!(
                "fragmentation OOM: {} requested and {} is free in all (device free {} + stranded {} + releasable {}), but the largest free block is {} and the device can hand out at most {} in one piece",
                h(self.requested), h(total), h(self.device_free), h(self.stranded), h(self.releasable),
                h(self.largest_free_block),
                h(largest_allocatable(0, self.device_free, self.releasable))
            ),
            Verdict::Inconclusive if !self.device_free_known => format!(
                "inconclusive: {} requested, but the device's free memory at the failure was not measured (no reading by the process near it and no NVML), so true OOM and fragmentation cannot be told apart (stranded {}, releasable {}, largest free block {})",
                h(self.requested), h(self.stranded), h(self.releasable), h(self.largest_free_block)
            ),
            Verdict::Inconclusive => format!(
                "inconclusive: {} requested, and by the traced figures one piece of {} could be had (largest free block {}, device free {}); the failure comes from outside what was traced",
                h(self.requested), h(largest_allocatable(self.largest_free_block, self.device_free, self.releasable)),
                h(self.largest_free_block), h(self.device_free)
            ),
        }
    }

    /// A verdict from partial facts in words: what is missing, and the driver-level figures (the
    /// request, what the device had free, what the process held as traced), the block-level ones
    /// as the lower bounds they are.
    fn partial_explanation(&self, p: crate::ingest::Partial) -> String {
        let h = human_bytes;
        let free = if self.device_free_known { h(self.device_free) } else { "not measured".to_string() };
        format!(
            "inconclusive: {}, so true OOM and fragmentation cannot be told apart. At the driver level: {} requested, device free {free}, {} reserved by the process as traced; in its traced segments at least {} stranded, {} releasable, a largest free block of at least {}",
            p.missing(),
            h(self.requested),
            h(self.reserved),
            h(self.stranded),
            h(self.releasable),
            h(self.largest_free_block)
        )
    }

    /// The allowed-limit verdict in words: exact when the allowed bytes are known, else what the
    /// allocator's refusal without a driver call shows.
    fn allowed_explanation(&self, limit: Option<u64>) -> String {
        let h = human_bytes;
        let room = if self.device_free_known { format!(", while the device had {} free", h(self.device_free)) } else { String::new() };
        match limit {
            Some(a) => format!(
                "allowed limit: PyTorch's caching allocator may reserve at most {} (set_per_process_memory_fraction{}); it held {} reserved and the {} it needed more would make {}, {} over the allowed bytes{}: the allocator refused without asking the driver",
                h(a),
                self.device_total.filter(|&t| t > 0).map_or(String::new(), |t| format!(": {:.4} of the device's {}", a as f64 / t as f64, h(t))),
                h(self.reserved),
                h(self.requested),
                // Checked: input sizes near 2^64 wrapped here ("would make 3917296640.00 GiB" from
                // larger parts, found by the record fuzz target); a sum past 2^64 saturates.
                h(self.reserved.saturating_add(self.requested)),
                h(self.reserved.saturating_add(self.requested).saturating_sub(a)),
                room
            ),
            None => format!(
                "allowed limit: PyTorch's caching allocator refused {} without asking the driver (no driver call failed{}): a limit inside the allocator refused it, the allowed bytes of set_per_process_memory_fraction, which reserved {} + the {} requested exceed (PyTorch's message says \"N GiB allowed\")",
                h(self.requested),
                room,
                h(self.reserved),
                h(self.requested)
            ),
        }
    }

    /// The sums the explanation prints, worked out in 128 bits and capped at 2^64 − 1 as the
    /// explanation caps them: (reserved + requested, the bytes over the allowed limit). The fuzz
    /// targets check that the explanation shows exactly these.
    pub fn allowed_sums(&self) -> (u64, u64) {
        let sum = (self.reserved as u128 + self.requested as u128).min(u64::MAX as u128) as u64;
        (sum, sum.saturating_sub(self.allowed.unwrap_or(0)))
    }

    /// A driver-level verdict (no caching allocator) in words, in 2 MiB pages.
    fn driver_explanation(&self) -> String {
        let h = human_bytes;
        let one = largest_allocatable(0, self.device_free, self.releasable);
        match self.verdict() {
            Verdict::Fragmentation => format!(
                "fragmentation OOM at the driver level: {} requested needs {} of new 2 MiB pages, but the device can hand out at most {} in new pages (device free {}, less the driver's {} slack); {} page-stranded bytes sit free in partly used 2 MiB pages (the driver packs sub-2 MiB allocations into shared 2 MiB pages), and no request of 2 MiB or more can use them",
                h(self.requested), h(self.need()), h(one), h(self.device_free), h(DRIVER_SLACK), h(self.page_stranded)
            ),
            _ => format!(
                "true OOM: {} requested needs {} of new 2 MiB pages, but only {} is free on the device (less the driver's {} slack: {} in one piece){}",
                h(self.requested),
                h(self.need()),
                h(self.device_free),
                h(DRIVER_SLACK),
                h(one),
                if self.page_stranded > 0 { format!("; {} page-stranded in partly used pages would not cover it either", h(self.page_stranded)) } else { String::new() }
            ),
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> String {
        let h = human_bytes;
        if let Some(limit) = self.allowed_limit() {
            // The same capped sum the explanation prints (a record's sizes are its own to claim).
            let need = self.allowed_sums().0;
            return match (limit, self.device_total.filter(|&t| t > 0)) {
                (Some(a), Some(t)) => format!(
                    "raise the cap: torch.cuda.set_per_process_memory_fraction({:.4}) or more allows the {} this request needs ({} now: {:.4}); or make the run fit under the allowed {} (gpufrag whatif FILE --memory-limit {a} simulates the allocator settings under this cap)",
                    (need as f64 / t as f64).min(1.0) + 0.00005, h(need), h(a), a as f64 / t as f64, h(a)
                ),
                (Some(a), None) => format!(
                    "raise the cap given to torch.cuda.set_per_process_memory_fraction so that it allows at least {} (now {}); or make the run fit under it (gpufrag whatif FILE --memory-limit {a})",
                    h(need), h(a)
                ),
                (None, _) => format!(
                    "raise torch.cuda.set_per_process_memory_fraction so that it allows at least {} (reserved + the request), or remove the cap; gpufrag run reads the allowed bytes exactly (PyTorch's OOM observer)",
                    h(need)
                ),
            };
        }
        if self.partial.is_some() {
            return "trace the process from its start: run it under gpufrag run, or have gpufrag agent running before it starts (its exec hold keeps a new process until its probes are in) and nothing dropped; then its verdict rests on every block it allocated".to_string();
        }
        match self.allocator.and_then(|f| f.model().oom_fix(self.oom_kind(), &self.oom_figures())) {
            Some(fix) => fix,
            None => self.fix_pytorch_or_driver(),
        }
    }

    fn fix_pytorch_or_driver(&self) -> String {
        let h = human_bytes;
        let release = if self.releasable > 0 {
            format!("; releasing the cache (torch.cuda.empty_cache()) would have returned {}", h(self.releasable))
        } else {
            "; releasing the cache would have returned nothing (no cached segment is empty)".to_string()
        };
        match (self.verdict(), self.framework) {
            (Verdict::Fragmentation, true) => format!(
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that free space in one segment can grow into the next ({} stranded in split segments would become usable); or cap splitting with max_split_size_mb, or call torch.cuda.empty_cache() at a phase change{}",
                h(self.stranded), release
            ),
            (Verdict::Fragmentation, false) => format!(
                "pool the small allocations: a caching allocator (PyTorch's, CuPy's memory pool, or your own slab) carves sub-2 MiB requests out of segments it keeps, so freed pieces serve later requests instead of leaving {} stranded in half-used 2 MiB pages (with PyTorch, expandable_segments:True maps its segments in whole pages); or allocate the large buffers first, before small allocations pin pages around them{}",
                h(self.page_stranded), release
            ),
            (Verdict::AllowedLimit | Verdict::SharingLimit, _) => unreachable_verdict(),
            (Verdict::TrueOom, _) if self.driver_level() => format!(
                "the request is larger than what the device has left in new 2 MiB pages (short by {}): free device memory (other processes, or this one's own allocations), or move work to another device",
                h(self.need().saturating_sub(largest_allocatable(0, self.device_free, self.releasable)))
            ),
            (Verdict::TrueOom, _) => format!(
                "the request is larger than all free memory: reduce the batch or sequence length, use activation checkpointing, or move work to another device (short by {}){}",
                h(self.requested.saturating_sub(self.device_free + self.stranded + self.releasable)),
                release
            ),
            (Verdict::Inconclusive, _) if !self.device_free_known => "make NVML reachable to the tracer (libnvidia-ml.so.1), or have the allocator report its device free (include/gpufrag_annotate.h)".to_string(),
            (Verdict::Inconclusive, _) => "check other processes on the device (nvidia-smi) and whether events were dropped".to_string(),
        }
    }
}

/// The allowed-limit verdict is explained and fixed before the other verdicts are matched.
fn unreachable_verdict() -> String {
    String::from("allowed limit")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag_oom() -> OomInputs {
        OomInputs {
            requested: 2_684_354_560,
            device_free: 2_398_224_384,
            device_free_known: true,
            stranded: 2_097_152_000,
            releasable: 0,
            largest_free_block: 209_715_200,
            framework: true,
            allocator: Some(Framework::PYTORCH),
            page_stranded: 0,
            allowed: None,
            allocator_refused: false,
            reserved: 10_485_760_000,
            device_total: None,
            partial: None,
        }
    }

    /// Issue 22 item 6: frag_oom's figures with the process not traced from its start (or with
    /// events dropped) are no fragmentation OOM: `inconclusive`, naming what is missing, with the
    /// driver-level figures; a true OOM's figures the same (the missing part may hold the cache).
    #[test]
    fn a_verdict_from_partial_facts_is_inconclusive_and_names_what_is_missing() {
        use crate::ingest::Partial;
        assert_eq!(frag_oom().verdict(), Verdict::Fragmentation);
        for (p, words) in [(Partial::NotFromStart, "not traced from its start"), (Partial::Dropped(7), "dropped 7 event(s)")] {
            let o = OomInputs { partial: Some(p), ..frag_oom() };
            assert_eq!(o.verdict(), Verdict::Inconclusive, "{p:?}");
            let e = o.explanation();
            assert!(e.starts_with("inconclusive: ") && e.contains(words), "{e}");
            assert!(e.contains("2.50 GiB requested, device free 2.23 GiB, 9.77 GiB reserved"), "the driver-level figures: {e}");
            assert!(o.fix().starts_with("trace the process from its start"), "{}", o.fix());
            let t = OomInputs { requested: 5 << 30, partial: Some(p), ..frag_oom() };
            assert_eq!(t.verdict(), Verdict::Inconclusive, "a true OOM's figures from half the facts: {p:?}");
        }
        // The allocator's own cap, reported by PyTorch with its allowed bytes, stays what it is.
        let capped = OomInputs { allowed: Some(1 << 30), partial: Some(Partial::NotFromStart), ..frag_oom() };
        assert_eq!(capped.verdict(), Verdict::AllowedLimit);
    }

    #[test]
    fn xla_fragmentation_names_jaxs_settings_and_ignores_device_free() {
        let mib = 1u64 << 20;
        let o = OomInputs {
            requested: 20 * mib,
            device_free: 0,
            device_free_known: true,
            stranded: 25 * mib,
            releasable: 0,
            largest_free_block: 17 * mib,
            framework: true,
            allocator: Some(Framework::XLA),
            ..frag_oom()
        };
        assert_eq!(o.verdict(), Verdict::Fragmentation);
        let fix = o.fix();
        for want in ["XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR=platform"] {
            assert!(fix.contains(want), "{fix}");
        }
        assert!(o.explanation().contains("largest free chunk is 17.00 MiB"), "{}", o.explanation());
        let c = OomInputs { allocator: Some(Framework::CUPY), releasable: 8 * mib, ..o };
        assert!(c.fix().contains("free_all_blocks") && c.fix().contains("set_limit"), "{}", c.fix());
    }

    #[test]
    fn frag_oom_is_a_fragmentation_oom_and_names_expandable_segments() {
        let o = frag_oom();
        assert_eq!(o.verdict(), Verdict::Fragmentation);
        assert!(o.fix().contains("expandable_segments:True"), "{}", o.fix());
        assert!(o.explanation().contains("2.50 GiB requested"), "{}", o.explanation());
        let f = fragmentation(o.largest_free_block, o.device_free, o.stranded, o.releasable);
        assert!((f - 0.4674).abs() < 0.001, "fragmentation {f}");
    }

    #[test]
    fn more_than_everything_free_is_a_true_oom() {
        let o = OomInputs { requested: 5 << 30, ..frag_oom() };
        assert_eq!(o.verdict(), Verdict::TrueOom);
    }

    #[test]
    fn a_request_that_fits_is_inconclusive() {
        let o = OomInputs { requested: 100 << 20, ..frag_oom() };
        assert_eq!(o.verdict(), Verdict::Inconclusive);
    }

    #[test]
    fn an_unmeasured_device_free_gives_no_verdict_but_inconclusive() {
        let o = OomInputs { device_free: 0, device_free_known: false, ..frag_oom() };
        assert_eq!(o.verdict(), Verdict::Inconclusive);
        assert!(o.explanation().contains("not measured"), "{}", o.explanation());
        let o = OomInputs { requested: 50 << 30, device_free_known: false, ..frag_oom() };
        assert_eq!(o.verdict(), Verdict::Inconclusive, "not a true OOM by a free figure of 0 that nobody measured");
    }

    /// Issue 13: a capped program (PyTorch: "... 16.00 GiB allowed") got `inconclusive` with
    /// 132 GB free. With the allowed bytes known, the verdict is the cap, and its numbers are
    /// reserved + requested against them.
    #[test]
    fn regression_a_request_over_the_allowed_bytes_is_an_allowed_limit_verdict() {
        let gib = 1u64 << 30;
        let total = 150_109_880_320u64;
        let allowed = (0.1144 * total as f64) as u64;
        let o = OomInputs {
            requested: 20 * gib,
            device_free: 132_000_000_000,
            reserved: 2 * gib,
            allowed: Some(allowed),
            device_total: Some(total),
            stranded: 0,
            largest_free_block: 0,
            ..frag_oom()
        };
        assert_eq!(o.verdict(), Verdict::AllowedLimit);
        let why = o.explanation();
        assert!(why.contains(&format!("at most {}", human_bytes(allowed))), "{why}");
        assert!(why.contains(&format!("{} over the allowed bytes", human_bytes(22 * gib - allowed))), "{why}");
        let fix = o.fix();
        let f = (22 * gib) as f64 / total as f64;
        assert!(fix.contains(&format!("set_per_process_memory_fraction({:.4})", f + 0.00005)), "{fix}");
        // Under the allowed bytes the cap did not refuse it: the figures decide.
        let under = OomInputs { requested: gib, ..o };
        assert_ne!(under.verdict(), Verdict::AllowedLimit);
        // The allocator's refusal without a driver call, the allowed bytes unseen (eBPF).
        let seen = OomInputs { allowed: None, allocator_refused: true, ..o };
        assert_eq!(seen.verdict(), Verdict::AllowedLimit);
        assert!(seen.explanation().contains("without asking the driver"), "{}", seen.explanation());
        // XLA's and CuPy's pools are not PyTorch's cap.
        assert_ne!(OomInputs { allocator: Some(Framework::XLA), ..seen }.verdict(), Verdict::AllowedLimit);
    }

    /// Issue 13: at the driver level (no caching allocator), sub-2 MiB allocations strand 2 MiB
    /// pages; a 2 MiB request the device cannot give in new pages, with enough free in partly
    /// used ones, is a driver-level fragmentation verdict naming the page-stranded bytes.
    #[test]
    fn regression_small_pages_make_a_driver_level_fragmentation_verdict() {
        let mib = 1u64 << 20;
        let driver = OomInputs {
            framework: false,
            allocator: None,
            stranded: 0,
            releasable: 0,
            largest_free_block: 0,
            reserved: 714 * mib,
            ..frag_oom()
        };
        let o = OomInputs { requested: 2 * mib, device_free: 5 * mib, page_stranded: 714 * mib, ..driver };
        assert_eq!(o.verdict(), Verdict::Fragmentation);
        assert!(o.explanation().contains("714.00 MiB page-stranded"), "{}", o.explanation());
        assert!(o.fix().contains("pool the small allocations"), "{}", o.fix());
        // The device full (5 MiB free, the driver's 4 MiB slack, no partly used page): a 1 MiB
        // request needs a whole new page and gets none: a true OOM, not inconclusive.
        let full = OomInputs { requested: mib, device_free: 5 * mib, page_stranded: 0, ..driver };
        assert_eq!(full.verdict(), Verdict::TrueOom, "{}", full.explanation());
        // New pages would hold it: the cause lies elsewhere.
        let fits = OomInputs { requested: 2 * mib, device_free: 64 * mib, page_stranded: 714 * mib, ..driver };
        assert_eq!(fits.verdict(), Verdict::Inconclusive);
        // More than the device and the half pages together: a true OOM.
        let big = OomInputs { requested: 1 << 30, device_free: 5 * mib, page_stranded: 714 * mib, ..driver };
        assert_eq!(big.verdict(), Verdict::TrueOom);
    }

    #[test]
    fn nothing_free_means_no_fragmentation() {
        assert_eq!(fragmentation(0, 0, 0, 0), 0.0);
        assert_eq!(fragmentation(0, 1 << 30, 0, 0), 1.0 - ((1u64 << 30) - DRIVER_SLACK) as f64 / (1u64 << 30) as f64);
    }

    /// Issue 23: the record fuzz target found "would make 3917296640.00 GiB" printed from a
    /// reserved and a request whose sum passes 2^64 (it wrapped in release builds).
    #[test]
    fn regression_allowed_limit_sums_near_two_to_the_64_never_wrap() {
        let o = OomInputs {
            requested: u64::MAX - 1000,
            reserved: 1 << 40,
            allowed: Some(1 << 30),
            device_free: u64::MAX / 2,
            device_free_known: true,
            stranded: u64::MAX / 2,
            releasable: u64::MAX / 2,
            allocator: None,
            allocator_refused: false,
            ..frag_oom()
        };
        assert_eq!(o.verdict(), Verdict::AllowedLimit);
        let e = o.explanation();
        let (sum, over) = o.allowed_sums();
        assert_eq!((sum, over), (u64::MAX, u64::MAX - (1 << 30)));
        assert!(e.contains(&format!("would make {}, {} over", human_bytes(sum), human_bytes(over))), "{e}");
        assert!(!e.contains("3917296640"), "{e}");
        // The sums of the other verdicts saturate too (no panic in debug builds).
        let t = OomInputs { allowed: None, ..o };
        let _ = (t.verdict(), t.explanation());
        let d = OomInputs { framework: false, ..t };
        let _ = (d.verdict(), d.explanation());
    }
}
