//! One traced process's connection: the peer-uid check, the hello with its memfd
//! (`SCM_RIGHTS`), the shared mapping of its event region (K ring lanes, merged by timestamp as
//! they are drained, and brought into memory one lane ahead of the threads that need them, see
//! [`LanePrefaulter`]), and the framed messages a Python hook sends.
//!
//! A region stamped in TSC ticks (`HELLO_F_TSC`) is merged on the raw ticks and each event is
//! converted to `CLOCK_MONOTONIC` ns right after the merge (`gpufrag_wire::clock`: the process's
//! one calibration, made when the first such region appears, and a per-region clamp that keeps
//! converted timestamps non-decreasing), so that everything downstream, recordings included,
//! sees nanoseconds.

use crate::event::{Event, EventKind};
use crate::hello::{Hello, HELLO_BYTES, HELLO_ENV_MAX, HELLO_F_ENV, HELLO_F_TSC, SOURCE_PYTHON, SOURCE_SHIM};
use gpufrag_wire::clock::{self, Converter};
use gpufrag_wire::lanes::{Lanes, Merge, Prefault, SPARE_LANES};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Weak};

/// A shim's event region, mapped.
pub struct RingConn {
    /// The process's hello.
    pub hello: Hello,
    /// Drops already reported.
    pub dropped_seen: u64,
    /// The environment block that followed the hello (NUL-separated `KEY=VALUE`), if any.
    pub env: Option<Vec<u8>>,
    stream: UnixStream,
    region: Arc<Region>,
    lanes: Lanes,
    merge: Merge,
    /// For a region stamped in TSC ticks: its conversion to ns.
    ticks: Option<Converter>,
}

// SAFETY: the mapping is kept alive by the `Arc<Region>` this value holds and the lanes view is
// Send.
unsafe impl Send for RingConn {}

/// The consumer's shared mapping of one event region, unmapped when the last holder (the
/// connection, the prefaulter) lets go.
struct Region {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a mapping is a range of addresses; what is done through it is the holders' business
// (the lanes view's atomics).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `handshake`, which nothing uses any more
        // (every holder of the Arc is gone).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Keeps one lane beyond those a process has handed out in memory ([`Prefault`]), through the
/// consumer's mapping: run by the consumer's prefault thread, so that neither the acceptor nor
/// the drainer waits on it. It holds the region weakly, and strongly only while it populates: the
/// mapping (and with it the memfd's pages, the process's whole ring) goes the moment the
/// drainer drops the connection of a process that exited, however many other regions the
/// prefaulter still tends (issue 23: held strongly, a burst of short children kept each exited
/// child's ring, about 1.75 MB, until the burst ended: 2.66 GB for 1,500 children).
pub struct LanePrefaulter {
    region: Weak<Region>,
    lanes: Lanes,
    prefault: Prefault,
}

// SAFETY: the lanes view is used only while `run` holds the region mapped (an upgraded Weak),
// and it is Send.
unsafe impl Send for LanePrefaulter {}

impl LanePrefaulter {
    /// Populates what is due; whether there is anything left to do (more lanes to populate,
    /// and the connection still alive).
    pub fn run(&mut self) -> bool {
        // Mapped for as long as `_mapped` lives; gone means the connection is gone.
        let Some(_mapped) = self.region.upgrade() else { return false };
        self.prefault.ahead(&self.lanes, SPARE_LANES);
        !self.prefault.done(&self.lanes)
    }

    /// Whether the connection (and so the mapping) is gone.
    pub fn gone(&self) -> bool {
        self.region.strong_count() == 0
    }
}

impl RingConn {
    /// Hands `out` up to about `limit` events, merged across the lanes in timestamp order (an
    /// event waits until every lane has been looked at since it was read; see `Merge`); with
    /// `flush`, everything published before the call. `out` returns `false` to stop. The events
    /// handed over, and whether `out` wants more.
    /// Timestamps are `CLOCK_MONOTONIC` ns (converted from ticks for a TSC region).
    pub fn drain(&mut self, limit: usize, flush: bool, mut out: impl FnMut(Event) -> bool) -> (usize, bool) {
        match &mut self.ticks {
            None => self.merge.drain(&self.lanes, limit, flush, out),
            Some(conv) => {
                let model = clock::shared_model();
                self.merge.drain(&self.lanes, limit, flush, |mut e| {
                    e.ts_ns = conv.convert(&model, e.ts_ns);
                    out(e)
                })
            }
        }
    }

