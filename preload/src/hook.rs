//! What every wrapper does around the real call: the per-thread re-entrancy guard, the event it
//! builds and pushes, the device it names, and the device-totals samples.
//!
//! Hot-path rules, kept here once for every wrapper: no allocation, no lock, no syscall per event
//! in the common case (the clock is the TSC or the vDSO's `clock_gettime`, see `clock`; the
//! thread id and lane are cached in thread.c's initial-exec thread-local, reached from the
//! thread pointer without a call; the device comes from the real `cuCtxGetDevice`), no panic
//! across the C boundary (`Guard::record` catches it and turns tracing off), and a push that
//! drops and counts when the ring is full rather than wait.
//!
//! Re-entrancy: a runtime call (`cudaMalloc`) that reaches the driver (`cuMemAlloc_v2`) through
//! one of our driver wrappers is recorded once: while a thread is inside a wrapper, nested
//! tracked calls pass straight through (bytehound's `StrongThreadHandle` habit).
//!
//! Devices: an allocation names the current context's device (`cuCtxGetDevice`, or the device
//! in `cuMemCreate`'s allocation properties); a free names -1 and the consumer finds the device
//! from the address. Device totals (`DeviceInfo`, from the real `cuMemGetInfo_v2`) are sampled
//! at the first successful allocation on each device, at every failed allocation, and at most
//! every `GPUFRAG_SAMPLE_MS` (200 ms by default) from inside allocation wrappers.
//!
//! Placement: before the first allocation on each ordinal is recorded, the shim asks the real
//! `cuDeviceGetUuid_v2` (else `cuDeviceGetUuid`) which GPU that ordinal is and pushes it as a
//! `DeviceUuid` event, so the consumer places the process by what its driver said, whatever its
//! environment was when it started (`CUDA_VISIBLE_DEVICES` or `CUDA_DEVICE_ORDER` set by the
//! program itself). The common case costs one relaxed load.
//!
//! Stream-ordered pools: the driver rounds what a pool reserves (it grows in chunks), so the
//! consumer's model of a pool (live bytes + freed, untrimmed bytes) is a lower bound. The pools
//! that served allocations are remembered (up to [`POOL_SLOTS`]) and their
//! `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` is sampled as `PoolReserved` with the device totals,
//! after a trim, and when the process ends; a program that reads the attribute itself has its
//! value recorded too.

use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use gpufrag_wire::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FAILED, F_SRC_SHIM};

use crate::cuda::{
    CUdevice, CUmemoryPool, CuCtxGetDeviceFn, CuDeviceGetMemPoolFn, CuDeviceGetUuidFn, CuMemGetInfoFn, CuMemPoolGetAttributeFn,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
};
use crate::state;
use crate::table::{self, Sym};

/// A thread's state: inside a wrapper or not, its id and the lane of the event region it pushes
/// into (looked up at its first event). Lives in `thread.c`'s initial-exec thread-local storage:
/// reached from the thread pointer with no `__tls_get_addr` call, and valid until the thread is
/// gone (no destructor).
#[repr(C)]
struct ThreadState {
    in_hook: Cell<u32>,
    tid: Cell<u32>,
    lane: Cell<u32>,
    _pad: u32,
    /// How far the thread may push into its exclusive lane before it reads the consumer's head.
    limit: Cell<u64>,
}

extern "C" {
    /// This thread's [`ThreadState`] (thread.c).
    fn gpufrag_thread() -> *const ThreadState;
}

/// Where `ThreadState` lies relative to the thread pointer: the same offset in every thread,
/// since initial-exec storage sits in the static TLS block at a fixed distance from each
/// thread's control block (what the compiler's own initial-exec accesses rely on). 0 until the
/// first lookup: the x86_64 offset is negative, the aarch64 one at least 16.
static TLS_OFFSET: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

/// The thread pointer, as glibc sets it: `%fs:0` (the control block's pointer to itself) on
/// x86_64, `tpidr_el0` on aarch64.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the thread control block's self-pointer, always mapped in a glibc thread.
    unsafe { std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags, pure)) };
    tp
}
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the thread-pointer register.
    unsafe { std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags, pure)) };
    tp
}

