//! Every input kept in fuzz/regressions/ as an ordinary named test (`include_bytes!`), so that a
//! fixed bug stays fixed without the fuzzer: each goes through the same steps as the fuzz target
//! of its kind (decode, replay, summary, rendering, the map invariants) and must end without a
//! panic within a second. A crash the fuzzer finds later is minimised (`cargo +nightly fuzz tmin`),
//! copied here with a name saying what it provoked, and gets a test below (docs/robustness.md).

use gpufrag::ingest::State;
use std::path::Path;
use std::time::{Duration, Instant};

/// What the fuzz targets run after decoding: the same file, so the two cannot drift apart.
#[path = "../fuzz/fuzz_targets/common.rs"]
mod common;
use common::after_decoding;

fn record(bytes: &[u8]) -> State {
    let t = Instant::now();
    let rec = gpufrag::record::parse(Path::new("regression.rec"), bytes).expect("a record file");
    let mut state = State::default();
    state.apply_all(&rec.events);
    after_decoding(&state);
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
    state
}

// A zero-size map and an unmap over it: `AddressSpace::unmap` looped for ever (issue 14's
// 176-byte record file).
#[test]
fn fuzz_regression_record_zero_size_map_then_unmap_terminates() {
    let state = record(include_bytes!("../fuzz/regressions/record_zero_size_map_then_unmap.rec"));
    assert_eq!(state.anomaly_count, 2, "{:?}", state.anomalies);
}

// An empty segment at the start of a live one orphaned its tiling: `Tiling::split` walked a list
// that never ended and the live-block counter wrapped (capacity overflow in `to_events`).
#[test]
fn fuzz_regression_record_empty_segment_on_a_live_one_keeps_the_map_consistent() {
    let state = record(include_bytes!("../fuzz/regressions/record_empty_segment_on_a_live_one.rec"));
    assert!(!state.exact());
}

// A segment whose end wraps past 2^64 was accepted (and its end wrapped to a small address).
#[test]
fn fuzz_regression_record_segment_end_wrapping_past_2_64_is_an_anomaly() {
    let state = record(include_bytes!("../fuzz/regressions/record_segment_end_wraps_past_2_64.rec"));
    assert_eq!(state.spaces.values().map(|s| s.map.figures().segments).sum::<u64>(), 0);
    assert!(state.anomaly_count >= 1);
}

// An allocator OOM under a fraction whose report carries the allocator's own reserved bytes
// (800 GiB) beside traced segments that hold far less: the explanation works its sums from the
// allocator's figure (what PyTorch's message says), the fuzz target's check took the traced one
// and called the sums wrong (found by the record target in a 30-minute run, issue 23). The check
// now reads the explanation's own inputs; the sums themselves were right.
#[test]
fn fuzz_regression_record_allowed_limit_sums_use_the_allocators_own_reserved_bytes() {
    let state = record(include_bytes!("../fuzz/regressions/record_allocator_reserved_beside_traced_reserved.rec"));
    let s = gpufrag::analysis::summary::Summary::from_state(&state, "regression");
    let o = s.ooms.iter().find(|o| o.allowed.is_some()).expect("an allowed-limit OOM");
    assert!(
        o.explanation.contains("it held 800.00 GiB reserved") && o.explanation.contains("would make 800.00 GiB, 800.00 GiB over"),
        "{}",
        o.explanation
    );
}

