//! The request stream of a trace: what the program asked the caching allocator for (allocations
//! of a requested size on a stream, frees, `empty_cache()` calls), which does not depend on the
//! allocator's settings, and beside it what the driver was asked to do for each request (the
//! recorded `segment_*` entries), which does, for the self-check.
//!
//! Sources: a PyTorch snapshot with allocation history (any settings; a memory_viz export is one),
//! or a gpufrag record file with block events (`run`, `attach`, `agent`).
//!
//! Attribution. A `malloc`'s driver calls come right before its `alloc` (or `oom`) entry, and a
//! `malloc` that frees segments (a retry, garbage collection) always then maps or allocates one or
//! fails; so a run of `segment_free`/`segment_unmap` entries not followed by a `segment_alloc`,
//! a `segment_map` or an `oom` before the next request is an `empty_cache()` call. (An
//! `empty_cache()` immediately followed by a `malloc` that needs a new segment is indistinguishable
//! from that `malloc`'s own retry; the self-check then reports the difference.)
//!
//! Completeness. whatif needs the history from the first allocation: a free of a block the trace
//! never allocated, a segment freed that it never allocated, or final segments the trace does not
//! account for mean the ring was truncated (`max_entries`) or recording began late, and the trace
//! is refused with a message saying so.

use super::allocator::DeviceOp;
use crate::alloc::pytorch::AllocConf;
use crate::event::{Event, EventKind, F_FRAMEWORK_OWNED};
use crate::snapshot::{Action, Snapshot};
use std::collections::{BTreeMap, HashMap};

/// One request of the program to the caching allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `malloc(size)` on `stream`.
    Alloc {
        /// Bytes asked for (for a request that failed in the trace, its `oom` entry's rounded size).
        size: u64,
        /// The `cudaStream_t`.
        stream: u64,
        /// The trace entry.
        entry: usize,
        /// Where the trace's allocator put it; `None` when the request failed in the trace.
        traced: Option<u64>,
    },
    /// `free` of a block.
    FreeRequested {
        /// Which allocation: the n-th `Alloc` of the stream.
        alloc: u32,
        /// The trace entry.
        entry: usize,
    },
    /// The block is reusable (after its last stream use).
    FreeCompleted {
        /// Which allocation.
        alloc: u32,
        /// The trace entry.
        entry: usize,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache {
        /// The trace entry of its first driver call.
        entry: usize,
    },
}

impl Request {
    /// The trace entry (or record event) this request came from.
    pub fn entry(&self) -> usize {
        match *self {
            Request::Alloc { entry, .. }
            | Request::FreeRequested { entry, .. }
            | Request::FreeCompleted { entry, .. }
            | Request::EmptyCache { entry } => entry,
        }
    }
}

/// What the trace's own run ended with (from a snapshot's final segments).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceFinal {
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes.
    pub allocated: u64,
}

/// A trace turned into requests.
#[derive(Clone, Debug)]
pub struct RequestStream {
    /// The requests, in order.
    pub requests: Vec<Request>,
    /// The driver ops the trace recorded, in order.
    pub recorded: Vec<DeviceOp>,
    /// The trace entry of each recorded op.
    pub recorded_entry: Vec<usize>,
    /// Request `r` caused `recorded[op_start[r]..op_start[r + 1]]`.
    pub op_start: Vec<u32>,
    /// The settings the trace ran under.
    pub conf: AllocConf,
    /// The device simulated.
    pub device: i16,
    /// Entries (or events) in the trace.
    pub entries: usize,
    /// Requests that failed in the trace: (request index, device free bytes when known).
    pub trace_ooms: Vec<(usize, Option<u64>)>,
    /// What the driver could still give at the trace's first OOM (reserved then + device free).
    pub device_capacity_hint: Option<u64>,
    /// Peak bytes of driver memory on the device that no caching allocator owns (record files).
    pub non_framework_peak: u64,
    /// The final figures, when the source has them.
    pub final_figures: Option<TraceFinal>,
    /// Peak reserved in the trace.
    pub peak_reserved: u64,
    /// What kind of source: "snapshot" or "record".
    pub source: &'static str,
    /// Driver ops of a record whose block events were not written between its driver calls (the
    /// Python hook hands PyTorch's history over at exit): in order, attributed to no request.
    /// The self-check then compares the sequence of driver calls (kind and size) only.
    pub unattributed: Vec<DeviceOp>,
    /// Things the reader should know.
    pub notes: Vec<String>,
    /// Successful legacy CUDA IPC exports (`cuIpcGetMemHandle` / `cudaIpcGetMemHandle`) of memory
    /// in the caching allocator's segments: (record event, address). Only a record carries them.
    pub ipc_exports: Vec<(usize, u64)>,
    /// Whether the source could have shown an IPC export (a record written by the shim).
    pub sees_ipc: bool,
    /// The time of each request in nanoseconds (a snapshot's `time_us` × 1000, a record's
    /// `ts_ns`; 0 where the source has none), for interleaving two traces on one device.
    pub times: Vec<u64>,
}

