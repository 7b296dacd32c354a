//! Capacity questions answered by simulation.
//!
//! The least memory: for one setting, the least allowed bytes (`set_per_process_memory_fraction`
//! × total, the cap PyTorch's allocator checks its own reserved bytes against) under which every
//! request of the trace succeeds, found to the allocation granule (2 MiB: segments, small
//! buffers and expandable pages are whole multiples of it) by bisection between a limit that
//! must fail (below the peak of the bytes the program held at once) and one that holds (the
//! unlimited run's peak reserved). The bisection ends on a limit that survives with the limit
//! one granule below it failing, which is what the tests check by simulating both.
//!
//! Two traces on one card: each process has its own simulated allocator, both draw on one
//! device; the requests of the two are interleaved by their times, each taken from its own
//! first request (the two jobs started together), or by their position in the stream where a
//! trace has no times. Before each request its allocator's device capacity is the card less
//! what the other holds and less both processes' memory outside the caching allocator. A process
//! that fails stops (it raised), and the other runs on.

use super::{FirstOom, Limits, Request, RequestStream, Scenario, Stepper};
use crate::alloc::pytorch::AllocConf;
use crate::units::human_bytes;

/// The allocation granule of the search.
pub const GRANULE: u64 = 2 << 20;

/// The least memory one setting needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinMemory {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    /// The least allowed bytes under which the trace survives (a multiple of [`GRANULE`]);
    /// `None` when not even the unlimited run's peak reserved times 64 holds it.
    pub bytes: Option<u64>,
    /// Peak reserved of the run at that limit.
    pub peak_reserved: u64,
    /// Simulations the search ran.
    pub simulations: usize,
}

/// The highest sum of the sizes of the blocks the program held at once (from each allocation to
/// its free): no allocator can do with less.
pub fn peak_live_requested(stream: &RequestStream) -> u64 {
    let mut sizes: Vec<u64> = Vec::new();
    let (mut live, mut peak) = (0u64, 0u64);
    for r in &stream.requests {
        match *r {
            Request::Alloc { size, .. } => {
                sizes.push(size);
                live += size;
                peak = peak.max(live);
            }
            Request::FreeRequested { alloc, .. } => {
                if let Some(s) = sizes.get_mut(alloc as usize) {
                    live -= *s;
                    *s = 0;
                }
            }
            _ => {}
        }
    }
    peak
}

fn run_at(stream: &RequestStream, alloc_conf: &str, conf: &AllocConf, limit: u64, device_total: u64) -> super::Outcome {
    let limits = Limits { memory_limit: Some(limit), device_capacity: None, device_total };
    let replay = *conf == stream.conf;
    super::simulate(stream, &Scenario { alloc_conf: alloc_conf.to_string(), conf: conf.clone(), limits }, replay)
}

/// True when every request of `stream` succeeds under `conf` with `limit` allowed bytes.
pub fn survives(stream: &RequestStream, conf: &AllocConf, limit: u64, device_total: u64) -> bool {
    run_at(stream, &conf.conf, conf, limit, device_total).first_oom.is_none()
}

