//! `gpufrag top --once` (issue 27): one frame as text, no terminal needed, at 80 and 120
//! columns: the two pids 21364 and 21368 whole and distinct (no `pid 2136`), devices in index
//! order with their processes under them, the exited process's figures in parentheses and out of
//! its device's totals, columns dropped by priority and no line wider than asked; and without
//! `--once` and without a terminal, `top` says it needs one. Against a live `gpufrag run` of a
//! simcuda workload: NVML's used bytes beside the traced ones, the GPU's name and utilization,
//! checked against what simcuda was given (the bytes held, `SIMCUDA_UTILIZATION`, its name), and
//! `-` (never 0) for all three without NVML.

mod tool_support;
use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};
use std::io::{BufRead, BufReader, Write};
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

/// The shim and the simcuda stand-ins, built by the workspace build (see tests/preload_common).
fn simcuda() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?.to_path_buf();
    let (shim, workload, libs) = (profile.join("libgpufrag_preload.so"), profile.join("simcuda-workload"), profile.join("simcuda"));
    if shim.exists() && workload.exists() && libs.join("libnvidia-ml.so.1").exists() {
        Some((shim, workload, libs))
    } else {
        tool_support::missing("the shim and simcuda-workload", "build them first with `cargo build --release --workspace`");
        None
    }
}

/// The cells of a `--once` frame's table, by the header's column names: (row label, column) →
/// text. A column's cells are the characters under its name up to the next name.
fn table(frame: &str) -> std::collections::HashMap<(String, String), String> {
    let inner = |l: &str| l.strip_prefix('│').and_then(|l| l.strip_suffix('│')).map(|l| l.chars().collect::<Vec<char>>());
    let lines: Vec<Vec<char>> = frame.lines().filter_map(inner).collect();
    let header = lines.iter().find(|l| l.iter().collect::<String>().contains("gpu / pid")).expect("header");
    // A name begins after two spaces (one inside a name, as in `nvml used`).
    let starts: Vec<usize> =
        (0..header.len()).filter(|&i| header[i] != ' ' && header[..i].iter().rev().take(2).all(|c| *c == ' ')).collect();
    let name = |k: usize| -> String {
        let end = starts.get(k + 1).copied().unwrap_or(header.len());
        header[starts[k]..end].iter().collect::<String>().trim().trim_end_matches(['▼', '▲']).to_string()
    };
    let mut out = std::collections::HashMap::new();
    for l in &lines {
        let cell = |k: usize| -> String {
            let end = starts.get(k + 1).copied().unwrap_or(l.len()).min(l.len());
            l.get(starts[k]..end).map_or(String::new(), |c| c.iter().collect::<String>().trim().to_string())
        };
        let label = cell(0).trim_start_matches("> ").to_string();
        if !(label.starts_with("gpu ") || label.starts_with("pid ")) || label.starts_with("gpu / pid") {
            continue;
        }
        for k in 1..starts.len() {
            out.insert((label.clone(), name(k)), cell(k));
        }
        out.insert((label.clone(), "label".into()), label.clone());
    }
    out
}

/// A `gpufrag run` under test and its stdout (kept open: the workload prints its result there
/// as it ends).
type Live = (std::process::Child, BufReader<std::process::ChildStdout>);

