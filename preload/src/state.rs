//! Whether this process is traced, and the ring and connection that make it so.
//!
//! One state word decides: `Uninit` until the constructor (or the first hook, if another
//! library's constructor reaches a hook first) reads the environment; `Disabled` (pure
//! pass-through: no consumer socket configured, not the consumer's direct child under
//! `GPUFRAG_NO_FOLLOW`, any setup failure, or a panic inside the shim); `Armed` (ring created,
//! hello sent: hooks record); `NeedsRearm` in a fork child, which gets its own ring and
//! connection at its first hooked call, if it ever makes one (`HELLO_F_FORKED`), and `Arming`
//! while one thread does that.
//!
//! Arming: connect (non-blocking, so a consumer that stopped accepting cannot block us) to
//! `GPUFRAG_SOCK`, create the event region in a memfd (`memfd_create`, `ftruncate`, `mmap`
//! shared, `Lanes::init`: K rings, "lanes"; each thread is given one, round robin, at its first
//! event, see `assign_lane`), send the 64-byte hello with the memfd attached (`SCM_RIGHTS`),
//! close our copy of the memfd (the mapping keeps it alive) and keep the socket open,
//! close-on-exec, for the life of the process image: the consumer sees EOF when the image exits
//! or execs. An exec'd image runs the constructor again and connects as a new process image.
//!
//! Environment: `GPUFRAG_SOCK` (the consumer's Unix socket path; `@name` for the abstract
//! namespace), `GPUFRAG_RING_CAPACITY` (events the whole region holds, all lanes together, a
//! power of two, default `lanes::DEFAULT_TOTAL_CAPACITY` = 1 Mi; each lane holds this divided
//! by the lane count, at least 2: a thread alone in its lane can have that many events waiting
//! before it drops), `GPUFRAG_RING_LANES` (lanes, a power of two up to `lanes::MAX_LANES`,
//! default 16; 1 = every thread shares one ring), `GPUFRAG_NO_FOLLOW=1` with
//! `GPUFRAG_CONSUMER_PID` (trace only a process whose parent is the consumer),
//! `GPUFRAG_SAMPLE_MS` (device-totals sampling period, default 200, 0 = only at first allocation
//! and at failures), `GPUFRAG_CLOCK=monotonic` (stamp events with `CLOCK_MONOTONIC` even where
//! the TSC is invariant; see `clock`), `GPUFRAG_POOL_SAMPLES=0` (no reads of stream-ordered pools' reserved bytes
//! of the shim's own; the program's own reads are still recorded), `GPUFRAG_SHIM_DEBUG=1` (say
//! on stderr what the constructor decided).

