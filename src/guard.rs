//! Panic containment for the work done on an input file: decoding, replay, summary and rendering
//! run inside [`contain`], so that a bug an input provokes ends in a one-line error naming the
//! file (exit 2) instead of an unwinding thread, a backtrace and exit 101.
//!
//! A process-wide panic hook is installed once; it stays silent for panics on a thread that is
//! inside [`contain`] (their message and place are kept for the error) and defers to the previous
//! hook everywhere else, so panics elsewhere (the terminal restore of `top`, tests) behave as
//! before.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::sync::Once;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DEPTH.with(|d| d.get()) > 0 {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".to_string());
                let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                LAST.with(|l| *l.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, which works on the input `file`; a panic inside becomes an unusable-input error
/// naming the file and what went wrong.
pub fn contain<T>(file: &Path, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    install_hook();
    DEPTH.with(|d| d.set(d.get() + 1));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    DEPTH.with(|d| d.set(d.get() - 1));
    r.unwrap_or_else(|_| {
        let what = LAST.with(|l| l.borrow_mut().take()).unwrap_or_else(|| "panic".to_string());
        Err(crate::input::UnusableInput(format!(
            "{}: internal error while reading this input ({what}); please report it with the file",
            file.display()
        ))
        .into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 14: `capacity overflow` in `AddressSpace::to_events` escaped the decoder's guard
    /// (exit 101 in `analyze` and `report`). Whatever panics inside `contain` is an input error.
    #[test]
    fn regression_a_panic_after_decoding_is_an_error_naming_the_file() {
        let r: anyhow::Result<()> = contain(Path::new("/tmp/x.rec"), || {
            let v: Vec<u64> = Vec::with_capacity(usize::MAX / 2);
            drop(v);
            Ok(())
        });
        let e = r.expect_err("contained");
        assert_eq!(crate::cli::exit_code(&e), 2);
        let msg = e.to_string();
        assert!(msg.starts_with("/tmp/x.rec: internal error while reading this input (capacity overflow"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        // Nested and repeated uses keep working.
        assert!(contain(Path::new("a"), || contain(Path::new("b"), || Ok(1))).is_ok());
    }
}
