//! `gpufrag top`: a live terminal view of where GPU memory is, per device and per process, fed by
//! a running `gpufrag run` (its live feed, see [`crate::views::feed`]) or by a recorded file
//! played back. `app.rs` holds what is shown, `ui.rs` draws it, `term.rs` owns the terminal and
//! restores it on every exit path (normal, error, panic, SIGTERM/SIGINT/SIGHUP), `replay.rs` plays
//! files back.

pub mod app;
pub mod replay;
pub mod term;
pub mod ui;

use crate::views::feed::{self, Update};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// Where `top` reads from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A live feed socket.
    Connect(PathBuf),
    /// A record file or snapshot, played back at `speed` × real time (0: at once).
    Replay {
        /// The file.
        path: PathBuf,
        /// Playback speed.
        speed: f64,
    },
}

/// Runs the UI until `q`, a signal, or an error; the terminal is restored in every case.
pub fn run(source: &Source) -> anyhow::Result<()> {
    let (rx, label): (Receiver<Update>, String) = match source {
        Source::Connect(p) => (feed::connect(p).map_err(|e| anyhow::anyhow!("connecting to the live feed {}: {e}", p.display()))?, format!("live {}", p.display())),
        Source::Replay { path, speed } => (replay::spawn(path, *speed)?, format!("replay {} ×{speed}", path.display())),
    };
    let mut app = app::App::new(&label);
    let mut guard = term::TerminalGuard::enter()?;
    let panic_after = std::env::var("GPUFRAG_TOP_TEST_PANIC_AFTER_MS").ok().and_then(|v| v.parse::<u64>().ok()).map(Duration::from_millis);
    let started = Instant::now();
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    loop {
        // A hung-up terminal whose SIGHUP went to the parent shell leaves us orphaned, reading a
        // dead tty that polls ready forever: a changed parent means the session is gone.
        // SAFETY: as above.
        if term::signalled().is_some() || unsafe { libc::getppid() } != parent {
            break;
        }
        loop {
            match rx.try_recv() {
                Ok(u) => app.update(u),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if app.ended.is_none() {
                        app.ended = Some("the feed closed".into());
                    }
                    break;
                }
            }
        }
        guard.terminal.draw(|f| ui::draw(f, &app))?;
        if let Some(after) = panic_after {
            if started.elapsed() >= after {
                panic!("GPUFRAG_TOP_TEST_PANIC_AFTER_MS: a panic on purpose, to test that the terminal is restored");
            }
        }
        if event::poll(Duration::from_millis(100))? {
            if let Event::Key(k) = event::read()? {
                if k.kind == KeyEventKind::Press && app.key(k) {
                    break;
                }
            }
        }
    }
    drop(guard);
    Ok(())
}
