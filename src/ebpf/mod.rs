//! eBPF capture: uprobes on the CUDA driver's exported memory functions, USDT probes (or symbol
//! uprobes) on PyTorch's caching allocator, and the tracepoints that follow forks, execs and
//! exits, for processes that are already running (`gpufrag attach`) or every GPU process of the
//! node (`gpufrag agent`), without LD_PRELOAD and without restarting anything.
//!
//! The BPF programs (`bpf/gpufrag.bpf.c`, compiled by build.rs into a libbpf-rs skeleton) emit
//! the one wire event (`include/gpufrag_event.h`) into a ring buffer; [`Probes`] loads them,
//! attaches them once per distinct library file (device + inode), and drains the ring;
//! [`session::Session`] finds the processes and files, keys processes by pid and start time
//! ([`processes`]), measures coverage against NVML ([`nvml`]), and returns the messages
//! ([`crate::source::Msg`]) that the loop feeds to the same [`crate::live::Live`] that
//! `gpufrag run` uses.

pub mod exec_hold;
pub mod libroots;
pub mod nvml;
pub mod processes;
pub mod procfs;
pub mod session;
mod skel;
pub mod symbols;

use crate::event::{Event, EVENT_SIZE};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, UprobeOpts};
use procfs::{FileId, LibKind};
use skel::{GpufragSkel, GpufragSkelBuilder};
use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;
use symbols::{BfcProbes, TorchProbes};

/// The driver functions probed, with the skeleton's program pair for each. Several names share
/// a pair (`_ptsz` variants); a name the library does not export is skipped.
const DRIVER_FUNCTIONS: &[(&str, &str)] = &[
    ("cuMemAlloc_v2", "mem_alloc"),
    ("cuMemAllocPitch_v2", "mem_alloc_pitch"),
    ("cuMemAllocManaged", "mem_alloc_managed"),
    ("cuMemFree_v2", "mem_free"),
    ("cuMemAddressReserve", "address_reserve"),
    ("cuMemAddressFree", "address_free"),
    ("cuMemCreate", "mem_create"),
    ("cuMemRelease", "mem_release"),
    ("cuMemMap", "mem_map"),
    ("cuMemUnmap", "mem_unmap"),
    ("cuMemAllocAsync", "alloc_async"),
    ("cuMemAllocAsync_ptsz", "alloc_async"),
    ("cuMemAllocFromPoolAsync", "alloc_from_pool_async"),
    ("cuMemAllocFromPoolAsync_ptsz", "alloc_from_pool_async"),
    ("cuMemFreeAsync", "free_async"),
    ("cuMemFreeAsync_ptsz", "free_async"),
    ("cuMemPoolTrimTo", "pool_trim_to"),
    ("cuMemPoolGetAttribute", "pool_get_attribute"),
    ("cuMemGetInfo_v2", "mem_get_info"),
    // device attribution
    ("cuDevicePrimaryCtxRetain", "primary_ctx_retain"),
    ("cuCtxSetCurrent", "ctx_set_current"),
    ("cuCtxCreate_v2", "ctx_create"),
    ("cuCtxPushCurrent_v2", "ctx_push_current"),
    ("cuCtxPopCurrent_v2", "ctx_pop_current"),
    ("cuCtxGetDevice", "ctx_get_device"),
    ("cuMemPoolCreate", "pool_create"),
    ("cuDeviceGetDefaultMemPool", "default_mem_pool"),
    ("cuDeviceGetMemPool", "default_mem_pool"),
];

/// The CUDA runtime's allocation functions, each ending in a probed driver allocation: probed
/// (one program pair, `runtime_alloc`) only so that the driver's event names the code that asked
/// the runtime as its owner, not libcudart. `cudaMallocAsync` and the pool functions are not
/// here: a pool allocation carries no owner (docs/metrics.md).
pub const RUNTIME_FUNCTIONS: [&str; 4] = ["cudaMalloc", "cudaMallocPitch", "cudaMalloc3D", "cudaMallocManaged"];

/// Kernel functions that every file-backed mmap passes, with the file as first argument, in the
/// order tried for the library-mapping kprobe.
const MMAP_FUNCTIONS: [&str; 3] = ["security_mmap_file", "do_mmap", "vm_mmap_pgoff"];

/// The ring buffer's default size (the BPF source's `events` map).
const DEFAULT_RING_BYTES: u32 = 1 << 22;

