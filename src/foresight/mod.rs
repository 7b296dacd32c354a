//! foresight: a prediction of a process's coming peak from its own step pattern. The step finder
//! (`step.rs`) finds the repeating pattern of the process's requests and how its sizes change;
//! the [`Predictor`] keeps the simulated caching allocator (`crate::sim`, the rules of
//! `crate::alloc::pytorch`) at the process's current state, request by request, and after a step
//! simulates the next steps (extrapolated) on a copy of it under what the process may still
//! take: the device's free memory plus what it holds, or its cap
//! (`set_per_process_memory_fraction`). When a coming step does not fit, the warning says how
//! many steps ahead, the predicted peak (the reserved bytes the failing request would need:
//! reserved then + the segment asked for, as PyTorch's message counts) and the setting that would
//! fit, from the same simulation under each setting of the sweep. The live pipeline runs it on a
//! worker thread (`watch.rs`); [`forecast`] runs it on a whole recorded stream.
//!
//! Nothing is invented: too few requests to see three whole steps, no step, or a cap already
//! below the reserved bytes give a note and no warning.

mod step;
pub mod watch;

pub use step::{extrapolate, find_step, find_step_in, keys, keys_from, Growth, Step, ENVELOPE_STEPS, MIN_REPEATS};

use crate::alloc::pytorch::AllocConf;
use crate::sim::{self, Addresses, Allocator, Limits, Oom, Request, RequestStream};

/// Steps simulated ahead by the live pipeline.
pub const HORIZON: usize = 8;

/// The most recent requests the step finder searches (a step of up to a third of it is found).
pub const FINDER_WINDOW: usize = 1 << 18;

/// The most requests of history kept for the sweep of settings that names the fix (older ones
/// are let go, and the sweep is then not run: the warning says so).
pub const HISTORY_KEPT: usize = 1 << 21;

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
    /// Requests simulated for this prediction (future steps, all settings tried; the history
    /// the sweep first replays included).
    pub simulated_requests: usize,
}

/// A simulated allocator that has run a process's requests, in order.
#[derive(Clone, Debug)]
pub struct Replayed {
    /// The allocator.
    pub allocator: Allocator,
    /// Where each allocation whose block is not yet reusable again lives (allocation index →
    /// address; a failed one is absent): only the live ones are kept, so a copy for the next
    /// steps costs what is live, not the whole history.
    ptrs: std::collections::HashMap<u32, u64>,
    allocs: u32,
    /// The highest reserved bytes so far.
    pub peak: u64,
    /// The first request that failed (the process would have raised there).
    pub failed: Option<Oom>,
}

impl Replayed {
    /// An empty allocator under `conf`, no limit.
    pub fn new(conf: AllocConf) -> Replayed {
        Replayed {
            allocator: Allocator::new(conf, Limits::default(), Addresses::Model),
            ptrs: std::collections::HashMap::new(),
            allocs: 0,
            peak: 0,
            failed: None,
        }
    }

    /// Runs one request.
    pub fn apply(&mut self, r: &Request) -> Result<(), Oom> {
        let out = match *r {
            Request::Alloc { size, stream, traced, .. } => match self.allocator.malloc(size, stream) {
                Ok(p) => {
                    self.ptrs.insert(self.allocs, p);
                    self.allocs += 1;
                    Ok(())
                }
                Err(o) => {
                    self.allocs += 1;
                    // a request that failed in the trace too is passed over, as the program did
                    if traced.is_some() {
                        self.failed.get_or_insert(o.clone());
                    }
                    Err(o)
                }
            },
            // as sim's replay releases (crate::sim::release), with the live allocations only
            Request::FreeRequested { alloc, .. } => {
                if let Some(&p) = self.ptrs.get(&alloc) {
                    self.allocator.free_requested(p);
                }
                Ok(())
            }
            Request::FreeCompleted { alloc, .. } => {
                if let Some(p) = self.ptrs.remove(&alloc) {
                    self.allocator.free_completed(p);
                }
                Ok(())
            }
            Request::EmptyCache { .. } => {
                self.allocator.empty_cache();
                Ok(())
            }
        };
        self.allocator.clear_ops();
        self.peak = self.peak.max(self.reserved());
        out
    }

