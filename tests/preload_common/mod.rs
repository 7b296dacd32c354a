//! What the preload-shim tests share: where the built artifacts are (the shim, the simcuda
//! stand-ins and `simcuda-workload`), a minimal consumer that speaks the shim's protocol (bind a
//! Unix socket, accept, read the hello and its memfd, map the event region, drain its lanes
//! merged by timestamp with the wire crate's `Merge`, and convert a TSC region's ticks to
//! `CLOCK_MONOTONIC` ns with the wire crate's `clock`, and keep the lanes about to be handed out
//! in memory with the wire crate's `Prefault`, as `gpufrag run` does), and a runner that starts
//! the workload under `LD_PRELOAD` against it.
//!
//! The consumer is deliberately independent of `src/consumer/` so that the shim's own tests do
//! not depend on it; it can also stall (never drain, or never accept) and die mid-run, which is
//! what the shim must survive. It is pulled in with `mod preload_common;` by each
//! `tests/preload_*.rs`.
#![allow(dead_code)]

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpufrag_wire::clock::{self, Converter};
use gpufrag_wire::event::{Event, EventKind};
use gpufrag_wire::hello::{Hello, HELLO_BYTES, HELLO_F_TSC};
use gpufrag_wire::lanes::{Lanes, Merge, Prefault, SPARE_LANES};
use std::sync::atomic::AtomicU32;

/// Lanes the consumer keeps populated beyond those handed out (`gpufrag run`'s
/// `SPARE_LANES`; 0: none, the shim's thread populates its own lane, as before issue 15).
static PREFAULT_SPARE: AtomicU32 = AtomicU32::new(SPARE_LANES);

/// Sets the spare lanes of consumers started from now on (benchmarks compare 0 with the default).
pub fn set_prefault_spare(n: u32) {
    PREFAULT_SPARE.store(n, Ordering::Relaxed);
}

pub const MIB: u64 = 1 << 20;

/// The build outputs the tests run.
pub struct Artifacts {
    pub shim: PathBuf,
    pub workload: PathBuf,
    pub libs: PathBuf,
}

/// Finds the artifacts next to this test binary (`target/<profile>/`), building them first
/// (`cargo build -p gpufrag-preload -p simcuda-workload`, a no-op when fresh) so that a plain
/// `cargo test --test preload_routes` runs the current shim.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "--quiet", "-p", "gpufrag-preload", "-p", "simcuda-workload"]);
        if release {
            build.arg("--release");
        }
        build.current_dir(env!("CARGO_MANIFEST_DIR"));
        // Same target directory as this test binary (it may be CARGO_TARGET_DIR elsewhere).
        if let Some(target) = profile_dir.parent() {
            build.env("CARGO_TARGET_DIR", target);
        }
        match build.status() {
            Ok(s) if s.success() => {}
            other => eprintln!("warning: building the shim and the workload: {other:?}; using what is there"),
        }
        let a = Artifacts {
            shim: profile_dir.join("libgpufrag_preload.so"),
            workload: profile_dir.join("simcuda-workload"),
            libs: profile_dir.join("simcuda"),
        };
        for p in [&a.shim, &a.workload, &a.libs.join("libcuda.so.1"), &a.libs.join("libcudart.so.13")] {
            assert!(p.exists(), "{} is missing: run `cargo build --workspace` first", p.display());
        }
        a
    })
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!("gpufrag-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How the consumer behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Accept every connection and drain every ring.
    Drain,
    /// Accept and read the hello, but never drain a ring (it fills and the shim drops).
    NeverDrain,
    /// Bind and listen but never accept (connections wait in the backlog).
    NeverAccept,
}

/// One traced process image as the consumer saw it.
#[derive(Debug)]
pub struct Traced {
    pub hello: Hello,
    pub events: Vec<Event>,
    /// The lanes' own count of pushes that found them full.
    pub dropped: u64,
    /// Slots claimed by the producer (= events pushed successfully).
    pub pushed: u64,
    /// The connection reached EOF (the image exited or exec'd).
    pub eof: bool,
    /// Events popped from the ring (= `events.len()` + `placements.len()` unless a sink took
    /// them).
    pub received: u64,
    /// The shim's placement events (`DeviceUuid`, one per CUDA ordinal before its first recorded
    /// allocation), kept apart from `events` (and from a sink): tests/gpu_placement.rs checks them.
    pub placements: Vec<Event>,
}

