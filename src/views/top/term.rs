//! The terminal, put back the way it was on every exit path: a guard whose `Drop` leaves the
//! alternate screen, shows the cursor and ends raw mode; a panic hook that does the same before
//! the panic message prints; and SIGTERM / SIGINT / SIGHUP handlers that only set a flag, which
//! the UI loop checks at least every 100 ms and then returns normally (so the guard runs).
//!
//! A terminal that goes away (its window closed, its tmux pane killed, its ssh connection cut)
//! leaves a tty that reads end-of-file for ever; crossterm's reader loops on that without
//! returning (it spun a core and never saw the SIGHUP flag, issue 14). So the UI loop never
//! hands crossterm a read that could hit that end: [`wait_for_input`] polls the terminal itself
//! and says [`Input::Gone`] on a hang-up, an error or a readable tty with nothing to read. And a
//! watchdog thread ends the process within [`GRACE`] of a hang-up or a stop signal if the UI loop
//! has not (the loop stuck in a draw or a read), putting the terminal back first.

use ratatui::crossterm::cursor::{Hide, Show};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen};
use std::io::{stdout, Stdout};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Once;
use std::time::Duration;

/// The terminal type `top` draws on.
pub type Term = ratatui::Terminal<ratatui::backend::CrosstermBackend<Stdout>>;

static SIGNAL: AtomicI32 = AtomicI32::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();
static GONE: AtomicBool = AtomicBool::new(false);
static WATCHDOG: Once = Once::new();
static UI_THREAD: std::sync::OnceLock<std::thread::ThreadId> = std::sync::OnceLock::new();

/// How long after a hang-up or a stop signal the watchdog waits for the UI loop to end.
pub const GRACE: Duration = Duration::from_millis(1000);

/// What the terminal has for the UI loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Nothing within the wait.
    Idle,
    /// Bytes to read: crossterm may read them without blocking or spinning.
    Ready,
    /// The terminal hung up or reads end-of-file: it is gone.
    Gone,
    /// Stdin is not the terminal (crossterm reads keys from `/dev/tty` then): not watched here,
    /// the caller waits in crossterm's own poll.
    Unwatched,
}

/// The file descriptor of the terminal keys come from (crossterm's choice: stdin when it is a
/// tty), or `None` when stdin is not a tty.
fn tty_fd() -> Option<libc::c_int> {
    // SAFETY: isatty only inspects the descriptor.
    (unsafe { libc::isatty(0) } == 1).then_some(0)
}

/// Waits up to `timeout` for input on the terminal, without reading it.
pub fn wait_for_input(timeout: Duration) -> Input {
    let Some(fd) = tty_fd() else {
        return Input::Unwatched;
    };
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd we own, for the length we pass.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as libc::c_int) };
    if n <= 0 {
        return Input::Idle; // a timeout, or EINTR from a signal (the loop checks the flag next)
    }
    if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        GONE.store(true, Ordering::SeqCst);
        return Input::Gone;
    }
    let mut pending: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int we own.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut pending) };
    if r == 0 && pending == 0 {
        // Readable with nothing to read: end-of-file, a hung-up tty.
        GONE.store(true, Ordering::SeqCst);
        return Input::Gone;
    }
    Input::Ready
}

/// Whether the terminal went away.
pub fn terminal_gone() -> bool {
    GONE.load(Ordering::SeqCst)
}

/// Starts the watchdog (once): it polls the terminal for a hang-up (no input is read) and the
/// stop flag, and when either has lasted [`GRACE`] without the UI loop ending, puts the terminal
/// back and ends the process (exit 128 + the signal, or 129 for a hang-up without one).
fn start_watchdog() {
    WATCHDOG.call_once(|| {
        let fd = tty_fd();
        let _ = std::thread::Builder::new().name("gpufrag-top-watchdog".into()).spawn(move || {
            let mut since: Option<std::time::Instant> = None;
            loop {
                match fd {
                    Some(fd) => {
                        // events 0: only a hang-up, an error or a closed descriptor wake it.
                        let mut p = libc::pollfd { fd, events: 0, revents: 0 };
                        // SAFETY: one pollfd we own, for the length we pass.
                        let n = unsafe { libc::poll(&mut p, 1, 200) };
                        if n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                            GONE.store(true, Ordering::SeqCst);
                            if p.revents & libc::POLLNVAL != 0 {
                                std::thread::sleep(Duration::from_millis(200)); // no busy poll on a closed fd
                            }
                        }
                    }
                    None => std::thread::sleep(Duration::from_millis(200)),
                }
                if !ACTIVE.load(Ordering::SeqCst) {
                    if GONE.load(Ordering::SeqCst) || signalled().is_some() {
                        return; // the UI loop ended: nothing left to watch
                    }
                    continue;
                }
                if terminal_gone() || signalled().is_some() {
                    let t = *since.get_or_insert_with(std::time::Instant::now);
                    if t.elapsed() >= GRACE {
                        restore();
                        let code = signalled().map_or(129, |s| 128 + s);
                        // SAFETY: ends the process at once; nothing is left to flush to a dead tty.
                        unsafe { libc::_exit(code) };
                    }
                }
            }
        });
    });
}

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// The signal that asked `top` to stop, if one did.
pub fn signalled() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Puts the terminal back (idempotent; safe to call from the panic hook).
pub fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(stdout(), LeaveAlternateScreen, Show);
    }
}

/// Owns the terminal's raw mode and alternate screen while alive.
pub struct TerminalGuard {
    /// The terminal to draw on.
    pub terminal: Term,
}

impl TerminalGuard {
    /// Enters raw mode and the alternate screen, with the panic hook and signal handlers installed.
    pub fn enter() -> std::io::Result<TerminalGuard> {
        let _ = UI_THREAD.set(std::thread::current().id());
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // Only the UI thread's panic ends the UI: another thread's (the replay's, which its
                // panic guard turns into an error) must not pull the screen from under it.
                if UI_THREAD.get() == Some(&std::thread::current().id()) {
                    restore();
                }
                previous(info);
            }));
        });
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            // SAFETY: installs a handler that only stores into an atomic (async-signal-safe).
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
        enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        start_watchdog();
        if let Err(e) = execute!(stdout(), EnterAlternateScreen, Hide) {
            restore();
            return Err(e);
        }
        let terminal = match ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(stdout())) {
            Ok(t) => t,
            Err(e) => {
                restore();
                return Err(e);
            }
        };
        Ok(TerminalGuard { terminal })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}
