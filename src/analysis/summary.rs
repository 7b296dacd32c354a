//! The summary schema: what `gpufrag analyze --json` prints and what `run --summary-json` and
//! `attach --summary-json` write. Field names are stable (docs/metrics.md documents them); new
//! fields may be added, none renamed or removed. All sizes are exact bytes.

use super::{fragmentation, largest_allocatable, OomInputs, Verdict};
use crate::ingest::histogram::{Distribution, SizeStats};
use crate::ingest::State;
use crate::map::Figures;
use serde::{Deserialize, Serialize};

/// Version of this schema.
pub const SCHEMA_VERSION: u32 = 1;

/// One analysis.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// What was analysed: a file path or a command line.
    pub source: String,
    /// Whether every figure is exact: no dropped events, no anomalies, a complete trace.
    pub exact: bool,
    /// Why the figures are not exact, or how they were obtained, in plain words.
    pub notes: Vec<String>,
    /// Per device, summed over processes.
    pub devices: Vec<DeviceSummary>,
    /// Per process and device.
    pub processes: Vec<ProcessSummary>,
    /// Every failed allocation, in order.
    pub ooms: Vec<OomSummary>,
    /// Events applied.
    pub events: u64,
    /// Events the sources dropped.
    pub dropped: u64,
    /// Events that did not fit the map (lost or inconsistent).
    pub anomalies: u64,
    /// Failed driver allocations inside caching allocators' address spaces (their retries; each
    /// final failure is an entry of `ooms`).
    #[serde(default)]
    pub driver_failures: u64,
    /// Failed allocations that recovered: the same thread's next allocation of that size
    /// succeeded after memory was released (PyTorch's `num_alloc_retries`); never OOMs.
    #[serde(default)]
    pub retries: u64,
    /// What the simulation of the trace under other allocator settings gave (`gpufrag whatif`'s
    /// sweep), when the trace had an OOM and its full allocation history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatif: Option<WhatIfSummary>,
    /// Allocation calls that failed with a code other than out-of-memory (no verdict: not OOMs),
    /// the first 20 of them; `notes` gives the count.
    #[serde(default)]
    pub failed_calls: Vec<FailedCallSummary>,
    /// The frameworks' own statistics, as their Python APIs reported them under `gpufrag run`
    /// (JAX's `memory_stats()`, CuPy's pool): latest per process, device and framework, and the
    /// one read at an out-of-memory error (`when: "oom"`).
    #[serde(default)]
    pub framework_stats: Vec<crate::alloc::FrameworkReport>,
    /// How a live command captured the trace: `shim` (`run`: the LD_PRELOAD shim, with the Python
    /// hook's blocks) or `ebpf` (`attach`, `agent`); absent for a file (`analyze`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<String>,
    /// eBPF capture: per process and device, the traced bytes beside NVML's used bytes; absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Vec<crate::ingest::Coverage>>,
    /// Foresight's warnings (forecast events whose simulated steps do not fit), in order: when,
    /// which process and device, the predicted peak, what it may hold, how many steps ahead, and
    /// the setting that would fit. A record replays to the same list.
    #[serde(default)]
    pub warnings: Vec<crate::ingest::forecasts::Forecast>,
}

/// An allocation call that failed with a code other than out-of-memory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FailedCallSummary {
    /// Device.
    pub device: i16,
    /// Process.
    pub pid: u32,
    /// Timestamp, ns.
    pub ts_ns: u64,
    /// Bytes requested.
    pub requested: u64,
    /// The return code (`CUresult` or `cudaError_t`).
    pub rc: i32,
    /// The call that failed.
    pub op: String,
}