impl Traced {
    /// The events without device-totals samples.
    pub fn memory_events(&self) -> Vec<Event> {
        self.events.iter().filter(|e| !matches!(e.kind(), Some(EventKind::DeviceInfo | EventKind::PoolReserved))).copied().collect()
    }
}

/// Takes every event instead of the consumer keeping it (for runs of millions of events).
pub type Sink = Box<dyn FnMut(&Event) + Send>;

struct Conn {
    stream: UnixStream,
    map: *mut libc::c_void,
    len: usize,
    lanes: Lanes,
    merge: Merge,
    /// A region stamped in TSC ticks: its conversion to ns.
    ticks: Option<Converter>,
    /// The lanes brought into memory ahead of the producer's threads, and how many spare.
    prefault: (Prefault, u32),
    traced: Traced,
}

// SAFETY: the mapping is owned by this Conn and only touched by the consumer thread.
unsafe impl Send for Conn {}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: our own mapping of the ring, not used after this.
        unsafe { libc::munmap(self.map, self.len) };
    }
}

impl Conn {
    fn prefault(&mut self) {
        let (p, spare) = &mut self.prefault;
        p.ahead(&self.lanes, *spare);
    }

    fn drain(&mut self, sink: &mut Option<Sink>) -> usize {
        let events = &mut self.traced.events;
        let placements = &mut self.traced.placements;
        let mut conv = self.ticks.map(|c| (c, clock::shared_model()));
        let (n, _) = self.merge.drain(&self.lanes, usize::MAX, false, |mut e| {
            if let Some((c, model)) = &mut conv {
                e.ts_ns = c.convert(model, e.ts_ns);
            }
            if e.kind() == Some(EventKind::DeviceUuid) {
                placements.push(e);
                return true;
            }
            match sink {
                Some(f) => f(&e),
                None => events.push(e),
            }
            true
        });
        self.traced.received += n as u64;
        if let Some((c, _)) = conv {
            self.ticks = Some(c);
        }
        n
    }

    /// Everything left, waiting for nothing.
    fn drain_all(&mut self, sink: &mut Option<Sink>) {
        let events = &mut self.traced.events;
        let placements = &mut self.traced.placements;
        let mut conv = self.ticks.map(|c| (c, clock::shared_model()));
        let n = self.merge.finish(&self.lanes, |mut e| {
            if let Some((c, model)) = &mut conv {
                e.ts_ns = c.convert(model, e.ts_ns);
            }
            if e.kind() == Some(EventKind::DeviceUuid) {
                placements.push(e);
                return true;
            }
            match sink {
                Some(f) => f(&e),
                None => events.push(e),
            }
            true
        });
        self.traced.received += n as u64;
        if let Some((c, _)) = conv {
            self.ticks = Some(c);
        }
    }

    fn poll_eof(&mut self) {
        if self.traced.eof {
            return;
        }
        let mut b = [0u8; 16];
        match self.stream.read(&mut b) {
            Ok(0) => self.traced.eof = true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => self.traced.eof = true,
        }
    }

    fn finish(mut self) -> Traced {
        let events = std::mem::take(&mut self.traced.events);
        Traced {
            hello: self.traced.hello,
            events,
            dropped: self.lanes.dropped_count(),
            pushed: self.lanes.pushed_count(),
            eof: self.traced.eof,
            received: self.traced.received,
            placements: std::mem::take(&mut self.traced.placements),
        }
    }
}

/// Reads the 64-byte hello and the memfd attached to it.
fn read_hello(stream: &UnixStream) -> std::io::Result<(Hello, OwnedFd)> {
    let mut buf = [0u8; HELLO_BYTES];
    let mut control = [0u64; 8];
    let mut got = 0usize;
    let mut fd: Option<OwnedFd> = None;
    while got < HELLO_BYTES {
        let mut iov = libc::iovec { iov_base: buf[got..].as_mut_ptr().cast(), iov_len: HELLO_BYTES - got };
        // SAFETY: msghdr is plain data; all zeroes is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: msg describes buffers we own.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "EOF before the hello"));
        }
        got += n as usize;
        // SAFETY: walking the control messages the kernel wrote into our buffer.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let raw = libc::CMSG_DATA(c).cast::<i32>().read_unaligned();
                    fd = Some(OwnedFd::from_raw_fd(raw));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    let hello = Hello::from_bytes(&buf).ok_or_else(|| std::io::Error::other("bad hello magic"))?;
    let fd = fd.ok_or_else(|| std::io::Error::other("hello without a memfd"))?;
    Ok((hello, fd))
}

