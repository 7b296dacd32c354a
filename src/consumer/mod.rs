//! The consumer side of live capture: a private Unix socket that traced processes connect to,
//! the shared-memory rings they hand over, and one bounded channel that carries what they say to
//! whoever owns the [`State`](crate::ingest::State).
//!
//! Threads: an acceptor (checks each peer's uid, reads its hello, maps its event region or starts
//! a reader for a Python hook), a prefaulter (keeps each region's next lane in memory before a
//! thread of the process is given it, see [`conn::LanePrefaulter`]) and a drainer (empties every
//! region into the channel, its lanes merged by timestamp, turns lane drop counts into `Dropped`
//! events and a closed socket into `ProcessExit`). A slow owner blocks only the drainer; the
//! traced processes then drop and count, never wait. Python messages are forwarded only after a full drain pass, so a snapshot
//! never overtakes the driver events that preceded it.
//!
//! The socket lives in a private folder (`gpufrag-PID-XXXXXXXX` in `XDG_RUNTIME_DIR`, else the
//! temporary folder), removed on every exit path; a run killed before it could leaves it behind,
//! and the next consumer to start removes such folders of the same user whose owner is gone
//! ([`remove_stale_dirs`]).

pub mod blocks;
pub mod callers;
mod conn;
/// The Python hook's framing, for the fuzz target of fuzz/.
pub use conn::python_reader;

use crate::event::{Event, EventKind, F_SRC_SHIM};
use crate::hello::{SOURCE_PYTHON, SOURCE_SHIM};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::VecDeque;
use std::io;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::source::{now_ns, Msg};
pub use conn::{
    RingConn, PY_ARMED, PY_ARMED_BYTES, PY_BLOCKS_SOURCE, PY_EVENTS, PY_FRACTION, PY_FRACTION_BYTES, PY_FRAMEWORK, PY_FRAMEWORK_OOM,
    PY_HEADER_BYTES, PY_MAGIC, PY_OOM, PY_OOM_ALLOWED, PY_OOM_ALLOWED_BYTES, PY_OOM_BYTES, PY_SETTINGS, PY_SNAPSHOT, PY_STATS,
};

struct Shared {
    stop: AtomicBool,
    rings: Mutex<Vec<RingConn>>,
    pending: Mutex<VecDeque<Msg>>,
    connections: AtomicU64,
    open: AtomicU64,
    /// The traced processes' code mappings, read at their hello and on a miss (see `callers`).
    callers: Mutex<callers::Callers>,
}

/// A running consumer.
pub struct Consumer {
    dir: PathBuf,
    sock: PathBuf,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    rx: Receiver<Msg>,
}

/// Makes a fresh directory only the owner can enter (src/private.rs: created 0700 by this call,
/// checked by its descriptor, in a base whose folders no other user may change).
fn private_dir() -> io::Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_dir()).unwrap_or_else(std::env::temp_dir);
    remove_stale_dirs(&base);
    crate::private::PrivateDir::fresh(&base, "gpufrag")
        .map(|d| d.path().to_path_buf())
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))
}

/// Whether `name` is a consumer folder's (`gpufrag-PID-XXXXXXXX`, as `PrivateDir::fresh` names
/// them); its owner's pid.
fn consumer_dir_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("gpufrag-")?;
    let (pid, tag) = rest.split_once('-')?;
    let whole = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && tag.len() == 8 && tag.bytes().all(|b| b.is_ascii_hexdigit());
    whole.then(|| pid.parse().ok()).flatten()
}

/// Removes the consumer folders in `base` left by runs that were killed before they could
/// (`kill -9`, a crash): a folder of ours (`gpufrag-PID-XXXXXXXX`, a real directory owned by
/// this user) whose owner is gone, that is whose pid is no live process and whose socket
/// accepts no connection (a consumer in another pid namespace that shares the folder still
/// answers on its socket). Anything else, another user's folders first, is left alone; an error
/// only leaves the folder where it was.
pub fn remove_stale_dirs(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else { return };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(consumer_dir_owner) else { continue };
        if pid == std::process::id() {
            continue;
        }
        let path = entry.path();
        // lstat: a symlink is not a folder of ours.
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        if alive {
            continue;
        }
        let sock = path.join("sock");
        if std::fs::symlink_metadata(&sock).is_ok() && std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            continue;
        }
        // std's remove_dir_all never follows a symlink inside the folder.
        let _ = std::fs::remove_dir_all(&path);
    }
}