    /// Hands `out` every event left, waiting for nothing (the process is gone, or we stop).
    pub fn finish(&mut self, mut out: impl FnMut(Event) -> bool) -> usize {
        match &mut self.ticks {
            None => self.merge.finish(&self.lanes, out),
            Some(conv) => {
                let model = clock::shared_model();
                self.merge.finish(&self.lanes, |mut e| {
                    e.ts_ns = conv.convert(&model, e.ts_ns);
                    out(e)
                })
            }
        }
    }

    /// Pushes that found their lane full, all lanes together.
    pub fn dropped_count(&self) -> u64 {
        self.lanes.dropped_count()
    }

    /// The prefaulter of this region's lanes.
    pub fn prefaulter(&self) -> LanePrefaulter {
        LanePrefaulter { region: Arc::downgrade(&self.region), lanes: self.lanes, prefault: Prefault::new() }
    }

    /// Whether the process closed its end (it exited).
    pub fn peer_closed(&self) -> bool {
        let mut p = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
        // SAFETY: one pollfd we own, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n <= 0 {
            return false;
        }
        if p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
            return true;
        }
        let mut b = [0u8; 1];
        // SAFETY: peeks one byte into our buffer without blocking.
        let r = unsafe { libc::recv(self.stream.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        r == 0
    }
}

/// What a new connection turned out to be.
pub enum Accepted {
    /// The shim with its ring.
    Ring(RingConn),
    /// A Python hook that will send framed messages.
    Python(Hello, UnixStream),
}

fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills one ucred we own, of the length we pass.
    let r =
        unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Receives the hello and, if attached, one file descriptor.
fn recv_hello(s: &UnixStream) -> io::Result<(Hello, Option<OwnedFd>)> {
    let mut buf = [0u8; HELLO_BYTES];
    let mut cmsg = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: HELLO_BYTES };
    // SAFETY: an all-zero msghdr is valid; we point it at our buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
    // SAFETY: recvmsg writes into the buffers msg points to, within their stated sizes.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: the CMSG_* macros walk the control buffer recvmsg filled, bounded by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = libc::CMSG_DATA(c).cast::<libc::c_int>().read_unaligned();
                if fd.is_none() {
                    fd = Some(OwnedFd::from_raw_fd(raw));
                } else {
                    libc::close(raw);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if (n as usize) < HELLO_BYTES {
        let mut stream = s;
        stream.read_exact(&mut buf[n as usize..])?;
    }
    let hello = Hello::from_bytes(&buf).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a gpufrag hello"))?;
    Ok((hello, fd))
}

/// Reads the environment block that follows a hello with `HELLO_F_ENV`.
fn recv_env(mut s: &UnixStream, pid: u32) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let len = usize::from(u16::from_le_bytes(len));
    if len > HELLO_ENV_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("pid {pid}: environment block of {len} bytes, more than {HELLO_ENV_MAX}"),
        ));
    }
    let mut env = vec![0u8; len];
    s.read_exact(&mut env)?;
    Ok(env)
}

/// Checks the peer and reads its hello; maps a shim's ring.
pub fn handshake(stream: UnixStream) -> io::Result<Accepted> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let uid = peer_uid(&stream)?;
    if uid != me {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("peer uid {uid} is not ours ({me})")));
    }
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let (hello, fd) = recv_hello(&stream)?;
    match hello.source {
        SOURCE_PYTHON => {
            stream.set_read_timeout(None)?;
            Ok(Accepted::Python(hello, stream))
        }
        SOURCE_SHIM => {
            let env = if hello.flags & HELLO_F_ENV != 0 { Some(recv_env(&stream, hello.pid)?) } else { None };
            let fd = fd.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("pid {}: hello without its ring", hello.pid)))?;
            // SAFETY: fstat fills one stat we own.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above; fd is open.
            if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let len = st.st_size as usize;
            if len as u64 != hello.ring_bytes || len == 0 || len > (1 << 32) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("pid {}: ring of {len} bytes, hello says {}", hello.pid, hello.ring_bytes),
                ));
            }
            // SAFETY: maps the whole memfd shared; the result is checked before use.
            let base =
                unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh page-aligned mapping of `len` bytes that RingConn unmaps on drop.
            let lanes = match unsafe { Lanes::attach(base.cast(), len) } {
                Ok(r) => r,
                Err(e) => {
                    // SAFETY: unmaps what we just mapped.
                    unsafe { libc::munmap(base, len) };
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("pid {}: {e}", hello.pid)));
                }
            };
            stream.set_read_timeout(None)?;
            let merge = Merge::new(lanes.count());
            let ticks = (hello.flags & HELLO_F_TSC != 0).then(Converter::new);
            let region = Arc::new(Region { base, len });
            Ok(Accepted::Ring(RingConn { hello, dropped_seen: 0, env, stream, region, lanes, merge, ticks }))
        }
        other => Err(io::Error::new(io::ErrorKind::InvalidData, format!("pid {}: unknown source {other}", hello.pid))),
    }
}

