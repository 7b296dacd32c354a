//! The live state: every event, from any source, applied to the address map of its
//! (process, device), plus device totals, OOM records and the bookkeeping that says whether the
//! figures are exact.
//!
//! [`State::apply`] is the one entry point; it never fails. What the map cannot square with what
//! it knows (a free of an unknown address, a block outside every segment, events the source
//! dropped) is counted, the first few are kept with their event index for the user, and the
//! figures are then reported as inexact.
//!
//! The device free of a failure. An OOM verdict needs what the device had free at the moment
//! of the failure, and a process that dies of its OOM gives its memory back within ~100 ms
//! (measured on the H200), so a reading taken later is wrong. An OOM record takes, in order:
//! the figure its own event carries (the shim reads `cuMemGetInfo` in the process right after the
//! failed call; PyTorch's observer and the annotation API pass the allocator's own figure); else
//! the failing process's own latest `cuMemGetInfo`/`cudaMemGetInfo` reading on that device within
//! [`READING_WINDOW_NS`] of the failure, before or after it (PyTorch reads it while building its
//! message), while the process's traced bytes there are what they were at the failure; else an
//! NVML read that the capture made for this failure while the process was alive (a `DeviceInfo`
//! with the process's pid and [`F_SRC_NVML`]). Each record says which ([`DeviceFreeSource`]) and
//! how far from the failure the reading was. Readings that arrive after the failure complete the
//! record when applied, so a replay of the same events gives the same record.
//!
//! The state's size distributions (allocation sizes as events arrive, free-run sizes at a
//! summary) live beside it in [`histogram`].

mod failure;
pub mod fix;
pub mod forecasts;
pub mod gpus;
pub mod histogram;
pub mod holders;
pub mod oom_rule;
pub mod owners;
pub mod partial;
mod seed;
pub mod settings;

pub use oom_rule::{OomOutcome, OOM_HOLD_NS};
pub use partial::Partial;

use crate::alloc::pytorch::AllocatorRules;
use crate::alloc::Framework;
use crate::event::{
    Event, EventKind, F_ALLOC_XLA_BFC, F_BLOCK_SIZE_KNOWN, F_FAILED, F_FRAMEWORK_OWNED, F_OOM_AMEND, F_SRC_EBPF, F_SRC_NVML, F_SRC_SHIM,
};
use crate::map::{AddressSpace, Anomaly, Figures, SegmentKind};
use histogram::SizeStats;
use std::collections::BTreeMap;

/// How many exit times [`State::exited`] keeps (the most recent).
pub const EXITED_KEPT: usize = 4096;

/// How much of a process's device memory a live trace accounts for (eBPF capture, which may
/// attach to a process mid-run): what the trace holds beside what NVML says the process uses.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Coverage {
    /// Process.
    pub pid: u32,
    /// Start time (clock ticks after boot).
    pub start_time: u64,
    /// Executable name.
    pub name: String,
    /// Device.
    pub device: i16,
    /// Bytes the trace holds for it (reserved plus created-but-unmapped physical memory).
    pub traced: u64,
    /// NVML's used bytes for it, when NVML answered.
    pub nvml_used: Option<u64>,
    /// `nvml_used − traced`: memory it held that the trace cannot place (allocated before
    /// attaching, or the driver's own context memory).
    pub unattributed: Option<u64>,
    /// Traced from its start.
    pub exact: bool,
}

/// How many anomalies are kept verbatim (all are counted).
pub const KEPT_ANOMALIES: usize = 20;

/// The most (process, device) address maps a state holds: far above any node's GPU processes
/// (the eBPF path forgets processes that end), and a bound on what a record file of many
/// processes can make this take (a few KB each). Events of further ones are an anomaly.
pub const MAX_SPACES: usize = 65_536;

/// A process's map on one device, with its counters.
#[derive(Clone, Debug)]
pub struct ProcessDevice {
    /// Process id.
    pub pid: u32,
    /// CUDA ordinal.
    pub device: i16,
    /// The address map.
    pub map: AddressSpace,
    /// Sizes of framework blocks allocated, bytes.
    pub block_sizes: SizeStats,
    /// Sizes of segments allocated (driver, mapped, pool), bytes.
    pub segment_sizes: SizeStats,
    /// Successful allocations seen.
    pub allocs: u64,
    /// Frees seen.
    pub frees: u64,
    /// The caching allocator whose blocks (or adoption) were seen first; `None`: segments only.
    pub framework: Option<Framework>,
    /// Its live driver bytes by the library that took them (issue 25, item 3).
    pub owners: owners::OwnerBytes,
}

impl ProcessDevice {
    fn new(pid: u32, device: i16, rules: AllocatorRules) -> ProcessDevice {
        ProcessDevice {
            pid,
            device,
            map: AddressSpace::new(rules),
            block_sizes: SizeStats::default(),
            segment_sizes: SizeStats::default(),
            allocs: 0,
            frees: 0,
            framework: None,
            owners: owners::OwnerBytes::default(),
        }
    }

    /// Applies one memory event to the map, and counts the frees, block allocations and block
    /// sizes it makes; a kind that changes no map is [`Anomaly::NotAMapEvent`].
    fn apply_map_event(&mut self, ev: &Event, kind: EventKind, framework: bool) -> Result<(), Anomaly> {
        let m = &mut self.map;
        let r = match kind {
            EventKind::MemAlloc => m.driver_alloc(ev.addr, ev.size, SegmentKind::Driver, framework, ev.stream),
            EventKind::MemAllocPitch => m.driver_alloc(ev.addr, ev.size, SegmentKind::Pitch, framework, ev.stream),
            EventKind::MemAllocManaged => m.driver_alloc(ev.addr, ev.size, SegmentKind::Managed, framework, ev.stream),
            EventKind::MemFree | EventKind::PoolFree => {
                self.frees += 1;
                m.driver_free(ev.addr)
            }
            EventKind::AddressReserve => m.reserve(ev.addr, ev.size),
            EventKind::AddressFree => m.reserve_free(ev.addr),
            EventKind::PhysCreate => {
                m.phys_create(ev.handle, ev.size);
                Ok(())
            }
            EventKind::PhysRelease => m.phys_release(ev.handle),
            // A captured map is one driver call (unmapped only whole); a snapshot's map
            // entry, or a rebuilt one, may be many.
            EventKind::Map if ev.flags & (F_SRC_SHIM | F_SRC_EBPF) == 0 => m.map_pages(ev.addr, ev.size, framework),
            EventKind::Map => m.map(ev.addr, ev.size, framework),
            EventKind::Unmap => m.unmap(ev.addr, ev.size),
            EventKind::PoolAlloc => m.pool_alloc(ev.addr, ev.size, ev.handle, ev.stream),
            EventKind::PoolTrim => {
                m.pool_trim(ev.handle, ev.size);
                Ok(())
            }
            EventKind::PoolReserved => {
                m.pool_reserved(ev.handle, ev.size);
                Ok(())
            }
            EventKind::BlockAlloc => {
                let known = (ev.flags & F_BLOCK_SIZE_KNOWN != 0).then_some(ev.size);
                let framework = Framework::from_flags(ev.flags);
                self.framework.get_or_insert(framework);
                m.block_alloc_by(ev.addr, ev.requested, known, framework).map(|size| {
                    self.allocs += 1;
                    self.block_sizes.record(size);
                })
            }
            EventKind::Adopt if ev.addr == 0 => {
                self.framework.get_or_insert(Framework::from_flags(ev.flags));
                m.note_framework();
                Ok(())
            }
            EventKind::Adopt => m.adopt_at(ev.addr),
            EventKind::BlockFree => {
                self.frees += 1;
                m.block_free(ev.addr).map(|_| ())
            }
            _ => Err(Anomaly::NotAMapEvent(ev.kind)),
        };
        m.debug_check();
        r
    }
}

