//! `gpufrag top --once` (issue 27): one frame as text, no terminal needed, at 80 and 120
//! columns: the two pids 21364 and 21368 whole and distinct (no `pid 2136`), devices in index
//! order with their processes under them, the exited process's figures in parentheses and out of
//! its device's totals, columns dropped by priority and no line wider than asked; and without
//! `--once` and without a terminal, `top` says it needs one.

use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GIB: u64 = 1 << 30;

/// A record: pid 21364 holds 1 GiB on gpu 1 and 3 GiB on gpu 0, pid 21368 holds 2 GiB on gpu 0
/// and exits without freeing it.
fn record(dir: &Path) -> PathBuf {
    let path = dir.join("two.rec");
    let mut w = gpufrag::record::Writer::create(&path).expect("record");
    let alloc = |ts, pid, device, addr, size| Event {
        ts_ns: ts,
        addr,
        size,
        requested: size,
        device_free: 20 * GIB,
        flags: F_DEVICE_FREE_KNOWN,
        ..Event::new(EventKind::MemAlloc, pid, device)
    };
    for e in [
        alloc(1_000, 21364, 1, 0x7f00_0000_0000, GIB),
        alloc(2_000, 21368, 0, 0x7e00_0000_0000, 2 * GIB),
        alloc(3_000, 21364, 0, 0x7d00_0000_0000, 3 * GIB),
        Event { ts_ns: 4_000, ..Event::new(EventKind::ProcessExit, 21368, -1) },
    ] {
        w.write(&e).expect("write");
    }
    w.finish().expect("finish");
    path
}

fn once(file: &Path, width: u16) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["top", "--once", "--width", &width.to_string(), "--replay"])
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .expect("gpufrag top --once");
    assert!(out.status.success(), "top --once failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The table's rows: (label, the cells after it), read off the frame.
fn rows(frame: &str) -> Vec<(String, Vec<String>)> {
    frame
        .lines()
        .filter_map(|l| l.strip_prefix('│').and_then(|l| l.strip_suffix('│')))
        .map(|l| l.trim_start_matches("> ").trim())
        .filter(|l| !l.starts_with("gpu / pid") && (l.starts_with("gpu ") || l.starts_with("pid ") || l.starts_with("all gpus")))
        .map(|l| {
            let cells: Vec<String> = l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect();
            (cells[0].clone(), cells[1..].to_vec())
        })
        .collect()
}

#[test]
fn once_at_80_and_120_columns_keeps_pids_whole_groups_by_device_and_marks_the_exited() {
    let dir = std::env::temp_dir().join(format!("gpufrag-top-once-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = record(&dir);
    for width in [80u16, 120] {
        let frame = once(&file, width);
        for l in frame.lines() {
            assert!(l.chars().count() <= width as usize, "a line wider than {width}: {l:?}\n{frame}");
        }
        let got = rows(&frame);
        let labels: Vec<&str> = got.iter().map(|(l, _)| l.as_str()).collect();
        // All devices, then gpu 0 with its processes (the largest first), then gpu 1 with its.
        assert_eq!(labels, ["all gpus", "gpu 0", "pid 21364 gpu 0", "pid 21368 gpu 0", "gpu 1", "pid 21364 gpu 1"], "at {width}:\n{frame}");
        let cells = |label: &str| got.iter().find(|(l, _)| l == label).map(|(_, c)| c.clone()).expect("row");
        // reserved is the first figure: the exited pid's 2 GiB is out of gpu 0's and the total.
        assert_eq!(cells("gpu 0")[0], "3.00 GiB", "at {width}:\n{frame}");
        assert_eq!(cells("all gpus")[0], "4.00 GiB", "at {width}:\n{frame}");
        assert_eq!(cells("pid 21368 gpu 0")[0], "(2.00 GiB)", "the exited figures marked, at {width}:\n{frame}");
        assert!(cells("pid 21368 gpu 0").contains(&"exited".to_string()), "at {width}:\n{frame}");
        assert!(cells("pid 21364 gpu 0").contains(&"running".to_string()), "at {width}:\n{frame}");
        let header = frame.lines().find(|l| l.contains("gpu / pid")).expect("header");
        if width == 80 {
            assert!(!header.contains("coverage") && !header.contains("dev total"), "dropped at 80: {header}");
        } else {
            assert!(header.contains("dev free") && header.contains("dev total"), "kept at 120: {header}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn top_without_a_terminal_says_it_needs_one() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["top", "--replay", "tests/fixtures/frag_oom.pickle"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("gpufrag top");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("gpufrag top needs a terminal") && err.contains("gpufrag top --once"), "{err}");
}

/// Issue 24: a record whose forecast event warns (foresight: a predicted OOM) shows the marker
/// in `top --once`: the process, the steps ahead, the predicted peak and what it may hold, the fix.
#[test]
fn a_forecast_warning_in_the_record_is_marked_in_top() {
    let dir = std::env::temp_dir().join(format!("gpufrag-top-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("warn.rec");
    let mut w = gpufrag::record::Writer::create(&path).expect("record");
    w.write(&Event {
        ts_ns: 1_000,
        addr: 0x7f00_0000_0000,
        size: 3 * GIB,
        requested: 3 * GIB,
        device_free: GIB,
        flags: F_DEVICE_FREE_KNOWN,
        ..Event::new(EventKind::MemAlloc, 4242, 0)
    })
    .expect("write");
    let fix = b"no setting tried fits the step that fails in 4.00 GiB: checkpoint now";
    w.write_text(
        &Event { ts_ns: 2_000, size: 5 * GIB, requested: 4 * GIB, handle: 2, addr: 8, ..Event::new(EventKind::Forecast, 4242, 0) },
        fix,
    )
    .expect("write");
    w.finish().expect("finish");
    let frame = once(&path, 200);
    assert!(frame.contains("1 predicted OOM warning(s)"), "{frame}");
    assert!(
        frame.contains("PREDICTED OOM pid 4242 gpu 0: 2 step(s) ahead, peak 5.00 GiB of 4.00 GiB available: checkpoint now"),
        "{frame}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
