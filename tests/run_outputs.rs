//! `gpufrag run` loses nothing the user already has (issue 14): every output path and argument is
//! checked before the workload starts and before any file is touched, `--feed` never removes what
//! is not its own socket, a write error names the path, makes the figures inexact and keeps the
//! traced command's exit code, and the private temporary directory goes on every exit path.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufrag-run-outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `gpufrag run ARGS`, with its private directory under `tmp` (XDG_RUNTIME_DIR unset).
fn run(tmp: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .arg("run")
        .args(["--quiet", "--no-feed", "--no-report"])
        .args(args)
        .env("TMPDIR", tmp)
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir(tmp)
        .output()
        .expect("run gpufrag")
}

fn leftovers(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .expect("tmp")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gpufrag-"))
        .collect()
}

#[test]
fn regression_run_feed_on_an_existing_file_keeps_it() {
    let dir = scratch("feed");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "the user's notes").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "--quiet", "--no-report", "--feed"])
        .arg(&file)
        .args(["--", "true"])
        .env("TMPDIR", &dir)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&file.display().to_string()) && stderr.contains("not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "the user's notes");
}

#[test]
fn regression_bad_arguments_never_truncate_an_existing_record() {
    let dir = scratch("record");
    let rec = dir.join("old.rec");
    let old: Vec<u8> = (0..82_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&rec, &old).expect("write");
    let r = rec.to_str().expect("utf-8");
    for args in [
        vec!["--record", r, "--prometheus", "nonsense", "--", "true"],
        vec!["--record", r, "--ring-capacity", "3", "--", "true"],
        vec!["--record", r, "--python-interval", "nan", "--", "true"],
        vec!["--record", r, "--otlp", "http://127.0.0.1:4318", "--otlp-interval", "99999999999999999999s", "--", "true"],
        vec!["--record", r, "--", "/nonexistent/gpufrag-no-such-command"],
        vec!["--record", r, "--summary-json", "/nonexistent/dir/s.json", "--", "true"],
    ] {
        let out = run(&dir, &args);
        assert_ne!(out.status.code(), Some(0), "{args:?} must fail");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read(&rec).expect("kept").len(), old.len(), "{args:?} truncated the record");
    }
    assert_eq!(std::fs::read(&rec).expect("kept"), old);
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn regression_a_missing_summary_directory_is_found_before_the_workload_runs() {
    let dir = scratch("summary");
    let marker = dir.join("ran");
    let script = format!("touch '{}'; exit 7", marker.display());
    let out = run(&dir, &["--summary-json", "/nonexistent/dir/s.json", "--", "sh", "-c", &script]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--summary-json /nonexistent/dir/s.json") && stderr.contains("does not exist"), "{stderr}");
    assert!(!marker.exists(), "the workload must not have run");
}

#[test]
fn regression_a_full_disk_names_the_record_keeps_the_exit_code_and_is_not_exact() {
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/full").is_ok_and(|m| m.file_type().is_char_device()), "/dev/full is the kernel's full device");
    let dir = scratch("full");
    let summary = dir.join("s.json");
    let out = run(&dir, &["--record", "/dev/full", "--summary-json", summary.to_str().expect("utf-8"), "--", "sh", "-c", "exit 7"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "the command's own code: {stderr}");
    assert!(stderr.contains("/dev/full: "), "the error names the record file: {stderr}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).expect("summary written")).expect("json");
    assert_eq!(s["exact"], serde_json::Value::Bool(false), "{s}");
    assert!(s["notes"].as_array().expect("notes").iter().any(|n| n.as_str().is_some_and(|n| n.contains("/dev/full"))), "{s}");
    // The summary itself on a full disk: named, no partial file, the command's code kept.
    let out = run(&dir, &["--summary-json", "/dev/full", "--", "sh", "-c", "exit 7"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("writing the summary /dev/full"), "{stderr}");
    assert!(std::fs::metadata("/dev/full").is_ok_and(|m| m.file_type().is_char_device()), "a path that existed is never removed");
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn regression_temporary_directories_go_on_every_exit_path() {
    let dir = scratch("tmpdirs");
    for args in [vec!["--", "sh", "-c", "exit 3"], vec!["--", "true"], vec!["--no-python-hook", "--", "sh", "-c", "kill -TERM $$"]] {
        let _ = run(&dir, &args);
        assert!(leftovers(&dir).is_empty(), "{args:?} left {:?}", leftovers(&dir));
    }
}

/// Issue 23, item 5: a run killed with `kill -9` leaves its private folder behind; the next run
/// removes the folders of this user whose owner is gone (no such process, and nothing answers on
/// the folder's socket), and nothing else: a live owner's folder, a dead pid's folder whose
/// socket still answers (a run in another pid namespace), another user's folder, a name that is
/// not a consumer folder's and a symlink all stay, and the symlink's target is untouched.
#[test]
fn regression_a_stale_temporary_folder_of_a_dead_owner_is_removed_by_the_next_run() {
    let dir = scratch("stale");
    let dead = || {
        let mut c = Command::new("true").spawn().expect("true");
        c.wait().expect("wait");
        c.id()
    };
    let (gone, gone_answering) = (dead(), dead());
    let stale = dir.join(format!("gpufrag-{gone}-0badc0de"));
    std::fs::create_dir(&stale).expect("stale");
    // Its socket, no longer listened on, and what a run keeps beside it.
    drop(std::os::unix::net::UnixListener::bind(stale.join("sock")).expect("bind"));
    std::fs::write(stale.join("gpufrag_python_hook.py"), "# a copy").expect("write");
    let live = dir.join(format!("gpufrag-{}-00000001", std::process::id()));
    std::fs::create_dir(&live).expect("live");
    let answering = dir.join(format!("gpufrag-{gone_answering}-00000002"));
    std::fs::create_dir(&answering).expect("answering");
    let _listening = std::os::unix::net::UnixListener::bind(answering.join("sock")).expect("bind");
    let not_ours = dir.join(format!("gpufrag-{gone}-notahex1"));
    std::fs::create_dir(&not_ours).expect("near miss");
    let target = dir.join("target");
    std::fs::create_dir(&target).expect("target");
    std::fs::write(target.join("precious"), "keep").expect("write");
    let link = dir.join(format!("gpufrag-{gone}-0000000a"));
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    // Another user's (the tests run as root: any uid will do, no account is needed).
    let others = dir.join(format!("gpufrag-{gone}-0000000b"));
    std::fs::create_dir(&others).expect("others");
    std::os::unix::fs::chown(&others, Some(4242), Some(4242)).expect("chown");

    let out = run(&dir, &["--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let now = leftovers(&dir);
    assert!(!stale.exists(), "the dead owner's folder is still there: {now:?}");
    for kept in [&live, &answering, &not_ours, &others] {
        assert!(kept.is_dir(), "{} was removed: {now:?}", kept.display());
    }
    assert!(std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()), "the symlink went: {now:?}");
    assert_eq!(std::fs::read_to_string(target.join("precious")).expect("kept"), "keep");
    // And the run's own folder went at its end, as always.
    assert_eq!(now.len(), 5, "{now:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
