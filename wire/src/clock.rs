//! Event timestamps: the clock a traced process stamps its events with, and the one conversion
//! of raw TSC ticks to `CLOCK_MONOTONIC` nanoseconds, shared by the consumer and the tests.
//!
//! The shim stamps events with `CLOCK_MONOTONIC` through the vDSO (20–32 ns a read, depending on
//! the host's clocksource) or, on x86_64 with an invariant TSC (CPUID 0x80000007 EDX bit 8: the
//! counter ticks at one rate in every power state and is synchronised across cores), with the
//! TSC read after `lfence` ([`ticks`]: what the kernel's own `rdtsc_ordered` does, so that the
//! counter is read only after every earlier load has completed: a timestamp taken after learning
//! an address another thread published is later than that thread's, which the lanes' merge
//! relies on). A region stamped in ticks says so in its hello (`HELLO_F_TSC`); its lanes are
//! merged on the raw ticks (one counter for all CPUs) and every event is converted after the
//! merge, before anything downstream sees it, so recordings and the state keep nanoseconds.
//!
//! Conversion ([`Calibration`]): pairs of (`CLOCK_MONOTONIC`, ticks) read bracketed (ns, ticks,
//! ns; of several tries the pair with the narrowest bracket, the ns taken at its middle). A first
//! pair, a second at least [`FIRST_BASELINE_NS`] later (it blocks its caller that long, once: the
//! consumer calibrates lazily, when the first TSC region appears), give the first rate; from
//! then on [`Calibration::maybe_refresh`] takes a new pair every [`REFRESH_NS`], re-anchors the
//! conversion there, and takes the rate over the baseline since the previous anchor (a second or
//! more: bracket noise of tens of ns makes it exact to about 1e-7, and it follows the NTP slewing
//! of `CLOCK_MONOTONIC`). A re-anchoring may move the conversion by the drift accumulated since
//! the last one, either way; [`Converter`] clamps each region's converted timestamps to be
//! non-decreasing, so that a refresh can never reorder events the merge put in order.

use std::os::raw::{c_int, c_long};
use std::sync::{Mutex, OnceLock};

/// The first calibration's baseline: the rate from two pairs at least this far apart.
pub const FIRST_BASELINE_NS: u64 = 10_000_000;
/// How often [`Calibration::maybe_refresh`] re-anchors the conversion.
pub const REFRESH_NS: u64 = 1_000_000_000;
/// Bracketed reads per pair (the narrowest is kept).
const PAIR_TRIES: usize = 16;

const CLOCK_MONOTONIC: c_int = 1;
const CLOCK_MONOTONIC_COARSE: c_int = 6;

#[repr(C)]
struct Timespec {
    tv_sec: c_long,
    tv_nsec: c_long,
}

extern "C" {
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
}

