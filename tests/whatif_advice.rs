//! Advice that does not break the program: a process that exports its caching allocator's memory
//! over legacy CUDA IPC (`cuIpcGetMemHandle`) is never told to use expandable segments. End to
//! end: `gpufrag run --record` of simcuda's `ipc-export` workload (a caching allocator that hands
//! out a block and exports its segment, then asks for the handle of an address no allocation
//! holds, which the driver refuses), the shim's `IpcExport` events in the record, and whatif's
//! refusal, with the same trace's expandable-segments scenario still simulated and shown.

mod preload_common;

use gpufrag::event::EventKind;
use preload_common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn record_ipc_export(dir: &Path) -> (PathBuf, String) {
    let a = artifacts();
    let record = dir.join("ipc.rec");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "--quiet", "--no-python-hook", "--no-feed", "--no-report", "--record"])
        .arg(&record)
        .arg("--preload")
        .arg(&a.shim)
        .arg("--")
        .arg(&a.workload)
        .arg("ipc-export")
        .env("LD_LIBRARY_PATH", &a.libs)
        .env("SIMCUDA_STATE_DIR", dir)
        .output()
        .expect("gpufrag run");
    assert!(out.status.success(), "gpufrag run: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    (record, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn whatif(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("whatif").args(args).arg("--json").output().expect("whatif");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn the_shim_records_each_legacy_ipc_export_with_its_address_and_result() {
    let dir = TempDir::new("ipc-events");
    let (record, stdout) = record_ipc_export(dir.path());
    let results = lines_with(&stdout, "RESULT");
    assert_eq!(results.len(), 2, "{stdout}");
    let exported = addr(field(&results[0], "addr"));
    assert_eq!(field(&results[0], "rc"), "0");
    assert_ne!(field(&results[1], "rc"), "0", "the driver refuses an address no allocation holds");
    let rec = gpufrag::record::read(&record).expect("record");
    let ipc: Vec<_> = rec.events.iter().filter(|e| e.kind == EventKind::IpcExport as u16).collect();
    assert_eq!(ipc.len(), 2, "{ipc:?}");
    assert_eq!((ipc[0].addr, ipc[0].rc), (exported, 0));
    assert_eq!(ipc[1].addr, 0x10);
    assert_ne!(ipc[1].rc, 0);
}

#[test]
fn advice_refuses_expandable_segments_for_a_trace_that_exports_allocator_memory_over_ipc() {
    let dir = TempDir::new("ipc-advice");
    let (record, _) = record_ipc_export(dir.path());
    let r = record.to_str().unwrap();
    let v = whatif(&[r]);
    assert_eq!(v["ipc_exports"], 1, "one successful export of the allocator's memory: {v}");
    let sc = v["scenarios"].as_array().unwrap();
    let mut refused = 0;
    for s in sc {
        let expandable = s["alloc_conf"].as_str().unwrap().contains("expandable_segments:True");
        if expandable {
            refused += 1;
            assert!(s["rank"].is_null(), "a setting left out has no rank: {s}");
            let why = s["left_out"].as_str().unwrap_or_else(|| panic!("no reason given: {s}"));
            assert!(why.contains("cuIpcGetMemHandle") && why.contains("expandable segments"), "{why}");
            assert!(s["simulated_requests"].as_u64().unwrap() > 0, "still simulated and shown: {s}");
        } else {
            assert!(s["left_out"].is_null() && s["rank"].as_u64().is_some(), "{s}");
        }
    }
    assert_eq!(refused, 3, "the sweep's three expandable settings");
    let rec = v["recommendation"].as_str().unwrap();
    assert!(rec.contains("left out"), "the sentence says why: {rec}");
    assert!(!rec.starts_with("With expandable_segments"), "{rec}");
    // asked for only that setting: the answer is the baseline, and why the setting is out
    let only = whatif(&[r, "--alloc-conf", "expandable_segments:True"]);
    assert_eq!(only["scenarios"][0]["rank"], 1);
    assert!(only["scenarios"][1]["rank"].is_null());
    assert!(only["recommendation"].as_str().unwrap().contains("expandable_segments:True was simulated and left out"), "{only}");
}

#[test]
fn a_snapshot_cannot_show_ipc_exports_and_the_advice_says_so_when_it_names_expandable_segments() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frag_oom.pickle");
    let v = whatif(&[f.to_str().unwrap()]);
    assert_eq!(v["ipc_exports"], 0);
    let rec = v["recommendation"].as_str().unwrap();
    assert!(rec.starts_with("With expandable_segments:True"), "{rec}");
    assert!(rec.contains("cannot show CUDA IPC exports"), "{rec}");
}
