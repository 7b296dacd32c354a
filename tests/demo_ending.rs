//! `gpufrag demo` ends on its point (issue 27): run in an 80×24 tmux pane as a new user would,
//! its last screen lines are the verdict, free in all against the largest piece, the fix as a
//! command to copy and the report's path; bold and coloured on the terminal, plain under
//! `NO_COLOR`. small-pages shows only its 2 MiB OOM (no true OOM of its fill phase).
//!
//! Needs the workspace built (`cargo build --release --workspace`): the demo runs the simcuda
//! stand-ins next to the gpufrag binary.

mod tool_support;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn have_tmux() -> bool {
    let ok = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    if !ok {
        tool_support::missing("tmux", "apt-get install tmux");
    }
    ok
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufrag-demo-ending-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Runs `gpufrag demo ARGS` in a fresh 80×24 tmux pane in `dir` until it exits; returns the last
/// screen, plain and with its escape sequences (`capture-pane -e`).
fn demo_in_tmux(tag: &str, dir: &PathBuf, args: &str, env: &[(&str, &str)]) -> (String, String) {
    let name = format!("gpufrag-demo-{tag}-{}", std::process::id());
    let done = dir.join("done");
    let mut cmd = Command::new("tmux");
    cmd.args(["-L", &name, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "80", "-y", "24", "-c"]).arg(dir);
    for (k, v) in env {
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    // The shell stays after the demo so that its last screen can be read.
    cmd.arg(format!("sh -c '{} demo {args}; echo $? > {}; sleep 60'", env!("CARGO_BIN_EXE_gpufrag"), done.display()));
    assert!(cmd.status().expect("tmux").success(), "tmux new-session");
    let capture = |extra: &[&str]| {
        let o = Command::new("tmux").args(["-L", &name, "capture-pane", "-p", "-t", "t"]).args(extra).output().expect("tmux");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done.exists() {
        assert!(Instant::now() < deadline, "the demo did not finish in 120 s:\n{}", capture(&[]));
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(300));
    let screens = (capture(&[]), capture(&["-e"]));
    let _ = Command::new("tmux").args(["-L", &name, "kill-server"]).status();
    screens
}

/// The screen's last non-empty lines.
fn last_lines(screen: &str, n: usize) -> Vec<String> {
    let lines: Vec<String> = screen.lines().map(|l| l.trim_end().to_string()).filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

#[test]
fn frag_oom_demo_ends_on_the_verdict_the_fix_command_and_the_report_at_80x24() {
    assert!(have_tmux(), "tmux drives the demo at 80×24: install it (bash scripts/setup.sh)");
    let dir = tmp("frag");
    let (plain, escaped) = demo_in_tmux("frag", &dir, "", &[]);
    let last = last_lines(&plain, 4);
    // The report goes to the private state folder (report-PID.html), never the current directory.
    let report = PathBuf::from(last[3].strip_prefix("[gpufrag] report:  ").unwrap_or_default());
    assert!(!report.starts_with(&dir), "the report is not left in the current directory: {}", report.display());
    assert_eq!(
        last,
        vec![
            "[gpufrag] verdict: Fragmentation OOM: 2.50 GiB requested".to_string(),
            last[1].clone(),
            "[gpufrag] fix:     export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_string(),
            format!("[gpufrag] report:  {}", report.display()),
        ],
        "the last screen at 80×24:\n{plain}"
    );
    // free in all against the largest piece, as numbers: more free in all than was asked, the
    // largest piece less than it.
    assert!(last[1].contains(" free in all, the largest free piece "), "{}", last[1]);
    assert!(report.is_file(), "the report the last line names");
    for l in &last {
        assert!(l.chars().count() <= 80, "a last line wider than the pane: {l}");
    }
    // Bold red verdict and bold green fix on the terminal.
    assert!(
        escaped.contains("\x1b[1m\x1b[31mFragmentation OOM") || escaped.contains("\x1b[1;31mFragmentation OOM"),
        "no colour:\n{escaped:?}"
    );
    assert!(escaped.contains("32mexport PYTORCH_CUDA_ALLOC_CONF"), "no colour on the fix:\n{escaped:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_color_turns_the_ending_plain_and_small_pages_shows_only_its_2mib_oom() {
    assert!(have_tmux(), "tmux drives the demo at 80×24: install it (bash scripts/setup.sh)");
    let dir = tmp("pages");
    let (plain, escaped) = demo_in_tmux("pages", &dir, "--scenario small-pages --mem 2GiB --summary-json s.json", &[("NO_COLOR", "1")]);
    let last = last_lines(&plain, 4);
    assert_eq!(last[0], "[gpufrag] verdict: Fragmentation OOM at the driver level: 2.00 MiB requested", "{plain}");
    assert_eq!(last[2], "[gpufrag] fix:     pool the small allocations", "{plain}");
    assert_eq!(last[3], format!("[gpufrag] report:  {}", dir.join("report.html").display()), "{plain}");
    let tail: String = escaped.lines().rev().take(6).collect::<Vec<_>>().join("\n");
    assert!(!tail.contains('\x1b'), "NO_COLOR=1 and still escapes: {tail:?}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("s.json")).expect("summary")).expect("json");
    let ooms: Vec<(u64, String)> = s["ooms"]
        .as_array()
        .expect("ooms")
        .iter()
        .map(|o| (o["requested"].as_u64().unwrap_or(0), o["verdict"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(ooms, vec![(2 << 20, "fragmentation".to_string())], "only the story's OOM: {s:#}");
    let _ = std::fs::remove_dir_all(&dir);
}
