//! Issue 28, "once each": every command opens its input once, tells it apart once and decodes it
//! once (`input::open`); the computed fix's simulator takes the opened input, not the path. A pipe
//! can be read only once, so each command is given the input through a FIFO and through
//! `/dev/stdin` (a pipe) and its whole output (the verdict, the computed fix, the report) must be
//! the output for the regular file: a second open of a FIFO finds no writer (an error after
//! `input::PIPE_SILENCE`), a second read of the pipe finds it drained (an empty input), and
//! either fails the comparison. Snapshots (plain and gzipped) and a record are covered, and a pipe
//! is held under the memory budget.

use gpufrag::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_FRAMEWORK_OWNED, F_SRC_SNAPSHOT};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufrag-once-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch");
    d
}

/// How the input reaches the command.
#[derive(Clone, Copy, Debug)]
enum Via {
    File,
    Fifo,
    Stdin,
}

/// Runs `gpufrag ARGS INPUT` with `input`'s bytes given `via` a regular file, a FIFO or
/// `/dev/stdin`; its output with every spelling of the input's path replaced by `INPUT`, and the
/// report (when `html` is given) likewise.
fn run(args: &[&str], input: &Path, via: Via, dir: &Path, html: Option<&Path>) -> (Output, String) {
    let bytes = std::fs::read(input).expect("input");
    let path = match via {
        Via::File => input.to_path_buf(),
        Via::Fifo => {
            let p = dir.join(format!("fifo-{}", input.file_name().and_then(|n| n.to_str()).expect("name")));
            let _ = std::fs::remove_file(&p);
            let c = std::ffi::CString::new(p.to_str().expect("utf-8")).expect("cstr");
            // SAFETY: mkfifo reads the NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
            p
        }
        Via::Stdin => PathBuf::from("/dev/stdin"),
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpufrag"));
    cmd.args(args).arg(&path).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if matches!(via, Via::Stdin) { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("gpufrag");
    let feeder = match via {
        Via::File => None,
        Via::Stdin => {
            let mut w = child.stdin.take().expect("stdin");
            Some(std::thread::spawn(move || {
                let _ = w.write_all(&bytes);
            }))
        }
        Via::Fifo => {
            let p = path.clone();
            Some(std::thread::spawn(move || feed_fifo(&p, &bytes)))
        }
    };
    let out = child.wait_with_output().expect("output");
    if let Some(f) = feeder {
        f.join().expect("feeder");
    }
    let spell = |s: &str| s.replace(&path.display().to_string(), "INPUT").replace(&input.display().to_string(), "INPUT");
    let report = html.map(|h| spell(&std::fs::read_to_string(h).unwrap_or_default())).unwrap_or_default();
    let out = Output {
        status: out.status,
        stdout: spell(&String::from_utf8_lossy(&out.stdout)).into_bytes(),
        stderr: spell(&String::from_utf8_lossy(&out.stderr)).into_bytes(),
    };
    (out, report)
}

/// Opens the FIFO for writing once the command has opened it for reading (within 20 s), writes
/// `bytes` and closes it: one writer, once.
fn feed_fifo(p: &Path, bytes: &[u8]) {
    let t0 = Instant::now();
    let mut f = loop {
        match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(p) {
            Ok(f) => break f,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{}: no reader opened the FIFO: {e}", p.display()),
        }
    };
    use std::os::unix::io::AsRawFd;
    // SAFETY: fcntl on the descriptor we own: blocking writes from here.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    let _ = f.write_all(bytes);
}

/// A record of the frag_oom snapshot's trace as a tracer writes one (the allocator's segments
/// claimed, block sizes from the trace, not sampled): 20 segments, 1.95 GiB stranded, one OOM.
fn frag_oom_record(dir: &Path) -> PathBuf {
    let snap = gpufrag::snapshot::load(&fixture("frag_oom.pickle")).expect("fixture");
    let rec = dir.join("frag_oom.rec");
    let mut w = gpufrag::record::Writer::create(&rec).expect("record");
    for (i, mut e) in snap.events().into_iter().enumerate() {
        e.flags &= !(F_BLOCK_SIZE_KNOWN | F_SRC_SNAPSHOT);
        if e.kind == EventKind::MemAlloc as u16 {
            e.flags |= F_FRAMEWORK_OWNED;
        }
        e.ts_ns = 1_000 * (i as u64 + 1);
        w.write(&e).expect("write");
    }
    w.finish_at(1 << 40).expect("finish");
    rec
}

fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).expect("utf-8")
}