/// The calling thread's state. The reference must not outlive the thread: `ThreadState` is not
/// `Sync`, so it cannot be handed to another one.
///
/// Once the offset is known this is the thread pointer plus a constant, inlined: three
/// instructions where a call into thread.c (through the GOT: C and Rust are not inlined into
/// each other) cost five per wrapper.
#[inline(always)]
fn this_thread() -> &'static ThreadState {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let off = TLS_OFFSET.load(Ordering::Relaxed);
        if off != 0 {
            // SAFETY: thread pointer + the offset measured in `this_thread_slow` is this thread's
            // `gpufrag_thread` (the offset is the same in every thread, see TLS_OFFSET).
            return unsafe { &*(thread_pointer().wrapping_add_signed(off) as *const ThreadState) };
        }
    }
    this_thread_slow()
}

#[cold]
#[inline(never)]
fn this_thread_slow() -> &'static ThreadState {
    // SAFETY: thread.c returns the address of this thread's zero-initialised `gpufrag_thread`,
    // laid out as ThreadState, valid for the thread's lifetime.
    let p = unsafe { gpufrag_thread() };
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    TLS_OFFSET.store((p as isize).wrapping_sub(thread_pointer() as isize), Ordering::Relaxed);
    // SAFETY: as above.
    unsafe { &*p }
}

/// Held while a wrapper runs the real call and records it; dropping it re-arms the thread. It
/// holds the thread's state (found once at `enter`), so it cannot leave the thread.
pub struct Guard {
    thread: &'static ThreadState,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.thread.in_hook.set(0);
    }
}

/// Enters a wrapper: `Some` when this call should be recorded (tracing on, not nested).
#[inline]
pub fn enter() -> Option<Guard> {
    let thread = this_thread();
    if thread.in_hook.replace(1) != 0 {
        return None;
    }
    let guard = Guard { thread };
    state::active().then_some(guard)
}

impl Guard {
    /// Runs the recording part of a wrapper; a panic in it turns tracing off for good and is
    /// never propagated to the C caller.
    #[inline]
    pub fn record(&self, f: impl FnOnce()) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            state::disable_after_panic();
        }
    }
}

/// An event timestamp: TSC ticks or `CLOCK_MONOTONIC` ns, whichever the process chose.
#[inline(always)]
pub fn stamp() -> u64 {
    crate::clock::stamp()
}

fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The calling thread's id and lane, from the per-thread cache. At the thread's first event the
/// id is looked up and a lane assigned (`state::assign_lane`: the first K/2 threads each have one
/// to themselves; it also brings the lane's pages into memory).
#[inline]
fn thread_ids(t: &ThreadState) -> (u32, u32) {
    match t.tid.get() {
        0 => {
            let tid = gettid();
            let lane = state::assign_lane();
            t.tid.set(tid);
            t.lane.set(lane);
            t.limit.set(0);
            (tid, lane)
        }
        tid => (tid, t.lane.get()),
    }
}

/// A driver function the shim calls itself (never a tracked one), found once.
struct Helper {
    name: &'static CStr,
    slot: AtomicUsize,
    /// When a failed lookup may be retried (the driver may be loaded later), in
    /// `CLOCK_MONOTONIC_COARSE` ns.
    retry_at: AtomicU64,
}

impl Helper {
    const fn new(name: &'static CStr) -> Helper {
        Helper { name, slot: AtomicUsize::new(0), retry_at: AtomicU64::new(0) }
    }

    fn get(&self) -> usize {
        let p = self.slot.load(Ordering::Relaxed);
        if p != 0 {
            return p;
        }
        let now = gpufrag_wire::clock::monotonic_coarse_ns();
        if now < self.retry_at.load(Ordering::Relaxed) {
            return 0;
        }
        let p = table::find_real(self.name);
        if p != 0 {
            self.slot.store(p, Ordering::Relaxed);
        } else {
            self.retry_at.store(now + RETRY_NS, Ordering::Relaxed);
        }
        p
    }
}

