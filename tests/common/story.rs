//! The story a summary tells (per process: its figures; every OOM: its request, verdict, op,
//! stranded and largest free bytes, allowed bytes; the retries), and the check that `analyze` of a
//! run's record tells the live run's story (issue 22: one story per run, for every record source:
//! run with the tracker or snapshots, attach, agent). Included by the tests that record a run.

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

/// The figures, OOMs (with verdicts) and retries of a summary: what a replay of the run's record
/// must give as the live run did.
pub fn story(s: &Value) -> Value {
    let figures = |p: &Value| {
        let keep =
            ["pid", "device", "reserved", "allocated", "stranded", "releasable", "largest_free_block", "segments", "blocks", "retries"];
        Value::Object(keep.iter().map(|k| (k.to_string(), p[*k].clone())).collect())
    };
    let ooms: Vec<Value> = s["ooms"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| {
                    serde_json::json!([
                        o["pid"],
                        o["requested"],
                        o["verdict"],
                        o["op"],
                        o["stranded"],
                        o["largest_free_block"],
                        o["allowed"]
                    ])
                })
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({
        "processes": s["processes"].as_array().map(|a| a.iter().map(figures).collect::<Vec<_>>()),
        "ooms": ooms,
        "retries": s["retries"],
    })
}

/// Asserts that `analyze` of `record` tells the live summary's story.
pub fn assert_replays(live: &Value, record: &Path) {
    let replay = analyze(record);
    assert_eq!(story(&replay), story(live), "the record's replay differs from the live run\nlive: {live:#}\nreplay: {replay:#}");
}
