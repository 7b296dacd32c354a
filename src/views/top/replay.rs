//! `top --replay FILE [--speed X]`: plays a record file or a snapshot back through the same state
//! and the same frames the live feed serves, paced by the events' own time stamps.
//!
//! The replay has its own clock: trace time advances by wall time × speed while the replay is
//! not paused ([`Control::set_paused`], `p` in `top`), so a pause stops the events, not just the
//! screen, and an idle stretch longer than [`MAX_GAP`] of wall time is cut short. Where the replay
//! stands (events applied of all, trace time reached of the whole) is in [`Control::position`]
//! for the header. A panic while replaying is contained (the command line's panic guard, handed
//! down as [`super::Contain`]): the thread ends, its channel closes and [`Control::failure`] holds
//! the one-line error naming the file.

use crate::ingest::State;
use crate::views::feed::{frame, Update};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Frames per second of wall time the replay sends.
const FRAME_EVERY: Duration = Duration::from_millis(250);
/// The longest pause between two events, in wall time: idle stretches are cut to this.
pub const MAX_GAP: Duration = Duration::from_secs(2);

/// Where a replay stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// Events applied so far.
    pub done: u64,
    /// Events in the file.
    pub total: u64,
    /// Trace time of the last event applied, ns after the first stamped event.
    pub at_ns: u64,
    /// Trace time of the last event, ns after the first stamped event.
    pub span_ns: u64,
}

/// Shared between `top` and its replay thread: the pause switch, the position and a failure.
#[derive(Debug, Default)]
pub struct Control {
    paused: AtomicBool,
    done: AtomicU64,
    total: AtomicU64,
    at_ns: AtomicU64,
    span_ns: AtomicU64,
    failure: Mutex<Option<String>>,
}

impl Control {
    /// Pauses or resumes the replay (its clock stops while paused).
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }
    /// Whether it is paused.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
    /// Where it stands.
    pub fn position(&self) -> Position {
        Position {
            done: self.done.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            at_ns: self.at_ns.load(Ordering::Relaxed),
            span_ns: self.span_ns.load(Ordering::Relaxed),
        }
    }
    /// The error that ended the replay, if one did (a contained panic).
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().map_or_else(|p| p.into_inner().clone(), |f| f.clone())
    }
}

/// A replay running on its own thread.
pub struct Replay {
    /// Its frames, then `Ended`.
    pub updates: Receiver<Update>,
    /// Its pause switch and position.
    pub control: Arc<Control>,
}

/// Trace time that advances with wall time × speed, except while paused.
struct Clock {
    speed: f64,
    last: Instant,
    /// Trace ns reached.
    now_ns: f64,
}

impl Clock {
    fn tick(&mut self, paused: bool) {
        let wall = self.last.elapsed();
        self.last = Instant::now();
        if !paused {
            self.now_ns += wall.as_secs_f64() * 1e9 * self.speed;
        }
    }
}

/// Starts playing `path` back at `speed` × real time (0: as fast as possible).
/// `contain` is the panic guard the replay runs under (see [`super::Contain`]).
pub fn spawn(path: &Path, speed: f64, contain: super::Contain) -> anyhow::Result<Replay> {
    let crate::input::Loaded { rules, replay: events, .. } = crate::input::load(path)?;
    let control = Arc::new(Control::default());
    let (tx, rx) = sync_channel(4);
    let (c, file) = (control.clone(), path.to_path_buf());
    std::thread::Builder::new().name("gpufrag-replay".into()).spawn(move || {
        let mut state = Some(State::new(rules));
        let r = contain(&file, &mut || {
            if let Some(state) = state.take() {
                play(&file, state, &events, speed, &c, &mut |u| tx.send(u).is_ok());
            }
            Ok(())
        });
        if let Err(e) = r {
            if let Ok(mut f) = c.failure.lock() {
                *f = Some(e.to_string());
            }
        }
    })?;
    Ok(Replay { updates: rx, control })
}

/// Set by tests: panic after this many events (proves the replay runs under the panic guard).
fn panic_after() -> Option<u64> {
    std::env::var("GPUFRAG_TOP_TEST_REPLAY_PANIC_AFTER").ok().and_then(|v| v.parse().ok())
}

