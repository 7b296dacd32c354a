//! NVML as the eBPF path's yardstick: per-process used bytes (running compute processes) to say
//! how much of a process's memory was allocated before gpufrag attached, and device free bytes
//! for an OOM seen by a uprobe. `libnvidia-ml.so.1` is loaded at run time (nvml-wrapper): a
//! machine without it simply has no coverage figures.
//!
//! Placement from the driver ([`DriverPlacer`]): a uprobe cannot call `cuDeviceGetUuid`, but
//! the driver's own list of who holds memory where is NVML's process list. When a process's
//! allocation on CUDA ordinal d succeeded, its memory is on the GPU behind d, so that GPU is
//! among those NVML lists the process on; when exactly one of them is not already the GPU of
//! another of its ordinals, it is d's. The placer says so as a `DeviceUuid` event (flagged
//! `F_SRC_NVML`), which the pipeline takes over the process's environment; otherwise the
//! environment stays the fallback.
//!
//! MIG (`crate::attribution::mig`): the instances are walked once when NVML is opened, in the
//! attribution's order, so node device `n + k` (n GPUs) is instance k here too. A process on an
//! instance is looked for on the instance's handle (its own process list and memory), and a GPU
//! in MIG mode is not itself a place a process is put: its instances are.

use crate::event::{Event, EventKind, F_SRC_EBPF, F_SRC_NVML};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::collections::{BTreeMap, HashMap};

/// A loaded NVML.
pub struct DeviceMonitor {
    nvml: Nvml,
    /// NVML's GPU count when opened.
    gpus: u32,
    /// The MIG instances, (GPU, MIG index), in node order (instance k is node device gpus + k).
    migs: Vec<(u32, u32)>,
}

impl DeviceMonitor {
    fn new(nvml: Nvml) -> DeviceMonitor {
        let gpus = nvml.device_count().unwrap_or(0);
        let migs =
            crate::attribution::mig::walk(&crate::attribution::mig::Wrapper(&nvml), gpus).0.into_iter().map(|(g, k, _)| (g, k)).collect();
        DeviceMonitor { nvml, gpus, migs }
    }

    /// Loads NVML; the error says why not (no driver, no library).
    pub fn open() -> Result<DeviceMonitor, String> {
        Nvml::init().map(DeviceMonitor::new).map_err(|e| format!("NVML unavailable: {e}"))
    }

    /// The handle of node device `index`: a GPU, or a MIG instance's handle.
    fn handle(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, String> {
        match index.checked_sub(self.gpus) {
            None => self.nvml.device_by_index(index).map_err(|e| format!("NVML device {index}: {e}")),
            Some(k) => {
                let &(g, m) = self.migs.get(k as usize).ok_or_else(|| format!("device {index} is no NVML device nor MIG instance"))?;
                self.nvml
                    .device_by_index(g)
                    .and_then(|d| d.mig_device_by_index(m))
                    .map_err(|e| format!("NVML MIG instance {m} of GPU {g}: {e}"))
            }
        }
    }

    /// The node devices a process may be placed on: GPUs not in MIG mode, and every instance.
    fn places(&self) -> Vec<u32> {
        (0..self.gpus)
            .filter(|g| !self.migs.iter().any(|(p, _)| p == g))
            .chain((0..self.migs.len() as u32).map(|k| self.gpus + k))
            .collect()
    }

    /// NVML at `lib` (`None`: the default `libnvidia-ml.so.1`; `none`: no NVML).
    pub fn open_lib(lib: Option<&str>) -> Result<DeviceMonitor, String> {
        match lib {
            Some("none") => Err("NVML turned off (GPUFRAG_NVML_LIB=none)".to_string()),
            Some(path) => Nvml::builder()
                .lib_path(std::ffi::OsStr::new(path))
                .init()
                .map(DeviceMonitor::new)
                .map_err(|e| format!("NVML unavailable at {path}: {e}")),
            None => DeviceMonitor::open(),
        }
    }

    /// The compute processes NVML lists on device `index`: (pid, used bytes; `None` where NVML
    /// cannot say, as under MIG without privileges), or NVML's error.
    pub fn processes_on(&self, index: i16) -> crate::ingest::holders::NvmlList {
        let i = u32::try_from(index).map_err(|_| format!("device {index} is no NVML index"))?;
        let dev = self.handle(i)?;
        let procs = dev.running_compute_processes().map_err(|e| format!("NVML running processes of device {i}: {e}"))?;
        Ok(procs.into_iter().map(|p| (p.pid, if let UsedGpuMemory::Used(b) = p.used_gpu_memory { Some(b) } else { None })).collect())
    }

    /// Used bytes per (pid, device) as NVML reports them, for every compute process.
    pub fn process_used(&self) -> BTreeMap<(u32, i16), u64> {
        let mut out = BTreeMap::new();
        for i in self.places() {
            let Ok(dev) = self.handle(i) else { continue };
            let Ok(procs) = dev.running_compute_processes() else { continue };
            for p in procs {
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    *out.entry((p.pid, i as i16)).or_insert(0) += b;
                }
            }
        }
        out
    }

