//! The state file that makes simulated devices shared across processes, like a real GPU: a small
//! fixed-size file `$SIMCUDA_STATE_DIR/state.v1`, mapped `MAP_SHARED` by every process that loads
//! the driver or NVML stand-in, holding one slot per (process, device) with the bytes of physical
//! memory that process holds there. A device's used memory is the sum of its slots, so one
//! process's allocations shrink what every other process can allocate, and NVML in any process
//! reads the same figures.
//!
//! Hot path (charging and uncharging pages) is lock-free: an atomic add to the caller's own slot,
//! then a sum over the slots in use; a charge that would pass the limit is undone. Two processes
//! racing for the last pages can therefore both fail where one of them could have succeeded; they
//! never both succeed past the limit. Slot claims, releases and the reaping of dead processes
//! (`/proc/PID/stat` gone, a zombie, or a start time that no longer matches) take an exclusive
//! `flock` on the file, opened afresh for each so that a forked child never shares the parent's lock.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_be_bytes(*b"simcuda1");
const HEADER_LEN: usize = 64;
const SLOT_LEN: usize = 32;
/// How many (process, device) pairs the file can hold.
pub const SLOTS: usize = 1024;
const FILE_LEN: usize = HEADER_LEN + SLOTS * SLOT_LEN;
const FILE_NAME: &str = "state.v1";

/// Header: magic u64 @0, slots-ever-used high-water mark u32 @8.
const HWM_OFFSET: usize = 8;

/// One slot: pid u32 @0 (0 = free; written last when claimed), device u32 @4, process start
/// time u64 @8 (clock ticks since boot, `/proc/PID/stat` field 22), used bytes u64 @16.
#[repr(C)]
struct Slot {
    pid: AtomicU32,
    device: AtomicU32,
    start_time: AtomicU64,
    used: AtomicU64,
    _reserved: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_LEN);

/// A process seen in the state file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub used: u64,
}

/// The mapped state file (or, when it cannot be opened, a private in-process stand-in for it).
pub struct SharedState {
    base: *mut u8,
    path: Option<PathBuf>,
}

// SAFETY: the mapping lives as long as the value and is only accessed through atomics.
unsafe impl Send for SharedState {}
// SAFETY: as above: every access to the mapped bytes is atomic.
unsafe impl Sync for SharedState {}

