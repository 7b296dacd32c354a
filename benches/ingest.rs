//! Ingest throughput: the `gpt2_varlen` trace (a PyTorch memory snapshot of a GPT-2 run with
//! variable-length batches: segment allocations, then ~13k block allocations and frees) replayed
//! into a fresh address map per iteration, with the figures kept current. Parsing is excluded:
//! the snapshot is decoded into wire events once, before anything is timed.
//!
//! Variants, all over the same events, in events per second:
//! - `state_apply`: `ingest::State::apply`, the one entry point every source feeds.
//! - `state_apply_read_figures`: the same, reading the (pid, device) map's `figures()` after every
//!   event, as a live display would; the gap to `state_apply` is the cost of that read (O(1)).
//! - `address_space`: the map alone (`AddressSpace` calls, events pre-decoded into ops), without
//!   `State`'s kind decoding, space lookup and size histogram.
//! - `naive_model`: the naive model of `tests/common/naive.rs` (linear scans, nothing derived
//!   kept), the alternative the map is measured against; `naive_model_read_figures_every_64`
//!   reads its figures (recomputed from scratch) after one event in 64.
//!
//! gpt2_varlen never holds more than 745 live blocks in 204 segments, small enough for linear
//! scans to do well; `ingest_churn_4k_live` replays a synthetic stream holding ~4,000 live blocks
//! to show how the two scale.
//!
//! Run: `cargo bench --bench ingest`; results and the ratios are in docs/benchmarks.md.

#[path = "../tests/common/naive.rs"]
mod naive;

use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use gpufrag::alloc::pytorch::AllocatorRules;
use gpufrag::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_FRAMEWORK_OWNED};
use gpufrag::ingest::State;
use gpufrag::map::{AddressSpace, SegmentKind};
use naive::NaiveState;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

const TRACE: &str = "tests/fixtures/gpt2_varlen.pickle.gz";

/// The trace's events and the allocator rules it was recorded under.
fn trace() -> (Vec<Event>, AllocatorRules) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    let snap = gpufrag::snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"));
    (snap.events(), gpufrag::input::rules_from(&snap.settings))
}

/// An event as the direct map call it becomes (the `address_space` variant).
#[derive(Clone, Copy)]
enum MapOp {
    DriverAlloc { addr: u64, size: u64, framework: bool },
    DriverFree { addr: u64 },
    BlockAlloc { addr: u64, requested: u64, known: Option<u64> },
    BlockFree { addr: u64 },
}

fn map_ops(events: &[Event]) -> Vec<MapOp> {
    events
        .iter()
        .filter_map(|e| {
            let op = match e.kind()? {
                EventKind::MemAlloc => MapOp::DriverAlloc { addr: e.addr, size: e.size, framework: e.flags & F_FRAMEWORK_OWNED != 0 },
                EventKind::MemFree => MapOp::DriverFree { addr: e.addr },
                EventKind::BlockAlloc => {
                    MapOp::BlockAlloc { addr: e.addr, requested: e.requested, known: (e.flags & F_BLOCK_SIZE_KNOWN != 0).then_some(e.size) }
                }
                EventKind::BlockFree => MapOp::BlockFree { addr: e.addr },
                _ => return None, // this trace has no other map events
            };
            Some(op)
        })
        .collect()
}

fn apply_ops(m: &mut AddressSpace, ops: &[MapOp]) -> u64 {
    let mut anomalies = 0;
    for op in ops {
        let r = match *op {
            MapOp::DriverAlloc { addr, size, framework } => m.driver_alloc(addr, size, SegmentKind::Driver, framework, 0),
            MapOp::DriverFree { addr } => m.driver_free(addr),
            MapOp::BlockAlloc { addr, requested, known } => m.block_alloc(addr, requested, known).map(|_| ()),
            MapOp::BlockFree { addr } => m.block_free(addr).map(|_| ()),
        };
        anomalies += r.is_err() as u64;
    }
    anomalies
}

