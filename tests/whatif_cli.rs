//! `gpufrag whatif` driven as a user drives it: the JSON fields the issue fixes, the sweep and
//! its ranking, the human table, and bad input of every kind (exit 2 with a message that says
//! what to do).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn gpufrag(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).output().expect("run gpufrag")
}

fn json(args: &[&str]) -> Value {
    let out = gpufrag(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let out = gpufrag(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: exit {:?}, stderr {err}", out.status.code());
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}: {err}");
    }
}

#[test]
fn json_has_the_fixed_fields_for_every_scenario() {
    let f = fixture("frag_oom.pickle");
    let v = json(&["whatif", f.to_str().unwrap(), "--json"]);
    assert_eq!(v["faithful"], Value::Bool(true), "{}", v["check"]);
    let sc = v["scenarios"].as_array().unwrap();
    assert_eq!(sc.len(), 12, "the baseline and the 11 other settings of the sweep");
    for s in sc {
        assert!(s["alloc_conf"].is_string(), "alloc_conf in {s}");
        for k in [
            "peak_reserved",
            "peak_allocated",
            "num_alloc_retries",
            "num_device_alloc",
            "num_device_free",
            "reserved",
            "allocated",
            "stranded",
            "largest_free_block",
        ] {
            assert!(s[k].is_u64(), "{k} in {s}");
        }
        assert!(s["oom"].is_boolean());
        assert!(s["memory_limit"].is_null());
        assert_eq!(s["first_oom_requested"].is_null(), !s["oom"].as_bool().unwrap(), "{s}");
        assert_eq!(s["first_oom_index"].is_null(), !s["oom"].as_bool().unwrap(), "{s}");
    }
    let base = &sc[0];
    assert_eq!(base["alloc_conf"], "");
    assert_eq!(base["baseline"], true);
    assert_eq!(base["oom"], true);
    assert_eq!(base["first_oom_requested"], 2_684_354_560u64);
    assert_eq!(base["first_oom_index"], 70);
    let exp = sc.iter().find(|s| s["alloc_conf"] == "expandable_segments:True").unwrap();
    assert_eq!(exp["oom"], false);
    assert_eq!(exp["peak_reserved"], 11_072_962_560u64);
    let best = sc.iter().find(|s| s["rank"] == 1).unwrap();
    assert_eq!(best["oom"], false);
    assert!(v["recommendation"].as_str().unwrap().contains("fits"), "{}", v["recommendation"]);
}

#[test]
fn alloc_conf_scenarios_come_in_the_order_given_after_the_baseline() {
    let f = fixture("pinned_splits.pickle");
    let v = json(&[
        "whatif",
        f.to_str().unwrap(),
        "--json",
        "--alloc-conf",
        "max_split_size_mb:256",
        "--alloc-conf",
        "",
        "--alloc-conf",
        "expandable_segments:True",
        "--memory-limit",
        "16GiB",
    ]);
    let names: Vec<&str> = v["scenarios"].as_array().unwrap().iter().map(|s| s["alloc_conf"].as_str().unwrap()).collect();
    assert_eq!(names, ["", "max_split_size_mb:256", "", "expandable_segments:True"]);
    for s in v["scenarios"].as_array().unwrap() {
        assert_eq!(s["memory_limit"], 17_179_869_184u64);
    }
    // the baseline and the explicit "" are the same allocator: the same figures
    let sc = v["scenarios"].as_array().unwrap();
    assert_eq!(sc[0]["peak_reserved"], sc[2]["peak_reserved"]);
    assert_eq!(sc[0]["peak_reserved"], 8_589_934_592u64, "pinned_splits' own peak");
}

#[test]
fn a_memory_limit_below_the_need_is_a_true_oom_in_every_scenario() {
    let f = fixture("frag_oom.pickle");
    let v = json(&["whatif", f.to_str().unwrap(), "--json", "--memory-limit", "10GiB"]);
    for s in v["scenarios"].as_array().unwrap() {
        assert_eq!(s["oom"], true, "{s}");
        assert_eq!(s["first_oom_limit"], "memory_fraction", "{s}");
    }
    assert!(v["recommendation"].as_str().unwrap().starts_with("No setting tried avoids the OOM"), "{}", v["recommendation"]);
}