/// Figures of one device, or of one process on one device.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceSummary {
    /// The device: under `run`, `attach` and `agent` the node's GPU index (NVML's order), the
    /// process's CUDA ordinal placed through its `CUDA_VISIBLE_DEVICES` and
    /// `NVIDIA_VISIBLE_DEVICES`; in a snapshot, PyTorch's device index.
    pub device: i16,
    /// The GPU's UUID (`hw.id`), when the live front end knew it (NVML); a MIG instance's own
    /// `MIG-…` UUID when the device is one (`crate::attribution::mig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hw_id: Option<String>,
    /// When the device is a MIG instance: the UUID of the GPU it is a slice of (its figures,
    /// device free and total included, are the instance's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_parent: Option<String>,
    /// The address map's figures (reserved, allocated, stranded, releasable, largest free block,
    /// counts; `level`: `block` when a caching allocator's blocks were seen, else `segment`),
    /// summed over the device's processes on a device's: [`Figures`], the one list of them.
    #[serde(flatten)]
    pub map: Figures,
    /// Share of free memory that no single request can use.
    pub fragmentation: f64,
    /// stranded / reserved.
    pub stranded_ratio: f64,
    /// Device free bytes when measured.
    pub device_free: Option<u64>,
    /// Device total bytes when measured.
    pub device_total: Option<u64>,
    /// What one request can get now.
    pub largest_allocatable: u64,
    /// NVML's used bytes (`nvmlDeviceGetComputeRunningProcesses`, read by the live pipeline:
    /// `crate::ingest::gpus`): of this process on a process's figures; on a device's, the sum
    /// over every process NVML lists there, untraced ones too. Absent when NVML was not read or
    /// does not list the process: unknown, not 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_used: Option<u64>,
    /// The GPU's name from NVML (`nvmlDeviceGetName`), on a device's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_name: Option<String>,
    /// NVML's GPU utilization, percent (`nvmlDeviceGetUtilizationRates`), on a device's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_gpu: Option<u32>,
    /// NVML's memory utilization, percent (the share of time device memory was read or
    /// written), on a device's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_memory: Option<u32>,
    /// The segments with the most stranded bytes, most first (at most ten).
    pub top_stranded_segments: Vec<SegmentSummary>,
    /// Sizes of successful allocations: framework blocks at block level, segments at segment level.
    pub alloc_sizes: Distribution,
    /// Sizes of the free runs inside segments now.
    pub free_runs: Distribution,
}

/// A process's figures on one device.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcessSummary {
    /// Process id (0 for a snapshot).
    pub pid: u32,
    /// The figures.
    #[serde(flatten)]
    pub figures: DeviceSummary,
    /// Successful allocations seen.
    pub allocs: u64,
    /// Frees seen.
    pub frees: u64,
    /// Its recovered failed allocations (see `Summary::retries`).
    #[serde(default)]
    pub retries: u64,
    /// The caching allocator seen in this process: `pytorch`, `xla` or `cupy`; `null` when only
    /// driver segments were seen.
    #[serde(default)]
    pub framework: Option<crate::alloc::Framework>,
    /// Base name of its executable, when the live front end read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// `container.id`: the container it runs in, from its cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// `k8s.pod.uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_pod_uid: Option<String>,
    /// `k8s.pod.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_pod_name: Option<String>,
    /// `k8s.namespace.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_namespace_name: Option<String>,
    /// `k8s.container.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_container_name: Option<String>,
    /// Which source named its pod and container: `pod-resources` (the kubelet's socket: the one
    /// container given the GPU it uses), `oci-annotations` (the runtime's config of the
    /// container, read as it started), `environment` (the container's own variables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_source: Option<String>,
    /// The GPUs (UUIDs) the kubelet's pod-resources socket lists for its container; absent when
    /// the socket is not read or does not list it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_gpus: Option<Vec<String>>,
    /// The process ended (a `ProcessExit` was seen); its figures are its last. Left out while
    /// it runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exited: bool,
    /// Its live driver bytes by the library that took them (`cublas`, `cudnn`, `nccl`,
    /// `cuda_runtime`, `framework`, `other`): the caller of each allocation, resolved live (the
    /// shim's capture). Absent when no allocation's owner was said.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub owners: std::collections::BTreeMap<String, u64>,
}

/// A process's live driver bytes by owner, for the summary; with allocations whose owner no
/// source said, those too (`unattributed`), so the figures sum to its driver bytes. Empty when
/// no owner was said.
fn owner_bytes(o: &crate::ingest::owners::OwnerBytes) -> std::collections::BTreeMap<String, u64> {
    if !o.any_known() {
        return Default::default();
    }
    let mut m: std::collections::BTreeMap<String, u64> = o.by_owner().into_iter().map(|(w, b)| (w.name().to_string(), b)).collect();
    if o.unattributed() > 0 {
        m.insert("unattributed".to_string(), o.unattributed());
    }
    m
}

