//! `gpufrag top`: a live terminal view of where GPU memory is, per device and per process, fed by
//! a running `gpufrag run` (its live feed, see [`crate::views::feed`]) or by a recorded file
//! played back. `app.rs` holds what is shown, `ui.rs` draws it, `term.rs` owns the terminal and
//! restores it on every exit path (normal, error, panic, SIGTERM/SIGINT/SIGHUP, the terminal
//! going away), `replay.rs` plays files back on a clock that `p` stops, `procinfo.rs` reads the
//! command and user of live processes from `/proc`.

pub mod app;
pub mod procinfo;
pub mod replay;
pub mod term;
pub mod ui;

use crate::views::feed::{self, Update};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::path::{Path, PathBuf};
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

/// Runs `f` on the input `file` so that a panic inside becomes an error naming the file: the
/// command line's panic guard, handed down (a view does not import the command line's policy).
pub type Contain = fn(file: &Path, f: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<()>;

/// Runs the UI until `q`, a signal, the terminal going away, or an error; the terminal is
/// restored in every case. The replay thread runs under `contain`: a panic there ends `top` with
/// the error it gives (the caller runs the UI loop of a replay under the same guard).
pub fn run(source: &Source, contain: Contain) -> anyhow::Result<()> {
    match source {
        Source::Connect(p) => {
            let rx = feed::connect(p).map_err(|e| anyhow::anyhow!("connecting to the live feed {}: {e}", p.display()))?;
            let mut app = app::App::new(&format!("{}", p.display()), app::Mode::Live);
            ui_loop(&mut app, &rx, None)
        }
        Source::Replay { path, speed } => {
            let replay = replay::spawn(path, *speed, contain)?;
            let mut app = app::App::new(&format!("{} ×{speed}", path.display()), app::Mode::Replay(replay.control.clone()));
            ui_loop(&mut app, &replay.updates, Some(&replay.control))?;
            match replay.control.failure() {
                Some(e) => Err(crate::input::UnusableInput(e).into()),
                None => Ok(()),
            }
        }
    }
}

/// `--once`: one frame as plain text, `width` columns wide (the table's columns dropped by
/// priority as on a terminal): a live feed's first frame, or a file's last, played at once.
pub fn once(source: &Source, contain: Contain, width: u16) -> anyhow::Result<String> {
    let (mut app, rx, replay) = match source {
        Source::Connect(p) => {
            let rx = feed::connect(p).map_err(|e| anyhow::anyhow!("connecting to the live feed {}: {e}", p.display()))?;
            (app::App::new(&format!("{}", p.display()), app::Mode::Live), rx, None)
        }
        Source::Replay { path, .. } => {
            let replay = replay::spawn(path, 0.0, contain)?;
            let app = app::App::new(&format!("{}", path.display()), app::Mode::Replay(replay.control.clone()));
            (app, replay.updates, Some(replay.control))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(u) => {
                let frame = matches!(u, Update::Frame(_));
                app.update(u);
                if frame && replay.is_none() {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if replay.is_none() && Instant::now() > deadline => {
                anyhow::bail!("the live feed sent no frame in 10 s")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    if let Some(e) = replay.and_then(|c| c.failure()) {
        return Err(crate::input::UnusableInput(e).into());
    }
    if matches!(app.mode, app::Mode::Live) {
        app.learn_owners(procinfo::read);
    }
    let height = ui::once_height(&app);
    let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height))?;
    terminal.draw(|f| ui::draw_once(f, &app))?;
    Ok(buffer_text(terminal.backend().buffer()))
}

/// A drawn buffer as lines of text, trailing blanks cut.
fn buffer_text(b: &ratatui::buffer::Buffer) -> String {
    let w = b.area.width as usize;
    let mut out = String::new();
    for row in b.content.chunks(w.max(1)) {
        let line: String = row.iter().map(|c| c.symbol()).collect();
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// Draws and takes keys until the user quits, a signal arrives or the terminal goes away.
fn ui_loop(app: &mut app::App, rx: &Receiver<Update>, replay: Option<&std::sync::Arc<replay::Control>>) -> anyhow::Result<()> {
    let mut guard = term::TerminalGuard::enter()?;
    let panic_after = std::env::var("GPUFRAG_TOP_TEST_PANIC_AFTER_MS").ok().and_then(|v| v.parse::<u64>().ok()).map(Duration::from_millis);
    let started = Instant::now();
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    loop {
        // A hung-up terminal whose SIGHUP went to the parent shell leaves us orphaned, reading a
        // dead tty: a changed parent means the session is gone.
        // SAFETY: as above.
        if term::signalled().is_some() || term::terminal_gone() || unsafe { libc::getppid() } != parent {
            break;
        }
        loop {
            match rx.try_recv() {
                Ok(u) => app.update(u),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if app.ended.is_none() {
                        app.ended = Some(replay.and_then(|c| c.failure()).unwrap_or_else(|| "the feed closed".into()));
                    }
                    break;
                }
            }
        }
        if matches!(app.mode, app::Mode::Live) {
            app.learn_owners(procinfo::read);
        }
        app.tick(Instant::now());
        if std::mem::take(&mut app.refresh) {
            guard.terminal.clear()?;
        }
        guard.terminal.draw(|f| ui::draw(f, app))?;
        if let Some(after) = panic_after {
            if started.elapsed() >= after {
                panic!("GPUFRAG_TOP_TEST_PANIC_AFTER_MS: a panic on purpose, to test that the terminal is restored");
            }
        }
        if replay.is_some_and(|c| c.failure().is_some()) {
            break;
        }
        let ready = match term::wait_for_input(Duration::from_millis(100)) {
            term::Input::Gone => break,
            term::Input::Idle => false,
            term::Input::Ready => true,
            term::Input::Unwatched => event::poll(Duration::from_millis(100))?,
        };
        // Everything crossterm has parsed, without waiting.
        while ready && event::poll(Duration::ZERO)? {
            if let Event::Key(k) = event::read()? {
                if k.kind == KeyEventKind::Press && app.key(k) {
                    drop(guard);
                    return Ok(());
                }
            }
        }
    }
    drop(guard);
    Ok(())
}