/// How close to a failure (before or after it) a reading of device free must be to stand for
/// the failure's moment.
pub const READING_WINDOW_NS: u64 = 100_000_000;

/// Where an OOM record's device free came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceFreeSource {
    /// The failure's own event carried it (the shim's reading right after the failed call,
    /// PyTorch's figure, the annotation API's figure).
    FailureEvent,
    /// The failing process's own `cuMemGetInfo`/`cudaMemGetInfo` reading near the failure.
    ProcessReading,
    /// An NVML read made for this failure while the process was still alive.
    NvmlAtFailure,
    /// Not measured: the verdict cannot weigh device free.
    NotMeasured,
}

impl DeviceFreeSource {
    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            DeviceFreeSource::FailureEvent => "failure_event",
            DeviceFreeSource::ProcessReading => "process_reading",
            DeviceFreeSource::NvmlAtFailure => "nvml_at_failure",
            DeviceFreeSource::NotMeasured => "not_measured",
        }
    }
}

/// A process's latest own reading of device free on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reading {
    ts_ns: u64,
    free: u64,
    /// The device total the driver gave with it (CUDA's total: NVML's less the driver's reserve).
    total: u64,
    /// The process's traced bytes on the device when it read.
    traced: u64,
}

/// A failed allocation with the state of its address space at that moment.
#[derive(Clone, Debug, PartialEq)]
pub struct OomRecord {
    /// Event timestamp.
    pub ts_ns: u64,
    /// Process.
    pub pid: u32,
    /// Device.
    pub device: i16,
    /// Bytes requested.
    pub requested: u64,
    /// Return code of the failed call.
    pub rc: i32,
    /// What kind of call failed.
    pub op: Option<EventKind>,
    /// Device free bytes at the failure, if measured (see [`DeviceFreeSource`]).
    pub device_free: Option<u64>,
    /// Where `device_free` came from.
    pub device_free_source: DeviceFreeSource,
    /// Failure time minus reading time, ns, for a reading before the failure; 0 for the
    /// failure's own figure and for a reading after it (see `device_free_after_ns`); never
    /// negative; `None` when not measured.
    pub device_free_age_ns: Option<i64>,
    /// For a reading taken after the failure (NVML read when the failure woke the tracer, the
    /// process's own read while building its error message): how long after, ns.
    pub device_free_after_ns: Option<u64>,
    /// The process's figures on that device at that moment.
    pub figures: Figures,
    /// The caching allocator whose request failed (a block allocation), or the one managing the
    /// process's memory (a driver call); `None` when none was seen.
    pub framework: Option<Framework>,
    /// The allocator's allowed bytes (`set_per_process_memory_fraction`), when its OOM report
    /// carried them ([`crate::event::F_ALLOWED_KNOWN`]: PyTorch's OOM observer under `run`).
    pub allowed: Option<u64>,
    /// PyTorch's own out-of-memory path reported this failure in a capture that traces the
    /// process's driver calls ([`crate::event::F_ALLOCATOR_OOM`]).
    pub allocator_oom: bool,
    /// The allocator's own reserved bytes at the failure, when its report carried them.
    pub allocator_reserved: Option<u64>,
    /// Failed driver allocations of this process on this device since its last successful
    /// driver allocation or its last allocator OOM: 0 for an allocator OOM means the allocator
    /// refused without asking the driver.
    pub driver_failures_before: u64,
    /// The device's total bytes as last measured before the failure (`cuMemGetInfo` or NVML).
    pub device_total: Option<u64>,
    /// Who else held the device at that moment and the sharing layer's limit
    /// (`crate::ingest::holders`, `crate::limits`).
    pub shared: crate::ingest::holders::Shared,
    /// What the failure turned out to be ([`oom_rule`]): the one rule every output reads.
    pub outcome: OomOutcome,
    /// What was missing from the process's trace at the failure ([`partial`]): the verdict is
    /// then `inconclusive`.
    pub partial: Option<Partial>,
    /// The failure's index in the stream of applied events (a record's event index: the live
    /// pipeline records every event it applies, in order): where the computed fix's simulation
    /// ends (`crate::sim::FixInput::cut`).
    pub event: u64,
    /// The failing thread.
    pub tid: u32,
}

/// One instance of XLA's BFC allocator, as its chunks showed it (`State::bfc_instances`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfcInstance {
    /// Its first chunk lay in a traced device segment: its chunks are the device pool's blocks.
    pub device_pool: bool,
    /// Chunk allocations seen.
    pub chunks: u64,
    /// Lowest chunk address seen.
    pub lo: u64,
    /// Highest chunk address seen.
    pub hi: u64,
}

/// Most BFC instances filed per trace; chunks of further instances are filed by address alone.
const MAX_BFC_INSTANCES: usize = 256;

impl OomRecord {
    fn traced(&self) -> u64 {
        self.figures.reserved + self.figures.unmapped_physical
    }
}

/// `CUDA_ERROR_OUT_OF_MEMORY` and `cudaErrorMemoryAllocation`: the one return code that means
/// the memory was not there.
pub const RC_OUT_OF_MEMORY: i32 = 2;

/// A failed allocation call whose code says something other than "out of memory" (PyTorch
/// probing for fabric handles gets `CUDA_ERROR_NOT_PERMITTED` from `cuMemCreate`; calls made
/// while the context is torn down at exit get `CUDA_ERROR_INVALID_CONTEXT`). Not an OOM: no
/// verdict is given for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedCall {
    /// Event timestamp.
    pub ts_ns: u64,
    /// Process.
    pub pid: u32,
    /// Device.
    pub device: i16,
    /// Bytes requested.
    pub requested: u64,
    /// Return code.
    pub rc: i32,
    /// What kind of call failed.
    pub op: Option<EventKind>,
}

/// A release the state refused, awaiting its failed twin (see `State::refused_release`).
#[derive(Clone, Copy, Debug)]
struct RefusedRelease {
    kind: EventKind,
    key: u64,
    /// The anomaly's event index (its kept record, if kept, carries it).
    index: u64,
    ts_ns: u64,
}

/// How long after a refused release its failed twin may come (the real call's duration).
const TWIN_WINDOW_NS: u64 = 1_000_000_000;

