//! `gpufrag analyze` driven as a user drives it, against the real H200 traces and their ground
//! truth (`torch.cuda.memory_stats()` saved beside each snapshot, and the largest free blocks of
//! tests/fixtures/README.md), and against bad input of every kind.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn gpufrag(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).output().expect("run gpufrag")
}

fn analyze_json(file: &Path) -> Value {
    let out = gpufrag(&["analyze", "--json", file.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "analyze {} failed: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("analyze --json prints JSON")
}

fn stat(name: &str, key: &str) -> u64 {
    let text = std::fs::read_to_string(fixture(&format!("{name}.stats.json"))).expect("stats.json");
    let v: Value = serde_json::from_str(&text).expect("stats.json is JSON");
    v[key].as_u64().unwrap_or_else(|| panic!("{name}.stats.json has no {key}"))
}

/// Asserts the device-0 figures equal the trace's ground truth, printing both on failure.
fn check_trace(name: &str, file: &str, segments: u64, largest_free_block: u64, stranded: u64) -> Value {
    let s = analyze_json(&fixture(file));
    let d = &s["devices"][0];
    let want = [
        ("reserved", stat(name, "reserved_bytes.all.current")),
        ("allocated", stat(name, "allocated_bytes.all.current")),
        ("stranded", stranded),
        ("segments", segments),
        ("largest_free_block", largest_free_block),
    ];
    for (k, v) in want {
        assert_eq!(d[k].as_u64(), Some(v), "{name}: {k} is {} but the ground truth says {v}\nsummary: {d:#}", d[k]);
    }
    assert_eq!(s["exact"], Value::Bool(true), "{name}: notes {:#}", s["notes"]);
    s
}

#[test]
fn frag_oom_matches_ground_truth_and_is_a_fragmentation_oom() {
    let stranded = stat("frag_oom", "inactive_split_bytes.all.current");
    assert_eq!(stranded, 2_097_152_000);
    let s = check_trace("frag_oom", "frag_oom.pickle", 20, 209_715_200, stranded);
    let ooms = s["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1);
    let o = &ooms[0];
    assert_eq!(o["verdict"], "fragmentation");
    assert_eq!(o["requested"].as_u64(), Some(2_684_354_560));
    assert_eq!(o["device_free"].as_u64(), Some(2_398_224_384));
    assert_eq!(o["stranded"].as_u64(), Some(2_097_152_000));
    assert_eq!(o["largest_free_block"].as_u64(), Some(209_715_200));
    let f = s["devices"][0]["fragmentation"].as_f64().expect("fragmentation");
    assert!((f - 0.467).abs() < 0.001, "fragmentation {f}, docs/metrics.md works it out as 1 - 2.23/4.18 = 0.47");
}

#[test]
fn frag_oom_human_output_names_the_numbers_and_the_fix() {
    let out = gpufrag(&["analyze", fixture("frag_oom.pickle").to_str().expect("path")]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["verdict: fragmentation", "2.50 GiB requested", "1.95 GiB", "2.23 GiB", "200.00 MiB", "expandable_segments:True"] {
        assert!(text.contains(needle), "human output lacks {needle:?}:\n{text}");
    }
}

#[test]
fn frag_oom_expandable_has_no_oom_and_nothing_stranded() {
    assert_eq!(stat("frag_oom_expandable", "inactive_split_bytes.all.current"), 0);
    let s = check_trace("frag_oom_expandable", "frag_oom_expandable.pickle", 11, 0, 0);
    assert_eq!(s["ooms"].as_array().map(Vec::len), Some(0));
}

#[test]
fn pinned_splits_matches_ground_truth() {
    let stranded = stat("pinned_splits", "inactive_split_bytes.all.current");
    check_trace("pinned_splits", "pinned_splits.pickle", 8, 1_073_741_824, stranded);
}

#[test]
fn gpt2_varlen_matches_ground_truth() {
    let stranded = stat("gpt2_varlen", "inactive_split_bytes.all.current");
    check_trace("gpt2_varlen", "gpt2_varlen.pickle.gz", 204, 2_703_228_928, stranded);
}

#[test]
fn device_filter_keeps_only_that_device() {
    let out = gpufrag(&["analyze", "--json", "--device", "3", fixture("frag_oom.pickle").to_str().expect("path")]);
    assert!(out.status.success());
    let s: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(s["devices"].as_array().map(Vec::len), Some(0));
    assert_eq!(s["ooms"].as_array().map(Vec::len), Some(0));
}

/// Runs analyze on bad input: exit 2, one line on stderr naming the file, no panic.
fn rejects(file: &Path, what: &str) -> String {
    let out = gpufrag(&["analyze", file.to_str().expect("path")]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{what}: exit {:?}, stderr {err}", out.status.code());
    assert!(!err.contains("panicked"), "{what}: panicked: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: want one line, got {err}");
    assert!(err.contains(&file.display().to_string()), "{what}: error does not name the file: {err}");
    err
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufrag-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write scratch file");
    p
}

#[test]
fn bad_input_gets_one_line_naming_the_file_and_exit_2() {
    rejects(Path::new("/nonexistent/trace.pickle"), "missing file");
    let whole = std::fs::read(fixture("frag_oom.pickle")).expect("fixture");
    let err = rejects(&scratch("truncated.pickle", &whole[..whole.len() / 2]), "truncated pickle");
    assert!(err.contains("offset") || err.contains("truncated") || err.contains("end of"), "{err}");
    // A valid pickle that is not a snapshot: protocol 2, the list [1, 2].
    rejects(&scratch("list.pickle", b"\x80\x02]q\x00(K\x01K\x02e."), "not a snapshot");
    let mut gz = vec![0x1f, 0x8b, 0x08, 0x00];
    gz.extend_from_slice(&[0xde; 64]);
    rejects(&scratch("corrupt.pickle.gz", &gz), "corrupt gzip");
    rejects(&scratch("random.bin", b"\x00\x01\x02 this is not anything"), "random bytes");
    let mut rec = b"GPUFRAG\x01".to_vec();
    rec.extend_from_slice(&9u32.to_le_bytes());
    rec.extend_from_slice(&80u32.to_le_bytes());
    rejects(&scratch("future.rec", &rec), "record file of a future version");
}

#[test]
fn event_anomalies_are_counted_warnings_and_make_the_figures_inexact() {
    use gpufrag::event::{Event, EventKind, F_FRAMEWORK_OWNED};
    let mut w = gpufrag::record::Writer::new(Vec::new()).expect("writer");
    let seg = Event { addr: 0x7f00_0000_0000, size: 20 << 20, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 42, 0) };
    let block = Event { addr: 0x7f00_0000_0000, requested: 4 << 20, ..Event::new(EventKind::BlockAlloc, 42, 0) };
    let unknown_free = Event { addr: 0xdead_0000, ..Event::new(EventKind::BlockFree, 42, 0) };
    let outside = Event { addr: 0x1000, requested: 512, ..Event::new(EventKind::BlockAlloc, 42, 0) };
    for e in [seg, block, unknown_free, outside] {
        w.write(&e).expect("write");
    }
    let file = scratch("anomalies.rec", &w.finish().expect("finish"));
    let s = analyze_json(&file);
    assert_eq!(s["exact"], Value::Bool(false));
    assert_eq!(s["anomalies"].as_u64(), Some(2));
    let notes = s["notes"].to_string();
    assert!(notes.contains("free of unknown address 0xdead0000"), "{notes}");
    assert!(notes.contains("inside no segment"), "{notes}");
    // What was consistent still counts.
    assert_eq!(s["devices"][0]["allocated"].as_u64(), Some(4 << 20));
    assert_eq!(s["devices"][0]["stranded"].as_u64(), Some(16 << 20));
}

/// Issue 22 item 6, a verdict from partial facts says so: the same record of a fragmentation OOM
/// (a 1 GiB segment whose free 768 MiB are split in two runs by a live block, the larger 512 MiB,
/// a 600 MiB request,
/// 100 MiB free on the device) is `fragmentation` when the process was traced from its start,
/// and `inconclusive` (what is missing named, the driver-level figures given, no computed fix)
/// when its `ProcessExec` says it was first seen after its start or when the capture dropped
/// events of it; the figures stay the same.
#[test]
fn a_record_whose_blocks_are_missing_gets_inconclusive_naming_what_is_missing() {
    use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FAILED, F_FRAMEWORK_OWNED, F_PARTIAL};
    const MIB: u64 = 1 << 20;
    let dir = std::env::temp_dir().join(format!("gpufrag-analyze-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let seg = 1u64 << 40;
    let write = |name: &str, exec_flags: u32, dropped: u64| -> PathBuf {
        let path = dir.join(name);
        let mut w = gpufrag::record::Writer::create(&path).expect("record");
        let mut t = 0u64;
        let mut put = |e: Event| {
            t += 1000;
            w.write(&Event { ts_ns: t, ..e }).expect("write");
        };
        put(Event { flags: exec_flags, ..Event::new(EventKind::ProcessExec, 7, -1) });
        put(Event { addr: seg, size: 1 << 30, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 7, 0) });
        put(Event { addr: seg, requested: 256 * MIB, ..Event::new(EventKind::BlockAlloc, 7, 0) });
        put(Event { addr: seg + 512 * MIB, requested: 256 * MIB, ..Event::new(EventKind::BlockAlloc, 7, 0) });
        put(Event { addr: seg + 256 * MIB, requested: 256 * MIB, ..Event::new(EventKind::BlockAlloc, 7, 0) });
        put(Event { addr: seg, ..Event::new(EventKind::BlockFree, 7, -1) });
        put(Event { addr: seg + 512 * MIB, ..Event::new(EventKind::BlockFree, 7, -1) });
        if dropped > 0 {
            put(Event { size: dropped, ..Event::new(EventKind::Dropped, 7, -1) });
        }
        put(Event {
            requested: 600 * MIB,
            device_free: 100 * MIB,
            rc: 2,
            op: EventKind::BlockAlloc as u16,
            flags: F_FAILED | F_DEVICE_FREE_KNOWN,
            ..Event::new(EventKind::AllocFailed, 7, 0)
        });
        w.finish().expect("finish");
        path
    };
    let whole = analyze_json(&write("whole.gpufrag", 0, 0));
    let o = &whole["ooms"][0];
    assert_eq!(o["verdict"], "fragmentation", "traced from its start: {o:#}");
    assert!(o.get("missing").is_none(), "{o:#}");
    let figures = |o: &Value| (o["requested"].clone(), o["stranded"].clone(), o["largest_free_block"].clone(), o["device_free"].clone());
    assert_eq!(
        figures(o),
        figures(
            &serde_json::json!({"requested": 600 * MIB, "stranded": 768 * MIB, "largest_free_block": 512 * MIB, "device_free": 100 * MIB})
        )
    );
    for (name, flags, dropped, words) in
        [("late.gpufrag", F_PARTIAL, 0, "not traced from its start"), ("dropped.gpufrag", 0, 3, "dropped 3 event(s)")]
    {
        let s = analyze_json(&write(name, flags, dropped));
        let p = &s["ooms"][0];
        assert_eq!(p["verdict"], "inconclusive", "{name}: {p:#}");
        assert!(p["missing"].as_str().is_some_and(|m| m.contains(words)), "{name}: what is missing: {p:#}");
        let e = p["explanation"].as_str().expect("explanation");
        assert!(
            e.contains(words) && e.contains("At the driver level: 600.00 MiB requested, device free 100.00 MiB, 1024.00 MiB reserved"),
            "{name}: {e}"
        );
        assert_eq!(figures(p), figures(o), "{name}: the figures are the same, only the verdict says what they rest on");
        let notes = s["notes"].to_string();
        assert!(notes.contains("no simulated fix") && notes.contains(words), "{name}: {notes}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 22, bad input: a record with a settings event that does not parse (not UTF-8), a
/// settings change naming a key PyTorch does not know, a framework's OOM figures and an OOM
/// report's allowed bytes for processes never seen: `analyze` reads it (exit 0), each is a counted
/// note with a one-line reason, and every figure is that of the same record without them.
#[test]
fn a_record_with_bad_facts_gets_a_counted_note_for_each_and_no_changed_figure() {
    use gpufrag::event::{Event, EventKind, F_ALLOWED_KNOWN, F_FAILED, F_FRAMEWORK_OWNED, F_OOM_AMEND};
    const MIB: u64 = 1 << 20;
    let dir = std::env::temp_dir().join(format!("gpufrag-analyze-badfacts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let write = |name: &str, bad: bool| -> PathBuf {
        let path = dir.join(name);
        let mut w = gpufrag::record::Writer::create(&path).expect("record");
        let settings = |text: &[u8]| Event { text_len: text.len() as u16, ..Event::new(EventKind::AllocSettings, 7, -1) };
        w.write(&Event::new(EventKind::ProcessExec, 7, -1)).expect("write");
        w.write_text(&settings(b"max_split_size_mb:128"), b"max_split_size_mb:128").expect("write");
        w.write(&Event { addr: 1 << 40, size: 64 * MIB, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 7, 0) })
            .expect("write");
        w.write(&Event { addr: 1 << 40, requested: 1_153_434, ..Event::new(EventKind::BlockAlloc, 7, 0) }).expect("write");
        if bad {
            w.write_text(&settings(b"\xff\xfe"), b"\xff\xfe").expect("write");
            w.write_text(&settings(b"no_such_key:1"), b"no_such_key:1").expect("write");
            let figures = Event { size: 1 << 30, requested: 1 << 29, handle: MIB, ..Event::new(EventKind::FrameworkFigures, 9, 0) };
            w.write(&figures).expect("write");
            let amend = Event {
                size: 1 << 30,
                rc: 2,
                op: EventKind::BlockAlloc as u16,
                flags: F_FAILED | F_ALLOWED_KNOWN | F_OOM_AMEND,
                ..Event::new(EventKind::AllocFailed, 11, 0)
            };
            w.write(&amend).expect("write");
        }
        w.write(&Event { addr: (1 << 40) + 2 * MIB, requested: 1_153_434, ..Event::new(EventKind::BlockAlloc, 7, 0) }).expect("write");
        w.finish().expect("finish");
        path
    };
    let clean = analyze_json(&write("clean.gpufrag", false));
    let bad = analyze_json(&write("bad.gpufrag", true));
    for k in ["devices", "processes", "ooms", "retries", "anomalies"] {
        assert_eq!(bad[k], clean[k], "{k} changed by facts that could not be used");
    }
    let notes: Vec<&str> = bad["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).collect();
    assert!(notes.iter().any(|n| n.starts_with("4 fact(s) a process stated about itself could not be used")), "{notes:#?}");
    for want in [
        "pid 7: allocator settings that are not UTF-8: ignored",
        "pid 7: allocator settings \"no_such_key:1\" do not parse (Unrecognized CachingAllocator option: no_such_key)",
        "pid 9: a framework's OOM figures on device 0 for a process with no OOM there: ignored",
        "pid 11: an OOM report's allowed bytes (1073741824) for a process never seen: ignored",
    ] {
        let n = notes.iter().find(|n| n.contains(want)).unwrap_or_else(|| panic!("no note {want:?}: {notes:#?}"));
        assert!(!n.contains('\n') && n.starts_with("event "), "one line naming the event: {n}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
