//! One tracing session: which processes to report (one pid and maybe its children, or all),
//! finding the CUDA libraries they map and probing each file once, noticing new processes and
//! files within a scan interval, ending processes that exit, turning lost ring-buffer records
//! into `Dropped` events, and measuring coverage against NVML. It holds no pipeline: each call
//! returns the [`Msg`]s it produced, in order, and the loop of `attach` / `agent` feeds them to the
//! same [`Live`](crate::live::Live) that `gpufrag run` feeds from the consumer's channel, so the
//! status line, OOM verdicts, record file, summary and observers are the same.
//!
//! A loop round is [`Session::step`], its messages applied, then [`Session::sample_nvml`] with the
//! state they built (NVML's per-process bytes are compared with the traced bytes of the same
//! moment, so the step that makes a sample due first brings the trace up to now).
//!
//! Traced from the first call. At start every libcuda the node has is probed (the dynamic
//! linker's cache and configuration, the usual driver directories, `/run/nvidia/driver`, each
//! also under `--host-root`), so a process started later is traced from its first call. A
//! libcuda or libc10_cuda file not probed yet that a process maps is reported by the
//! `security_mmap_file` kprobe and probed at once (the `/proc` scan stays as the fallback); a
//! process that mapped a file before its probes were in is declared inexact. Executables that
//! carry gpufrag's annotation USDT probes are probed when the scan first sees them (or up front
//! with `--lib`); with the agent's exec hold ([`super::exec_hold`]) an annotated executable's
//! first exec waits until its probes are in, so its first process is exact too.
//!
//! The moment of failure. A failed allocation wakes the reader at once (the BPF side forces the
//! wakeup); if the event carries no device free, NVML is read right then and, if the failing
//! process is still alive after the read, the figure goes into the stream as a `DeviceInfo` for
//! that pid ([`F_SRC_NVML`]): the state takes it only when the process made no reading of its own
//! near the failure (see `crate::ingest`).

use super::nvml::DeviceMonitor;
use super::processes::{coverage, Action, Coverage, ProcFs, ProcessTable};
use super::procfs::{self, FileId, LibKind};
use super::{Attached, ProbeError, ProbeOptions, Probes};
use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_SRC_EBPF, F_SRC_NVML};
use crate::ingest::State;
use crate::source::{now_ns, Msg};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Whom to trace.
#[derive(Clone, Debug)]
pub enum Target {
    /// One process, and with `follow` its descendants.
    Pid {
        /// The process.
        pid: u32,
        /// Its children too (forked after attaching, and those alive at attach time).
        follow: bool,
    },
    /// Every process that uses a probed library (the agent).
    All,
}

/// Session settings.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Whom.
    pub target: Target,
    /// Libraries to probe up front (libcuda or libc10_cuda, by file name), beyond what
    /// processes map and the libcuda they would load.
    pub libs: Vec<PathBuf>,
    /// How often `/proc` is scanned for new processes and libraries.
    pub scan_interval: Duration,
    /// Ring buffer bytes.
    pub ring_bytes: Option<u32>,
    /// Keep exited processes' final maps (attach: the summary) or forget them (agent).
    pub forget_on_exit: bool,
    /// Test hook: wait this long between ring drains (forces overflow with a small ring).
    pub drain_delay: Duration,
    /// The node's root file system as mounted into the agent's container (`--host-root`):
    /// its libcuda files are probed up front too.
    pub host_root: Option<PathBuf>,
    /// Exited processes whose final maps are kept (when not forgotten on exit); older ones are
    /// let go and counted.
    pub keep_exited_max: usize,
    /// Hold the first exec of each executable until its probes are in (the agent).
    pub exec_hold: Option<super::exec_hold::HoldOptions>,
}

