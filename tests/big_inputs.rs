//! Issue 23, item 4 (cost bounded by size): big inputs read under a small `ulimit -v`, the way a
//! user would (`bash -c 'ulimit -v N; exec gpufrag ...'`), measured as whole processes (peak RSS
//! and CPU time from `wait4`). A 1.2 GB record used to abort analyze ("memory allocation of
//! 1199999920 bytes failed"); a 10^7-request trace made whatif take 3.17 GB and abort with no file
//! named. Records are generated on the spot (tests/common/big.rs); the 4 GB and 10^7-request runs
//! by hand are in docs/benchmarks.md ("Big inputs").

#[path = "common/big.rs"]
mod big;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What a whole process did.
struct Measured {
    code: i32,
    stdout: String,
    stderr: String,
    /// Peak resident set, KiB.
    max_rss_kib: i64,
    /// User + system CPU seconds.
    cpu_s: f64,
}

/// Runs `cmd` to its end and reads its resources from `wait4` (the process itself, not its
/// parent's children totals); the child is reaped by that `wait4`.
#[allow(clippy::zombie_processes)]
fn measured(cmd: &mut Command) -> Measured {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let (mut out, mut err) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).ok();
        s
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into locals we own.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Measured {
        code,
        stdout: t_out.join().expect("stdout thread"),
        stderr: t_err.join().expect("stderr thread"),
        max_rss_kib: ru.ru_maxrss,
        cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
    }
}

/// `gpufrag ARGS` under `ulimit -v KIB`.
fn gpufrag_limited(kib: u64, args: &[&str]) -> Measured {
    let mut line = format!("ulimit -v {kib} && exec \"$0\"");
    for i in 0..args.len() {
        line.push_str(&format!(" \"${}\"", i + 1));
    }
    measured(Command::new("bash").arg("-c").arg(line).arg(env!("CARGO_BIN_EXE_gpufrag")).args(args))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufrag-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn json(m: &Measured) -> serde_json::Value {
    serde_json::from_str(&m.stdout).unwrap_or_else(|e| panic!("not JSON ({e}); exit {}, stderr {}", m.code, m.stderr))
}

/// A one-line error naming the file and the budget flag: no panic, no backtrace.
fn assert_budget_error(m: &Measured, file: &Path) {
    assert_eq!(m.code, 2, "want exit 2 (unusable input); stderr: {}", m.stderr);
    let err = m.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "want one line: {err}");
    assert!(err.contains(&file.display().to_string()) && err.contains("--max-memory") && err.contains("memory budget"), "{err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace") && !err.contains("memory allocation"), "{err}");
}

/// See issue 23 ("A 1.2 GB record aborts analyze"): the record is streamed, so a 400 MB one is
/// analysed under `ulimit -v` 256 MiB in the memory a 40 MB one takes, to its exact figures.
#[test]
fn regression_issue23_a_400_mb_record_is_analysed_under_256_mib_in_the_memory_of_a_40_mb_one() {
    let mut rss = Vec::new();
    for (name, allocs) in [("small.rec", 250_000u64), ("large.rec", 2_500_000)] {
        let path = tmp(name);
        let want = big::write_record(&path, allocs, 64, 0).expect("write record");
        let bytes = std::fs::metadata(&path).expect("record").len();
        let m = gpufrag_limited(256 << 10, &["analyze", path.to_str().expect("utf-8"), "--json"]);
        assert_eq!(m.code, 0, "{name} ({bytes} B): exit {}; stderr {}", m.code, m.stderr);
        let s = json(&m);
        assert_eq!(s["events"], want.events, "{name}");
        assert_eq!(s["exact"], true, "{name}");
        assert_eq!(s["devices"][0]["reserved"], want.reserved, "{name}");
        assert_eq!(s["devices"][0]["allocated"], want.allocated, "{name}");
        eprintln!("{name}: {bytes} B, {} events: peak RSS {} KiB, {:.2} s CPU", want.events, m.max_rss_kib, m.cpu_s);
        rss.push((bytes, m.max_rss_kib));
        std::fs::remove_file(&path).ok();
    }
    let ((small_b, small), (large_b, large)) = (rss[0], rss[1]);
    assert!(large_b >= 9 * small_b, "{large_b} vs {small_b} bytes");
    assert!(large <= small + (8 << 10), "peak RSS grew with the record: {small} KiB for {small_b} B, {large} KiB for {large_b} B");
    assert!(large < 64 << 10, "peak RSS {large} KiB for a {large_b} B record (want < 64 MiB)");
}

/// An OOM whose computed fix would simulate more requests than the budget holds: the figures
/// and the verdict still come, and the fix's note says why there is none (file and flag named).
#[test]
fn a_fix_past_the_memory_budget_is_a_note_and_the_figures_still_come() {
    let path = tmp("oom.rec");
    let want = big::write_record(&path, 250_000, 64, 250_000).expect("write record");
    let m = gpufrag_limited(256 << 10, &["analyze", path.to_str().expect("utf-8"), "--json", "--max-memory", "16MiB"]);
    assert_eq!(m.code, 0, "stderr {}", m.stderr);
    let s = json(&m);
    assert_eq!(s["events"], want.events);
    assert_eq!(s["devices"][0]["reserved"], want.reserved);
    assert_eq!(s["ooms"].as_array().map(Vec::len), Some(1), "one OOM: {}", s["ooms"]);
    let notes = s["notes"].to_string();
    assert!(notes.contains("no simulated fix") && notes.contains("memory budget of 16 MiB") && notes.contains("--max-memory"), "{notes}");
    std::fs::remove_file(&path).ok();
}