/// `gpufrag run` of `simcuda-workload hold 1536MiB` with `env`; returns the run, the workload's
/// pid and the feed socket once it holds its memory.
fn live_hold(dir: &Path, env: &[(&str, &str)]) -> Option<(Live, u32, PathBuf)> {
    let (shim, workload, libs) = simcuda()?;
    let sock = dir.join("feed.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpufrag"));
    cmd.args(["run", "--quiet", "--no-report", "--feed"])
        .arg(&sock)
        .arg("--preload")
        .arg(&shim)
        .arg("--")
        .arg(&workload)
        .args(["hold", "1536MiB"])
        .env("LD_LIBRARY_PATH", &libs)
        .env("SIMCUDA_STATE_DIR", dir.join("simcuda"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut run = cmd.spawn().expect("gpufrag run");
    let mut out = BufReader::new(run.stdout.take().expect("stdout"));
    let mut ready = String::new();
    out.read_line(&mut ready).expect("READY line");
    assert!(ready.starts_with("READY pid="), "{ready}");
    let pid: u32 = ready["READY pid=".len()..].split_whitespace().next().and_then(|p| p.parse().ok()).expect("pid");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !sock.exists() {
        assert!(std::time::Instant::now() < deadline, "the feed socket never appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Some(((run, out), pid, sock))
}

fn once_live(sock: &Path, width: u16) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["top", "--once", "--width", &width.to_string(), "--connect"])
        .arg(sock)
        .stdin(Stdio::null())
        .output()
        .expect("gpufrag top --once");
    assert!(out.status.success(), "top --once failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn end((mut run, mut out): Live) {
    if let Some(mut stdin) = run.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let status = run.wait().expect("run ends");
    assert!(status.success(), "gpufrag run: {status:?}");
}

/// Issue 27: nvitop's users expect NVML's per-process memory, the GPU's name and its
/// utilization. simcuda was given a 1536 MiB hold (2 MiB pages: NVML's used is exactly that),
/// `SIMCUDA_UTILIZATION=37:12` and its name `NVIDIA H200 (simcuda)`; at 80 and 120 columns the
/// frame shows them beside the traced reserved, the pid whole.
#[test]
fn live_once_shows_nvml_used_the_gpu_name_and_utilization_at_80_and_120_columns() {
    let dir = std::env::temp_dir().join(format!("gpufrag-top-once-nvml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let Some((run, pid, sock)) = live_hold(&dir, &[("SIMCUDA_UTILIZATION", "37:12")]) else { return };
    let held = 1536u64 << 20;
    let shown = gpufrag::units::human_bytes(held);
    for width in [80u16, 120] {
        let frame = once_live(&sock, width);
        for l in frame.lines() {
            assert!(l.chars().count() <= width as usize, "a line wider than {width}: {l:?}\n{frame}");
        }
        let t = table(&frame);
        let row = format!("pid {pid} gpu 0");
        let device = t.keys().map(|(l, _)| l.clone()).find(|l| l.starts_with("gpu 0")).expect("device row");
        let cell = |label: &str, col: &str| {
            t.get(&(label.to_string(), col.to_string())).cloned().unwrap_or_else(|| panic!("no {col:?} of {label:?} at {width}:\n{frame}"))
        };
        assert_eq!(cell(&row, "reserved"), shown, "traced, at {width}:\n{frame}");
        assert_eq!(cell(&row, "nvml used"), shown, "NVML's used bytes of the pid, at {width}:\n{frame}");
        assert_eq!(cell(&device, "nvml used"), shown, "every process NVML lists on gpu 0, at {width}:\n{frame}");
        assert_eq!(cell(&device, "util"), "37%", "SIMCUDA_UTILIZATION's GPU share, at {width}:\n{frame}");
        assert_eq!(cell(&row, "util"), "", "utilization is the GPU's, at {width}:\n{frame}");
        // The name, shortened by priority: whole where it fits, else without the vendor, else the model.
        let forms = ["gpu 0 NVIDIA H200 (simcuda)", "gpu 0 H200 (simcuda)", "gpu 0 H200"];
        assert!(forms.contains(&device.as_str()), "the device row names the GPU, at {width}: {device:?}\n{frame}");
        if width == 120 {
            assert!(device.len() > "gpu 0 H200".len(), "120 columns have room for more of the name: {device:?}\n{frame}");
        }
    }
    end(run);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without NVML (`GPUFRAG_NVML_LIB=none`), what NVML would say is unknown: `-`, never `0 B` or `0%`.
#[test]
fn live_once_without_nvml_says_unknown_not_zero() {
    let dir = std::env::temp_dir().join(format!("gpufrag-top-once-nonvml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let Some((run, pid, sock)) = live_hold(&dir, &[("GPUFRAG_NVML_LIB", "none"), ("SIMCUDA_UTILIZATION", "37:12")]) else { return };
    let frame = once_live(&sock, 80);
    let t = table(&frame);
    let row = format!("pid {pid} gpu 0");
    let get = |label: &str, col: &str| t.get(&(label.to_string(), col.to_string())).cloned();
    assert_eq!(get(&row, "reserved").as_deref(), Some("1.50 GiB"), "{frame}");
    assert_eq!(get(&row, "nvml used").as_deref(), Some("-"), "{frame}");
    assert_eq!(get("gpu 0", "nvml used").as_deref(), Some("-"), "no name: the label alone\n{frame}");
    assert_eq!(get("gpu 0", "util").as_deref(), Some("-"), "{frame}");
    end(run);
    let _ = std::fs::remove_dir_all(&dir);
}