impl RequestStream {
    /// The recorded ops of request `r`.
    pub fn ops_of(&self, r: usize) -> &[DeviceOp] {
        &self.recorded[self.op_start[r] as usize..self.op_start[r + 1] as usize]
    }
}

/// Why a trace cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// A snapshot with segments and no trace.
    #[error("the snapshot has no allocation history (segments only): whatif needs every allocation from the first one; record it with torch.cuda.memory._record_memory_history(max_entries=1000000) before the first CUDA allocation, or trace the program from its start with gpufrag attach --record FILE (PyTorch's USDT probes see every block)")]
    NoHistory,
    /// Nothing at all.
    #[error("the trace holds no allocation: nothing to simulate")]
    Empty,
    /// The history does not start at the first allocation.
    #[error("the trace does not start at the program's first allocation ({0}): the history was truncated by max_entries or began late, and its start cannot be rebuilt for another allocator setting. A snapshot: record again with a larger max_entries from before the first allocation (torch.cuda.memory._record_memory_history(max_entries=...)). A record: gpufrag attach to a running process sees only what it allocates afterwards; trace the program from its start instead (gpufrag run --torch-tracker build --record FILE -- CMD)")]
    Truncated(String),
    /// The record could not be read part-way (the message names the file and the offset).
    #[error("{0}")]
    Unreadable(String),
    /// Holding the stream would pass the memory budget (the message names the file and the flag).
    #[error("{0}")]
    Budget(String),
    /// A record of driver-level segments only: no caching allocator was seen in the program.
    #[error("the record holds only driver-level segments, no caching-allocator block: whatif models PyTorch's caching allocator, and gpufrag saw none in this program. If the program is PyTorch, the hook that sees its blocks did not load: under gpufrag run, check with `gpufrag run -- python -c 'import sitecustomize; print(sitecustomize.__file__)'` (it prints a path in gpufrag's folder, unless --no-python-hook, `python -I` or `-S`, or a PYTHONPATH the program resets keeps it out); under gpufrag attach, the program's libc10_cuda.so had no pytorch:malloc USDT probe to attach to (`readelf -n` on it lists its probes). If it is JAX (XLA) or CuPy, whatif does not model their allocators")]
    NoBlocks,
    /// A record whose blocks are differences between periodic snapshots.
    #[error("the record's blocks come from periodic snapshots of the allocator (gpufrag run's Python hook), which miss every block that lived between two of them: whatif needs each allocation. The hook takes snapshots when PyTorch's trace tracker is off or not built yet (--torch-tracker auto builds it in the background for the next run): record again with gpufrag run --torch-tracker build --record, which sees each block; or record the history with torch.cuda.memory._record_memory_history() and give whatif the snapshot, or trace the program with gpufrag attach --record (PyTorch's USDT probes see every block)")]
    Sampled,
}

#[derive(Default)]
struct Builder {
    requests: Vec<Request>,
    recorded: Vec<DeviceOp>,
    recorded_entry: Vec<usize>,
    op_start: Vec<u32>,
    pending: Vec<(DeviceOp, usize)>,
    live: HashMap<u64, u32>,
    allocs: u32,
    segments: BTreeMap<u64, u64>,
    reserved: u64,
    peak_reserved: u64,
    trace_ooms: Vec<(usize, Option<u64>)>,
    capacity: Option<u64>,
    /// The time of the entry being read.
    now: u64,
    times: Vec<u64>,
    /// The file named when the stream would grow past the memory budget (`None`: unchecked).
    budget_file: Option<std::path::PathBuf>,
    /// Why the stream stopped growing: past the memory budget.
    over: Option<String>,
}

impl Builder {
    fn push(&mut self, r: Request, ops: Vec<(DeviceOp, usize)>) {
        if self.requests.len() == self.requests.capacity() && self.over.is_none() {
            self.charge_growth();
        }
        if self.over.is_some() {
            // past the budget: the caller stops at this request and says why
            return;
        }
        self.op_start.push(self.recorded.len() as u32);
        for (op, e) in ops {
            self.recorded.push(op);
            self.recorded_entry.push(e);
        }
        self.requests.push(r);
        self.times.push(self.now);
    }

