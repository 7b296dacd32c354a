// Shared by the targets: what a user's input goes through after decoding. Every step must finish
// without a panic, and every address map must pass its own invariant check.

use gpufrag::ingest::State;

/// Summary and rendering of a state, plus the map invariants and the to_events round trip.
pub fn after_decoding(state: &State) {
    let summary = gpufrag::analysis::summary::Summary::from_state(state, "fuzz");
    let _ = gpufrag::analysis::render::render(&summary);
    // The allowed-limit explanation's sums (issue 23: one wrapped past 2^64): reserved + requested
    // and the bytes over the limit, worked out in 128 bits, are what it prints. Its reserved bytes
    // are the explanation's inputs' (the allocator's own figure where its OOM report carried one,
    // else the traced segments': OomInputs::of), found by the OOM's event.
    for o in &summary.ooms {
        if let (Some(a), true) = (o.allowed, o.explanation.starts_with("allowed limit: PyTorch's caching allocator may reserve at most")) {
            let rec = state.ooms.iter().find(|r| Some(r.event) == o.event).expect("the summary's OOM is one of the state's");
            let reserved = gpufrag::analysis::OomInputs::of(rec).reserved;
            let sum = (reserved as u128 + o.requested as u128).min(u64::MAX as u128) as u64;
            let want =
                format!("would make {}, {} over", gpufrag::units::human_bytes(sum), gpufrag::units::human_bytes(sum.saturating_sub(a)));
            assert!(o.explanation.contains(&want), "explanation sums: want {want:?} in {:?}", o.explanation);
        }
    }
    for s in state.spaces.values() {
        if let Err(e) = s.map.check_invariants() {
            panic!("address map invariant broken: {e}");
        }
        let mut again = State::default();
        again.apply_all(&s.map.to_events(s.pid, s.device));
    }
}
