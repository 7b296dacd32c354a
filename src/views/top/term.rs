//! The terminal, put back the way it was on every exit path: a guard whose `Drop` leaves the
//! alternate screen, shows the cursor and ends raw mode; a panic hook that does the same before
//! the panic message prints; and SIGTERM / SIGINT / SIGHUP handlers that only set a flag, which
//! the UI loop checks at least every 100 ms and then returns normally (so the guard runs).

use ratatui::crossterm::cursor::{Hide, Show};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen};
use std::io::{stdout, Stdout};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Once;

/// The terminal type `top` draws on.
pub type Term = ratatui::Terminal<ratatui::backend::CrosstermBackend<Stdout>>;

static SIGNAL: AtomicI32 = AtomicI32::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

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
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
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