/// The least memory for one setting.
pub fn min_memory_of(stream: &RequestStream, alloc_conf: &str, conf: &AllocConf, device_total: u64) -> MinMemory {
    let simulations = std::cell::Cell::new(0usize);
    let at = |k: u64| {
        simulations.set(simulations.get() + 1);
        run_at(stream, alloc_conf, conf, k * GRANULE, device_total)
    };
    // k_fail * GRANULE must fail: below the bytes the program held at once
    let floor = peak_live_requested(stream);
    let mut k_fail = floor.div_ceil(GRANULE).saturating_sub(1);
    let unlimited = super::simulate(
        stream,
        &Scenario { alloc_conf: alloc_conf.into(), conf: conf.clone(), limits: Limits { device_total, ..Limits::default() } },
        *conf == stream.conf,
    );
    simulations.set(simulations.get() + 1);
    let mut k_hi = unlimited.counters.peak_reserved.div_ceil(GRANULE).max(k_fail + 1);
    let mut best = at(k_hi);
    let mut tries = 0;
    while best.first_oom.is_some() {
        tries += 1;
        if tries > 6 {
            return MinMemory { alloc_conf: alloc_conf.into(), bytes: None, peak_reserved: 0, simulations: simulations.get() };
        }
        k_fail = k_hi;
        k_hi *= 2;
        best = at(k_hi);
    }
    while k_hi - k_fail > 1 {
        let mid = k_fail + (k_hi - k_fail) / 2;
        let o = at(mid);
        if o.first_oom.is_none() {
            k_hi = mid;
            best = o;
        } else {
            k_fail = mid;
        }
    }
    MinMemory {
        alloc_conf: alloc_conf.into(),
        bytes: Some(k_hi * GRANULE),
        peak_reserved: best.counters.peak_reserved,
        simulations: simulations.get(),
    }
}

/// The least memory of every setting of `confs` (the trace's own first), searched in parallel.
pub fn min_memory(stream: &RequestStream, confs: &[(String, AllocConf)], device_total: u64) -> Vec<MinMemory> {
    let mut all: Vec<(String, AllocConf)> = vec![(stream.conf.conf.clone(), stream.conf.clone())];
    all.extend(confs.iter().cloned());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let mut out: Vec<Option<MinMemory>> = vec![None; all.len()];
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads.min(all.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, conf)) = all.get(i) else { break };
                let m = min_memory_of(stream, name, conf, device_total);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(m);
            });
        }
    });
    out.into_iter().flatten().collect()
}

/// A setting's name in a sentence.
pub fn plain_name(conf: &str) -> String {
    match conf {
        "" => "the defaults".into(),
        "expandable_segments:True" => "expandable segments".into(),
        c => c.into(),
    }
}

/// "fits in X with the best setting; needs Y with the trace's own" (`found[0]` is the trace's own).
pub fn min_memory_sentence(found: &[MinMemory]) -> String {
    let Some(own) = found.first() else { return String::new() };
    let best = found.iter().filter(|m| m.bytes.is_some()).min_by_key(|m| m.bytes);
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    match (own.bytes, best) {
        (_, None) => "no setting tried lets the trace survive under any limit searched".into(),
        (Some(o), Some(b)) if b.bytes == Some(o) || b.alloc_conf == own.alloc_conf => {
            format!("needs {} with {}; no setting tried fits in less", gib(o), plain_name(&own.alloc_conf))
        }
        (Some(o), Some(b)) => format!(
            "fits in {} with {}; needs {} with {}",
            gib(b.bytes.unwrap_or(0)),
            plain_name(&b.alloc_conf),
            gib(o),
            plain_name(&own.alloc_conf)
        ),
        (None, Some(b)) => format!(
            "fits in {} with {}; {} does not survive under any limit searched",
            gib(b.bytes.unwrap_or(0)),
            plain_name(&b.alloc_conf),
            plain_name(&own.alloc_conf)
        ),
    }
}

/// Two traces on one card under one setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Together {
    /// The setting both processes ran under ("own" settings: each its trace's).
    pub alloc_conf: String,
    /// Both ran to the end.
    pub fits: bool,
    /// The first failure: which trace (0 or 1) and where.
    pub failed: Option<(usize, FirstOom)>,
    /// Peak of the two allocators' reserved bytes together.
    pub peak_combined: u64,
    /// Each one's peak reserved.
    pub peaks: [u64; 2],
}

