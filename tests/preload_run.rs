//! End to end through the real consumer: `gpufrag run --record FILE -- simcuda-workload frag-oom`
//! preloads the shim, receives its events, and the record replays (`gpufrag analyze`) to the same
//! verdict: a fragmentation OOM, with the blocks the workload's caching allocator announced
//! through the annotation API, the failed 2.5 GiB request and the device free bytes at that moment.
//! And many threads freeing and allocating the same sizes, so that the driver hands an address
//! one thread just freed to another thread's allocation: the record replays with no anomaly (a
//! free recorded after the real call, or lanes drained without the timestamp merge, let the
//! reused address's allocation overtake its previous free).

mod preload_common;

use std::path::Path;
use std::process::Command;

use preload_common::*;

#[test]
fn gpufrag_run_records_a_fragmentation_oom() {
    let a = artifacts();
    let dir = TempDir::new("run");
    let record = dir.path().join("frag.rec");
    let summary = dir.path().join("summary.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "--quiet", "--no-python-hook", "--no-feed", "--no-report", "--record"])
        .arg(&record)
        .arg("--summary-json")
        .arg(&summary)
        .arg("--preload")
        .arg(&a.shim)
        .arg("--")
        .arg(&a.workload)
        .arg("frag-oom")
        .env("LD_LIBRARY_PATH", &a.libs)
        .env("SIMCUDA_STATE_DIR", dir.path())
        .output()
        .expect("gpufrag run");
    assert!(out.status.success(), "gpufrag run: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let oom = lines_with(&stdout, "RESULT").into_iter().find(|l| field(l, "step") == "oom").expect("the workload's OOM line");
    let device_free: u64 = field(&oom, "device_free").parse().expect("device_free");

    let live = std::fs::read_to_string(&summary).expect("summary JSON");
    let replay = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("analyze").arg(&record).arg("--json").output().expect("analyze");
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
    let replayed = String::from_utf8_lossy(&replay.stdout);
    let (lv, rv): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(&live).expect("JSON"), serde_json::from_str(&replayed).expect("JSON"));
    assert_eq!(lv["capture"], "shim", "run's summary says how it captured (docs/metrics.md)");
    assert!(rv.get("capture").is_none() && rv.get("coverage").is_none(), "analyze of a file has neither capture nor coverage: {rv}");
    for json in [live.as_str(), &replayed] {
        let v: serde_json::Value = serde_json::from_str(json).expect("JSON");
        let ooms = v["ooms"].as_array().expect("ooms");
        assert!(!ooms.is_empty(), "{json}");
        for oom in ooms {
            assert_eq!(oom["verdict"], "fragmentation", "{oom}");
            assert_eq!(oom["requested"], 2684354560u64, "{oom}");
            assert_eq!(oom["device_free"], device_free, "the device free bytes measured at the failure: {oom}");
        }
        assert_eq!(v["exact"], true, "nothing dropped, nothing inconsistent: {json}");
    }
}

/// `gpufrag analyze --json RECORD`, parsed.
fn analyze(record: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("analyze").arg("--json").arg(record).output().expect("analyze");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn threads_reusing_each_others_addresses_replay_exactly() {
    let a = artifacts();
    let dir = TempDir::new("run-threads");
    let record = dir.path().join("threads.rec");
    // Lanes big enough that a debug-build consumer on a loaded machine drops nothing (the lanes
    // touch memory only as far as they fill).
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "--quiet", "--no-python-hook", "--no-feed", "--no-report", "--ring-capacity", "2097152", "--record"])
        .arg(&record)
        .arg("--preload")
        .arg(&a.shim)
        .arg("--")
        .arg(&a.workload)
        .args(["threads", "8", "20000"])
        .env("LD_LIBRARY_PATH", &a.libs)
        .env("SIMCUDA_STATE_DIR", dir.path())
        .output()
        .expect("gpufrag run");
    assert!(out.status.success(), "gpufrag run: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let v = analyze(&record);
    assert_eq!(v["dropped"], 0, "{}", v["notes"]);
    assert_eq!(v["anomalies"], 0, "a free and an allocation of a reused address out of order: {}", v["notes"]);
    assert_eq!(v["exact"], true, "{}", v["notes"]);
}

/// What a new user sees first (issue 17): `gpufrag demo` shows the live line, the OOM and its
/// verdict with the fix once, none of the simulated program's own lines (those come with
/// `--program-output`), and leaves nothing in the current directory: the report goes under
/// `$XDG_STATE_HOME/gpufrag/`, named after the process that failed.
#[test]
fn demo_first_screen_shows_live_line_oom_and_verdict_once_and_leaves_no_file_in_the_cwd() {
    let _ = artifacts();
    let dir = TempDir::new("demo");
    let cwd = dir.path().join("cwd");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&cwd).expect("cwd");
    let demo = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
            .arg("demo")
            .args(extra)
            .current_dir(&cwd)
            .env("XDG_STATE_HOME", &state)
            .env("XDG_RUNTIME_DIR", dir.path())
            .output()
            .expect("gpufrag demo");
        assert!(out.status.success(), "gpufrag demo: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (stdout, stderr) = demo(&[]);
    let all = format!("{stdout}{stderr}");
    assert!(!all.contains("EVENT kind=") && !all.contains("RESULT test="), "the simulator's own lines leak into the demo:\n{all}");
    let first: Vec<&str> = stderr.lines().take(12).collect();
    let at = |what: &str| {
        first.iter().position(|l| l.contains(what)).unwrap_or_else(|| panic!("{what:?} not on the first screen:\n{}", first.join("\n")))
    };
    let (live, oom, verdict, fix) = (
        at("[gpufrag] gpu0: reserved"),
        at("OOM in pid"),
        at("fragmentation OOM: 2.50 GiB requested"),
        at("fix: With expandable_segments:True"),
    );
    assert!(live < oom && oom < verdict && verdict < fix, "order: live {live}, oom {oom}, verdict {verdict}, fix {fix}\n{stderr}");
    for once in ["fragmentation OOM: 2.50 GiB requested", "fix: With expandable_segments:True"] {
        assert_eq!(stderr.matches(once).count(), 1, "{once:?} should be printed once:\n{stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(&cwd).expect("cwd").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "the demo left files in the current directory: {left:?}");
    // The demo's report goes to the private state folder, never the current directory.
    let report = state.join("gpufrag").join("demo-report.html");
    assert!(report.is_file(), "no report at {}:\n{stderr}", report.display());
    assert!(stderr.contains(&format!("OOM report: {}", report.display())), "{stderr}");

    let (stdout, stderr) = demo(&["--program-output"]);
    assert!(
        format!("{stdout}{stderr}").contains("RESULT test=frag-oom"),
        "--program-output shows the program's lines:\n{stdout}\n{stderr}"
    );
}