    /// Checks the growth the next request takes (every per-request vector doubling with the
    /// requests) against the memory budget; past it, says why in `over`.
    fn charge_growth(&mut self) {
        let Some(file) = &self.budget_file else { return };
        use crate::budget::{vec_bytes, vec_growth_bytes};
        let bytes = vec_growth_bytes(&self.requests)
            + vec_growth_bytes(&self.times)
            + vec_growth_bytes(&self.op_start)
            + vec_bytes(&self.recorded)
            + vec_bytes(&self.recorded_entry)
            + (self.live.capacity() as u64) * 16;
        let n = self.requests.len() as u64;
        if let Err(over) = crate::budget::charge(file, || format!("the request stream of {}+ requests", crate::units::thousands(n)), bytes)
        {
            self.over = Some(over.to_string());
        }
    }

    fn flush_as_empty_cache(&mut self) {
        if !self.pending.is_empty() {
            let ops = std::mem::take(&mut self.pending);
            let entry = ops[0].1;
            self.push(Request::EmptyCache { entry }, ops);
        }
    }

    fn op(&mut self, op: DeviceOp, entry: usize) -> Result<(), StreamError> {
        match op {
            DeviceOp::SegmentAlloc { addr, size } | DeviceOp::Map { addr, size } => {
                self.segments.insert(addr, size);
                self.reserved += size;
                self.peak_reserved = self.peak_reserved.max(self.reserved);
            }
            DeviceOp::SegmentFree { addr, size } => {
                if self.segments.remove(&addr).is_none() {
                    return Err(StreamError::Truncated(format!(
                        "entry {entry} frees the segment at {addr:#x}, which the trace never allocated"
                    )));
                }
                self.reserved = self.reserved.saturating_sub(size);
            }
            DeviceOp::Unmap { addr, size } => {
                // an unmap may cut a mapped range; check only that something was mapped there
                let covered = self.segments.range(..=addr).next_back().is_some_and(|(&a, &s)| a + s > addr);
                if !covered && self.reserved < size {
                    return Err(StreamError::Truncated(format!("entry {entry} unmaps {addr:#x}, which the trace never mapped")));
                }
                self.reserved = self.reserved.saturating_sub(size);
            }
        }
        self.pending.push((op, entry));
        Ok(())
    }

    fn alloc(&mut self, size: u64, stream: u64, entry: usize, traced: Option<u64>) {
        let grows = self.pending.iter().any(|(op, _)| matches!(op, DeviceOp::SegmentAlloc { .. } | DeviceOp::Map { .. }));
        if !grows && traced.is_some() {
            self.flush_as_empty_cache();
        }
        let ops = std::mem::take(&mut self.pending);
        if let Some(addr) = traced {
            self.live.insert(addr, self.allocs);
        }
        self.allocs += 1;
        self.push(Request::Alloc { size, stream, entry, traced }, ops);
    }

    fn free(&mut self, addr: u64, entry: usize, completed: bool, remove: bool) -> Result<(), StreamError> {
        self.flush_as_empty_cache();
        let Some(&alloc) = self.live.get(&addr) else {
            return Err(StreamError::Truncated(format!("entry {entry} frees the block at {addr:#x}, which the trace never allocated")));
        };
        if remove {
            self.live.remove(&addr);
        }
        let r = if completed { Request::FreeCompleted { alloc, entry } } else { Request::FreeRequested { alloc, entry } };
        self.push(r, Vec::new());
        Ok(())
    }

    fn oom(&mut self, size: u64, stream: u64, entry: usize, device_free: Option<u64>) {
        if let Some(f) = device_free {
            let cap = self.reserved + f;
            self.capacity = Some(self.capacity.map_or(cap, |c| c.min(cap)));
        }
        self.alloc(size, stream, entry, None);
        self.trace_ooms.push((self.requests.len() - 1, device_free));
    }

    fn finish(mut self, conf: AllocConf, device: i16, entries: usize, source: &'static str) -> Result<RequestStream, StreamError> {
        self.flush_as_empty_cache();
        if self.allocs == 0 {
            return Err(StreamError::Empty);
        }
        self.op_start.push(self.recorded.len() as u32);
        Ok(RequestStream {
            requests: self.requests,
            recorded: self.recorded,
            recorded_entry: self.recorded_entry,
            op_start: self.op_start,
            conf,
            device,
            entries,
            trace_ooms: self.trace_ooms,
            device_capacity_hint: self.capacity,
            non_framework_peak: 0,
            final_figures: None,
            peak_reserved: self.peak_reserved,
            source,
            unattributed: Vec::new(),
            notes: Vec::new(),
            ipc_exports: Vec::new(),
            sees_ipc: false,
            times: self.times,
        })
    }
}