const RETRY_NS: u64 = 200_000_000;
static CTX_GET_DEVICE: Helper = Helper::new(c"cuCtxGetDevice");
static DEVICE_GET_MEM_POOL: Helper = Helper::new(c"cuDeviceGetMemPool");
static DEVICE_GET_UUID_V2: Helper = Helper::new(c"cuDeviceGetUuid_v2");
static DEVICE_GET_UUID: Helper = Helper::new(c"cuDeviceGetUuid");
/// Ordinals 0..64 whose UUID was announced.
static ANNOUNCED_DEVICES: AtomicU64 = AtomicU64::new(0);

/// Announces ordinal `device`'s UUID the first time it is seen (one relaxed load after that).
/// A driver without `cuDeviceGetUuid` (or one that fails) announces nothing: the consumer then
/// falls back to the process's environment. Two threads racing may both announce (harmless).
#[inline]
fn announce_device(device: i16) {
    if !(0..64).contains(&device) || ANNOUNCED_DEVICES.load(Ordering::Relaxed) & (1u64 << device) != 0 {
        return;
    }
    announce_device_slow(device);
}

#[cold]
#[inline(never)]
fn announce_device_slow(device: i16) {
    let p = match DEVICE_GET_UUID_V2.get() {
        0 => DEVICE_GET_UUID.get(),
        p => p,
    };
    if p == 0 {
        return;
    }
    // SAFETY: p is the driver's cuDeviceGetUuid(_v2), whose C type this is.
    let f = unsafe { std::mem::transmute::<usize, CuDeviceGetUuidFn>(p) };
    let mut uuid = [0u8; 16];
    // SAFETY: cuDeviceGetUuid writes one 16-byte CUuuid.
    if unsafe { f(&mut uuid, CUdevice::from(device)) } != 0 {
        return;
    }
    let mut ev = event(stamp(), EventKind::DeviceUuid, device, 0);
    let (hi, lo) = uuid.split_at(8);
    ev.addr = u64::from_be_bytes(hi.try_into().unwrap_or([0; 8]));
    ev.size = u64::from_be_bytes(lo.try_into().unwrap_or([0; 8]));
    push(&ev);
    ANNOUNCED_DEVICES.fetch_or(1u64 << device, Ordering::Relaxed);
}

/// The current context's device; -1 when there is none or the driver cannot say.
pub fn current_device() -> i16 {
    let p = CTX_GET_DEVICE.get();
    if p == 0 {
        return -1;
    }
    // SAFETY: p is the driver's cuCtxGetDevice, whose C type this is.
    let f = unsafe { std::mem::transmute::<usize, CuCtxGetDeviceFn>(p) };
    let mut d: CUdevice = -1;
    // SAFETY: cuCtxGetDevice writes one CUdevice.
    let rc = unsafe { f(&mut d) };
    if rc == 0 {
        i16::try_from(d).unwrap_or(-1)
    } else {
        -1
    }
}

/// The current memory pool of `device` (what `cuMemAllocAsync` allocates from); 0 when unknown.
fn current_pool(device: i16) -> u64 {
    let p = DEVICE_GET_MEM_POOL.get();
    if p == 0 || device < 0 {
        return 0;
    }
    // SAFETY: p is the driver's cuDeviceGetMemPool, whose C type this is.
    let f = unsafe { std::mem::transmute::<usize, CuDeviceGetMemPoolFn>(p) };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: cuDeviceGetMemPool writes one CUmemoryPool.
    if unsafe { f(&mut pool, CUdevice::from(device)) } == 0 {
        pool as u64
    } else {
        0
    }
}

/// The sampling period in ns, as configured, and in stamps (ticks at the estimated rate, see
/// `clock::refine_rate`; refreshed on the sampling path); the last sample's stamp.
static SAMPLE_INTERVAL_NS: AtomicU64 = AtomicU64::new(200_000_000);
static SAMPLE_INTERVAL: AtomicU64 = AtomicU64::new(200_000_000);
static LAST_SAMPLE: AtomicU64 = AtomicU64::new(0);
/// Devices 0..64 that have had their first-allocation sample.
static SAMPLED_DEVICES: AtomicU64 = AtomicU64::new(0);