    /// Reserved bytes now.
    pub fn reserved(&self) -> u64 {
        self.allocator.counters().reserved
    }

    /// Allocations run so far.
    pub fn allocs(&self) -> u32 {
        self.allocs
    }
}

/// What the next steps gave on a copy of an allocator.
struct Ahead {
    peak: u64,
    fail: Option<(usize, Oom)>,
    simulated: usize,
}

/// The next `horizon` steps (extrapolated from `window`, the requests `step` was found in) on a
/// copy of `base` under `available`. A periodic or varying step whose simulated step leaves the
/// allocator as the one before it did (reserved and allocated alike) repeats from there: the rest
/// is not simulated.
fn ahead(base: &Replayed, window: &[Request], step: &Step, horizon: usize, available: Available) -> Ahead {
    let mut a = base.clone();
    match available {
        Available::Device(b) => a.allocator.set_device_capacity(Some(b)),
        Available::Cap(b) => a.allocator.set_memory_limit(Some(b)),
    }
    let mut peak = a.reserved();
    let mut simulated = 0;
    let mut before = (a.reserved(), a.allocator.counters().allocated);
    for k in 1..=horizon {
        let allocs = a.allocs();
        for r in extrapolate(window, step, k, allocs) {
            simulated += 1;
            if let Err(o) = a.apply(&r) {
                return Ahead { peak: peak.max(o.reserved + o.alloc_size), fail: Some((k, o)), simulated };
            }
            peak = peak.max(a.reserved());
        }
        let after = (a.reserved(), a.allocator.counters().allocated);
        if step.growth != Growth::Growing && after == before && k > 1 {
            break;
        }
        before = after;
    }
    Ahead { peak, fail: None, simulated }
}

fn gib(b: u64) -> String {
    crate::units::human_bytes(b)
}

/// A process's requests as they come, its simulated allocator at its current state, and (once a
/// warning needs a fix) the same history under each setting of the sweep.
#[derive(Debug)]
pub struct Predictor {
    conf: AllocConf,
    /// The requests kept (the last [`HISTORY_KEPT`] at most).
    requests: Vec<Request>,
    /// Requests let go from the front of `requests`, and the allocations among them.
    dropped: usize,
    dropped_allocs: u32,
    own: Replayed,
    /// Settings that must not be recommended (a legacy CUDA IPC export rules out expandable
    /// segments), with why.
    ipc_export: bool,
    sweep: Option<Vec<(String, Replayed)>>,
    /// The step found last (checked first: O(step) when it still holds).
    last_step: Option<usize>,
    /// What the driver could give the allocator, and its cap, as they were set over the history
    /// (from request index on), so that the history replays under what the process lived under.
    limits: Vec<(usize, Option<u64>, Option<u64>)>,
}

impl Predictor {
    /// A process that runs under `conf` (its own settings), before its first request.
    pub fn new(conf: AllocConf) -> Predictor {
        Predictor {
            own: Replayed::new(conf.clone()),
            conf,
            requests: Vec::new(),
            dropped: 0,
            dropped_allocs: 0,
            ipc_export: false,
            sweep: None,
            last_step: None,
            limits: Vec::new(),
        }
    }

    /// What the driver can give the allocator from now on (its reserved bytes + the device's
    /// free bytes less the driver's slack, at a reading), and its cap: the history replays under
    /// them, as the process lived (a failed cudaMalloc releases the cache and retries).
    pub fn set_limits(&mut self, capacity: Option<u64>, cap: Option<u64>) {
        if self.limits.last().is_some_and(|&(_, c, l)| c == capacity && l == cap) {
            return;
        }
        self.own.allocator.set_device_capacity(capacity);
        self.own.allocator.set_memory_limit(cap);
        if let Some(sw) = self.sweep.as_mut() {
            for (_, a) in sw.iter_mut() {
                a.allocator.set_device_capacity(capacity);
                a.allocator.set_memory_limit(cap);
            }
        }
        self.limits.push((self.requests.len(), capacity, cap));
    }

    /// The limits set last: (device capacity, cap).
    pub fn current_limits(&self) -> (Option<u64>, Option<u64>) {
        self.limits.last().map_or((None, None), |&(_, c, l)| (c, l))
    }