/// See issue 23 ("a 10^7-request trace makes whatif take 3.17 GB and abort with no file
/// named"): the request stream is built from the file in streamed passes; 10^6 requests are
/// simulated under `ulimit -v` 512 MiB to PyTorch's figures, and past `--max-memory` whatif ends
/// with the one-line budget error.
#[test]
fn regression_issue23_whatif_of_a_million_requests_fits_under_512_mib_or_says_the_budget() {
    let path = tmp("million.rec");
    let want = big::write_record(&path, 333_500, 64, 0).expect("write record");
    assert!(want.requests >= 1_000_000, "{want:?}");
    let file = path.to_str().expect("utf-8");
    let m = gpufrag_limited(512 << 10, &["whatif", file, "--alloc-conf", "", "--json"]);
    assert_eq!(m.code, 0, "stderr {}", m.stderr);
    let w = json(&m);
    assert_eq!(w["faithful"], true, "{}", w["check"]);
    let base = &w["scenarios"][0];
    assert_eq!(base["simulated_requests"], want.requests);
    assert_eq!(base["peak_reserved"], want.reserved);
    assert_eq!(base["peak_allocated"], want.allocated);
    let per_request = (m.max_rss_kib as f64 * 1024.0) / want.requests as f64;
    eprintln!("whatif of {} requests: peak RSS {} KiB ({per_request:.0} B a request), {:.2} s CPU", want.requests, m.max_rss_kib, m.cpu_s);
    let over = gpufrag_limited(512 << 10, &["whatif", file, "--alloc-conf", "", "--max-memory", "16MiB"]);
    assert_budget_error(&over, &path);
    std::fs::remove_file(&path).ok();
}

/// The report plays every event back, so it holds them: past the budget, one line naming the
/// file and the flag (it was an abort with a backtrace).
#[test]
fn regression_issue23_report_of_a_record_past_the_budget_is_one_line() {
    let path = tmp("report.rec");
    big::write_record(&path, 250_000, 64, 0).expect("write record");
    let html = tmp("report.html");
    let m =
        gpufrag_limited(256 << 10, &["report", path.to_str().expect("utf-8"), "-o", html.to_str().expect("utf-8"), "--max-memory", "8MiB"]);
    assert_budget_error(&m, &path);
    assert!(!html.exists(), "no report past the budget");
    std::fs::remove_file(&path).ok();
}

/// Issue 23's must-show: `analyze` of a 253k-entry GPT-2 snapshot at most half the peak memory
/// of CPython's own `pickle.load` of the same file, as whole processes side by side (it was
/// 1.15x). The snapshot is scripts/big_snapshot.py's (the GPT-2 fixture's ring played 7 times,
/// the last 253,000 entries kept); runs alternate, medians of 3. The time half of the target is
/// a benchmark (`benches/big_snapshot.rs`, docs/benchmarks.md), not an assertion: a timed test
/// failed at 0.50x on a fresh 2-core container while its build ran beside it. The CPU times are
/// printed.
#[test]
fn analyze_of_a_253k_entry_gpt2_snapshot_takes_half_the_memory_of_cpython_pickle_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let snap = tmp("gpt2_253k.pickle");
    let made = Command::new("python3")
        .arg(root.join("scripts/big_snapshot.py"))
        .arg(root.join("tests/fixtures/gpt2_varlen.pickle.gz"))
        .arg(&snap)
        .output()
        .expect("python3 runs scripts/big_snapshot.py");
    assert!(made.status.success(), "big_snapshot.py: {}", String::from_utf8_lossy(&made.stderr));
    let file = snap.to_str().expect("utf-8");
    let load = format!("import pickle; pickle.load(open({file:?}, 'rb'))");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let g = measured(Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(["analyze", file]));
        assert_eq!(g.code, 0, "{}", g.stderr);
        assert!(g.stdout.contains("exact"), "{}", g.stdout);
        let p = measured(Command::new("python3").args(["-c", &load]));
        assert_eq!(p.code, 0, "{}", p.stderr);
        ours.push((g.cpu_s, g.max_rss_kib));
        theirs.push((p.cpu_s, p.max_rss_kib));
    }
    let median = |v: &mut Vec<(f64, i64)>| {
        let mut t: Vec<f64> = v.iter().map(|x| x.0).collect();
        let mut m: Vec<i64> = v.iter().map(|x| x.1).collect();
        t.sort_by(f64::total_cmp);
        m.sort_unstable();
        (t[t.len() / 2], m[m.len() / 2])
    };
    let ((gt, gm), (pt, pm)) = (median(&mut ours), median(&mut theirs));
    let (rt, rm) = (gt / pt, gm as f64 / pm as f64);
    eprintln!(
        "gpufrag analyze {gt:.3} s CPU, {gm} KiB; python3 pickle.load {pt:.3} s CPU, {pm} KiB: {rt:.2}x the time, {rm:.2}x the memory"
    );
    assert!(rm <= 0.5, "peak memory {gm} KiB against CPython's {pm} KiB: {rm:.2}x (want <= 0.5x)");
    std::fs::remove_file(&snap).ok();
}