/// Linux capability numbers.
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Why the probes cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Missing privileges (checked before loading, or the kernel said EPERM).
    #[error("{0}")]
    Privileges(String),
    /// The kernel cannot run these programs (no BPF, no uprobes, no BTF).
    #[error("the kernel refused the eBPF programs: {0}")]
    Unsupported(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// What to say when privileges are missing.
pub fn privilege_message(what: &str) -> String {
    format!(
        "{what} needs CAP_BPF and CAP_PERFMON to load eBPF programs and CAP_SYS_ADMIN to attach uprobes (kernels since 6.16, \
         and their stable backports, refuse uprobe perf events to CAP_PERFMON alone), or root, \
         plus CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH to read other users' /proc/PID/maps and /proc/PID/root; \
         `gpufrag run -- CMD` works without any of them (it traces CMD through LD_PRELOAD)"
    )
}

/// The effective capability set of this process.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(0))))
        .unwrap_or(0)
}

/// Checks the capabilities before anything is loaded; `what` names the command for the message.
pub fn check_privileges(what: &str) -> Result<(), ProbeError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        if !(has(CAP_SYS_PTRACE) && has(CAP_DAC_READ_SEARCH)) {
            eprintln!("gpufrag: warning: without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH only processes of this user can be found");
        }
        return Ok(());
    }
    Err(ProbeError::Privileges(privilege_message(what)))
}

fn classify(e: &libbpf_rs::Error, what: &str) -> ProbeError {
    let text = format!("{e:#}");
    match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => ProbeError::Privileges(format!("{}: {text}", privilege_message(what))),
        libbpf_rs::ErrorKind::Unsupported => ProbeError::Unsupported(text),
        _ if text.contains("Operation not permitted") || text.contains("EPERM") => {
            ProbeError::Privileges(format!("{}: {text}", privilege_message(what)))
        }
        _ if text.contains("Function not implemented") || text.contains("ENOSYS") || text.contains("not supported") => {
            ProbeError::Unsupported(text)
        }
        _ => ProbeError::Other(text),
    }
}

/// How the probes are set up before loading.
#[derive(Clone, Debug, Default)]
pub struct ProbeOptions {
    /// Report every process that hits a probe (the agent), not only the traced set.
    pub trace_all: bool,
    /// A fork of a traced process is traced from its start.
    pub follow_children: bool,
    /// Ring buffer bytes (a power of two, at least a page); the default is 4 MiB.
    pub ring_bytes: Option<u32>,
}

/// How a library file is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attached {
    /// libcuda: this many functions.
    Driver {
        /// Functions probed.
        functions: usize,
    },
    /// libc10_cuda: USDT, symbols, or nothing (with why), and which raw entry points were
    /// probed beside them; PyTorch's OOM report in the `libc10.so` beside it; its memory-fraction
    /// setter in the `libtorch_python.so` beside it.
    Torch(TorchProbes, symbols::RawEntries, symbols::TorchOomProbe, symbols::TorchFractionProbe),
    /// A library with XLA's BFC allocator: symbols, or nothing (with why).
    Bfc(BfcProbes),
    /// A program or library with gpufrag's annotation USDT probes: this many of them.
    Annotations {
        /// Probes attached.
        probes: usize,
    },
    /// A dynamic loader (`ld.so`): a uprobe on [`LOADER_BREAKPOINT`].
    Loader,
    /// libcudart: this many of [`RUNTIME_FUNCTIONS`] (0: none exported, a runtime linked
    /// statically into another file, whose allocations are filed under that file's driver calls).
    Runtime {
        /// Functions probed.
        functions: usize,
    },
}

/// A process mapped a CUDA library file that is not probed yet (the `security_mmap_file`
/// kprobe), exec'd a file not looked at yet (the exec tracepoint), or changed its mappings
/// through the dynamic loader (the `_dl_debug_state` uprobe: `loader`, no file named): probe
/// what it maps now rather than at the next `/proc` scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibMapped {
    /// The process.
    pub pid: u32,
    /// The file, as `stat` would give it (zero for the loader's breakpoint).
    pub id: FileId,
    /// Its file name.
    pub name: String,
    /// When (the events' clock, CLOCK_MONOTONIC ns).
    pub ts_ns: u64,
    /// The dynamic loader's breakpoint: a dlopen began or finished mapping objects.
    pub loader: bool,
}

/// The function of the dynamic loader that glibc's and musl's `ld.so` call at every change of
/// the loaded objects (the `r_debug` breakpoint debuggers use).
pub const LOADER_BREAKPOINT: &str = "_dl_debug_state";