/// One segment in a table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SegmentSummary {
    /// Process.
    pub pid: u32,
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// How the driver handed it out.
    pub kind: String,
    /// Free bytes held hostage by live blocks.
    pub stranded: u64,
    /// Live blocks inside.
    pub live_blocks: u64,
    /// The largest free run inside.
    pub largest_free_run: u64,
}

pub use crate::ingest::fix::{ScenarioBrief, WhatIfSummary};

/// One failed allocation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OomSummary {
    /// Device.
    pub device: i16,
    /// Process.
    pub pid: u32,
    /// Timestamp, ns.
    pub ts_ns: u64,
    /// Bytes requested.
    pub requested: u64,
    /// Device free at the failure (0 when not measured; see `device_free_known`).
    pub device_free: u64,
    /// Whether `device_free` was measured.
    pub device_free_known: bool,
    /// Where `device_free` came from: `failure_event` (the failure's own event: the shim's
    /// reading right after the failed call, PyTorch's or the annotating allocator's figure),
    /// `process_reading` (the process's own `cuMemGetInfo` near the failure), `nvml_at_failure`
    /// (NVML read for this failure while the process was alive), `not_measured`.
    #[serde(default = "not_measured")]
    pub device_free_source: String,
    /// Failure time minus the reading's time, ns, for a reading before the failure; 0 for the
    /// failure's own figure and for a reading after it; never negative; absent when not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_age_ns: Option<i64>,
    /// A reading taken after the failure (NVML woken by it, the process's own read while it
    /// builds its error message): how long after, ns; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_after_ns: Option<u64>,
    /// The failing process's figures on that device at the failure ([`Figures`]: stranded,
    /// releasable, largest free block, reserved, allocated, page-stranded, counts, level).
    #[serde(flatten)]
    pub map: Figures,
    /// The return code of the failed call.
    pub rc: i32,
    /// The call that failed.
    pub op: String,
    /// The allocator's allowed bytes (`set_per_process_memory_fraction`: fraction × device total)
    /// when its OOM report carried them (PyTorch's OOM observer under `run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<u64>,
    /// `fragmentation`, `true_oom`, `allowed_limit` or `inconclusive`.
    pub verdict: Verdict,
    /// The verdict in plain words.
    pub explanation: String,
    /// What to do.
    pub fix: String,
    /// Failed driver allocations in this process and device just before this OOM (the caching
    /// allocator's own attempts and retries), folded into it.
    #[serde(default)]
    pub driver_failures_before: u64,
    /// The caching allocator whose request failed (or that manages the process), when known.
    #[serde(default)]
    pub framework: Option<crate::alloc::Framework>,
    /// The GPU's UUID (`hw.id`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hw_id: Option<String>,
    /// `container.id` of the failing process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Who else held the device at the failure (`crate::ingest::holders`): other traced processes and
    /// those NVML listed.
    #[serde(default)]
    pub holders: crate::ingest::holders::Holders,
    /// The sharing layer's limit the process ran under on this device (MPS, a preload quota:
    /// `crate::limits`), judged against the request; absent when none was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<crate::limits::LimitHit>,
    /// What was missing from the process's trace at the failure (`crate::ingest::partial`), in
    /// words: the verdict is then `inconclusive`. Absent when it was traced whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// The failure's event index in the trace (a record's event index; for a snapshot, the
    /// index of its replayed events): where the computed fix's simulation ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<u64>,
}

fn not_measured() -> String {
    "not_measured".to_string()
}

