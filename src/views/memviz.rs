//! Export to PyTorch's memory snapshot format, the pickle that pytorch.org/memory_viz opens:
//! `segments` (each with its `blocks`, PyTorch's schema), `device_traces` (the actions PyTorch
//! records: `alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`,
//! `segment_map`, `segment_unmap`, `oom`) and `allocator_settings` (the rounding and split rules
//! the blocks followed, so that a replay of the export places every block where it was).
//!
//! The trace comes from a [`TraceLog`] fed every event after it was applied (a bounded ring: past
//! its capacity the oldest entries go, as in PyTorch's own `max_entries`, and the importer then
//! rebuilds the start of the ring from the final segments). The segments come from the final
//! [`State`]. Round trip: `gpufrag analyze` of the export gives the same figures as the capture.
//!
//! How gpufrag's events map to PyTorch's: a framework block is an `alloc` (its requested size) and
//! a `free_requested` + `free_completed` pair; a driver segment, pitch or managed allocation, or a
//! pool allocation is a `segment_alloc` / `segment_free`; mapped VMM memory is `segment_map` /
//! `segment_unmap` (with `is_expandable` segments); a failed allocation is an `oom` with
//! `device_free`. A segment no caching allocator owns (a raw `cudaMalloc`, a library's workspace,
//! a JAX mapping) is exported with one `active_allocated` block covering it, so that memory_viz
//! shows it in use, and with the extra key `gpufrag_driver_only: True` (on the segment and on its
//! `segment_*` trace entries; PyTorch's readers ignore keys they do not know), so that a re-import
//! counts it as driver memory (`non_framework`) as the capture did, while every segment of
//! PyTorch's own snapshots is the caching allocator's. The top-level extra key `gpufrag_allocator`
//! names the process's caching allocator (`pytorch`, `xla`, `cupy`) when one was seen. Events of
//! several processes go to one file per process ([`export_all`]).

use super::pickler::Writer;
use crate::alloc::pytorch::{AllocatorRules, ROUNDUP_INTERVALS, SMALL_BUFFER};
use crate::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN};
use crate::ingest::{ProcessDevice, State};
use crate::map::SegmentKind;
use crate::snapshot::Action;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

/// Trace entries kept by default (the oldest go first past it).
pub const DEFAULT_ENTRIES: usize = 1_000_000;

/// One trace entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Process.
    pub pid: u32,
    /// Device.
    pub device: i16,
    /// Action.
    pub act: Action,
    /// Address (0 for `oom`).
    pub addr: u64,
    /// Bytes (requested size for blocks, segment size, failed request).
    pub size: u64,
    /// Stream.
    pub stream: u64,
    /// Microseconds since the epoch.
    pub time_us: u64,
    /// For `oom`: device free bytes when known.
    pub device_free: Option<u64>,
    /// A `segment_alloc` / `segment_free` of driver memory no caching allocator owned over its
    /// whole life (set when the segment is freed; for segments still held, the export asks the
    /// final state).
    pub driver_only: bool,
}

/// What the log remembers of a segment it saw allocated.
#[derive(Clone, Copy, Debug)]
struct SegSeen {
    device: i16,
    size: u64,
    /// The sequence number of its `segment_alloc` entry.
    seq: u64,
    /// A caching allocator owned it at some point (the event said so, it was adopted, or a
    /// framework block was placed in it).
    framework: bool,
}

/// The trace entries seen so far, bounded.
#[derive(Clone, Debug)]
pub struct TraceLog {
    entries: VecDeque<Entry>,
    capacity: usize,
    /// Entries that fell off the front.
    pub dropped: u64,
    /// (pid, block address) → (device, requested).
    blocks: HashMap<(u32, u64), (i16, u64)>,
    /// (pid, segment address) → what was seen of it.
    segments: HashMap<(u32, u64), SegSeen>,
    /// Entries pushed so far, dropped ones included: the next entry's sequence number.
    pushed: u64,
}

impl Default for TraceLog {
    fn default() -> Self {
        TraceLog::new(DEFAULT_ENTRIES)
    }
}

impl TraceLog {
    /// A log keeping at most `capacity` entries.
    pub fn new(capacity: usize) -> TraceLog {
        TraceLog {
            entries: VecDeque::new(),
            capacity: capacity.max(1),
            dropped: 0,
            blocks: HashMap::new(),
            segments: HashMap::new(),
            pushed: 0,
        }
    }

    /// The sequence number of the oldest entry kept.
    fn first_seq(&self) -> u64 {
        self.pushed - self.entries.len() as u64
    }

