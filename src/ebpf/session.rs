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
use crate::consumer::callers::{self, Callers};
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
    /// Scan the node's library and Python roots at start for the caching allocators' libraries
    /// ([`super::libroots`]), these directories too (the agent; `None`: no scan).
    pub lib_roots: Option<Vec<PathBuf>>,
}

/// One library of one process: when it was loaded and when its probes went in (the coverage
/// notes say the time between).
#[derive(Clone, Debug)]
struct LibLoad {
    /// The process's start time (which holder of the pid).
    start_time: u64,
    kind: LibKind,
    /// The file's name.
    name: String,
    /// When the dynamic loader's breakpoint reported the dlopen that brought it (`None`: found
    /// by the `/proc` scan, the load itself not seen).
    load_ns: Option<u64>,
    /// When its probes went in.
    probe_ns: u64,
    /// When the agent first saw it in the process's maps.
    seen_ns: u64,
}

/// What the loader's breakpoint cost the agent: events, `/proc/PID/maps` reads, time spent.
#[derive(Clone, Debug, Default)]
struct LoaderCost {
    events: u64,
    reads: u64,
    /// Reading the maps and looking at them, probing not included.
    total_ns: u64,
    max_ns: u64,
    /// Libraries probed from these events, and the time their probing took.
    probed: u64,
    probe_ns: u64,
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
    /// What the runtimes' configs said of the containers they started (the exec hold's
    /// [`super::exec_hold::Request::Container`]).
    node_pods: crate::attribution::pods::NodePods,
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
    /// When each file's probes went in (the events' clock).
    probed_at: std::collections::HashMap<FileId, u64>,
    /// Per (process, library file): its load and probe (bounded).
    lib_loads: BTreeMap<(u32, FileId), LibLoad>,
    /// Processes that mapped an allocator library before its probes went in: (start time, the
    /// probe's moment). A segment of theirs stamped before it makes them not exact.
    late_allocator: std::collections::HashMap<u32, (u64, u64)>,
    /// The traced processes' code mappings: the owner of each driver allocation, named from its
    /// caller's address as `run`'s consumer names it (the same [`Callers`]), when its event is
    /// drained. Read at attach, at each report of the dynamic loader's breakpoint (a process's
    /// start and each dlopen, while it surely runs) and on a miss.
    callers: Callers,
    loader_cost: LoaderCost,
    /// New filesystems scanned at the exec hold.
    rootfs_scans: u64,
    /// Of those, scans that met directories gone (the filesystem removed while its first exec
    /// was held): how many scans, how many directories, the first.
    rootfs_gone: (u64, u64, Option<String>),
    /// Dynamic loaders that could not be probed (not tried again).
    unprobeable_loaders: HashSet<FileId>,
}

/// Bound of the per-process library records.
const LIB_LOADS_MAX: usize = 65_536;

/// How long probe events wait before they are applied, so that a free (stamped when its call
/// began) is applied before an allocation of the same address by another thread that returned
/// before the free's uretprobe ran.
const REORDER_WINDOW_NS: u64 = 50_000_000;