fn device_summary(
    device: i16,
    f: &Figures,
    free: Option<u64>,
    total: Option<u64>,
    spaces: &[&crate::ingest::ProcessDevice],
) -> DeviceSummary {
    // What this process holds is not free: a device-free sample above `total − reserved` is stale
    // (taken before the process's segments were allocated), and added to the releasable bytes it
    // made `largest allocatable` exceed the card (144.09 GiB on a 139.80 GiB H200, issue 14).
    let device_free = match total {
        Some(t) => free.unwrap_or(0).min(t.saturating_sub(f.reserved)),
        None => free.unwrap_or(0),
    };
    let mut top: Vec<SegmentSummary> = spaces
        .iter()
        .flat_map(|s| {
            let m = &s.map;
            m.segments().filter(|g| g.stranded() > 0).map(move |g| SegmentSummary {
                pid: s.pid,
                address: g.start,
                size: g.size,
                kind: g.kind.name().to_string(),
                stranded: g.stranded(),
                live_blocks: g.live_blocks,
                largest_free_run: m.free_runs_in(g.start, g.end()).map(|(_, l)| l).max().unwrap_or(0),
            })
        })
        .collect();
    top.sort_by(|a, b| b.stranded.cmp(&a.stranded).then(a.address.cmp(&b.address)));
    top.truncate(10);
    let mut alloc_sizes = SizeStats::default();
    let mut runs = SizeStats::default();
    for s in spaces {
        alloc_sizes.merge(if f.framework_seen { &s.block_sizes } else { &s.segment_sizes });
        for (_, l) in s.map.free_runs() {
            runs.record(l);
        }
    }
    DeviceSummary {
        device,
        hw_id: None,
        mig_parent: None,
        map: *f,
        fragmentation: fragmentation(f.largest_free_block, device_free, f.stranded, f.releasable),
        stranded_ratio: if f.reserved == 0 { 0.0 } else { f.stranded as f64 / f.reserved as f64 },
        device_free: free,
        device_total: total,
        largest_allocatable: largest_allocatable(f.largest_free_block, device_free, f.releasable),
        nvml_used: None,
        gpu_name: None,
        utilization_gpu: None,
        utilization_memory: None,
        top_stranded_segments: top,
        alloc_sizes: alloc_sizes.distribution(),
        free_runs: runs.distribution(),
    }
}

impl Summary {
    /// Adds who each process is (`state.identities`) and each device's UUID (`attribution`'s
    /// node GPUs) to the figures: the live front ends call this; a replayed record has neither.
    pub fn attribute(&mut self, state: &State, attribution: &crate::attribution::Attribution) {
        let uuid = |d: i16| attribution.gpu_uuid(d).map(str::to_string);
        let parent = |d: i16| attribution.mig_parent(d).map(str::to_string);
        for d in &mut self.devices {
            d.hw_id = uuid(d.device);
            d.mig_parent = parent(d.device);
        }
        for p in &mut self.processes {
            p.figures.hw_id = uuid(p.figures.device);
            p.figures.mig_parent = parent(p.figures.device);
        }
        for o in &mut self.ooms {
            o.hw_id = uuid(o.device);
        }
        self.identify(state);
    }

    /// Adds who each process is (`state.identities`: executable, container, pod) to the
    /// processes and OOMs (the live views, which see the state but not the GPU table).
    pub fn identify(&mut self, state: &State) {
        for p in &mut self.processes {
            if let Some(id) = state.identities.get(&p.pid) {
                p.exe = Some(id.exe.clone());
                p.container_id = id.container_id.clone();
                p.k8s_pod_uid = id.pod_uid.clone();
                p.k8s_pod_name = id.pod_name.clone();
                p.k8s_namespace_name = id.namespace.clone();
                p.k8s_container_name = id.container_name.clone();
                p.identity_source = id.identity_source.map(String::from);
                p.assigned_gpus = id.assigned_gpus.clone();
            }
        }
        for o in &mut self.ooms {
            o.container_id = state.identities.get(&o.pid).and_then(|id| id.container_id.clone());
        }
    }

    /// `pid P`, with its pod (`NAMESPACE/NAME`) or container (first 12 hex digits) when known:
    /// how views name a process.
    pub fn process_label(p: &ProcessSummary) -> String {
        match (&p.k8s_namespace_name, &p.k8s_pod_name, &p.container_id) {
            (Some(ns), Some(pod), _) => format!("pid {} {ns}/{pod}", p.pid),
            (None, Some(pod), _) => format!("pid {} {pod}", p.pid),
            (_, None, Some(c)) => format!("pid {} ctr {}", p.pid, &c[..c.len().min(12)]),
            _ => format!("pid {}", p.pid),
        }
    }