/// A running session.
pub struct Session {
    opts: SessionOptions,
    probes: Probes,
    /// Processes and their incarnations.
    pub table: ProcessTable,
    /// (pid, start time) of processes that mapped a library before it was probed.
    preexisting: HashSet<(u32, u64)>,
    lost_seen: u64,
    last_scan: Instant,
    last_nvml: Instant,
    nvml: Option<DeviceMonitor>,
    /// (pid, device) → (NVML used bytes, traced bytes at that sample).
    nvml_used: BTreeMap<(u32, i16), (u64, u64)>,
    /// Notes for the summary (how each library is probed, what could not be).
    pub notes: Vec<String>,
    attached_notes: BTreeSet<FileId>,
    /// Probe events waiting out the reorder window, by (timestamp, arrival).
    reorder: BTreeMap<(u64, u64), Event>,
    seq: u64,
    /// Library mappings reported by the kprobe whose file is not in `/proc/PID/maps` yet, with
    /// the rounds tried.
    mapped_pending: Vec<(super::LibMapped, u32)>,
    /// Executables already checked for gpufrag's annotation probes.
    checked_exes: HashSet<FileId>,
    /// Who a held process is (its cgroup and pod namespace), read while its exec was held: a
    /// short-lived one may be gone by the time its first events are read (bounded).
    held_reads: BTreeMap<u32, crate::attribution::ProcRead>,
    /// Processes whose `/proc` entries could not be read (a coverage gap), counted once each.
    pub unreadable_procs: u64,
    unreadable: HashSet<u32>,
    /// Processes that ended before their (new) executable could be checked for annotation
    /// probes: declared inexact.
    unchecked_exec: HashSet<u32>,
    /// Failed allocations for which NVML was read at once.
    pub nvml_reads_at_failure: u64,
    /// Failed allocations whose process was gone before NVML could be read for them.
    pub failures_after_exit: u64,
    /// The trace is up to now and an NVML sample is due ([`Session::sample_nvml`]).
    nvml_due: bool,
    /// Which node GPU each process's CUDA ordinal is, for the NVML readings this session takes
    /// itself (the pipeline places the events with its own, fed the same `/proc` readings).
    placement: crate::attribution::Attribution,
    /// Places ordinals from NVML's process list (the driver's word, `DeviceUuid` events).
    placer: super::nvml::DriverPlacer,
    /// The exec hold, when on.
    hold: Option<super::exec_hold::ExecHold>,
}

/// How long probe events wait before they are applied, so that a free (stamped when its call
/// began) is applied before an allocation of the same address by another thread that returned
/// before the free's uretprobe ran.
const REORDER_WINDOW_NS: u64 = 50_000_000;

impl Session {
    /// Loads the probes, attaches what can be found now, and marks who is traced.
    pub fn start(opts: SessionOptions, what: &str) -> Result<Session, ProbeError> {
        super::check_privileges(what)?;
        let (trace_all, follow) = match opts.target {
            Target::All => (true, false),
            Target::Pid { follow, .. } => (false, follow),
        };
        let probes = Probes::load(&ProbeOptions { trace_all, follow_children: follow, ring_bytes: opts.ring_bytes }, what)?;
        let nvml = DeviceMonitor::open();
        let mut notes = Vec::new();
        let nvml = match nvml {
            Ok(n) => Some(n),
            Err(e) => {
                notes.push(format!("{e}: no coverage figures (NVML per-process used bytes)"));
                None
            }
        };
        let mut s = Session {
            table: {
                let mut t = ProcessTable::new(opts.forget_on_exit);
                t.keep_exited_max = opts.keep_exited_max;
                t
            },
            opts,
            probes,
            preexisting: HashSet::new(),
            lost_seen: 0,
            last_scan: Instant::now(),
            last_nvml: Instant::now() - Duration::from_secs(10),
            nvml,
            nvml_used: BTreeMap::new(),
            notes,
            attached_notes: BTreeSet::new(),
            reorder: BTreeMap::new(),
            seq: 0,
            mapped_pending: Vec::new(),
            checked_exes: HashSet::new(),
            held_reads: BTreeMap::new(),
            unreadable_procs: 0,
            unreadable: HashSet::new(),
            unchecked_exec: HashSet::new(),
            nvml_reads_at_failure: 0,
            failures_after_exit: 0,
            nvml_due: false,
            placement: crate::attribution::Attribution::for_node(None),
            placer: super::nvml::DriverPlacer::default(),
            hold: None,
        };
        if let Some(e) = &s.probes.mmap_probe_error {
            s.notes.push(format!("no kprobe on a kernel mmap function ({e}): a libcuda file not probed at start is found only by the /proc scan, every {} ms", s.opts.scan_interval.as_millis()));
        }
        if let Target::Pid { pid, follow } = s.opts.target {
            if !procfs::alive(pid) {
                return Err(ProbeError::Other(format!("no process {pid}")));
            }
            s.probes.trace(pid)?;
            if follow {
                for c in procfs::descendants(pid) {
                    s.probes.trace(c)?;
                }
            }
            // Probe the library the process would load before it does, so that a process caught
            // before its first CUDA call is traced exactly.
            let mut c = procfs::libcuda_candidates(pid);
            c.extend(procfs::node_libcuda(s.opts.host_root.as_deref()));
            s.attach_up_front(c)?;
        } else {
            // Where this process would load libcuda from (its LD_LIBRARY_PATH), and the node's.
            let mut c = procfs::libcuda_candidates(std::process::id());
            c.extend(procfs::node_libcuda(s.opts.host_root.as_deref()));
            s.attach_up_front(c)?;
        }
        // Before the first scan: whatever is exec'd after it is held.
        if let Some(h) = s.opts.exec_hold.clone() {
            match super::exec_hold::ExecHold::start(h) {
                Ok(hold) => match s.probes.add_wakeup(std::os::fd::AsRawFd::as_raw_fd(&hold.wake)) {
                    Ok(()) => s.hold = Some(hold),
                    Err(e) => s.notes.push(format!("exec hold off (its wake-up could not join the ring's epoll set: {e}): the first process of a new annotated executable is seen only after its exec")),
                },
                Err(e) => s.notes.push(format!("exec hold off (fanotify: {e}; it needs CAP_SYS_ADMIN and a kernel with FAN_OPEN_EXEC_PERM): the first process of a new annotated executable is seen only after its exec")),
            }
        }
        s.scan()?;
        Ok(s)
    }

