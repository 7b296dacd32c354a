//! `top --replay FILE [--speed X]`: plays a record file or a snapshot back through the same state
//! and the same frames the live feed serves, paced by the events' own time stamps.

use crate::ingest::State;
use crate::views::feed::{frame, Update};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};
use std::time::{Duration, Instant};

/// Frames per second of wall time the replay sends.
const FRAME_EVERY: Duration = Duration::from_millis(250);
/// The longest pause between two events, in wall time: idle stretches are cut to this.
const MAX_GAP: Duration = Duration::from_secs(2);

/// Starts playing `path` back at `speed` × real time (0: as fast as possible).
pub fn spawn(path: &Path, speed: f64) -> anyhow::Result<Receiver<Update>> {
    let crate::input::Loaded { rules, replay: events, .. } = crate::input::load(path)?;
    let source = format!("replay of {}", path.display());
    let (tx, rx) = sync_channel(4);
    std::thread::Builder::new().name("gpufrag-replay".into()).spawn(move || {
        let mut state = State::new(rules);
        let t0 = events.iter().map(|e| e.ts_ns).find(|t| *t > 0).unwrap_or(0);
        let mut start = Instant::now();
        let mut last_frame = Instant::now();
        let mut seq = 0u64;
        for ev in &events {
            if speed > 0.0 && ev.ts_ns >= t0 && t0 > 0 {
                let due = Duration::from_secs_f64((ev.ts_ns - t0) as f64 / 1e9 / speed);
                let now = start.elapsed();
                if due > now + MAX_GAP {
                    // Cut an idle stretch: move the origin so that this event is due MAX_GAP from now.
                    start -= due - now - MAX_GAP;
                }
                while start.elapsed() < due {
                    let left = due.saturating_sub(start.elapsed());
                    std::thread::sleep(left.min(Duration::from_millis(50)));
                    if last_frame.elapsed() >= FRAME_EVERY {
                        seq += 1;
                        if tx.send(Update::Frame(Box::new(frame(&state, &source, seq, false)))).is_err() {
                            return;
                        }
                        last_frame = Instant::now();
                    }
                }
            }
            state.apply(ev);
            if last_frame.elapsed() >= FRAME_EVERY {
                seq += 1;
                if tx.send(Update::Frame(Box::new(frame(&state, &source, seq, false)))).is_err() {
                    return;
                }
                last_frame = Instant::now();
            }
        }
        seq += 1;
        let _ = tx.send(Update::Frame(Box::new(frame(&state, &source, seq, true))));
        let _ = tx.send(Update::Ended(format!("replay finished: {} events", events.len())));
    })?;
    Ok(rx)
}