/// The kernel's internal `dev_t` (`major << 20 | minor`) as `stat`'s `st_dev`.
pub fn stat_dev(kernel_dev: u32) -> u64 {
    libc::makedev(kernel_dev >> 20, kernel_dev & 0xf_ffff)
}

/// `stat`'s `st_dev` as the kernel's internal `dev_t`.
fn kernel_dev(st_dev: u64) -> u32 {
    (libc::major(st_dev) << 20) | (libc::minor(st_dev) & 0xf_ffff)
}

/// How a file with gpufrag's own USDT probes (`include/gpufrag_annotate.h`) is probed: the
/// probes attached, by name.
pub const ANNOTATE_PROBES: [&str; 4] = ["segment", "block_alloc", "block_free", "oom"];

/// The loaded programs and their attachments.
pub struct Probes {
    skel: GpufragSkel<'static>,
    links: Vec<Link>,
    files: HashMap<FileId, (PathBuf, Attached)>,
    ring: libbpf_rs::RingBuffer<'static>,
    inbox: Rc<RefCell<Vec<Event>>>,
    mapped: Rc<RefCell<Vec<LibMapped>>>,
    /// Why the library-mapping kprobe could not be attached (then only the `/proc` scan finds
    /// new library files).
    pub mmap_probe_error: Option<String>,
}

