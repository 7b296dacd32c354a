// Shared by the targets: what a user's input goes through after decoding. Every step must finish
// without a panic, and every address map must pass its own invariant check.

use gpufrag::ingest::State;

/// Summary and rendering of a state, plus the map invariants and the to_events round trip.
pub fn after_decoding(state: &State) {
    let summary = gpufrag::analysis::summary::Summary::from_state(state, "fuzz");
    let _ = gpufrag::analysis::render::render(&summary);
    for s in state.spaces.values() {
        if let Err(e) = s.map.check_invariants() {
            panic!("address map invariant broken: {e}");
        }
        let mut again = State::default();
        again.apply_all(&s.map.to_events(s.pid, s.device));
    }
}
