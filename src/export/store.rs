//! The hand-off between the capture path and the exporters. The observer's `tick` (on the live
//! loop, every ~500 ms) turns the [`State`] into a small [`Snapshot`] and swaps it into the
//! [`Store`] (one pointer swap under a mutex); the exporters read it on their own threads, each
//! through its own [`Reader`], so export never runs on, nor waits for, the capture path.
//!
//! A [`Reader`] applies the exit rule: a process that exited is exported once more (its last
//! figures reach that reader's next collection) and then left out. Device figures are summed over
//! the processes that same view exports, so a device's series always equals the sum of its
//! process series in one export.

use super::gpu::GpuIds;
use crate::analysis::Verdict;
use crate::ingest::histogram::{SizeStats, BUCKET_BOUNDS};
use crate::ingest::State;
use crate::map::Figures;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// Buckets of the allocation-size histogram: one per bound of [`BUCKET_BOUNDS`] and a last,
/// unbounded one.
pub const BUCKETS: usize = BUCKET_BOUNDS.len() + 1;

/// How long an exited process stays in snapshots (so that every reader exports it once more,
/// even one whose interval is long); afterwards it is left out for good.
pub const EXITED_KEEP: Duration = Duration::from_secs(600);

/// A process's figures on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessPoint {
    /// Process id.
    pub pid: u32,
    /// Base name of its executable (`unknown` when it could not be read).
    pub exe: Arc<str>,
    /// CUDA ordinal.
    pub device: i16,
    /// The device's `hw.id`.
    pub hw_id: Arc<str>,
    /// The map's figures.
    pub figures: Figures,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// OOMs by verdict, in the order of [`Verdict::ALL`].
    pub ooms: [u64; Verdict::ALL.len()],
    /// Recovered failed allocations (`crate::ingest::OomOutcome::Retry`).
    pub retries: u64,
    /// Of those, the OOMs at which other processes held memory on the GPU, by who they were:
    /// traced only, untraced only (NVML's list), both (`crate::ingest::holders::Holders::kind`).
    pub ooms_held: [u64; 3],
    /// Foresight's latest forecast of the process's peak reserved bytes on the device, when one
    /// was made (`crate::ingest::forecasts`).
    pub predicted_peak: Option<u64>,
    /// Foresight's warnings so far (forecasts whose simulated steps do not fit).
    pub warnings: u64,
    /// The caching allocator whose blocks it uses, when one was seen (the `gpufrag.framework`
    /// attribute: one of [`crate::alloc::Framework::ALL`]'s names, or `none`).
    pub framework: Option<crate::alloc::Framework>,
    /// Its live driver bytes by owner, in [`crate::owner::Owner::ALL`]'s order, when any
    /// allocation's owner was said (`crate::ingest::owners`).
    pub owners: Option<[u64; crate::owner::Owner::ALL.len()]>,
    /// Whether the process exited.
    pub exited: bool,
    /// Its container and pod, when known (`container.id`, `k8s.*`).
    pub identity: Option<Arc<crate::attribution::Identity>>,
}

/// What is known of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePoint {
    /// CUDA ordinal.
    pub device: i16,
    /// `hw.id`: the GPU's UUID, or `gpu-<index>` without NVML.
    pub hw_id: Arc<str>,
    /// `hw.model`, `hw.vendor`, `hw.driver_version` from NVML.
    pub hardware: Arc<super::gpu::Hardware>,
    /// Total bytes, when measured.
    pub total: Option<u64>,
    /// Free bytes, when measured.
    pub free: Option<u64>,
}

/// The cumulative allocation-size histogram of one device and level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistPoint {
    /// CUDA ordinal.
    pub device: i16,
    /// The device's `hw.id`.
    pub hw_id: Arc<str>,
    /// `block` (framework blocks) or `segment` (driver segments).
    pub level: &'static str,
    /// Counts per bucket (`(previous bound, bound]`, the last unbounded).
    pub buckets: [u64; BUCKETS],
    /// Number of values.
    pub count: u64,
    /// Sum of values, bytes.
    pub sum: u64,
}

/// The state as the exporters see it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Increases with every snapshot.
    pub seq: u64,
    /// When it was taken.
    pub taken: SystemTime,
    /// Per process and device, by (pid, device).
    pub processes: Vec<ProcessPoint>,
    /// Per device, by ordinal.
    pub devices: Vec<DevicePoint>,
    /// Allocation sizes per device and level, over every process ever traced.
    pub alloc_sizes: Vec<HistPoint>,
    /// Events the sources dropped.
    pub dropped: u64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot { seq: 0, taken: SystemTime::now(), processes: Vec::new(), devices: Vec::new(), alloc_sizes: Vec::new(), dropped: 0 }
    }
}