    /// Each process's driver bytes by owner (the summary's `owners`), largest first, for the
    /// views: only processes whose driver memory is split between two owners or more (one owner
    /// alone, the program itself or the framework, says nothing its reserved bytes do not).
    pub fn owner_splits(&self) -> Vec<(&ProcessSummary, Vec<(&str, u64)>)> {
        self.processes
            .iter()
            .filter(|p| p.owners.len() > 1)
            .map(|p| {
                let mut o: Vec<(&str, u64)> = p.owners.iter().map(|(k, &b)| (k.as_str(), b)).collect();
                o.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
                (p, o)
            })
            .collect()
    }

    /// The summary of `state`, for `source`.
    pub fn from_state(state: &State, source: &str) -> Summary {
        let (devices, processes) = device_and_process_summaries(state);
        let driver_failures =
            state.ooms.iter().filter(|o| o.op != Some(crate::event::EventKind::BlockAlloc) && !o.counts_as_oom()).count() as u64;
        let mut summary = Summary {
            schema: SCHEMA_VERSION,
            source: source.to_string(),
            exact: state.exact(),
            notes: state_notes(state),
            devices,
            processes,
            ooms: oom_summaries(state),
            events: state.events - state.drop_markers,
            dropped: state.dropped,
            anomalies: state.anomaly_count,
            driver_failures,
            retries: state.retries_total(),
            framework_stats: Vec::new(),
            whatif: None,
            failed_calls: state.failed_calls.iter().map(FailedCallSummary::of).collect(),
            capture: None,
            coverage: None,
            warnings: state.forecast_warnings.clone(),
        };
        // The live pipeline's computed fix (one computation, every view of this state).
        if let Some(fix) = &state.computed_fix {
            put_fix(&mut summary, fix);
        }
        summary
    }
}

/// The figures of every device of `state`, and of every (process, device) on it.
fn device_and_process_summaries(state: &State) -> (Vec<DeviceSummary>, Vec<ProcessSummary>) {
    let mut devices = Vec::new();
    let mut processes = Vec::new();
    for device in state.device_ids() {
        let totals = state.devices.get(&device).copied().unwrap_or_default();
        let spaces: Vec<_> = state.spaces.values().filter(|s| s.device == device).collect();
        let f = state.device_figures(device);
        let mut d = device_summary(device, &f, totals.free, totals.total, &spaces);
        // NVML's reading of this device (crate::ingest::gpus), when the live pipeline took one.
        let gpu = state.gpus.as_ref().and_then(|g| Some((g, g.gpus.get(&device)?)));
        if let Some((g, r)) = gpu {
            d.nvml_used = g.used_on(device);
            d.gpu_name = r.name.clone();
            d.utilization_gpu = r.utilization_gpu;
            d.utilization_memory = r.utilization_memory;
        }
        devices.push(d);
        for s in &spaces {
            let mut figures = device_summary(device, &s.map.figures(), totals.free, totals.total, std::slice::from_ref(s));
            figures.nvml_used = gpu.and_then(|(g, _)| g.used_by(s.pid, device));
            processes.push(ProcessSummary {
                pid: s.pid,
                figures,
                allocs: s.allocs,
                frees: s.frees,
                retries: state.retries_of(s.pid, device),
                framework: s.framework,
                exe: None,
                container_id: None,
                k8s_pod_uid: None,
                k8s_pod_name: None,
                k8s_namespace_name: None,
                k8s_container_name: None,
                identity_source: None,
                assigned_gpus: None,
                exited: state.exited.contains_key(&s.pid),
                owners: owner_bytes(&s.owners),
            });
        }
    }
    (devices, processes)
}

/// The OOMs of `state`.
fn oom_summaries(state: &State) -> Vec<OomSummary> {
    // One rule decides what an OOM is (crate::ingest::oom_rule): the records decided OOMs, in
    // the order decided, then those still undecided at the end of the trace (nothing
    // recovered them). Retries and the tries folded into an OOM are counted, not listed.
    let mut finals: Vec<&crate::ingest::OomRecord> = state.oom_log().iter().map(|&i| &state.ooms[i]).collect();
    finals.extend(state.ooms.iter().filter(|o| o.outcome == crate::ingest::OomOutcome::Pending));
    finals.into_iter().map(OomSummary::of).collect()
}

