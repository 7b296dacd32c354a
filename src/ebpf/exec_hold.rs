//! The first exec of an executable the agent has not looked at is held until its probes are in,
//! so that a process of a new annotated executable (`include/gpufrag_annotate.h`) is traced from
//! its first call rather than from the `/proc` scan that follows its exec event.
//!
//! The mechanism is fanotify's exec permission event: a `FAN_OPEN_EXEC_PERM` mark on every
//! filesystem of the node (each superblock once, from `/proc/self/mountinfo`; filesystems
//! mounted later are marked when the mount table changes, and before any OCI runtime binary —
//! runc, crun — is let run, since a container's rootfs is mounted before its runtime starts).
//! The kernel stops every `execve` (and the dynamic loader's open of the ELF interpreter) in the
//! open of the file until this thread answers. The answer comes from a cache of files already
//! seen (device, inode, change time, size), so a known executable passes at once; a file not
//! seen yet is read for the annotation header's USDT note (the ELF section headers and that one
//! section, never the whole file); an annotated one is handed to the session's thread, which
//! attaches its probes (uprobes belong to the inode, so the new process is covered from its first
//! instruction) and answers. Other execs of the same file wait on the same request.
//!
//! Bounded. A hold that the session has not answered within the timeout is released with a
//! note, and the processes released are declared not exact (a gap, never a false claim).
//! Killing the agent releases whatever it holds: the kernel answers `FAN_ALLOW` for every
//! pending permission event when the fanotify descriptor closes (`fanotify_release`), which
//! `tests/ebpf_node_agent.rs` checks with SIGKILL.
//!
//! An OCI runtime's exec (runc, crun) is let go at once, and its arguments are read as soon as
//! the exec has replaced them (the thread looks every millisecond while one is pending; at the
//! exec itself `/proc/PID/cmdline` is still the caller's): a `create` or `run` names its bundle
//! (`--bundle`, else its working directory), whose `config.json` gives the container's rootfs
//! and annotations ([`crate::attribution::oci`]). The annotations go to the session
//! ([`Request::Container`]) before the container's first exec (from its rootfs, a new
//! filesystem) is held and scanned, so its processes are named from them. A config that is
//! missing, over 4 MiB, malformed, or a runtime gone before its arguments could be read, is a
//! counted note; the container is never held for it.
//!
//! The thread never blocks on the session: it sends requests over a channel and wakes the
//! session's ring poll through an eventfd in the ring's epoll set; replies come back the same way.

use super::procfs::FileId;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Filesystem types that hold no executables or refuse permission events (marking them would
/// fail or only cost); `fuse` is left out so that the agent never waits on a FUSE daemon that
/// is itself held.
const SKIPPED_FS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "bpf",
    "tracefs",
    "debugfs",
    "securityfs",
    "pstore",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "autofs",
    "binfmt_misc",
    "rpc_pipefs",
    "nsfs",
    "efivarfs",
    "selinuxfs",
    "devtmpfs",
    "ramfs",
];

/// The OCI runtimes whose exec makes the thread look for filesystems mounted since (a new
/// container's rootfs) before the runtime runs.
const OCI_RUNTIMES: &[&str] = &["runc", "crun", "youki", "runsc"];

/// The cache's bound: beyond it the oldest half is dropped (a dropped file is only read again).
const CACHE_MAX: usize = 1 << 16;

/// A file as the cache knows it: a file rewritten in place, or a new file on a reused inode,
/// is a new key.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Key {
    id: FileId,
    ctime_ns: i128,
    size: u64,
}