/// A device's figures in one view: summed over the processes the view exports.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceView {
    /// CUDA ordinal.
    pub device: i16,
    /// `hw.id`.
    pub hw_id: Arc<str>,
    /// `hw.model`, `hw.vendor`, `hw.driver_version` from NVML.
    pub hardware: Arc<super::gpu::Hardware>,
    /// The exported processes' figures, combined by [`Figures::merge`] (sums; the largest free
    /// block is the largest of one process's).
    pub figures: Figures,
    /// Device free, when measured.
    pub free: Option<u64>,
    /// Device total, when measured.
    pub total: Option<u64>,
    /// Device memory in use that no traced process accounts for. `run` traces every process it
    /// starts and knows nothing else on the device: 0. (`attach` and `agent` fill it from NVML.)
    pub unattributed: u64,
}

/// What one reader exports in one collection.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The snapshot it was made from.
    pub seq: u64,
    /// Processes exported.
    pub processes: Vec<ProcessPoint>,
    /// Devices, figures summed over `processes`.
    pub devices: Vec<DeviceView>,
    /// Allocation sizes.
    pub alloc_sizes: Vec<HistPoint>,
    /// Dropped events.
    pub dropped: u64,
    /// Exited processes this view exports for the last time.
    exited_now: Vec<u32>,
}

impl View {
    /// The part of this view that one OTLP resource reports: `None`, the node's (devices,
    /// histograms, dropped events; no process); `Some(pid)`, that process's points, with the
    /// devices its figures read (free bytes) but no histogram.
    pub fn scoped(&self, pid: Option<u32>) -> View {
        let (processes, alloc_sizes, dropped) = match pid {
            None => (Vec::new(), self.alloc_sizes.clone(), self.dropped),
            Some(pid) => (self.processes.iter().filter(|p| p.pid == pid).cloned().collect(), Vec::new(), 0),
        };
        View { seq: self.seq, processes, devices: self.devices.clone(), alloc_sizes, dropped, exited_now: Vec::new() }
    }

    /// The pids this view exports, each once, in order.
    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.processes.iter().map(|p| p.pid).collect();
        v.dedup();
        v
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The latest snapshot.
#[derive(Debug, Default)]
pub struct Store {
    latest: Mutex<Arc<Snapshot>>,
}

impl Store {
    /// Replaces the snapshot.
    pub fn put(&self, s: Snapshot) {
        *lock(&self.latest) = Arc::new(s);
    }
    /// The snapshot.
    pub fn get(&self) -> Arc<Snapshot> {
        lock(&self.latest).clone()
    }
}

/// One exporter's window on the store, with its own exit bookkeeping.
#[derive(Debug)]
pub struct Reader {
    store: Arc<Store>,
    /// Exited pids this reader has exported for the last time.
    done: Mutex<BTreeSet<u32>>,
    /// The view of the collection in progress, and when it was made.
    current: Mutex<Option<(Instant, Arc<View>)>>,
}

/// A view older than this is not reused by a collection (one collection takes milliseconds).
const VIEW_REUSE: Duration = Duration::from_secs(2);

impl Reader {
    /// A reader of `store`.
    pub fn new(store: Arc<Store>) -> Reader {
        Reader { store, done: Mutex::new(BTreeSet::new()), current: Mutex::new(None) }
    }

    /// The view of the collection in progress: every call until [`Reader::collected`] returns the
    /// same one, so all metrics of one export come from one snapshot.
    pub fn view(&self) -> Arc<View> {
        let mut cur = lock(&self.current);
        if let Some((at, v)) = cur.as_ref() {
            if at.elapsed() < VIEW_REUSE {
                return v.clone();
            }
        }
        let v = Arc::new(self.make_view(&self.store.get()));
        *cur = Some((Instant::now(), v.clone()));
        v
    }

    /// Ends a collection. When it was delivered, the exited processes it carried are left out
    /// from now on; when it was not (the collector is down), they stay for the next one.
    pub fn collected(&self, delivered: bool) {
        if let Some((_, v)) = lock(&self.current).take() {
            if delivered {
                lock(&self.done).extend(v.exited_now.iter().copied());
            }
        }
    }