fn ingest(c: &mut Criterion) {
    let (events, rules) = trace();
    let ops = map_ops(&events);

    // The replay is only worth timing if it is right: the map, and the naive model, end where the
    // model says, with no anomaly.
    let mut state = State::new(rules.clone());
    state.apply_all(&events);
    let mut model = NaiveState::new(rules.clone());
    events.iter().for_each(|e| model.apply(e));
    let (real, naive) = (state.spaces[&(0, 0)].map.figures(), model.space(0, 0).figures());
    assert_eq!(real, naive, "map and model disagree on the replay");
    assert!(state.exact() && model.anomalies == 0, "anomalies in the replay: {:?}", state.anomalies);
    let mut direct = AddressSpace::new(rules.clone());
    assert_eq!(apply_ops(&mut direct, &ops), 0);
    assert_eq!(direct.figures(), real);

    let mut g = c.benchmark_group("ingest_gpt2_varlen");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));

    g.bench_function("state_apply", |b| {
        b.iter_batched(
            || State::new(rules.clone()),
            |mut s| {
                for e in &events {
                    s.apply(e);
                }
                s // dropped outside the timing
            },
            BatchSize::SmallInput,
        )
    });

    g.bench_function("state_apply_read_figures", |b| {
        b.iter_batched(
            || State::new(rules.clone()),
            |mut s| {
                for e in &events {
                    s.apply(e);
                    if let Some(space) = s.spaces.get(&(e.pid, e.device)) {
                        black_box(space.map.figures());
                    }
                }
                s
            },
            BatchSize::SmallInput,
        )
    });

    // The map alone; the op count differs from the event count only by events that are not map
    // operations (none in this trace), so the events/s figures compare.
    g.bench_function("address_space", |b| {
        b.iter_batched(
            || AddressSpace::new(rules.clone()),
            |mut m| {
                black_box(apply_ops(&mut m, &ops));
                m
            },
            BatchSize::SmallInput,
        )
    });

    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function("naive_model", |b| {
        b.iter_batched(
            || NaiveState::new(rules.clone()),
            |mut s| {
                for e in &events {
                    s.apply(e);
                }
                s
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    // Recomputing every figure from scratch after each event is slow enough to need its own,
    // smaller group: one event in 64, the throughput counted in events replayed.
    let mut g = c.benchmark_group("ingest_gpt2_varlen_naive_figures");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(10));
    g.bench_function("naive_model_read_figures_every_64", |b| {
        b.iter_batched(
            || NaiveState::new(rules.clone()),
            |mut s| {
                for (i, e) in events.iter().enumerate() {
                    s.apply(e);
                    if i % 64 == 0 {
                        black_box(s.space(e.pid, e.device).figures());
                    }
                }
                s
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// A synthetic stream with many live blocks, where the naive model's linear scans show: 32
/// framework segments of 64 MiB, then allocations (512 B to 1 MiB, placed first-fit from a random
/// free run) and frees of random live blocks, holding about `live` blocks; `len` events in all.
/// Generated against the map itself so that every event is valid. Deterministic (xorshift).
fn churn(live: usize, len: usize) -> Vec<Event> {
    const BASE: u64 = 0x7f00_0000_0000;
    const SEGMENT: u64 = 64 << 20;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut m = AddressSpace::default();
    let mut out = Vec::with_capacity(len);
    for i in 0..32 {
        let addr = BASE + i * 2 * SEGMENT;
        m.driver_alloc(addr, SEGMENT, SegmentKind::Driver, true, 0).expect("fresh segment");
        out.push(Event { addr, size: SEGMENT, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 0, 0) });
    }
    let mut live_blocks: Vec<u64> = Vec::new();
    while out.len() < len {
        let r = next();
        if live_blocks.len() < live / 2 || (live_blocks.len() < live && r % 2 == 0) {
            let rounded = 512 * (1 + (r >> 8) % 2048);
            let requested = rounded - (r >> 32) % 512;
            let runs: Vec<(u64, u64)> = m.free_runs().collect();
            let from = (r >> 40) as usize % runs.len();
            let Some(&(addr, _)) = runs[from..].iter().chain(&runs[..from]).find(|&&(_, l)| l >= rounded) else { continue };
            m.block_alloc(addr, requested, None).expect("fits its run");
            live_blocks.push(addr);
            out.push(Event { addr, requested, ..Event::new(EventKind::BlockAlloc, 0, 0) });
        } else {
            let addr = live_blocks.swap_remove((r >> 16) as usize % live_blocks.len());
            m.block_free(addr).expect("live block");
            out.push(Event { addr, ..Event::new(EventKind::BlockFree, 0, 0) });
        }
    }
    out
}

fn churn_many_live_blocks(c: &mut Criterion) {
    let events = churn(4096, 40_000);
    let rules = AllocatorRules::default();
    let mut state = State::new(rules.clone());
    state.apply_all(&events);
    assert!(state.exact(), "{:?}", state.anomalies);
    let mut g = c.benchmark_group("ingest_churn_4k_live");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    g.bench_function("state_apply", |b| {
        b.iter_batched(
            || State::new(rules.clone()),
            |mut s| {
                s.apply_all(&events);
                s
            },
            BatchSize::SmallInput,
        )
    });
    g.measurement_time(Duration::from_secs(10));
    g.bench_function("naive_model", |b| {
        b.iter_batched(
            || NaiveState::new(rules.clone()),
            |mut s| {
                events.iter().for_each(|e| s.apply(e));
                s
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, ingest, churn_many_live_blocks);

/// Replays the events `n` times with no timing, for instruction counts under callgrind (take the
/// difference between two `n`, which cancels the decoding): `what` is `state` (`State::apply`),
/// `figures` (the same, reading figures after every event) or `naive`; `churn` in it replays the
/// synthetic stream instead of gpt2_varlen.
fn replay(n: usize, what: &str) {
    let (trace, rules) = trace();
    let events = if what.contains("churn") { churn(4096, 40_000) } else { trace };
    let mut check = 0u64;
    // Decided once: a `contains` per event cost ~22 instructions/event of harness in the counts.
    let (naive, figures) = (what.contains("naive"), what.contains("figures"));
    for _ in 0..n {
        if naive {
            let mut s = NaiveState::new(rules.clone());
            events.iter().for_each(|e| s.apply(e));
            check ^= s.anomalies;
            std::mem::forget(s); // as in the timed variants, dropping is not counted
            continue;
        }
        let mut s = State::new(rules.clone());
        for e in &events {
            s.apply(e);
            if figures {
                check ^= s.spaces.get(&(e.pid, e.device)).map_or(0, |p| p.map.figures().largest_free_block);
            }
        }
        check ^= s.anomaly_count;
        std::mem::forget(s);
    }
    println!("replayed {} events {n} times ({what}), check {check}", events.len());
}

/// criterion's `main`, plus `INGEST_REPLAY=N [INGEST_REPLAY_WHAT=state|figures|naive[,churn]]`
/// to run [`replay`] instead.
fn main() {
    if let Some(n) = std::env::var("INGEST_REPLAY").ok().and_then(|v| v.parse().ok()) {
        replay(n, &std::env::var("INGEST_REPLAY_WHAT").unwrap_or_else(|_| "state".into()));
        return;
    }
    benches();
    criterion::Criterion::default().configure_from_args().final_summary();
}