impl OomSummary {
    /// The summary of one OOM record, its verdict, explanation and fix included.
    fn of(o: &crate::ingest::OomRecord) -> OomSummary {
        let inputs = OomInputs::of(o);
        OomSummary {
            device: o.device,
            pid: o.pid,
            ts_ns: o.ts_ns,
            requested: o.requested,
            device_free: o.device_free.unwrap_or(0),
            device_free_known: o.device_free.is_some(),
            device_free_source: o.device_free_source.name().to_string(),
            device_free_age_ns: o.device_free_age_ns,
            device_free_after_ns: o.device_free_after_ns,
            map: o.figures,
            allowed: o.allowed,
            rc: o.rc,
            op: o.op.map_or("unknown", |k| k.name()).to_string(),
            verdict: super::sharing::verdict(o),
            explanation: super::sharing::explanation(o, &inputs),
            fix: super::sharing::fix(o, &inputs),
            driver_failures_before: o.driver_failures_before,
            framework: o.framework,
            hw_id: None,
            container_id: None,
            holders: o.shared.holders.clone(),
            limit: super::sharing::limit(o),
            missing: o.partial.map(crate::ingest::Partial::missing),
            event: Some(o.event),
        }
    }
}

impl FailedCallSummary {
    /// The summary of one failed call that was no OOM.
    fn of(c: &crate::ingest::FailedCall) -> FailedCallSummary {
        FailedCallSummary {
            device: c.device,
            pid: c.pid,
            ts_ns: c.ts_ns,
            requested: c.requested,
            rc: c.rc,
            op: c.op.map_or("unknown", |k| k.name()).to_string(),
        }
    }
}

/// The notes of `state`: what the figures miss (dropped events, anomalies), failed calls, facts
/// that changed nothing, retries, failed releases, warnings past those listed, unknown kinds and
/// XLA BFC instances outside the device segments.
fn state_notes(state: &State) -> Vec<String> {
    let mut notes = Vec::new();
    if state.dropped > 0 {
        notes.push(format!("{} events were dropped by the capture: figures are lower bounds", state.dropped));
    }
    if state.anomaly_count > 0 {
        notes.push(format!("{} events did not fit the traced state (lost or inconsistent events)", state.anomaly_count));
        for a in &state.anomalies {
            notes.push(format!("event {}: pid {} device {}: {}", a.index, a.pid, a.device, a.anomaly));
        }
    }
    if state.failed_call_count > 0 {
        let first: Vec<String> = state
            .failed_calls
            .iter()
            .take(3)
            .map(|c| format!("{} rc {} (pid {})", c.op.map_or("unknown", |k| k.name()), c.rc, c.pid))
            .collect();
        notes.push(format!(
            "{} allocation call(s) failed with codes other than out-of-memory, not counted as OOMs: {}",
            state.failed_call_count,
            first.join(", ")
        ));
    }
    if state.fact_note_count > 0 {
        notes.push(format!(
            "{} fact(s) a process stated about itself could not be used and changed nothing (settings that do not parse or name an unknown key, a framework's figures or allowed bytes for an OOM or a process never seen)",
            state.fact_note_count
        ));
        notes.extend(state.fact_notes.iter().cloned());
    }
    if state.retries_total() > 0 {
        notes.push(format!(
            "{} failed allocation(s) recovered (retries: the same thread's next allocation of that size succeeded after memory was released): not OOMs",
            state.retries_total()
        ));
    }
    if state.failed_releases > 0 {
        notes.push(format!(
            "{} release call(s) failed with an error code (the program's own error, a bad argument): the driver kept that memory, and so does the trace",
            state.failed_releases
        ));
    }
    let warned: u64 = state.forecast_warning_counts.values().sum();
    if warned > state.forecast_warnings.len() as u64 {
        notes.push(format!("{warned} foresight warnings: the first {} are listed", state.forecast_warnings.len()));
    }
    if state.unknown_kinds > 0 {
        notes.push(format!("{} events had a kind this build does not know", state.unknown_kinds));
    }
    for (&(pid, instance), i) in state.bfc_instances.iter().filter(|(_, i)| !i.device_pool).take(8) {
        notes.push(format!(
            "pid {pid}: XLA BFC allocator instance {instance:#x} handed out {} chunk(s) at {:#x}..={:#x}, outside every traced device segment (XLA's pinned-host allocator, another memory space's, or a pool mapped before tracing began): not counted in the device figures",
            i.chunks, i.lo, i.hi
        ));
    }
    notes
}