/// What the thread asks of the session.
#[derive(Debug)]
pub enum Request {
    /// Probe the annotated executable `path` (the file `id`) now, then answer `req`; with
    /// `rootfs`, first probe the allocator libraries under that filesystem's library and Python
    /// roots (the first exec from a filesystem mounted after the agent started: a new
    /// container's rootfs, whose first process is held while it is scanned).
    Probe {
        /// The request's number, echoed in the answer.
        req: u64,
        /// The file.
        id: FileId,
        /// A path to it valid in the agent (`/proc/self/fd/N` of the held descriptor when the
        /// file's own path is not reachable).
        path: PathBuf,
        /// The process whose exec is held (who it is can be read now, before it runs).
        pid: u32,
        /// The mount point of the new filesystem to scan first.
        rootfs: Option<PathBuf>,
        /// Whether the executable carries the annotation probes (else it only needs the scan).
        annotated: bool,
    },
    /// A file looked at that needs no probe (the session stops asking the exec tracepoint
    /// about it).
    Looked(FileId),
    /// An OCI runtime is starting container `id`: its config's annotations name its pod.
    Container {
        /// The runtime's container id (the one its cgroup path carries).
        id: String,
        /// Its names, when the annotations name a pod.
        names: Option<crate::attribution::pods::PodNames>,
        /// The config file read.
        file: PathBuf,
    },
    /// The timeout released these processes before the file's probes were in: not exact.
    Released {
        /// The file.
        id: FileId,
        /// The processes that exec'd it.
        pids: Vec<u32>,
        /// For the note.
        path: PathBuf,
    },
}

/// Hold times, per kind of exec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timing {
    /// Execs.
    pub count: u64,
    /// Sum of the holds, ns.
    pub total_ns: u64,
    /// The longest hold, ns.
    pub max_ns: u64,
}

impl Timing {
    fn add(&mut self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// The mean hold in µs.
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.total_ns as f64 / self.count as f64 / 1e3
        }
    }
}

/// What the holds cost and how they ended (the summary's note).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HoldStats {
    /// Execs of a file already in the cache.
    pub repeated: Timing,
    /// First execs of a file needing no probe (read for the note, then let go).
    pub first_plain: Timing,
    /// First execs of annotated executables, held until probed.
    pub first_probed: Timing,
    /// First execs from a filesystem mounted after the start (a new container's rootfs), held
    /// while its library roots were scanned and what they hold probed.
    pub first_rootfs: Timing,
    /// Holds released by the timeout (processes declared not exact).
    pub timeouts: u64,
    /// Execs answered at once because the file could not be examined (its descriptor missing).
    pub unexamined: u64,
    /// Filesystems marked, and those that could not be (with why, the first few).
    pub marked: u64,
    /// Marks refused.
    pub mark_failures: Vec<String>,
    /// Container starts whose runtime config was read (`create`/`run` of runc or crun).
    pub configs: u64,
    /// Of those, configs naming a pod in their annotations.
    pub named: u64,
    /// Container starts whose config could not be read (missing, huge, malformed, the runtime
    /// gone), and why (the first few).
    pub config_failures: u64,
    /// The first few of those.
    pub config_errors: Vec<String>,
    /// Runtime execs whose new arguments were never read (the runtime gone first, or its
    /// arguments unchanged), and the first few.
    pub runtimes_unread: u64,
    /// The first few of those.
    pub runtime_errors: Vec<String>,
    /// Time from a runtime's exec to its config read, ns.
    pub config_read: Timing,
    /// OCI runtime execs seen (each watched for its new arguments, or skipped as a runtime's
    /// own `init` re-executing itself).
    pub runtime_execs: u64,
    /// Of those, skipped as a runtime's `init`.
    pub runtime_inits: u64,
    /// Runtime execs whose arguments were read, by subcommand (`create`, `start`, `state`, ...;
    /// at most [`SUBCOMMANDS_MAX`] names, the rest as `other`).
    pub runtime_subcommands: std::collections::BTreeMap<String, u64>,
}

/// Subcommand names counted apart at most (the rest are `other`).
const SUBCOMMANDS_MAX: usize = 16;