/// The order of the two streams' requests: (which, index), by relative time.
fn interleave(a: &RequestStream, b: &RequestStream) -> Vec<usize> {
    let rel = |s: &RequestStream| -> Vec<f64> {
        let t0 = s.times.first().copied().unwrap_or(0);
        let span = s.times.last().copied().unwrap_or(0).saturating_sub(t0);
        if span == 0 || s.times.len() != s.requests.len() {
            let n = s.requests.len().max(1) as f64;
            (0..s.requests.len()).map(|i| i as f64 / n).collect()
        } else {
            s.times.iter().map(|&t| t.saturating_sub(t0) as f64 * 1e-9).collect()
        }
    };
    let (ta, tb) = (rel(a), rel(b));
    // both without times: proportional position; one without: both proportional
    let (ta, tb) = if (a.times.iter().all(|&t| t == 0)) != (b.times.iter().all(|&t| t == 0)) {
        let p = |s: &RequestStream| (0..s.requests.len()).map(|i| i as f64 / s.requests.len().max(1) as f64).collect::<Vec<_>>();
        (p(a), p(b))
    } else {
        (ta, tb)
    };
    let (mut i, mut j) = (0, 0);
    let mut order = Vec::with_capacity(ta.len() + tb.len());
    while i < ta.len() || j < tb.len() {
        if j >= tb.len() || (i < ta.len() && ta[i] <= tb[j]) {
            order.push(0);
            i += 1;
        } else {
            order.push(1);
            j += 1;
        }
    }
    order
}

/// Runs `a` and `b` on one card of `device_memory` bytes under each setting of `confs` (each
/// trace's own settings first).
pub fn together(a: &RequestStream, b: &RequestStream, confs: &[(String, AllocConf)], device_memory: u64) -> Vec<Together> {
    let order = interleave(a, b);
    let cap = device_memory.saturating_sub(a.non_framework_peak + b.non_framework_peak);
    let mut settings: Vec<(String, Option<AllocConf>)> = vec![("own".into(), None)];
    settings.extend(confs.iter().map(|(s, c)| (s.clone(), Some(c.clone()))));
    settings
        .iter()
        .map(|(name, conf)| {
            let limits = Limits { memory_limit: None, device_capacity: Some(cap), device_total: device_memory };
            let sc = |s: &RequestStream| Scenario {
                alloc_conf: name.clone(),
                conf: conf.clone().unwrap_or_else(|| s.conf.clone()),
                limits: limits.clone(),
            };
            let mut st = [Stepper::new(a, &sc(a), conf.is_none()), Stepper::new(b, &sc(b), conf.is_none())];
            let mut failed = None;
            let mut peak_combined = 0u64;
            // a process that raised has exited: its memory is back with the device
            let held = |s: &Stepper| if s.dead { 0 } else { s.allocator.counters().reserved };
            for &w in &order {
                let other = held(&st[1 - w]);
                st[w].allocator.set_device_capacity(Some(cap.saturating_sub(other)));
                st[w].step();
                if failed.is_none() {
                    if let Some(f) = &st[w].first_oom {
                        failed = Some((w, f.clone()));
                    }
                }
                let both = held(&st[0]) + held(&st[1]);
                peak_combined = peak_combined.max(both);
            }
            Together {
                alloc_conf: name.clone(),
                fits: failed.is_none(),
                failed,
                peak_combined,
                peaks: [st[0].allocator.counters().peak_reserved, st[1].allocator.counters().peak_reserved],
            }
        })
        .collect()
}

/// One line per setting of a `together` answer.
pub fn together_lines(rows: &[Together], device_memory: u64, names: [&str; 2]) -> String {
    let mut s = String::new();
    for r in rows {
        let name = if r.alloc_conf == "own" { "each its own settings".to_string() } else { plain_name(&r.alloc_conf) };
        match &r.failed {
            None => s.push_str(&format!(
                "fits with {name}: together at most {} of {} ({} + {})\n",
                human_bytes(r.peak_combined),
                human_bytes(device_memory),
                human_bytes(r.peaks[0]),
                human_bytes(r.peaks[1])
            )),
            Some((w, f)) => s.push_str(&format!(
                "does not fit with {name}: {} fails asking for {} at entry {} ({} held by both then)\n",
                names[*w],
                human_bytes(f.oom.requested),
                f.entry,
                human_bytes(r.peak_combined)
            )),
        }
    }
    s
}