/// Each command's output for the input given through a FIFO and through /dev/stdin equals its
/// output for the regular file, and that output holds a verdict and (`fix`) a computed fix.
fn same_output_from_a_pipe(input: &Path, dir: &Path, fix: bool) {
    let html = dir.join("r.html");
    let html_s = html.to_str().expect("utf-8").to_string();
    let commands: [(&[&str], bool); 4] =
        [(&["analyze", "--json"], false), (&["analyze"], false), (&["whatif", "--json"], false), (&["report", "-o", &html_s], true)];
    for (args, report) in commands {
        let (want, want_html) = run(args, input, Via::File, dir, report.then_some(html.as_path()));
        assert!(want.status.success(), "{args:?} {}: {}", input.display(), text(&want.stderr));
        if args == ["analyze", "--json"] {
            let s: serde_json::Value = serde_json::from_slice(&want.stdout).expect("json");
            let oom = &s["ooms"][0];
            assert!(oom["verdict"].is_string(), "{}: no verdict in {oom}", input.display());
            let w = &s["whatif"];
            assert!(!fix || w.is_object() && w["best"].is_object(), "{}: no computed fix: {w}; notes {}", input.display(), s["notes"]);
        }
        for via in [Via::Fifo, Via::Stdin] {
            let (got, got_html) = run(args, input, via, dir, report.then_some(html.as_path()));
            assert_eq!(got.status.code(), want.status.code(), "{args:?} via {via:?} {}: {}", input.display(), text(&got.stderr));
            assert_eq!(text(&got.stdout), text(&want.stdout), "{args:?} via {via:?} {}", input.display());
            assert_eq!(text(&got.stderr), text(&want.stderr), "{args:?} via {via:?} {}", input.display());
            assert!(
                got_html == want_html,
                "{args:?} via {via:?} {}: the report differs ({} vs {} bytes)",
                input.display(),
                got_html.len(),
                want_html.len()
            );
        }
    }
}

#[test]
fn a_snapshot_through_a_fifo_or_stdin_gives_the_output_of_the_file() {
    let d = scratch("snap");
    same_output_from_a_pipe(&fixture("frag_oom.pickle"), &d, true);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_gzipped_snapshot_through_a_fifo_or_stdin_gives_the_output_of_the_file() {
    let d = scratch("gz");
    // its OOM came under an allowed-bytes cap the snapshot does not carry: analyze says why it
    // has no simulated fix (a note), which the pipe's output must say the same
    same_output_from_a_pipe(&fixture("whatif/frag_s0_lim11g.pickle.gz"), &d, false);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_record_through_a_fifo_or_stdin_gives_the_output_of_the_file() {
    let d = scratch("rec");
    let rec = frag_oom_record(&d);
    same_output_from_a_pipe(&rec, &d, true);
    let _ = std::fs::remove_dir_all(&d);
}

/// A pipe is read into memory: under the memory budget, named in its one-line error.
#[test]
fn a_pipe_larger_than_the_memory_budget_is_refused_naming_it_and_the_flag() {
    let d = scratch("budget");
    let rec = d.join("big.rec");
    let mut w = gpufrag::record::Writer::create(&rec).expect("record");
    for i in 0..60_000u64 {
        w.write(&Event { addr: 0x7f00_0000_0000 + (i << 21), size: 2 << 20, ..Event::new(EventKind::MemAlloc, 1, 0) }).expect("write");
    }
    w.finish_at(1).expect("finish");
    let size = std::fs::metadata(&rec).expect("size").len();
    assert!(size > 4 << 20, "{size}");
    let (out, _) = run(&["analyze", "--max-memory", "2MiB"], &rec, Via::Stdin, &d, None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("INPUT: the ") && err.contains("bytes read from the pipe would hold") && err.contains("--max-memory"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