    /// Entries kept, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    fn push(&mut self, e: Entry) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(e);
        self.pushed += 1;
    }

    /// The segment of `state` that holds `addr` in `pid`'s space on `device`.
    fn segment_of(state: &State, pid: u32, device: i16, addr: u64) -> Option<&crate::map::Segment> {
        state.spaces.get(&(pid, device)).and_then(|s| s.map.segment_at(addr))
    }

    /// Notes that a caching allocator owns the segment that holds `addr`.
    fn mark_framework(&mut self, state: &State, pid: u32, device: i16, addr: u64) {
        if let Some(start) = Self::segment_of(state, pid, device, addr).map(|g| g.start) {
            if let Some(seen) = self.segments.get_mut(&(pid, start)) {
                seen.framework = true;
            }
        }
    }

    /// The device of an event whose source did not know it: the process's space that holds the
    /// address now (after the event), or the one that held it (for frees).
    fn device_of(&self, state: &State, ev: &Event, known: Option<i16>) -> i16 {
        if ev.device >= 0 {
            return ev.device;
        }
        if let Some(d) = known {
            return d;
        }
        state.spaces.range((ev.pid, i16::MIN)..=(ev.pid, i16::MAX)).find(|(_, s)| s.map.holds(ev.addr)).map_or(0, |((_, d), _)| *d)
    }

    /// Notes one event, after it was applied to `state`.
    pub fn observe(&mut self, state: &State, ev: &Event) {
        let Some(kind) = ev.kind() else { return };
        let time_us = ev.ts_ns / 1000;
        let base = |act, device, addr, size| Entry {
            pid: ev.pid,
            device,
            act,
            addr,
            size,
            stream: ev.stream,
            time_us,
            device_free: None,
            driver_only: false,
        };
        match kind {
            EventKind::AllocFailed => {
                let device = if ev.device >= 0 { ev.device } else { 0 };
                self.push(Entry { device_free: ev.device_free(), ..base(Action::Oom, device, 0, ev.requested) });
            }
            _ if ev.rc != 0 => {}
            EventKind::BlockAlloc => {
                let device = self.device_of(state, ev, None);
                let requested = if ev.requested > 0 || ev.flags & F_BLOCK_SIZE_KNOWN == 0 { ev.requested } else { ev.size };
                self.blocks.insert((ev.pid, ev.addr), (device, requested));
                self.mark_framework(state, ev.pid, device, ev.addr);
                self.push(base(Action::Alloc, device, ev.addr, requested));
            }
            EventKind::Adopt if ev.addr != 0 => {
                let device = self.device_of(state, ev, None);
                self.mark_framework(state, ev.pid, device, ev.addr);
            }
            EventKind::BlockFree => {
                let known = self.blocks.remove(&(ev.pid, ev.addr));
                let device = self.device_of(state, ev, known.map(|k| k.0));
                let size = known.map_or(ev.requested, |k| k.1);
                self.push(base(Action::FreeRequested, device, ev.addr, size));
                self.push(base(Action::FreeCompleted, device, ev.addr, size));
            }
            EventKind::MemAlloc | EventKind::MemAllocPitch | EventKind::MemAllocManaged | EventKind::PoolAlloc => {
                let device = self.device_of(state, ev, None);
                // A pool allocation is what a stream-ordered cache hands out: never driver-only.
                let framework =
                    kind == EventKind::PoolAlloc || Self::segment_of(state, ev.pid, device, ev.addr).is_some_and(|g| g.framework);
                let seen = SegSeen { device, size: ev.size, seq: self.pushed, framework };
                self.segments.insert((ev.pid, ev.addr), seen);
                self.push(base(Action::SegmentAlloc, device, ev.addr, ev.size));
            }
            EventKind::MemFree | EventKind::PoolFree => {
                let known = self.segments.remove(&(ev.pid, ev.addr));
                let device = self.device_of(state, ev, known.map(|k| k.device));
                let size = known.map_or(ev.size, |k| k.size);
                self.blocks.retain(|(p, a), _| !(*p == ev.pid && *a >= ev.addr && *a < ev.addr + size));
                let driver_only = known.is_some_and(|k| !k.framework);
                if let Some(k) = known.filter(|_| driver_only) {
                    if k.seq >= self.first_seq() {
                        let i = (k.seq - self.first_seq()) as usize;
                        self.entries[i].driver_only = true;
                    }
                }
                self.push(Entry { driver_only, ..base(Action::SegmentFree, device, ev.addr, size) });
            }
            EventKind::Map => {
                let device = self.device_of(state, ev, None);
                self.push(base(Action::SegmentMap, device, ev.addr, ev.size));
            }
            EventKind::Unmap => {
                let device = self.device_of(state, ev, None);
                self.push(base(Action::SegmentUnmap, device, ev.addr, ev.size));
            }
            _ => {}
        }
    }

    /// Processes with entries or maps.
    pub fn pids(&self, state: &State) -> Vec<u32> {
        let mut p: Vec<u32> = self.entries.iter().map(|e| e.pid).chain(state.spaces.keys().map(|k| k.0)).collect();
        p.sort_unstable();
        p.dedup();
        p
    }
}