/// The fix of one OOM of the simulated device: the simulation's sentence, how it was had, and for
/// an allowed-limit verdict the cap's own fix beside it.
pub fn fix_text(f: &crate::ingest::fix::ComputedFix, verdict: crate::analysis::Verdict, own_fix: &str) -> String {
    let simulated = format!(
        "{} (simulated over {} allocator settings: gpufrag whatif FILE{})",
        f.sentence,
        f.whatif.scenarios,
        f.allowed.map_or(String::new(), |a| format!(" --memory-limit {a}"))
    );
    if verdict == crate::analysis::Verdict::AllowedLimit {
        format!("{simulated}; or {own_fix}")
    } else {
        simulated
    }
}

/// Puts a computed fix (or the note why there is none) into `summary`'s OOM verdicts.
pub fn put_fix(summary: &mut Summary, fix: &Result<crate::ingest::fix::ComputedFix, String>) {
    match fix {
        Err(note) => summary.notes.push(note.clone()),
        Ok(f) => {
            for o in summary.ooms.iter_mut().filter(|o| o.device == f.device) {
                o.fix = fix_text(f, o.verdict, &o.fix);
            }
            summary.whatif = Some(f.whatif.clone());
        }
    }
}

#[cfg(test)]
mod robustness_tests {
    use super::*;
    use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FRAMEWORK_OWNED};

    const GIB: u64 = 1 << 30;

    /// Issue 14: `largest allocatable` showed 144.09 GiB on a 139.80 GiB card: a device-free
    /// sample older than the process's segments, added to their releasable bytes.
    #[test]
    fn regression_largest_allocatable_never_exceeds_the_card() {
        let mut st = State::default();
        let total = 150_110_011_392; // 139.80 GiB
                                     // Free sampled before anything was allocated: nearly the whole card.
        st.apply(&Event { size: total, device_free: total - GIB, flags: F_DEVICE_FREE_KNOWN, ..Event::new(EventKind::DeviceInfo, 1, 0) });
        st.apply(&Event { addr: 1 << 40, size: 20 * GIB, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 1, 0) });
        let d = &Summary::from_state(&st, "t").devices[0];
        assert_eq!(d.map.releasable, 20 * GIB);
        assert!(d.largest_allocatable <= total, "largest allocatable {} above the card's {total}", d.largest_allocatable);
        assert_eq!(d.largest_allocatable, total - crate::analysis::DRIVER_SLACK);
    }

    /// Issue 14: the summary's event count included the sources' drop markers.
    #[test]
    fn regression_the_event_count_leaves_drop_markers_out() {
        let mut st = State::default();
        st.apply(&Event { addr: 1 << 40, size: GIB, ..Event::new(EventKind::MemAlloc, 1, 0) });
        st.apply(&Event { size: 5, ..Event::new(EventKind::Dropped, 1, 0) });
        let s = Summary::from_state(&st, "t");
        assert_eq!((s.events, s.dropped), (1, 5));
    }
}