/// The settings a snapshot records: its `PYTORCH_CUDA_ALLOC_CONF` string parsed as PyTorch does,
/// or, when the string is absent or unparsable, the parsed fields.
pub fn snapshot_conf(snap: &Snapshot) -> AllocConf {
    if let Ok(c) = AllocConf::parse(&snap.settings.conf) {
        if !snap.settings.conf.is_empty() || (!snap.settings.expandable_segments && snap.settings.max_split_size.is_none()) {
            return c;
        }
    }
    AllocConf {
        rules: crate::input::rules_from(&snap.settings),
        expandable_segments: snap.settings.expandable_segments,
        garbage_collection_threshold: snap.settings.garbage_collection_threshold,
        conf: snap.settings.conf.clone(),
        ..AllocConf::default()
    }
}

/// The request stream of a snapshot's busiest device.
pub fn from_snapshot(snap: &Snapshot) -> Result<RequestStream, StreamError> {
    let trace =
        snap.traces.iter().max_by_key(|t| t.entries.iter().filter(|e| e.action == Action::Alloc).count()).filter(|t| !t.entries.is_empty());
    let Some(trace) = trace else {
        return Err(if snap.segments.is_empty() { StreamError::Empty } else { StreamError::NoHistory });
    };
    let mut b = Builder::default();
    for (i, e) in trace.entries.iter().enumerate() {
        b.now = e.time_us.saturating_mul(1000);
        match e.action {
            Action::Alloc => b.alloc(e.size, e.stream, i, Some(e.addr)),
            Action::FreeRequested => b.free(e.addr, i, false, false)?,
            Action::FreeCompleted => b.free(e.addr, i, true, true)?,
            Action::SegmentAlloc => b.op(DeviceOp::SegmentAlloc { addr: e.addr, size: e.size }, i)?,
            Action::SegmentFree => b.op(DeviceOp::SegmentFree { addr: e.addr, size: e.size }, i)?,
            Action::SegmentMap => b.op(DeviceOp::Map { addr: e.addr, size: e.size }, i)?,
            Action::SegmentUnmap => b.op(DeviceOp::Unmap { addr: e.addr, size: e.size }, i)?,
            Action::Oom => b.oom(e.size, e.stream, i, e.device_free),
            Action::Snapshot | Action::UserDefined | Action::Unknown => {}
        }
    }
    let final_reserved: u64 = snap.segments.iter().filter(|s| s.device == trace.device).map(|s| s.total_size).sum();
    let final_allocated: u64 = snap
        .segments
        .iter()
        .filter(|s| s.device == trace.device)
        .flat_map(|s| s.blocks.iter())
        .filter(|bl| bl.state == crate::snapshot::BlockState::ActiveAllocated)
        .map(|bl| bl.size)
        .sum();
    let traced_reserved = b.reserved;
    let entries = trace.entries.len();
    let mut s = b.finish(snapshot_conf(snap), trace.device, entries, "snapshot")?;
    if !snap.segments.is_empty() {
        if final_reserved != traced_reserved {
            return Err(StreamError::Truncated(format!(
                "its final segments hold {final_reserved} bytes, the trace accounts for {traced_reserved}"
            )));
        }
        s.final_figures = Some(TraceFinal { reserved: final_reserved, allocated: final_allocated });
    }
    if snap.traces.iter().filter(|t| !t.entries.is_empty()).count() > 1 {
        s.notes.push(format!("the snapshot traces several devices; whatif simulates device {}, the busiest", trace.device));
    }
    Ok(s)
}

/// The request stream of a gpufrag record's busiest (process, device) with block events, under
/// PyTorch's default settings (a record without settings events).
pub fn from_events(events: &[Event]) -> Result<RequestStream, StreamError> {
    from_events_with_texts(events, &[])
}

/// The request stream of a gpufrag record's busiest (process, device) with block events; its own
/// settings are the process's first settings event (`texts` by index into `events`, as
/// [`crate::record::Recording`] holds them).
pub fn from_events_with_texts(events: &[Event], texts: &[(usize, Box<[u8]>)]) -> Result<RequestStream, StreamError> {
    from_passes(&InMemory { events, texts })
}