/// The libraries a scan's files were probed in, for its note: `N allocator libraries probed`,
/// `when` (a scan at start probes before any process loads them), the time it took, the list.
fn probed_note(probed: &[String], when: &str, took: std::time::Duration) -> String {
    format!(
        "{} allocator librar{} probed{when} in {:.1} ms{}",
        probed.len(),
        if probed.len() == 1 { "y" } else { "ies" },
        took.as_secs_f64() * 1e3,
        if probed.is_empty() { String::new() } else { format!(": {}", probed.join(", ")) }
    )
}

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
            node_pods: crate::attribution::pods::NodePods::default(),
            unreadable_procs: 0,
            unreadable: HashSet::new(),
            unchecked_exec: HashSet::new(),
            nvml_reads_at_failure: 0,
            failures_after_exit: 0,
            nvml_due: false,
            placement: crate::attribution::Attribution::for_node(None),
            placer: super::nvml::DriverPlacer::default(),
            hold: None,
            probed_at: std::collections::HashMap::new(),
            lib_loads: BTreeMap::new(),
            late_allocator: std::collections::HashMap::new(),
            callers: Callers::default(),
            loader_cost: LoaderCost::default(),
            rootfs_scans: 0,
            rootfs_gone: (0, 0, None),
            unprobeable_loaders: HashSet::new(),
        };
        // The dynamic loader's breakpoint first: every dlopen from now on is reported.
        let loaders = procfs::node_loaders(s.opts.host_root.as_deref());
        let mut probed_loaders = Vec::new();
        for l in &loaders {
            match s.attach_file(LibKind::Loader, l) {
                Ok(()) => probed_loaders.push(l.display().to_string()),
                Err(e) => s.notes.push(format!("no uprobe on the dynamic loader {} ({e})", l.display())),
            }
        }
        s.notes.push(if probed_loaders.is_empty() {
            format!("dynamic loader not probed: a library loaded later is found by the /proc scan only, every {} ms", s.opts.scan_interval.as_millis())
        } else {
            format!(
                "dynamic loader: a uprobe on {} in {} (and in each other ld.so a process is seen running): a library a process loads later is probed when the loader reports it",
                super::LOADER_BREAKPOINT,
                probed_loaders.join(", ")
            )
        });
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
            s.attach_runtimes(procfs::cudart_candidates(pid));
        } else {
            // Where this process would load libcuda from (its LD_LIBRARY_PATH), and the node's.
            let mut c = procfs::libcuda_candidates(std::process::id());
            c.extend(procfs::node_libcuda(s.opts.host_root.as_deref()));
            s.attach_up_front(c)?;
            s.attach_runtimes(procfs::cudart_candidates(std::process::id()));
        }
        if let Some(extra) = s.opts.lib_roots.clone() {
            s.scan_lib_roots(&extra)?;
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

    /// Probes the caching allocators' libraries found under the node's library and Python roots
    /// (and `extra`) before any process loads them; the summary's note says what was walked,
    /// found, probed and cut, and what it took.
    fn scan_lib_roots(&mut self, extra: &[PathBuf]) -> Result<(), ProbeError> {
        let mut roots = super::libroots::default_roots(self.opts.host_root.as_deref());
        roots.extend(extra.iter().cloned());
        let t = Instant::now();
        let scan = super::libroots::scan(&roots);
        let mut probed = Vec::new();
        for (kind, path) in &scan.found {
            match self.attach_file(*kind, path) {
                Ok(()) => probed.push(path.display().to_string()),
                Err(e @ (ProbeError::Privileges(_) | ProbeError::Unsupported(_))) => return Err(e),
                Err(e) => self.notes.push(format!("could not probe {} found under the library roots: {e}", path.display())),
            }
        }
        let b = super::libroots::TIME_BUDGET.as_millis();
        self.notes.push(format!(
            "library roots scanned at start ({} root(s); bounds: {} directories deep, {} entries, {b} ms, {} files): {}; {}",
            roots.len(),
            super::libroots::MAX_DEPTH,
            super::libroots::MAX_ENTRIES,
            super::libroots::MAX_FOUND,
            scan.figures(),
            probed_note(&probed, " before any process loads them", t.elapsed() - scan.elapsed)
        ));
        Ok(())
    }

    /// The first exec from a filesystem mounted after the start (a new container's rootfs) is
    /// held: the allocator libraries under its library and Python roots are probed before its
    /// process runs. Bounded by [`super::libroots::HELD_TIME_BUDGET`]; the last few scans are
    /// noted, all are counted.
    fn scan_rootfs(&mut self, root: &std::path::Path, pid: u32, exe: &std::path::Path) {
        let roots = super::libroots::roots_under(root);
        let t = Instant::now();
        let mut scan = super::libroots::scan_within(&roots, super::libroots::HELD_TIME_BUDGET, super::libroots::MAX_ENTRIES);
        if let Err(e) =
            std::fs::metadata(root).and_then(|m| if m.is_dir() { Ok(()) } else { Err(std::io::ErrorKind::NotADirectory.into()) })
        {
            // The mount point itself gone (before or during the walk).
            scan.gone += 1;
            scan.first_gone.get_or_insert_with(|| format!("{}: {e}", root.display()));
        }
        if scan.gone > 0 {
            self.rootfs_gone.0 += 1;
            self.rootfs_gone.1 += scan.gone;
            if self.rootfs_gone.2.is_none() {
                self.rootfs_gone.2 = Some(format!("{} (pid {pid}'s exec of {}): {}", root.display(), exe.display(), scan.figures()));
            }
        }
        let mut probed = Vec::new();
        for (kind, path) in &scan.found {
            match self.attach_file(*kind, path) {
                Ok(()) => probed.push(path.display().to_string()),
                Err(e) => {
                    self.notes.push(format!("could not probe {} found under the new filesystem {}: {e}", path.display(), root.display()))
                }
            }
        }
        self.rootfs_scans += 1;
        if self.rootfs_scans <= 8 {
            self.notes.push(format!(
                "new filesystem {} (pid {pid}'s exec of {} held while it was scanned): {}; {}",
                root.display(),
                exe.display(),
                scan.figures(),
                probed_note(&probed, "", t.elapsed() - scan.elapsed)
            ));
        }
    }

    /// Records that process `pid` maps `lib` (loaded at `load_ns` when the loader's breakpoint
    /// said so), for the coverage notes: allocator libraries always, libcuda when probed late.
    fn record_load(&mut self, pid: u32, lib: &procfs::MappedLib, load_ns: Option<u64>) {
        if lib.kind == LibKind::Loader {
            return;
        }
        if let Some(l) = self.lib_loads.get_mut(&(pid, lib.id)) {
            // Seen by the /proc scan before this breakpoint's batch was read: the breakpoint,
            // stamped before that sighting, is the load's (the batch before it found nothing).
            if let (None, Some(t)) = (l.load_ns, load_ns) {
                if t <= l.seen_ns {
                    l.load_ns = Some(t);
                }
            }
            return;
        }
        let Some(&probe_ns) = self.probed_at.get(&lib.id) else { return };
        let Some(st) = procfs::stat(pid) else { return };
        if self.lib_loads.len() >= LIB_LOADS_MAX {
            let table = &self.table;
            self.lib_loads.retain(|&(p, _), l| table.get(p).is_some_and(|i| i.start_time == l.start_time));
            if self.lib_loads.len() >= LIB_LOADS_MAX {
                self.lib_loads.clear();
            }
        }
        let name = lib.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let seen_ns = now_ns();
        self.lib_loads.insert((pid, lib.id), LibLoad { start_time: st.start_time, kind: lib.kind, name, load_ns, probe_ns, seen_ns });
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
                super::exec_hold::Request::Probe { req, id, path, pid, rootfs, annotated } => {
                    if self.held_reads.len() >= 4096 {
                        self.held_reads.clear();
                    }
                    let mut read = crate::attribution::ProcRead::read(std::path::Path::new("/proc"), pid);
                    read.node = read.cgroup.as_deref().ok().and_then(|c| self.node_pods.of_cgroup(c));
                    self.held_reads.insert(pid, read);
                    self.checked_exes.insert(id);
                    if let Some(root) = rootfs {
                        self.scan_rootfs(&root, pid, &path);
                    }
                    let result = if annotated {
                        self.attach_file_as(LibKind::Annotated, &path, true).map_err(|e| e.to_string())
                    } else {
                        self.probes.mark_probed(id);
                        Ok(())
                    };
                    if let Err(e) = &result {
                        self.checked_exes.remove(&id);
                        self.notes.push(format!("could not probe the annotations in {} before its first exec ran: {e}", path.display()));
                    }
                    if let Some(h) = &self.hold {
                        h.answer(req, result);
                    }
                }
                super::exec_hold::Request::Container { id, names, .. } => {
                    if let Some(n) = names {
                        self.node_pods.insert(id, n);
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
                if let Some(ranges) = callers::read_maps(p) {
                    self.callers.prime(p, ranges, now_ns());
                }
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

    /// Probes the CUDA runtime files found up front (a note for one that cannot be).
    fn attach_runtimes(&mut self, paths: Vec<PathBuf>) {
        for p in paths {
            if let Err(e) = self.attach_file(LibKind::Cudart, &p) {
                self.notes.push(format!("could not probe the CUDA runtime {}: {e}", p.display()));
            }
        }
    }

    fn attach_file(&mut self, kind: LibKind, path: &std::path::Path) -> Result<(), ProbeError> {
        self.attach_file_as(kind, path, false)
    }

    /// [`Session::attach_file`]; `executable`: the file is an executable held at its exec, so
    /// the processes that ran it before are those whose `/proc/PID/exe` it is (a `stat` each,
    /// not a read of every process's maps: the hold waits on this).
    fn attach_file_as(&mut self, kind: LibKind, path: &std::path::Path, executable: bool) -> Result<(), ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if self.probes.has_file(&id) || self.unprobeable_loaders.contains(&id) {
            return Ok(());
        }
        let how = match self.probes.attach(kind, path) {
            Ok(how) => how.clone(),
            Err(e) => {
                // A loader without the breakpoint (or one that refused the uprobe) is said once,
                // not at every scan that sees a process running it.
                if kind == LibKind::Loader && self.unprobeable_loaders.len() < LIB_LOADS_MAX {
                    self.unprobeable_loaders.insert(id);
                }
                return Err(e);
            }
        };
        let probe_ns = now_ns();
        if self.probed_at.len() >= LIB_LOADS_MAX {
            self.probed_at.clear();
        }
        self.probed_at.insert(id, probe_ns);
        if kind == LibKind::Loader {
            // Nothing was missed by a process that ran this loader before: it only reports.
            return Ok(());
        }
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
                Attached::Loader => format!("dynamic loader: a uprobe on {} in {}", super::LOADER_BREAKPOINT, path.display()),
                Attached::Runtime { functions: 0 } => format!(
                    "owners: {} exports none of {}: driver allocations its code makes are filed under their own caller",
                    path.display(),
                    super::RUNTIME_FUNCTIONS.join(", ")
                ),
                Attached::Runtime { functions } => format!(
                    "owners: uprobes on {functions} runtime allocation functions of {} (a driver allocation made inside one is owned by the runtime call's caller)",
                    path.display()
                ),
            };
            self.notes.push(note);
        }
        if kind == LibKind::Cudart {
            // Nothing a process did before is missing: its driver calls were probed; only their
            // owner is the runtime's (its caller was not seen).
            return Ok(());
        }
        // Whoever maps the file now may have called it before the probes were in.
        let runs = |pid: u32| {
            if executable {
                std::fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| m.dev() == id.dev && m.ino() == id.ino)
            } else {
                procfs::maps_file(pid, id)
            }
        };
        // An allocator's library (not an executable held at its exec): its blocks are carved
        // from segments the driver gave out, so a process with no segment before this moment
        // lost no block; one with a segment before it may have (not exact).
        let allocator = kind.is_allocator() && !executable;
        for pid in procfs::pids() {
            if pid != std::process::id() && runs(pid) {
                if let Some(st) = procfs::stat(pid) {
                    let known = self.table.get(pid).filter(|p| p.start_time == st.start_time);
                    if allocator && known.is_none_or(|p| p.first_segment_ns.is_none_or(|t| t >= probe_ns)) {
                        if self.late_allocator.len() >= LIB_LOADS_MAX {
                            self.late_allocator.clear();
                        }
                        let e = self.late_allocator.entry(pid).or_insert((st.start_time, probe_ns));
                        *e = (st.start_time, e.1.max(probe_ns));
                        continue;
                    }
                    self.preexisting.insert((pid, st.start_time));
                    if known.is_some() {
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
                self.record_load(pid, &lib, None);
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
        let (loader, mapped): (Vec<super::LibMapped>, Vec<super::LibMapped>) =
            self.probes.take_mapped().into_iter().partition(|m| m.loader);
        self.on_loader(loader);
        let mut work: Vec<(super::LibMapped, u32)> = mapped.into_iter().map(|m| (m, 0)).collect();
        work.append(&mut self.mapped_pending);
        for (m, tries) in work {
            if self.probes.has_file(&m.id) || !self.wanted(m.pid) {
                continue;
            }
            if LibKind::of(&m.name).is_none() {
                // An executable the exec hold looked at already (its answer may reach this thread
                // after the exec tracepoint's report): nothing to probe, nothing missed.
                if self.checked_exes.contains(&m.id) {
                    continue;
                }
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

    /// The dynamic loader's breakpoint fired in these processes (a dlopen began or finished
    /// mapping objects): each one's maps are read once, its CUDA libraries not probed yet are
    /// probed now, and each library's load is recorded at the earliest breakpoint of the batch.
    fn on_loader(&mut self, events: Vec<super::LibMapped>) {
        if events.is_empty() {
            return;
        }
        self.loader_cost.events += events.len() as u64;
        let mut first: BTreeMap<u32, u64> = BTreeMap::new();
        for m in &events {
            let e = first.entry(m.pid).or_insert(m.ts_ns);
            *e = (*e).min(m.ts_ns);
        }
        for (pid, ts) in first {
            if !self.wanted(pid) || pid == std::process::id() {
                continue;
            }
            self.loader_cost.reads += 1;
            let read = Instant::now();
            let libs = procfs::cuda_libs(pid);
            // The code it maps now, for the owners of its driver allocations (a short-lived
            // process may be gone before they are drained).
            if let Some(ranges) = callers::read_maps(pid) {
                self.callers.prime(pid, ranges, now_ns());
            }
            let ns = read.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
            self.loader_cost.total_ns = self.loader_cost.total_ns.saturating_add(ns);
            self.loader_cost.max_ns = self.loader_cost.max_ns.max(ns);
            for lib in libs {
                if !self.probes.has_file(&lib.id) {
                    let probe = Instant::now();
                    match self.attach_file(lib.kind, &lib.path) {
                        Ok(()) => self.loader_cost.probed += 1,
                        Err(e) => self.notes.push(format!("could not probe {} of pid {pid}: {e}", lib.path.display())),
                    }
                    self.loader_cost.probe_ns += probe.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                }
                self.record_load(pid, &lib, Some(ts));
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
                // environment then was the old image's, so it is not taken). An exited process's
                // cgroup reads as an error too (`ProcRead::read`: a zombie's file no longer names
                // its container).
                if let Some(held) = self.held_reads.remove(&e.pid).filter(|_| read.cgroup.is_err()) {
                    read.cgroup = held.cgroup;
                    read.namespace = held.namespace;
                }
                read.node = read.cgroup.as_deref().ok().and_then(|c| self.node_pods.of_cgroup(c));
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

    /// Puts drained events in the reorder buffer, each driver allocation's owner named first
    /// (after `probe_mapped` let the loader's reports prime the mappings), before it is
    /// recorded or applied, as the consumer does under `run`.
    fn buffer(&mut self, events: Vec<Event>) {
        let now = now_ns();
        for mut e in events {
            self.callers.resolve(&mut e, now);
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
            // A segment stamped before the allocator's probes of a process that had mapped its
            // library: blocks may have been carved from it unseen.
            let mut late_segment = false;
            if let (Some(&(start, probe)), Some(kind)) = (self.late_allocator.get(&ev.pid), ev.kind()) {
                if super::processes::segment_like(kind, ev.rc) && ev.ts_ns < probe {
                    self.preexisting.insert((ev.pid, start));
                    late_segment = true;
                }
            }
            let pid = ev.pid;
            let pre = &self.preexisting;
            let unchecked = &self.unchecked_exec;
            // A process gone before its first event is handled has no start time (0): then any
            // holder of its pid that used a file before its probes were in makes it inexact.
            let exact_if_new = |pid: u32, start: u64| {
                !pre.contains(&(pid, start)) && !(start == 0 && (unchecked.contains(&pid) || pre.iter().any(|&(p, _)| p == pid)))
            };
            let acts = self.table.on_event(ev, &lookup, &exact_if_new);
            if late_segment {
                self.table.mark_inexact(pid);
            }
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

    /// Per process and library: the time from its load to its probes, and what that means for
    /// the process's exactness (allocator libraries always; libcuda when probed after its load).
    fn load_notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (&(pid, _), l) in &self.lib_loads {
            // Start time 0: the process was gone before its first event was handled.
            let Some(p) = self.table.get(pid).filter(|p| p.start_time == l.start_time || p.start_time == 0) else { continue };
            let late = l.load_ns.is_none_or(|t| l.probe_ns > t);
            if (l.kind == LibKind::Cuda && !late) || l.kind == LibKind::Cudart {
                continue;
            }
            let ms = |a: u64, b: u64| (a as f64 - b as f64) / 1e6;
            let when = match l.load_ns {
                Some(t) if !late => {
                    out.push(format!(
                        "pid {pid} ({}): {} load to probe {:.1} ms: probed before its load, traced from its first call",
                        p.name,
                        l.name,
                        ms(l.probe_ns, t)
                    ));
                    continue;
                }
                Some(t) => format!("load to probe {:.1} ms (the load seen at the dynamic loader's breakpoint)", ms(l.probe_ns, t)),
                None => "load not seen (found by the /proc scan)".to_string(),
            };
            let seg = match p.first_segment_ns {
                _ if l.kind == LibKind::Cuda => "driver calls before the probe are missing: not exact".to_string(),
                Some(s) if s < l.probe_ns => format!(
                    "its first segment came {:.1} ms before the probe, so blocks made before it may be missing: not exact",
                    ms(l.probe_ns, s)
                ),
                _ => "no segment before the probe, so no block was made unseen".to_string(),
            };
            out.push(format!("pid {pid} ({}): {} {when}; {seg}", p.name, l.name));
        }
        let c = &self.loader_cost;
        if c.events > 0 {
            out.push(format!(
                "dynamic loader's breakpoint: {} event(s), {} /proc/PID/maps read(s) of {:.1} µs on average (max {:.1} µs); {} librar{} probed from them in {:.1} ms on average",
                c.events,
                c.reads,
                c.total_ns as f64 / c.reads.max(1) as f64 / 1e3,
                c.max_ns as f64 / 1e3,
                c.probed,
                if c.probed == 1 { "y" } else { "ies" },
                c.probe_ns as f64 / c.probed.max(1) as f64 / 1e6
            ));
        }
        out
    }

    /// Notes on coverage and device attribution for the summary.
    pub fn coverage_notes(&self, state: &State) -> Vec<String> {
        let mut notes = self.hold.as_ref().map(|h| h.notes()).unwrap_or_default();
        if let (n, dirs, Some(first)) = &self.rootfs_gone {
            notes.push(format!(
                "exec hold: {n} new filesystem scan(s) met {dirs} directories gone or unreadable (a container's rootfs removed while its first exec was held): each scan went on past them within its bounds and its exec was let go; the first: {first}"
            ));
        }
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
        notes.extend(self.load_notes());
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