use std::ffi::{c_int, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use gpufrag_wire::hello::{env_block, Hello, HELLO_BYTES, HELLO_ENV_MAX, HELLO_F_ENV, HELLO_F_FORKED, HELLO_F_TSC, SOURCE_SHIM};
use gpufrag_wire::lanes::{region_bytes, Lanes, DEFAULT_LANES, DEFAULT_TOTAL_CAPACITY, MAX_LANES};

use crate::hook;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const DISABLED: u8 = 2;
const ARMED: u8 = 3;
const NEEDS_REARM: u8 = 4;
const ARMING: u8 = 5;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// The lanes view (a leaked box, replaced only in a fork child before it re-arms).
static RING: AtomicPtr<Lanes> = AtomicPtr::new(std::ptr::null_mut());
static RING_BASE: AtomicUsize = AtomicUsize::new(0);
static RING_LEN: AtomicUsize = AtomicUsize::new(0);
static SOCK: AtomicI32 = AtomicI32::new(-1);
/// Lanes whose pages are in memory (bit k of word k / 64), reset at each arm.
static POPULATED: [AtomicU64; MAX_LANES as usize / 64] = [const { AtomicU64::new(0) }; MAX_LANES as usize / 64];
static PID: AtomicU32 = AtomicU32::new(0);
static DEBUG: AtomicBool = AtomicBool::new(false);
static CONFIG: OnceLock<Config> = OnceLock::new();

/// Smallest and largest region the shim creates, in events (the ring protocol needs at least
/// two slots per lane).
const MIN_CAPACITY: u64 = 2;
const MAX_CAPACITY: u64 = 1 << 24;

macro_rules! debug {
    ($($t:tt)*) => {
        if DEBUG.load(Ordering::Relaxed) {
            eprintln!("gpufrag-preload[{}]: {}", std::process::id(), format_args!($($t)*));
        }
    };
}

/// What the environment said, kept for a fork child's re-arm.
struct Config {
    addr: libc::sockaddr_un,
    addr_len: libc::socklen_t,
    /// Lanes (a power of two).
    lanes: u32,
    /// Events per lane (a power of two, at least 2).
    lane_capacity: u64,
    /// Trace only a process whose parent is this pid.
    only_child_of: Option<u32>,
}

impl Config {
    fn from_env() -> Option<Config> {
        DEBUG.store(std::env::var_os("GPUFRAG_SHIM_DEBUG").is_some_and(|v| v != "0" && !v.is_empty()), Ordering::Relaxed);
        let Some(sock) = std::env::var_os("GPUFRAG_SOCK").filter(|s| !s.is_empty()) else {
            debug!("GPUFRAG_SOCK unset: pass-through");
            return None;
        };
        let Some((addr, addr_len)) = sockaddr(&sock) else {
            debug!("GPUFRAG_SOCK {sock:?} is not a usable socket path: pass-through");
            return None;
        };
        let capacity = match std::env::var("GPUFRAG_RING_CAPACITY") {
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(c) if c.is_power_of_two() => c.clamp(MIN_CAPACITY, MAX_CAPACITY),
                _ => {
                    debug!("GPUFRAG_RING_CAPACITY={v:?} is not a power of two: using {DEFAULT_TOTAL_CAPACITY}");
                    DEFAULT_TOTAL_CAPACITY
                }
            },
            Err(_) => DEFAULT_TOTAL_CAPACITY,
        };
        let lanes = match std::env::var("GPUFRAG_RING_LANES") {
            Ok(v) => match v.trim().parse::<u32>() {
                Ok(k) if k.is_power_of_two() && k <= MAX_LANES => k,
                _ => {
                    debug!("GPUFRAG_RING_LANES={v:?} is not a power of two up to {MAX_LANES}: using {DEFAULT_LANES}");
                    DEFAULT_LANES
                }
            },
            Err(_) => DEFAULT_LANES,
        };
        let lane_capacity = (capacity / u64::from(lanes)).max(MIN_CAPACITY);
        let no_follow = std::env::var_os("GPUFRAG_NO_FOLLOW").is_some_and(|v| v != "0" && !v.is_empty());
        let consumer = std::env::var("GPUFRAG_CONSUMER_PID").ok().and_then(|v| v.trim().parse::<u32>().ok());
        if no_follow && consumer.is_none() {
            debug!("GPUFRAG_NO_FOLLOW set without a valid GPUFRAG_CONSUMER_PID: following every process");
        }
        let clock = crate::clock::init(std::env::var("GPUFRAG_CLOCK").ok().as_deref());
        debug!("{clock}");
        let sample_ms = std::env::var("GPUFRAG_SAMPLE_MS").ok().and_then(|v| v.trim().parse::<u64>().ok());
        hook::set_sample_interval_ms(sample_ms.unwrap_or(200));
        hook::set_pool_sampling(std::env::var("GPUFRAG_POOL_SAMPLES").map_or(true, |v| v.trim() != "0"));
        Some(Config { addr, addr_len, lanes, lane_capacity, only_child_of: consumer.filter(|_| no_follow) })
    }
}

/// A Unix socket address for `path` (`@name`: abstract namespace).
fn sockaddr(path: &OsStr) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes();
    let (abstract_ns, name) = match bytes.strip_prefix(b"@") {
        Some(n) => (true, n),
        None => (false, bytes),
    };
    let off = usize::from(abstract_ns);
    if name.is_empty() || name.contains(&0) || off + name.len() >= a.sun_path.len() {
        return None;
    }
    for (dst, &src) in a.sun_path[off..].iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    let path_off = std::mem::size_of::<libc::sa_family_t>();
    let len = path_off + off + name.len() + usize::from(!abstract_ns);
    Some((a, len as libc::socklen_t))
}

/// Reads the environment and arms the shim, once per process image. Never aborts: any failure
/// leaves the shim disabled.
pub fn init() {
    if STATE.compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    let armed = std::panic::catch_unwind(|| {
        if !crate::dl::loader_found() {
            // Without the real dlsym the shim could not even pass lookups through.
            eprintln!("gpufrag-preload: the C library's dlsym was not found; tracing is off");
            return false;
        }
        let Some(cfg) = Config::from_env() else { return false };
        let cfg = CONFIG.get_or_init(|| cfg);
        let ok = arm(cfg, false);
        if ok {
            // SAFETY: registering a plain function with no preconditions as the fork child handler.
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        }
        ok
    })
    .unwrap_or(false);
    STATE.store(if armed { ARMED } else { DISABLED }, Ordering::Release);
}