/// Sets the periodic sampling interval (0: only first allocation and failures).
pub fn set_sample_interval_ms(ms: u64) {
    SAMPLE_INTERVAL_NS.store(ms.saturating_mul(1_000_000), Ordering::Relaxed);
    update_sample_interval();
}

/// The sampling period in stamps, from the configured ns and the current rate estimate.
fn update_sample_interval() {
    let ns = SAMPLE_INTERVAL_NS.load(Ordering::Relaxed);
    SAMPLE_INTERVAL.store(if ns == 0 { 0 } else { crate::clock::stamps_for_ns(ns).max(1) }, Ordering::Relaxed);
}

/// The fork child starts its own sampling and its thread-id cache afresh.
pub fn after_fork_in_child() {
    this_thread().tid.set(0);
    LAST_SAMPLE.store(0, Ordering::Relaxed);
    SAMPLED_DEVICES.store(0, Ordering::Relaxed);
    ANNOUNCED_DEVICES.store(0, Ordering::Relaxed);
    for (pool, device) in POOLS.iter().zip(&POOL_DEVICES) {
        pool.store(0, Ordering::Relaxed);
        device.store(-1, Ordering::Relaxed);
    }
}

/// Free and total bytes of the current device, from the real `cuMemGetInfo_v2`.
fn measure() -> Option<(u64, u64)> {
    // SAFETY: CuMemGetInfoFn is cuMemGetInfo_v2's C type.
    let f = unsafe { table::real_fn::<CuMemGetInfoFn>(Sym::CuMemGetInfoV2) }?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the real function writes two size_t.
    (unsafe { f(&mut free, &mut total) } == 0).then_some((free as u64, total as u64))
}

/// An event of `kind` stamped `ts_ns` (a stamp: ticks or ns), by this thread.
#[inline]
fn event(ts_ns: u64, kind: EventKind, device: i16, rc: i32) -> Event {
    Event {
        ts_ns,
        pid: state::pid(),
        tid: thread_ids(this_thread()).0,
        kind: kind as u16,
        device,
        rc,
        flags: F_SRC_SHIM | if rc != 0 { F_FAILED } else { 0 },
        ..Event::default()
    }
}

/// Pushes into this thread's lane (never blocks; a full lane drops and counts): without a locked
/// instruction when the thread has the lane to itself (`state::assign_lane`).
#[inline]
fn push(ev: &Event) {
    if let Some(lanes) = state::ring() {
        let t = this_thread();
        let lane = thread_ids(t).1;
        if lane & state::LANE_EXCLUSIVE != 0 {
            // SAFETY: assign_lane gives an exclusive lane to one thread only, and that thread
            // pushes nowhere else; its limit was reset when the lane was assigned.
            unsafe { lanes.push_exclusive(lane & !state::LANE_EXCLUSIVE, ev, &t.limit) };
        } else {
            lanes.push(lane, ev);
        }
    }
}

fn push_device_info(ts_ns: u64, device: i16, free: u64, total: u64) {
    let mut ev = event(ts_ns, EventKind::DeviceInfo, device, 0);
    ev.size = total;
    ev.device_free = free;
    ev.flags |= F_DEVICE_FREE_KNOWN;
    push(&ev);
}

/// How many stream-ordered pools are remembered for sampling.
pub const POOL_SLOTS: usize = 8;
/// Pools that served allocations (0 = free slot) and their devices (-1 = not yet known).
static POOLS: [AtomicU64; POOL_SLOTS] = [const { AtomicU64::new(0) }; POOL_SLOTS];
static POOL_DEVICES: [AtomicI32; POOL_SLOTS] = [const { AtomicI32::new(-1) }; POOL_SLOTS];