    fn make_view(&self, s: &Snapshot) -> View {
        let mut done = lock(&self.done);
        // Forget pids that left the snapshot (their exit was long ago).
        let still: BTreeSet<u32> = s.processes.iter().filter(|p| p.exited).map(|p| p.pid).collect();
        done.retain(|pid| still.contains(pid));
        let processes: Vec<ProcessPoint> = s.processes.iter().filter(|p| !(p.exited && done.contains(&p.pid))).cloned().collect();
        let mut exited_now: Vec<u32> = processes.iter().filter(|p| p.exited).map(|p| p.pid).collect();
        exited_now.dedup();
        let mut devices: Vec<DeviceView> = s
            .devices
            .iter()
            .map(|d| DeviceView {
                device: d.device,
                hw_id: d.hw_id.clone(),
                hardware: d.hardware.clone(),
                figures: Figures::default(),
                free: d.free,
                total: d.total,
                unattributed: 0,
            })
            .collect();
        for p in &processes {
            if let Some(d) = devices.iter_mut().find(|d| d.device == p.device) {
                d.figures.merge(&p.figures);
            }
        }
        View { seq: s.seq, processes, devices, alloc_sizes: s.alloc_sizes.clone(), dropped: s.dropped, exited_now }
    }
}

/// The exact bucket counts and sum of a size distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sizes {
    buckets: [u64; BUCKETS],
    count: u64,
    sum: u64,
}

impl Sizes {
    fn of(s: &SizeStats) -> Sizes {
        let d = s.distribution();
        let mut buckets = [0u64; BUCKETS];
        for b in &d.buckets {
            let i = BUCKET_BOUNDS.iter().position(|&le| le == b.le).unwrap_or(BUCKETS - 1);
            buckets[i] += b.count;
        }
        Sizes { buckets, count: d.count, sum: d.sum }
    }
}

/// Per-space cache of the size distributions (recomputed only when the space allocated since).
#[derive(Clone, Copy, Debug)]
struct SpaceSizes {
    allocs: u64,
    block: Sizes,
    segment: Sizes,
}

/// Turns states into snapshots; keeps what is costly to redo each tick, and what the state may
/// forget: the last figures of a process whose maps were dropped (`State::forget`, when the eBPF
/// path sees a process end), exported once more like any exited process, and the allocation
/// sizes of such processes, which stay in the cumulative histogram.
pub struct Builder {
    gpus: GpuIds,
    exe: HashMap<u32, Arc<str>>,
    exited_at: HashMap<u32, Instant>,
    sizes: HashMap<(u32, i16), SpaceSizes>,
    /// Sizes of spaces the state no longer has, per (device, level).
    retired: BTreeMap<(i16, &'static str), Sizes>,
    /// The last point of every (pid, device) shown.
    last: HashMap<(u32, i16), ProcessPoint>,
    seq: u64,
}

fn add_sizes(into: &mut Sizes, x: &Sizes) {
    for (a, b) in into.buckets.iter_mut().zip(x.buckets.iter()) {
        *a += b;
    }
    into.count += x.count;
    into.sum = into.sum.saturating_add(x.sum);
}

const NO_SIZES: Sizes = Sizes { buckets: [0; BUCKETS], count: 0, sum: 0 };

impl Builder {
    /// A builder naming GPUs with `gpus`.
    pub fn new(gpus: GpuIds) -> Builder {
        Builder {
            gpus,
            exe: HashMap::new(),
            exited_at: HashMap::new(),
            sizes: HashMap::new(),
            retired: BTreeMap::new(),
            last: HashMap::new(),
            seq: 0,
        }
    }

    /// Reads the name of `pid` now (called when it starts or execs, while it surely runs: a
    /// short-lived process may be gone by the next tick).
    pub fn note_process(&mut self, pid: u32) {
        self.exe.insert(pid, Arc::from(read_exe_name(pid).as_str()));
    }

    fn exe_name(&mut self, pid: u32) -> Arc<str> {
        self.exe.entry(pid).or_insert_with(|| Arc::from(read_exe_name(pid).as_str())).clone()
    }

    fn retire(&mut self, key: (u32, i16), sz: SpaceSizes) {
        for (level, x) in [("block", sz.block), ("segment", sz.segment)] {
            if x.count > 0 {
                add_sizes(self.retired.entry((key.1, level)).or_insert(NO_SIZES), &x);
            }
        }
    }