#[inline]
fn read_clock(clock: c_int) -> u64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own (served by the vDSO: no syscall).
    unsafe { clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[inline]
pub fn monotonic_ns() -> u64 {
    read_clock(CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds (the last tick's time: a few ns to read, a few ms of
/// resolution; for intervals, never for event order).
#[inline]
pub fn monotonic_coarse_ns() -> u64 {
    read_clock(CLOCK_MONOTONIC_COARSE)
}

/// The time-stamp counter, read after every earlier instruction has completed locally
/// (`lfence; rdtsc`). Elsewhere than x86_64: `CLOCK_MONOTONIC` (so that the conversion code is
/// the identity there; no producer stamps ticks on those machines).
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: lfence and rdtsc exist on every x86_64 CPU and touch no memory.
        unsafe {
            core::arch::x86_64::_mm_lfence();
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

/// Whether the CPU reports an invariant TSC (CPUID 0x80000007 EDX bit 8, after checking that
/// the extended leaf exists). Always false elsewhere than x86_64.
pub fn invariant_tsc() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        // SAFETY: CPUID is available on every x86_64 CPU; leaf 0x80000000 gives the largest
        // extended leaf, and 0x80000007 is read only when it exists. (`__cpuid` is a safe
        // function in newer Rust, unsafe in older.)
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One reading of both clocks at (nearly) the same instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// `CLOCK_MONOTONIC` ns (the middle of the bracket).
    pub ns: u64,
    /// Ticks read inside the bracket.
    pub ticks: u64,
    /// Width of the bracket in ns (the pair's uncertainty).
    pub bracket: u64,
}

impl Pair {
    /// The narrowest of [`PAIR_TRIES`] bracketed readings (ns, ticks, ns).
    pub fn read() -> Pair {
        let mut best = Pair { ns: 0, ticks: 0, bracket: u64::MAX };
        for _ in 0..PAIR_TRIES {
            let a = monotonic_ns();
            let t = ticks();
            let b = monotonic_ns();
            let w = b.saturating_sub(a);
            if w < best.bracket {
                best = Pair { ns: a + w / 2, ticks: t, bracket: w };
            }
        }
        best
    }
}

/// A linear map from ticks to `CLOCK_MONOTONIC` ns: `ns = anchor.ns + (ticks - anchor.ticks) ×
/// rate`, the rate in ns per tick as a 32.32 fixed-point number. Copied out of the shared
/// calibration once per drain, so that conversion takes no lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    /// Where the map is exact (up to the pair's bracket).
    pub anchor: Pair,
    /// ns per tick × 2^32.
    pub rate_q32: u64,
}

impl Model {
    /// The model through `a` and `b` (`b` later); `None` if they do not span both clocks.
    pub fn through(a: Pair, b: Pair) -> Option<Model> {
        let (dn, dt) = (b.ns.checked_sub(a.ns)?, b.ticks.checked_sub(a.ticks)?);
        if dn == 0 || dt == 0 {
            return None;
        }
        let rate = ((u128::from(dn) << 32) / u128::from(dt)).min(u128::from(u64::MAX)) as u64;
        Some(Model { anchor: b, rate_q32: rate })
    }

    /// `ticks` in `CLOCK_MONOTONIC` ns (ticks before the anchor extrapolate backwards).
    #[inline]
    pub fn to_ns(&self, ticks: u64) -> u64 {
        let d = i128::from(ticks.wrapping_sub(self.anchor.ticks) as i64);
        let ns = i128::from(self.anchor.ns) + ((d * i128::from(self.rate_q32)) >> 32);
        ns.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// The consumer's calibration of the TSC against `CLOCK_MONOTONIC` (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    model: Model,
    /// Refreshes so far.
    pub refreshes: u64,
}

impl Calibration {
    /// A first calibration: two pairs [`FIRST_BASELINE_NS`] apart (blocks that long).
    pub fn new() -> Calibration {
        Calibration::with_baseline(FIRST_BASELINE_NS)
    }

    /// As [`Calibration::new`], with a baseline of `baseline_ns` (at least 1 µs).
    pub fn with_baseline(baseline_ns: u64) -> Calibration {
        let baseline_ns = baseline_ns.max(1_000);
        let a = Pair::read();
        loop {
            let left = (a.ns + baseline_ns).saturating_sub(monotonic_ns());
            if left == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_nanos(left));
        }
        let mut b = Pair::read();
        loop {
            if let Some(model) = Model::through(a, b) {
                return Calibration { model, refreshes: 0 };
            }
            // A counter that did not move (or a clock that went back): try again a moment later.
            std::thread::sleep(std::time::Duration::from_millis(1));
            b = Pair::read();
        }
    }

    /// The current model.
    pub fn model(&self) -> Model {
        self.model
    }

    /// Re-anchors at a fresh pair when [`REFRESH_NS`] have passed since the anchor; whether it
    /// did.
    pub fn maybe_refresh(&mut self) -> bool {
        if monotonic_ns().saturating_sub(self.model.anchor.ns) < REFRESH_NS {
            return false;
        }
        self.refresh_with(Pair::read())
    }

    /// Re-anchors at `p` (a pair later than the anchor), the rate taken over the baseline since
    /// the anchor; false (nothing changed) if `p` is not later on both clocks.
    pub fn refresh_with(&mut self, p: Pair) -> bool {
        match Model::through(self.model.anchor, p) {
            Some(m) => {
                self.model = m;
                self.refreshes += 1;
                true
            }
            None => false,
        }
    }

    /// `ticks` in `CLOCK_MONOTONIC` ns under the current model.
    pub fn to_ns(&self, ticks: u64) -> u64 {
        self.model.to_ns(ticks)
    }
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration::new()
    }
}

/// The process's one calibration, made at the first call (which blocks for
/// [`FIRST_BASELINE_NS`]); every later call refreshes it when due and returns the current model.
pub fn shared_model() -> Model {
    static SHARED: OnceLock<Mutex<Calibration>> = OnceLock::new();
    let m = SHARED.get_or_init(|| Mutex::new(Calibration::new()));
    let mut c = m.lock().unwrap_or_else(|e| e.into_inner());
    c.maybe_refresh();
    c.model()
}

/// One region's conversion: converted timestamps never decrease (each is clamped to the one
/// before), so that a change of model between two drains cannot reorder the region's events.
#[derive(Clone, Copy, Debug, Default)]
pub struct Converter {
    last: u64,
}

impl Converter {
    /// A converter that has converted nothing yet.
    pub fn new() -> Converter {
        Converter { last: 0 }
    }

    /// `ticks` in ns under `model`, no earlier than the previous result.
    #[inline]
    pub fn convert(&mut self, model: &Model, ticks: u64) -> u64 {
        let ns = model.to_ns(ticks).max(self.last);
        self.last = ns;
        ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_now_to_now() {
        let cal = Calibration::new();
        for _ in 0..100 {
            let before = monotonic_ns();
            let t = ticks();
            let after = monotonic_ns();
            let ns = cal.to_ns(t);
            assert!(ns + 1_000_000 >= before && ns <= after + 1_000_000, "{before} <= {ns} <= {after} within 1 ms");
        }
        // A later refresh keeps it there.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut cal = cal;
        assert!(cal.refresh_with(Pair::read()));
        let (before, t, after) = (monotonic_ns(), ticks(), monotonic_ns());
        let ns = cal.to_ns(t);
        assert!(ns + 1_000_000 >= before && ns <= after + 1_000_000, "{before} <= {ns} <= {after} within 1 ms");
        eprintln!(
            "rate {:.6} ns/tick, bracket {} ns, error now {} ns",
            cal.model().rate_q32 as f64 / 4_294_967_296.0,
            cal.model().anchor.bracket,
            ns as i128 - ((before + after) / 2) as i128
        );
    }

    #[test]
    fn model_arithmetic() {
        let a = Pair { ns: 1_000, ticks: 10_000, bracket: 0 };
        let b = Pair { ns: 2_000, ticks: 14_000, bracket: 0 };
        let m = Model::through(a, b).expect("a model");
        assert_eq!(m.to_ns(14_000), 2_000);
        assert_eq!(m.to_ns(18_000), 3_000);
        assert_eq!(m.to_ns(10_000), 1_000);
        // A rate that is not a power of two: rounded down by at most a ns over a second's ticks.
        let m = Model::through(a, Pair { ns: 1_000_001_000, ticks: 3_000_010_000, bracket: 0 }).expect("a model");
        assert!(m.to_ns(6_000_010_000).abs_diff(2_000_001_000) <= 1);
        assert_eq!(m.to_ns(0), 0, "clamped at zero");
        assert!(Model::through(b, a).is_none());
        assert!(Model::through(a, a).is_none());
    }

    #[test]
    fn clamped_to_be_monotonic() {
        let m = Model::through(Pair { ns: 0, ticks: 0, bracket: 0 }, Pair { ns: 1_000, ticks: 1_000, bracket: 0 }).expect("model");
        let mut c = Converter::new();
        assert_eq!(c.convert(&m, 500), 500);
        assert_eq!(c.convert(&m, 400), 500, "an earlier tick count comes out no earlier");
        assert_eq!(c.convert(&m, 700), 700);
    }

    #[test]
    fn a_refresh_never_goes_back() {
        // A model that runs fast, then a refresh that pulls the conversion back by 100 ns.
        let a = Pair { ns: 0, ticks: 0, bracket: 0 };
        let b = Pair { ns: 1_000, ticks: 1_000, bracket: 0 };
        let mut cal = Calibration { model: Model::through(a, b).expect("model"), refreshes: 0 };
        let mut c = Converter::new();
        let mut out = Vec::new();
        for t in (1_000..2_000).step_by(100) {
            out.push(c.convert(&cal.model(), t));
        }
        assert!(cal.refresh_with(Pair { ns: 1_900, ticks: 2_000, bracket: 0 }));
        assert_eq!(cal.refreshes, 1);
        assert!(cal.to_ns(1_950) < out[out.len() - 1], "the new model maps that tick count earlier");
        for t in (1_950..3_000).step_by(50) {
            out.push(c.convert(&cal.model(), t));
        }
        assert!(out.windows(2).all(|w| w[0] <= w[1]), "{out:?}");
        // The real clock too: converted ticks of a live sequence never decrease across refreshes.
        let mut cal = Calibration::with_baseline(1_000_000);
        let mut c = Converter::new();
        let mut last = 0;
        for i in 0..2_000 {
            if i % 500 == 0 {
                cal.refresh_with(Pair::read());
            }
            let ns = c.convert(&cal.model(), ticks());
            assert!(ns >= last);
            last = ns;
        }
    }

    #[test]
    fn shared_model_is_calibrated_once() {
        let m1 = shared_model();
        let m2 = shared_model();
        assert_eq!(m1, m2, "no refresh within a second");
        let ns = m2.to_ns(ticks());
        assert!(ns.abs_diff(monotonic_ns()) < 1_000_000);
    }
}