fn write_frames(w: &mut Writer) {
    w.str("frames");
    w.begin_list();
    w.end();
}

/// Driver memory no caching allocator owns (pool allocations are a cache's).
fn driver_only(seg: &crate::map::Segment) -> bool {
    !seg.framework && seg.kind != SegmentKind::Pool
}

fn write_segment(w: &mut Writer, s: &ProcessDevice, seg: &crate::map::Segment) {
    let m = &s.map;
    // Live blocks and free runs tile a framework segment; a raw segment is one live block.
    let mut pieces: Vec<(u64, u64, u64, bool)> = Vec::new(); // (addr, size, requested, live)
    if seg.framework {
        pieces.extend(m.blocks().filter(|b| b.addr >= seg.start && b.addr < seg.end()).map(|b| (b.addr, b.size, b.requested, true)));
        pieces.extend(m.free_runs_in(seg.start, seg.end()).map(|(a, l)| (a, l, 0, false)));
        pieces.sort_by_key(|p| p.0);
        // Fill any gap the map does not explain, so that the blocks tile the segment.
        let mut filled = Vec::with_capacity(pieces.len());
        let mut at = seg.start;
        for p in pieces {
            if p.0 > at {
                filled.push((at, p.0 - at, 0, false));
            }
            at = at.max(p.0 + p.1);
            filled.push(p);
        }
        if at < seg.end() {
            filled.push((at, seg.end() - at, 0, false));
        }
        pieces = filled;
    } else {
        pieces.push((seg.start, seg.size, seg.size, true));
    }
    let allocated: u64 = pieces.iter().filter(|p| p.3).map(|p| p.1).sum();
    let requested: u64 = pieces.iter().filter(|p| p.3).map(|p| p.2).sum();
    w.begin_dict();
    w.str("device");
    w.int(i128::from(s.device));
    w.kv_uint("address", seg.start);
    w.kv_uint("total_size", seg.size);
    w.kv_uint("allocated_size", allocated);
    w.kv_uint("active_size", allocated);
    w.kv_uint("requested_size", requested);
    w.kv_uint("stream", seg.stream);
    w.kv_str("segment_type", if seg.size == SMALL_BUFFER && seg.kind != SegmentKind::Mapped { "small" } else { "large" });
    w.str("segment_pool_id");
    w.tuple2_uint(0, 0);
    w.str("is_expandable");
    w.bool(seg.kind == SegmentKind::Mapped);
    if driver_only(seg) {
        w.str("gpufrag_driver_only");
        w.bool(true);
    }
    write_frames(w);
    w.str("blocks");
    w.begin_list();
    for (addr, size, req, live) in pieces {
        w.begin_dict();
        w.kv_uint("address", addr);
        w.kv_uint("size", size);
        w.kv_uint("requested_size", req);
        w.kv_str("state", if live { "active_allocated" } else { "inactive" });
        write_frames(w);
        w.end();
    }
    w.end();
    w.end();
}

fn write_settings(w: &mut Writer, rules: &AllocatorRules, expandable: bool) {
    w.begin_dict();
    let mut conf = Vec::new();
    if expandable {
        conf.push("expandable_segments:True".to_string());
    }
    if rules.max_split_size != u64::MAX {
        conf.push(format!("max_split_size_mb:{}", rules.max_split_size >> 20));
    }
    w.kv_str("PYTORCH_CUDA_ALLOC_CONF", &conf.join(","));
    w.str("max_split_size");
    if rules.max_split_size == u64::MAX {
        w.int(-1);
    } else {
        w.uint(rules.max_split_size);
    }
    w.str("expandable_segments");
    w.bool(expandable);
    w.str("garbage_collection_threshold");
    w.float(0.0);
    w.str("roundup_power2_divisions");
    w.begin_dict();
    for (i, d) in rules.roundup_power2_divisions.iter().enumerate().take(ROUNDUP_INTERVALS) {
        w.kv_uint(&(1u64 << i).to_string(), *d);
    }
    w.end();
    w.end();
}