/// A record's events that can be read more than once, in order: the builder reads a record in
/// a few passes (the busiest process first, then its allocator's segments, then its requests),
/// so that a record on disk is streamed each time and never held whole.
pub trait EventPasses {
    /// Calls `f` with each event's index, the event and its text (empty when none), in order,
    /// until `f` returns false or the events end.
    fn pass(&self, f: &mut dyn FnMut(usize, &Event, &[u8]) -> bool) -> Result<(), StreamError>;
    /// Where the events come from, for the memory budget's error.
    fn name(&self) -> &std::path::Path;
    /// Whether any block event with a known size may have been synced from periodic snapshots
    /// without saying so: a record older than format 4
    /// ([`crate::record::sized_blocks_may_be_sampled`]). Otherwise only
    /// [`crate::event::sampled_block`]'s are.
    fn sized_blocks_may_be_sampled(&self) -> bool {
        false
    }
}

struct InMemory<'a> {
    events: &'a [Event],
    texts: &'a [(usize, Box<[u8]>)],
}

impl EventPasses for InMemory<'_> {
    fn pass(&self, f: &mut dyn FnMut(usize, &Event, &[u8]) -> bool) -> Result<(), StreamError> {
        let mut texts = self.texts.iter().peekable();
        for (i, e) in self.events.iter().enumerate() {
            while texts.peek().is_some_and(|(t, _)| *t < i) {
                texts.next();
            }
            let text = texts.peek().filter(|(t, _)| *t == i).map_or(&[][..], |(_, t)| &t[..]);
            if !f(i, e, text) {
                break;
            }
        }
        Ok(())
    }

    fn name(&self) -> &std::path::Path {
        std::path::Path::new("the trace")
    }
}

/// A record read from its start up to and including the event at index `cut` (all of it with
/// `None`), entry by entry at each pass, from the input opened once (`crate::input::open`): a
/// regular file read again at its offset, a pipe's bytes held in memory.
pub struct RecordPasses<'a> {
    /// The record's bytes.
    pub bytes: &'a crate::input::Bytes,
    /// The file, for errors.
    pub path: &'a std::path::Path,
    /// The last event read, when not all.
    pub cut: Option<u64>,
}

impl EventPasses for RecordPasses<'_> {
    fn pass(&self, f: &mut dyn FnMut(usize, &Event, &[u8]) -> bool) -> Result<(), StreamError> {
        let reader = self.bytes.records(self.path).map_err(|e| StreamError::Unreadable(e.to_string()))?;
        for (i, entry) in reader.enumerate() {
            if self.cut.is_some_and(|c| i as u64 > c) {
                break;
            }
            let entry = entry.map_err(|e| StreamError::Unreadable(e.to_string()))?;
            if !f(i, &entry.event, entry.text.as_deref().unwrap_or(&[])) {
                break;
            }
        }
        Ok(())
    }

    fn name(&self) -> &std::path::Path {
        self.path
    }

    fn sized_blocks_may_be_sampled(&self) -> bool {
        self.bytes.records(self.path).is_ok_and(|r| crate::record::sized_blocks_may_be_sampled(r.version()))
    }
}