/// Magic of a Python hook's frame.
pub const PY_MAGIC: u32 = u32::from_le_bytes(*b"GFPY");
/// Frame: a pickled `torch.cuda.memory._snapshot()`.
pub const PY_SNAPSHOT: u32 = 1;
/// Frame: the out-of-memory observer fired (`<qQQQQ`: device, requested (PyTorch's allocation
/// size), the observer's limit argument (the allowed bytes with a memory fraction set, else the
/// device total), device free, and the allowed bytes or 0 when no fraction caps the allocator).
/// The 32-byte body of earlier hooks (no allowed bytes) is accepted too.
pub const PY_OOM: u32 = 2;
/// Bytes of a [`PY_OOM`] frame's body.
pub const PY_OOM_BYTES: usize = 40;
/// Bytes of a [`PY_OOM`] frame's body from a hook that sends no allowed bytes.
pub const PY_OOM_BYTES_V1: usize = 32;
/// Frame: the allowed bytes of the OOM the trace tracker reported (`<qQQ`: device, PyTorch's
/// allocation size, the allowed bytes of `set_per_process_memory_fraction`), sent by the OOM
/// observer when the tracker's OOM entry, which cannot carry them, is the OOM itself.
pub const PY_OOM_ALLOWED: u32 = 8;
/// Bytes of a [`PY_OOM_ALLOWED`] frame's body.
pub const PY_OOM_ALLOWED_BYTES: usize = 24;
/// Frame: CUDA is up and PyTorch's native caching allocator manages this process's memory
/// (`<q`: the current device).
pub const PY_ARMED: u32 = 3;
/// Bytes of a [`PY_ARMED`] frame's body.
pub const PY_ARMED_BYTES: usize = 8;
/// Bytes of a frame's header (`<4sIQ`: magic, frame type, body length).
pub const PY_HEADER_BYTES: usize = 16;
/// Frame: wire events (80 bytes each) the hook made itself: CuPy's pool chunks from its
/// MemoryHook (`BlockAlloc` / `BlockFree` with `F_ALLOC_CUPY`, and `Adopt` at address 0 before the
/// pool's first allocation on a device; nothing else is accepted).
pub const PY_EVENTS: u32 = 4;
/// Frame: a framework's own statistics, JSON ([`crate::alloc::FrameworkReport`] without the pid).
pub const PY_STATS: u32 = 5;
/// Frame: a framework's out-of-memory error, JSON (`framework`, `device`, `requested`,
/// `device_free` or null, `requested_text` (XLA's rounded size) or null, `pool_total` (CuPy's) or
/// null, `pool_limit`, `seen` (`raised`: at the error's construction; `hook`: an exception hook),
/// `source`, `message`).
pub const PY_FRAMEWORK_OOM: u32 = 6;
/// Frame: how this process's PyTorch blocks reach gpufrag, JSON (`blocks`: `"tracker"`, PyTorch's
/// allocator trace tracker, event level, its events in the shim's ring; or `"snapshots"`; `note`:
/// the hook's sentence for the summary, saying why when it is snapshots).
pub const PY_BLOCKS_SOURCE: u32 = 7;
/// Largest frame accepted.
const PY_MAX_FRAME: u64 = 1 << 31;
/// A Python hook's frame: the allocator settings in force (JSON `{"conf"}`: at arm, and after each
/// `torch.cuda.memory._set_allocator_settings` with the string given), a settings event.
pub const PY_SETTINGS: u32 = 20;
/// A Python hook's frame: `set_per_process_memory_fraction` (device, fraction, allowed bytes).
pub const PY_FRACTION: u32 = 21;
/// Bytes of a [`PY_FRACTION`] frame's body.
pub const PY_FRACTION_BYTES: usize = 24;
/// A Python hook's frame: the framework managing the process's memory (JSON
/// `{"framework", "version"}`).
pub const PY_FRAMEWORK: u32 = 22;
/// Longest settings or framework text taken from a frame.
const PY_FACT_TEXT: usize = 4096;