fn open_conn(stream: UnixStream) -> std::io::Result<Conn> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let (hello, fd) = read_hello(&stream)?;
    let len = hello.ring_bytes as usize;
    // SAFETY: mapping the memfd the producer sized to `len` bytes.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    if map == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh mapping of `len` bytes, page-aligned, unmapped only by Conn::drop.
    let lanes = match unsafe { Lanes::attach(map.cast(), len) } {
        Ok(l) => l,
        Err(e) => {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(map, len) };
            return Err(std::io::Error::other(e.to_string()));
        }
    };
    stream.set_nonblocking(true)?;
    let merge = Merge::new(lanes.count());
    let ticks = (hello.flags & HELLO_F_TSC != 0).then(Converter::new);
    let mut c = Conn {
        stream,
        map,
        len,
        lanes,
        merge,
        ticks,
        prefault: (Prefault::new(), PREFAULT_SPARE.load(Ordering::Relaxed)),
        traced: Traced { hello, events: Vec::new(), dropped: 0, pushed: 0, eof: false, received: 0, placements: Vec::new() },
    };
    c.prefault();
    Ok(c)
}

/// A consumer on a Unix socket in its own temp dir, running on a thread.
pub struct Consumer {
    dir: TempDir,
    sock: PathBuf,
    stop: Arc<AtomicBool>,
    kill: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Traced>>>,
    /// Hellos seen so far (for tests that wait for a connection).
    pub connections: Arc<Mutex<Vec<Hello>>>,
}

impl Consumer {
    pub fn start(mode: Mode) -> Consumer {
        Consumer::start_with(mode, None)
    }

    /// A consumer that hands every event to `sink` instead of keeping it.
    pub fn start_with(mode: Mode, sink: Option<Sink>) -> Consumer {
        Consumer::start_polling(mode, sink, None)
    }

    /// As [`Consumer::start_with`], draining in batches every `every` (as a consumer that does
    /// other work would) instead of as fast as events arrive.
    pub fn start_polling(mode: Mode, sink: Option<Sink>, every: Option<Duration>) -> Consumer {
        let dir = TempDir::new("consumer");
        let sock = dir.path().join("gpufrag.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let kill = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (s, k, c) = (Arc::clone(&stop), Arc::clone(&kill), Arc::clone(&connections));
        let thread = std::thread::spawn(move || serve(listener, mode, sink, every, &s, &k, &c));
        Consumer { dir, sock, stop, kill, thread: Some(thread), connections }
    }

    pub fn sock(&self) -> &Path {
        &self.sock
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops after everything traced has ended and every ring is drained; returns what it saw,
    /// in connection order.
    pub fn finish(mut self) -> Vec<Traced> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().map(|t| t.join().expect("consumer thread")).unwrap_or_default()
    }

    /// Dies now: the listener, every connection and every ring mapping are closed, as when the
    /// consumer process is killed.
    pub fn kill(&mut self) {
        self.kill.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    /// Waits until `n` processes have connected (or the timeout passes).
    pub fn wait_for_connections(&self, n: usize, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.connections.lock().map(|c| c.len() >= n).unwrap_or(false) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.kill.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    listener: UnixListener,
    mode: Mode,
    mut sink: Option<Sink>,
    every: Option<Duration>,
    stop: &AtomicBool,
    kill: &AtomicBool,
    seen: &Mutex<Vec<Hello>>,
) -> Vec<Traced> {
    let mut conns: Vec<Conn> = Vec::new();
    let mut stop_at: Option<Instant> = None;
    loop {
        if kill.load(Ordering::Acquire) {
            return Vec::new(); // everything dropped: sockets closed, rings unmapped
        }
        let stopping = stop.load(Ordering::Acquire);
        let mut busy = false;
        if mode != Mode::NeverAccept {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        busy = true;
                        match open_conn(stream) {
                            Ok(c) => {
                                if let Ok(mut s) = seen.lock() {
                                    s.push(c.traced.hello);
                                }
                                conns.push(c);
                            }
                            Err(e) => eprintln!("consumer: bad connection: {e}"),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        eprintln!("consumer: accept: {e}");
                        break;
                    }
                }
            }
        }
        for c in &mut conns {
            if mode == Mode::Drain {
                c.prefault();
                busy |= c.drain(&mut sink) > 0;
            }
            c.poll_eof();
        }
        if stopping {
            let t0 = *stop_at.get_or_insert_with(Instant::now);
            let all_eof = conns.iter().all(|c| c.traced.eof);
            if (all_eof && !busy) || t0.elapsed() > Duration::from_secs(20) || mode == Mode::NeverAccept {
                for c in &mut conns {
                    if mode == Mode::Drain {
                        c.drain_all(&mut sink);
                    }
                }
                return conns.into_iter().map(Conn::finish).collect();
            }
        }
        match every {
            Some(d) => std::thread::sleep(d),
            None if !busy => std::thread::sleep(Duration::from_micros(200)),
            None => {}
        }
    }
}

/// A workload run under the shim.
pub struct Run {
    pub output: Output,
    pub traced: Vec<Traced>,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// The one traced process (panics unless exactly one connected).
    pub fn only(&self) -> &Traced {
        assert_eq!(self.traced.len(), 1, "expected one traced process, got {:#?}", self.hellos());
        &self.traced[0]
    }

