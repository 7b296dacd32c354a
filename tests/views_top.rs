//! `gpufrag top` driven in tmux as a person would (issue 7): against a live `gpufrag run` of a
//! simcuda workload and against a replayed trace, the numbers read off the captured screen
//! (`tmux capture-pane -p`), and the terminal checked to be restored (`stty -a` before and after,
//! tmux's `alternate_on`) after `q`, after SIGTERM and after a panic.

mod tool_support;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufrag-views-top-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn have_tmux() -> bool {
    let ok = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    if !ok {
        tool_support::missing("tmux", "apt-get install tmux");
    }
    ok
}

/// A tmux server of our own (its own socket), killed on drop.
struct Tmux {
    name: String,
}

impl Tmux {
    /// Starts `shell` (run by `sh -c`) in a 150×45 pane.
    fn start(tag: &str, shell: &str, env: &[(&str, &str)]) -> Tmux {
        let name = format!("gpufrag-test-{tag}-{}", std::process::id());
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &name, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "150", "-y", "45"]);
        for (k, v) in env {
            cmd.args(["-e", &format!("{k}={v}")]);
        }
        cmd.arg(format!("sh -c '{shell}'"));
        let st = cmd.status().expect("tmux");
        assert!(st.success(), "tmux new-session");
        Tmux { name }
    }
    fn tmux(&self, args: &[&str]) -> String {
        let o = Command::new("tmux").args(["-L", &self.name]).args(args).output().expect("tmux");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "t"])
    }
    fn alternate_on(&self) -> String {
        self.tmux(&["display", "-p", "-t", "t", "#{alternate_on}"]).trim().to_string()
    }
    /// Waits until the screen contains every one of `want`; returns the screen.
    fn wait_for(&self, want: &[&str], secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if want.iter().all(|w| s.contains(w)) {
                return s;
            }
            assert!(Instant::now() < deadline, "screen never showed {want:?}:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    /// The pid of the pane's shell's child (`gpufrag top`).
    fn top_pid(&self) -> i32 {
        let sh = self.tmux(&["display", "-p", "-t", "t", "#{pane_pid}"]).trim().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let children = std::fs::read_to_string(format!("/proc/{sh}/task/{sh}/children")).unwrap_or_default();
            if let Some(p) = children.split_whitespace().next() {
                return p.parse().expect("pid");
            }
            assert!(Instant::now() < deadline, "no child of the pane's shell");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.name, "kill-server"]).status();
    }
}