/// The kinds the shim records before the real call (a failure follows as a twin with `F_FAILED`).
fn is_release(kind: EventKind) -> bool {
    matches!(kind, EventKind::MemFree | EventKind::PoolFree | EventKind::Unmap | EventKind::PhysRelease | EventKind::AddressFree)
}

/// What names a release's target: the handle of a `cuMemRelease`, the address of the others.
fn release_key(kind: EventKind, ev: &Event) -> u64 {
    if kind == EventKind::PhysRelease {
        ev.handle
    } else {
        ev.addr
    }
}

/// Device-wide totals as last measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    /// Bytes the device has (`cuMemGetInfo` total or NVML total).
    pub total: Option<u64>,
    /// Bytes free on the device.
    pub free: Option<u64>,
}

/// One anomaly, kept for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnomalyRecord {
    /// Index of the event in the stream (0-based).
    pub index: u64,
    /// Process.
    pub pid: u32,
    /// Device.
    pub device: i16,
    /// What was wrong.
    pub anomaly: Anomaly,
}

/// Everything known from the events applied so far.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Per (pid, device).
    pub spaces: BTreeMap<(u32, i16), ProcessDevice>,
    /// Per device.
    pub devices: BTreeMap<i16, DeviceTotals>,
    /// Allocations that failed for want of memory, in order.
    pub ooms: Vec<OomRecord>,
    /// Allocation calls that failed with another code, in order (the first [`KEPT_ANOMALIES`]).
    pub failed_calls: Vec<FailedCall>,
    /// All such calls, counted.
    pub failed_call_count: u64,
    /// Release calls (`cuMemFree`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`, ...) that
    /// failed with an error code: the driver kept the memory, and so does the state.
    pub failed_releases: u64,
    /// Per process, the last release event that did not fit the state: the shim records a
    /// release before the real call, and when the call then fails (a program's bad argument), its
    /// failed twin (same kind and target, within [`TWIN_WINDOW_NS`]) takes the anomaly back.
    refused_release: BTreeMap<u32, RefusedRelease>,
    /// Events the sources reported dropped.
    pub dropped: u64,
    /// Anomalies counted.
    pub anomaly_count: u64,
    /// The first [`KEPT_ANOMALIES`] anomalies.
    pub anomalies: Vec<AnomalyRecord>,
    /// Events applied (drop markers included: see `drop_markers`).
    pub events: u64,
    /// `Dropped` markers among them: the sources' notes of how many events they lost, not events
    /// of the traced program.
    pub drop_markers: u64,
    /// Events with a kind this build does not know.
    pub unknown_kinds: u64,
    /// Processes that exited.
    pub exited: BTreeMap<u32, u64>,
    /// XLA BFC block events of instances that are not a device pool (see `bfc_instances`):
    /// skipped.
    pub host_bfc_blocks: u64,
    /// XLA's BFC allocator instances seen, by (pid, instance address): XLA runs one per memory
    /// space (the device pool, pinned host memory, ...) and the probes see them all. An instance
    /// is filed by its first chunk: a device pool when that chunk lies in one of the process's
    /// traced segments, another memory space otherwise; only device pools' chunks are counted.
    pub bfc_instances: BTreeMap<(u32, u64), BfcInstance>,
    /// Who each process is (name, container, pod), as the live front end read it from `/proc`
    /// when the process was first seen ([`crate::attribution`]). Not carried by events: a
    /// replayed record has none.
    pub identities: BTreeMap<u32, std::sync::Arc<crate::attribution::Identity>>,
    rules: AllocatorRules,
    /// Per process: the allocator settings, memory fractions and framework its events stated
    /// ([`settings`]); its maps size blocks by these settings.
    settings: BTreeMap<u32, settings::ProcessSettings>,
    /// Facts that could not be used (settings that do not parse, a framework's OOM figures for a
    /// process with no OOM), counted.
    pub fact_note_count: u64,
    /// The first [`settings::KEPT_FACT_NOTES`] of them, each a one-line reason.
    pub fact_notes: Vec<String>,
    /// Per (pid, device): the process's latest own reading of device free.
    readings: BTreeMap<(u32, i16), Reading>,
    /// OOM records (indices into `ooms`) that a reading arriving later may still complete, in
    /// the order they failed.
    awaiting: std::collections::VecDeque<usize>,
    /// Whether `awaiting` is in time order (OOMs arrive in order almost always): then the
    /// records whose reading window closed are a prefix, popped in O(1) each, not a `retain`
    /// over all of them on every event (issue 23: quadratic in OOMs).
    awaiting_unordered: bool,
    /// Per (pid, device): failed driver allocations since the last successful one or the last
    /// allocator OOM ([`OomRecord::driver_failures_before`]).
    driver_failures: BTreeMap<(u32, i16), u64>,
    /// Per (pid, device): allowed bytes that arrived before the OOM they amend (time, bytes).
    pending_allowed: BTreeMap<(u32, i16), (u64, u64)>,
    /// Failed driver allocations not yet decided ([`oom_rule`]).
    undecided: Vec<oom_rule::Undecided>,
    /// Releases of device memory seen (any process, any device): a retry comes after one.
    releases: u64,
    /// Per (pid, device): recovered failures ([`OomOutcome::Retry`]); kept when a process is
    /// forgotten, like its OOM records.
    retries: BTreeMap<(u32, i16), u64>,
    /// Indices into `ooms` of the records decided as OOMs, in the order decided.
    oom_log: Vec<usize>,
    /// Per process: what is missing from its trace ([`partial`]).
    partial: BTreeMap<u32, Partial>,
    /// Processes whose start (`ProcessExec`) was applied, until forgotten (at most
    /// [`MAX_SPACES`]): an OOM report of a process never seen is a note ([`settings`]).
    execs: std::collections::BTreeSet<u32>,
    /// The fix the simulation computed for the first OOM ([`fix`], computed by `crate::sim`), or the note
    /// why there is none: set by the live pipeline (`crate::live`), which keeps the events the
    /// simulation replays; every summary of this state carries it. A replayed state has none:
    /// `analyze` computes it from the file, over the same events.
    pub computed_fix: Option<Result<fix::ComputedFix, String>>,
    /// What NVML said of the GPUs at the live pipeline's last reading ([`gpus`]): names,
    /// utilization, per-process used bytes. `None` where nothing read NVML (a replay), or NVML
    /// could not be opened.
    pub gpus: Option<gpus::GpuReadings>,
    /// Per (pid, device): the latest forecast of its peak ([`forecasts`]); kept when a process
    /// is forgotten, like its OOM records.
    pub forecasts: BTreeMap<(u32, i16), forecasts::Forecast>,
    /// The first [`forecasts::KEPT_WARNINGS`] warnings (forecasts that do not fit), in order.
    pub forecast_warnings: Vec<forecasts::Forecast>,
    /// Per (pid, device): warnings so far.
    pub forecast_warning_counts: BTreeMap<(u32, i16), u64>,
}

/// How far apart in time an OOM and the amendment that gives it its allowed bytes may be (they
/// come by different channels: the tracker's ring and the Python hook's socket).
pub const AMEND_WINDOW_NS: u64 = 2_000_000_000;