    /// The snapshot of `state`.
    pub fn build(&mut self, state: &State) -> Snapshot {
        self.seq += 1;
        let now = Instant::now();
        for pid in state.exited.keys() {
            self.exited_at.entry(*pid).or_insert(now);
        }
        // OOMs per (pid, device) and verdict: the records the state decided OOMs
        // (crate::ingest::oom_rule); one still undecided is counted once decided (a counter
        // never goes down), and at the end of the run every undecided one is decided.
        let mut ooms: BTreeMap<(u32, i16), [u64; Verdict::ALL.len()]> = BTreeMap::new();
        let mut held: BTreeMap<(u32, i16), [u64; 3]> = BTreeMap::new();
        for o in state.oom_log().iter().map(|&i| &state.ooms[i]) {
            ooms.entry((o.pid, o.device)).or_default()[crate::analysis::sharing::verdict(o).index()] += 1;
            if let Some(i) = crate::ingest::holders::HELD_KINDS.iter().position(|k| *k == o.shared.holders.kind()) {
                held.entry((o.pid, o.device)).or_default()[i] += 1;
            }
        }
        // Allocation sizes count every process ever traced (the histogram is cumulative): the
        // spaces of the state, plus those it no longer has.
        for (&key, s) in &state.spaces {
            let prev = self.sizes.get(&key).copied();
            if let Some(p) = prev.filter(|p| p.allocs > s.allocs) {
                // Fewer allocations than last time: a new process reuses the pid.
                self.retire(key, p);
            }
            let sz = match prev.filter(|p| p.allocs == s.allocs) {
                Some(p) => p,
                None => SpaceSizes { allocs: s.allocs, block: Sizes::of(&s.block_sizes), segment: Sizes::of(&s.segment_sizes) },
            };
            self.sizes.insert(key, sz);
        }
        let gone: Vec<(u32, i16)> = self.sizes.keys().filter(|k| !state.spaces.contains_key(k)).copied().collect();
        for k in gone {
            if let Some(sz) = self.sizes.remove(&k) {
                self.retire(k, sz);
            }
        }
        let mut hist: BTreeMap<(i16, &'static str), Sizes> = self.retired.clone();
        for (k, sz) in &self.sizes {
            for (level, x) in [("block", sz.block), ("segment", sz.segment)] {
                if x.count > 0 {
                    add_sizes(hist.entry((k.1, level)).or_insert(NO_SIZES), &x);
                }
            }
        }
        let mut processes = Vec::new();
        for (&(pid, device), s) in &state.spaces {
            let key = (pid, device);
            let exited = state.exited.contains_key(&pid);
            if exited && self.exited_at.get(&pid).is_some_and(|t| now.duration_since(*t) > EXITED_KEEP) {
                continue;
            }
            let identity = state.identities.get(&pid).cloned();
            let exe = match &identity {
                Some(id) => Arc::from(id.exe.as_str()),
                None => self.exe_name(pid),
            };
            let point = ProcessPoint {
                pid,
                exe,
                device,
                hw_id: self.gpus.id(device),
                figures: s.map.figures(),
                allocs: s.allocs,
                frees: s.frees,
                ooms: ooms.get(&key).copied().unwrap_or_default(),
                retries: state.retries_of(pid, device),
                ooms_held: held.get(&key).copied().unwrap_or_default(),
                predicted_peak: state.forecast_of(pid, device).map(|f| f.predicted_peak),
                warnings: state.forecast_warnings_of(pid, device),
                framework: s.framework,
                owners: s.owners.any_known().then(|| {
                    let mut b = [0u64; crate::owner::Owner::ALL.len()];
                    for (o, bytes) in s.owners.by_owner() {
                        b[o as usize - 1] = bytes;
                    }
                    b
                }),
                exited,
                identity,
            };
            self.last.insert(key, point.clone());
            processes.push(point);
        }
        // Spaces the state dropped: their last figures are shown as exited until EXITED_KEEP.
        let dropped_points: Vec<(u32, i16)> = self.last.keys().filter(|k| !state.spaces.contains_key(k)).copied().collect();
        for k in dropped_points {
            let since = *self.exited_at.entry(k.0).or_insert(now);
            if now.duration_since(since) > EXITED_KEEP {
                self.last.remove(&k);
            } else if let Some(p) = self.last.get_mut(&k) {
                p.exited = true;
                processes.push(p.clone());
            }
        }
        processes.sort_by_key(|p| (p.pid, p.device));
        // Forget names of processes no longer shown (a reused pid gets its own name), unless
        // just noted (a process that started but has not allocated yet).
        let shown: BTreeSet<u32> = processes.iter().map(|p| p.pid).collect();
        let noted_live = |pid: &u32| !state.exited.contains_key(pid);
        self.exe.retain(|pid, _| shown.contains(pid) || noted_live(pid));
        let devices = state
            .device_ids()
            .into_iter()
            .map(|d| {
                let t = state.devices.get(&d).copied().unwrap_or_default();
                DevicePoint { device: d, hw_id: self.gpus.id(d), hardware: self.gpus.hardware(d), total: t.total, free: t.free }
            })
            .collect();
        let alloc_sizes = hist
            .into_iter()
            .map(|((device, level), h)| HistPoint {
                device,
                hw_id: self.gpus.id(device),
                level,
                buckets: h.buckets,
                count: h.count,
                sum: h.sum,
            })
            .collect();
        Snapshot { seq: self.seq, taken: SystemTime::now(), processes, devices, alloc_sizes, dropped: state.dropped }
    }
}

/// The base name of `/proc/PID/exe`, else `/proc/PID/comm`, else `unknown`.
pub fn read_exe_name(pid: u32) -> String {
    if let Ok(p) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        if let Some(n) = p.file_name() {
            // A deleted executable reads as "name (deleted)".
            return n.to_string_lossy().trim_end_matches(" (deleted)").to_string();
        }
    }
    if let Ok(c) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        let c = c.trim();
        if !c.is_empty() {
            return c.to_string();
        }
    }
    "unknown".to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::event::{Event, EventKind};