/// The request stream of the busiest (process, device) with block events of `src`, in four
/// passes over it; its own settings are the process's first settings event.
pub fn from_passes(src: &dyn EventPasses) -> Result<RequestStream, StreamError> {
    // pass 1: the busiest (process, device), whether its blocks are sampled, how many events
    let (pid, device, total) = busiest(src)?;
    // pass 2: segments that ever held a block, or that the allocator claimed, are the
    // allocator's; the process's settings events; whether the shim wrote it
    let Claimed { framework, first_block, stated_texts, sees_ipc } = claimed(src, pid, device)?;
    let is_framework = |addr: u64| framework.binary_search_by(|&(a, _)| a.cmp(&addr)).is_ok();
    // pass 3 (up to the first block)
    let interleaved = interleaved(src, pid, device, first_block.unwrap_or(0), &is_framework)?;
    // pass 4: the requests
    let mut unattributed: Vec<DeviceOp> = Vec::new();
    let mut b = Builder { budget_file: Some(src.name().to_path_buf()), ..Builder::default() };
    let (mut other, mut other_peak) = (0u64, 0u64);
    let mut other_segs: HashMap<u64, u64> = HashMap::new();
    let mut mapped_ranges = 0usize;
    let mut ipc_exports: Vec<(usize, u64)> = Vec::new();
    let mut failed: Result<(), StreamError> = Ok(());
    src.pass(&mut |i, e, _| {
        if e.pid != pid {
            return true;
        }
        // legacy IPC exports of the allocator's memory (the segment holding the address is one
        // the allocator claimed); the shim sees them, eBPF and PyTorch's history do not
        if e.kind == EventKind::IpcExport as u16 && e.rc == 0 && framework.iter().any(|&(a, sz)| a <= e.addr && e.addr < a + sz) {
            ipc_exports.push((i, e.addr));
        }
        if e.device != device {
            return true;
        }
        if let Err(err) = request_of(
            &mut b,
            i,
            e,
            interleaved,
            &framework,
            &is_framework,
            &mut unattributed,
            &mut other,
            &mut other_peak,
            &mut other_segs,
            &mut mapped_ranges,
        ) {
            failed = Err(err);
            return false;
        }
        if let Some(over) = b.over.take() {
            failed = Err(StreamError::Budget(over));
            return false;
        }
        true
    })?;
    failed?;
    let expandable = mapped_ranges > 0;
    // The process's own settings at its start, as its first settings event stated them (a
    // change at run time is noted: the simulation runs one setting throughout).
    // (an event without text states PyTorch's defaults, "")
    let stated: Vec<&str> = stated_texts.iter().filter_map(|t| std::str::from_utf8(t).ok()).collect();
    let own = stated.first().and_then(|t| AllocConf::parse(t).ok());
    let conf = match own.clone() {
        Some(c) if c.expandable_segments == expandable || !expandable => c,
        _ => AllocConf {
            expandable_segments: expandable,
            conf: if expandable { "expandable_segments:True".into() } else { String::new() },
            ..AllocConf::default()
        },
    };
    let mut s = b.finish(conf, device, total, "record")?;
    s.non_framework_peak = other_peak;
    // legacy IPC exports of the allocator's memory (the segment holding the address is one the
    // allocator claimed); the shim sees them, eBPF and PyTorch's history do not
    s.sees_ipc = sees_ipc;
    s.ipc_exports = ipc_exports;
    if !interleaved {
        s.notes.push(format!(
            "the record's block events were written after its driver calls ({} segment calls before the first block), not between them: the self-check compares the order and sizes of the driver calls only",
            unattributed.len()
        ));
        s.unattributed = unattributed;
    }
    settings_notes(&mut s, own.as_ref(), &stated, pid, expandable);
    Ok(s)
}

/// [`from_passes`]'s first pass: the (process, device) with the most block allocations and the
/// number of events; an error where there are none, or where their blocks were synced from
/// periodic snapshots (sampled).
fn busiest(src: &dyn EventPasses) -> Result<(u32, i16, usize), StreamError> {
    let mut counts: BTreeMap<(u32, i16), (usize, bool)> = BTreeMap::new();
    let mut total = 0usize;
    let legacy = src.sized_blocks_may_be_sampled();
    src.pass(&mut |i, e, _| {
        total = i + 1;
        if e.kind == EventKind::BlockAlloc as u16 {
            let c = counts.entry((e.pid, e.device)).or_default();
            c.0 += 1;
            c.1 |= crate::event::sampled_block(e.flags) || (legacy && e.flags & crate::event::F_BLOCK_SIZE_KNOWN != 0);
        }
        true
    })?;
    let Some((&(pid, device), &(_, sampled))) = counts.iter().max_by_key(|(_, &(n, _))| n) else {
        return Err(StreamError::NoBlocks);
    };
    if sampled {
        return Err(StreamError::Sampled);
    }
    Ok((pid, device, total))
}

/// What [`from_passes`]'s second pass finds of the simulated (process, device).
struct Claimed {
    /// The allocator's segments (address, size), sorted: those that ever held a block, or that
    /// the allocator claimed.
    framework: Vec<(u64, u64)>,
    /// The index of its first block allocation.
    first_block: Option<usize>,
    /// The texts of the process's settings events, in order.
    stated_texts: Vec<Vec<u8>>,
    /// Whether the shim wrote its events (it sees legacy IPC exports).
    sees_ipc: bool,
}