/// The body of a [`PY_SETTINGS`] frame.
#[derive(serde::Deserialize)]
struct SettingsFrame {
    conf: String,
}

/// The body of a [`PY_FRAMEWORK`] frame.
#[derive(serde::Deserialize)]
struct FrameworkFrame {
    framework: crate::alloc::Framework,
    #[serde(default)]
    version: String,
}

/// The body of a [`PY_BLOCKS_SOURCE`] frame.
#[derive(serde::Deserialize)]
struct BlocksSourceFrame {
    blocks: String,
    #[serde(default)]
    note: String,
}

/// The body of a [`PY_FRAMEWORK_OOM`] frame.
#[derive(serde::Deserialize)]
struct FrameworkOomFrame {
    framework: crate::alloc::Framework,
    #[serde(default)]
    device: i16,
    #[serde(default)]
    requested: u64,
    #[serde(default)]
    device_free: Option<u64>,
    #[serde(default)]
    requested_text: Option<String>,
    #[serde(default)]
    pool_total: Option<u64>,
}

/// Reads a Python hook's frames until it closes, handing each to `emit`. Generic over the
/// reader so that the framing can be fuzzed on bytes (fuzz/fuzz_targets/python_frames.rs).
pub fn python_reader(hello: Hello, mut stream: impl Read, mut emit: impl FnMut(crate::source::Msg)) {
    let name = format!("python hook of pid {}", hello.pid);
    loop {
        let mut head = [0u8; PY_HEADER_BYTES];
        if stream.read_exact(&mut head).is_err() {
            return;
        }
        let word = |o: usize| u32::from_le_bytes([head[o], head[o + 1], head[o + 2], head[o + 3]]);
        let len = u64::from_le_bytes([head[8], head[9], head[10], head[11], head[12], head[13], head[14], head[15]]);
        if word(0) != PY_MAGIC || len > PY_MAX_FRAME {
            emit(crate::source::Msg::Warning(format!("{name}: bad frame header; hook disconnected")));
            return;
        }
        // Memory follows the bytes that arrive, not the length the header claims (a header
        // claiming 2 GiB made this allocate 2 GiB before one byte of body came).
        let mut body = Vec::new();
        match (&mut stream).take(len).read_to_end(&mut body) {
            Ok(n) if n as u64 == len => {}
            _ => return,
        }
        match word(4) {
            PY_SNAPSHOT => match crate::snapshot::from_bytes(&body, Path::new(&name)) {
                Ok(s) => emit(crate::source::Msg::Blocks { pid: hello.pid, snapshot: Box::new(s) }),
                Err(e) => emit(crate::source::Msg::Warning(e.to_string())),
            },
            PY_OOM if body.len() == PY_OOM_BYTES || body.len() == PY_OOM_BYTES_V1 => {
                let q = |o: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&body[o..o + 8]);
                    u64::from_le_bytes(w)
                };
                let allowed = if body.len() == PY_OOM_BYTES { Some(q(32)).filter(|&a| a > 0) } else { None };
                emit(crate::source::Msg::PyOom {
                    pid: hello.pid,
                    device: q(0) as i64 as i16,
                    requested: q(8),
                    device_free: q(24),
                    allowed,
                });
            }
            PY_OOM_ALLOWED if body.len() == PY_OOM_ALLOWED_BYTES => {
                let q = |o: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&body[o..o + 8]);
                    u64::from_le_bytes(w)
                };
                emit(crate::source::Msg::PyOomAllowed { pid: hello.pid, device: q(0) as i64 as i16, requested: q(8), allowed: q(16) });
            }
            PY_ARMED if body.len() == PY_ARMED_BYTES => {
                let mut w = [0u8; 8];
                w.copy_from_slice(&body);
                emit(crate::source::Msg::Armed { pid: hello.pid, device: i64::from_le_bytes(w) as i16 });
            }
            PY_EVENTS if body.len() % crate::event::EVENT_SIZE == 0 => {
                for chunk in body.chunks_exact(crate::event::EVENT_SIZE) {
                    let Ok(b) = <&[u8; crate::event::EVENT_SIZE]>::try_from(chunk) else { continue };
                    let mut e = crate::event::Event::from_bytes(b);
                    let block = matches!(e.kind(), Some(crate::event::EventKind::BlockAlloc | crate::event::EventKind::BlockFree))
                        || (e.kind() == Some(crate::event::EventKind::Adopt) && e.addr == 0);
                    if !block || e.flags & crate::event::F_ALLOC_CUPY == 0 {
                        emit(crate::source::Msg::Warning(format!(
                            "{name}: an event frame held a {} event; only CuPy block events are accepted",
                            e.kind().map_or("unknown", |k| k.name())
                        )));
                        continue;
                    }
                    e.pid = hello.pid;
                    emit(crate::source::Msg::Event(e));
                }
            }
            PY_STATS => match serde_json::from_slice::<crate::alloc::FrameworkReport>(&body) {
                Ok(mut r) => {
                    r.pid = hello.pid;
                    emit(crate::source::Msg::FrameworkStats(r));
                }
                Err(e) => emit(crate::source::Msg::Warning(format!("{name}: unusable statistics frame: {e}"))),
            },
            PY_FRAMEWORK_OOM => match serde_json::from_slice::<FrameworkOomFrame>(&body) {
                Ok(f) => emit(crate::source::Msg::FrameworkOom {
                    pid: hello.pid,
                    framework: f.framework,
                    device: f.device,
                    requested: f.requested,
                    device_free: f.device_free,
                    requested_text: f.requested_text.map(|t| t.chars().take(40).collect()),
                    pool_total: f.pool_total,
                }),
                Err(e) => emit(crate::source::Msg::Warning(format!("{name}: unusable out-of-memory frame: {e}"))),
            },
            PY_BLOCKS_SOURCE => match serde_json::from_slice::<BlocksSourceFrame>(&body) {
                Ok(f) if f.blocks == "tracker" || f.blocks == "snapshots" => {
                    let note = f.note.chars().take(400).collect();
                    emit(crate::source::Msg::BlocksSource { pid: hello.pid, tracker: f.blocks == "tracker", note })
                }
                Ok(f) => emit(crate::source::Msg::Warning(format!(
                    "{name}: unknown block source {:?}",
                    f.blocks.chars().take(40).collect::<String>()
                ))),
                Err(e) => emit(crate::source::Msg::Warning(format!("{name}: unusable block-source frame: {e}"))),
            },
            PY_SETTINGS => match serde_json::from_slice::<SettingsFrame>(&body) {
                Ok(f) => emit(crate::source::Msg::Fact {
                    event: Event { ts_ns: crate::source::now_ns(), ..Event::new(EventKind::AllocSettings, hello.pid, -1) },
                    text: f.conf.chars().take(PY_FACT_TEXT).collect(),
                }),
                Err(e) => emit(crate::source::Msg::Warning(format!("{name}: unusable settings frame: {e}"))),
            },
            PY_FRACTION if body.len() == PY_FRACTION_BYTES => {
                let q = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap_or([0; 8]));
                let fraction = f64::from_bits(q(8));
                emit(crate::source::Msg::Fact {
                    event: Event {
                        ts_ns: crate::source::now_ns(),
                        size: q(16),
                        ..Event::new(EventKind::MemoryFraction, hello.pid, q(0) as i64 as i16)
                    },
                    text: format!("{fraction}"),
                });
            }
            PY_FRAMEWORK => match serde_json::from_slice::<FrameworkFrame>(&body) {
                Ok(f) => emit(crate::source::Msg::Fact {
                    event: Event {
                        ts_ns: crate::source::now_ns(),
                        flags: f.framework.flags(),
                        ..Event::new(EventKind::FrameworkInfo, hello.pid, -1)
                    },
                    text: format!("{} {}", f.framework.name(), f.version.chars().take(PY_FACT_TEXT).collect::<String>()),
                }),
                Err(e) => emit(crate::source::Msg::Warning(format!("{name}: unusable framework frame: {e}"))),
            },
            t => emit(crate::source::Msg::Warning(format!("{name}: unknown frame type {t}"))),
        }
    }
}