    fn alloc(pid: u32, addr: u64, size: u64) -> Event {
        Event { addr, size, ..Event::new(EventKind::MemAlloc, pid, 0) }
    }

    fn builder() -> Builder {
        Builder::new(GpuIds::without_nvml())
    }

    /// Issue 13: page-stranded bytes were in no metric. Sub-2 MiB driver allocations packed two
    /// to a 2 MiB page, every other one freed: each page keeps half of itself stranded.
    #[test]
    fn regression_page_stranded_bytes_are_exported_per_process_and_device() {
        let mut st = State::default();
        let (mib, base) = (1u64 << 20, 1u64 << 40);
        let pages = 5u64;
        for i in 0..2 * pages {
            st.apply(&alloc(10, base + i * mib, mib));
        }
        for i in (0..2 * pages).step_by(2) {
            st.apply(&Event { addr: base + i * mib, ..Event::new(EventKind::MemFree, 10, 0) });
        }
        // The naive model: every page holds one live 1 MiB, so 1 MiB of it is stranded.
        let want = pages * mib;
        let store = Arc::new(Store::default());
        store.put(builder().build(&st));
        let r = Reader::new(store);
        let text = crate::export::prometheus::render(&r.view(), &[]);
        let value = |name: &str| -> u64 {
            let line = text.lines().find(|l| l.starts_with(name) && !l.starts_with('#')).unwrap_or_else(|| panic!("no {name} in\n{text}"));
            line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
        };
        assert_eq!(value("gpufrag_memory_page_stranded_bytes{"), want, "{text}");
        assert_eq!(value("gpufrag_process_memory_page_stranded_bytes{"), want, "{text}");
        // The verdict label set has every verdict, allowed_limit included, at 0.
        assert!(text.contains("gpufrag_verdict=\"allowed_limit\"} 0"), "{text}");
    }