#[test]
fn the_table_shows_the_baseline_first_and_one_sentence() {
    let f = fixture("frag_oom.pickle");
    let out = gpufrag(&["whatif", f.to_str().unwrap(), "--alloc-conf", "expandable_segments:True"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("GiB")).collect();
    assert!(rows[0].contains("[baseline]"), "{text}");
    assert!(text.contains("self-check: faithful"), "{text}");
    assert!(text.contains("With expandable_segments:True this run peaks at 10.31 GiB reserved and the 2.50 GiB request"), "{text}");
}

#[test]
fn a_snapshot_without_history_says_how_to_record_one() {
    let f = fixture("gpt2_cache_no_history.pickle");
    fails_with(&["whatif", f.to_str().unwrap()], &["no allocation history", "_record_memory_history", "gpufrag attach --record"]);
}

#[test]
fn an_unknown_alloc_conf_key_is_named() {
    let f = fixture("frag_oom.pickle");
    fails_with(
        &["whatif", f.to_str().unwrap(), "--alloc-conf", "expandable_segments:True,max_spilt_size_mb:256"],
        &["Unrecognized CachingAllocator option: max_spilt_size_mb"],
    );
}

#[test]
fn values_pytorch_rejects_are_rejected_with_its_words() {
    let f = fixture("frag_oom.pickle");
    let p = f.to_str().unwrap();
    fails_with(
        &["whatif", p, "--alloc-conf", "max_split_size_mb:8"],
        &["CachingAllocator option max_split_size_mb too small, must be >= 20"],
    );
    fails_with(
        &["whatif", p, "--alloc-conf", "garbage_collection_threshold:1.2"],
        &["garbage_collect_threshold is invalid, set it in (0.0, 1.0)"],
    );
    fails_with(&["whatif", p, "--alloc-conf", "roundup_power2_divisions:3"], &["For roundups, the divisions has to be power of 2"]);
    fails_with(&["whatif", p, "--alloc-conf", "expandable_segments:1"], &["Expected a single True/False argument for expandable_segments"]);
    fails_with(&["whatif", p, "--memory-limit", "lots"], &["--memory-limit"]);
}

#[test]
fn a_record_of_sampled_blocks_is_refused() {
    let f = fixture("gpt2_run_h200.rec");
    fails_with(&["whatif", f.to_str().unwrap()], &["periodic snapshots", "_record_memory_history"]);
}

#[test]
fn missing_and_garbage_files_are_exit_2() {
    fails_with(&["whatif", "/nonexistent/trace.pickle"], &["/nonexistent/trace.pickle"]);
    let dir = std::env::temp_dir().join(format!("gpufrag-whatif-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.pickle");
    std::fs::write(&junk, b"\x80\x04this is not a snapshot").unwrap();
    fails_with(&["whatif", junk.to_str().unwrap()], &["junk.pickle"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_that_starts_after_the_first_allocation_is_refused() {
    let mut snap = gpufrag::snapshot::load(&fixture("frag_oom.pickle")).unwrap();
    // drop the first ten entries, as a ring truncated by max_entries would
    snap.traces[0].entries.drain(..10);
    let err = gpufrag::sim::from_snapshot(&snap).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("does not start at the program's first allocation") && msg.contains("max_entries"), "{msg}");
}

#[test]
fn analyze_and_report_name_the_setting_that_avoids_the_oom_from_the_simulation() {
    let f = fixture("frag_oom.pickle");
    let v = json(&["analyze", "--json", f.to_str().unwrap()]);
    let fix = v["ooms"][0]["fix"].as_str().unwrap();
    assert!(fix.starts_with("With expandable_segments:True this run peaks at 10.31 GiB reserved and the 2.50 GiB request"), "{fix}");
    assert_eq!(v["whatif"]["best"]["alloc_conf"], "expandable_segments:True");
    assert_eq!(v["whatif"]["best"]["peak_reserved"], 11_072_962_560u64);
    assert_eq!(v["whatif"]["baseline"]["oom"], true);
    assert_eq!(v["whatif"]["scenarios"], 12);
    let dir = std::env::temp_dir().join(format!("gpufrag-whatif-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let html = dir.join("r.html");
    let out = gpufrag(&["report", f.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<table id=\"whatif\" data-scenarios=\"12\">"), "the report has the side-by-side table");
    assert!(page.contains("<td id=\"whatif-best\">expandable_segments:True</td>"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_without_an_oom_keeps_its_summary_as_it_was() {
    let f = fixture("pinned_splits.pickle");
    let v = json(&["analyze", "--json", f.to_str().unwrap()]);
    assert!(v.get("whatif").is_none(), "no OOM, no simulated fix: {}", v["whatif"]);
}

#[test]
fn device_memory_answers_whether_it_fits_on_a_bigger_card() {
    // frag_oom ran out of device memory against a balloon; on an 80 GB card nothing fails
    let f = fixture("frag_oom.pickle");
    let v = json(&["whatif", f.to_str().unwrap(), "--json", "--device-memory", "80GB", "--alloc-conf", ""]);
    assert_eq!(v["faithful"], true, "the self-check keeps the trace's own device limit");
    assert_eq!(v["device_memory"], 85_899_345_920u64);
    for s in v["scenarios"].as_array().unwrap() {
        assert_eq!(s["oom"], false, "{s}");
        assert_eq!(s["peak_reserved"], 13_170_114_560u64, "{s}");
    }
}

/// Issue 27: whatif of a record with driver-level segments only told the user to record with
/// `gpufrag run --record`, which they had done, under a heading that said the trace was truncated.
/// It now says what is true (no caching allocator was seen), how to check the hook, and what
/// whatif does not model.
#[test]
fn regression_a_record_without_blocks_says_why_and_does_not_ask_for_what_was_done() {
    use gpufrag::event::{Event, EventKind};
    let dir = std::env::temp_dir().join(format!("gpufrag-whatif-noblocks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("segments.rec");
    let mut w = gpufrag::record::Writer::create(&rec).unwrap();
    for (i, size) in [1u64 << 30, 2 << 30].into_iter().enumerate() {
        let addr = 0x7f00_0000_0000 + (i as u64) * (4 << 30);
        w.write(&Event { ts_ns: 1_000 * (i as u64 + 1), addr, size, requested: size, ..Event::new(EventKind::MemAlloc, 77, 0) }).unwrap();
    }
    w.finish().unwrap();
    let out = gpufrag(&["whatif", rec.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit {:?}: {err}", out.status.code());
    for n in ["only driver-level segments", "models PyTorch's caching allocator", "import sitecustomize", "JAX (XLA) or CuPy"] {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    for wrong in ["record the program with gpufrag run --record", "does not start at the program's first allocation"] {
        assert!(!err.contains(wrong), "stderr still says {wrong:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