/// Whether hooks should record now: arms on first use where needed. The hot path is one load.
#[inline]
pub fn active() -> bool {
    match STATE.load(Ordering::Acquire) {
        ARMED => true,
        UNINIT => {
            init();
            STATE.load(Ordering::Acquire) == ARMED
        }
        NEEDS_REARM => rearm(),
        _ => false,
    }
}

/// Whether lookup routes should hand out wrappers: unless tracing is known to be off. Before the
/// constructor has run, only whether a consumer is configured (no allocation here: this runs
/// inside `dlsym`).
pub fn swapping() -> bool {
    match STATE.load(Ordering::Acquire) {
        DISABLED => false,
        // SAFETY: getenv with a NUL-terminated name; only the presence of the value is used.
        UNINIT | INITIALIZING => !unsafe { libc::getenv(c"GPUFRAG_SOCK".as_ptr()) }.is_null(),
        _ => true,
    }
}

/// Turns tracing off for good after a panic inside the shim (hooks then pass straight through).
pub fn disable_after_panic() {
    STATE.store(DISABLED, Ordering::Release);
}

/// The event lanes, while armed.
#[inline]
pub fn ring() -> Option<&'static Lanes> {
    let p = RING.load(Ordering::Acquire);
    // SAFETY: RING is null or a leaked Box<Lanes> that is never freed.
    unsafe { p.as_ref() }
}

/// Threads given a lane so far.
static NEXT_LANE: AtomicU32 = AtomicU32::new(0);

/// Set in a lane number the thread has to itself: it pushes without a locked instruction
/// (`Lanes::push_exclusive`).
pub const LANE_EXCLUSIVE: u32 = 1 << 31;
/// The last lane, whatever the count (a power of two): always one of the shared ones.
pub const LAST_LANE: u32 = !LANE_EXCLUSIVE;

/// A lane for a thread's first event. With K lanes, the first K/2 threads each get a lane of their
/// own (`LANE_EXCLUSIVE`); later threads share the other K/2 round robin, pushing with a
/// compare-and-swap (with one lane, every thread shares it). Threads that allocate are few in the
/// programs traced (PyTorch: the main thread, one autograd thread per device, a few workers); a
/// process with many keeps correct, only slower, pushes.
///
/// The first thread given a lane brings its pages into memory, so that no push takes a page fault
/// (a fresh lane is untouched zeroes: lanes no thread uses cost nothing): one `madvise`
/// (`MADV_POPULATE_WRITE`, Linux 5.14), else a load from each page. The count of lanes handed
/// out is published in the region's header first: the consumer keeps the lane after it
/// populated through its own mapping of the memfd (`gpufrag_wire::lanes::Prefault`), so the
/// pages are usually allocated and cleared already and this only maps them.
#[cold]
pub fn assign_lane() -> u32 {
    let n = NEXT_LANE.fetch_add(1, Ordering::Relaxed);
    // Not armed yet: the last lane, always a shared one (lane numbers are taken modulo the count).
    let Some(lanes) = ring() else { return LAST_LANE };
    // Tell the consumer, which brings the next lane into memory before another thread needs it.
    lanes.note_assigned(n.saturating_add(1));
    let count = lanes.count() as u32;
    let own = count / 2;
    let lane = if n < own { n | LANE_EXCLUSIVE } else { own + (n - own) % (count - own) };
    let k = (lane & !LANE_EXCLUSIVE) as usize;
    let bit = 1u64 << (k % 64);
    if POPULATED[k / 64].fetch_or(bit, Ordering::Relaxed) & bit != 0 {
        return lane;
    }
    let (base, len) = lanes.lane_region(k);
    // SAFETY: the lane's bytes lie inside our mapping of the region; populating changes no data.
    if unsafe { libc::madvise(base.cast(), len, libc::MADV_POPULATE_WRITE) } == 0 {
        return lane;
    }
    for off in (0..len).step_by(4096) {
        // SAFETY: a page-aligned word inside the mapped lane; an atomic load races with nothing,
        // and a read fault on a shared memfd mapping maps the page writable.
        let _ = unsafe { &*base.add(off).cast::<AtomicU64>() }.load(Ordering::Relaxed);
    }
    lane
}

/// This process's pid (updated in a fork child).
#[inline]
pub fn pid() -> u32 {
    PID.load(Ordering::Relaxed)
}