impl HoldStats {
    /// The summary's lines.
    pub fn notes(&self, timeout: Duration) -> Vec<String> {
        let t = |x: &Timing| format!("{} (mean {:.1} µs, max {:.1} µs)", x.count, x.mean_us(), x.max_ns as f64 / 1e3);
        let mut out = vec![format!(
            "exec hold (fanotify FAN_OPEN_EXEC_PERM on {} filesystem(s)): first execs of annotated executables held until probed {}; \
             other first execs {}; repeated execs {}",
            self.marked,
            t(&self.first_probed),
            t(&self.first_plain),
            t(&self.repeated)
        )];
        if self.first_rootfs.count > 0 {
            out.push(format!(
                "exec hold: first execs from a filesystem mounted after the start (a new container's rootfs), held while its library roots were scanned {}",
                t(&self.first_rootfs)
            ));
        }
        if self.timeouts > 0 {
            out.push(format!(
                "exec hold: {} hold(s) released by the {} ms timeout before the probes were in: those processes are not exact",
                self.timeouts,
                timeout.as_millis()
            ));
        }
        if self.unexamined > 0 {
            out.push(format!("exec hold: {} exec(s) let go unexamined (no file descriptor in the event)", self.unexamined));
        }
        if self.configs + self.config_failures > 0 {
            out.push(format!(
                "exec hold: {} container start(s) by an OCI runtime: config.json read for {} (mean {:.1} µs from the runtime's exec, max {:.1} µs), {} naming a pod in its annotations; {} not read",
                self.configs + self.config_failures,
                self.configs,
                self.config_read.mean_us(),
                self.config_read.max_ns as f64 / 1e3,
                self.named,
                self.config_failures
            ));
        }
        if self.runtime_execs > 0 {
            let subs: Vec<String> = self.runtime_subcommands.iter().map(|(k, v)| format!("{k} {v}")).collect();
            out.push(format!(
                "exec hold: {} OCI runtime exec(s) seen: arguments read for {} ({}), {} a runtime's own init re-executing itself, {} not read",
                self.runtime_execs,
                self.runtime_subcommands.values().sum::<u64>(),
                if subs.is_empty() { "none".to_string() } else { subs.join(", ") },
                self.runtime_inits,
                self.runtimes_unread
            ));
        }
        if self.runtimes_unread > 0 {
            out.push(format!(
                "exec hold: {} OCI runtime exec(s) whose arguments were not read (a start among them is named from its environment): {}",
                self.runtimes_unread,
                self.runtime_errors.join("; ")
            ));
        }
        for e in &self.config_errors {
            out.push(format!("exec hold: a container's config was not read: {e}: its processes are named from their environment"));
        }
        for f in &self.mark_failures {
            out.push(format!("exec hold: {f}: execs there are not held (their first process may be seen late)"));
        }
        out
    }
}

/// Settings.
#[derive(Clone, Debug)]
pub struct HoldOptions {
    /// How long an exec is held at most.
    pub timeout: Duration,
    /// Testing: the session never answers for a file whose path contains this (the timeout,
    /// or the agent's death, releases it).
    pub stall: Option<String>,
}

