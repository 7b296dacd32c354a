//! The live feed: what `gpufrag top` reads from a running `gpufrag run` (and, later, from the
//! eBPF `agent`): newline-delimited JSON [`Frame`]s on a Unix socket.
//!
//! Protocol (version [`FEED_VERSION`]): the server writes one frame per line, about every 500 ms
//! while the traced command runs, and a last one with `"final": true` before it closes. A client
//! sends nothing. A frame is the [`Summary`] schema of `analyze --json` (devices, processes, OOMs
//! with verdicts, dropped events, `exact`) plus `strips`: for each process and device its segments
//! in address order with [`STRIP_CELLS`](super::strip::STRIP_CELLS) digits of live share each and
//! the largest free run (see [`ProcessStrip`]). Fields are added, never renamed.
//!
//! Where: `--feed SOCK`, or by default `$XDG_RUNTIME_DIR/gpufrag/run-PID.sock` (falling back to
//! `/tmp/gpufrag-UID/run-PID.sock`) in a directory of mode 0700 owned by the user; the socket is
//! 0600 and the server also checks each client's uid (SO_PEERCRED). `gpufrag top` with no argument
//! connects to the newest socket there that answers.
//!
//! The server never blocks the capture: frames are built on the observer's tick only while a
//! client is connected, and each client has its own writer thread behind a channel of two frames;
//! a client that cannot keep up misses frames (counted), it never slows the run. At most
//! [`MAX_CLIENTS`] clients are served at once (each costs a thread); further connections are
//! closed at once. A client's writes time out after [`WRITE_TIMEOUT`], so a client that stops
//! reading is dropped.
//!
//! Nothing that is not the server's own socket is ever removed: at bind an existing path is
//! replaced only when it is a socket nobody answers on (a run that was killed), anything else is
//! an error; at the end the path is removed only while it is still the socket bound here (same
//! device and inode).
//!
//! The client ([`connect`]) reads lines of at most [`MAX_LINE`] bytes: a longer one ends the
//! feed with an error instead of growing a buffer without bound.

use super::strip::{process_strip, ProcessStrip};
use crate::analysis::summary::Summary;
use crate::ingest::State;
use crate::observe::Observer;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Version of the feed protocol.
pub const FEED_VERSION: u32 = 1;

/// The most clients served at once.
pub const MAX_CLIENTS: usize = 32;

/// How long a write to a client may block its writer thread before the client is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest feed line a client accepts (a frame of thousands of processes is a few MB).
pub const MAX_LINE: usize = 64 << 20;

/// One line of the feed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Frame {
    /// [`FEED_VERSION`].
    pub feed: u32,
    /// Frame number, from 1.
    pub seq: u64,
    /// When it was built, ns since the Unix epoch.
    pub ts_ns: u64,
    /// The server's pid.
    pub server_pid: u32,
    /// The last frame of this feed.
    #[serde(rename = "final")]
    pub last: bool,
    /// The figures (the schema of `analyze --json`).
    pub summary: Summary,
    /// Per process and device: the segments as strips.
    pub strips: Vec<ProcessStrip>,
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Builds a frame from a state.
pub fn frame(state: &State, source: &str, seq: u64, last: bool) -> Frame {
    let mut summary = Summary::from_state(state, source);
    summary.identify(state);
    let strips = state.spaces.values().map(process_strip).collect();
    Frame { feed: FEED_VERSION, seq, ts_ns: now_ns(), server_pid: std::process::id(), last, summary, strips }
}

/// The directory feeds live in: `$XDG_RUNTIME_DIR/gpufrag`, else `/tmp/gpufrag-UID`.
pub fn feed_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("gpufrag"),
        // SAFETY: getuid cannot fail and touches no memory.
        None => PathBuf::from(format!("/tmp/gpufrag-{}", unsafe { libc::getuid() })),
    }
}

/// The default socket of this process.
pub fn default_socket() -> PathBuf {
    feed_dir().join(format!("run-{}.sock", std::process::id()))
}