// Live driver allocations whose owner's sum passed 2^64 (found by the record target in 15 s of
// its 30-minute run, this round): `OwnerBytes::add` overflowed (a panic under the fuzz build's
// overflow checks, a wrapped figure without). The sums are exact (u128) and read saturated; the
// unit test `ingest::owners::tests::sizes_summing_past_2_64_stay_exact_and_read_saturated` shows
// the figures. Kept whole (3,152 bytes): it replays through the fuzz target's own checks.
#[test]
fn fuzz_regression_record_owner_sizes_past_2_64_read_saturated_never_wrapped() {
    let bytes = include_bytes!("../fuzz/regressions/record_owner_sizes_past_2_64.rec");
    record(bytes);
    // Event by event: at the allocation that takes an owner's live sum past 2^64 − 1 the figure
    // reads 2^64 − 1 (wrapped, it read a few bytes).
    let rec = gpufrag::record::parse(Path::new("regression.rec"), bytes).expect("a record file");
    let mut state = State::default();
    let mut saturated_at = None;
    for (i, e) in rec.events.iter().enumerate() {
        state.apply(e);
        let full =
            state.spaces.values().any(|d| d.owners.by_owner().iter().any(|&(_, b)| b == u64::MAX) || d.owners.unattributed() == u64::MAX);
        if full && saturated_at.is_none() {
            saturated_at = Some(i);
        }
    }
    assert!(saturated_at.is_some(), "no owner's sum read 2^64 - 1 over the {} events", rec.events.len());
}

// An allowed-limit OOM whose reserved + requested passes 2^64: the fix's sum overflowed (a panic
// under overflow checks, a wrapped "allows at least 1684300900.39 GiB" without), while the
// explanation beside it capped the same sum. Found by the record target in its 30-minute run.
#[test]
fn fuzz_regression_record_allowed_limit_fix_caps_its_sum_as_the_explanation_does() {
    let state = record(include_bytes!("../fuzz/regressions/record_allowed_limit_fix_sum_past_2_64.rec"));
    let s = gpufrag::analysis::summary::Summary::from_state(&state, "regression");
    let o = s.ooms.iter().find(|o| o.allowed.is_some()).expect("an allowed-limit OOM");
    // The explanation's "... would make S, D over": the fix asks for the same S.
    let made = o.explanation.split("would make ").nth(1).and_then(|t| t.split(',').next()).expect("the explanation's sum");
    let want = format!("allows at least {made} ");
    assert!(o.fix.contains(&want), "want {want:?} in the fix {:?}; the explanation: {:?}", o.fix, o.explanation);
}

// Memo-shared containers: 8 KB naming 2,000 segments of 2,000 blocks each (4 million blocks) were
// expanded in full (21 KB took 2.2 GB). Refused with an error naming the file and the offset.
#[test]
fn fuzz_regression_pickle_memo_shared_containers_are_refused_not_expanded() {
    let t = Instant::now();
    let bytes = include_bytes!("../fuzz/regressions/pickle_memo_shared_containers.pickle");
    let e = gpufrag::snapshot::from_bytes_unguarded(bytes, Path::new("shared.pickle")).expect_err("refused");
    let msg = e.to_string();
    assert!(msg.starts_with("shared.pickle: shared (memoized) containers expand to more than"), "{msg}");
    assert!(e.offset().is_some(), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
}

// The seed corpus itself decodes and replays (a corpus entry that stops decoding is a fixture
// that no longer exercises the decoder).
#[test]
fn fuzz_seed_corpus_entries_decode_and_replay() {
    for bytes in [
        &include_bytes!("../fuzz/corpus/snapshot/frag_oom.pickle")[..],
        &include_bytes!("../fuzz/corpus/snapshot/pinned_splits.pickle")[..],
    ] {
        let snap = gpufrag::snapshot::from_bytes_unguarded(bytes, Path::new("seed.pickle")).expect("a snapshot");
        after_decoding(&gpufrag::input::replay_snapshot(&snap).state);
    }
    record(include_bytes!("../fuzz/corpus/record/gpt2_run_h200_head.rec"));
    let mut frames = 0;
    gpufrag::views::feed::read_feed(&include_bytes!("../fuzz/corpus/feed/frames.jsonl")[..], "seed", |u| {
        frames += matches!(u, gpufrag::views::feed::Update::Frame(_)) as usize;
        true
    });
    assert_eq!(frames, 2);
}
