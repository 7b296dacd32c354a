//! whatif speed: the `gpt2_varlen` trace (a GPT-2 run, 38,927 snapshot entries) repeated 6.5 times
//! into one request stream of about 253k entries (every block still live at the end of a
//! repetition is freed before the next, as if the program ran its steps again in the same
//! process), then simulated. Decoding the pickle is excluded: the stream is built once.
//!
//! Variants:
//! - `one_scenario/defaults`, `one_scenario/expandable`: `sim::simulate` of one setting (target
//!   ≤ 0.3 s on the 2-core CI machine).
//! - `sweep_12`: the baseline and the 11 other settings of `sim::sweep_confs` (target ≤ 1 s).
//! - `self_check`: the faithful check under the trace's own settings.
//! - `replay_address_map`: the same trace's wire events through `ingest::State` (what `analyze`
//!   does), the alternative a user already runs, for scale.
//!
//! Run: `cargo bench --bench whatif`; medians in docs/benchmarks.md.

use criterion::{criterion_group, Criterion};
use gpufrag::alloc::pytorch::AllocConf;
use gpufrag::ingest::State;
use gpufrag::sim::{self, Limits, Request, RequestStream, Scenario};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

const TRACE: &str = "tests/fixtures/gpt2_varlen.pickle.gz";

fn snapshot() -> gpufrag::snapshot::Snapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    gpufrag::snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// `times` repetitions (a fraction repeats a prefix) of the stream's requests, each ending with
/// frees of the blocks it left live.
pub fn repeat(s: &RequestStream, times: f64) -> RequestStream {
    let mut out = s.clone();
    out.requests.clear();
    out.recorded.clear();
    out.recorded_entry.clear();
    out.op_start = vec![];
    out.final_figures = None;
    let total = (s.entries as f64 * times) as usize;
    let mut base_alloc = 0u32;
    let mut entries = 0usize;
    while entries < total {
        let mut live: Vec<u32> = Vec::new();
        let mut n = 0u32;
        for r in &s.requests {
            if entries >= total {
                break;
            }
            let r2 = match *r {
                Request::Alloc { size, stream, entry, traced } => {
                    live.push(base_alloc + n);
                    n += 1;
                    Request::Alloc { size, stream, entry, traced }
                }
                Request::FreeRequested { alloc, entry } => Request::FreeRequested { alloc: base_alloc + alloc, entry },
                Request::FreeCompleted { alloc, entry } => {
                    live.retain(|&a| a != base_alloc + alloc);
                    Request::FreeCompleted { alloc: base_alloc + alloc, entry }
                }
                Request::EmptyCache { entry } => Request::EmptyCache { entry },
            };
            out.op_start.push(0);
            out.requests.push(r2);
            entries += 1; // one trace entry per request (gpt2_varlen: 38,723 requests, 38,927 entries)
        }
        for a in live {
            out.op_start.push(0);
            out.requests.push(Request::FreeRequested { alloc: a, entry: 0 });
            out.op_start.push(0);
            out.requests.push(Request::FreeCompleted { alloc: a, entry: 0 });
        }
        base_alloc += n;
    }
    out.op_start.push(0);
    out.entries = total;
    out
}

fn scenario(conf: &str) -> Scenario {
    Scenario { alloc_conf: conf.into(), conf: AllocConf::parse(conf).expect("a sweep setting parses"), limits: Limits::default() }
}

fn benches(c: &mut Criterion) {
    let snap = snapshot();
    let base = sim::from_snapshot(&snap).expect("gpt2_varlen has its full history");
    let big = repeat(&base, 253_000.0 / base.entries as f64);
    let events = snap.events();
    eprintln!("whatif bench: {} requests standing for {} entries", big.requests.len(), big.entries);
    let mut g = c.benchmark_group("whatif");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(6));
    g.bench_function("one_scenario/defaults", |b| b.iter(|| black_box(sim::simulate(&big, &scenario(""), false))));
    g.bench_function("one_scenario/expandable", |b| {
        b.iter(|| black_box(sim::simulate(&big, &scenario("expandable_segments:True"), false)))
    });
    g.bench_function("sweep_12", |b| {
        b.iter(|| {
            let mut n = 0;
            for conf in sim::sweep_confs() {
                n += sim::simulate(&big, &scenario(conf), false).counters.peak_reserved;
            }
            black_box(n)
        })
    });
    g.bench_function("self_check_gpt2_varlen_38k", |b| b.iter(|| black_box(sim::self_check(&base, &Limits::default()))));
    g.bench_function("replay_address_map_gpt2_varlen_38k", |b| {
        b.iter(|| {
            let mut s = State::new(gpufrag::input::rules_from(&snap.settings));
            for e in &events {
                s.apply(e);
            }
            black_box(s.anomaly_count)
        })
    });
    g.bench_function("one_scenario_gpt2_varlen_38k", |b| b.iter(|| black_box(sim::simulate(&base, &scenario(""), false))));
    g.finish();
}

criterion_group!(group, benches);

fn main() {
    group();
    criterion::Criterion::default().configure_from_args().final_summary();
}