/// Whether the shim samples pools on its own (`GPUFRAG_POOL_SAMPLES=0` turns it off; the
/// program's own reads of the attribute are recorded either way).
static POOL_SAMPLING: AtomicBool = AtomicBool::new(true);

/// Turns the shim's own pool samples on or off.
pub fn set_pool_sampling(on: bool) {
    POOL_SAMPLING.store(on, Ordering::Relaxed);
}

/// Remembers `pool` (of `device`) and samples it the first time it is seen. Lock-free: a
/// compare-and-swap claims a slot; with every slot taken the pool is sampled only when the
/// program reads its attribute.
fn note_pool(pool: u64, device: i16) {
    if pool == 0 {
        return;
    }
    for (i, slot) in POOLS.iter().enumerate() {
        match slot.load(Ordering::Relaxed) {
            p if p == pool => return,
            0 => match slot.compare_exchange(0, pool, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    POOL_DEVICES[i].store(i32::from(device), Ordering::Relaxed);
                    sample_pool(pool, Some(device));
                    return;
                }
                Err(p) if p == pool => return,
                Err(_) => continue,
            },
            _ => continue,
        }
    }
}

/// The device a remembered pool belongs to.
fn pool_device(pool: u64) -> Option<i16> {
    let i = POOLS.iter().position(|p| p.load(Ordering::Relaxed) == pool)?;
    i16::try_from(POOL_DEVICES[i].load(Ordering::Relaxed)).ok().filter(|&d| d >= 0)
}

/// Records a pool's reserved bytes as the driver reported them.
///
/// `ts` is a stamp taken *before* the read: another thread's allocation landing between the
/// stamp and the read is then ordered after the sample, and the consumer serves it from the
/// cache the sample already counts (stamped after the read, such an allocation would be ordered
/// before a sample that may not include it, and the pool's figure would come out short).
pub fn pool_reserved(ts: u64, pool: u64, reserved: u64, device: Option<i16>) {
    let device = device.or_else(|| pool_device(pool)).unwrap_or_else(current_device);
    let mut ev = event(ts, EventKind::PoolReserved, device, 0);
    ev.handle = pool;
    ev.size = reserved;
    push(&ev);
}

/// Reads `pool`'s `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` from the real driver and records it.
pub fn sample_pool(pool: u64, device: Option<i16>) {
    if !POOL_SAMPLING.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: CuMemPoolGetAttributeFn is cuMemPoolGetAttribute's C type.
    let Some(f) = (unsafe { table::real_fn::<CuMemPoolGetAttributeFn>(Sym::CuMemPoolGetAttribute) }) else { return };
    let mut reserved = 0u64;
    let ts = stamp();
    // SAFETY: the attribute is a cuuint64_t, written into `reserved`.
    let rc = unsafe { f(pool as CUmemoryPool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast()) };
    if rc == 0 {
        pool_reserved(ts, pool, reserved, device);
    }
}

/// Samples every remembered pool of `device` (every pool for `None`).
fn sample_pools(device: Option<i16>) {
    for (i, slot) in POOLS.iter().enumerate() {
        let pool = slot.load(Ordering::Relaxed);
        let d = i16::try_from(POOL_DEVICES[i].load(Ordering::Relaxed)).ok().filter(|&d| d >= 0);
        if pool != 0 && (device.is_none() || d.is_none() || d == device) {
            sample_pool(pool, d);
        }
    }
}

/// Samples device totals after a successful allocation when the device is new or the period
/// has passed (one relaxed load each in the common case; the period and `ts` are in stamps).
#[inline]
fn maybe_sample(ts: u64, device: i16) {
    let bit = if (0..64).contains(&device) { 1u64 << device } else { 0 };
    let first =
        bit != 0 && SAMPLED_DEVICES.load(Ordering::Relaxed) & bit == 0 && SAMPLED_DEVICES.fetch_or(bit, Ordering::Relaxed) & bit == 0;
    let interval = SAMPLE_INTERVAL.load(Ordering::Relaxed);
    let last = LAST_SAMPLE.load(Ordering::Relaxed);
    let due = interval != 0
        && ts.saturating_sub(last) >= interval
        && LAST_SAMPLE.compare_exchange(last, ts, Ordering::Relaxed, Ordering::Relaxed).is_ok();
    if first || due {
        if crate::clock::refine_rate() {
            update_sample_interval();
        }
        if let Some((free, total)) = measure() {
            LAST_SAMPLE.fetch_max(ts, Ordering::Relaxed);
            push_device_info(stamp(), device, free, total);
        }
        sample_pools(Some(device));
    }
}