/// Plays `events` into `state`, handing frames to `send` (false: the viewer is gone).
fn play(file: &Path, mut state: State, events: &[crate::event::Event], speed: f64, c: &Control, send: &mut dyn FnMut(Update) -> bool) {
    let source = format!("replay of {}", file.display());
    let t0 = events.iter().map(|e| e.ts_ns).find(|t| *t > 0).unwrap_or(0);
    let rel = |ts: u64| if t0 > 0 && ts >= t0 { ts - t0 } else { 0 };
    c.total.store(events.len() as u64, Ordering::Relaxed);
    c.span_ns.store(events.iter().map(|e| rel(e.ts_ns)).max().unwrap_or(0), Ordering::Relaxed);
    let mut clock = Clock { speed, last: Instant::now(), now_ns: 0.0 };
    let max_gap_ns = MAX_GAP.as_secs_f64() * 1e9 * speed;
    let mut last_frame = Instant::now();
    let mut seq = 0u64;
    let panic_at = panic_after();
    let mut frame_due = |state: &State, seq: &mut u64, last_frame: &mut Instant| -> bool {
        if last_frame.elapsed() < FRAME_EVERY {
            return true;
        }
        *seq += 1;
        *last_frame = Instant::now();
        send(Update::Frame(Box::new(frame(state, &source, *seq, false))))
    };
    for (i, ev) in events.iter().enumerate() {
        if panic_at == Some(i as u64) {
            panic!("GPUFRAG_TOP_TEST_REPLAY_PANIC_AFTER: a panic on purpose, to test the replay's guard");
        }
        let due = rel(ev.ts_ns) as f64;
        loop {
            clock.tick(c.paused());
            let paced = speed > 0.0 && ev.ts_ns > 0;
            if !c.paused() && (!paced || clock.now_ns >= due) {
                break;
            }
            if paced && !c.paused() && due - clock.now_ns > max_gap_ns {
                // Cut an idle stretch: this event becomes due MAX_GAP from now.
                clock.now_ns = due - max_gap_ns;
            }
            let left = if c.paused() { Duration::from_millis(50) } else { Duration::from_secs_f64((due - clock.now_ns) / 1e9 / speed) };
            std::thread::sleep(left.min(Duration::from_millis(50)));
            if !frame_due(&state, &mut seq, &mut last_frame) {
                return;
            }
        }
        state.apply(ev);
        if let Some(comm) = ev.comm() {
            // A record of the eBPF agent names each process at its exit: what a replay knows.
            state.identities.entry(ev.pid).or_insert_with(|| Arc::new(crate::attribution::Identity { exe: comm, ..Default::default() }));
        }
        c.done.store(i as u64 + 1, Ordering::Relaxed);
        c.at_ns.store(rel(ev.ts_ns), Ordering::Relaxed);
        if !frame_due(&state, &mut seq, &mut last_frame) {
            return;
        }
    }
    seq += 1;
    let _ = send(Update::Frame(Box::new(frame(&state, &source, seq, true))));
    let _ = send(Update::Ended(format!("replay finished: {} events", events.len())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventKind};

    fn alloc(ts_ns: u64, addr: u64) -> Event {
        Event { ts_ns, addr, size: 1 << 20, ..Event::new(EventKind::MemAlloc, 7, 0) }
    }

    /// Issue 17: `p` froze the screen while the replay kept playing. Paused, no event is applied
    /// however long the pause; resumed, the rest plays.
    #[test]
    fn regression_pause_stops_the_replay_itself_not_just_the_screen() {
        let events: Vec<Event> = (0..4).map(|i| alloc(1_000_000_000 + i * 100_000_000, (i + 1) << 30)).collect();
        let control = Arc::new(Control::default());
        control.set_paused(true);
        let c = control.clone();
        let (tx, rx) = sync_channel(64);
        let t = std::thread::spawn(move || play(Path::new("t.rec"), State::default(), &events, 1.0, &c, &mut |u| tx.send(u).is_ok()));
        std::thread::sleep(Duration::from_millis(700));
        let held = control.position();
        assert_eq!((held.done, held.total), (0, 4), "paused from the start: nothing applied in 700 ms ({held:?})");
        control.set_paused(false);
        let mut last = None;
        while let Ok(u) = rx.recv_timeout(Duration::from_secs(5)) {
            if let Update::Frame(f) = u {
                last = f.summary.devices.first().map(|d| d.map.reserved);
            } else {
                break;
            }
        }
        t.join().expect("replay thread");
        let end = control.position();
        assert_eq!((end.done, end.at_ns, end.span_ns), (4, 300_000_000, 300_000_000), "{end:?}");
        assert_eq!(last, Some(4 << 20), "the final frame holds all four segments");
    }
}