impl State {
    /// An empty state; new address spaces follow `rules`.
    pub fn new(rules: AllocatorRules) -> State {
        State { rules, ..State::default() }
    }

    /// Whether the figures can be trusted to the byte: nothing dropped, nothing inconsistent.
    pub fn exact(&self) -> bool {
        self.dropped == 0 && self.anomaly_count == 0 && self.unknown_kinds == 0
    }

    /// Records an anomaly (used by sources that find one outside `apply`, too).
    pub fn note_anomaly(&mut self, pid: u32, device: i16, anomaly: Anomaly) {
        self.anomaly_count += 1;
        if self.anomalies.len() < KEPT_ANOMALIES {
            self.anomalies.push(AnomalyRecord { index: self.events.saturating_sub(1), pid, device, anomaly });
        }
    }

    /// Bytes the trace holds for (pid, device): reserved plus created-but-unmapped physical
    /// memory (what [`Coverage::traced`] compares with NVML).
    pub fn traced_bytes(&self, pid: u32, device: i16) -> u64 {
        self.spaces.get(&(pid, device)).map_or(0, |s| {
            let f = s.map.figures();
            f.reserved + f.unmapped_physical
        })
    }

    /// Drops every map of `pid` (all devices): its process is gone and its pid may be reused
    /// (the eBPF path keys processes by pid and start time and calls this when one ends). The
    /// process's OOM records, anomalies and exit time stay.
    pub fn forget(&mut self, pid: u32) {
        self.spaces.retain(|&(p, _), _| p != pid);
        self.identities.remove(&pid);
        self.bfc_instances.retain(|&(p, _), _| p != pid);
        self.readings.retain(|&(p, _), _| p != pid);
        self.driver_failures.retain(|&(p, _), _| p != pid);
        self.pending_allowed.retain(|&(p, _), _| p != pid);
        self.settings.remove(&pid);
        self.partial.remove(&pid);
        self.execs.remove(&pid);
        self.settle_pid(pid);
        let ooms = &self.ooms;
        self.awaiting.retain(|&i| ooms[i].pid != pid);
    }

    /// A reading of device free by (or, with `nvml`, for) `pid` on `device`: remembered as the
    /// process's latest, and given to the OOM records it may complete.
    fn reading(&mut self, pid: u32, device: i16, ts_ns: u64, free: u64, total: u64, nvml: bool) {
        let traced = self.traced_bytes(pid, device);
        if !nvml {
            self.readings.insert((pid, device), Reading { ts_ns, free, total, traced });
        }
        let ooms = &mut self.ooms;
        for &i in &self.awaiting {
            let o = &mut ooms[i];
            if o.pid != pid || o.device != device || ts_ns < o.ts_ns || ts_ns - o.ts_ns > READING_WINDOW_NS {
                continue;
            }
            let take = if nvml { o.device_free_source == DeviceFreeSource::NotMeasured } else { o.traced() == traced };
            if take {
                o.device_free = Some(free);
                o.device_free_source = if nvml { DeviceFreeSource::NvmlAtFailure } else { DeviceFreeSource::ProcessReading };
                o.device_free_age_ns = Some(0);
                o.device_free_after_ns = Some(ts_ns - o.ts_ns);
            }
        }
    }

    /// An amendment's allowed bytes: to `pid`'s latest allocator OOM on `device` when it has none
    /// yet and is near in time, else kept for the next one.
    fn amend_allowed(&mut self, pid: u32, device: i16, ts_ns: u64, allowed: u64) {
        let latest = self.ooms.iter_mut().rev().find(|o| o.pid == pid && o.device == device && o.op == Some(EventKind::BlockAlloc));
        match latest {
            Some(o) if o.allowed.is_none() && o.ts_ns.abs_diff(ts_ns) <= AMEND_WINDOW_NS => o.allowed = Some(allowed),
            _ => {
                self.pending_allowed.insert((pid, device), (ts_ns, allowed));
            }
        }
    }

    /// The device free of a failure whose event carries none: the process's own latest reading
    /// before it, when recent and nothing of the process changed since.
    fn reading_before(&self, pid: u32, device: i16, ts_ns: u64, traced: u64) -> Option<(u64, i64)> {
        let r = self.readings.get(&(pid, device))?;
        (r.ts_ns <= ts_ns && ts_ns - r.ts_ns <= READING_WINDOW_NS && r.traced == traced).then(|| (r.free, (ts_ns - r.ts_ns) as i64))
    }

    /// The map of (pid, device), created on first use.
    pub fn space(&mut self, pid: u32, device: i16) -> &mut ProcessDevice {
        let rules = self.settings.get(&pid).map_or(&self.rules, |s| &s.conf.rules);
        self.spaces.entry((pid, device)).or_insert_with(|| ProcessDevice::new(pid, device, rules.clone()))
    }

    /// Applies one event that carries no text. Never fails: what does not fit is counted.
    pub fn apply(&mut self, ev: &Event) {
        self.apply_text(ev, &[]);
    }