    /// The process exported memory of its caching allocator over legacy CUDA IPC.
    pub fn set_ipc_export(&mut self) {
        self.ipc_export = true;
    }

    /// Requests seen so far.
    pub fn seen(&self) -> usize {
        self.dropped + self.requests.len()
    }

    /// Reserved bytes of the simulated allocator now.
    pub fn reserved(&self) -> u64 {
        self.own.reserved()
    }

    /// Runs one more request of the process. Its own allocator refusing one (the process got it
    /// in fact) is kept as the simulation's failure: predictions then say so.
    pub fn push(&mut self, r: Request) {
        let _ = self.own.apply(&r);
        if let Some(sw) = self.sweep.as_mut() {
            for (_, a) in sw.iter_mut() {
                let _ = a.apply(&r);
            }
        }
        if self.requests.len() >= HISTORY_KEPT {
            let cut = HISTORY_KEPT - FINDER_WINDOW;
            self.dropped_allocs += self.requests[..cut].iter().filter(|r| matches!(r, Request::Alloc { .. })).count() as u32;
            self.requests.drain(..cut);
            self.dropped += cut;
            let last = self.limits.last().map(|&(_, c, l)| (0, c, l));
            self.limits.retain(|m| m.0 >= cut);
            for m in self.limits.iter_mut() {
                m.0 -= cut;
            }
            if let Some(l) = last.filter(|_| self.limits.first().is_none_or(|m| m.0 > 0)) {
                self.limits.insert(0, l);
            }
        }
        self.requests.push(r);
    }

    /// The step of the last requests, checking the last one found first.
    fn step(&mut self) -> Result<(usize, Step), String> {
        let n = self.requests.len();
        let from = n.saturating_sub(FINDER_WINDOW);
        if let Some(p) = self.last_step.filter(|&p| 3 * p <= n) {
            // the last step still holds when its last three windows are equal: search only the
            // steps the finder counts back (the same answer as a search of the whole window)
            let from = n.saturating_sub((ENVELOPE_STEPS + 1) * p).max(n.saturating_sub(FINDER_WINDOW));
            let allocs = self.allocs_before(from);
            if let Ok(st) = find_step_in(&self.requests[from..], allocs) {
                if st.period == p {
                    return Ok((from, st));
                }
            }
        }
        let allocs = self.allocs_before(from);
        let st = find_step_in(&self.requests[from..], allocs)?;
        self.last_step = Some(st.period);
        Ok((from, st))
    }

    fn allocs_before(&self, from: usize) -> u32 {
        let in_window = self.requests[from..].iter().filter(|r| matches!(r, Request::Alloc { .. })).count() as u32;
        self.own.allocs() - in_window
    }

    /// The prediction of the next `horizon` steps from now under `available`, or a note saying
    /// why there is none.
    pub fn predict(&mut self, available: Available, horizon: usize) -> Result<Forecast, String> {
        if let Some(o) = &self.own.failed {
            return Err(format!(
                "the simulated allocator under the process's own settings refused a request the process got ({} bytes asked with {} reserved): the simulation no longer follows the process, nothing to predict",
                o.requested, o.reserved
            ));
        }
        let (from, step) = self.step()?;
        let horizon = horizon.max(1);
        let reserved_now = self.own.reserved();
        if let Available::Cap(b) = available {
            if b < reserved_now {
                return Err(format!(
                    "the cap ({b} bytes) is below the {reserved_now} bytes the allocator already holds: nothing to predict against"
                ));
            }
        }
        let window = &self.requests[from..];
        let own = ahead(&self.own, window, &step, horizon, available);
        let mut simulated = own.simulated;
        let warning = match &own.fail {
            None => None,
            Some((steps_ahead, oom)) => {
                let predicted_peak = oom.reserved + oom.alloc_size;
                // a setting fits when the step that fails under the process's own settings, and
                // those before it, fit under it
                let (best, note) = self.fix(&step, from, *steps_ahead, available, &mut simulated);
                let fix_text = match &best {
                    Some((name, peak)) => format!(
                        "with {} the step that fails under the current settings fits: peak {} reserved, {} under the {} available",
                        if name.is_empty() { "PyTorch's default settings".to_string() } else { format!("PYTORCH_CUDA_ALLOC_CONF={name}") },
                        gib(*peak),
                        gib(available.bytes() - peak),
                        gib(available.bytes())
                    ),
                    None => format!(
                        "{}: checkpoint now, and give the job {} more or shrink the step",
                        note.unwrap_or_else(|| format!("no setting tried fits the step that fails in {}", gib(available.bytes()))),
                        gib(predicted_peak.saturating_sub(available.bytes()))
                    ),
                };
                Some(Warning {
                    steps_ahead: *steps_ahead,
                    predicted_peak,
                    available: available.bytes(),
                    requested: oom.requested,
                    fix: best,
                    fix_text,
                })
            }
        };
        Ok(Forecast {
            predicted_peak: own.peak,
            step,
            horizon,
            reserved_now,
            available: available.bytes(),
            warning,
            simulated_requests: simulated,
        })
    }

