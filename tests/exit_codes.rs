//! `gpufrag`'s exit codes (issue 27, the table in docs/operations.md): `run`'s command not found
//! is 127 and not executable is 126, as the shells have them, each with a line saying what to do;
//! the command's own code comes back, a signal as 128 + its number; an unusable input is 2.

use std::process::Command;

fn gpufrag(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).output().expect("run gpufrag");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn run_exits_127_for_a_missing_command_and_126_for_one_not_executable() {
    let (code, err) = gpufrag(&["run", "--no-report", "--", "/nonexistent/gpufrag-no-such-command"]);
    assert_eq!(code, Some(127), "{err}");
    assert!(err.contains("/nonexistent/gpufrag-no-such-command: command not found (check its name, or give its path"), "{err}");
    let (code, err) = gpufrag(&["run", "--no-report", "--", "gpufrag-no-such-command-on-path"]);
    assert_eq!(code, Some(127), "{err}");

    let dir = std::env::temp_dir().join(format!("gpufrag-exit-codes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("job.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").expect("script");
    let path = script.to_str().expect("utf-8");
    let (code, err) = gpufrag(&["run", "--no-report", "--", path]);
    assert_eq!(code, Some(126), "a file without x: {err}");
    assert!(err.contains("not executable (chmod +x it"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_passes_the_commands_own_code_and_a_signal_as_128_plus_it() {
    assert_eq!(gpufrag(&["run", "--no-report", "--", "sh", "-c", "exit 7"]).0, Some(7));
    assert_eq!(gpufrag(&["run", "--no-report", "--", "sh", "-c", "kill -TERM $$"]).0, Some(128 + 15));
    assert_eq!(gpufrag(&["analyze", "/nonexistent/trace.pickle"]).0, Some(2));
}