    pub fn hellos(&self) -> Vec<Hello> {
        self.traced.iter().map(|t| t.hello).collect()
    }
}

/// A command for `simcuda-workload ARGS` with the stand-ins on the library path, a private
/// simcuda state dir (tests run in parallel), and the shim preloaded when `shim` is set.
pub fn workload(args: &[&str], state_dir: &Path, shim: bool) -> Command {
    let a = artifacts();
    let mut cmd = Command::new(&a.workload);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &a.libs)
        .env("SIMCUDA_STATE_DIR", state_dir)
        .env_remove("GPUFRAG_SOCK")
        .env_remove("GPUFRAG_RING_CAPACITY")
        .env_remove("GPUFRAG_RING_LANES")
        .env_remove("GPUFRAG_NO_FOLLOW")
        .env_remove("GPUFRAG_CONSUMER_PID")
        .env_remove("GPUFRAG_SAMPLE_MS")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null());
    if shim {
        cmd.env("LD_PRELOAD", &a.shim);
    }
    cmd
}

/// Runs `simcuda-workload ARGS` under the shim against a draining consumer; `env` adds variables
/// (periodic sampling is off unless `env` sets `GPUFRAG_SAMPLE_MS`).
pub fn traced_run(args: &[&str], env: &[(&str, &str)]) -> Run {
    traced_run_with(args, env, None)
}

/// As [`traced_run`], every event handed to `sink` instead of kept.
pub fn traced_run_with(args: &[&str], env: &[(&str, &str)], sink: Option<Sink>) -> Run {
    let consumer = Consumer::start_with(Mode::Drain, sink);
    let mut cmd = workload(args, consumer.dir(), true);
    cmd.env("GPUFRAG_SOCK", consumer.sock()).env("GPUFRAG_SAMPLE_MS", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().expect("run the workload");
    let traced = consumer.finish();
    Run { output, traced }
}

/// Runs `simcuda-workload ARGS` with no shim at all: the reference output.
pub fn bare_run(args: &[&str]) -> Output {
    let dir = TempDir::new("bare");
    workload(args, dir.path(), false).output().expect("run the workload")
}

/// `key=value` fields of the workload's lines that start with `tag`.
pub fn lines_with(stdout: &str, tag: &str) -> Vec<Vec<(String, String)>> {
    stdout
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(tag))
        .map(|l| l.split_whitespace().skip(1).filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect())
        .collect()
}

/// One field of a parsed line.
pub fn field<'a>(line: &'a [(String, String)], key: &str) -> &'a str {
    line.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// A hex address as the workload prints it.
pub fn addr(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("bad address {s}"))
}

/// A compact view of an event for assertions: (kind, addr, size).
pub fn brief(e: &Event) -> (EventKind, u64, u64) {
    (e.kind().expect("known kind"), e.addr, e.size)
}

/// The workload's output with process ids blanked (`pid=…`, `child_pid=…` differ run to run).
pub fn normalized(stdout: &[u8]) -> String {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| {
            l.split(' ')
                .map(|w| match w.split_once('=') {
                    Some((k, _)) if k.ends_with("pid") => format!("{k}=*"),
                    _ => w.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A numeric field of a parsed line.
pub fn num(line: &[(String, String)], key: &str) -> u64 {
    let v = field(line, key);
    v.parse().unwrap_or_else(|_| panic!("{key}={v} is not a number"))
}
