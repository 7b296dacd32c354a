//! What a test does when a tool it needs (tmux, chromium, promtool, rotel-agent, python3, eBPF
//! in the kernel, setpriv...) is missing: under `CI=true`, where `.ci/run` installs every tool, it
//! fails, naming the tool and how to install it; elsewhere it skips with a line that cargo shows
//! (written to the process's stderr directly, past libtest's capture of passing tests' output).

#![allow(dead_code)]

use std::io::Write;

/// Whether this is CI (where every tool must be present): `CI` set to `true` or `1`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The test cannot run without `what` (`how` installs it): panics under CI, else prints
/// `SKIPPED <test>: ...` where cargo shows it. The caller returns right after.
pub fn missing(what: &str, how: &str) {
    let msg = format!("{what} is missing; {how} (.ci/run does)");
    if in_ci() {
        panic!("CI=true and {msg}");
    }
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {msg}");
}