/// Re-arms a fork child at its first hooked call; other threads pass through meanwhile.
#[cold]
fn rearm() -> bool {
    if STATE.compare_exchange(NEEDS_REARM, ARMING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return STATE.load(Ordering::Acquire) == ARMED;
    }
    let ok = CONFIG.get().is_some_and(|cfg| std::panic::catch_unwind(|| arm(cfg, true)).unwrap_or(false));
    STATE.store(if ok { ARMED } else { DISABLED }, Ordering::Release);
    ok
}

/// The fork child handler: the parent's ring and connection are not ours; re-arm lazily.
extern "C" fn after_fork_in_child() {
    PID.store(std::process::id(), Ordering::Relaxed);
    hook::after_fork_in_child();
    if !matches!(STATE.load(Ordering::Acquire), ARMED | ARMING | NEEDS_REARM) {
        return;
    }
    RING.store(std::ptr::null_mut(), Ordering::Release);
    let (base, len) = (RING_BASE.swap(0, Ordering::AcqRel), RING_LEN.swap(0, Ordering::AcqRel));
    if base != 0 {
        // SAFETY: the parent's mapping of its ring, which nothing in the child uses any more
        // (RING is null and the child has only this thread).
        unsafe { libc::munmap(base as *mut c_void, len) };
    }
    let fd = SOCK.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: our copy of the parent's connection; closing it lets the consumer see the
        // parent's EOF even if this child outlives it.
        unsafe { libc::close(fd) };
    }
    STATE.store(NEEDS_REARM, Ordering::Release);
}

/// Sets up the ring and the connection, and says hello.
fn arm(cfg: &Config, forked: bool) -> bool {
    // SAFETY: getpid/getppid cannot fail.
    let (pid, ppid) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
    PID.store(pid, Ordering::Relaxed);
    if let Some(consumer) = cfg.only_child_of {
        if ppid != consumer {
            debug!("parent {ppid} is not the consumer {consumer} (GPUFRAG_NO_FOLLOW): pass-through");
            return false;
        }
    }
    let sock = match connect(cfg) {
        Ok(fd) => fd,
        Err(e) => {
            debug!("cannot connect to the consumer: {e}: pass-through");
            return false;
        }
    };
    let len = region_bytes(cfg.lanes, cfg.lane_capacity);
    let fail = |what: &str, mapped: Option<*mut c_void>, memfd: Option<c_int>| {
        let e = std::io::Error::last_os_error();
        debug!("{what}: {e}: pass-through");
        // SAFETY: releasing what this function created and nobody else uses yet.
        unsafe {
            if let Some(m) = mapped {
                libc::munmap(m, len);
            }
            if let Some(fd) = memfd {
                libc::close(fd);
            }
            libc::close(sock);
        }
        false
    };
    // SAFETY: memfd_create with a NUL-terminated name and valid flags.
    let memfd = unsafe { libc::memfd_create(c"gpufrag-ring".as_ptr(), libc::MFD_CLOEXEC) };
    if memfd < 0 {
        return fail("memfd_create", None, None);
    }
    // SAFETY: sizing our own fresh memfd.
    if unsafe { libc::ftruncate(memfd, len as libc::off_t) } != 0 {
        return fail("ftruncate", None, Some(memfd));
    }
    // SAFETY: a fresh shared mapping of the whole memfd.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd, 0) };
    if base == libc::MAP_FAILED {
        return fail("mmap", None, Some(memfd));
    }
    // SAFETY: `len` fresh, zeroed, page-aligned bytes that only this function knows about yet.
    let ring = match unsafe { Lanes::init(base.cast(), len, cfg.lanes, cfg.lane_capacity, pid) } {
        Ok(r) => r,
        Err(_) => return fail("ring layout", Some(base), Some(memfd)),
    };
    let hello = Hello {
        pid,
        ppid,
        ring_bytes: len as u64,
        start_time: own_start_time().unwrap_or(0),
        // A fork child keeps the parent's clock (same machine, same counter).
        flags: if forked { HELLO_F_FORKED } else { 0 } | if crate::clock::tsc() { HELLO_F_TSC } else { 0 } | HELLO_F_ENV,
        source: SOURCE_SHIM,
        exe: own_comm(),
    };
    // Which GPUs this process sees (and its pod's names), for the consumer: read once, here.
    let mut env = [0u8; HELLO_ENV_MAX + 2];
    let env_len = env_block(|k| std::env::var_os(k).map(|v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec()), &mut env);
    if let Err(e) = send_hello(sock, memfd, &hello.to_bytes(), &env[..env_len]) {
        debug!("cannot send the hello: {e}");
        return fail("hello", Some(base), Some(memfd));
    }
    // SAFETY: our copy of the memfd; the mapping and the consumer's copy keep the memory.
    unsafe { libc::close(memfd) };
    RING_BASE.store(base as usize, Ordering::Relaxed);
    RING_LEN.store(len, Ordering::Relaxed);
    SOCK.store(sock, Ordering::Relaxed);
    for w in &POPULATED {
        w.store(0, Ordering::Relaxed);
    }
    NEXT_LANE.store(0, Ordering::Relaxed);
    RING.store(Box::into_raw(Box::new(ring)), Ordering::Release);
    debug!("armed: {} lanes of {} events, forked={forked}", cfg.lanes, cfg.lane_capacity);
    true
}

