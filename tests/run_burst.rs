//! `gpufrag run` stays bounded under a burst of short children (issue 23, item 6; see
//! docs/benchmarks.md, "Bursts of short children"): 1,500 processes, four at a time, started
//! one after the other by `xargs` while the shell stays alive, each mapping its shim ring into the
//! consumer and exiting. Before, the consumer's prefaulter held every exited child's ring mapping
//! until new connections paused for 5 ms (2.66 GB peak RSS for 1,500 when the issue was filed;
//! 415 MB here with four at a time, 916 MB with five); now a ring is unmapped when the
//! drainer lets go of its exited process. gpufrag's own peak (VmHWM of /proc/PID/status, read
//! while it still runs) must stay under 200 MB, and every child must have been traced (the
//! summary names 1,500 workload processes).
//!
//! Needs the workspace built (`cargo build --workspace --release`).

#![allow(clippy::unwrap_used)]

mod tool_support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILDREN: usize = 1_500;
/// Children alive at once (`xargs -P`: a new one starts the moment one ends, so new connections
/// never pause). Each live child's ring costs the consumer the lanes it keeps in memory (lane 0
/// and the spare, 5.5 MiB each by default), so the peak is the base plus this many live rings
/// (and those of children that exited since the drainer's last pass); what the test shows is that
/// the exited ones add nothing more.
const AT_ONCE: usize = 4;
const PEAK_BOUND_KB: u64 = 200 * 1000;

fn status_kb(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    line[key.len()..].trim().trim_end_matches("kB").trim().parse().unwrap()
}

#[test]
fn fifteen_hundred_short_children_under_run_keep_peak_rss_under_200_mb() {
    let gpufrag = PathBuf::from(env!("CARGO_BIN_EXE_gpufrag"));
    let dir = std::env::var_os("GPUFRAG_TEST_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| gpufrag.parent().unwrap().to_path_buf());
    let (workload, preload, libs) = (dir.join("simcuda-workload"), dir.join("libgpufrag_preload.so"), dir.join("simcuda"));
    if !(workload.is_file() && preload.is_file() && libs.join("libcuda.so.1").exists()) {
        tool_support::missing("the simcuda stand-ins and the shim", "build them with `cargo build --workspace --release`");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("gpufrag-burst-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let summary = tmp.join("summary.json");
    // Child i allocates i bytes. Then the shell says so and waits for its stdin to close, so that
    // gpufrag's peak can be read while it still runs.
    let script = format!("seq {CHILDREN} | xargs -P {AT_ONCE} -n 1 \"$0\" basic >/dev/null; echo BURST-DONE; read _");
    let t = Instant::now();
    let mut run = Command::new(&gpufrag)
        .env("SIMCUDA_MEM", "16GiB")
        .env("SIMCUDA_STATE_DIR", tmp.join("sim"))
        .env("LD_LIBRARY_PATH", &libs)
        .env_remove("LD_PRELOAD")
        .arg("run")
        .arg("--quiet")
        .arg("--preload")
        .arg(&preload)
        .arg("--summary-json")
        .arg(&summary)
        .args(["--", "sh", "-c", &script])
        .arg(&workload)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = run.id();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let done = lines.any(|l| l.is_ok_and(|l| l.trim() == "BURST-DONE"));
    assert!(done, "the burst did not finish");
    let burst = t.elapsed();
    // The drainer lets go of the last children's rings within a few of its passes.
    std::thread::sleep(Duration::from_millis(500));
    let (hwm, rss) = (status_kb(pid, "VmHWM:"), status_kb(pid, "VmRSS:"));
    writeln!(run.stdin.as_mut().unwrap()).unwrap();
    drop(run.stdin.take());
    let status = run.wait().unwrap();
    let text = std::fs::read_to_string(&summary).unwrap();
    let s: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Each child allocates once (the shell allocates nothing).
    let children = s["processes"].as_array().unwrap().iter().filter(|p| p["allocs"].as_u64() == Some(1)).count();
    let allocs: u64 = s["processes"].as_array().unwrap().iter().filter_map(|p| p["allocs"].as_u64()).sum();
    eprintln!(
        "{CHILDREN} children, {AT_ONCE} at a time, under run in {:.1} s: gpufrag peak RSS (VmHWM) {:.1} MB, RSS after the burst {:.1} MB; the summary has {children} workload processes, {allocs} allocations",
        burst.as_secs_f64(),
        hwm as f64 / 1000.0,
        rss as f64 / 1000.0
    );
    assert_eq!(status.code(), Some(0), "gpufrag run's exit");
    assert_eq!(children, CHILDREN, "workload processes in the summary");
    assert_eq!(allocs, CHILDREN as u64, "one allocation per child");
    assert!(
        hwm < PEAK_BOUND_KB,
        "gpufrag's peak RSS was {:.1} MB over {CHILDREN} short children (bound {} MB)",
        hwm as f64 / 1000.0,
        PEAK_BOUND_KB / 1000
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
