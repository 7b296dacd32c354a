//! The traced program never depends on the consumer: with no consumer configured, a consumer
//! that is gone, one that stops draining, one that never accepts, and one killed mid-run, the
//! workload's own output and exit code are those of a run without the shim, and it finishes.

mod preload_common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use preload_common::*;

/// A workload long enough to kill the consumer in the middle of it, with deterministic output.
const ARGS: [&str; 3] = ["threads", "8", "40000"];

fn assert_same_as_bare(args: &[&str], out: &std::process::Output) {
    let bare = bare_run(args);
    assert_eq!(out.status.code(), bare.status.code(), "exit code");
    assert_eq!(normalized(&out.stdout), normalized(&bare.stdout), "stdout");
    assert_eq!(normalized(&out.stderr), normalized(&bare.stderr), "stderr: the shim must say nothing");
}

/// Runs `args` under the shim with `env`, failing the test if it takes longer than `limit`.
fn run_bounded(args: &[&str], env: &[(&str, &std::ffi::OsStr)], limit: Duration) -> std::process::Output {
    let state = TempDir::new("state");
    let mut cmd = workload(args, state.path(), true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let t0 = Instant::now();
    loop {
        if let Some(_status) = child.try_wait().expect("wait") {
            return child.wait_with_output().expect("output");
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the workload blocked for more than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn no_consumer_configured_is_pure_pass_through() {
    for args in [&["routes"][..], &["vmm"], &["async"], &["basic", "3MiB"], &["small-pages", "300"]] {
        let out = run_bounded(args, &[], Duration::from_secs(120));
        assert_same_as_bare(args, &out);
    }
}

#[test]
fn consumer_gone_is_pure_pass_through() {
    let dir = TempDir::new("gone");
    // A path where nothing listens, and a socket file whose listener has closed.
    let missing = dir.path().join("nobody.sock");
    let dead = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).expect("bind"));
    for sock in [&missing, &dead] {
        let out = run_bounded(&ARGS, &[("GPUFRAG_SOCK", sock.as_os_str())], Duration::from_secs(120));
        assert_same_as_bare(&ARGS, &out);
    }
}

#[test]
fn consumer_that_never_drains() {
    // One lane: the region's 64 slots fill exactly.
    let consumer = Consumer::start(Mode::NeverDrain);
    let out = run_bounded(
        &ARGS,
        &[("GPUFRAG_SOCK", consumer.sock().as_os_str()), ("GPUFRAG_RING_CAPACITY", "64".as_ref()), ("GPUFRAG_RING_LANES", "1".as_ref())],
        Duration::from_secs(120),
    );
    assert_same_as_bare(&ARGS, &out);
    let traced = consumer.finish();
    assert_eq!(traced.len(), 1);
    let t = &traced[0];
    assert_eq!(t.pushed, 64, "the ring filled");
    assert!(t.dropped > 600_000, "everything else was dropped and counted: {}", t.dropped);
    // The default 16 lanes of 4: the lanes the threads use fill, and the rest is counted.
    let consumer = Consumer::start(Mode::NeverDrain);
    let out = run_bounded(
        &ARGS,
        &[("GPUFRAG_SOCK", consumer.sock().as_os_str()), ("GPUFRAG_RING_CAPACITY", "64".as_ref()), ("GPUFRAG_SAMPLE_MS", "0".as_ref())],
        Duration::from_secs(120),
    );
    assert_same_as_bare(&ARGS, &out);
    let t = &consumer.finish()[0];
    assert!(t.pushed >= 4 && t.pushed <= 64, "lanes of 4 filled: {}", t.pushed);
    let events = 2 * 8 * 40_000 + 4; // pairs, first-allocation sample, two cudaMemGetInfo, exit
                                     // Plus the shim's placement events of device 0 (DeviceUuid): one per thread that raced to
                                     // announce it (1..=8, as in preload_clock), each pushed or, when its lane was full already,
                                     // dropped and counted like any other event.
    let placed = (t.pushed + t.dropped).checked_sub(events);
    assert!(
        placed.is_some_and(|p| (1..=8).contains(&p) && p >= t.placements.len() as u64),
        "every event pushed or counted: pushed {} + dropped {} against {events} events and 1..=8 placements ({} seen in the ring)",
        t.pushed,
        t.dropped,
        t.placements.len()
    );
}

#[test]
fn consumer_that_never_accepts() {
    let consumer = Consumer::start(Mode::NeverAccept);
    let out = run_bounded(&ARGS, &[("GPUFRAG_SOCK", consumer.sock().as_os_str())], Duration::from_secs(120));
    assert_same_as_bare(&ARGS, &out);
}

#[test]
fn consumer_killed_mid_run() {
    let mut consumer = Consumer::start(Mode::Drain);
    let state = TempDir::new("state");
    let args = ["threads", "8", "200000"];
    let mut child = workload(&args, state.path(), true)
        .env("GPUFRAG_SOCK", consumer.sock())
        .env("GPUFRAG_RING_CAPACITY", "256")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    assert!(consumer.wait_for_connections(1, Duration::from_secs(30)), "the workload connected");
    std::thread::sleep(Duration::from_millis(50));
    consumer.kill();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "the workload blocked after the consumer died");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stdout = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut stdout).expect("read");
    let bare = bare_run(&args);
    assert_eq!(status.code(), bare.status.code());
    assert_eq!(normalized(stdout.as_bytes()), normalized(&bare.stdout));
}
