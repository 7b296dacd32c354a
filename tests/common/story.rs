//! The story a summary tells (per process: its figures; every OOM: its framework, request,
//! verdict, op, figures and allowed bytes; the retries), and the check that `analyze` of a run's
//! record tells the live run's story (issue 22: one story per run, for every record source: run
//! with the tracker or snapshots, attach, agent). Included by the tests that record a run.

#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// `gpufrag analyze --json` of a record file.
pub fn analyze(record: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("analyze").arg("--json").arg(record).output().expect("analyze");
    assert!(out.status.success(), "analyze {}: {}", record.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("analyze json")
}

/// The keys of `v` named in `keep`, as an object.
fn pick(v: &Value, keep: &[&str]) -> Value {
    Value::Object(keep.iter().map(|k| (k.to_string(), v[*k].clone())).collect())
}

/// The figures, OOMs (with verdicts) and retries of a summary: what a replay of the run's record
/// must give as the live run did.
pub fn story(s: &Value) -> Value {
    let process =
        ["pid", "device", "reserved", "allocated", "stranded", "releasable", "largest_free_block", "segments", "blocks", "retries"];
    let oom = [
        "pid",
        "device",
        "framework",
        "op",
        "requested",
        "verdict",
        "reserved",
        "allocated",
        "stranded",
        "releasable",
        "largest_free_block",
        "allowed",
    ];
    let all = |key: &str, keep: &[&str]| s[key].as_array().map(|a| a.iter().map(|v| pick(v, keep)).collect::<Vec<_>>()).unwrap_or_default();
    serde_json::json!({ "processes": all("processes", &process), "ooms": all("ooms", &oom), "retries": s["retries"] })
}

/// Asserts that `analyze` of `record` tells the live summary's story.
pub fn assert_replays(live: &Value, record: &Path) {
    let replay = analyze(record);
    assert_eq!(story(&replay), story(live), "the record's replay differs from the live run\nlive: {live:#}\nreplay: {replay:#}");
}
