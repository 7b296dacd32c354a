//! `gpufrag top` driven in tmux as a person would (issues 7, 14 and 17): against a live
//! `gpufrag run` of a simcuda workload and against replayed traces, the numbers read off the
//! captured screen (`tmux capture-pane -p`), the keys pressed with `send-keys` (help, Esc, sort
//! column and order, pause, dropping exited rows), the terminal checked to be restored (`stty -a`
//! before and after, tmux's `alternate_on`) after `q`, after SIGTERM and after a panic, and `top`
//! checked to be gone within 2 s, without spinning, when its pane or session is killed.

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
    /// Starts `shell` (run by `sh -c`) in a 200×45 pane (wide enough for every column and a command line of 30 characters: issue 27 added nvml used and util).
    fn start(tag: &str, shell: &str, env: &[(&str, &str)]) -> Tmux {
        let name = format!("gpufrag-test-{tag}-{}", std::process::id());
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &name, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "200", "-y", "45"]);
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
    /// Waits until the screen no longer contains `gone`; returns the screen.
    fn wait_gone(&self, gone: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if !s.contains(gone) {
                return s;
            }
            assert!(Instant::now() < deadline, "the screen still shows {gone:?}:\n{s}");
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
    let prow = s
        .lines()
        .find(|l| l.contains("pid 0") && l.contains("gpu 0") && l.contains("9.77 GiB"))
        .unwrap_or_else(|| panic!("a process row:\n{s}"));
    assert!(prow.contains("pytorch"), "the process row names its allocator: {prow:?}");
    let title = s.lines().next().unwrap_or_default();
    assert!(title.contains(" replay ") && !title.contains(" live "), "a replay is labelled as one: {title:?}");
    assert!(title.contains("event 61/61"), "with its position: {title:?}");
    assert!(s.contains("segments of pid 0 on gpu 0: 20, largest free run 200.00 MiB"), "{s}");
    assert_eq!(s.matches("500.00 MiB ").count(), 20, "one strip row per segment:\n{s}");
    assert!(s.contains("   request ▀"), "the request at the same scale:\n{s}");
    // Keys: sort, filter, select, pause, then quit.
    t.tmux(&["send-keys", "-t", "t", "s", "s"]);
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

/// `sh -c` text like [`wrapped`], with top's stderr kept in `DIR/stderr`.
fn wrapped_stderr(dir: &Path, top: &str) -> String {
    wrapped(dir, &format!("{top} 2> {}/stderr", dir.display()))
}

/// Issue 14: `top` ignored SIGTERM (4 times of 4). It ends within 2 s, the terminal restored.
#[test]
fn regression_top_exits_on_sigterm_within_2s_and_restores_the_terminal() {
    if !have_tmux() {
        return;
    }
    let dir = tmp("term");
    let top = format!("{} top --replay {} --speed 1", bin(), fixture("gpt2_run_h200.rec").display());
    let t = Tmux::start("term", &wrapped(&dir, &top), &[]);
    t.wait_for(&["gpufrag top"], 30);
    let pid = t.top_pid();
    let sent = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill").success());
    wait_file(&dir.join("exit"), 5);
    assert!(sent.elapsed() < Duration::from_secs(2), "top took {:?} to end after SIGTERM", sent.elapsed());
    assert_restored(&t, &dir, "0");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14: a panic while drawing a replay was exit 101 with a backtrace; a replay runs under
/// the decoder's panic guard: one line naming the file, exit 2, the terminal restored. Both
/// where it can happen: the UI loop (drawing) and the replay thread.
#[test]
fn regression_a_panic_in_replay_or_drawing_is_one_line_exit_2_with_the_terminal_restored() {
    if !have_tmux() {
        return;
    }
    let file = fixture("frag_oom.pickle");
    for (tag, env) in
        [("panic-draw", ("GPUFRAG_TOP_TEST_PANIC_AFTER_MS", "300")), ("panic-replay", ("GPUFRAG_TOP_TEST_REPLAY_PANIC_AFTER", "5"))]
    {
        let dir = tmp(tag);
        let top = format!("{} top --replay {} --speed 0", bin(), file.display());
        let t = Tmux::start(tag, &wrapped_stderr(&dir, &top), &[env]);
        assert_restored(&t, &dir, "2");
        let err = std::fs::read_to_string(dir.join("stderr")).expect("stderr");
        assert_eq!(err.lines().count(), 1, "{tag}: one line: {err:?}");
        assert!(
            err.contains(&format!("{}: internal error while reading this input", file.display())) && err.contains("a panic on purpose"),
            "{tag}: {err:?}"
        );
        drop(t);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// utime + stime of `pid` in clock ticks, and whether it is a zombie (it has ended); `None`
/// once it is reaped.
fn cpu_ticks(pid: i32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?, f.first() == Some(&"Z")))
}

/// Issue 14: `gpufrag top` kept running at up to 85 % of a core after its terminal closed (4
/// times of 4): crossterm's reader loops on the end-of-file of a hung-up tty. Killing its tmux
/// pane (top is the pane's process) or its whole session (top under a shell) ends it within
/// 2 s, using less than a tenth of a core meanwhile.
#[test]
fn regression_top_exits_within_2s_without_spinning_when_its_terminal_goes_away() {
    if !have_tmux() {
        return;
    }
    let file = fixture("gpt2_run_h200.rec");
    let top = format!("{} top --replay {} --speed 1", bin(), file.display());
    for how in ["kill-pane", "kill-server"] {
        let dir = tmp(how);
        let t = match how {
            "kill-pane" => Tmux::start(how, &top, &[]),
            _ => Tmux::start(how, &wrapped(&dir, &top), &[]),
        };
        t.wait_for(&["gpufrag top", "event "], 30);
        let pid = if how == "kill-pane" {
            t.tmux(&["display", "-p", "-t", "t", "#{pane_pid}"]).trim().parse().expect("pane pid")
        } else {
            t.top_pid()
        };
        let (before, _) = cpu_ticks(pid).expect("top runs");
        let killed = Instant::now();
        match how {
            "kill-pane" => t.tmux(&["kill-pane", "-t", "t"]),
            _ => t.tmux(&["kill-server"]),
        };
        let mut used = 0;
        loop {
            match cpu_ticks(pid) {
                None => break,
                Some((ticks, zombie)) => {
                    used = ticks.saturating_sub(before);
                    if zombie {
                        break;
                    }
                }
            }
            assert!(
                killed.elapsed() < Duration::from_secs(2),
                "{how}: top (pid {pid}) still runs {:?} after its terminal went, {used} ticks used",
                killed.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let ended = killed.elapsed();
        // SAFETY: sysconf only reads a constant of the system.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        assert!((used as f64) < 0.1 * hz * ended.as_secs_f64().max(0.2) + 2.0, "{how}: {used} ticks ({hz}/s) in {ended:?}: spinning");
        drop(t);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Which event of how many the title says the replay is at.
fn replay_position(screen: &str) -> Option<(u64, u64)> {
    let title = screen.lines().next()?;
    let at = &title[title.find("event ")? + "event ".len()..];
    let (done, rest) = at.split_once('/')?;
    let total: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((done.parse().ok()?, total.parse().ok()?))
}

/// Issue 17: nvitop's habits in a replay of the H200 GPT-2 record: `?` opens the help and any
/// key closes it, `Esc` clears the selection without quitting, the sort column is marked and `I`
/// reverses it, the device row has the device's free and total, the exited process is marked
/// `exited` and `x` drops it, and the header says replay with its position.
#[test]
fn keys_help_esc_sort_marker_reverse_device_free_and_exited_rows_in_a_replay() {
    if !have_tmux() {
        return;
    }
    let dir = tmp("keys");
    let top = format!("{} top --replay {} --speed 0", bin(), fixture("gpt2_run_h200.rec").display());
    let t = Tmux::start("keys", &wrapped(&dir, &top), &[]);
    let s = t.wait_for(&["replay finished", "pid 445 gpu 0"], 30);
    assert_eq!(replay_position(&s), Some((1027, 1027)), "{s}");
    let device = s.lines().find(|l| l.contains("> gpu 0")).unwrap_or_else(|| panic!("the selected device row:\n{s}"));
    assert!(device.contains("121.72 GiB") && device.contains("139.80 GiB"), "device free and total: {device:?}");
    let process = s.lines().find(|l| l.contains("pid 445 gpu 0")).expect("process row");
    assert!(process.contains("exited"), "the process ended: {process:?}");
    assert!(s.contains("reserved▼"), "the sort column is marked:\n{s}");

    t.tmux(&["send-keys", "-t", "t", "?"]);
    t.wait_for(&["Press any key to return."], 5);
    t.tmux(&["send-keys", "-t", "t", "j"]);
    let s = t.wait_gone("Press any key to return.", 5);
    assert!(s.contains("> gpu 0"), "the key that closed the help did nothing else:\n{s}");

    t.tmux(&["send-keys", "-t", "t", "Escape"]);
    std::thread::sleep(Duration::from_millis(400));
    let s = t.screen();
    assert!(s.contains("gpufrag top") && !s.contains("> gpu 0") && !s.contains("> pid"), "Esc clears the selection and top stays:\n{s}");
    assert!(!dir.join("exit").exists(), "Esc does not quit");

    t.tmux(&["send-keys", "-t", "t", "I"]);
    t.wait_for(&["reserved▲", "sort: reserved▲"], 5);
    t.tmux(&["send-keys", "-t", "t", ","]);
    t.wait_for(&["gpu / pid▼", "sort: id▼"], 5);
    t.tmux(&["send-keys", "-t", "t", "x"]);
    let s = t.wait_gone("pid 445 gpu 0", 5);
    assert!(s.contains("gpu 0"), "the device row stays:\n{s}");
    t.tmux(&["send-keys", "-t", "t", "q"]);
    assert_restored(&t, &dir, "0");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 17: `p` froze the screen while a replay kept playing. Paused, the replay's position
/// stays; resumed, it plays to the end.
#[test]
fn regression_p_pauses_the_replay_itself_not_just_the_screen() {
    if !have_tmux() {
        return;
    }
    let dir = tmp("pause");
    let top = format!("{} top --replay {} --speed 4", bin(), fixture("gpt2_run_h200.rec").display());
    let t = Tmux::start("pause", &wrapped(&dir, &top), &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = t.screen();
        if replay_position(&s).is_some_and(|(done, _)| done > 0) {
            break;
        }
        assert!(Instant::now() < deadline, "the replay never started:\n{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t.tmux(&["send-keys", "-t", "t", "p"]);
    let s = t.wait_for(&["PAUSED"], 5);
    let held = replay_position(&s).expect("position");
    assert!(held.0 < held.1, "paused before the end: {held:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let s = t.screen();
    assert_eq!(replay_position(&s), Some(held), "paused for 1.5 s, the replay stays where it was:\n{s}");
    t.tmux(&["send-keys", "-t", "t", "p"]);
    let s = t.wait_for(&["replay finished"], 40);
    assert_eq!(replay_position(&s), Some((held.1, held.1)), "{s}");
    t.tmux(&["send-keys", "-t", "t", "q"]);
    assert_restored(&t, &dir, "0");
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
        tool_support::missing("the shim and simcuda-workload", "build them first with `cargo build --release --workspace`");
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
        .env("SIMCUDA_UTILIZATION", "37:12")
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
    assert!(s.contains("dropped 0"), "no event dropped:\n{s}");
    assert!(row.contains("running") && row.contains("hold 1536MiB"), "its state and command line, from /proc: {row:?}");
    // SAFETY: geteuid cannot fail.
    let user = gpufrag::views::top::procinfo::user_name(unsafe { libc::geteuid() });
    assert!(row.contains(&format!(" {user} ")), "its user {user}: {row:?}");
    // NVML's figures (issue 27), as simcuda was given them: its name and SIMCUDA_UTILIZATION.
    let device = s.lines().find(|l| l.contains("gpu 0 ") && !l.contains("pid ")).expect("device row");
    // (shortened to what the label column has: at 200 columns the command column takes what is left).
    assert!(device.contains("gpu 0 H200 ") && device.contains(" 37% "), "name and utilization: {device:?}");
    // The workload frees and exits when its stdin closes; run sends its final frame.
    if let Some(mut stdin) = run.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    let status = run.wait().expect("run ends");
    assert!(status.success(), "gpufrag run: {status:?}");
    let s = t.wait_for(&["ended: the traced command ended"], 20);
    let row = s.lines().find(|l| l.contains(&pid_row)).expect("process row");
    assert!(row.contains("0 B"), "after the free, nothing reserved: {row:?}");
    assert!(row.contains("exited"), "the workload ended: {row:?}");
    t.tmux(&["send-keys", "-t", "t", "q"]);
    assert_restored(&t, &dir, "0");
    let _ = std::fs::remove_dir_all(&dir);
}