impl Probes {
    /// Opens, configures and loads the programs (nothing is attached yet but the tracepoints).
    pub fn load(opts: &ProbeOptions, what: &str) -> Result<Probes, ProbeError> {
        // The skeleton borrows its open object for its whole life; a session loads once, so the
        // object is leaked rather than made self-referential.
        let open_object: &'static mut MaybeUninit<libbpf_rs::OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let builder = GpufragSkelBuilder::default();
        let mut open = builder.open(open_object).map_err(|e| classify(&e, what))?;
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.trace_all = opts.trace_all;
            ro.follow_children = opts.follow_children;
            ro.wakeup_bytes = u64::from(opts.ring_bytes.unwrap_or(DEFAULT_RING_BYTES)) / 8;
        }
        if let Some(n) = opts.ring_bytes {
            open.maps.events.set_max_entries(n).map_err(|e| ProbeError::Other(format!("ring buffer size {n}: {e}")))?;
        }
        let skel = open.load().map_err(|e| classify(&e, what))?;
        let mut links = Vec::new();
        for (prog, tp) in [
            (&skel.progs.on_fork, "sched_process_fork"),
            (&skel.progs.on_exec, "sched_process_exec"),
            (&skel.progs.on_exit, "sched_process_exit"),
        ] {
            links.push(prog.attach_raw_tracepoint(tp).map_err(|e| classify(&e, what))?);
        }
        // Every file mmap goes through these (the first argument is the file); the first one
        // this kernel lets us probe is used.
        let kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists()
            || Path::new("/sys/kernel/tracing/kprobe_events").exists()
            || Path::new("/sys/kernel/debug/tracing/kprobe_events").exists();
        let mut mmap_probe_error =
            (!kprobes).then(|| "this kernel offers no kprobes (no kprobe PMU, no tracefs kprobe_events)".to_string());
        for func in MMAP_FUNCTIONS.iter().filter(|_| kprobes) {
            match skel.progs.on_mmap_file.attach_kprobe(false, func) {
                Ok(l) => {
                    links.push(l);
                    mmap_probe_error = None;
                    break;
                }
                Err(e) => mmap_probe_error = Some(format!("{}: {e:#}", MMAP_FUNCTIONS.join(", "))),
            }
        }
        let inbox: Rc<RefCell<Vec<Event>>> = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&inbox);
        let mapped: Rc<RefCell<Vec<LibMapped>>> = Rc::new(RefCell::new(Vec::new()));
        let mapped_sink = Rc::clone(&mapped);
        let mut rb = libbpf_rs::RingBufferBuilder::new();
        rb.add(&skel.maps.events, move |data: &[u8]| {
            if let Some(b) = data.get(..EVENT_SIZE).and_then(|b| <&[u8; EVENT_SIZE]>::try_from(b).ok()) {
                sink.borrow_mut().push(Event::from_bytes(b));
            }
            0
        })
        .map_err(|e| ProbeError::Other(format!("ring buffer: {e}")))?;
        rb.add(&skel.maps.lib_maps, move |data: &[u8]| {
            // struct lib_mapped: u64 ino, u32 dev, u32 pid, char name[48], u64 ts_ns.
            if data.len() >= 72 {
                let ino = u64::from_ne_bytes(data[0..8].try_into().unwrap_or([0; 8]));
                let dev = u32::from_ne_bytes(data[8..12].try_into().unwrap_or([0; 4]));
                let pid = u32::from_ne_bytes(data[12..16].try_into().unwrap_or([0; 4]));
                let raw = &data[16..64];
                let ts_ns = u64::from_ne_bytes(data[64..72].try_into().unwrap_or([0; 8]));
                let name = String::from_utf8_lossy(&raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())]).into_owned();
                let loader = ino == 0 && dev == 0;
                mapped_sink.borrow_mut().push(LibMapped { pid, id: FileId { dev: stat_dev(dev), ino }, name, ts_ns, loader });
            }
            0
        })
        .map_err(|e| ProbeError::Other(format!("ring buffer: {e}")))?;
        let ring = rb.build().map_err(|e| ProbeError::Other(format!("ring buffer: {e}")))?;
        Ok(Probes { skel, links, files: HashMap::new(), ring, inbox, mapped, mmap_probe_error })
    }

    /// The files probed so far, with how.
    pub fn files(&self) -> impl Iterator<Item = (&FileId, &(PathBuf, Attached))> {
        self.files.iter()
    }

    /// Whether this file is already probed.
    pub fn has_file(&self, id: &FileId) -> bool {
        self.files.contains_key(id)
    }

    fn program(&self, name: &str) -> Option<&libbpf_rs::ProgramMut<'static>> {
        let p = &self.skel.progs;
        Some(match name {
            "mem_alloc_entry" => &p.mem_alloc_entry,
            "mem_alloc_return" => &p.mem_alloc_return,
            "mem_alloc_pitch_entry" => &p.mem_alloc_pitch_entry,
            "mem_alloc_pitch_return" => &p.mem_alloc_pitch_return,
            "mem_alloc_managed_entry" => &p.mem_alloc_managed_entry,
            "mem_alloc_managed_return" => &p.mem_alloc_managed_return,
            "mem_free_entry" => &p.mem_free_entry,
            "mem_free_return" => &p.mem_free_return,
            "address_free_return" => &p.address_free_return,
            "mem_release_return" => &p.mem_release_return,
            "mem_unmap_return" => &p.mem_unmap_return,
            "free_async_return" => &p.free_async_return,
            "address_reserve_entry" => &p.address_reserve_entry,
            "address_reserve_return" => &p.address_reserve_return,
            "address_free_entry" => &p.address_free_entry,
            "mem_create_entry" => &p.mem_create_entry,
            "mem_create_return" => &p.mem_create_return,
            "mem_release_entry" => &p.mem_release_entry,
            "mem_map_entry" => &p.mem_map_entry,
            "mem_map_return" => &p.mem_map_return,
            "mem_unmap_entry" => &p.mem_unmap_entry,
            "alloc_async_entry" => &p.alloc_async_entry,
            "alloc_async_return" => &p.alloc_async_return,
            "alloc_from_pool_async_entry" => &p.alloc_from_pool_async_entry,
            "alloc_from_pool_async_return" => &p.alloc_from_pool_async_return,
            "free_async_entry" => &p.free_async_entry,
            "pool_trim_to_entry" => &p.pool_trim_to_entry,
            "pool_trim_to_return" => &p.pool_trim_to_return,
            "mem_get_info_entry" => &p.mem_get_info_entry,
            "mem_get_info_return" => &p.mem_get_info_return,
            "primary_ctx_retain_entry" => &p.primary_ctx_retain_entry,
            "primary_ctx_retain_return" => &p.primary_ctx_retain_return,
            "ctx_set_current_entry" => &p.ctx_set_current_entry,
            "ctx_set_current_return" => &p.ctx_set_current_return,
            "ctx_create_entry" => &p.ctx_create_entry,
            "ctx_create_return" => &p.ctx_create_return,
            "ctx_push_current_entry" => &p.ctx_push_current_entry,
            "ctx_push_current_return" => &p.ctx_push_current_return,
            "ctx_pop_current_entry" => &p.ctx_pop_current_entry,
            "ctx_pop_current_return" => &p.ctx_pop_current_return,
            "ctx_get_device_entry" => &p.ctx_get_device_entry,
            "ctx_get_device_return" => &p.ctx_get_device_return,
            "pool_create_entry" => &p.pool_create_entry,
            "pool_create_return" => &p.pool_create_return,
            "default_mem_pool_entry" => &p.default_mem_pool_entry,
            "default_mem_pool_return" => &p.default_mem_pool_return,
            "pool_get_attribute_entry" => &p.pool_get_attribute_entry,
            "pool_get_attribute_return" => &p.pool_get_attribute_return,
            "torch_malloc_entry" => &p.torch_malloc_entry,
            "torch_malloc_return" => &p.torch_malloc_return,
            "torch_free_entry" => &p.torch_free_entry,
            "torch_raw_alloc_entry" => &p.torch_raw_alloc_entry,
            "torch_raw_alloc_return" => &p.torch_raw_alloc_return,
            "torch_raw_alloc_stream_entry" => &p.torch_raw_alloc_stream_entry,
            "torch_raw_alloc_stream_return" => &p.torch_raw_alloc_stream_return,
            "torch_raw_delete_entry" => &p.torch_raw_delete_entry,
            "torch_fraction_entry" => &p.torch_fraction_entry,
            "torch_fraction_return" => &p.torch_fraction_return,
            "torch_oom_entry" => &p.torch_oom_entry,
            "bfc_alloc_entry" => &p.bfc_alloc_entry,
            "bfc_alloc_return" => &p.bfc_alloc_return,
            "bfc_alloc_plain_entry" => &p.bfc_alloc_plain_entry,
            "bfc_alloc_plain_return" => &p.bfc_alloc_plain_return,
            "gf_segment" => &p.gf_segment,
            "gf_block_alloc" => &p.gf_block_alloc,
            "gf_block_free" => &p.gf_block_free,
            "gf_oom" => &p.gf_oom,
            "runtime_alloc_entry" => &p.runtime_alloc_entry,
            "runtime_alloc_return" => &p.runtime_alloc_return,
            "empty_entry" => &p.empty_entry,
            "empty_return" => &p.empty_return,
            _ => return None,
        })
    }

    /// Attaches `pair`'s entry and return programs at file offset `offset` of `path` (`func` names
    /// it in errors). Offsets are resolved once per file by [`symbols::function_offsets`].
    fn attach_pair(&mut self, path: &Path, func: &str, offset: u64, pair: &str) -> Result<(), ProbeError> {
        for (suffix, retprobe) in [("entry", false), ("return", true)] {
            let name = format!("{pair}_{suffix}");
            let prog = self.program(&name).ok_or_else(|| ProbeError::Other(format!("no program {name}")))?;
            let opts = UprobeOpts { retprobe, ..UprobeOpts::default() };
            let link = prog
                .attach_uprobe_with_opts(-1, path, offset as usize, opts)
                .map_err(|e| classify(&e, &format!("attaching a uprobe to {func} in {}", path.display())))?;
            self.links.push(link);
        }
        Ok(())
    }

    fn offsets(path: &Path) -> Result<HashMap<String, u64>, ProbeError> {
        let names: Vec<&str> = DRIVER_FUNCTIONS.iter().map(|(f, _)| *f).collect();
        symbols::function_offsets(path, &names).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))
    }

    /// Probes the driver functions of the libcuda file at `path` (once per file identity).
    pub fn attach_driver(&mut self, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if !self.files.contains_key(&id) {
            let offsets = Self::offsets(path)?;
            let mut functions = 0;
            for (func, pair) in DRIVER_FUNCTIONS {
                let Some(&off) = offsets.get(*func) else { continue };
                self.attach_pair(path, func, off, pair)?;
                functions += 1;
            }
            if functions == 0 {
                return Err(ProbeError::Other(format!("{} exports none of the CUDA memory functions", path.display())));
            }
            self.files.insert(id, (path.to_path_buf(), Attached::Driver { functions }));
        }
        Ok(&self.files[&id].1)
    }

    /// Probes the CUDA runtime's allocation functions ([`RUNTIME_FUNCTIONS`]) in the libcudart
    /// file at `path` (once per file identity). A file that exports none of them is recorded as
    /// probed with 0 functions (no error: its driver calls name their own caller).
    pub fn attach_runtime(&mut self, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if !self.files.contains_key(&id) {
            let offsets =
                symbols::function_offsets(path, &RUNTIME_FUNCTIONS).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
            let mut functions = 0;
            for func in RUNTIME_FUNCTIONS {
                let Some(&off) = offsets.get(func) else { continue };
                self.attach_pair(path, func, off, "runtime_alloc")?;
                functions += 1;
            }
            self.files.insert(id, (path.to_path_buf(), Attached::Runtime { functions }));
        }
        Ok(&self.files[&id].1)
    }

    /// Probes PyTorch's allocator in the libc10_cuda file at `path`: USDT where present, else
    /// the `.symtab` functions.
    pub fn attach_torch(&mut self, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if !self.files.contains_key(&id) {
            let (how, found) = symbols::torch_probes(path);
            // The raw entry points probed: all three beside the USDT probes (which fire only in
            // allocate() and local_raw_delete); beside the malloc uprobe, which raw_alloc's calls
            // reach already, only raw_delete.
            let mut raw = symbols::RawEntries::default();
            match &how {
                TorchProbes::Usdt => {
                    for (prog, name) in [(&self.skel.progs.usdt_malloc, "malloc"), (&self.skel.progs.usdt_free, "free")] {
                        let link = prog.attach_usdt(-1, path, "pytorch", name).map_err(|e| classify(&e, "attaching USDT probes"))?;
                        self.links.push(link);
                    }
                    if let Some(off) = found.alloc {
                        self.attach_pair(path, symbols::TORCH_RAW_ALLOC, off, "torch_raw_alloc")?;
                        raw.alloc = Some(off);
                    }
                    if let Some(off) = found.alloc_stream {
                        self.attach_pair(path, symbols::TORCH_RAW_ALLOC_STREAM, off, "torch_raw_alloc_stream")?;
                        raw.alloc_stream = Some(off);
                    }
                }
                TorchProbes::Symbols { malloc, free } => {
                    for (prog, offset, retprobe) in [
                        (&self.skel.progs.torch_malloc_entry, *malloc, false),
                        (&self.skel.progs.torch_malloc_return, *malloc, true),
                        (&self.skel.progs.torch_free_entry, *free, false),
                    ] {
                        let link =
                            prog.attach_uprobe(retprobe, -1, path, offset as usize).map_err(|e| classify(&e, "attaching uprobes"))?;
                        self.links.push(link);
                    }
                }
                TorchProbes::None(_) => {}
            }
            if let (Some(off), false) = (found.delete, matches!(how, TorchProbes::None(_))) {
                let link = self
                    .skel
                    .progs
                    .torch_raw_delete_entry
                    .attach_uprobe(false, -1, path, off as usize)
                    .map_err(|e| classify(&e, &format!("attaching a uprobe to {} in {}", symbols::TORCH_RAW_DELETE, path.display())))?;
                self.links.push(link);
                raw.delete = Some(off);
            }
            let fraction = symbols::torch_fraction_probe(path);
            if let symbols::TorchFractionProbe::Symbol { path: lib, offset } = &fraction {
                self.attach_pair(lib, symbols::TORCH_FRACTION, *offset, "torch_fraction")?;
            }
            let oom = symbols::torch_oom_probe(path);
            if let symbols::TorchOomProbe::Symbol { path: lib, offset } = &oom {
                let link = self
                    .skel
                    .progs
                    .torch_oom_entry
                    .attach_uprobe(false, -1, lib, *offset as usize)
                    .map_err(|e| classify(&e, &format!("attaching a uprobe to {} in {}", symbols::TORCH_OOM_REPORT, lib.display())))?;
                self.links.push(link);
            }
            self.files.insert(id, (path.to_path_buf(), Attached::Torch(how, raw, oom, fraction)));
        }
        Ok(&self.files[&id].1)
    }

    /// Probes XLA's BFC allocator in the library at `path` (JAX's CUDA plugin, TensorFlow's
    /// framework library) through its `AllocateRaw` / `DeallocateRaw` symbols.
    pub fn attach_bfc(&mut self, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if !self.files.contains_key(&id) {
            let how = symbols::bfc_probes(path);
            if let BfcProbes::Symbols { allocate, allocate_plain, deallocate, .. } = &how {
                let (allocate, allocate_plain, deallocate) = (*allocate, *allocate_plain, *deallocate);
                self.attach_pair(path, symbols::BFC_ALLOCATE, allocate, "bfc_alloc")?;
                if let Some(off) = allocate_plain {
                    self.attach_pair(path, symbols::BFC_ALLOCATE_PLAIN, off, "bfc_alloc_plain")?;
                }
                let link = self
                    .skel
                    .progs
                    .bfc_free_entry
                    .attach_uprobe(false, -1, path, deallocate as usize)
                    .map_err(|e| classify(&e, &format!("attaching a uprobe to {} in {}", symbols::BFC_DEALLOCATE, path.display())))?;
                self.links.push(link);
            }
            self.files.insert(id, (path.to_path_buf(), Attached::Bfc(how)));
        }
        Ok(&self.files[&id].1)
    }

    /// Attaches gpufrag's own USDT probes (`gpufrag:segment`, `block_alloc`, `block_free`,
    /// `oom`, from `include/gpufrag_annotate.h`) in the ELF file at `path` (once per file).
    pub fn attach_annotations(&mut self, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if !self.files.contains_key(&id) {
            let present = symbols::annotate_probes(path);
            if present.is_empty() {
                return Err(ProbeError::Other(format!("{} has no gpufrag USDT probes (include/gpufrag_annotate.h)", path.display())));
            }
            for name in &present {
                let Some(prog) = self.program(&format!("gf_{name}")) else { continue };
                let link = prog
                    .attach_usdt(-1, path, "gpufrag", name)
                    .map_err(|e| classify(&e, &format!("attaching USDT gpufrag:{name} in {}", path.display())))?;
                self.links.push(link);
            }
            self.files.insert(id, (path.to_path_buf(), Attached::Annotations { probes: present.len() }));
        }
        Ok(&self.files[&id].1)
    }

    /// Puts a uprobe on the dynamic loader's breakpoint ([`LOADER_BREAKPOINT`]) in the `ld.so`
    /// at `path` (once per file), so that every dlopen of every process that runs this loader
    /// is reported as it happens.
    pub fn attach_loader(&mut self, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        if !self.files.contains_key(&id) {
            let offsets =
                symbols::function_offsets(path, &[LOADER_BREAKPOINT]).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
            let off = *offsets
                .get(LOADER_BREAKPOINT)
                .ok_or_else(|| ProbeError::Other(format!("{} has no {LOADER_BREAKPOINT}", path.display())))?;
            let link = self
                .skel
                .progs
                .on_dl_debug_state
                .attach_uprobe(false, -1, path, off as usize)
                .map_err(|e| classify(&e, &format!("attaching a uprobe to {LOADER_BREAKPOINT} in {}", path.display())))?;
            self.links.push(link);
            self.files.insert(id, (path.to_path_buf(), Attached::Loader));
        }
        Ok(&self.files[&id].1)
    }

    /// Probes a library of any kind.
    pub fn attach(&mut self, kind: LibKind, path: &Path) -> Result<&Attached, ProbeError> {
        let id = procfs::file_id(path).map_err(|e| ProbeError::Other(format!("{}: {e}", path.display())))?;
        match kind {
            LibKind::Cuda => {
                self.attach_driver(path)?;
            }
            LibKind::C10Cuda => {
                self.attach_torch(path)?;
            }
            LibKind::Annotated => {
                self.attach_annotations(path)?;
            }
            LibKind::XlaBfc => {
                self.attach_bfc(path)?;
            }
            LibKind::Loader => {
                self.attach_loader(path)?;
            }
            LibKind::Cudart => {
                self.attach_runtime(path)?;
            }
        }
        self.mark_probed(id);
        self.files.get(&id).map(|(_, a)| a).ok_or_else(|| ProbeError::Other(format!("{} was not recorded as probed", path.display())))
    }

    /// Tells the mapping kprobe and the exec tracepoint that `id` is known (probed, or looked
    /// at and found to need no probe): no more notifications for it.
    pub fn mark_probed(&self, id: FileId) {
        let mut key = [0u8; 16];
        key[0..8].copy_from_slice(&id.ino.to_ne_bytes());
        key[8..12].copy_from_slice(&kernel_dev(id.dev).to_ne_bytes());
        let _ = self.skel.maps.probed_files.update(&key, &[1u8], MapFlags::ANY);
    }

    /// Undoes [`Probes::mark_probed`]: the next mapping or exec of `id` is reported again.
    pub fn unmark_probed(&self, id: FileId) {
        let mut key = [0u8; 16];
        key[0..8].copy_from_slice(&id.ino.to_ne_bytes());
        key[8..12].copy_from_slice(&kernel_dev(id.dev).to_ne_bytes());
        let _ = self.skel.maps.probed_files.delete(&key);
    }

    /// The library mappings the kprobe reported since the last call.
    pub fn take_mapped(&mut self) -> Vec<LibMapped> {
        std::mem::take(&mut *self.mapped.borrow_mut())
    }

    /// Attaches only the empty baseline pair to `func` in `path` (for the benchmark).
    pub fn attach_empty(&mut self, path: &Path, func: &str) -> Result<(), ProbeError> {
        let off = *Self::offsets(path)?.get(func).ok_or_else(|| ProbeError::Other(format!("{} has no {func}", path.display())))?;
        self.attach_pair(path, func, off, "empty")
    }

    /// Attaches one driver function's real pair only (for the benchmark).
    pub fn attach_function(&mut self, path: &Path, func: &str) -> Result<(), ProbeError> {
        let pair = DRIVER_FUNCTIONS
            .iter()
            .find(|(f, _)| *f == func)
            .map(|(_, p)| *p)
            .ok_or_else(|| ProbeError::Other(format!("{func} is not probed")))?;
        let off = *Self::offsets(path)?.get(func).ok_or_else(|| ProbeError::Other(format!("{} has no {func}", path.display())))?;
        self.attach_pair(path, func, off, pair)
    }

    /// Reports `tgid`'s events from now on.
    pub fn trace(&self, tgid: u32) -> Result<(), ProbeError> {
        self.skel
            .maps
            .traced
            .update(&tgid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .map_err(|e| ProbeError::Other(format!("tracing {tgid}: {e}")))
    }

    /// Stops reporting `tgid`.
    pub fn untrace(&self, tgid: u32) {
        let _ = self.skel.maps.traced.delete(&tgid.to_ne_bytes());
    }

    /// Events lost so far (ring buffer full), summed over CPUs.
    pub fn lost(&self) -> u64 {
        let key = 0u32.to_ne_bytes();
        match self.skel.maps.lost.lookup_percpu(&key, MapFlags::ANY) {
            Ok(Some(per_cpu)) => {
                per_cpu.iter().filter_map(|v| v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok())).map(u64::from_ne_bytes).sum()
            }
            _ => 0,
        }
    }

    /// Waits up to `timeout` for events and returns what arrived. The probes wake this reader
    /// only when the ring fills up (see `submit_event` in the BPF source), so the ring is
    /// drained after every wait whether or not it woke us.
    pub fn poll(&mut self, timeout: Duration) -> Vec<Event> {
        let _ = self.ring.poll(timeout);
        let _ = self.ring.consume();
        std::mem::take(&mut *self.inbox.borrow_mut())
    }

    /// Adds `fd` to the ring's epoll set, so that [`Probes::poll`] returns as soon as it is
    /// readable (the exec hold's wake-up; the caller empties it). libbpf takes an epoll event's
    /// `data` as the index of the ring that is ready: 0, the one ring, which is then consumed.
    pub fn add_wakeup(&self, fd: std::os::fd::RawFd) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 0 };
        // SAFETY: epoll_ctl(2) on the ring's epoll descriptor with a descriptor the caller holds.
        if unsafe { libc::epoll_ctl(self.ring.epoll_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Empties the ring without waiting.
    pub fn drain(&mut self) -> Vec<Event> {
        let _ = self.ring.consume();
        std::mem::take(&mut *self.inbox.borrow_mut())
    }

    /// Turns on the kernel's per-program run-time statistics while the returned descriptor is
    /// open (`BPF_ENABLE_STATS`; the benchmark reads them with [`Probes::program_stats`]).
    pub fn enable_run_time_stats() -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: a plain bpf() command; it returns a new descriptor or a negative error.
        let fd = unsafe { libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME) };
        // SAFETY: fd is a descriptor we now own (checked non-negative).
        (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// (program name, runs, total run time in ns) of every program of this skeleton, as the
    /// kernel counts them while run-time statistics are on.
    pub fn program_stats(&self) -> Vec<(String, u64, u64)> {
        use libbpf_rs::skel::Skel;
        use std::os::fd::{AsFd, AsRawFd};
        let mut out = Vec::new();
        for prog in self.skel.object().progs() {
            let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of_val(&info) as u32;
            // SAFETY: info is a bpf_prog_info of `len` bytes that the kernel fills in.
            let rc = unsafe { libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(prog.as_fd().as_raw_fd(), &mut info, &mut len) };
            if rc == 0 {
                out.push((prog.name().to_string_lossy().into_owned(), info.run_cnt, info.run_time_ns));
            }
        }
        out
    }

    /// Number of attachments (links) held.
    pub fn link_count(&self) -> usize {
        self.links.len()
    }
}