impl Consumer {
    /// Starts listening; events reach [`Consumer::receiver`] through a channel of `capacity`.
    pub fn start(capacity: usize) -> io::Result<Consumer> {
        use std::os::unix::fs::PermissionsExt;
        let dir = private_dir()?;
        let sock = dir.join("sock");
        let listener = UnixListener::bind(&sock)?;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let (tx, rx) = bounded(capacity);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            rings: Mutex::new(Vec::new()),
            pending: Mutex::new(VecDeque::new()),
            connections: AtomicU64::new(0),
            open: AtomicU64::new(0),
            callers: Mutex::new(callers::Callers::default()),
        });
        let mut threads = Vec::new();
        let (prefault_tx, prefault_rx) = crossbeam_channel::unbounded();
        {
            let shared = Arc::clone(&shared);
            let tx = tx.clone();
            threads.push(
                std::thread::Builder::new().name("gpufrag-accept".into()).spawn(move || accept_loop(listener, shared, tx, prefault_tx))?,
            );
        }
        {
            let shared = Arc::clone(&shared);
            threads.push(std::thread::Builder::new().name("gpufrag-prefault".into()).spawn(move || prefault_loop(shared, prefault_rx))?);
        }
        {
            let shared = Arc::clone(&shared);
            threads.push(std::thread::Builder::new().name("gpufrag-drain".into()).spawn(move || drain_loop(shared, tx))?);
        }
        Ok(Consumer { dir, sock, shared, threads, rx })
    }

    /// The socket traced processes connect to (`GPUFRAG_SOCK`).
    pub fn socket_path(&self) -> &Path {
        &self.sock
    }

    /// The private directory (mode 0700) the socket lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where messages arrive.
    pub fn receiver(&self) -> &Receiver<Msg> {
        &self.rx
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Connections still open (processes still alive).
    pub fn open_connections(&self) -> u64 {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Stops accepting, drains what is left, and ends the threads. Messages already queued stay
    /// readable from the receiver.
    pub fn shutdown(mut self) -> Receiver<Msg> {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        self.rx.clone()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // The directory is this consumer's own (fresh name, mode 0700): all of it goes, the
        // Python hook's copy included, on every exit path.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>, tx: Sender<Msg>, prefault: Sender<conn::LanePrefaulter>) {
    use std::os::fd::AsRawFd;
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                match conn::handshake(stream) {
                    Ok(conn::Accepted::Ring(mut ring)) => {
                        shared.connections.fetch_add(1, Ordering::Relaxed);
                        shared.open.fetch_add(1, Ordering::Relaxed);
                        let hello = ring.hello;
                        let _ = prefault.send(ring.prefaulter());
                        let mut read = crate::attribution::ProcRead::read(std::path::Path::new("/proc"), hello.pid);
                        // The shim's own values, read when it armed: the process may be gone now.
                        if let Some(env) = ring.env.take() {
                            read.environ = Ok(crate::hello::Environ::parse(&env));
                        }
                        let proc = Some(Box::new(read));
                        // Its code mappings now, while it surely runs: a process that allocates
                        // and exits before its events are drained still has its owners named.
                        if let Some(ranges) = callers::read_maps(hello.pid) {
                            if let Ok(mut c) = shared.callers.lock() {
                                c.prime(hello.pid, ranges, now_ns());
                            }
                        }
                        if let Ok(mut rings) = shared.rings.lock() {
                            rings.push(ring);
                        }
                        if let Ok(mut p) = shared.pending.lock() {
                            p.push_back(Msg::Connected { hello, proc });
                        }
                    }
                    Ok(conn::Accepted::Python(hello, stream)) => {
                        let shared = Arc::clone(&shared);
                        let _ = std::thread::Builder::new().name("gpufrag-python".into()).spawn(move || {
                            conn::python_reader(hello, stream, |m| {
                                if let Ok(mut p) = shared.pending.lock() {
                                    p.push_back(m);
                                }
                            })
                        });
                    }
                    Err(e) => {
                        let _ = tx.send(Msg::Warning(format!("refused a connection: {e}")));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Wait for the next connection, accepted the moment it comes (the process is
                // starting, its first events are on their way), or for the next stop check.
                let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one pollfd we own, a bounded timeout.
                unsafe { libc::poll(&mut p, 1, POLL_MS as libc::c_int) };
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// How often the acceptor and the prefaulter look at stop requests, and the prefaulter at lanes
/// handed out, at most (milliseconds).
const POLL_MS: u64 = 5;

/// Keeps each region's next lane in memory ([`conn::LanePrefaulter`]): its own thread, so that
/// neither accepting nor draining waits while a lane of 64 Ki events (5.5 MiB) is cleared.
fn prefault_loop(shared: Arc<Shared>, new: Receiver<conn::LanePrefaulter>) {
    let mut regions: Vec<conn::LanePrefaulter> = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        match new.recv_timeout(Duration::from_millis(POLL_MS)) {
            // Lane 0 at once: the process's first thread is about to need it.
            Ok(mut r) => {
                if r.run() {
                    regions.push(r);
                }
                // In a burst of new processes, the regions of those that exited are let go at
                // every turn, not only when the burst pauses (the prefaulter holds them weakly,
                // so this only drops their entries).
                regions.retain(|r| !r.gone());
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => regions.retain_mut(conn::LanePrefaulter::run),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Events drained from one process per pass before moving to the next.
const BATCH: usize = 4096;

fn drain_loop(shared: Arc<Shared>, tx: Sender<Msg>) {
    // The process's one TSC calibration blocks its first caller for 10 ms: make it now, before
    // any process connects, not at the first drain of a region stamped in ticks (a process
    // bursting events at start-up would fill its lane meanwhile).
    if gpufrag_wire::clock::invariant_tsc() {
        let _ = gpufrag_wire::clock::shared_model();
    }
    let mut idle = 0u32;
    // Driver allocations' owners, named here before they are applied or recorded.
    let resolve = |e: &mut Event| {
        if let Ok(mut c) = shared.callers.lock() {
            c.resolve(e, now_ns());
        }
    };
    loop {
        let stopping = shared.stop.load(Ordering::Acquire);
        let (hellos, pending): (Vec<Msg>, Vec<Msg>) = shared
            .pending
            .lock()
            .map(|mut p| p.drain(..).collect::<Vec<Msg>>())
            .unwrap_or_default()
            .into_iter()
            .partition(|m| matches!(m, Msg::Connected { .. }));
        // A process's hello goes before its events (who it is, and which GPUs it sees, decide
        // where its events are filed).
        for m in hellos {
            if tx.send(m).is_err() {
                return;
            }
        }
        // Events a Python hook made (CuPy's chunks) up to its first other message go in between
        // the rings' events by timestamp (one clock): a chunk handed out before a failed driver
        // call is applied before it. From its first other message on, everything follows the
        // rings in the order sent, as before.
        let mut pending = pending;
        let first_other = pending.iter().position(|m| !matches!(m, Msg::Event(_))).unwrap_or(pending.len());
        let mut py_events: std::collections::VecDeque<Event> =
            pending.drain(..first_other).filter_map(|m| if let Msg::Event(e) = m { Some(e) } else { None }).collect();
        let had_python = !py_events.is_empty();
        let mut moved = 0usize;
        let mut closed = Vec::new();
        if let Ok(mut rings) = shared.rings.lock() {
            for (i, c) in rings.iter_mut().enumerate() {
                // With Python messages waiting, empty the rings completely first.
                let flush = !pending.is_empty() || had_python || stopping;
                let limit = if flush { usize::MAX } else { BATCH };
                // The lanes merged by timestamp, so one thread's free never overtakes another
                // thread's allocation of the same memory.
                let (n, open) = c.drain(limit, flush, |mut e| {
                    resolve(&mut e);
                    while py_events.front().is_some_and(|p| p.ts_ns <= e.ts_ns) {
                        if let Some(p) = py_events.pop_front() {
                            let _ = tx.send(Msg::Event(p));
                        }
                    }
                    tx.send(Msg::Event(e)).is_ok()
                });
                if !open {
                    return;
                }
                moved += n;
                let dropped = c.dropped_count();
                if dropped > c.dropped_seen {
                    let e = Event { size: dropped - c.dropped_seen, flags: F_SRC_SHIM, ..Event::new(EventKind::Dropped, c.hello.pid, -1) };
                    c.dropped_seen = dropped;
                    let _ = tx.send(Msg::Event(e));
                }
                if n < limit && (c.peer_closed() || stopping) {
                    closed.push(i);
                }
            }
            for i in closed.into_iter().rev() {
                let mut c = rings.remove(i);
                c.finish(|mut e| {
                    resolve(&mut e);
                    tx.send(Msg::Event(e)).is_ok()
                });
                let dropped = c.dropped_count();
                if dropped > c.dropped_seen {
                    let e = Event { size: dropped - c.dropped_seen, flags: F_SRC_SHIM, ..Event::new(EventKind::Dropped, c.hello.pid, -1) };
                    let _ = tx.send(Msg::Event(e));
                }
                let mut exit = Event { ts_ns: now_ns(), flags: F_SRC_SHIM, ..Event::new(EventKind::ProcessExit, c.hello.pid, -1) };
                resolve(&mut exit);
                let _ = tx.send(Msg::Event(exit));
                shared.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
        for m in py_events.into_iter().map(Msg::Event).chain(pending) {
            if tx.send(m).is_err() {
                return;
            }
        }
        if stopping && shared.rings.lock().map_or(true, |r| r.is_empty()) {
            let rest: Vec<Msg> = shared.pending.lock().map(|mut p| p.drain(..).collect()).unwrap_or_default();
            for m in rest {
                let _ = tx.send(m);
            }
            return;
        }
        if moved == 0 {
            idle = (idle + 1).min(5);
            std::thread::sleep(Duration::from_millis(u64::from(idle)));
        } else {
            idle = 0;
        }
    }
}

#[allow(dead_code)]
const _SOURCES: (u32, u32) = (SOURCE_SHIM, SOURCE_PYTHON);