/// Creates `dir` with mode 0700, or checks that an existing one is ours and private
/// (src/private.rs).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    crate::private::PrivateDir::ensure(dir).map(drop).map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()))
}

/// Whether a feed server of `uid` may be trusted by this process: its own uid, or root.
fn trusted_server(uid: u32) -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    uid == me || uid == 0
}

fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills one ucred we own, of the length we pass.
    let r =
        unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

struct Client {
    tx: SyncSender<Arc<str>>,
    writer: JoinHandle<()>,
}

/// The feed server: an [`Observer`] that serves frames to `top`.
pub struct FeedServer {
    path: PathBuf,
    /// (device, inode) of the socket bound at `path`: only that is ever removed.
    bound: Option<(u64, u64)>,
    source: String,
    clients: Arc<Mutex<Vec<Client>>>,
    stop: Arc<AtomicBool>,
    seq: u64,
    /// Frames a slow client missed.
    pub missed: Arc<AtomicU64>,
}

impl FeedServer {
    /// Binds `path` (its directory made private when it is the default one) and starts accepting.
    pub fn bind(path: &Path, source: &str) -> std::io::Result<FeedServer> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if dir == feed_dir() {
                private_dir(dir)?;
            }
        }
        // A socket left by a run that was killed: remove it only when it is a socket and nothing
        // answers there. Anything else at the path is the user's and stays.
        if let Ok(md) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !md.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "the path exists and is not a socket; it is left as it is",
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another feed is served on this socket"));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let bound = std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()));
        let clients: Arc<Mutex<Vec<Client>>> = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, s2) = (clients.clone(), stop.clone());
        std::thread::Builder::new().name("gpufrag-feed".into()).spawn(move || accept_loop(listener, c2, s2))?;
        Ok(FeedServer {
            path: path.to_path_buf(),
            bound,
            source: source.to_string(),
            clients,
            stop,
            seq: 0,
            missed: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Removes the socket, if the path still names the one bound here.
    fn remove_own_socket(&mut self) {
        let here = std::fs::symlink_metadata(&self.path).ok().map(|m| (m.dev(), m.ino()));
        if here.is_some() && here == self.bound.take() {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&mut self, state: &State, last: bool) {
        let mut clients = match self.clients.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if clients.is_empty() {
            return;
        }
        self.seq += 1;
        let f = frame(state, &self.source, self.seq, last);
        let Ok(mut line) = serde_json::to_string(&f) else { return };
        line.push('\n');
        let line: Arc<str> = line.into();
        clients.retain(|c| match c.tx.try_send(line.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.missed.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        });
    }
}

fn accept_loop(listener: UnixListener, clients: Arc<Mutex<Vec<Client>>>, stop: Arc<AtomicBool>) {
    // SAFETY: getuid cannot fail and touches no memory.
    let me = unsafe { libc::getuid() };
    for conn in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(stream) = conn else { continue };
        // Only this user (or root) may read the feed.
        if peer_uid(&stream).map_or(true, |u| u != me && u != 0) {
            continue;
        }
        // Bounded: clients whose writer ended (disconnected, timed out) leave first.
        let served = match clients.lock() {
            Ok(mut c) => {
                c.retain(|c| !c.writer.is_finished());
                c.len()
            }
            Err(_) => MAX_CLIENTS,
        };
        if served >= MAX_CLIENTS {
            continue; // dropped: the connection closes
        }
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        let (tx, rx) = sync_channel::<Arc<str>>(2);
        let Ok(writer) = std::thread::Builder::new().name("gpufrag-feed-client".into()).spawn(move || {
            let mut w = std::io::BufWriter::new(stream);
            for line in rx {
                if w.write_all(line.as_bytes()).and_then(|_| w.flush()).is_err() {
                    break;
                }
            }
        }) else {
            continue;
        };
        if let Ok(mut c) = clients.lock() {
            c.push(Client { tx, writer });
        }
    }
}

impl Observer for FeedServer {
    fn tick(&mut self, state: &State) {
        self.send(state, false);
    }

    fn finish(&mut self, state: &State) {
        self.send(state, true);
        self.stop.store(true, Ordering::Relaxed);
        self.remove_own_socket();
        let clients: Vec<Client> = match self.clients.lock() {
            Ok(mut c) => c.drain(..).collect(),
            Err(p) => p.into_inner().drain(..).collect(),
        };
        // Let the writers deliver the final frame (at most a second), then go on.
        let deadline = Instant::now() + Duration::from_secs(1);
        let writers: Vec<JoinHandle<()>> = clients.into_iter().map(|c| c.writer).collect();
        while Instant::now() < deadline && writers.iter().any(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FeedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.remove_own_socket();
    }
}

/// What a feed client receives.
#[derive(Debug)]
pub enum Update {
    /// A new frame.
    Frame(Box<Frame>),
    /// The feed ended (the reason, for the user).
    Ended(String),
}

/// Connects to a feed and reads it on a thread; updates arrive on the receiver.
pub fn connect(path: &Path) -> std::io::Result<Receiver<Update>> {
    let stream = UnixStream::connect(path)?;
    // The server must be this user (or root): another user's socket could feed forged frames.
    let uid = peer_uid(&stream)?;
    if !trusted_server(uid) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{}: refused, the feed is served by uid {uid}, not by you or root", path.display()),
        ));
    }
    let (tx, rx) = sync_channel(16);
    let name = path.display().to_string();
    std::thread::Builder::new().name("gpufrag-feed-reader".into()).spawn(move || {
        read_feed(BufReader::new(stream), &name, |u| tx.send(u).is_ok());
    })?;
    Ok(rx)
}