    /// Serves the exec hold's requests: an annotated executable held at its exec is probed now
    /// and let go; a file looked at is not asked about again; processes the timeout released
    /// unprobed are declared not exact.
    fn serve_hold(&mut self) {
        let Some(h) = &self.hold else { return };
        super::exec_hold::drain_eventfd(std::os::fd::AsRawFd::as_raw_fd(&h.wake));
        let requests: Vec<super::exec_hold::Request> = h.requests.try_iter().collect();
        for r in requests {
            match r {
                super::exec_hold::Request::Probe { req, id, path, pid } => {
                    if self.held_reads.len() >= 4096 {
                        self.held_reads.clear();
                    }
                    self.held_reads.insert(pid, crate::attribution::ProcRead::read(std::path::Path::new("/proc"), pid));
                    self.checked_exes.insert(id);
                    let result = self.attach_file_as(LibKind::Annotated, &path, true).map_err(|e| e.to_string());
                    if let Err(e) = &result {
                        self.checked_exes.remove(&id);
                        self.notes.push(format!("could not probe the annotations in {} before its first exec ran: {e}", path.display()));
                    }
                    if let Some(h) = &self.hold {
                        h.answer(req, result);
                    }
                }
                super::exec_hold::Request::Looked(id) => {
                    if self.checked_exes.len() > 65_536 {
                        self.checked_exes.clear();
                    }
                    if self.checked_exes.insert(id) {
                        self.probes.mark_probed(id);
                    }
                }
                super::exec_hold::Request::Released { pids, path, .. } => {
                    for pid in pids {
                        if let Some(st) = procfs::stat(pid) {
                            self.preexisting.insert((pid, st.start_time));
                        }
                        self.table.mark_inexact(pid);
                        self.notes.push(format!(
                            "pid {pid}: its exec of {} was released by the hold's timeout before the probes were in: not exact",
                            path.display()
                        ));
                    }
                }
            }
        }
    }

    /// Registers the target process (and its children) before any event: a process that maps no
    /// probed library yet is traced from before its first CUDA call (exact). Returns the messages
    /// that say so.
    pub fn begin(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        if let Target::Pid { pid, follow } = self.opts.target {
            let mut pids = vec![pid];
            if follow {
                pids.extend(procfs::descendants(pid));
            }
            for p in pids {
                let Some(st) = procfs::stat(p) else { continue };
                let exact = !self.preexisting.contains(&(p, st.start_time));
                let acts = self.table.register(p, st.start_time, procfs::exe_name(p), exact, now_ns());
                self.apply(&mut out, acts);
            }
        }
        out
    }

    /// Probes the libraries named by the user (an error if one cannot be) and the libcuda
    /// candidates found (a note if one cannot be).
    fn attach_up_front(&mut self, candidates: Vec<PathBuf>) -> Result<(), ProbeError> {
        for p in self.opts.libs.clone() {
            let by_name = p.file_name().and_then(|n| LibKind::of(&n.to_string_lossy()));
            let kind = match by_name {
                Some(k) => k,
                None if !super::symbols::annotate_probes(&p).is_empty() => LibKind::Annotated,
                None => LibKind::Cuda,
            };
            self.attach_file(kind, &p).map_err(|e| match e {
                ProbeError::Other(m) => ProbeError::Other(format!("--lib {}: {m}", p.display())),
                other => other,
            })?;
        }
        let mut seen = HashSet::new();
        for p in candidates {
            if !procfs::file_id(&p).is_ok_and(|id| seen.insert(id)) {
                continue;
            }
            if let Err(e) = self.attach_file(LibKind::Cuda, &p) {
                if matches!(e, ProbeError::Privileges(_) | ProbeError::Unsupported(_)) {
                    return Err(e);
                }
                self.notes.push(format!("could not probe {}: {e}", p.display()));
            }
        }
        Ok(())
    }