/// One call's fields, as a wrapper knows them.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub kind: EventKind,
    pub rc: i32,
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub handle: u64,
    pub stream: u64,
    /// The return address of the outermost tracked call (see `caller`), 0 when not taken: a
    /// successful driver allocation carries it for the consumer to name its owner.
    pub caller: u64,
}

impl Call {
    /// A call of `kind` that returned `rc`, other fields 0.
    #[inline]
    pub fn new(kind: EventKind, rc: i32) -> Call {
        Call { kind, rc, addr: 0, size: 0, requested: 0, handle: 0, stream: 0, caller: 0 }
    }

    fn fill(&self, ev: &mut Event) {
        ev.addr = self.addr;
        ev.size = self.size;
        ev.requested = self.requested;
        ev.handle = self.handle;
        ev.stream = self.stream;
    }
}

/// Where an allocation's pool handle comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// Not a pool allocation, or the caller named the pool (in `Call::handle`).
    Given,
    /// `cuMemAllocAsync`: the device's current pool, looked up after the call (0 if unknown).
    CurrentOfDevice,
}

/// Records an allocation-like call (memory, reservation, physical handle, pool allocation):
/// on success the event and perhaps a device sample; on failure `AllocFailed` with the device
/// free bytes measured right then, followed by the `DeviceInfo` of that measurement.
pub fn alloc(mut c: Call, device: Option<i16>, pool: Pool) {
    let device = device.unwrap_or_else(current_device);
    announce_device(device);
    let ts = stamp();
    if pool == Pool::CurrentOfDevice {
        c.handle = current_pool(device);
    }
    if c.rc == 0 {
        let mut ev = event(ts, c.kind, device, 0);
        c.fill(&mut ev);
        // The caller rides in the field its kind leaves unused (`event::caller_address`).
        match c.kind {
            EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::MemAllocManaged => ev.handle = c.caller,
            EventKind::PhysCreate => ev.stream = c.caller,
            _ => {}
        }
        push(&ev);
        if c.kind == EventKind::PoolAlloc {
            note_pool(c.handle, device);
        }
        maybe_sample(ts, device);
        return;
    }
    let mut ev = event(ts, EventKind::AllocFailed, device, c.rc);
    ev.op = c.kind as u16;
    ev.requested = c.requested;
    ev.handle = c.handle;
    ev.stream = c.stream;
    let measured = measure();
    if let Some((free, _)) = measured {
        ev.device_free = free;
        ev.flags |= F_DEVICE_FREE_KNOWN;
    }
    push(&ev);
    if let Some((free, total)) = measured {
        LAST_SAMPLE.fetch_max(ts, Ordering::Relaxed);
        push_device_info(stamp(), device, free, total);
    }
    sample_pools(Some(device));
}

/// Records a release-like call (frees, unmaps, releases): device -1, the consumer resolves it
/// from the address or handle. A failed release is recorded with its `rc` (and `F_FAILED`) so
/// the consumer can tell it changed nothing.
pub fn release(c: Call) {
    let mut ev = event(stamp(), c.kind, -1, c.rc);
    c.fill(&mut ev);
    push(&ev);
}