    /// The node devices NVML lists `pid` on (running compute processes: GPUs, MIG instances),
    /// as (node index, UUID).
    pub fn gpus_of(&self, pid: u32) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for i in self.places() {
            let Ok(dev) = self.handle(i) else { continue };
            let Ok(procs) = dev.running_compute_processes() else { continue };
            if procs.iter().any(|p| p.pid == pid) {
                if let Ok(u) = dev.uuid() {
                    out.push((i, u));
                }
            }
        }
        out
    }

    /// (total, free) bytes of node device `index` (a MIG instance's own).
    pub fn device_memory(&self, index: i16) -> Option<(u64, u64)> {
        let dev = self.handle(u32::try_from(index).ok()?).ok()?;
        let m = dev.memory_info().ok()?;
        Some((m.total, m.free))
    }

    /// Every node device's name, utilization and compute processes' used bytes, read now
    /// (`crate::ingest::gpus`); what NVML does not answer is left `None`. The name is asked
    /// once per device: `names` keeps it between readings.
    pub fn read_gpus(&self, names: &mut BTreeMap<i16, Option<String>>) -> crate::ingest::gpus::GpuReadings {
        let mut out = crate::ingest::gpus::GpuReadings { at_ns: now_ns(), gpus: BTreeMap::new() };
        for i in 0..self.device_count() {
            let Ok(dev) = self.handle(i) else { continue };
            let Ok(index) = i16::try_from(i) else { continue };
            let name = names.entry(index).or_insert_with(|| dev.name().ok()).clone();
            // NVML answers utilization for a whole GPU only (not a MIG instance): NOT_SUPPORTED there.
            let util = dev.utilization_rates().ok();
            let processes = dev.running_compute_processes().ok().map(|procs| {
                let mut used = BTreeMap::new();
                for p in procs {
                    if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                        *used.entry(p.pid).or_insert(0u64) += b;
                    }
                }
                used
            });
            out.gpus.insert(
                index,
                crate::ingest::gpus::GpuReading {
                    name,
                    utilization_gpu: util.as_ref().map(|u| u.gpu),
                    utilization_memory: util.as_ref().map(|u| u.memory),
                    processes,
                },
            );
        }
        out
    }

    /// Number of node devices: the GPUs, then the MIG instances.
    pub fn device_count(&self) -> u32 {
        self.gpus + self.migs.len() as u32
    }
}

/// NVML's process list read at each OOM the live pipeline applies (`crate::ingest::holders`): opened
/// on the first OOM, its problems counted for the summary's notes.
#[derive(Default)]
pub struct HolderReader {
    lib: Option<String>,
    monitor: Option<Result<DeviceMonitor, String>>,
    /// Reads that returned a list.
    pub reads: u64,
    /// What went wrong, counted.
    pub problems: crate::ingest::holders::NvmlProblems,
    /// Why NVML could not be opened, when it could not.
    pub unavailable: Option<String>,
    /// Each node device's name, asked of NVML once.
    names: BTreeMap<i16, Option<String>>,
}

impl HolderReader {
    /// A reader of the NVML at `lib` (see [`DeviceMonitor::open_lib`]).
    pub fn new(lib: Option<&str>) -> HolderReader {
        HolderReader { lib: lib.map(str::to_string), ..HolderReader::default() }
    }

    /// The node's GPUs read now (names, utilization, per-process used bytes: what `top` shows
    /// beside the traced figures), through the one NVML the holders are read from; `None` when
    /// NVML cannot be opened (said in the notes only where an OOM needed its holders).
    pub fn read_gpus(&mut self) -> Option<crate::ingest::gpus::GpuReadings> {
        let lib = self.lib.clone();
        match self.monitor.get_or_insert_with(|| DeviceMonitor::open_lib(lib.as_deref())) {
            Ok(m) => Some(m.read_gpus(&mut self.names)),
            Err(_) => None,
        }
    }

    /// Adds NVML's list of node GPU `device` to `h` (the OOM of `failing`); names from `/proc`.
    pub fn add(&mut self, h: &mut crate::ingest::holders::Holders, failing: u32, device: i16) {
        let lib = self.lib.clone();
        let m = self.monitor.get_or_insert_with(|| DeviceMonitor::open_lib(lib.as_deref()));
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                self.unavailable = Some(e.clone());
                return;
            }
        };
        let list = m.processes_on(device);
        if list.is_ok() {
            self.reads += 1;
        }
        let p = crate::ingest::holders::add_untraced(h, failing, &list, |pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
        });
        self.problems.errors += p.errors;
        self.problems.unknown_pids += p.unknown_pids;
    }

    /// The summary's notes: what NVML's list could not say.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.problems.errors > 0 {
            out.push(format!(
                "holders: NVML's process list failed at {} OOM(s): only traced processes are named as holders there",
                self.problems.errors
            ));
        }
        if self.problems.unknown_pids > 0 {
            out.push(format!(
                "holders: NVML named {} pid(s) with no /proc entry here (another pid namespace, or gone): listed by pid only",
                self.problems.unknown_pids
            ));
        }
        if let Some(e) = &self.unavailable {
            out.push(format!("holders: {e}: untraced processes holding a GPU are not named"));
        }
        out
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// How many processes the placer remembers (their placed ordinals); beyond it, the oldest
/// knowledge is dropped and a process may be looked up again (bounded either way).
const PLACER_PROCESSES: usize = 4096;