fn wait_file(p: &Path, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(s) = std::fs::read_to_string(p) {
            if !s.is_empty() {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `sh -c` text: records `stty -a` before and after TOP, and TOP's exit code.
fn wrapped(dir: &Path, top: &str) -> String {
    let d = dir.display();
    format!("stty -a > {d}/before; {top}; echo $? > {d}/exit; stty -a > {d}/after; sleep 120")
}

fn assert_restored(t: &Tmux, dir: &Path, want_exit: &str) {
    let exit = wait_file(&dir.join("exit"), 20);
    let after = wait_file(&dir.join("after"), 10);
    let before = std::fs::read_to_string(dir.join("before")).expect("before");
    assert_eq!(exit.trim(), want_exit, "top's exit code");
    assert_eq!(before, after, "the terminal settings are restored");
    assert_eq!(t.alternate_on(), "0", "the alternate screen is left");
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpufrag")
}

#[test]
fn replay_shows_the_frag_oom_numbers_and_q_restores_the_terminal() {
    if !have_tmux() {
        return;
    }
    let dir = tmp("replay-q");
    let top = format!("{} top --replay {} --speed 0", bin(), fixture("frag_oom.pickle").display());
    let t = Tmux::start("q", &wrapped(&dir, &top), &[]);
    let s = t.wait_for(&["replay finished", "9.77 GiB"], 30);
    assert_eq!(t.alternate_on(), "1", "top draws on the alternate screen");
    let row = s.lines().find(|l| l.contains("gpu 0") && l.contains("9.77 GiB")).unwrap_or_else(|| panic!("a device row:\n{s}"));
    for want in ["9.77 GiB", "7.81 GiB", "1.95 GiB", "200.00 MiB", "0.47", "exact block"] {
        assert!(row.contains(want), "{want} in the device row {row:?}");
    }
    assert!(s.contains("OOM pid 0 gpu 0: 2.50 GiB requested: fragmentation"), "{s}");
    let prow = s.lines().find(|l| l.contains("pid 0") && l.contains("gpu 0") && l.contains("9.77 GiB")).unwrap_or_else(|| panic!("a process row:\n{s}"));
    assert!(prow.contains("pytorch"), "the process row names its allocator: {prow:?}");
    assert!(s.contains("segments of pid 0 on gpu 0: 20, largest free run 200.00 MiB"), "{s}");
    assert_eq!(s.matches("500.00 MiB ").count(), 20, "one strip row per segment:\n{s}");
    assert!(s.contains("   request ▀"), "the request at the same scale:\n{s}");
    // Keys: sort, filter, select, pause, then quit.
    t.tmux(&["send-keys", "-t", "t", "s"]);
    t.wait_for(&["sort: stranded"], 5);
    t.tmux(&["send-keys", "-t", "t", "/", "p", "i", "d", "Enter"]);
    let s = t.wait_for(&["[pid]"], 5);
    assert!(!s.lines().any(|l| l.contains("│> gpu 0") || l.contains("│  gpu 0")), "the filter hides the device row:\n{s}");
    t.tmux(&["send-keys", "-t", "t", "p"]);
    t.wait_for(&["PAUSED"], 5);
    t.tmux(&["send-keys", "-t", "t", "q"]);
    assert_restored(&t, &dir, "0");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_and_panics_restore_the_terminal() {
    if !have_tmux() {
        return;
    }
    let dir = tmp("term");
    let top = format!("{} top --replay {} --speed 1", bin(), fixture("frag_oom.pickle").display());
    let t = Tmux::start("term", &wrapped(&dir, &top), &[]);
    t.wait_for(&["gpufrag top"], 30);
    let pid = t.top_pid();
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill").success());
    assert_restored(&t, &dir, "0");
    drop(t);

    let dir = tmp("panic");
    let top = format!("{} top --replay {} --speed 0", bin(), fixture("frag_oom.pickle").display());
    let t = Tmux::start("panic", &wrapped(&dir, &top), &[("GPUFRAG_TOP_TEST_PANIC_AFTER_MS", "300")]);
    assert_restored(&t, &dir, "101");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shim and the simcuda stand-ins, built by the workspace build (see tests/preload_common).
fn simcuda() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?.to_path_buf();
    let (shim, workload, libs) = (profile.join("libgpufrag_preload.so"), profile.join("simcuda-workload"), profile.join("simcuda"));
    if shim.exists() && workload.exists() && libs.join("libcudart.so.13").exists() {
        Some((shim, workload, libs))
    } else {
        assert!(std::env::var_os("CI").is_none(), "the shim and simcuda-workload are built in CI before the tests");
        eprintln!("skipped: build the shim and simcuda-workload first (cargo build --workspace)");
        None
    }
}

#[test]
fn live_top_follows_a_running_workload_through_runs_feed() {
    if !have_tmux() {
        return;
    }
    let Some((shim, workload, libs)) = simcuda() else { return };
    let dir = tmp("live");
    let sock = dir.join("feed.sock");
    let mut run = Command::new(bin())
        .args(["run", "--quiet", "--no-report", "--feed"])
        .arg(&sock)
        .arg("--preload")
        .arg(&shim)
        .arg("--")
        .arg(&workload)
        .args(["hold", "1536MiB"])
        .env("LD_LIBRARY_PATH", &libs)
        .env("SIMCUDA_STATE_DIR", dir.join("simcuda"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gpufrag run");
    let mut out = BufReader::new(run.stdout.take().expect("stdout"));
    let mut ready = String::new();
    out.read_line(&mut ready).expect("READY line");
    assert!(ready.starts_with("READY pid="), "{ready}");
    let wl_pid: u32 = ready["READY pid=".len()..].split_whitespace().next().and_then(|p| p.parse().ok()).expect("pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "the feed socket never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let top = format!("{} top --connect {}", bin(), sock.display());
    let t = Tmux::start("live", &wrapped(&dir, &top), &[]);
    let pid_row = format!("pid {wl_pid} gpu 0");
    let s = t.wait_for(&[" live ", &pid_row, "1.50 GiB"], 30);
    let row = s.lines().find(|l| l.contains(&pid_row)).expect("process row");
    assert!(row.contains("1.50 GiB") && row.contains("segment"), "reserved and coverage of the held allocation: {row:?}");
    assert!(row.contains(" 0 "), "no event dropped: {row:?}");
    // The workload frees and exits when its stdin closes; run sends its final frame.
    if let Some(mut stdin) = run.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    let status = run.wait().expect("run ends");
    assert!(status.success(), "gpufrag run: {status:?}");
    let s = t.wait_for(&["ended: the traced command ended"], 20);
    let row = s.lines().find(|l| l.contains(&pid_row)).expect("process row");
    assert!(row.contains("0 B"), "after the free, nothing reserved: {row:?}");
    t.tmux(&["send-keys", "-t", "t", "q"]);
    assert_restored(&t, &dir, "0");
    let _ = std::fs::remove_dir_all(&dir);
}