#[cfg(test)]
mod figures_once_tests {
    use super::*;
    use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FRAMEWORK_OWNED};

    const MIB: u64 = 1 << 20;

    /// Two processes on device 0 (one with a caching allocator's split segment, one with a raw
    /// driver allocation) and a failed block request in the first.
    fn two_processes() -> State {
        let mut st = State::default();
        st.apply(&Event { size: 1 << 34, device_free: 1 << 33, flags: F_DEVICE_FREE_KNOWN, ..Event::new(EventKind::DeviceInfo, 1, 0) });
        st.apply(&Event { addr: 1 << 40, size: 20 * MIB, flags: F_FRAMEWORK_OWNED, ..Event::new(EventKind::MemAlloc, 1, 0) });
        st.apply(&Event { addr: 1 << 40, size: 4 * MIB, ..Event::new(EventKind::BlockAlloc, 1, 0) });
        st.apply(&Event { addr: (1 << 40) + 8 * MIB, size: 2 * MIB, ..Event::new(EventKind::BlockAlloc, 1, 0) });
        st.apply(&Event { addr: 1 << 41, size: 6 * MIB, ..Event::new(EventKind::MemAlloc, 2, 0) });
        st
    }

    /// The names `Figures` serializes, in its order: the one list.
    fn figure_names() -> Vec<String> {
        match serde_json::to_value(crate::map::Figures::default()).unwrap() {
            serde_json::Value::Object(m) => m.keys().cloned().collect(),
            v => panic!("figures serialize as an object, not {v}"),
        }
    }

    /// Issue 28: the figures were declared in five structs. Each device, process and OOM entry
    /// now carries the map's own `Figures`, all of them, in its order; a device's are its
    /// processes' combined by `Figures::merge`.
    #[test]
    fn every_entry_carries_the_maps_figures_in_one_order_and_a_device_is_its_processes_merged() {
        let st = two_processes();
        let s = Summary::from_state(&st, "t");
        let names = figure_names();
        assert_eq!(names.len(), 13, "{names:?}");
        let v = serde_json::to_value(&s).unwrap();
        for (what, entry) in [("device", &v["devices"][0]), ("process", &v["processes"][0]), ("process", &v["processes"][1])] {
            let keys: Vec<&String> = entry.as_object().unwrap().keys().filter(|k| names.contains(k)).collect();
            assert_eq!(keys, names.iter().collect::<Vec<_>>(), "{what} entry: {entry:#}");
        }
        let mut merged = crate::map::Figures::default();
        for sp in st.spaces.values() {
            merged.merge(&sp.map.figures());
        }
        assert_eq!(s.devices[0].map, merged);
        assert_eq!(s.devices[0].map.reserved, 26 * MIB);
        let one = st.spaces[&(1, 0)].map.figures().largest_free_block;
        assert!(one > 0);
        assert_eq!(s.devices[0].map.largest_free_block, one, "the larger of one process's, not a sum");
        assert_eq!(s.devices[0].map.level(), "block");
        assert_eq!(s.processes.iter().map(|p| p.figures.map.level()).collect::<Vec<_>>(), ["block", "segment"]);
    }

    /// The OOM entry's figures are the failing process's `Figures` at the failure, the same list.
    #[test]
    fn an_oom_entry_carries_the_failing_processs_figures_at_the_failure() {
        let mut st = two_processes();
        let at_failure = st.spaces[&(1, 0)].map.figures();
        st.apply(&Event { requested: 64 * MIB, rc: crate::ingest::RC_OUT_OF_MEMORY, ..Event::new(EventKind::AllocFailed, 1, 0) });
        let s = Summary::from_state(&st, "t");
        assert_eq!(s.ooms.len(), 1, "{:?}", s.ooms);
        assert_eq!(s.ooms[0].map, at_failure);
        let v = serde_json::to_value(&s.ooms[0]).unwrap();
        let names = figure_names();
        let keys: Vec<&String> = v.as_object().unwrap().keys().filter(|k| names.contains(k)).collect();
        assert_eq!(keys, names.iter().collect::<Vec<_>>(), "{v:#}");
    }

    /// A summary read back (`top --replay` of a summary, the tests) is the summary written, the
    /// flattened figures and `level` included; a `level` other than `block` or `segment` is an
    /// error naming it.
    #[test]
    fn a_summary_reads_back_to_itself_and_a_bad_level_is_named() {
        let mut st = two_processes();
        st.apply(&Event { requested: 64 * MIB, rc: crate::ingest::RC_OUT_OF_MEMORY, ..Event::new(EventKind::AllocFailed, 1, 0) });
        let s = Summary::from_state(&st, "t");
        let text = serde_json::to_string(&s).unwrap();
        let back: Summary = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "byte-identical when written again");
        let bad = text.replacen("\"level\":\"block\"", "\"level\":\"chunk\"", 1);
        let err = serde_json::from_str::<Summary>(&bad).unwrap_err().to_string();
        assert!(err.contains("level is `block` or `segment`, not `chunk`"), "{err}");
    }
}
