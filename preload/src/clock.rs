//! The shim's clock, decided once per process image (a fork child keeps it: same machine, same
//! counter; an exec'd image decides again): on x86_64 with an invariant TSC, raw TSC ticks read
//! after `lfence` (`gpufrag_wire::clock::ticks`, a few ns) unless `GPUFRAG_CLOCK=monotonic`;
//! otherwise `CLOCK_MONOTONIC` through the vDSO (20–32 ns a read). The hello says which
//! (`HELLO_F_TSC`); the consumer converts ticks to `CLOCK_MONOTONIC` ns after merging the lanes
//! (see `gpufrag_wire::clock`).
//!
//! Every event timestamp is a [`stamp`]. Intervals the shim keeps itself are either in stamps
//! too (the device-sampling period, converted from ms with a tick rate estimated on the sampling
//! path, never per event: [`stamps_for_ns`], refined by [`refine_rate`]) or in
//! `CLOCK_MONOTONIC_COARSE` ns (the driver-lookup retry), never a mix of the two.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gpufrag_wire::clock;

/// Events are stamped with TSC ticks.
static TSC: AtomicBool = AtomicBool::new(false);
/// Ticks and `CLOCK_MONOTONIC` ns when the clock was chosen: the baseline of the rate estimate.
static ORIGIN_TICKS: AtomicU64 = AtomicU64::new(0);
static ORIGIN_NS: AtomicU64 = AtomicU64::new(0);
/// Estimated ticks per ns × 2^16 (until measured: 4 GHz, so that a period comes out no shorter
/// than asked on any slower counter).
static RATE_Q16: AtomicU64 = AtomicU64::new(NOMINAL_RATE_Q16);
const NOMINAL_RATE_Q16: u64 = 4 << 16;
/// The least baseline the rate estimate is taken over.
const MIN_BASELINE_NS: u64 = 10_000_000;

/// Chooses the clock from `GPUFRAG_CLOCK` (`monotonic`, or anything else / unset: the TSC where
/// it is invariant) and the CPU; a line saying what was chosen, for the debug output.
pub fn init(setting: Option<&str>) -> &'static str {
    let wanted = !matches!(setting.map(str::trim), Some("monotonic"));
    let tsc = wanted && clock::invariant_tsc();
    ORIGIN_TICKS.store(clock::ticks(), Ordering::Relaxed);
    ORIGIN_NS.store(clock::monotonic_ns(), Ordering::Relaxed);
    RATE_Q16.store(NOMINAL_RATE_Q16, Ordering::Relaxed);
    TSC.store(tsc, Ordering::Relaxed);
    match (tsc, wanted) {
        (true, _) => "clock: TSC ticks (invariant TSC)",
        (false, true) => "clock: CLOCK_MONOTONIC (no invariant TSC)",
        (false, false) => "clock: CLOCK_MONOTONIC (GPUFRAG_CLOCK=monotonic)",
    }
}

/// Whether events are stamped with TSC ticks.
pub fn tsc() -> bool {
    TSC.load(Ordering::Relaxed)
}

/// An event timestamp: TSC ticks or `CLOCK_MONOTONIC` ns, as chosen at [`init`].
#[inline(always)]
pub fn stamp() -> u64 {
    if TSC.load(Ordering::Relaxed) {
        clock::ticks()
    } else {
        clock::monotonic_ns()
    }
}

/// `ns` nanoseconds in stamps (ticks at the estimated rate, or ns).
pub fn stamps_for_ns(ns: u64) -> u64 {
    if !tsc() {
        return ns;
    }
    let r = RATE_Q16.load(Ordering::Relaxed);
    ((u128::from(ns) * u128::from(r)) >> 16).min(u128::from(u64::MAX)) as u64
}

/// Re-estimates the tick rate from the baseline since [`init`] (once it is at least 10 ms long);
/// called on the sampling path only (one `clock_gettime`). Whether the estimate changed.
pub fn refine_rate() -> bool {
    if !tsc() {
        return false;
    }
    let (t, ns) = (clock::ticks(), clock::monotonic_ns());
    let dn = ns.saturating_sub(ORIGIN_NS.load(Ordering::Relaxed));
    let dt = t.saturating_sub(ORIGIN_TICKS.load(Ordering::Relaxed));
    if dn < MIN_BASELINE_NS || dt == 0 {
        return false;
    }
    let r = ((u128::from(dt) << 16) / u128::from(dn)).clamp(1, u128::from(u64::MAX)) as u64;
    RATE_Q16.swap(r, Ordering::Relaxed) != r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_when_asked() {
        init(Some("monotonic"));
        assert!(!tsc());
        assert_eq!(stamps_for_ns(123), 123);
        let (a, s, b) = (clock::monotonic_ns(), stamp(), clock::monotonic_ns());
        assert!(a <= s && s <= b);
        init(None);
        assert_eq!(tsc(), clock::invariant_tsc());
        if tsc() {
            std::thread::sleep(std::time::Duration::from_millis(15));
            refine_rate();
            let per_ms = stamps_for_ns(1_000_000);
            // Any counter from 100 MHz to 10 GHz.
            assert!((100_000..10_000_000).contains(&per_ms), "{per_ms} ticks per ms");
        }
        init(Some("monotonic"));
    }
}