/// The snapshot pickle of one process (`None`: every process, as if one).
pub fn snapshot_pickle(state: &State, log: Option<&TraceLog>, pid: Option<u32>) -> Vec<u8> {
    let spaces: Vec<&ProcessDevice> = state.spaces.values().filter(|s| pid.is_none_or(|p| s.pid == p)).collect();
    let rules = spaces.first().map(|s| s.map.rules().clone()).unwrap_or_default();
    let expandable = spaces.iter().any(|s| s.map.segments().any(|g| g.kind == SegmentKind::Mapped && g.framework));
    // Each kept entry with whether it is about driver-only memory: said at the segment's free,
    // or, for memory still held (segments allocated in the log, mapped ranges), by the final state.
    let held_driver_only = |e: &Entry| {
        matches!(e.act, Action::SegmentAlloc | Action::SegmentMap | Action::SegmentUnmap)
            && TraceLog::segment_of(state, e.pid, e.device, e.addr).is_some_and(driver_only)
    };
    let entries: Vec<(&Entry, bool)> = log
        .map(|l| {
            let open: std::collections::HashSet<u64> = l.segments.values().map(|s| s.seq).collect();
            l.entries()
                .zip(l.first_seq()..)
                .filter(|(e, _)| pid.is_none_or(|p| e.pid == p))
                .map(|(e, seq)| {
                    let still_held = e.act != Action::SegmentAlloc || open.contains(&seq);
                    (e, e.driver_only || (still_held && held_driver_only(e)))
                })
                .collect()
        })
        .unwrap_or_default();
    let max_device = spaces.iter().map(|s| s.device).chain(entries.iter().map(|(e, _)| e.device)).max().unwrap_or(0).max(0);

    let mut w = Writer::new();
    w.begin_dict();
    w.str("segments");
    w.begin_list();
    let mut segs: Vec<(&ProcessDevice, &crate::map::Segment)> =
        spaces.iter().flat_map(|s| s.map.segments().map(move |g| (*s, g))).collect();
    segs.sort_by_key(|(s, g)| (s.device, g.start));
    for (s, g) in segs {
        write_segment(&mut w, s, g);
    }
    w.end();
    w.str("device_traces");
    w.begin_list();
    for d in 0..=max_device {
        w.begin_list();
        for (e, driver_only) in entries.iter().filter(|(e, _)| e.device == d) {
            w.begin_dict();
            w.kv_str("action", e.act.name());
            w.kv_uint("addr", e.addr);
            w.kv_uint("size", e.size);
            w.kv_uint("stream", e.stream);
            w.kv_uint("time_us", e.time_us);
            if let Some(free) = e.device_free {
                w.kv_uint("device_free", free);
            }
            if *driver_only {
                w.str("gpufrag_driver_only");
                w.bool(true);
            }
            write_frames(&mut w);
            w.end();
        }
        w.end();
    }
    w.end();
    w.str("allocator_settings");
    write_settings(&mut w, &rules, expandable);
    if let Some(f) = spaces.iter().find_map(|s| s.framework) {
        w.kv_str("gpufrag_allocator", f.name());
    }
    w.end();
    w.finish()
}

/// The most files one memviz export writes (issue 23: 18,709 files from a 1.6 MB record).
pub const MAX_FILES: usize = 32;

/// The processes a bounded export keeps, at most [`MAX_FILES`]: those with a failed allocation
/// first, then the most reserved bytes (ties by pid), in pid order.
fn bounded(state: &State, mut pids: Vec<u32>) -> (Vec<u32>, usize) {
    if pids.len() <= MAX_FILES {
        return (pids, 0);
    }
    let mut reserved: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    for ((pid, _), sp) in &state.spaces {
        let r = reserved.entry(*pid).or_default();
        *r = sp.map.segments().fold(*r, |a, s| a.saturating_add(s.size));
    }
    let failed: std::collections::HashSet<u32> = state.ooms.iter().map(|o| o.pid).collect();
    pids.sort_by_key(|p| (std::cmp::Reverse(failed.contains(p)), std::cmp::Reverse(reserved.get(p).copied().unwrap_or(0)), *p));
    let left = pids.len() - MAX_FILES;
    pids.truncate(MAX_FILES);
    pids.sort_unstable();
    (pids, left)
}