    fn attach_file(&mut self, kind: LibKind, path: &std::path::Path) -> Result<(), ProbeError> {
        self.attach_file_as(kind, path, false)
    }

    /// [`Session::attach_file`]; `executable`: the file is an executable held at its exec, so
    /// the processes that ran it before are those whose `/proc/PID/exe` it is (a `stat` each,
    /// not a read of every process's maps: the hold waits on this).
    fn attach_file_as(&mut self, kind: LibKind, path: &std::path::Path, executable: bool) -> Result<(), ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if self.probes.has_file(&id) {
            return Ok(());
        }
        let how = self.probes.attach(kind, path)?.clone();
        if self.attached_notes.insert(id) {
            let note = match how {
                Attached::Driver { functions } => format!("driver level: uprobes on {functions} functions of {}", path.display()),
                Attached::Torch(blocks, raw, oom, fraction) => {
                    let raw_named = [(raw.alloc, "raw_alloc"), (raw.alloc_stream, "raw_alloc_with_stream"), (raw.delete, "raw_delete")]
                        .iter()
                        .filter(|(o, _)| o.is_some())
                        .map(|(_, n)| *n)
                        .collect::<Vec<_>>()
                        .join(", ");
                    let raw_note = if raw_named.is_empty() {
                        " (no raw_alloc/raw_delete found: blocks made through them, CUB's temporary storage and workspaces among them, go unseen)".to_string()
                    } else {
                        format!(", and uprobes on NativeCachingAllocator::{raw_named}")
                    };
                    let blocks = match blocks {
                        super::symbols::TorchProbes::Usdt => {
                            format!("PyTorch blocks: USDT probes pytorch:malloc/free in {}{raw_note}", path.display())
                        }
                        super::symbols::TorchProbes::Symbols { .. } => {
                            format!("PyTorch blocks: no USDT probes in {}; uprobes on NativeCachingAllocator::malloc and Native::local_raw_delete from .symtab{raw_note}", path.display())
                        }
                        super::symbols::TorchProbes::None(why) => format!("PyTorch blocks not traced: {why}"),
                    };
                    let fraction = match fraction {
                        super::symbols::TorchFractionProbe::Symbol { path, .. } => {
                            format!("memory fractions: a uprobe on {} in {}", super::symbols::TORCH_FRACTION, path.display())
                        }
                        super::symbols::TorchFractionProbe::None(why) => {
                            format!(
                                "memory fractions not probed ({why}): a cap set with set_per_process_memory_fraction has no allowed bytes"
                            )
                        }
                    };
                    let oom = match oom {
                        super::symbols::TorchOomProbe::Symbol { path, .. } => {
                            format!("PyTorch's OOMs: a uprobe on {} in {}", super::symbols::TORCH_OOM_REPORT, path.display())
                        }
                        super::symbols::TorchOomProbe::None(why) => {
                            format!("PyTorch's own OOMs not probed ({why}): one its allocator raises without a failed driver call (a memory fraction's cap) goes unseen")
                        }
                    };
                    format!("{blocks}; {oom}; {fraction}")
                }
                Attached::Bfc(super::symbols::BfcProbes::Symbols { allocate_plain, exported, .. }) => format!(
                    "XLA BFC blocks: uprobes on tsl::BFCAllocator::AllocateRaw{} and DeallocateRaw from {} of {}",
                    if allocate_plain.is_some() { " (both overloads)" } else { "" },
                    if exported { ".dynsym" } else { ".symtab" },
                    path.display()
                ),
                Attached::Bfc(super::symbols::BfcProbes::None(why)) => {
                    format!("XLA BFC blocks not traced: {why}; XLA's pool is seen at the segment level only (one mapping, in use in full)")
                }
                Attached::Annotations { probes } => {
                    format!("allocator blocks: {probes} gpufrag annotation USDT probes (include/gpufrag_annotate.h) in {}", path.display())
                }
            };
            self.notes.push(note);
        }
        // Whoever maps the file now may have called it before the probes were in.
        let runs = |pid: u32| {
            if executable {
                std::fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| m.dev() == id.dev && m.ino() == id.ino)
            } else {
                procfs::maps_file(pid, id)
            }
        };
        for pid in procfs::pids() {
            if pid != std::process::id() && runs(pid) {
                if let Some(st) = procfs::stat(pid) {
                    self.preexisting.insert((pid, st.start_time));
                    if self.table.get(pid).is_some_and(|p| p.start_time == st.start_time) {
                        self.table.mark_inexact(pid);
                    }
                }
            }
        }
        Ok(())
    }

    fn wanted(&self, pid: u32) -> bool {
        match self.opts.target {
            Target::All => true,
            Target::Pid { pid: p, .. } => p == pid || self.table.knows_live(pid),
        }
    }

    /// Scans `/proc`: new libraries mapped by wanted processes are probed.
    fn scan(&mut self) -> Result<(), ProbeError> {
        let pids: Vec<u32> = match self.opts.target {
            Target::All => procfs::pids(),
            Target::Pid { pid, .. } => std::iter::once(pid).chain(self.table.all().filter(|p| !p.exited).map(|p| p.pid)).collect(),
        };
        for pid in pids {
            if !self.wanted(pid) || pid == std::process::id() {
                continue;
            }
            self.check_exe(pid);
            let libs = match procfs::try_cuda_libs(pid) {
                Ok(l) => l,
                Err(procfs::Unreadable::Gone) => continue,
                Err(procfs::Unreadable::Denied(why)) => {
                    if self.unreadable.len() >= 65_536 {
                        self.unreadable.clear();
                    }
                    if !self.unreadable.insert(pid) {
                        continue;
                    }
                    self.unreadable_procs += 1;
                    if self.unreadable_procs <= 3 {
                        self.notes.push(format!("could not read /proc/{pid}/maps ({why}): its CUDA libraries cannot be found, so it is traced only if it uses a file probed for another process"));
                    }
                    continue;
                }
            };
            for lib in libs {
                if !self.probes.has_file(&lib.id) {
                    if let Err(e) = self.attach_file(lib.kind, &lib.path) {
                        self.notes.push(format!("could not probe {} of pid {pid}: {e}", lib.path.display()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Probes the executable of `pid` if it carries gpufrag's annotation USDT probes (each
    /// executable file is checked once).
    fn check_exe(&mut self, pid: u32) {
        let Some(exe) = procfs::exe_path(pid) else { return };
        let Ok(id) = procfs::file_id(&exe) else { return };
        if self.probes.has_file(&id) || !self.checked_exes.insert(id) {
            return;
        }
        self.probes.mark_probed(id);
        if self.checked_exes.len() > 65_536 {
            self.checked_exes.clear();
        }
        // A path that outlives the process (the uprobe is attached by path).
        let path = std::fs::read_link(&exe)
            .ok()
            .map(|p| procfs::reachable(pid, &p.to_string_lossy()))
            .filter(|p| procfs::file_id(p).is_ok_and(|i| i == id))
            .unwrap_or(exe);
        if procfs::file_size(&path).is_some_and(|n| n > 512 << 20) || super::symbols::annotate_probes(&path).is_empty() {
            return;
        }
        // It ran before its announcements were probed: what it announced meanwhile is missing.
        let start = procfs::stat(pid).map(|st| st.start_time).or_else(|| self.table.get(pid).map(|p| p.start_time));
        if let Some(start) = start {
            self.preexisting.insert((pid, start));
        }
        self.table.mark_inexact(pid);
        if let Err(e) = self.attach_file(LibKind::Annotated, &path) {
            // Looked at again at its next exec: never a process of it claimed exact unprobed.
            self.checked_exes.remove(&id);
            self.probes.unmark_probed(id);
            if !procfs::alive(pid) {
                return;
            }
            self.notes.push(format!("could not probe the annotations in {} of pid {pid}: {e}", path.display()));
        }
    }

    /// Probes the library files the kprobe saw mapped (found in `/proc/PID/maps` by identity;
    /// retried for a few rounds while the mapping is not listed yet).
    fn probe_mapped(&mut self) {
        let mut work: Vec<(super::LibMapped, u32)> = self.probes.take_mapped().into_iter().map(|m| (m, 0)).collect();
        work.append(&mut self.mapped_pending);
        for (m, tries) in work {
            if self.probes.has_file(&m.id) || !self.wanted(m.pid) {
                continue;
            }
            if LibKind::of(&m.name).is_none() {
                // An executable the exec tracepoint saw for the first time.
                if procfs::exe_path(m.pid).is_some() {
                    self.check_exe(m.pid);
                } else {
                    // Gone before its executable could be looked at: it may have announced
                    // blocks nobody saw.
                    if self.unchecked_exec.len() >= 65_536 {
                        self.unchecked_exec.clear();
                    }
                    self.unchecked_exec.insert(m.pid);
                }
                continue;
            }
            let found = procfs::cuda_libs(m.pid).into_iter().find(|l| {
                l.id == m.id || l.path.file_name().is_some_and(|n| n.to_string_lossy() == m.name) && !self.probes.has_file(&l.id)
            });
            match found {
                Some(lib) => {
                    if let Err(e) = self.attach_file(lib.kind, &lib.path) {
                        self.notes.push(format!("could not probe {} of pid {}: {e}", lib.path.display(), m.pid));
                    }
                }
                None if tries < 50 && procfs::alive(m.pid) => self.mapped_pending.push((m, tries + 1)),
                None => self.notes.push(format!(
                    "pid {} mapped {} (not probed yet) and was gone before it could be found in /proc/{}/maps",
                    m.pid, m.name, m.pid
                )),
            }
        }
    }

    /// For each failed allocation among `events` that carries no device free: NVML read now,
    /// kept (as a `DeviceInfo` of that pid) only if the process is still alive after the read.
    fn read_at_failures(&mut self, events: &[Event]) -> Vec<Event> {
        let mut out = Vec::new();
        for e in events {
            if e.kind() != Some(EventKind::AllocFailed) || e.rc != crate::ingest::RC_OUT_OF_MEMORY || e.device_free().is_some() {
                continue;
            }
            let Some(n) = &self.nvml else { continue };
            let device = if e.device >= 0 { e.device } else { self.table.likely_device(e.pid) };
            // NVML's index of the process's GPU, not its CUDA ordinal.
            let gpu = self.placement.node_device(e.pid, device);
            let start = self.table.get(e.pid).map(|p| p.start_time);
            let ts = now_ns();
            let Some((total, free)) = n.device_memory(gpu) else { continue };
            let alive =
                procfs::stat(e.pid).is_some_and(|st| st.state != 'Z' && st.state != 'X' && start.is_none_or(|s| s == st.start_time));
            if !alive {
                self.failures_after_exit += 1;
                continue;
            }
            self.nvml_reads_at_failure += 1;
            out.push(Event {
                ts_ns: ts,
                size: total,
                device_free: free,
                flags: F_DEVICE_FREE_KNOWN | F_SRC_EBPF | F_SRC_NVML,
                ..Event::new(EventKind::DeviceInfo, e.pid, device)
            });
        }
        out
    }

    /// Whether the target (attach mode) is still running, counting followed children.
    pub fn target_alive(&self) -> bool {
        match self.opts.target {
            Target::All => true,
            Target::Pid { pid, .. } => procfs::alive(pid) || self.table.all().any(|p| !p.exited && procfs::alive(p.pid)),
        }
    }

    fn apply(&mut self, out: &mut Vec<Msg>, mut actions: Vec<Action>) {
        // Processes declared inexact since (a hold released unprobed, annotations found late, a
        // file probed after they mapped it): the stream says so before their next events.
        let mut partial = self.table.take_partial();
        if !partial.is_empty() {
            partial.append(&mut actions);
            actions = partial;
        }
        for a in actions {
            match a {
                // The fraction setter's probe gives the fraction and the device total PyTorch
                // multiplied it by: the same fact the Python hook states, with its text.
                Action::Apply(e) if e.kind() == Some(EventKind::MemoryFraction) && e.text_len == 0 => {
                    let fraction = f64::from_bits(e.handle);
                    let allowed = if e.size > 0 && (0.0..=1.0).contains(&fraction) { (fraction * e.size as f64) as u64 } else { 0 };
                    out.push(Msg::Fact { event: Event { size: allowed, handle: 0, ..e }, text: format!("{fraction}") });
                }
                Action::Apply(e) => {
                    if let Some(n) = &self.nvml {
                        if let Some(u) = self.placer.place(&e, |pid| n.gpus_of(pid)) {
                            self.placement.driver_uuid(u.pid, u.device, &crate::attribution::gpu::event_uuid(&u));
                            out.push(Msg::Event(u));
                        }
                    }
                    if matches!(e.kind(), Some(EventKind::ProcessExec | EventKind::ProcessExit)) {
                        let name = self.table.get(e.pid).map(|p| p.name.clone()).unwrap_or_default();
                        out.push(Msg::Named { pid: e.pid, name });
                    }
                    out.push(Msg::Event(e));
                }
                Action::Forget(pid) => {
                    self.placement.forget(pid);
                    self.placer.forget(pid);
                    out.push(Msg::Forget(pid));
                }
            }
        }
    }

    /// One round: drain the ring, and (at the scan interval) look for new processes, libraries
    /// and exits; once a second, bring the whole trace up to now and mark an NVML sample due.
    /// Returns the messages, in the order they are to be applied.
    pub fn step(&mut self, wait: Duration) -> Vec<Msg> {
        let mut out = Vec::new();
        self.round(&mut out, wait);
        if self.nvml.is_some() && self.last_nvml.elapsed() >= Duration::from_secs(1) {
            self.last_nvml = Instant::now();
            self.catch_up(&mut out);
            self.nvml_due = true;
        }
        out
    }

    /// One round of [`Session::step`] without NVML; the number of probe events drained.
    fn round(&mut self, out: &mut Vec<Msg>, wait: Duration) -> usize {
        if !self.opts.drain_delay.is_zero() {
            std::thread::sleep(self.opts.drain_delay);
        }
        let wait = if self.mapped_pending.is_empty() { wait } else { wait.min(Duration::from_millis(2)) };
        let events = self.probes.poll(wait);
        self.serve_hold();
        let n = events.len();
        // Who a new process is, read now: by the time its events leave the reorder window a
        // short-lived one is gone. The pipeline gets the same reading (Msg::Proc), before the
        // process's events.
        for e in &events {
            if e.pid != 0 && !self.placement.knows(e.pid) {
                let mut read = crate::attribution::ProcRead::read(std::path::Path::new("/proc"), e.pid);
                // Gone already: its cgroup and pod namespace as read while its exec was held (the
                // environment then was the old image's, so it is not taken).
                if let Some(held) = self.held_reads.remove(&e.pid).filter(|_| read.cgroup.is_err()) {
                    read.cgroup = held.cgroup;
                    read.namespace = held.namespace;
                }
                self.placement.prefetch(e.pid, read.clone());
                self.placement.identify(e.pid);
                out.push(Msg::Proc { pid: e.pid, read: Box::new(read) });
            }
        }
        let readings = self.read_at_failures(&events);
        self.probe_mapped();
        self.buffer(events);
        self.buffer(readings);
        let ready = self.release(Some(now_ns().saturating_sub(REORDER_WINDOW_NS)));
        self.handle_events(out, ready);
        let partial = self.table.take_partial();
        self.apply(out, partial);
        let lookup = ProcFs;
        let lost = self.probes.lost();
        if lost > self.lost_seen {
            let e = Event { ts_ns: now_ns(), size: lost - self.lost_seen, flags: F_SRC_EBPF, ..Event::new(EventKind::Dropped, 0, -1) };
            self.lost_seen = lost;
            out.push(Msg::Event(e));
        }
        if self.last_scan.elapsed() >= self.opts.scan_interval {
            self.last_scan = Instant::now();
            let _ = self.scan();
            let stale = self.table.stale(&lookup);
            if !stale.is_empty() {
                // A process that is gone has all its events in the buffer already.
                let all = self.release(None);
                self.handle_events(out, all);
            }
            for pid in stale {
                let acts = self.table.exited(pid, now_ns());
                self.probes.untrace(pid);
                self.apply(out, acts);
            }
        }
        n
    }

    /// Everything in the ring and the reorder buffer, now.
    fn catch_up(&mut self, out: &mut Vec<Msg>) {
        let events = self.probes.drain();
        self.buffer(events);
        let all = self.release(None);
        self.handle_events(out, all);
    }

    fn buffer(&mut self, events: Vec<Event>) {
        for e in events {
            self.seq += 1;
            self.reorder.insert((e.ts_ns, self.seq), e);
        }
    }

    /// Takes the buffered events stamped at or before `upto` (all with `None`), in time order.
    fn release(&mut self, upto: Option<u64>) -> Vec<Event> {
        let keep = match upto {
            Some(t) => self.reorder.split_off(&(t.saturating_add(1), 0)),
            None => BTreeMap::new(),
        };
        std::mem::replace(&mut self.reorder, keep).into_values().collect()
    }

    fn handle_events(&mut self, out: &mut Vec<Msg>, events: Vec<Event>) {
        let lookup = ProcFs;
        for ev in events {
            let pre = &self.preexisting;
            let unchecked = &self.unchecked_exec;
            // A process gone before its first event is handled has no start time (0): then any
            // holder of its pid that used a file before its probes were in makes it inexact.
            let exact_if_new = |pid: u32, start: u64| {
                !pre.contains(&(pid, start)) && !(start == 0 && (unchecked.contains(&pid) || pre.iter().any(|&(p, _)| p == pid)))
            };
            let acts = self.table.on_event(ev, &lookup, &exact_if_new);
            self.apply(out, acts);
        }
    }

    /// When a sample is due (the step or finish before it brought the trace up to now, and
    /// `state` has its messages applied): NVML's per-process used bytes beside the traced bytes
    /// of `state`, and the device totals as `DeviceInfo` events to apply.
    pub fn sample_nvml(&mut self, state: &State) -> Vec<Msg> {
        let mut out = Vec::new();
        if !std::mem::take(&mut self.nvml_due) {
            return out;
        }
        let Some(n) = &self.nvml else { return out };
        // Exited processes keep the last figure NVML gave for them (coverage at the end).
        let now = n.process_used();
        for (&(pid, _), _) in now.iter() {
            self.nvml_used.retain(|&(p, _), _| p != pid);
        }
        for ((pid, d), used) in now {
            let traced = state.traced_bytes(pid, d);
            self.nvml_used.insert((pid, d), (used, traced));
        }
        // Only for processes the table still knows: a long-running agent stays bounded.
        let table = &self.table;
        self.nvml_used.retain(|&(p, _), _| table.get(p).is_some());
        self.table.nvml_devices.clear();
        for &(pid, d) in self.nvml_used.keys() {
            self.table.nvml_devices.entry(pid).or_default().push(d);
        }
        for d in 0..n.device_count() {
            if let Some((total, free)) = n.device_memory(d as i16) {
                let e = Event {
                    ts_ns: now_ns(),
                    size: total,
                    device_free: free,
                    flags: F_DEVICE_FREE_KNOWN | F_SRC_EBPF,
                    ..Event::new(EventKind::DeviceInfo, 0, d as i16)
                };
                out.push(Msg::Event(e));
            }
        }
        out
    }

    /// Drains what is left in the ring (after the traced processes ended) and marks a last NVML
    /// sample due.
    pub fn finish(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        for _ in 0..3 {
            if self.round(&mut out, Duration::from_millis(50)) == 0 {
                break;
            }
        }
        self.catch_up(&mut out);
        self.nvml_due = self.nvml.is_some();
        out
    }

    /// Coverage of every process in `state` now.
    pub fn coverage(&self, state: &State) -> Vec<Coverage> {
        coverage(&self.table, state, &self.nvml_used)
    }

    /// Whether every process was traced from its start and nothing was lost.
    pub fn all_exact(&self) -> bool {
        self.table.all().all(|p| p.exact) && self.lost_seen == 0
    }

    /// Whether any libcuda file is probed yet.
    pub fn driver_probed(&self) -> bool {
        self.probes.files().any(|(_, (_, how))| matches!(how, Attached::Driver { .. }))
    }

    /// How many probe attachments are live.
    pub fn link_count(&self) -> usize {
        self.probes.link_count()
    }

    /// Notes on coverage and device attribution for the summary.
    pub fn coverage_notes(&self, state: &State) -> Vec<String> {
        let mut notes = self.hold.as_ref().map(|h| h.notes()).unwrap_or_default();
        for c in self.coverage(state) {
            if !c.exact {
                let un = c.unattributed.map_or_else(|| "unknown (no NVML)".to_string(), crate::units::human_bytes);
                notes.push(format!(
                    "pid {} ({}) on device {}: attached mid-run, so what it allocated before is missing: traced {}, unattributed {un}",
                    c.pid,
                    c.name,
                    c.device,
                    crate::units::human_bytes(c.traced)
                ));
            }
        }
        for (pid, n) in &self.table.assumed {
            notes.push(format!(
                "pid {pid}: {n} allocation(s) attributed to device 0 (no CUDA context seen since attaching and NVML did not tell)"
            ));
        }
        if self.unreadable_procs > 0 {
            notes.push(format!(
                "{} process(es) had /proc entries gpufrag could not read: a gap in coverage (their libraries were not looked for)",
                self.unreadable_procs
            ));
        }
        if self.failures_after_exit > 0 {
            notes.push(format!(
                "{} failed allocation(s) were seen only after their process had gone: no NVML figure was taken for them",
                self.failures_after_exit
            ));
        }
        if self.table.let_go > 0 {
            notes.push(format!(
                "{} exited process(es) beyond --keep-exited-max were let go: their final maps are not in this summary",
                self.table.let_go
            ));
        }
        if self.table.reused > 0 {
            notes.push(format!("{} pid(s) were reused by new processes; their earlier holders' state was dropped", self.table.reused));
        }
        notes
    }
}