    /// Applies one event with its text (a record entry's, or what a live source handed beside
    /// the event: a settings string, a framework's name). Never fails.
    pub fn apply_text(&mut self, ev: &Event, text: &[u8]) {
        self.events += 1;
        self.close_awaiting(ev.ts_ns);
        // A fact (settings, fraction, framework) is stated when the front end learns it, not when
        // the program acted: it does not move the OOM rule's clock.
        if !self.undecided.is_empty() && !matches!(ev.kind(), Some(k) if k.is_fact()) {
            self.settle_by_event(ev.ts_ns);
        }
        let Some(kind) = ev.kind() else {
            self.unknown_kinds += 1;
            return;
        };
        let pid = ev.pid;
        let device = if ev.device < 0 { self.resolve_device(pid, ev, kind) } else { ev.device };
        let framework = ev.flags & F_FRAMEWORK_OWNED != 0;
        let result: Result<(), Anomaly> = match kind {
            EventKind::DeviceInfo => {
                self.apply_device_info(ev, pid, device);
                Ok(())
            }
            EventKind::Dropped => {
                self.dropped = self.dropped.saturating_add(ev.size);
                self.drop_markers += 1;
                self.dropped_for(ev);
                Ok(())
            }
            EventKind::ProcessExec => {
                self.process_exec(ev);
                Ok(())
            }
            // The record reader consumes end markers; one from anywhere else changes nothing.
            EventKind::RecordEnd => Ok(()),
            EventKind::AllocSettings | EventKind::MemoryFraction | EventKind::FrameworkInfo | EventKind::FrameworkFigures => {
                self.apply_fact(ev, kind, text);
                Ok(())
            }
            EventKind::Forecast => {
                self.apply_forecast(ev, text);
                Ok(())
            }
            // Placement is the attribution's (the live pipeline reads it before the state).
            EventKind::DeviceUuid => Ok(()),
            // A legacy IPC export changes no memory; whatif's advice reads it from the record.
            EventKind::IpcExport => Ok(()),
            EventKind::ProcessExit => {
                self.process_exit(pid, ev.ts_ns);
                Ok(())
            }
            EventKind::AllocFailed if ev.flags & F_OOM_AMEND != 0 && !self.seen(pid) => {
                // An OOM report's allowed bytes for a process no event told of: nothing to amend.
                self.fact_note(format!(
                    "event {}: pid {pid}: an OOM report's allowed bytes ({}) for a process never seen: ignored",
                    self.events.saturating_sub(1),
                    ev.size
                ));
                Ok(())
            }
            EventKind::AllocFailed if ev.flags & F_OOM_AMEND != 0 => {
                self.amend_allowed(pid, device, ev.ts_ns, ev.size);
                Ok(())
            }
            EventKind::AllocFailed => {
                self.apply_failure(ev, pid, device);
                Ok(())
            }
            _ if ev.rc != 0 && ev.flags & F_FAILED != 0 && is_release(kind) => {
                self.failed_release(ev, pid, kind);
                Ok(())
            }
            _ if ev.rc != 0 => Ok(()), // a failed call changes nothing; sources send AllocFailed for OOMs
            // free(NULL) is a no-op for the driver and for caching allocators alike.
            EventKind::MemFree | EventKind::PoolFree | EventKind::BlockFree if ev.addr == 0 => Ok(()),
            EventKind::BlockAlloc | EventKind::BlockFree
                if ev.flags & F_ALLOC_XLA_BFC != 0 && !self.bfc_device_chunk(pid, device, ev, kind) =>
            {
                self.host_bfc_blocks += 1;
                Ok(())
            }
            _ if self.spaces.len() >= MAX_SPACES && !self.spaces.contains_key(&(pid, device)) => Err(Anomaly::TooManySpaces(MAX_SPACES)),
            _ => self.apply_to_map(ev, pid, device, kind, framework),
        };
        if let Err(a) = result {
            self.note_anomaly(pid, device, a);
            if is_release(kind) && ev.rc == 0 && self.refused_release.len() < MAX_SPACES {
                let index = self.events.saturating_sub(1);
                self.refused_release.insert(pid, RefusedRelease { kind, key: release_key(kind, ev), index, ts_ns: ev.ts_ns });
            }
        }
    }

    /// Drops from the OOMs awaiting a later device-free reading those whose window has closed by
    /// `ts_ns` (in order while the OOMs came in time order, else by a scan of them all).
    fn close_awaiting(&mut self, ts_ns: u64) {
        if self.awaiting.is_empty() {
            return;
        }
        let ooms = &self.ooms;
        let open = |i: usize| ts_ns <= ooms[i].ts_ns.saturating_add(READING_WINDOW_NS);
        if self.awaiting_unordered {
            self.awaiting.retain(|&i| open(i));
        } else {
            while self.awaiting.front().is_some_and(|&i| !open(i)) {
                self.awaiting.pop_front();
            }
        }
        if self.awaiting.is_empty() {
            self.awaiting_unordered = false;
        }
    }

    /// A device's total and free bytes, and a process's own reading of them.
    fn apply_device_info(&mut self, ev: &Event, pid: u32, device: i16) {
        let d = self.devices.entry(device).or_default();
        if ev.size > 0 {
            d.total = Some(ev.size);
        }
        if let Some(free) = ev.device_free() {
            d.free = Some(free);
            if pid != 0 {
                self.reading(pid, device, ev.ts_ns, free, ev.size, ev.flags & F_SRC_NVML != 0);
            }
        }
    }

    /// A process's exit: its pending release and undecided OOMs settled, its exit time kept (the
    /// oldest of [`EXITED_KEPT`] forgotten).
    fn process_exit(&mut self, pid: u32, ts_ns: u64) {
        self.refused_release.remove(&pid);
        self.settle_pid(pid);
        self.exited.insert(pid, ts_ns);
        if self.exited.len() > EXITED_KEPT {
            // The oldest exit goes: a long-running agent stays bounded.
            if let Some((&old, _)) = self.exited.iter().min_by_key(|(_, &t)| t) {
                self.exited.remove(&old);
            }
        }
    }

    /// The failed twin of a release: the driver kept the memory. If the state refused the
    /// release too (the program's bad argument), that was no lost event: its anomaly is taken back.
    fn failed_release(&mut self, ev: &Event, pid: u32, kind: EventKind) {
        self.failed_releases += 1;
        if let Some(r) = self
            .refused_release
            .remove(&pid)
            .filter(|r| r.kind == kind && r.key == release_key(kind, ev) && ev.ts_ns.saturating_sub(r.ts_ns) <= TWIN_WINDOW_NS)
        {
            self.anomaly_count = self.anomaly_count.saturating_sub(1);
            self.anomalies.retain(|a| !(a.pid == pid && a.index == r.index));
        }
    }

    /// An event that changes the address map of (pid, device), and what the state counts of it:
    /// sizes, driver failures cleared by a success, releases, the OOM rule's driver allocations.
    fn apply_to_map(&mut self, ev: &Event, pid: u32, device: i16, kind: EventKind, framework: bool) -> Result<(), Anomaly> {
        let s = self.space(pid, device);
        let r = s.apply_map_event(ev, kind, framework);
        if r.is_ok() {
            s.owners.apply(kind, ev);
        }
        let segment = r.is_ok()
            && matches!(
                kind,
                EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::MemAllocManaged | EventKind::PoolAlloc | EventKind::Map
            );
        if segment {
            s.allocs += 1;
            s.segment_sizes.record(ev.size);
        }
        if segment || kind == EventKind::PhysCreate {
            self.driver_failures.remove(&(pid, device));
        }
        if r.is_ok() && oom_rule::is_release(kind) {
            self.releases += 1;
        }
        if r.is_ok() && oom_rule::is_driver_alloc(kind) {
            self.on_driver_alloc(ev);
        }
        r
    }

    /// Whether an XLA BFC chunk event belongs to a device pool (and is applied to the map): its
    /// instance's filing, made at the instance's first chunk (in a traced segment of the process
    /// or not). An event without an instance address (0) is filed by its own address.
    fn bfc_device_chunk(&mut self, pid: u32, device: i16, ev: &Event, kind: EventKind) -> bool {
        let inside = self.spaces.get(&(pid, device)).is_some_and(|s| s.map.holds(ev.addr));
        if ev.handle == 0 || (self.bfc_instances.len() >= MAX_BFC_INSTANCES && !self.bfc_instances.contains_key(&(pid, ev.handle))) {
            return inside;
        }
        let i =
            self.bfc_instances.entry((pid, ev.handle)).or_insert(BfcInstance { device_pool: inside, chunks: 0, lo: ev.addr, hi: ev.addr });
        if kind == EventKind::BlockAlloc {
            i.chunks += 1;
            i.lo = i.lo.min(ev.addr);
            i.hi = i.hi.max(ev.addr);
        }
        i.device_pool
    }