/// Makes a release-like call (`real`) with its event stamped and pushed *before* the call, when
/// `record` (and the guard says this call is recorded).
///
/// Order matters across threads: the moment the real free returns, the driver may hand the same
/// address to another thread's allocation, which that thread records at once; recorded after
/// the call, this free could land behind that allocation and the consumer would free the new
/// one. Pushed first, it is published before the address can be reused, and the consumer's
/// timestamp merge of the lanes keeps it first.
///
/// If the call then fails, a second event of the same kind follows with the `rc` and
/// `F_FAILED`. The consumer ignores failed calls, so its state has already dropped the memory
/// the first event named: a known imprecision, for a call that fails only when the program
/// frees something it does not own (or the context is being torn down).
#[inline(always)]
pub fn release_around(guard: Option<Guard>, record: bool, c: Call, real: impl FnOnce() -> i32) -> i32 {
    // The guard (held whether or not this call is recorded) keeps the driver calls the real
    // function makes from being recorded as the program's own.
    let g = guard.as_ref().filter(|_| record);
    if let Some(g) = g {
        g.record(|| release(Call { rc: 0, ..c }));
    }
    let rc = real();
    if rc != 0 {
        if let Some(g) = g {
            g.record(|| release(Call { rc, ..c }));
        }
    }
    drop(guard);
    rc
}

/// Records any other call (`cuMemMap`, `cuMemPoolTrimTo`) on the current device.
pub fn other(c: Call) {
    let mut ev = event(stamp(), c.kind, current_device(), c.rc);
    c.fill(&mut ev);
    push(&ev);
}

/// Records a framework annotation (`annotate`) on `device`, with extra `flags`, the device free
/// bytes the framework measured, and for a failure the kind of request that failed.
pub fn annotation(c: Call, device: i16, flags: u32, device_free: u64, failed_op: Option<EventKind>) {
    let mut ev = event(stamp(), c.kind, device, c.rc);
    c.fill(&mut ev);
    ev.flags |= flags;
    ev.device_free = device_free;
    if let Some(op) = failed_op {
        ev.op = op as u16;
    }
    push(&ev);
}

/// Records device totals the program itself asked for (`cuMemGetInfo`, `cudaMemGetInfo`).
pub fn device_info(free: u64, total: u64) {
    let ts = stamp();
    LAST_SAMPLE.fetch_max(ts, Ordering::Relaxed);
    push_device_info(ts, current_device(), free, total);
}

/// Pushes `ProcessExit` when the process image ends normally (from the shim's destructor); an
/// EOF without it means `exec`, `_exit` or a crash.
pub fn process_exit() {
    if state::ring().is_some() && state::active() {
        // The driver may already be torn down: then the attribute read fails and nothing is sent.
        sample_pools(None);
        push(&event(stamp(), EventKind::ProcessExit, -1, 0));
    }
}

/// Reads a wrapper's out-parameter: 0 for a null pointer.
///
/// # Safety
/// `p` must be null or valid for a read of `T` (the real call succeeded and wrote it).
#[inline]
pub unsafe fn out<T: Copy + Default>(p: *const T) -> T {
    if p.is_null() {
        T::default()
    } else {
        // SAFETY: non-null and valid per the caller's contract.
        unsafe { p.read() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inlined lookup (thread pointer + the offset measured once) finds the same state as
    /// thread.c's own initial-exec access, in every thread, and each thread's is its own.
    #[test]
    fn every_thread_finds_its_own_state_from_the_thread_pointer() {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(9));
        let check = |barrier: std::sync::Arc<std::sync::Barrier>| {
            // SAFETY: thread.c's accessor, always valid.
            let c = unsafe { gpufrag_thread() } as usize;
            assert_eq!(this_thread() as *const ThreadState as usize, c);
            assert_ne!(TLS_OFFSET.load(Ordering::Relaxed), 0, "the offset is known after a lookup");
            assert_eq!(this_thread() as *const ThreadState as usize, c);
            // Every thread alive at once, so that no state's memory is reused by a later thread.
            barrier.wait();
            c
        };
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let b = std::sync::Arc::clone(&barrier);
                std::thread::spawn(move || check(b))
            })
            .collect();
        let mine = check(barrier);
        let mut all: Vec<usize> = threads.into_iter().map(|t| t.join().expect("thread")).collect();
        all.push(mine);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 9, "each thread has a state of its own");
    }
}