impl SharedState {
    /// Maps `dir/state.v1`, creating the directory and the file when missing.
    pub fn open(dir: &Path) -> io::Result<SharedState> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE_NAME);
        let fd = open_rw(&path)?;
        let lock = FileLock::acquire_fd(fd);
        let result = (|| {
            // SAFETY: fd is an open descriptor; fstat writes into the zeroed struct.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(io::Error::last_os_error());
            }
            if (st.st_size as usize) < FILE_LEN {
                // SAFETY: fd is open for writing; growing the file fills it with zeros.
                if unsafe { libc::ftruncate(fd, FILE_LEN as libc::off_t) } != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // SAFETY: mapping FILE_LEN bytes of a file at least that long, shared, read-write.
            let base = unsafe { libc::mmap(std::ptr::null_mut(), FILE_LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let state = SharedState { base: base.cast(), path: Some(path.clone()) };
            if state.magic().load(Ordering::Acquire) != MAGIC {
                // A new file, or one written by an incompatible version: start over.
                // SAFETY: the mapping is FILE_LEN bytes; we hold the file lock, and a file without
                // our magic has no user that follows this protocol.
                unsafe { std::ptr::write_bytes(state.base, 0, FILE_LEN) };
                state.magic().store(MAGIC, Ordering::Release);
            }
            Ok(state)
        })();
        drop(lock);
        // SAFETY: fd is ours; the mapping stays valid after the descriptor is closed.
        unsafe { libc::close(fd) };
        result
    }

    /// A private, zeroed mapping: usage is then seen by this process only.
    pub fn anonymous() -> SharedState {
        let layout = std::alloc::Layout::from_size_align(FILE_LEN, 64).expect("constant layout");
        // SAFETY: the layout has a non-zero size; the allocation is leaked on purpose (it lives
        // as long as the process, like a mapping would).
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let state = SharedState { base, path: None };
        state.magic().store(MAGIC, Ordering::Release);
        state
    }

    /// The state file's path (None for the private stand-in).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn magic(&self) -> &AtomicU64 {
        // SAFETY: offset 0 of the mapping is 8-aligned and only accessed atomically.
        unsafe { &*self.base.cast::<AtomicU64>() }
    }

    fn hwm(&self) -> &AtomicU32 {
        // SAFETY: offset 8 is 4-aligned, inside the header, only accessed atomically.
        unsafe { &*self.base.add(HWM_OFFSET).cast::<AtomicU32>() }
    }

    fn slot(&self, i: usize) -> &Slot {
        debug_assert!(i < SLOTS);
        // SAFETY: slot i lies inside the mapping, 32-byte aligned, only accessed atomically.
        unsafe { &*self.base.add(HEADER_LEN + i * SLOT_LEN).cast::<Slot>() }
    }

    fn slots_in_use(&self) -> impl Iterator<Item = &Slot> {
        let n = (self.hwm().load(Ordering::SeqCst) as usize).min(SLOTS);
        (0..n).map(|i| self.slot(i))
    }

    fn lock(&self) -> Option<FileLock> {
        self.path.as_deref().and_then(FileLock::acquire)
    }

    /// Claims a slot for (`pid`, `device`); None when all slots are taken by live processes.
    pub fn claim(&self, pid: u32, start_time: u64, device: u32) -> Option<usize> {
        let _lock = self.lock();
        let free = (0..SLOTS).find(|&i| self.slot(i).pid.load(Ordering::SeqCst) == 0).or_else(|| {
            self.reap_locked();
            (0..SLOTS).find(|&i| self.slot(i).pid.load(Ordering::SeqCst) == 0)
        })?;
        let s = self.slot(free);
        s.device.store(device, Ordering::SeqCst);
        s.start_time.store(start_time, Ordering::SeqCst);
        s.used.store(0, Ordering::SeqCst);
        s.pid.store(pid, Ordering::SeqCst);
        self.hwm().fetch_max(free as u32 + 1, Ordering::SeqCst);
        Some(free)
    }

    /// Frees slot `slot` (its bytes stop counting).
    pub fn release(&self, slot: usize) {
        let _lock = self.lock();
        let s = self.slot(slot);
        s.used.store(0, Ordering::SeqCst);
        s.pid.store(0, Ordering::SeqCst);
    }

    /// Frees every slot of (`pid`, `start_time`): what an earlier image of this process (before
    /// `exec`) held, which the real driver frees with the process's contexts.
    pub fn release_process(&self, pid: u32, start_time: u64) {
        let _lock = self.lock();
        for s in self.slots_in_use() {
            if s.pid.load(Ordering::SeqCst) == pid && s.start_time.load(Ordering::SeqCst) == start_time {
                s.used.store(0, Ordering::SeqCst);
                s.pid.store(0, Ordering::SeqCst);
            }
        }
    }

    /// Adds `bytes` to slot `slot` of device `device` if all processes together then hold at most
    /// `limit` bytes of it; returns whether it did.
    pub fn try_charge(&self, slot: usize, device: u32, bytes: u64, limit: u64) -> bool {
        let s = self.slot(slot);
        s.used.fetch_add(bytes, Ordering::SeqCst);
        if self.device_used(device) > limit {
            s.used.fetch_sub(bytes, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Bytes slot `slot` holds.
    pub fn slot_used(&self, slot: usize) -> u64 {
        self.slot(slot).used.load(Ordering::SeqCst)
    }

    /// Takes `bytes` off slot `slot`.
    pub fn uncharge(&self, slot: usize, bytes: u64) {
        self.slot(slot).used.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// Bytes held on `device` by all processes with a slot (dead ones included until reaped).
    pub fn device_used(&self, device: u32) -> u64 {
        self.slots_in_use()
            .filter(|s| s.pid.load(Ordering::SeqCst) != 0 && s.device.load(Ordering::SeqCst) == device)
            .map(|s| s.used.load(Ordering::SeqCst))
            .sum()
    }

    /// The processes holding a slot on `device`, in slot order.
    pub fn processes(&self, device: u32) -> Vec<ProcessUsage> {
        self.slots_in_use()
            .filter_map(|s| {
                let pid = s.pid.load(Ordering::SeqCst);
                (pid != 0 && s.device.load(Ordering::SeqCst) == device).then(|| ProcessUsage { pid, used: s.used.load(Ordering::SeqCst) })
            })
            .collect()
    }

    /// Frees the slots of processes that are gone; returns how many it freed.
    pub fn reap_dead(&self) -> usize {
        let _lock = self.lock();
        self.reap_locked()
    }

    fn reap_locked(&self) -> usize {
        let mut reaped = 0;
        for s in self.slots_in_use() {
            let pid = s.pid.load(Ordering::SeqCst);
            if pid != 0 && !process_alive(pid, s.start_time.load(Ordering::SeqCst)) {
                s.used.store(0, Ordering::SeqCst);
                s.pid.store(0, Ordering::SeqCst);
                reaped += 1;
            }
        }
        reaped
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`) and whether it is a zombie.
fn process_stat(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    let zombie = fields.next()? == "Z";
    // Field 3 (state) was the first after the command; field 22 is 19 further on.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((start_time, zombie))
}

/// This process's start time, the second half of its identity in the state file.
pub fn own_start_time() -> u64 {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    process_stat(pid).map_or(0, |(t, _)| t)
}

fn process_alive(pid: u32, start_time: u64) -> bool {
    match process_stat(pid) {
        Some((t, zombie)) => !zombie && (start_time == 0 || t == start_time),
        None => false,
    }
}

fn open_rw(path: &Path) -> io::Result<libc::c_int> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: c is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o666) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

/// An exclusive `flock` on the state file, held until dropped.
struct FileLock {
    fd: libc::c_int,
    owned: bool,
}

impl FileLock {
    fn acquire(path: &Path) -> Option<FileLock> {
        let fd = open_rw(path).ok()?;
        let mut lock = FileLock::acquire_fd(fd);
        lock.owned = true;
        Some(lock)
    }

    fn acquire_fd(fd: libc::c_int) -> FileLock {
        // SAFETY: fd is an open descriptor; flock blocks until the lock is ours (EINTR retried).
        while unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
        FileLock { fd, owned: false }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: fd is open; unlocking (and closing a descriptor we opened) cannot fault.
        unsafe {
            libc::flock(self.fd, libc::LOCK_UN);
            if self.owned {
                libc::close(self.fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("simcuda-core-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn charges_are_shared_between_mappings_and_bounded() {
        let dir = temp_dir("charge");
        let a = SharedState::open(&dir).expect("open");
        let b = SharedState::open(&dir).expect("open again");
        let me = std::process::id();
        let t = own_start_time();
        let sa = a.claim(me, t, 0).expect("slot");
        let sb = b.claim(me, t, 0).expect("slot");
        assert_ne!(sa, sb);
        assert!(a.try_charge(sa, 0, 6 << 20, 10 << 20));
        assert_eq!(b.device_used(0), 6 << 20);
        assert!(!b.try_charge(sb, 0, 6 << 20, 10 << 20), "over the limit");
        assert!(b.try_charge(sb, 0, 4 << 20, 10 << 20));
        assert_eq!(a.device_used(1), 0);
        assert_eq!(a.processes(0).len(), 2);
        a.uncharge(sa, 6 << 20);
        assert_eq!(b.device_used(0), 4 << 20);
        b.release_process(me, t);
        assert_eq!(a.processes(0), vec![]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dead_processes_are_reaped() {
        let dir = temp_dir("reap");
        let s = SharedState::open(&dir).expect("open");
        // pid_max on Linux is at most 2^22, so this pid cannot exist.
        let slot = s.claim(0x7fff_fff0, 1, 0).expect("slot");
        assert!(s.try_charge(slot, 0, 2 << 20, u64::MAX));
        assert_eq!(s.device_used(0), 2 << 20);
        assert_eq!(s.reap_dead(), 1);
        assert_eq!(s.device_used(0), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