    /// The device of a free-like event whose source did not know it (the shim sends -1 for frees):
    /// the one of this process's maps that holds the address or handle.
    fn resolve_device(&self, pid: u32, ev: &Event, kind: EventKind) -> i16 {
        let mut first = None;
        for ((_, d), s) in self.spaces.range((pid, i16::MIN)..=(pid, i16::MAX)) {
            first.get_or_insert(*d);
            let hit = match kind {
                EventKind::PhysRelease => s.map.holds_handle(ev.handle),
                EventKind::PoolTrim | EventKind::PoolReserved => false,
                _ => s.map.holds(ev.addr),
            };
            if hit {
                return *d;
            }
        }
        first.unwrap_or(ev.device)
    }

    /// Applies events in order.
    pub fn apply_all<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for e in events {
            self.apply(e);
        }
    }

    /// The figures of one device summed over processes.
    pub fn device_figures(&self, device: i16) -> Figures {
        let mut f = Figures::default();
        for s in self.spaces.values().filter(|s| s.device == device) {
            f.merge(&s.map.figures());
        }
        f
    }

    /// Devices that appear in any map or measurement, in order.
    pub fn device_ids(&self) -> Vec<i16> {
        let mut d: Vec<i16> = self.spaces.values().map(|s| s.device).chain(self.devices.keys().copied()).collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

#[cfg(test)]
mod forget_tests {
    use super::*;

    /// Issue 14: a record file of 10,000 processes took 5.8 GB and 300,000 aborted at 12 GB. The
    /// maps are bounded; events of processes past the bound are counted, never tracked.
    #[test]
    fn regression_many_processes_stay_bounded_and_are_counted() {
        let mut s = State::default();
        for pid in 0..(MAX_SPACES as u32 + 10) {
            s.apply(&Event { addr: 0x1000, size: 4096, ..Event::new(EventKind::MemAlloc, pid, 0) });
        }
        assert_eq!(s.spaces.len(), MAX_SPACES);
        assert_eq!(s.anomaly_count, 10);
        assert_eq!(s.anomalies[0].anomaly, Anomaly::TooManySpaces(MAX_SPACES));
        assert!(!s.exact());
    }

    #[test]
    fn forget_drops_one_pid_on_every_device_and_keeps_the_rest() {
        let mut s = State::default();
        for (pid, dev, addr) in [(1u32, 0i16, 0x1000u64), (1, 1, 0x2000), (2, 0, 0x3000)] {
            s.apply(&Event { addr, size: 4096, ..Event::new(EventKind::MemAlloc, pid, dev) });
        }
        s.forget(1);
        assert_eq!(s.spaces.keys().copied().collect::<Vec<_>>(), vec![(2, 0)]);
        assert_eq!(s.device_figures(0).reserved, 4096);
        assert_eq!(s.device_figures(1).reserved, 0);
        // A new holder of pid 1 starts empty.
        s.apply(&Event { addr: 0x1000, ..Event::new(EventKind::MemFree, 1, -1) });
        assert_eq!(s.anomaly_count, 1);
    }
}

#[cfg(test)]
mod process_rules_tests {
    use super::*;

    fn settings(pid: u32, conf: &str) -> (Event, Vec<u8>) {
        (Event { text_len: conf.len() as u16, ..Event::new(EventKind::AllocSettings, pid, -1) }, conf.as_bytes().to_vec())
    }

    /// Under `run` with the trace tracker a block event carries only the requested size: a
    /// process started with `PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4` has its 1.1 MiB
    /// request in a 1.25 MiB block (four divisions of [1 MiB, 2 MiB)), not PyTorch's default
    /// 512-byte rounding, and another process keeps the defaults. The settings are an event.
    #[test]
    fn regression_tracker_blocks_are_sized_by_the_processs_own_allocator_settings() {
        let mut s = State::default();
        let requested = 1_153_434; // 1.1 MiB
        for pid in [7u32, 8] {
            s.apply(&Event {
                addr: 0x1000_0000 * u64::from(pid),
                size: 20 << 20,
                requested: 20 << 20,
                ..Event::new(EventKind::MemAlloc, pid, 0)
            });
            if pid == 7 {
                // Stated after the process's first (driver) event, as the hook's frame arrives.
                let (e, t) = settings(7, "roundup_power2_divisions:4");
                s.apply_text(&e, &t);
            }
            s.apply(&Event { addr: 0x1000_0000 * u64::from(pid), requested, ..Event::new(EventKind::BlockAlloc, pid, 0) });
        }
        let allocated = |s: &State, pid| s.spaces[&(pid, 0)].map.figures().allocated;
        assert_eq!(allocated(&s, 7), 1_310_720, "1.1 MiB under roundup_power2_divisions:4");
        assert_eq!(allocated(&s, 8), 1_153_536, "1.1 MiB rounded to 512 bytes (the defaults)");
        assert_eq!(s.settings_of(7).map(|x| x.at_start.as_str()), Some("roundup_power2_divisions:4"));
        s.forget(7);
        s.apply(&Event { addr: 0x7000_0000, size: 20 << 20, requested: 20 << 20, ..Event::new(EventKind::MemAlloc, 7, 0) });
        s.apply(&Event { addr: 0x7000_0000, requested, ..Event::new(EventKind::BlockAlloc, 7, 0) });
        assert_eq!(allocated(&s, 7), 1_153_536, "a new holder of pid 7 starts with the defaults");
    }

    /// A change at run time (`_set_allocator_settings`) replaces the keys it names and sizes the
    /// blocks after it; settings that do not parse, or name a key PyTorch does not know, change
    /// nothing and are a counted note with the reason.
    #[test]
    fn a_settings_change_applies_from_there_and_bad_settings_are_noted_not_applied() {
        let mut s = State::default();
        let (e, t) = settings(7, "max_split_size_mb:128");
        s.apply_text(&e, &t);
        s.apply(&Event { addr: 0x1000_0000, size: 64 << 20, requested: 64 << 20, ..Event::new(EventKind::MemAlloc, 7, 0) });
        s.apply(&Event { addr: 0x1000_0000, requested: 1_153_434, ..Event::new(EventKind::BlockAlloc, 7, 0) });
        let (e, t) = settings(7, "roundup_power2_divisions:4");
        s.apply_text(&e, &t);
        s.apply(&Event { addr: 0x1000_0000 + (2 << 20), requested: 1_153_434, ..Event::new(EventKind::BlockAlloc, 7, 0) });
        let f = s.spaces[&(7, 0)].map.figures();
        assert_eq!(f.allocated, 1_153_536 + 1_310_720, "the first block by the start's settings, the second by the change");
        let set = s.settings_of(7).expect("settings");
        assert_eq!(set.conf.rules.max_split_size, 128 << 20, "the change kept the keys it did not name");
        assert_eq!(set.changes, vec!["roundup_power2_divisions:4".to_string()]);
        let before = (s.spaces[&(7, 0)].map.figures(), set.clone());
        for bad in ["roundup_power2_divisions:3", "no_such_key:1", "max_split_size_mb"] {
            let (e, t) = settings(7, bad);
            s.apply_text(&e, &t);
        }
        assert_eq!(s.fact_note_count, 3, "{:?}", s.fact_notes);
        assert!(s.fact_notes[1].contains("\"no_such_key:1\" do not parse"), "{:?}", s.fact_notes);
        assert_eq!((s.spaces[&(7, 0)].map.figures(), s.settings_of(7).cloned().expect("settings")), before, "nothing changed");
        // A framework's OOM figures for a process with no OOM: a note, nothing else.
        s.apply(&Event { size: 1 << 30, requested: 1 << 29, handle: 1 << 20, ..Event::new(EventKind::FrameworkFigures, 9, 0) });
        assert_eq!(s.fact_note_count, 4);
        assert!(s.ooms.is_empty() && !s.spaces.contains_key(&(9, 0)));
        // An OOM report's allowed bytes for a process never seen: a note, kept for nothing.
        let amend = Event {
            size: 1 << 30,
            rc: 2,
            op: EventKind::BlockAlloc as u16,
            flags: crate::event::F_FAILED | crate::event::F_ALLOWED_KNOWN | F_OOM_AMEND,
            ..Event::new(EventKind::AllocFailed, 11, 0)
        };
        s.apply(&amend);
        assert_eq!(s.fact_note_count, 5, "{:?}", s.fact_notes);
        assert!(
            s.fact_notes[4].contains("pid 11: an OOM report's allowed bytes (1073741824) for a process never seen"),
            "{:?}",
            s.fact_notes
        );
        assert!(s.ooms.is_empty() && s.pending_allowed.is_empty());
        // Of a process seen, it is kept for its OOM (the tracker's OOM entry may come after it).
        s.apply(&Event { flags: amend.flags, ..Event { pid: 7, ..amend } });
        assert_eq!((s.fact_note_count, s.pending_allowed.len()), (5, 1));
    }
}

#[cfg(test)]
mod failure_tests {
    use super::*;
    use crate::analysis::summary::Summary;

    /// Seen on the H200: `cuMemCreate` refused with `CUDA_ERROR_NOT_PERMITTED` (800) while
    /// PyTorch probes handle types, and a pool allocation failing with
    /// `CUDA_ERROR_INVALID_CONTEXT` (201) during teardown. Neither is an OOM.
    #[test]
    fn only_out_of_memory_codes_make_an_oom() {
        let mut s = State::default();
        let failed = |rc, op: EventKind, requested| Event { rc, requested, op: op as u16, ..Event::new(EventKind::AllocFailed, 7, 0) };
        s.apply(&failed(800, EventKind::PhysCreate, 20 << 20));
        s.apply(&failed(201, EventKind::PoolAlloc, 1 << 30));
        s.apply(&failed(RC_OUT_OF_MEMORY, EventKind::MemAlloc, 3 << 30));
        assert_eq!(s.ooms.len(), 1);
        assert_eq!(s.ooms[0].requested, 3 << 30);
        assert_eq!(s.failed_call_count, 2);
        let sum = Summary::from_state(&s, "test");
        assert_eq!(sum.ooms.len(), 1);
        assert_eq!(
            sum.failed_calls.iter().map(|c| (c.op.as_str(), c.rc)).collect::<Vec<_>>(),
            vec![("phys_create", 800), ("pool_alloc", 201)]
        );
        assert!(
            sum.notes.iter().any(|n| n.starts_with("2 allocation call(s) failed with codes other than out-of-memory")),
            "{:?}",
            sum.notes
        );
        assert!(sum.exact, "a refused call is not a lost event");
    }

    /// Issue 13: under the trace tracker the OOM is the tracker's entry (in the ring) and the
    /// allowed bytes come from the OOM observer (on the socket), in either order: the amendment
    /// gives them to that OOM and makes no OOM of its own; one that comes first waits for it.
    #[test]
    fn regression_an_amendment_gives_the_trackers_oom_its_allowed_bytes_in_either_order() {
        use crate::event::{F_ALLOWED_KNOWN, F_FAILED, F_OOM_AMEND};
        let oom = |ts_ns| Event {
            ts_ns,
            requested: 20 << 30,
            rc: RC_OUT_OF_MEMORY,
            op: EventKind::BlockAlloc as u16,
            flags: F_FAILED,
            ..Event::new(EventKind::AllocFailed, 7, 0)
        };
        let amend = |ts_ns| Event {
            ts_ns,
            requested: 20 << 30,
            size: 16 << 30,
            rc: RC_OUT_OF_MEMORY,
            op: EventKind::BlockAlloc as u16,
            flags: F_FAILED | F_ALLOWED_KNOWN | F_OOM_AMEND,
            ..Event::new(EventKind::AllocFailed, 7, 0)
        };
        for first_oom in [true, false] {
            let mut s = State::default();
            // The process started (its hook connected): an amendment of a process never seen is
            // a note (a_settings_change_applies_from_there_and_bad_settings_are_noted_not_applied).
            s.apply(&Event { ts_ns: 500, ..Event::new(EventKind::ProcessExec, 7, -1) });
            let (a, b) = if first_oom { (oom(1_000), amend(5_000)) } else { (amend(1_000), oom(5_000)) };
            s.apply(&a);
            s.apply(&b);
            assert_eq!(s.ooms.len(), 1, "first_oom {first_oom}: {:?}", s.ooms);
            assert_eq!(s.ooms[0].allowed, Some(16 << 30), "first_oom {first_oom}");
            // A later OOM of the same process is not given them.
            s.apply(&oom(10_000_000_000));
            assert_eq!(s.ooms[1].allowed, None);
        }
    }
}

#[cfg(test)]
mod device_free_tests {
    use super::*;
    use crate::event::{F_DEVICE_FREE_KNOWN, F_FAILED};

    const MS: u64 = 1_000_000;

    fn alloc(ts_ns: u64, addr: u64, size: u64) -> Event {
        Event { ts_ns, addr, size, requested: size, ..Event::new(EventKind::MemAlloc, 7, 0) }
    }
    fn reading(ts_ns: u64, pid: u32, free: u64, nvml: bool) -> Event {
        let flags = F_DEVICE_FREE_KNOWN | if nvml { F_SRC_NVML } else { 0 };
        Event { ts_ns, size: 16 << 30, device_free: free, flags, ..Event::new(EventKind::DeviceInfo, pid, 0) }
    }
    fn failure(ts_ns: u64, free: Option<u64>) -> Event {
        let flags = F_FAILED | if free.is_some() { F_DEVICE_FREE_KNOWN } else { 0 };
        Event {
            ts_ns,
            requested: 3 << 30,
            rc: RC_OUT_OF_MEMORY,
            op: EventKind::MemAlloc as u16,
            flags,
            device_free: free.unwrap_or(0),
            ..Event::new(EventKind::AllocFailed, 7, 0)
        }
    }
    fn run(events: &[Event]) -> (Option<u64>, DeviceFreeSource, Option<i64>) {
        let mut s = State::default();
        s.apply_all(events);
        let o = &s.ooms[0];
        assert!(o.device_free_age_ns.is_none_or(|a| a >= 0), "age never negative: {o:?}");
        assert!(o.device_free_after_ns.is_none() || o.device_free_age_ns == Some(0), "a reading after the failure has age 0: {o:?}");
        // The third value: the age of a reading before, minus the delay of one after.
        (o.device_free, o.device_free_source, o.device_free_age_ns.map(|a| o.device_free_after_ns.map_or(a, |after| -(after as i64))))
    }

    #[test]
    fn the_failures_own_figure_comes_first() {
        let e =
            [alloc(MS, 0x1000_0000, 2 << 20), reading(2 * MS, 7, 111, false), failure(3 * MS, Some(222)), reading(4 * MS, 7, 333, false)];
        assert_eq!(run(&e), (Some(222), DeviceFreeSource::FailureEvent, Some(0)));
    }

    #[test]
    fn the_processs_own_reading_just_before_stands_for_the_failure() {
        let e = [alloc(MS, 0x1000_0000, 2 << 20), reading(2 * MS, 7, 111, false), failure(3 * MS, None)];
        assert_eq!(run(&e), (Some(111), DeviceFreeSource::ProcessReading, Some(MS as i64)));
    }

    #[test]
    fn a_reading_before_an_allocation_of_the_process_is_stale() {
        let e = [reading(MS, 7, 111, false), alloc(2 * MS, 0x1000_0000, 2 << 20), failure(3 * MS, None)];
        assert_eq!(run(&e), (None, DeviceFreeSource::NotMeasured, None));
    }

    #[test]
    fn a_reading_older_than_the_window_is_not_taken() {
        let e = [reading(MS, 7, 111, false), failure(MS + READING_WINDOW_NS + 1, None)];
        assert_eq!(run(&e), (None, DeviceFreeSource::NotMeasured, None));
    }

    #[test]
    fn a_reading_after_the_failure_completes_it_and_beats_nvml() {
        // PyTorch reads cudaMemGetInfo while building its message, after the failure; the
        // capture's NVML read for the failure came first.
        let e = [failure(MS, None), reading(2 * MS, 7, 999, true), reading(3 * MS, 7, 111, false)];
        assert_eq!(run(&e), (Some(111), DeviceFreeSource::ProcessReading, Some(-2 * MS as i64)));
        let e = [failure(MS, None), reading(2 * MS, 7, 999, true)];
        assert_eq!(run(&e), (Some(999), DeviceFreeSource::NvmlAtFailure, Some(-(MS as i64))));
    }

    #[test]
    fn readings_of_other_processes_and_late_ones_are_not_taken() {
        let e = [
            failure(MS, None),
            reading(2 * MS, 8, 999, false),
            reading(2 * MS, 0, 998, false),
            reading(MS + READING_WINDOW_NS + 1, 7, 111, false),
        ];
        assert_eq!(run(&e), (None, DeviceFreeSource::NotMeasured, None));
    }

    #[test]
    fn an_unmeasured_failure_is_not_judged_on_zero_free() {
        let mut s = State::default();
        s.apply(&failure(MS, None));
        let sum = crate::analysis::summary::Summary::from_state(&s, "t");
        assert_eq!(sum.ooms[0].verdict, crate::analysis::Verdict::Inconclusive);
        assert_eq!(sum.ooms[0].device_free_source, "not_measured");
    }
}

#[cfg(test)]
mod failed_release_tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ev(kind: EventKind, ts_ns: u64, addr: u64, size: u64, handle: u64) -> Event {
        Event { ts_ns, addr, size, handle, flags: crate::event::F_SRC_SHIM, ..Event::new(kind, 9, 0) }
    }

    fn twin(e: Event) -> Event {
        Event { rc: 1, flags: e.flags | F_FAILED, ..e }
    }

    /// The vmm scenario's bad arguments, as the shim records them: each release before the real
    /// call, then, since the driver refused it, the same event failed. The state ends as the
    /// driver does, with no anomaly and four failed releases noted.
    #[test]
    fn a_refused_release_and_its_failed_twin_leave_no_anomaly_and_no_change() {
        let base = 0x5000_0000_0000;
        let mut s = State::default();
        let mut t = 0;
        let mut apply = |s: &mut State, e: Event| {
            t += 1;
            s.apply(&Event { ts_ns: t, ..e });
        };
        apply(&mut s, ev(EventKind::AddressReserve, 0, base, 1 << 30, 0));
        for i in 0..3 {
            apply(&mut s, ev(EventKind::PhysCreate, 0, 0, 20 * MIB, 0x10 + i));
            apply(&mut s, ev(EventKind::Map, 0, base + i * 20 * MIB, 20 * MIB, 0x10 + i));
        }
        let before = s.spaces[&(9, 0)].map.figures();
        for bad in [
            ev(EventKind::Unmap, 0, base + 40 * 20 * MIB, 20 * MIB, 0), // nothing mapped there
            ev(EventKind::Unmap, 0, base, 2 * MIB, 0),                  // cuts a mapping
            ev(EventKind::PhysRelease, 0, 0, 0, 0x99),                  // never created
            ev(EventKind::AddressFree, 0, base, 1 << 30, 0),            // still mapped
        ] {
            apply(&mut s, bad);
            assert_eq!(s.anomaly_count, 1, "{bad:?} is refused as the driver refuses it");
            apply(&mut s, twin(bad));
            assert_eq!(s.anomaly_count, 0, "its failed twin takes the anomaly back: {:?}", s.anomalies);
        }
        assert_eq!(s.failed_releases, 4);
        assert_eq!(s.spaces[&(9, 0)].map.figures(), before, "nothing changed");
        // The cleanup the program does next fits: whole mappings, then the range.
        for i in 0..3 {
            apply(&mut s, ev(EventKind::Unmap, 0, base + i * 20 * MIB, 20 * MIB, 0));
            apply(&mut s, ev(EventKind::PhysRelease, 0, 0, 0, 0x10 + i));
        }
        apply(&mut s, ev(EventKind::AddressFree, 0, base, 1 << 30, 0));
        assert_eq!(s.anomaly_count, 0, "{:?}", s.anomalies);
        assert_eq!(s.spaces[&(9, 0)].map.figures().reserved, 0);
    }

    /// A release that does not fit and is not followed by a failure is a lost event: the anomaly
    /// stays. So does one whose "twin" names another target or comes too late.
    #[test]
    fn a_refused_release_without_its_twin_stays_an_anomaly() {
        let mut s = State::default();
        s.apply(&ev(EventKind::MemFree, 1, 0x1000, 0, 0));
        s.apply(&ev(EventKind::MemAlloc, 2, 0x20_0000, 2 * MIB, 0));
        s.apply(&twin(ev(EventKind::MemFree, 3, 0x2000, 0, 0)));
        assert_eq!(s.anomaly_count, 1, "another target's failure does not take it back");
        s.apply(&twin(ev(EventKind::MemFree, 1 + TWIN_WINDOW_NS + 1, 0x1000, 0, 0)));
        assert_eq!(s.anomaly_count, 1, "nor one past the window");
        assert_eq!(s.failed_releases, 2);
    }
}