/// How many NVML lookups one process gets for one ordinal (an allocation NVML does not show
/// yet, or ambiguity, is retried on later allocations, then left to the environment).
const TRIES: u8 = 3;

/// Places each process's ordinals on GPUs from NVML's process list (see the module text).
#[derive(Default)]
pub struct DriverPlacer {
    /// Per pid: ordinal → (NVML index when placed, tries).
    seen: HashMap<u32, BTreeMap<i16, (Option<u32>, u8)>>,
}

/// Whether `e` is a successful allocation whose memory is on its device.
fn holds_memory(e: &Event) -> bool {
    matches!(
        e.kind(),
        Some(EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::PhysCreate | EventKind::PoolAlloc | EventKind::MemAllocManaged)
    ) && e.rc == 0
}

impl DriverPlacer {
    /// A `DeviceUuid` event placing `e`'s ordinal, when `e` is a process's allocation on an
    /// ordinal not placed yet and `lookup` (NVML's list of the GPUs holding the pid) decides it.
    pub fn place(&mut self, e: &Event, lookup: impl FnOnce(u32) -> Vec<(u32, String)>) -> Option<Event> {
        if e.pid == 0 || e.device < 0 || !holds_memory(e) {
            return None;
        }
        if self.seen.len() >= PLACER_PROCESSES && !self.seen.contains_key(&e.pid) {
            self.seen.clear();
        }
        let mine = self.seen.entry(e.pid).or_default();
        let entry = mine.entry(e.device).or_insert((None, 0));
        if entry.0.is_some() || entry.1 >= TRIES {
            return None;
        }
        entry.1 += 1;
        let taken: Vec<u32> = mine.iter().filter(|(&o, _)| o != e.device).filter_map(|(_, p)| p.0).collect();
        let left: Vec<(u32, String)> = lookup(e.pid).into_iter().filter(|(i, _)| !taken.contains(i)).collect();
        let [(index, uuid)] = left.as_slice() else { return None };
        let bytes = crate::attribution::gpu::uuid_bytes(uuid)?;
        mine.insert(e.device, (Some(*index), TRIES));
        Some(Event {
            ts_ns: e.ts_ns,
            addr: u64::from_be_bytes(bytes[..8].try_into().ok()?),
            size: u64::from_be_bytes(bytes[8..].try_into().ok()?),
            flags: F_SRC_EBPF | F_SRC_NVML,
            ..Event::new(EventKind::DeviceUuid, e.pid, e.device)
        })
    }

    /// Forgets `pid` (its process is gone).
    pub fn forget(&mut self, pid: u32) {
        self.seen.remove(&pid);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn alloc(pid: u32, device: i16) -> Event {
        Event { size: 1 << 20, addr: 0x7000_0000, ..Event::new(EventKind::MemAlloc, pid, device) }
    }

    const U3: &str = "GPU-00000003-1111-2222-3333-444455556663";
    const U1: &str = "GPU-00000001-1111-2222-3333-444455556661";

    #[test]
    fn one_gpu_listed_places_the_ordinal() {
        let mut p = DriverPlacer::default();
        let e = p.place(&alloc(7, 0), |_| vec![(3, U3.into())]).unwrap();
        assert_eq!((e.kind(), e.pid, e.device), (Some(EventKind::DeviceUuid), 7, 0));
        assert_eq!(crate::attribution::gpu::event_uuid(&e), crate::attribution::gpu::uuid_bytes(U3).unwrap());
        assert!(p.place(&alloc(7, 0), |_| panic!("placed once")).is_none());
        assert!(p.place(&Event::new(EventKind::MemFree, 7, 1), |_| panic!("a free says nothing")).is_none());
    }

    #[test]
    fn a_second_ordinal_takes_the_gpu_left_and_ambiguity_places_nothing() {
        let mut p = DriverPlacer::default();
        assert!(p.place(&alloc(7, 0), |_| vec![(3, U3.into()), (1, U1.into())]).is_none(), "two GPUs, one ordinal: unknown");
        assert!(p.place(&alloc(7, 0), |_| vec![(3, U3.into())]).is_some(), "retried on a later allocation");
        let e = p.place(&alloc(7, 1), |_| vec![(3, U3.into()), (1, U1.into())]).unwrap();
        assert_eq!(crate::attribution::gpu::event_uuid(&e), crate::attribution::gpu::uuid_bytes(U1).unwrap());
        let mut q = DriverPlacer::default();
        for _ in 0..TRIES {
            assert!(q.place(&alloc(8, 0), |_| Vec::new()).is_none());
        }
        assert!(q.place(&alloc(8, 0), |_| panic!("given up: the environment decides")).is_none());
    }
}