/// Writes one pickle per process: `path` itself for a single process, else `path` with `-PID`
/// before its extension for each, at most [`MAX_FILES`] of them (see [`bounded`]; the export says
/// how many were left out with [`export_all_counted`]). Returns the files written; an error names
/// the file it is about.
pub fn export_all(state: &State, log: Option<&TraceLog>, path: &Path) -> std::io::Result<Vec<PathBuf>> {
    export_all_counted(state, log, path).map(|(w, _)| w)
}

/// [`export_all`], with the number of processes left out by the bound.
pub fn export_all_counted(state: &State, log: Option<&TraceLog>, path: &Path) -> std::io::Result<(Vec<PathBuf>, usize)> {
    let pids = match log {
        Some(l) => l.pids(state),
        None => {
            let mut p: Vec<u32> = state.spaces.keys().map(|k| k.0).collect();
            p.dedup();
            p
        }
    };
    let mut written = Vec::new();
    if pids.len() <= 1 {
        std::fs::write(path, snapshot_pickle(state, log, pids.first().copied())).map_err(|e| named(path, e))?;
        written.push(path.to_path_buf());
        return Ok((written, 0));
    }
    let (pids, left) = bounded(state, pids);
    for pid in pids {
        let p = with_pid(path, pid);
        std::fs::write(&p, snapshot_pickle(state, log, Some(pid))).map_err(|e| named(&p, e))?;
        written.push(p);
    }
    Ok((written, left))
}

fn named(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// `dir/name.pickle` → `dir/name-PID.pickle`.
pub fn with_pid(path: &Path, pid: u32) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (stem, ext) = match name.find('.') {
        Some(i) if i > 0 => (&name[..i], &name[i..]),
        _ => (name.as_str(), ""),
    };
    path.with_file_name(format!("{stem}-{pid}{ext}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_processes_get_one_file_each() {
        assert_eq!(with_pid(Path::new("/x/mem.pickle"), 7), PathBuf::from("/x/mem-7.pickle"));
        assert_eq!(with_pid(Path::new("mem"), 7), PathBuf::from("mem-7"));
    }

    #[test]
    fn a_write_error_names_the_file_it_was_writing() {
        let mut state = State::default();
        for pid in [5, 6] {
            let mut e = Event::new(EventKind::MemAlloc, pid, 0);
            e.addr = 1 << 40;
            e.size = 2 << 20;
            state.apply(&e);
        }
        let base = std::env::temp_dir().join(format!("gpufrag-memviz-missing-{}", std::process::id())).join("mem.pickle");
        let err = export_all(&state, None, &base).expect_err("the directory does not exist").to_string();
        assert!(err.contains(&with_pid(&base, 5).display().to_string()), "{err}");
        let mut one = State::default();
        let mut e = Event::new(EventKind::MemAlloc, 5, 0);
        e.addr = 1 << 40;
        e.size = 2 << 20;
        one.apply(&e);
        let err = export_all(&one, None, &base).expect_err("the directory does not exist").to_string();
        assert!(err.starts_with(&base.display().to_string()), "{err}");
    }

    #[test]
    fn blocks_and_segments_become_pytorch_actions() {
        let mut state = State::default();
        let mut log = TraceLog::new(100);
        let mut evs = Vec::new();
        let mut e = Event::new(EventKind::MemAlloc, 5, 0);
        e.addr = 1 << 40;
        e.size = 20 << 20;
        evs.push(e);
        let mut b = Event::new(EventKind::BlockAlloc, 5, 0);
        b.addr = 1 << 40;
        b.requested = 1000;
        evs.push(b);
        let mut f = Event::new(EventKind::BlockFree, 5, -1);
        f.addr = 1 << 40;
        evs.push(f);
        for ev in &evs {
            state.apply(ev);
            log.observe(&state, ev);
        }
        let acts: Vec<(&str, u64, i16)> = log.entries().map(|e| (e.act.name(), e.size, e.device)).collect();
        assert_eq!(
            acts,
            vec![("segment_alloc", 20 << 20, 0), ("alloc", 1000, 0), ("free_requested", 1000, 0), ("free_completed", 1000, 0)]
        );
        let snap = crate::snapshot::from_bytes(&snapshot_pickle(&state, Some(&log), None), Path::new("x.pickle"))
            .expect("our own importer reads it");
        assert_eq!(snap.segments.len(), 1);
        assert_eq!(snap.traces[0].entries.len(), 4);
    }
}