/// [`from_passes`]'s second pass: which segments are the allocator's, and the process's settings.
fn claimed(src: &dyn EventPasses, pid: u32, device: i16) -> Result<Claimed, StreamError> {
    let mut framework: Vec<(u64, u64)> = Vec::new();
    let mut segs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut first_block: Option<usize> = None;
    let mut stated_texts: Vec<Vec<u8>> = Vec::new();
    let mut sees_ipc = false;
    src.pass(&mut |i, e, text| {
        if e.pid != pid {
            return true;
        }
        sees_ipc |= e.flags & crate::event::F_SRC_SHIM != 0;
        if e.kind == EventKind::AllocSettings as u16 {
            stated_texts.push(text.to_vec());
        }
        if e.device != device {
            return true;
        }
        match EventKind::from_u16(e.kind) {
            Some(EventKind::MemAlloc) => {
                segs.insert(e.addr, e.size);
                if e.flags & F_FRAMEWORK_OWNED != 0 {
                    framework.push((e.addr, e.size));
                }
            }
            Some(EventKind::BlockAlloc) | Some(EventKind::Adopt) => {
                if e.kind == EventKind::BlockAlloc as u16 && first_block.is_none() {
                    first_block = Some(i);
                }
                if let Some((&a, &s)) = segs.range(..=e.addr).next_back() {
                    if a + s > e.addr {
                        framework.push((a, s));
                    }
                }
            }
            _ => {}
        }
        true
    })?;
    framework.sort_unstable();
    framework.dedup();
    Ok(Claimed { framework, first_block, stated_texts, sees_ipc })
}

/// [`from_passes`]'s third pass, up to the first block: a malloc makes at most one cudaMalloc
/// before its block: two framework segments before the first block mean the blocks were written
/// after the driver calls, not between them (false).
fn interleaved(
    src: &dyn EventPasses,
    pid: u32,
    device: i16,
    first_block: usize,
    is_framework: &dyn Fn(u64) -> bool,
) -> Result<bool, StreamError> {
    let mut before = 0usize;
    src.pass(&mut |i, e, _| {
        if i >= first_block {
            return false;
        }
        if e.pid == pid && e.device == device && e.kind == EventKind::MemAlloc as u16 && is_framework(e.addr) {
            before += 1;
        }
        true
    })?;
    Ok(before < 2)
}

/// The notes on the simulated process's settings: its own (or the defaults taken for it), and
/// how often they changed at run time.
fn settings_notes(s: &mut RequestStream, own: Option<&AllocConf>, stated: &[&str], pid: u32, expandable: bool) {
    match own {
        Some(c) => s.notes.push(format!("the record's own settings: {:?} (its settings event at the process's start)", c.conf)),
        None => s.notes.push(format!(
            "the record carries no usable allocator settings for pid {pid}: its own settings are taken to be {}",
            if expandable { "expandable_segments:True (it maps pages)" } else { "PyTorch's defaults" }
        )),
    }
    if stated.len() > 1 {
        s.notes.push(format!(
            "the settings changed {} time(s) at run time ({}): the simulation runs the start's settings throughout",
            stated.len() - 1,
            stated[1..].join("; ")
        ));
    }
}

