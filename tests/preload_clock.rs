//! The shim's clock: where the CPU has an invariant TSC the shim stamps events with raw ticks
//! (`HELLO_F_TSC`) and the consumer converts them to `CLOCK_MONOTONIC` ns after the merge; with
//! `GPUFRAG_CLOCK=monotonic` it stamps `CLOCK_MONOTONIC` itself. Either way the consumer hands
//! out `CLOCK_MONOTONIC` ns, inside the test's own clock readings before and after the workload,
//! in order; a fork child keeps its parent's clock, an exec'd image chooses again; the periodic
//! device samples keep their period in ticks.

mod preload_common;

use gpufrag_wire::clock::{invariant_tsc, monotonic_ns};
use gpufrag_wire::event::EventKind;
use gpufrag_wire::hello::HELLO_F_TSC;
use preload_common::*;

/// Runs `args` under the shim with `env`; checks every traced image's clock flag and that its
/// events carry non-decreasing `CLOCK_MONOTONIC` ns within the run.
fn check(args: &[&str], env: &[(&str, &str)], tsc: bool) -> Run {
    let t0 = monotonic_ns();
    let run = traced_run(args, env);
    let t1 = monotonic_ns();
    assert!(run.output.status.success(), "{}\n{}", run.stdout(), String::from_utf8_lossy(&run.output.stderr));
    assert!(!run.traced.is_empty());
    for t in &run.traced {
        assert_eq!(t.hello.flags & HELLO_F_TSC != 0, tsc, "pid {} flags {:#x}", t.hello.pid, t.hello.flags);
        assert!(!t.events.is_empty());
        for e in &t.events {
            assert!((t0..=t1).contains(&e.ts_ns), "{:?} at {} outside the run {t0}..={t1}", e.kind(), e.ts_ns);
        }
        // Each thread's events in order; the region's too once converted from ticks (each
        // converted timestamp is clamped to the one before). With `CLOCK_MONOTONIC` stamps, events
        // of different threads with no causal link may come out of the merge out of timestamp
        // order by the width of a push (see `Merge`).
        let mut last = std::collections::HashMap::new();
        for e in &t.events {
            let prev = last.insert(e.tid, e.ts_ns).unwrap_or(0);
            assert!(prev <= e.ts_ns, "pid {} tid {}: {prev} then {}", t.hello.pid, e.tid, e.ts_ns);
        }
        if tsc {
            assert!(t.events.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns), "pid {}: timestamps out of order", t.hello.pid);
        }
    }
    run
}

#[test]
fn tsc_ticks_arrive_as_monotonic_ns() {
    let tsc = invariant_tsc();
    eprintln!("invariant TSC: {tsc}");
    // Parent, fork child (keeps the clock), exec'd image (chooses again).
    let run = check(&["fork-exec"], &[], tsc);
    assert_eq!(run.traced.len(), 3);
    // Many threads, several lanes merged.
    let run = check(&["threads", "8", "2000"], &[], tsc);
    let t = run.only();
    // Plus the shim's placement event(s) of device 0 (DeviceUuid: threads racing to the first
    // allocation may each ask once).
    assert!((1..=8).contains(&t.placements.len()), "{}", t.placements.len());
    assert_eq!(t.received, 2 * 8 * 2000 + 4 + t.placements.len() as u64);
}

#[test]
fn monotonic_when_asked() {
    let run = check(&["fork-exec"], &[("GPUFRAG_CLOCK", "monotonic")], false);
    assert_eq!(run.traced.len(), 3);
    check(&["threads", "8", "2000"], &[("GPUFRAG_CLOCK", "monotonic")], false);
}

/// Periodic device samples every 5 ms: no more often than that (the period is kept in ticks, at a
/// rate estimated on the sampling path), and they do happen.
#[test]
fn periodic_samples_keep_their_period() {
    for clock in ["tsc", "monotonic"] {
        let run = check(&["pairs", "300000"], &[("GPUFRAG_SAMPLE_MS", "5"), ("GPUFRAG_CLOCK", clock)], clock == "tsc" && invariant_tsc());
        let t = run.only();
        let allocs: Vec<u64> = t.events.iter().filter(|e| e.kind() == Some(EventKind::MemAlloc)).map(|e| e.ts_ns).collect();
        let (first, last) = (allocs[0], allocs[allocs.len() - 1]);
        let samples: Vec<u64> = t
            .events
            .iter()
            .filter(|e| e.kind() == Some(EventKind::DeviceInfo))
            .map(|e| e.ts_ns)
            .filter(|&ts| ts > first && ts < last)
            .collect();
        let ms = (last - first) / 1_000_000;
        eprintln!("{clock}: {} samples in {ms} ms", samples.len());
        assert!(samples.len() as u64 <= ms / 5 + 2, "{clock}: {} samples in {ms} ms", samples.len());
        if ms >= 50 {
            assert!(samples.len() as u64 >= ms / 5 / 4, "{clock}: only {} samples in {ms} ms", samples.len());
        }
        // Consecutive periodic samples about a period apart (each sample is stamped after its
        // measurement, so single gaps jitter by that much; the median does not).
        let mut gaps: Vec<u64> = samples.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort_unstable();
        if let Some(&median) = gaps.get(gaps.len() / 2) {
            assert!(median >= 4_500_000, "{clock}: samples a median {median} ns apart");
        }
    }
}