/// Connects to the consumer without ever blocking: a full accept queue is retried briefly.
fn connect(cfg: &Config) -> std::io::Result<c_int> {
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    for _ in 0..20 {
        // SAFETY: a valid sockaddr_un of addr_len bytes.
        let rc = unsafe { libc::connect(fd, (&cfg.addr as *const libc::sockaddr_un).cast(), cfg.addr_len) };
        if rc == 0 {
            return Ok(fd);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => {
                // The consumer's accept queue is full: give it a moment, a bounded number of times.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            _ => {
                // SAFETY: our own socket.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        }
    }
    // SAFETY: our own socket.
    unsafe { libc::close(fd) };
    Err(std::io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Sends the hello and the environment block after it, with `memfd` attached.
fn send_hello(sock: c_int, memfd: c_int, bytes: &[u8; HELLO_BYTES], env: &[u8]) -> std::io::Result<()> {
    // Room for one cmsghdr carrying one fd, 8-byte aligned.
    let mut control = [0u64; 4];
    let mut iov = [
        libc::iovec { iov_base: bytes.as_ptr() as *mut c_void, iov_len: bytes.len() },
        libc::iovec { iov_base: env.as_ptr() as *mut c_void, iov_len: env.len() },
    ];
    let total = bytes.len() + env.len();
    // SAFETY: msghdr is plain old data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = 2;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as _;
    debug_assert!(msg.msg_controllen as usize <= std::mem::size_of_val(&control));
    // SAFETY: msg_control points to msg_controllen bytes we own; CMSG_FIRSTHDR is non-null for
    // a control buffer that large, and CMSG_DATA has room for one int.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as _;
        libc::CMSG_DATA(c).cast::<c_int>().write_unaligned(memfd);
    }
    loop {
        // SAFETY: msg describes buffers that live across the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n == total as isize {
            return Ok(());
        }
        if n >= 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "short hello"));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Reads a small /proc file into `buf` without allocating; the bytes read.
fn read_proc<'a>(path: &CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    // SAFETY: opening a NUL-terminated path read-only.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: reading into the unused tail of `buf`.
        let r = unsafe { libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if r <= 0 {
            break;
        }
        n += r as usize;
    }
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    Some(&buf[..n])
}

/// Field 22 of /proc/self/stat: start time in clock ticks since boot.
fn own_start_time() -> Option<u64> {
    let mut buf = [0u8; 2048];
    let stat = read_proc(c"/proc/self/stat", &mut buf)?;
    // The command name (field 2) is in parentheses and may contain anything: count from the last ')'.
    let close = stat.iter().rposition(|&c| c == b')')?;
    let rest = &stat[close + 1..];
    let field = rest.split(|&c| c == b' ').filter(|f| !f.is_empty()).nth(22 - 3)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// /proc/self/comm, NUL-padded to the hello's 24 bytes.
fn own_comm() -> [u8; 24] {
    let mut out = [0u8; 24];
    let mut buf = [0u8; 64];
    if let Some(comm) = read_proc(c"/proc/self/comm", &mut buf) {
        let comm = comm.strip_suffix(b"\n").unwrap_or(comm);
        let n = comm.len().min(out.len() - 1);
        out[..n].copy_from_slice(&comm[..n]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses() {
        let (a, len) = sockaddr(OsStr::new("/tmp/x.sock")).expect("a path");
        assert_eq!(len as usize, 2 + 11 + 1);
        assert_eq!(a.sun_path[0], b'/' as libc::c_char);
        let (a, len) = sockaddr(OsStr::new("@gpufrag")).expect("an abstract name");
        assert_eq!(len as usize, 2 + 1 + 7);
        assert_eq!(a.sun_path[0], 0);
        assert!(sockaddr(OsStr::new(&"x".repeat(200))).is_none());
    }

    #[test]
    fn proc_fields() {
        assert!(own_start_time().is_some_and(|t| t > 0));
        assert_ne!(own_comm()[0], 0);
    }
}