/// Reads feed lines from `reader` until it ends, handing each frame and then the reason it
/// ended to `on` (which returns `false` to stop). Lines are bounded by [`MAX_LINE`].
pub fn read_feed(mut reader: impl BufRead, name: &str, mut on: impl FnMut(Update) -> bool) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if buf.capacity() > 1 << 20 {
            buf = Vec::new(); // a large frame's buffer is not kept for the small ones
        }
        match std::io::Read::take(&mut reader, MAX_LINE as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) if buf.last() == Some(&b'\n') => {}
            Ok(_) if buf.len() > MAX_LINE => {
                on(Update::Ended(format!("{name}: a feed line longer than {MAX_LINE} bytes; not a gpufrag feed")));
                return;
            }
            Ok(_) => break, // closed mid-line
            Err(e) => {
                on(Update::Ended(format!("{name}: {e}")));
                return;
            }
        }
        match serde_json::from_slice::<Frame>(&buf) {
            Ok(f) => {
                let last = f.last;
                if !on(Update::Frame(Box::new(f))) {
                    return;
                }
                if last {
                    on(Update::Ended("the traced command ended".into()));
                    return;
                }
            }
            Err(e) => {
                on(Update::Ended(format!("{name}: not a gpufrag feed line: {e}")));
                return;
            }
        }
    }
    on(Update::Ended("the feed closed".into()));
}

