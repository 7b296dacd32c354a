//! foresight's cost per step: what the worker thread of `run`, `attach` and `agent` spends on one
//! step of a PyTorch process (`foresight::Predictor`: the step's requests through the simulated
//! allocator, the step found again, the next `HORIZON` steps simulated on a copy of it). The
//! step is GPT-2 small's size (1051 allocations a step, measured on the H200): a synthetic
//! training step whose temporaries are freed at once and whose activations are freed in reverse
//! at the step's end, after 20 steps of history.
//!
//! Variants:
//! - `periodic_step`: the same sizes each step (the simulation stops once a simulated step
//!   leaves the allocator as the one before it: about 2 steps simulated).
//! - `growing_step`: every size grows each step (a rising sequence length): all `HORIZON` steps
//!   simulated.
//! - `warning_step`: a growing step that does not fit: the own simulation fails and the sweep of
//!   settings (kept up to date after the first warning) runs the failing steps under each.
//! - `alternative_whole_replay`: the naive way, the whole history replayed from the start for
//!   one prediction (`foresight::forecast`), for the ratio.
//!
//! Run: `cargo bench --bench foresight`; medians in docs/benchmarks.md.

use criterion::{criterion_group, Criterion};
use gpufrag::alloc::pytorch::AllocConf;
use gpufrag::foresight::{forecast, Available, Predictor, HORIZON};
use gpufrag::sim::{Request, RequestStream};
use std::hint::black_box;
use std::time::Duration;

const ALLOCS: u32 = 1051;
const KIB: u64 = 1024;

/// One step's requests from allocation index `first`, sizes grown by `grow` bytes per step `k`.
fn step(first: u32, k: u64, grow: u64) -> Vec<Request> {
    let mut out = Vec::new();
    let mut kept = Vec::new();
    for i in 0..ALLOCS {
        let base = (u64::from(i) * 7919 % 97 + 1) * 64 * KIB;
        out.push(Request::Alloc { size: base + k * grow, stream: 0, entry: 0, traced: Some(0) });
        let a = first + i;
        if i % 10 == 9 {
            out.push(Request::FreeRequested { alloc: a, entry: 0 });
            out.push(Request::FreeCompleted { alloc: a, entry: 0 });
        } else {
            kept.push(a);
        }
    }
    for a in kept.into_iter().rev() {
        out.push(Request::FreeRequested { alloc: a, entry: 0 });
        out.push(Request::FreeCompleted { alloc: a, entry: 0 });
    }
    out
}

fn warmed(steps: u64, grow: u64) -> (Predictor, u64) {
    let mut p = Predictor::new(AllocConf::default());
    for k in 0..steps {
        for r in step(k as u32 * ALLOCS, k, grow) {
            p.push(r);
        }
    }
    (p, steps)
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("foresight");
    g.sample_size(20).measurement_time(Duration::from_secs(6));
    let room = Available::Device(1 << 40);
    for (name, grow) in [("periodic_step", 0u64), ("growing_step", 4 * KIB)] {
        let (mut p, mut k) = warmed(20, grow);
        g.bench_function(name, |b| {
            b.iter(|| {
                for r in step(k as u32 * ALLOCS, k, grow) {
                    p.push(r);
                }
                k += 1;
                black_box(p.predict(room, HORIZON).expect("a step").predicted_peak)
            })
        });
    }
    // a growing step under a device that fails within the horizon: each step warns
    let (mut p, mut k) = warmed(20, 64 * KIB);
    let fits_now = p.predict(room, HORIZON).expect("a step").reserved_now;
    let tight = Available::Device(fits_now + (ALLOCS as u64) * 64 * KIB * 2);
    g.bench_function("warning_step", |b| {
        b.iter(|| {
            for r in step(k as u32 * ALLOCS, k, 64 * KIB) {
                p.push(r);
            }
            k += 1;
            let f = p.predict(Available::Device(tight.bytes() + k * ALLOCS as u64 * 64 * KIB), HORIZON).expect("a step");
            black_box(f.warning.map(|w| w.steps_ahead))
        })
    });
    // the naive alternative: the whole history replayed for one prediction
    let mut requests = Vec::new();
    for k in 0..20u64 {
        requests.extend(step(k as u32 * ALLOCS, k, 4 * KIB));
    }
    let n = requests.len();
    let s = RequestStream {
        requests,
        recorded: Vec::new(),
        recorded_entry: Vec::new(),
        op_start: vec![0; n + 1],
        conf: AllocConf::default(),
        device: 0,
        entries: n,
        trace_ooms: Vec::new(),
        device_capacity_hint: None,
        non_framework_peak: 0,
        final_figures: None,
        peak_reserved: 0,
        source: "synthetic",
        unattributed: Vec::new(),
        notes: Vec::new(),
        ipc_exports: Vec::new(),
        sees_ipc: false,
        times: vec![0; n],
    };
    g.bench_function("alternative_whole_replay_20_steps", |b| {
        b.iter(|| black_box(forecast(&s, room, HORIZON).expect("a step").predicted_peak))
    });
    g.finish();
}

criterion_group!(group, benches);

fn main() {
    group();
    criterion::Criterion::default().configure_from_args().final_summary();
}