/// One event of the simulated process turned into requests (the body of [`from_passes`]'s last
/// pass).
#[allow(clippy::too_many_arguments)]
fn request_of(
    b: &mut Builder,
    i: usize,
    e: &Event,
    interleaved: bool,
    framework: &[(u64, u64)],
    is_framework: &dyn Fn(u64) -> bool,
    unattributed: &mut Vec<DeviceOp>,
    other: &mut u64,
    other_peak: &mut u64,
    other_segs: &mut HashMap<u64, u64>,
    mapped_ranges: &mut usize,
) -> Result<(), StreamError> {
    b.now = e.ts_ns;
    match EventKind::from_u16(e.kind) {
        Some(EventKind::BlockAlloc) => b.alloc(e.requested, e.stream, i, Some(e.addr)),
        Some(EventKind::BlockFree) => {
            b.free(e.addr, i, false, false)?;
            b.free(e.addr, i, true, true)?;
        }
        Some(EventKind::MemAlloc | EventKind::MemFree | EventKind::Map | EventKind::Unmap) if !interleaved => {
            let op = match EventKind::from_u16(e.kind) {
                Some(EventKind::MemAlloc) if is_framework(e.addr) => DeviceOp::SegmentAlloc { addr: e.addr, size: e.size },
                Some(EventKind::MemFree) if framework.iter().any(|&(a, _)| a == e.addr) => {
                    DeviceOp::SegmentFree { addr: e.addr, size: framework.iter().find(|&&(a, _)| a == e.addr).map_or(0, |f| f.1) }
                }
                Some(EventKind::Map) => DeviceOp::Map { addr: e.addr, size: e.size },
                Some(EventKind::Unmap) => DeviceOp::Unmap { addr: e.addr, size: e.size },
                _ => return Ok(()),
            };
            match (op, unattributed.last_mut()) {
                (DeviceOp::Map { addr, size }, Some(DeviceOp::Map { addr: a0, size: s0 })) if *a0 + *s0 == addr => *s0 += size,
                (DeviceOp::Unmap { addr, size }, Some(DeviceOp::Unmap { addr: a0, size: s0 })) if *a0 + *s0 == addr => *s0 += size,
                _ => unattributed.push(op),
            }
            match op {
                DeviceOp::SegmentAlloc { size, .. } | DeviceOp::Map { size, .. } => {
                    b.reserved += size;
                    b.peak_reserved = b.peak_reserved.max(b.reserved);
                }
                DeviceOp::SegmentFree { size, .. } | DeviceOp::Unmap { size, .. } => b.reserved = b.reserved.saturating_sub(size),
            }
        }
        Some(EventKind::MemAlloc) if is_framework(e.addr) => b.op(DeviceOp::SegmentAlloc { addr: e.addr, size: e.size }, i)?,
        Some(EventKind::MemFree) if b.segments.contains_key(&e.addr) => {
            let size = b.segments[&e.addr];
            b.op(DeviceOp::SegmentFree { addr: e.addr, size }, i)?
        }
        Some(EventKind::MemAlloc) => {
            *other += e.size;
            *other_peak = (*other_peak).max(*other);
            other_segs.insert(e.addr, e.size);
        }
        Some(EventKind::MemFree) => {
            if let Some(s) = other_segs.remove(&e.addr) {
                *other -= s;
            }
        }
        Some(EventKind::Map) => {
            *mapped_ranges += 1;
            // PyTorch maps page by page; pages mapped for one request are one `segment_map`
            if let Some((DeviceOp::Map { addr, size }, _)) = b.pending.last_mut() {
                if *addr + *size == e.addr {
                    *size += e.size;
                    b.reserved += e.size;
                    b.peak_reserved = b.peak_reserved.max(b.reserved);
                    return Ok(());
                }
            }
            b.op(DeviceOp::Map { addr: e.addr, size: e.size }, i)?
        }
        Some(EventKind::Unmap) => {
            if let Some((DeviceOp::Unmap { addr, size }, _)) = b.pending.last_mut() {
                if *addr + *size == e.addr {
                    *size += e.size;
                    b.reserved = b.reserved.saturating_sub(e.size);
                    return Ok(());
                }
            }
            b.op(DeviceOp::Unmap { addr: e.addr, size: e.size }, i)?
        }
        Some(EventKind::AllocFailed) if e.op == EventKind::BlockAlloc as u16 => {
            let free = (e.flags & crate::event::F_DEVICE_FREE_KNOWN != 0).then_some(e.device_free);
            b.oom(e.requested, e.stream, i, free)
        }
        _ => {}
    }
    Ok(())
}

/// The request stream of a record's events (`texts` by index into them) up to and including the
/// event at index `cut` (all of them with `None`, or when `cut` lies past the end): the trace a
/// verdict's computed fix simulates (`super::verdict`), the same for the live pipeline's events
/// and for the record it wrote.
pub fn from_events_upto(events: &[Event], texts: &[(usize, Box<[u8]>)], cut: Option<u64>) -> Result<RequestStream, StreamError> {
    let end = cut.map_or(events.len(), |c| (c as usize).saturating_add(1).min(events.len()));
    let n = texts.partition_point(|(i, _)| *i < end);
    from_events_with_texts(&events[..end], &texts[..n])
}

/// The request stream of an input opened once (`crate::input::open`), up to and including the
/// record's event at index `cut` (a snapshot's whole trace: its entries are not record events),
/// or why not, in one line naming the file. A snapshot's stream is built from the snapshot the
/// opener decoded; a record's from passes over the open file (or the pipe's bytes).
pub fn stream_of(input: &crate::input::Opened, cut: Option<u64>) -> Result<RequestStream, String> {
    let path = input.path.as_path();
    let stream = match &input.body {
        crate::input::Body::Record(bytes) => from_passes(&RecordPasses { bytes, path, cut }),
        crate::input::Body::Snapshot(snap) => from_snapshot(snap),
        crate::input::Body::Summary(_) => return Err(format!("{}: a summary JSON holds no trace to simulate", path.display())),
    };
    stream.map_err(|e| named(path, e))
}

/// The one-line message of a stream error, naming the file unless the message already does.
fn named(path: &std::path::Path, e: StreamError) -> String {
    match e {
        StreamError::Unreadable(m) | StreamError::Budget(m) => m,
        e => format!("{}: {e}", path.display()),
    }
}
