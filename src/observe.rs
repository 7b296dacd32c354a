//! What live front ends plug into: `run`, `attach` and `agent` call every [`Observer`] with the
//! state at each tick and once at the end. Exporters (OTLP, Prometheus), the live feed that `top`
//! reads, and the post-mortem report writer are observers; the capture path knows none of them.

use crate::event::Event;
use crate::ingest::State;

/// Something that watches the live state.
pub trait Observer: Send {
    /// Called about every status interval with the current state.
    fn tick(&mut self, state: &State);
    /// Called once after the traced processes ended and the last events were applied.
    fn finish(&mut self, state: &State);
    /// Called after each event was applied to `state` (default: nothing). Views that keep a
    /// history need every event: the memviz export's trace, the report's timeline and its map at
    /// the moment of each OOM. Must be cheap: it runs on the capture's hot path.
    fn event(&mut self, _state: &State, _ev: &Event) {}
    /// Called once when the capture is in place (the eBPF session attached, or `run`'s program
    /// started under the shim): the Prometheus endpoint's `/readyz` waits for it (default:
    /// nothing).
    fn capture_started(&mut self) {}
}
