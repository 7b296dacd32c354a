//! The one event that every capture source produces and everything downstream consumes.
//!
//! `Event` is a fixed-size `#[repr(C)]` record mirrored field for field by
//! `include/gpufrag_event.h`, the header that the eBPF programs and the preload shim include;
//! `tests/event_layout.rs` compiles that header and fails if the size or any offset differs.
//! A kind is stored as a `u16` so that a record from a newer or broken source never becomes an
//! invalid Rust enum: [`Event::kind`] decodes it and says when it cannot.

use core::fmt;

/// What happened. The numbering is the wire format: never renumber, only append.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// `cuMemAlloc` / `cudaMalloc`: a driver segment at `addr` of `size` bytes.
    MemAlloc = 1,
    /// `cuMemAllocPitch` / `cudaMallocPitch` / `cudaMalloc3D`: `size` = pitch × height (× depth).
    MemAllocPitch = 2,
    /// `cuMemAllocManaged` / `cudaMallocManaged`.
    MemAllocManaged = 3,
    /// `cuMemFree` / `cudaFree` of `addr`.
    MemFree = 4,
    /// `cuMemAddressReserve`: a virtual range, no memory behind it yet.
    AddressReserve = 5,
    /// `cuMemAddressFree` of the range at `addr`.
    AddressFree = 6,
    /// `cuMemCreate`: physical memory `handle` of `size` bytes.
    PhysCreate = 7,
    /// `cuMemRelease` of `handle`.
    PhysRelease = 8,
    /// `cuMemMap`: `size` bytes of `handle` (from offset `requested`) at `addr`.
    Map = 9,
    /// `cuMemUnmap` of `[addr, addr + size)`.
    Unmap = 10,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`: `addr`, `size`, pool in `handle`.
    PoolAlloc = 11,
    /// `cuMemFreeAsync` of `addr`: the bytes stay in the pool until trimmed.
    PoolFree = 12,
    /// `cuMemPoolTrimTo(handle, size)`.
    PoolTrim = 13,
    /// A framework (caching allocator) block at `addr`; `requested` = the size asked for.
    BlockAlloc = 14,
    /// A framework block at `addr` freed (returned to the cache, not to the driver).
    BlockFree = 15,
    /// An allocation that failed: `requested`, `rc`, `op` (the kind that failed), device free if
    /// known; with [`F_ALLOWED_KNOWN`], `size` = the allocator's allowed bytes; with
    /// [`F_ALLOCATOR_OOM`], `handle` = the allocator's own reserved bytes.
    AllocFailed = 16,
    /// Device totals: `size` = total bytes, `device_free` = free bytes.
    DeviceInfo = 17,
    /// A traced process started or exec'd.
    ProcessExec = 18,
    /// A traced process ended.
    ProcessExit = 19,
    /// The source lost `size` events before this one.
    Dropped = 20,
    /// A stream-ordered pool's reserved bytes as the driver reports them (`handle` = pool).
    PoolReserved = 21,
    /// A caching allocator claims the segment or mapped range holding `addr`: its free space is
    /// cache from now on, stranded or releasable. With `addr` 0: a caching allocator manages the
    /// process's memory on `device` (its failed driver calls are retries, not final OOMs).
    Adopt = 22,
    /// The end of a record file (never on a ring): its writer stopped cleanly here. `ts_ns` is
    /// when, `size` the events written before it. A record without one was cut (the writer was
    /// killed or its disk filled) and is never called exact.
    RecordEnd = 23,
    /// A process's caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax) in the event's
    /// text: those it started with (its environment at exec), and each later change
    /// (`torch.cuda.memory._set_allocator_settings`: the keys given replace those keys). Blocks
    /// whose events carry only the requested size are sized by them from here on.
    AllocSettings = 24,
    /// `torch.cuda.set_per_process_memory_fraction` on `device`: `size` = the allowed bytes
    /// (fraction × the device's total), the text the fraction as set.
    MemoryFraction = 25,
    /// The framework managing a process's memory: its allocator in `flags` (as a block's), its
    /// name and version in the text.
    FrameworkInfo = 26,
    /// A framework's own figures at its OOM on `device` (XLA's `memory_stats()` read right after
    /// the failure): `size` = pool bytes, `requested` = bytes in use, `handle` = largest free
    /// chunk; they are the figures of the process's latest OOM there.
    FrameworkFigures = 27,
    /// gpufrag's own prediction of a process's coming peak on `device` (`crate::foresight`, made
    /// after a step of its requests): `size` = the predicted peak reserved bytes, `requested` =
    /// the bytes it may hold (device free + what it holds, or its cap), `handle` = how many steps
    /// ahead a step does not fit (0: every step simulated fits), `addr` = the steps simulated,
    /// `requested`'s source in `op` (1: its cap); a warning's text is the setting that would fit.
    /// Recorded like any event, so that a record replays to the warnings the live run gave.
    Forecast = 28,
    /// The driver's UUID of CUDA ordinal `device` in this process (`cuDeviceGetUuid`, asked once
    /// per ordinal before its first allocation is recorded): the 16 bytes in `addr` (bytes 0..8,
    /// big-endian) and `size` (bytes 8..16). The GPU a process's memory is on, whatever its
    /// environment said when it started.
    DeviceUuid = 32,
    /// A legacy CUDA IPC export (`cuIpcGetMemHandle` / `cudaIpcGetMemHandle`) of the allocation holding `addr`; `rc` is the call's result. Memory of expandable segments (VMM) cannot be exported this way.
    IpcExport = 40,
}

impl EventKind {
    /// Every kind, in wire order.
    pub const ALL: [EventKind; 30] = [
        EventKind::MemAlloc,
        EventKind::MemAllocPitch,
        EventKind::MemAllocManaged,
        EventKind::MemFree,
        EventKind::AddressReserve,
        EventKind::AddressFree,
        EventKind::PhysCreate,
        EventKind::PhysRelease,
        EventKind::Map,
        EventKind::Unmap,
        EventKind::PoolAlloc,
        EventKind::PoolFree,
        EventKind::PoolTrim,
        EventKind::BlockAlloc,
        EventKind::BlockFree,
        EventKind::AllocFailed,
        EventKind::DeviceInfo,
        EventKind::ProcessExec,
        EventKind::ProcessExit,
        EventKind::Dropped,
        EventKind::PoolReserved,
        EventKind::Adopt,
        EventKind::RecordEnd,
        EventKind::AllocSettings,
        EventKind::MemoryFraction,
        EventKind::FrameworkInfo,
        EventKind::FrameworkFigures,
        EventKind::Forecast,
        EventKind::DeviceUuid,
        EventKind::IpcExport,
    ];

    /// Decodes a wire value; `None` for 0 and for values this build does not know.
    pub fn from_u16(v: u16) -> Option<EventKind> {
        BY_WIRE_VALUE.get(v as usize).copied().flatten()
    }

    /// A fact about a process (its settings, memory fraction, framework, its framework's OOM
    /// figures, gpufrag's forecast of its peak), not a memory operation.
    pub fn is_fact(self) -> bool {
        matches!(
            self,
            EventKind::AllocSettings
                | EventKind::MemoryFraction
                | EventKind::FrameworkInfo
                | EventKind::FrameworkFigures
                | EventKind::Forecast
        )
    }

    /// The snake-case name used in JSON and on screen.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::MemAlloc => "mem_alloc",
            EventKind::MemAllocPitch => "mem_alloc_pitch",
            EventKind::MemAllocManaged => "mem_alloc_managed",
            EventKind::MemFree => "mem_free",
            EventKind::AddressReserve => "address_reserve",
            EventKind::AddressFree => "address_free",
            EventKind::PhysCreate => "phys_create",
            EventKind::PhysRelease => "phys_release",
            EventKind::Map => "map",
            EventKind::Unmap => "unmap",
            EventKind::PoolAlloc => "pool_alloc",
            EventKind::PoolFree => "pool_free",
            EventKind::PoolTrim => "pool_trim",
            EventKind::BlockAlloc => "block_alloc",
            EventKind::BlockFree => "block_free",
            EventKind::AllocFailed => "alloc_failed",
            EventKind::DeviceInfo => "device_info",
            EventKind::ProcessExec => "process_exec",
            EventKind::ProcessExit => "process_exit",
            EventKind::Dropped => "dropped",
            EventKind::PoolReserved => "pool_reserved",
            EventKind::Adopt => "adopt",
            EventKind::RecordEnd => "record_end",
            EventKind::AllocSettings => "alloc_settings",
            EventKind::MemoryFraction => "memory_fraction",
            EventKind::FrameworkInfo => "framework_info",
            EventKind::FrameworkFigures => "framework_figures",
            EventKind::Forecast => "forecast",
            EventKind::DeviceUuid => "device_uuid",
            EventKind::IpcExport => "ipc_export",
        }
    }
}

/// The largest wire value a kind may take (the decoding table's size less one).
const MAX_KIND: usize = 127;

/// Every kind at its wire value (values need not be contiguous: a number once given is never
/// reused, so a kind may be retired and leave a gap).
const BY_WIRE_VALUE: [Option<EventKind>; MAX_KIND + 1] = {
    let mut t = [None; MAX_KIND + 1];
    let mut i = 0;
    while i < EventKind::ALL.len() {
        let k = EventKind::ALL[i];
        assert!((k as usize) <= MAX_KIND && t[k as usize].is_none(), "kinds' wire values are unique and at most MAX_KIND");
        t[k as usize] = Some(k);
        i += 1;
    }
    t
};

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `device_free` holds a measured value.
pub const F_DEVICE_FREE_KNOWN: u32 = 1 << 0;
/// Produced by the LD_PRELOAD shim.
pub const F_SRC_SHIM: u32 = 1 << 1;
/// Produced by eBPF uprobes.
pub const F_SRC_EBPF: u32 = 1 << 2;
/// Imported from a PyTorch snapshot.
pub const F_SRC_SNAPSHOT: u32 = 1 << 3;
/// Produced by a USDT probe.
pub const F_SRC_USDT: u32 = 1 << 4;
/// A block event's `size` is the block's real extent (no allocator rules needed).
pub const F_BLOCK_SIZE_KNOWN: u32 = 1 << 5;

/// Whether a block event with these flags was found by comparing periodic snapshots of the
/// allocator (the Python hook without PyTorch's trace tracker: [`F_SRC_SNAPSHOT`] with its
/// extent, [`F_BLOCK_SIZE_KNOWN`]): every block that lived between two snapshots is missing, so
/// such events cannot drive a simulation of the allocator (whatif, foresight). The tracker's, the
/// probes' and the annotations' blocks come one event per request, their size often known too:
/// those are not sampled.
pub const fn sampled_block(flags: u32) -> bool {
    flags & F_SRC_SNAPSHOT != 0 && flags & F_BLOCK_SIZE_KNOWN != 0
}
/// The call returned a non-zero code.
pub const F_FAILED: u32 = 1 << 6;
/// A segment or mapping made by a framework's caching allocator (its free space is cache, not in use).
pub const F_FRAMEWORK_OWNED: u32 = 1 << 7;
/// A block or adopt event of XLA's BFC allocator (JAX, TensorFlow); with neither this nor
/// [`F_ALLOC_CUPY`], PyTorch's caching allocator.
pub const F_ALLOC_XLA_BFC: u32 = 1 << 8;
/// A block or adopt event of CuPy's memory pool.
pub const F_ALLOC_CUPY: u32 = 1 << 9;
/// A `DeviceInfo` that NVML gave (not the process's own `cuMemGetInfo`); with a non-zero `pid`, a
/// read made for that process's failed allocation while it was still alive.
pub const F_SRC_NVML: u32 = 1 << 10;
/// A `ProcessExit` from the eBPF probes whose `addr` and `size` hold the process's command name
/// (the kernel's 16-byte `comm`, NUL-padded): the name of a process gone before `/proc` was read.
pub const F_COMM: u32 = 1 << 11;
/// An `AllocFailed` that PyTorch's caching allocator reported from its own out-of-memory path
/// (`c10::reportOutOfMemoryToProfiler`, probed by eBPF) in a capture that also traces the
/// process's driver calls: with no failed driver call before it, the allocator refused the
/// request itself (a memory fraction's allowed bytes). `handle`, when non-zero, is
/// PyTorch's own reserved bytes at the failure.
pub const F_ALLOCATOR_OOM: u32 = 1 << 12;
/// An `AllocFailed` whose `size` is the allocator's allowed bytes
/// (`set_per_process_memory_fraction`: fraction × the device total), exactly as PyTorch's OOM
/// observer received them.
pub const F_ALLOWED_KNOWN: u32 = 1 << 13;
/// An `AllocFailed` that is no failure of its own: it gives its allowed bytes (`size`, with
/// [`F_ALLOWED_KNOWN`]) to its process's latest allocator OOM on its device (the trace tracker's
/// OOM entry, which cannot carry them), or to the next one when it comes first.
pub const F_OOM_AMEND: u32 = 1 << 14;
/// A `ProcessExec` saying the process's trace is partial: it was first seen after its start
/// (attached mid-run), or probes it used came in after it had started (an exec hold released by
/// its timeout, annotations found late), so what it allocated before (segments or blocks) is
/// missing. Its OOMs are `inconclusive`, never `true_oom` or `fragmentation`. A `ProcessExec`
/// without it is a process traced from its start.
pub const F_PARTIAL: u32 = 1 << 15;
/// A driver allocation (`MemAlloc*`, `PhysCreate`) whose `op` is the [`Owner`](crate::owner::Owner)
/// that took it: the library whose code made the outermost tracked call, resolved by the
/// consumer from the caller's return address (the shim's raw address rides in `handle` of a
/// `MemAlloc*`, `stream` of a `PhysCreate`, see [`caller_address`]).
pub const F_OWNER_KNOWN: u32 = 1 << 20;

/// The caller's return address the shim put in a driver allocation's event (0: none); the field
/// depends on the kind, one the kind leaves unused.
pub fn caller_address(e: &Event) -> u64 {
    match e.kind() {
        Some(EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::MemAllocManaged) => e.handle,
        Some(EventKind::PhysCreate) => e.stream,
        _ => 0,
    }
}

/// Bits 16–19 of a block, adopt or allocator `AllocFailed` event: an allocator named by its place
/// in gpufrag's allocator table (`REGISTRY` in src/alloc/mod.rs, places 1 to 15); 0 = none. gpufrag's
/// own sources write it for the allocators registered after the ones with a bit of their own
/// ([`F_ALLOC_XLA_BFC`], [`F_ALLOC_CUPY`]); the annotation header's allocator ids
/// (`GPUFRAG_ALLOCATOR_*` in include/gpufrag_annotate.h) are these places, so an annotation may
/// name those two here too. That table is append-only for this reason.
pub const F_ALLOC_ID_SHIFT: u32 = 16;
/// The mask of the allocator field ([`F_ALLOC_ID_SHIFT`]).
pub const F_ALLOC_ID_MASK: u32 = 0xF << F_ALLOC_ID_SHIFT;

/// The allocator field ([`F_ALLOC_ID_MASK`]) for an annotation's allocator id (the last argument
/// of include/gpufrag_annotate.h's `_by` calls and USDT probes): the id in bits 16–19, or 0 (the
/// default allocator) for an id outside 1–15. The BPF program writes the same
/// (`allocator_field` in bpf/gpufrag.bpf.c).
pub fn allocator_field(id: i64) -> u32 {
    if (1..=15).contains(&id) {
        (id as u32) << F_ALLOC_ID_SHIFT
    } else {
        0
    }
}

/// The wire record: 80 bytes, little-endian on every platform gpufrag runs on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Nanoseconds: `CLOCK_MONOTONIC` for live capture, the trace's own clock for imports.
    pub ts_ns: u64,
    /// Device address, 0 when none.
    pub addr: u64,
    /// Bytes; see each [`EventKind`].
    pub size: u64,
    /// The size the caller asked for; for [`EventKind::Map`], the offset into the handle.
    pub requested: u64,
    /// A `CUmemGenericAllocationHandle` or a `CUmemoryPool`.
    pub handle: u64,
    /// The `CUstream`, 0 for the legacy default stream.
    pub stream: u64,
    /// Bytes free on the device when known (see [`F_DEVICE_FREE_KNOWN`]).
    pub device_free: u64,
    /// Process id (the thread group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// An [`EventKind`] as its wire value.
    pub kind: u16,
    /// CUDA device ordinal; -1 when unknown.
    pub device: i16,
    /// `CUresult` / `cudaError_t` of the call; 0 on success.
    pub rc: i32,
    /// `F_*` bits.
    pub flags: u32,
    /// For [`EventKind::AllocFailed`]: the kind of the call that failed; for a driver allocation
    /// with [`F_OWNER_KNOWN`], its [`Owner`](crate::owner::Owner).
    pub op: u16,
    /// Bytes of text that belong to this event (a setting's string, a library's path, a
    /// framework's message), 0 for most events. The text is never inside the event: a record
    /// file stores it right after it ([`text_records`] whole records, zero-padded), and a live
    /// source hands it over beside the event. Always 0 on a ring (the consumer clears it).
    pub text_len: u16,
}

/// How many 80-byte records the `text_len` bytes of text after an event take in a record file.
pub fn text_records(text_len: u16) -> usize {
    (text_len as usize).div_ceil(EVENT_SIZE)
}

/// Size of one record on the wire.
pub const EVENT_SIZE: usize = std::mem::size_of::<Event>();
const _: () = assert!(EVENT_SIZE == 80);

impl Event {
    /// A zeroed event of `kind` for `pid` on `device`.
    pub fn new(kind: EventKind, pid: u32, device: i16) -> Event {
        Event { kind: kind as u16, pid, device, ..Event::default() }
    }

    /// The decoded kind, `None` when the wire value is unknown.
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_u16(self.kind)
    }

    /// The kind of call that failed, for [`EventKind::AllocFailed`].
    pub fn failed_op(&self) -> Option<EventKind> {
        EventKind::from_u16(self.op)
    }

    /// Device free bytes when the source measured them.
    pub fn device_free(&self) -> Option<u64> {
        (self.flags & F_DEVICE_FREE_KNOWN != 0).then_some(self.device_free)
    }

    /// The command name a [`F_COMM`] event carries in `addr` and `size`; `None` without the flag
    /// or when it is empty.
    pub fn comm(&self) -> Option<String> {
        if self.flags & F_COMM == 0 {
            return None;
        }
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..].copy_from_slice(&self.size.to_le_bytes());
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let name = String::from_utf8_lossy(&b[..end]).into_owned();
        (!name.is_empty()).then_some(name)
    }

    /// The owner of a driver allocation, when the consumer resolved it.
    pub fn owner(&self) -> Option<crate::owner::Owner> {
        (self.flags & F_OWNER_KNOWN != 0).then(|| crate::owner::Owner::from_u16(self.op)).flatten()
    }

    /// The record as its 80 wire bytes.
    pub fn to_bytes(&self) -> [u8; EVENT_SIZE] {
        let mut b = [0u8; EVENT_SIZE];
        let mut o = 0;
        for v in [self.ts_ns, self.addr, self.size, self.requested, self.handle, self.stream, self.device_free] {
            b[o..o + 8].copy_from_slice(&v.to_le_bytes());
            o += 8;
        }
        b[56..60].copy_from_slice(&self.pid.to_le_bytes());
        b[60..64].copy_from_slice(&self.tid.to_le_bytes());
        b[64..66].copy_from_slice(&self.kind.to_le_bytes());
        b[66..68].copy_from_slice(&self.device.to_le_bytes());
        b[68..72].copy_from_slice(&self.rc.to_le_bytes());
        b[72..76].copy_from_slice(&self.flags.to_le_bytes());
        b[76..78].copy_from_slice(&self.op.to_le_bytes());
        b[78..80].copy_from_slice(&self.text_len.to_le_bytes());
        b
    }

    /// Decodes 80 wire bytes (any alignment).
    pub fn from_bytes(b: &[u8; EVENT_SIZE]) -> Event {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap_or([0; 2]));
        Event {
            ts_ns: u64_at(0),
            addr: u64_at(8),
            size: u64_at(16),
            requested: u64_at(24),
            handle: u64_at(32),
            stream: u64_at(40),
            device_free: u64_at(48),
            pid: u32_at(56),
            tid: u32_at(60),
            kind: u16_at(64),
            device: u16_at(66) as i16,
            rc: u32_at(68) as i32,
            flags: u32_at(72),
            op: u16_at(76),
            text_len: u16_at(78),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_annotations_allocator_id_lands_in_bits_16_to_19_and_a_bad_one_is_the_default() {
        for id in 1..=15i64 {
            let f = allocator_field(id);
            assert_eq!(((f & F_ALLOC_ID_MASK) >> F_ALLOC_ID_SHIFT, f & !F_ALLOC_ID_MASK), (id as u32, 0), "id {id}: {f:#x}");
        }
        for id in [0, -1, 16, 255, i64::MIN, i64::MAX, 1 << 32 | 3] {
            assert_eq!(allocator_field(id), 0, "id {id}");
        }
    }

    #[test]
    fn kinds_round_trip_and_unknown_values_decode_to_none() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u16(k as u16), Some(k));
        }
        assert_eq!(EventKind::from_u16(0), None);
        assert_eq!(EventKind::from_u16(EventKind::ALL.len() as u16 + 1), None);
        assert_eq!(EventKind::from_u16(MAX_KIND as u16 + 1), None);
        assert_eq!(EventKind::from_u16(u16::MAX), None);
    }

    #[test]
    fn bytes_round_trip_every_field() {
        let e = Event {
            ts_ns: 1,
            addr: 0x7f00_0000_0000,
            size: 3,
            requested: 4,
            handle: 5,
            stream: 6,
            device_free: 7,
            pid: 8,
            tid: 9,
            kind: EventKind::AllocFailed as u16,
            device: -1,
            rc: -2,
            flags: F_DEVICE_FREE_KNOWN | F_FAILED,
            op: EventKind::MemAlloc as u16,
            text_len: 0,
        };
        assert_eq!(Event::from_bytes(&e.to_bytes()), e);
        assert_eq!(e.device_free(), Some(7));
        assert_eq!(e.failed_op(), Some(EventKind::MemAlloc));
    }
}
