//! foresight: a prediction of a process's coming peak from its own step pattern. The step finder
//! (`step.rs`) finds the repeating pattern of the process's requests and how its sizes change;
//! the prediction replays the history through the simulated caching allocator (`crate::sim`, the
//! rules of `crate::alloc::pytorch`) to the allocator's current state, then simulates the next
//! steps (extrapolated) under what the process may still take: the device's free memory plus
//! what it holds, or its cap (`set_per_process_memory_fraction`). When a coming step does not
//! fit, the warning says how many steps ahead, the predicted peak (the reserved bytes the failing
//! request would need: reserved then + the segment asked for, as PyTorch's message counts) and
//! the setting that would fit, from the same simulation under each setting of the sweep.
//!
//! Nothing is invented: too few requests to see three whole steps, no step, or a cap already
//! below the reserved bytes give a note and no warning.

mod step;

pub use step::{extrapolate, find_step, keys, Growth, Step, MIN_REPEATS};

use crate::alloc::pytorch::AllocConf;
use crate::sim::{self, Limits, Request, RequestStream, Scenario, Stepper};

/// What the process may hold in all from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Available {
    /// The device: what the process holds now plus the device's free bytes.
    Device(u64),
    /// The process's cap (`set_per_process_memory_fraction` × total).
    Cap(u64),
}

impl Available {
    /// The bytes.
    pub fn bytes(self) -> u64 {
        match self {
            Available::Device(b) | Available::Cap(b) => b,
        }
    }
}

/// A coming step that does not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Steps ahead of now (1 = the next step).
    pub steps_ahead: usize,
    /// Reserved bytes the failing request would need (reserved then + the segment asked for).
    pub predicted_peak: u64,
    /// What the process may hold.
    pub available: u64,
    /// The request that would fail.
    pub requested: u64,
    /// The setting that fits, from the simulation, with its predicted peak; `None` when none does.
    pub fix: Option<(String, u64)>,
    /// The fix in words.
    pub fix_text: String,
}

/// A prediction at the end of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forecast {
    /// The step found.
    pub step: Step,
    /// Steps simulated ahead.
    pub horizon: usize,
    /// Peak reserved over the simulated steps (up to the failure, when one fails).
    pub predicted_peak: u64,
    /// Reserved bytes now.
    pub reserved_now: u64,
    /// What the process may hold.
    pub available: u64,
    /// The warning, when a coming step does not fit.
    pub warning: Option<Warning>,
    /// Requests simulated (history + future, all settings tried).
    pub simulated_requests: usize,
}

/// `stream` with `horizon` extrapolated steps appended (the future requests carry entry
/// `usize::MAX`); the index of the first future request.
pub fn extended(stream: &RequestStream, step: &Step, horizon: usize) -> (RequestStream, usize) {
    let mut s = stream.clone();
    let history = s.requests.len();
    let mut allocs = s.requests.iter().filter(|r| matches!(r, Request::Alloc { .. })).count() as u32;
    let last_op = *s.op_start.last().unwrap_or(&0);
    let t_last = s.times.last().copied().unwrap_or(0);
    for ahead in 1..=horizon {
        let reqs = extrapolate(&stream.requests, step, ahead, allocs);
        allocs += step.allocs as u32;
        for r in reqs {
            s.requests.push(r);
            s.op_start.push(last_op);
            s.times.push(t_last);
        }
    }
    (s, history)
}

struct Run {
    peak: u64,
    reserved_now: u64,
    fail: Option<(usize, sim::Oom)>,
    simulated: usize,
}

fn run(ext: &RequestStream, history: usize, period: usize, conf: &AllocConf, own: bool, available: Available) -> Result<Run, String> {
    let sc = Scenario { alloc_conf: conf.conf.clone(), conf: conf.clone(), limits: Limits::default() };
    // the history ran under the same limit (the process has lived under it)
    let mut st = Stepper::new(ext, &sc, own);
    match available {
        Available::Device(b) => st.allocator.set_device_capacity(Some(b)),
        Available::Cap(b) => st.allocator.set_memory_limit(Some(b)),
    }
    while st.done() < history && st.step() {}
    if st.dead {
        let held = st.first_oom.as_ref().map_or(0, |f| f.oom.reserved + f.oom.alloc_size);
        let what = match available {
            Available::Cap(_) => "cap",
            Available::Device(_) => "available device memory",
        };
        return Err(format!(
            "the {what} ({} bytes) is below the {held} bytes the allocator already holds (its history does not replay under it): nothing to predict against",
            available.bytes()
        ));
    }
    let reserved_now = st.allocator.counters().reserved;
    let mut peak = reserved_now;
    let mut fail = None;
    while st.step() {
        peak = peak.max(st.allocator.counters().reserved);
        if st.dead {
            let f = st.first_oom.clone().expect("dead after an OOM");
            let ahead = (f.request - history) / period + 1;
            fail = Some((ahead, f.oom));
            break;
        }
    }
    Ok(Run { peak, reserved_now, fail, simulated: st.done() })
}

/// Predicts the next `horizon` steps of `stream` from its end under `available`.
pub fn forecast(stream: &RequestStream, available: Available, horizon: usize) -> Result<Forecast, String> {
    let step = find_step(&stream.requests)?;
    let horizon = horizon.max(1);
    let (ext, history) = extended(stream, &step, horizon);
    let own = run(&ext, history, step.period, &stream.conf, true, available)?;
    let mut simulated = own.simulated;
    let warning = match &own.fail {
        None => None,
        Some((ahead, oom)) => {
            let predicted_peak = oom.reserved + oom.alloc_size;
            // the same future under each setting of the sweep, from the start of the history
            let mut best: Option<(String, u64)> = None;
            for (name, conf) in sim::sweep_for(stream) {
                if sim::refusal(stream, &conf).is_some() {
                    continue;
                }
                if let Ok(r) = run(&ext, history, step.period, &conf, false, available) {
                    simulated += r.simulated;
                    if r.fail.is_none() && best.as_ref().is_none_or(|b| r.peak < b.1) {
                        best = Some((name, r.peak));
                    }
                }
            }
            let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
            let fix_text = match &best {
                Some((name, peak)) => format!(
                    "with {name} the next {horizon} steps peak at {} reserved, {} under the {} available",
                    gib(*peak),
                    gib(available.bytes() - peak),
                    gib(available.bytes())
                ),
                None => format!(
                    "no setting tried fits the next {horizon} steps in {}: checkpoint now, and give the job {} more or shrink the step",
                    gib(available.bytes()),
                    gib(predicted_peak.saturating_sub(available.bytes()))
                ),
            };
            Some(Warning {
                steps_ahead: *ahead,
                predicted_peak,
                available: available.bytes(),
                requested: oom.requested,
                fix: best,
                fix_text,
            })
        }
    };
    Ok(Forecast {
        step,
        horizon,
        predicted_peak: own.fail.as_ref().map_or(own.peak, |(_, o)| o.reserved + o.alloc_size),
        reserved_now: own.reserved_now,
        available: available.bytes(),
        warning,
        simulated_requests: simulated,
    })
}

/// `stream` cut after its first `n` requests (a live view at that moment).
pub fn prefix(stream: &RequestStream, n: usize) -> RequestStream {
    let mut s = stream.clone();
    let n = n.min(s.requests.len());
    s.requests.truncate(n);
    s.times.truncate(n);
    s.op_start.truncate(n + 1);
    let ops = *s.op_start.last().unwrap_or(&0) as usize;
    s.recorded.truncate(ops);
    s.recorded_entry.truncate(ops);
    s.trace_ooms.retain(|&(r, _)| r < n);
    s
}