/// The sockets in the feed directory that answer, newest first: only when the folder is the
/// user's own (owner and mode checked, src/private.rs) and only those served by this user or
/// root (SO_PEERCRED). `Err` says why the folder itself is refused.
pub fn live_sockets() -> Result<Vec<PathBuf>, crate::private::Refused> {
    let dir = feed_dir();
    if !dir.exists() {
        return Ok(Vec::new());
    }
    crate::private::PrivateDir::existing(&dir)?;
    let Ok(rd) = std::fs::read_dir(&dir) else { return Ok(Vec::new()) };
    let mut socks: Vec<(std::time::SystemTime, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    socks.sort_by_key(|s| std::cmp::Reverse(s.0));
    Ok(socks.into_iter().map(|s| s.1).filter(|p| UnixStream::connect(p).is_ok_and(|c| peer_uid(&c).is_ok_and(trusted_server))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventKind};

    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpufrag-feed-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test setup");
        dir
    }

    fn threads() -> usize {
        std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
    }

    /// Issue 14: `gpufrag run --feed EXISTING_FILE` deleted that file and exited 0.
    #[test]
    fn regression_feed_never_removes_what_is_not_its_own_socket() {
        let dir = test_dir("keep");
        let file = dir.join("notes.txt");
        std::fs::write(&file, "the user's").expect("test setup");
        let e = FeedServer::bind(&file, "test").err().expect("a regular file is refused");
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).expect("kept"), "the user's");
        // A socket replaced under the server by the user's file survives the server's end.
        let sock = dir.join("s.sock");
        let mut server = FeedServer::bind(&sock, "test").expect("bind");
        std::fs::remove_file(&sock).expect("test setup");
        std::fs::write(&sock, "mine now").expect("test setup");
        server.finish(&State::default());
        drop(server);
        assert_eq!(std::fs::read_to_string(&sock).expect("kept"), "mine now");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 14: 2,000 idle feed clients took 2,000 threads.
    #[test]
    fn regression_feed_server_bounds_its_clients() {
        let dir = test_dir("clients");
        let sock = dir.join("c.sock");
        let server = FeedServer::bind(&sock, "test").expect("bind");
        let before = threads();
        let idle: Vec<UnixStream> = (0..300).filter_map(|_| UnixStream::connect(&sock).ok()).collect();
        assert_eq!(idle.len(), 300);
        // Let the accept thread see them all.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            let served = server.clients.lock().expect("lock").len();
            if served >= MAX_CLIENTS {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let served = server.clients.lock().expect("lock").len();
        let grown = threads().saturating_sub(before);
        assert_eq!(served, MAX_CLIENTS, "clients served of 300 connected");
        assert!(grown <= MAX_CLIENTS + 2, "{grown} threads for 300 idle clients");
        drop(idle);
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 14: `top` read its feed without a line-length limit (a feed that never sends a
    /// newline grew it to 8.8 GB in 8 s).
    #[test]
    fn regression_feed_reader_bounds_its_line_length() {
        let dir = test_dir("line");
        let sock = dir.join("l.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        let writer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..(MAX_LINE >> 20) + 4 {
                if s.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        let rx = connect(&sock).expect("connect");
        match rx.recv_timeout(Duration::from_secs(30)).expect("an update") {
            Update::Ended(why) => assert!(why.contains("longer than"), "{why}"),
            Update::Frame(_) => panic!("no frame in a line of x"),
        }
        let _ = writer.join();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_client_gets_frames_and_the_final_one() {
        let dir = std::env::temp_dir().join(format!("gpufrag-feed-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test setup");
        let sock = dir.join("t.sock");
        let mut server = FeedServer::bind(&sock, "test").expect("test setup");
        let rx = connect(&sock).expect("test setup");
        let mut state = State::default();
        let mut e = Event::new(EventKind::MemAlloc, 9, 0);
        e.addr = 1 << 40;
        e.size = 1 << 30;
        state.apply(&e);
        // The accept thread registers the client asynchronously.
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.clients.lock().expect("test setup").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        server.tick(&state);
        server.finish(&state);
        let mut frames = Vec::new();
        while let Ok(u) = rx.recv_timeout(Duration::from_secs(5)) {
            match u {
                Update::Frame(f) => frames.push(f),
                Update::Ended(_) => break,
            }
        }
        assert_eq!(frames.len(), 2);
        assert!(frames[1].last);
        assert_eq!(frames[0].summary.devices[0].map.reserved, 1 << 30);
        assert_eq!(frames[0].strips[0].segments[0].cells, "8".repeat(crate::views::strip::STRIP_CELLS));
        assert!(!sock.exists(), "the socket is removed at the end");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