    /// The setting of the sweep whose next steps fit with the least peak (its history replayed
    /// once, then kept up to date); a note when the sweep cannot run.
    fn fix(
        &mut self,
        step: &Step,
        from: usize,
        horizon: usize,
        available: Available,
        simulated: &mut usize,
    ) -> (Option<(String, u64)>, Option<String>) {
        if self.sweep.is_none() {
            if self.dropped > 0 {
                return (
                    None,
                    Some(format!(
                        "the history is longer than the {HISTORY_KEPT} requests kept, so the settings that might fit were not simulated"
                    )),
                );
            }
            let mut sw = Vec::new();
            for c in sim::sweep_confs() {
                if c == self.conf.conf {
                    continue;
                }
                let Ok(conf) = AllocConf::parse(c) else { continue };
                // legacy IPC exports cannot export expandable segments' memory (sim::refusal)
                if conf.expandable_segments && !self.conf.expandable_segments && self.ipc_export {
                    continue;
                }
                let mut a = Replayed::new(conf);
                let mut marks = self.limits.iter().peekable();
                for (i, r) in self.requests.iter().enumerate() {
                    while let Some(&(_, c, l)) = marks.next_if(|m| m.0 <= i) {
                        a.allocator.set_device_capacity(c);
                        a.allocator.set_memory_limit(l);
                    }
                    let _ = a.apply(r);
                }
                for &(_, c, l) in marks {
                    a.allocator.set_device_capacity(c);
                    a.allocator.set_memory_limit(l);
                }
                *simulated += self.requests.len();
                sw.push((c.to_string(), a));
            }
            self.sweep = Some(sw);
        }
        let mut best: Option<(String, u64)> = None;
        let window = &self.requests[from..];
        for (name, a) in self.sweep.iter().flatten() {
            if a.failed.is_some() || a.peak > available.bytes() {
                continue;
            }
            let r = ahead(a, window, step, horizon, available);
            *simulated += r.simulated;
            if r.fail.is_none() && best.as_ref().is_none_or(|b| r.peak < b.1) {
                best = Some((name.clone(), r.peak));
            }
        }
        (best, None)
    }
}

/// Predicts the next `horizon` steps of `stream` from its end under `available` (the history
/// replayed under the stream's own settings; the sweep leaves out what [`sim::refusal`] refuses).
pub fn forecast(stream: &RequestStream, available: Available, horizon: usize) -> Result<Forecast, String> {
    let mut p = Predictor::new(stream.conf.clone());
    if sim::sweep_for(stream).iter().any(|(_, c)| sim::refusal(stream, c).is_some()) {
        p.set_ipc_export();
    }
    // the history ran under the same limit (the process has lived under it)
    let what = match available {
        Available::Device(b) => {
            p.set_limits(Some(b), None);
            "available device memory"
        }
        Available::Cap(b) => {
            p.set_limits(None, Some(b));
            "cap"
        }
    };
    for r in &stream.requests {
        p.push(*r);
    }
    if let Some(o) = &p.own.failed {
        return Err(format!(
            "the {what} ({} bytes) is below the {} bytes the allocator already holds (its history does not replay under it): nothing to predict against",
            available.bytes(),
            o.reserved + o.alloc_size
        ));
    }
    p.predict(available, horizon)
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