    #[test]
    fn a_containers_process_carries_its_container_and_pod_until_dropped_after_exit() {
        let mut st = State::default();
        st.apply(&alloc(10, 1 << 30, 4 << 20));
        let id = crate::attribution::Identity {
            exe: "train".into(),
            container_id: Some("c0ffee".repeat(10) + "c0ff"),
            pod_uid: Some("b3922967-14e1-4867-9388-461bac94b37e".into()),
            pod_name: Some("trainer-0".into()),
            namespace: Some("ml".into()),
            ..Default::default()
        };
        st.identities.insert(10, Arc::new(id));
        let store = Arc::new(Store::default());
        let mut b = builder();
        store.put(b.build(&st));
        let r = Reader::new(store.clone());
        let attrs = super::super::catalog::process_attrs(&r.view().processes[0]);
        let keys: Vec<&str> = attrs.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "process.pid",
                "process.executable.name",
                "hw.id",
                "gpufrag.framework",
                "container.id",
                "k8s.pod.uid",
                "k8s.pod.name",
                "k8s.namespace.name"
            ]
        );
        assert_eq!(attrs[1].1.to_label(), "train");
        assert_eq!(attrs[3].1.to_label(), "none", "no caching allocator seen: a bounded value, not an absent attribute");
        r.collected(true);
        // It exits and the state forgets it (the agent): exported once more, with its pod, then gone.
        st.apply(&Event::new(EventKind::ProcessExit, 10, -1));
        st.forget(10);
        store.put(b.build(&st));
        let v = r.view();
        assert_eq!(v.processes.len(), 1);
        assert!(v.processes[0].exited && v.processes[0].identity.as_ref().is_some_and(|i| i.pod_name.as_deref() == Some("trainer-0")));
        r.collected(true);
        assert!(r.view().processes.is_empty());
    }

    #[test]
    fn an_exited_process_is_exported_once_more_then_dropped() {
        let mut st = State::default();
        st.apply(&alloc(10, 1 << 30, 4 << 20));
        st.apply(&alloc(11, 2 << 30, 8 << 20));
        let store = Arc::new(Store::default());
        let mut b = builder();
        store.put(b.build(&st));
        let r = Reader::new(store.clone());
        let v = r.view();
        assert_eq!(v.processes.len(), 2);
        assert_eq!(v.devices[0].figures.reserved, 12 << 20);
        r.collected(true);
        st.apply(&Event::new(EventKind::ProcessExit, 10, -1));
        store.put(b.build(&st));
        let v = r.view();
        assert_eq!(v.processes.len(), 2, "exported once more");
        assert!(v.processes.iter().any(|p| p.pid == 10 && p.exited));
        assert_eq!(v.devices[0].figures.reserved, 12 << 20);
        r.collected(true);
        let v = r.view();
        assert_eq!(v.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![11]);
        assert_eq!(v.devices[0].figures.reserved, 8 << 20, "the device sums what the view exports");
        // Another reader that never saw the exit still gets it once.
        let r2 = Reader::new(store);
        assert_eq!(r2.view().processes.len(), 2);
    }

    #[test]
    fn a_collection_sees_one_snapshot() {
        let mut st = State::default();
        st.apply(&alloc(10, 1 << 30, 4 << 20));
        let store = Arc::new(Store::default());
        let mut b = builder();
        store.put(b.build(&st));
        let r = Reader::new(store.clone());
        let first = r.view();
        st.apply(&alloc(10, 2 << 30, 4 << 20));
        store.put(b.build(&st));
        assert_eq!(r.view().seq, first.seq);
        r.collected(true);
        assert_eq!(r.view().devices[0].figures.reserved, 8 << 20);
    }

    #[test]
    fn a_forgotten_process_is_shown_once_more_and_its_sizes_stay() {
        let mut st = State::default();
        st.apply(&alloc(10, 1 << 30, 4 << 20));
        st.apply(&alloc(11, 2 << 30, 8 << 20));
        let store = Arc::new(Store::default());
        let mut b = builder();
        store.put(b.build(&st));
        let r = Reader::new(store.clone());
        assert_eq!(r.view().processes.len(), 2);
        r.collected(true);
        // What the eBPF path does when a process ends: its maps go.
        st.spaces.retain(|&(p, _), _| p != 10);
        store.put(b.build(&st));
        let v = r.view();
        assert!(v.processes.iter().any(|p| p.pid == 10 && p.exited && p.figures.reserved == 4 << 20), "{:?}", v.processes);
        r.collected(true);
        let v = r.view();
        assert_eq!(v.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![11]);
        assert_eq!(v.alloc_sizes[0].count, 2, "the histogram keeps the forgotten process's sizes");
    }

    #[test]
    fn allocation_sizes_are_exact_and_cumulative_over_exited_processes() {
        let mut st = State::default();
        st.apply(&alloc(10, 1 << 30, 512));
        st.apply(&alloc(10, 2 << 30, 513));
        st.apply(&alloc(11, 3 << 30, 1 << 30));
        st.apply(&Event::new(EventKind::ProcessExit, 10, -1));
        let s = builder().build(&st);
        assert_eq!(s.alloc_sizes.len(), 1);
        let h = &s.alloc_sizes[0];
        assert_eq!((h.level, h.count, h.sum), ("segment", 3, 512 + 513 + (1 << 30)));
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[1], 1);
        assert_eq!(h.buckets[21], 1, "1 GiB is the bound of bucket 21");
    }
}
