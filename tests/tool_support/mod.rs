//! The one skip mechanism of every test: what a test does when a tool it needs (tmux, chromium,
//! promtool, rotel-agent, python3, eBPF in the kernel, setpriv, the built shim...) is missing.
//! Under `CI=true`, where `scripts/setup.sh` installs every tool, it fails, naming the tool and how
//! to install it. Elsewhere the test is skipped visibly: a `SKIPPED` line that cargo shows (written
//! to the process's stderr directly, past libtest's capture of passing tests' output), and one
//! file in the skip log (`target/tmp/gpufrag-skipped/`, or `$GPUFRAG_SKIP_LOG`) that
//! `scripts/test.sh` counts and names at the end of the run, failing it.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

/// Whether this is CI (where every tool must be present): `CI` set to `true` or `1`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Where skips are logged: `$GPUFRAG_SKIP_LOG`, else `gpufrag-skipped/` in cargo's directory for
/// integration tests' files (target/tmp of the target directory in use).
pub fn skip_log() -> PathBuf {
    match std::env::var_os("GPUFRAG_SKIP_LOG") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpufrag-skipped"),
    }
}

/// The test binary and test that is running, as `binary::module::test`.
fn test_name() -> String {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.rsplit_once('-').map_or(s.clone(), |(name, _hash)| name.to_string()))
        .unwrap_or_else(|| "tests".to_string());
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    format!("{bin}::{test}")
}

/// The test cannot run without `what` (`how` installs it): panics under CI, else prints
/// `SKIPPED <test>: ...` where cargo shows it and logs the skip. The caller returns right after.
pub fn missing(what: &str, how: &str) {
    let msg = format!("{what} is missing; {how} (scripts/setup.sh does)");
    if in_ci() {
        panic!("CI=true and {msg}");
    }
    let test = test_name();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {msg}");
    let dir = skip_log();
    let file = dir.join(test.replace(['/', ':'], "_"));
    let logged = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, format!("{test}: {msg}\n")));
    if let Err(e) = logged {
        // A skip that cannot be counted must not pass silently.
        panic!("{test} skipped ({msg}) and the skip could not be logged in {}: {e}", file.display());
    }
}
