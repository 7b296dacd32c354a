//! Issue 23, item 8: the smaller defects. A FIFO given as input blocked analyze, report and
//! whatif for ever (now a pipe is waited on for a bounded time); `report --memviz` wrote one file per process (18,709 files from a 1.6 MB
//! record); text from an input (a file name here) reached the terminal raw, escape sequences
//! included.

use gpufrag::event::{Event, EventKind};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufrag-small-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch");
    d
}

/// Runs gpufrag with a deadline: (exit code, stderr, seconds); a hang is killed and fails.
fn gpufrag(args: &[&std::ffi::OsStr], limit: Duration) -> (Option<i32>, String, String, f64) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpufrag");
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpufrag {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed().as_secs_f64(),
    )
}

/// A FIFO that no writer opens is waited on for `input::PIPE_SILENCE` (10 s), never for ever,
/// then refused naming it (issue 28 made pipes inputs: tests/input_once.rs); what can never be
/// read to an end (a directory, a device) is refused at once. The commands run side by side.
#[test]
fn regression_a_fifo_input_without_a_writer_is_refused_after_a_bounded_wait_not_waited_on() {
    let d = scratch("fifo");
    let fifo = d.join("input.rec");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("cstr");
    // SAFETY: mkfifo reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let html = d.join("r.html");
    let silence = gpufrag::input::PIPE_SILENCE.as_secs_f64();
    let commands = [vec!["analyze"], vec!["report", "-o", html.to_str().expect("utf-8")], vec!["whatif"]];
    let runs: Vec<_> = commands
        .iter()
        .map(|args| {
            let mut a: Vec<std::ffi::OsString> = args.iter().map(std::ffi::OsString::from).collect();
            a.push(fifo.clone().into_os_string());
            std::thread::spawn(move || {
                let a: Vec<&std::ffi::OsStr> = a.iter().map(|s| s.as_os_str()).collect();
                gpufrag(&a, Duration::from_secs_f64(silence * 3.0))
            })
        })
        .collect();
    for (args, r) in commands.iter().zip(runs) {
        let (code, _, stderr, secs) = r.join().expect("run");
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("{}: a pipe that sent nothing for 10 s", fifo.display())), "{args:?}: {stderr}");
        assert!(secs >= silence - 0.5 && secs < silence * 2.0, "{args:?} took {secs:.1} s (the bound is {silence} s)");
    }
    for (what, path) in [("a directory", d.clone()), ("a device", PathBuf::from("/dev/zero"))] {
        for args in [vec!["analyze"], vec!["whatif"]] {
            let mut a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
            a.push(path.as_os_str());
            let (code, _, stderr, secs) = gpufrag(&a, Duration::from_secs(10));
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("{}: {what}; gpufrag reads regular files and pipes only", path.display())),
                "{args:?}: {stderr}"
            );
            assert!(secs < 5.0, "{args:?} {what} took {secs:.1} s");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn regression_report_memviz_writes_a_bounded_number_of_files() {
    let d = scratch("memviz");
    let rec = d.join("many.rec");
    let mut w = gpufrag::record::Writer::create(&rec).expect("create");
    for pid in 1..=100u32 {
        let base = 0x7f00_0000_0000 + (pid as u64) * (1 << 30);
        // Process 77 reserves the most; process 5 fails an allocation (both must be kept).
        let size = if pid == 77 { 64 << 20 } else { 2 << 20 };
        w.write(&Event { addr: base, size, ..Event::new(EventKind::MemAlloc, pid, 0) }).expect("write");
    }
    let mut oom = Event { size: 1 << 40, ..Event::new(EventKind::MemAlloc, 5, 0) };
    oom.flags |= gpufrag::event::F_FAILED;
    w.write(&oom).expect("write");
    w.finish().expect("finish");
    let out = d.join("out");
    std::fs::create_dir_all(&out).expect("out");
    let (code, stdout, stderr, _) = gpufrag(
        &[std::ffi::OsStr::new("report"), rec.as_os_str(), "--memviz".as_ref(), out.join("m.pickle").as_os_str()],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{stderr}");
    let files: Vec<String> =
        std::fs::read_dir(&out).expect("out").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(files.len(), gpufrag::views::memviz::MAX_FILES, "{files:?}");
    assert!(files.contains(&"m-77.pickle".to_string()) && files.contains(&"m-5.pickle".to_string()), "{files:?}");
    assert!(stdout.contains(&format!("memory_viz: {} more process(es) left out", 100 - gpufrag::views::memviz::MAX_FILES)), "{stdout}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn regression_input_text_reaches_the_terminal_escaped() {
    let d = scratch("escape");
    let bad = d.join("evil\x1b]0;owned\x07\x1b[2J.rec");
    std::fs::write(&bad, b"not a gpufrag record or snapshot").expect("write");
    let (code, _, stderr, _) = gpufrag(&["analyze".as_ref(), bad.as_os_str()], Duration::from_secs(10));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!stderr.contains('\x1b') && !stderr.contains('\x07'), "raw escape sequences on the terminal: {stderr:?}");
    assert!(stderr.contains("evil\\x1b]0;owned\\x07\\x1b[2J.rec"), "{stderr:?}");
    let _ = std::fs::remove_dir_all(&d);
}