/// The running hold: the session's end of it.
pub struct ExecHold {
    /// Requests from the thread.
    pub requests: mpsc::Receiver<Request>,
    answers: mpsc::Sender<(u64, Result<(), String>)>,
    /// Becomes readable when a request is waiting (in the ring's epoll set).
    pub wake: OwnedFd,
    answer_wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Costs and outcomes so far.
    pub stats: Arc<Mutex<HoldStats>>,
    /// The settings.
    pub opts: HoldOptions,
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn poke(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: an 8-byte write to an eventfd we hold.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

/// Empties an eventfd.
pub fn drain_eventfd(fd: RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: an 8-byte read from a non-blocking eventfd we hold.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// One mount from `/proc/self/mountinfo`: its superblock's key, device, filesystem type, mount
/// point. The key is the device with the filesystem's type, source and super options: an
/// overlay mounted after another was unmounted often gets its device number (and mount id)
/// again, but never its `upperdir`, so a new container's rootfs is a new key.
fn mounts() -> Vec<(String, String, String, PathBuf)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else { continue };
        let (Some(dev), Some(point), Some(fstype)) = (f.get(2), f.get(4), f.get(sep + 1)) else { continue };
        let sb = format!("{dev} {}", f[sep + 1..].join(" "));
        out.push((sb, dev.to_string(), fstype.to_string(), PathBuf::from(unescape(point))));
    }
    out
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Thread {
    fan: OwnedFd,
    requests: mpsc::Sender<Request>,
    answers: mpsc::Receiver<(u64, Result<(), String>)>,
    wake: RawFd,
    answer_wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<HoldStats>>,
    timeout: Duration,
    stall: Option<String>,
    cache: HashSet<Key>,
    cache_order: Vec<Key>,
    /// Superblocks (keys of [`mounts`]) marked or refused, those still mounted.
    marked_devs: HashSet<String>,
    /// Device → superblock key, as of the last reading of the mount table.
    current_sb: HashMap<String, String>,
    /// Devices of execs that the mount table does not list (a mount of another namespace),
    /// until it changes: the table is not read again at each of their execs.
    unlisted: HashSet<String>,
    /// Filesystems whose library roots were scanned (those of the start: by the session's scan).
    scanned_devs: HashSet<String>,
    pending: HashMap<u64, Pending>,
    by_key: HashMap<Key, u64>,
    next_req: u64,
    /// The OCI runtime binaries seen (their later execs are cache hits).
    runtime_keys: HashSet<Key>,
    /// Runtimes let go whose arguments are not read yet.
    runtimes: Vec<Runtime>,
}

/// An OCI runtime exec let go, waiting for its new arguments.
struct Runtime {
    pid: u32,
    /// The runtime's file: the exec is complete once `/proc/PID/exe` is it.
    file: FileId,
    /// `/proc/PID/cmdline` at the exec (the caller's; for the notes and the `init` check).
    before: Vec<u8>,
    /// The caller was the runtime itself (`runc create` starting `runc init` through
    /// `/proc/self/exe`, a vfork child sharing its memory): its exec is complete once its
    /// arguments differ from `before` too.
    caller_is_runtime: bool,
    t0: Instant,
}

/// How long a runtime's new arguments are waited for (an exec completes in microseconds).
const RUNTIME_ARGS_WAIT: Duration = Duration::from_millis(500);
/// Runtimes watched at once at most (each exits or is read within [`RUNTIME_ARGS_WAIT`]).
const RUNTIMES_MAX: usize = 256;

struct Pending {
    key: Key,
    /// Held for a new filesystem's scan.
    rootfs: bool,
    path: PathBuf,
    deadline: Instant,
    /// (event descriptor, pid, when the event was read).
    held: Vec<(OwnedFd, u32, Instant)>,
}

impl ExecHold {
    /// Marks the node's filesystems and starts the thread. An error when fanotify is refused
    /// (no CAP_SYS_ADMIN, a kernel without it).
    pub fn start(opts: HoldOptions) -> std::io::Result<ExecHold> {
        // SAFETY: fanotify_init(2) returns a new descriptor or -1.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_UNLIMITED_QUEUE,
                (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor we own.
        let fan = unsafe { OwnedFd::from_raw_fd(fd) };
        let (req_tx, req_rx) = mpsc::channel();
        let (ans_tx, ans_rx) = mpsc::channel();
        let wake = eventfd()?;
        let answer_wake = Arc::new(eventfd()?);
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(HoldStats::default()));
        let mut t = Thread {
            fan,
            requests: req_tx,
            answers: ans_rx,
            wake: wake.as_raw_fd(),
            answer_wake: answer_wake.clone(),
            stop: stop.clone(),
            stats: stats.clone(),
            timeout: opts.timeout,
            stall: opts.stall.clone(),
            cache: HashSet::new(),
            cache_order: Vec::new(),
            marked_devs: HashSet::new(),
            current_sb: HashMap::new(),
            unlisted: HashSet::new(),
            scanned_devs: HashSet::new(),
            pending: HashMap::new(),
            by_key: HashMap::new(),
            next_req: 1,
            runtime_keys: HashSet::new(),
            runtimes: Vec::new(),
        };
        t.mark_new_filesystems();
        t.scanned_devs = t.marked_devs.clone();
        if t.marked_devs.is_empty() {
            let why = stats.lock().map(|s| s.mark_failures.join("; ")).unwrap_or_default();
            return Err(std::io::Error::other(format!("no filesystem could be marked: {why}")));
        }
        let thread = std::thread::Builder::new().name("gpufrag-exec-hold".into()).spawn(move || t.run())?;
        Ok(ExecHold { requests: req_rx, answers: ans_tx, wake, answer_wake, stop, thread: Some(thread), stats, opts })
    }

    /// Answers request `req`: its held execs go on.
    pub fn answer(&self, req: u64, result: Result<(), String>) {
        let _ = self.answers.send((req, result));
        poke(self.answer_wake.as_raw_fd());
    }

    /// The summary's lines.
    pub fn notes(&self) -> Vec<String> {
        self.stats.lock().map(|s| s.notes(self.opts.timeout)).unwrap_or_default()
    }
}

impl Drop for ExecHold {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        poke(self.answer_wake.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Thread {
    fn stats(&self) -> std::sync::MutexGuard<'_, HoldStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks every filesystem not marked yet.
    fn mark_new_filesystems(&mut self) {
        let all = mounts();
        self.unlisted.clear();
        let now: HashMap<String, String> = all.iter().map(|(sb, dev, _, _)| (dev.clone(), sb.clone())).collect();
        // A device number now another superblock's (an overlay unmounted, another mounted):
        // the files cached under it were the old one's (an overlay's files keep their lower
        // layer's inode numbers, so a new container of the same image would hit them).
        let stale: HashSet<&String> = self.current_sb.iter().filter(|(d, k)| now.get(*d) != Some(*k)).map(|(d, _)| d).collect();
        if !stale.is_empty() {
            let dev_of = |k: &Key| format!("{}:{}", libc::major(k.id.dev), libc::minor(k.id.dev));
            self.cache.retain(|k| !stale.contains(&dev_of(k)));
            let cache = &self.cache;
            self.cache_order.retain(|k| cache.contains(k));
            self.runtime_keys.retain(|k| !stale.contains(&dev_of(k)));
        }
        self.current_sb = now;
        // Unmounted filesystems are forgotten (bounded; a key is never mounted again).
        let present: HashSet<&String> = all.iter().map(|m| &m.0).collect();
        self.marked_devs.retain(|k| present.contains(k));
        self.scanned_devs.retain(|k| present.contains(k));
        for (sb, _, fstype, point) in all {
            if self.marked_devs.contains(&sb) || SKIPPED_FS.contains(&fstype.as_str()) || fstype.starts_with("fuse") {
                continue;
            }
            let Ok(c) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) else { continue };
            // SAFETY: a mark on our fanotify descriptor for a NUL-terminated path.
            let rc = unsafe {
                libc::fanotify_mark(
                    self.fan.as_raw_fd(),
                    libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                    libc::FAN_OPEN_EXEC_PERM,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                )
            };
            // A device refused once is not tried again at each change of the mount table.
            self.marked_devs.insert(sb.clone());
            let mut st = self.stats();
            if rc == 0 {
                st.marked += 1;
            } else if st.mark_failures.len() < 8 {
                st.mark_failures.push(format!("{} ({fstype}) not marked: {}", point.display(), std::io::Error::last_os_error()));
            }
        }
    }

    fn respond(&self, fd: &OwnedFd) {
        let r = libc::fanotify_response { fd: fd.as_raw_fd(), response: libc::FAN_ALLOW };
        // SAFETY: writes one fanotify_response to our fanotify descriptor.
        unsafe { libc::write(self.fan.as_raw_fd(), (&r as *const libc::fanotify_response).cast(), std::mem::size_of_val(&r)) };
    }

    fn remember(&mut self, key: Key) {
        if self.cache.len() >= CACHE_MAX {
            let old: Vec<Key> = self.cache_order.drain(..CACHE_MAX / 2).collect();
            for k in old {
                self.cache.remove(&k);
            }
        }
        if self.cache.insert(key) {
            self.cache_order.push(key);
        }
    }

    fn run(mut self) {
        let mountinfo = std::fs::File::open("/proc/self/mountinfo").ok();
        let mut buf = vec![0u8; 64 * 1024];
        while !self.stop.load(Ordering::Relaxed) {
            let mut fds = vec![
                libc::pollfd { fd: self.fan.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.answer_wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            if let Some(m) = &mountinfo {
                fds.push(libc::pollfd { fd: m.as_raw_fd(), events: libc::POLLPRI, revents: 0 });
            }
            let wait = self.pending.values().map(|p| p.deadline.saturating_duration_since(Instant::now())).min();
            let ms = if self.runtimes.is_empty() { wait.map_or(200, |w| w.as_millis().clamp(1, 200) as i32) } else { 1 };
            // SAFETY: poll(2) over descriptors we hold.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if fds.get(2).is_some_and(|f| f.revents & (libc::POLLPRI | libc::POLLERR) != 0) {
                self.mark_new_filesystems();
            }
            drain_eventfd(self.answer_wake.as_raw_fd());
            self.read_events(&mut buf);
            self.read_runtimes();
            self.take_answers();
            self.expire();
        }
        // Dropping the descriptor answers FAN_ALLOW for whatever is still held.
    }

    fn read_events(&mut self, buf: &mut [u8]) {
        loop {
            // SAFETY: reads fanotify events into our buffer.
            let n = unsafe { libc::read(self.fan.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            let n = n as usize;
            let mut off = 0;
            let size = std::mem::size_of::<libc::fanotify_event_metadata>();
            while off + size <= n {
                // SAFETY: the kernel wrote whole event records; read_unaligned copes with the
                // buffer's alignment.
                let m: libc::fanotify_event_metadata = unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
                let len = (m.event_len as usize).max(size);
                off += len;
                if m.vers != libc::FANOTIFY_METADATA_VERSION || m.fd < 0 {
                    if m.mask & libc::FAN_OPEN_EXEC_PERM != 0 {
                        self.stats().unexamined += 1;
                    }
                    continue;
                }
                // SAFETY: the event's descriptor is ours to close.
                let fd = unsafe { OwnedFd::from_raw_fd(m.fd) };
                if m.mask & libc::FAN_OPEN_EXEC_PERM != 0 {
                    self.on_exec(fd, m.pid.max(0) as u32, Instant::now());
                }
            }
        }
    }

    fn on_exec(&mut self, fd: OwnedFd, pid: u32, t0: Instant) {
        let file = fd.try_clone().map(std::fs::File::from).and_then(|f| f.metadata().map(|m| (f, m)));
        let (file, meta) = match file {
            Ok(fm) => fm,
            Err(_) => {
                self.respond(&fd);
                self.stats().unexamined += 1;
                return;
            }
        };
        let key = Key {
            id: FileId { dev: meta.dev(), ino: meta.ino() },
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            size: meta.size(),
        };
        if self.runtime_keys.contains(&key) {
            self.watch_runtime(pid, key.id, t0);
        }
        if pid == std::process::id() || self.cache.contains(&key) {
            self.respond(&fd);
            self.stats().repeated.add(t0.elapsed());
            return;
        }
        if let Some(req) = self.by_key.get(&key) {
            if let Some(p) = self.pending.get_mut(req) {
                p.held.push((fd, pid, t0));
                return;
            }
        }
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if OCI_RUNTIMES.contains(&name.as_str()) {
            // A container's rootfs is mounted before its runtime runs: mark it now.
            self.mark_new_filesystems();
            if self.runtime_keys.len() < 64 && self.runtime_keys.insert(key) {
                self.watch_runtime(pid, key.id, t0);
            }
        }
        // The first exec from a filesystem mounted since the start: its mount point is scanned.
        let dev = format!("{}:{}", libc::major(meta.dev()), libc::minor(meta.dev()));
        let new_fs = |t: &Thread| match t.current_sb.get(&dev) {
            Some(sb) => !t.scanned_devs.contains(sb),
            None => !t.unlisted.contains(&dev),
        };
        if new_fs(self) {
            // Maybe a new filesystem's first exec: the mount table read again (its device may
            // be an unmounted one's), and a runtime still unread may be the one starting it.
            self.mark_new_filesystems();
            self.read_runtimes();
        }
        let rootfs = match self.current_sb.get(&dev).cloned() {
            Some(sb) if !self.scanned_devs.contains(&sb) => {
                self.scanned_devs.insert(sb.clone());
                mounts().into_iter().find(|m| m.0 == sb).map(|m| m.3)
            }
            Some(_) => None,
            None => {
                self.unlisted.insert(dev.clone());
                None
            }
        };
        let annotated = !super::symbols::annotate_probes_in(file).is_empty();
        if !annotated && rootfs.is_none() {
            self.remember(key);
            self.respond(&fd);
            self.stats().first_plain.add(t0.elapsed());
            let _ = self.requests.send(Request::Looked(key.id));
            return;
        }
        // The file's own path if it is the same file here, else the held descriptor's.
        let usable = super::procfs::file_id(&path).is_ok_and(|i| i == key.id);
        let probe_path = if usable { path.clone() } else { PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())) };
        let req = self.next_req;
        self.next_req += 1;
        let stalled = self.stall.as_deref().is_some_and(|s| path.to_string_lossy().contains(s));
        let scan = rootfs.is_some();
        self.pending.insert(req, Pending { key, rootfs: scan, path, deadline: t0 + self.timeout, held: vec![(fd, pid, t0)] });
        self.by_key.insert(key, req);
        if !stalled {
            let _ = self.requests.send(Request::Probe { req, id: key.id, path: probe_path, pid, rootfs, annotated });
            poke(self.wake);
        }
    }

    fn watch_runtime(&mut self, pid: u32, file: FileId, t0: Instant) {
        self.stats().runtime_execs += 1;
        if self.runtimes.len() >= RUNTIMES_MAX {
            self.stats().config_failures += 1;
            return;
        }
        let before = crate::attribution::oci::read_cmdline(std::path::Path::new("/proc"), pid).unwrap_or_default();
        // A runtime's own `init` re-executing itself starts no container.
        if crate::attribution::oci::split_cmdline(&before).get(1).is_some_and(|a| a == "init") {
            self.stats().runtime_inits += 1;
            return;
        }
        let exe = |pid: u32| super::procfs::file_id(std::path::Path::new(&format!("/proc/{pid}/exe")));
        let caller_is_runtime = exe(pid).is_ok_and(|id| id == file);
        self.runtimes.push(Runtime { pid, file, before, caller_is_runtime, t0 });
    }

    /// Reads the arguments of the runtimes whose exec has completed; a `create` or `run` has
    /// its config read and its annotations sent to the session.
    fn read_runtimes(&mut self) {
        let proc_root = std::path::Path::new("/proc");
        let mut i = 0;
        while i < self.runtimes.len() {
            let r = &self.runtimes[i];
            // The exec is complete once the process's executable is the runtime's (the new
            // image's arguments are then in, or empty for the microseconds before they are):
            // arguments that merely differ from those read at the exec may still be the
            // caller's (measured: 1 create and 3 starts of 10 were read as conmon's and
            // podman's own arguments, and so missed; docs/benchmarks.md).
            let exec_done = super::procfs::file_id(&proc_root.join(r.pid.to_string()).join("exe")).is_ok_and(|id| id == r.file);
            let now = crate::attribution::oci::read_cmdline(proc_root, r.pid);
            let waited = r.t0.elapsed();
            let args = match now {
                Ok(b) if exec_done && !b.is_empty() && (!r.caller_is_runtime || b != r.before) => {
                    crate::attribution::oci::split_cmdline(&b)
                }
                Ok(_) if waited < RUNTIME_ARGS_WAIT => {
                    i += 1;
                    continue;
                }
                other => {
                    // Gone, or never changed (a `state` or `kill` may end this fast): counted.
                    let r = self.runtimes.swap_remove(i);
                    let why = match other {
                        Ok(b) if b.is_empty() => {
                            format!("it exited after {} ms (a zombie) before its arguments were read", waited.as_millis())
                        }
                        Ok(b) => format!(
                            "its arguments stayed {:?} for {} ms",
                            String::from_utf8_lossy(&b[..b.len().min(80)]),
                            waited.as_millis()
                        ),
                        Err(e) => format!(
                            "gone after {} µs ({e}), its arguments {:?} until then",
                            waited.as_micros(),
                            String::from_utf8_lossy(&r.before[..r.before.len().min(80)])
                        ),
                    };
                    let mut st = self.stats();
                    st.runtimes_unread += 1;
                    if st.runtime_errors.len() < 4 {
                        st.runtime_errors.push(format!("pid {}: {why}", r.pid));
                    }
                    continue;
                }
            };
            let r = self.runtimes.swap_remove(i);
            {
                let sub = crate::attribution::oci::subcommand(&args).unwrap_or("(none)");
                let mut st = self.stats();
                let known = st.runtime_subcommands.contains_key(sub) || st.runtime_subcommands.len() < SUBCOMMANDS_MAX;
                *st.runtime_subcommands.entry(if known { sub } else { "other" }.to_string()).or_default() += 1;
            }
            let Some(call) = crate::attribution::oci::parse_args(&args) else { continue };
            match crate::attribution::oci::read_for_runtime(proc_root, r.pid, &call) {
                Ok(config) => {
                    let names = crate::attribution::pods::PodNames::from_annotations(&config.annotations);
                    {
                        let mut st = self.stats();
                        st.configs += 1;
                        st.named += u64::from(names.is_some());
                        st.config_read.add(r.t0.elapsed());
                    }
                    let _ = self.requests.send(Request::Container { id: call.container_id, names, file: config.file });
                    poke(self.wake);
                }
                Err(e) => {
                    let mut st = self.stats();
                    st.config_failures += 1;
                    if st.config_errors.len() < 8 {
                        st.config_errors
                            .push(format!("{} {} of container {} (pid {}): {e}", args[0], call.subcommand, call.container_id, r.pid));
                    }
                }
            }
        }
    }

    fn take_answers(&mut self) {
        while let Ok((req, result)) = self.answers.try_recv() {
            let Some(p) = self.pending.remove(&req) else { continue };
            self.by_key.remove(&p.key);
            if result.is_ok() {
                self.remember(p.key);
            }
            for (fd, _, t0) in &p.held {
                self.respond(fd);
                let mut st = self.stats();
                if p.rootfs {
                    st.first_rootfs.add(t0.elapsed());
                } else {
                    st.first_probed.add(t0.elapsed());
                }
            }
        }
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let due: Vec<u64> = self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(&r, _)| r).collect();
        for req in due {
            let Some(p) = self.pending.remove(&req) else { continue };
            self.by_key.remove(&p.key);
            for (fd, _, _) in &p.held {
                self.respond(fd);
            }
            self.stats().timeouts += p.held.len() as u64;
            let pids = p.held.iter().map(|h| h.1).collect();
            let _ = self.requests.send(Request::Released { id: p.key.id, pids, path: p.path });
            poke(self.wake);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }

    #[test]
    fn timing_means_in_microseconds() {
        let mut t = Timing::default();
        t.add(Duration::from_micros(10));
        t.add(Duration::from_micros(30));
        assert_eq!((t.count, t.max_ns), (2, 30_000));
        assert!((t.mean_us() - 20.0).abs() < 1e-9, "{}", t.mean_us());
    }
}
