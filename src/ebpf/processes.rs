//! The per-process layer between the probes and the [`State`](crate::ingest::State): which
//! process a pid means (pid AND start time, so that a reused pid never inherits another
//! process's segments), whether each process was traced from its start (exact) or attached to
//! mid-run, which device an allocation belongs to when the probe could not tell, and what a
//! process's exit, exec or fork means for the state.
//!
//! It is pure: it turns probe events into [`Action`]s and never touches `/proc` itself (a
//! [`ProcLookup`] answers), so PID reuse and exits are tested with fakes.
//!
//! Device attribution. A uprobe cannot call `cuCtxGetDevice`; the BPF side follows contexts
//! instead (`cuDevicePrimaryCtxRetain`/`cuCtxCreate` learn context → device, `cuCtxSetCurrent`/
//! `cuCtxPushCurrent` set a thread's device, `cuCtxGetDevice`'s answer refreshes it, `cuMemCreate`
//! and pools carry their own). What arrives with device -1 is resolved here, in order:
//! 1. `cuMemMap` takes the device of the physical handle it maps (from its `cuMemCreate`);
//! 2. frees and unmaps stay -1: the state finds them by address;
//! 3. otherwise the process's last known device (most processes use one);
//! 4. otherwise the one device NVML lists the process on, if exactly one;
//! 5. otherwise device 0 (the runtime's default device), counted in [`ProcessTable::assumed`].

use crate::event::{Event, EventKind};
pub use crate::ingest::Coverage;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Exited incarnations remembered (for late events and the summary's names) when their maps
/// are forgotten at exit; the oldest beyond this are dropped from the table.
pub const EXITED_REMEMBERED: usize = 4096;

/// What the state owner must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Apply this event.
    Apply(Event),
    /// Drop every map of this pid: its process is gone (or replaced its image).
    Forget(u32),
}

/// Answers about live processes (`/proc` in production, a fake in tests).
pub trait ProcLookup {
    /// Start time (clock ticks after boot) of `pid`, `None` when it is gone.
    fn start_time(&self, pid: u32) -> Option<u64>;
    /// A display name.
    fn name(&self, pid: u32) -> String;
}

/// `/proc`.
pub struct ProcFs;

impl ProcLookup for ProcFs {
    fn start_time(&self, pid: u32) -> Option<u64> {
        super::procfs::stat(pid).map(|s| s.start_time)
    }
    fn name(&self, pid: u32) -> String {
        super::procfs::exe_name(pid)
    }
}

/// One process (one holder of a pid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incarnation {
    /// Process id.
    pub pid: u32,
    /// Start time, clock ticks after boot.
    pub start_time: u64,
    /// Executable name.
    pub name: String,
    /// Traced from before its first CUDA call: the state holds everything it allocated.
    pub exact: bool,
    /// It exited (its final state is kept until forgotten).
    pub exited: bool,
    /// The device its last device-bearing event named.
    pub last_device: Option<i16>,
    /// When its first segment came from the driver (a successful driver allocation; the
    /// events' clock): a caching allocator's block can only be carved from a segment, so a
    /// process with none before its allocator's probes went in has no block missing.
    pub first_segment_ns: Option<u64>,
    /// Physical VMM handles → device.
    handle_device: HashMap<u64, i16>,
}

/// Whether `kind` (with return code `rc`) gives a process memory from the driver: a segment
/// (or the physical memory or range of one) that blocks can be carved from.
pub fn segment_like(kind: EventKind, rc: i32) -> bool {
    rc == 0 && segment_kind(kind)
}

/// The kinds of a call that gives a process memory from the driver, when it succeeds.
fn segment_kind(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::MemAlloc
            | EventKind::MemAllocPitch
            | EventKind::MemAllocManaged
            | EventKind::AddressReserve
            | EventKind::PhysCreate
            | EventKind::Map
            | EventKind::PoolAlloc
    )
}

/// Every process seen, current incarnation per pid.
#[derive(Debug, Default)]
pub struct ProcessTable {
    procs: BTreeMap<u32, Incarnation>,
    /// Forget a process's maps when it exits (the agent: bounded memory) or keep its final
    /// state for the summary (attach).
    pub forget_on_exit: bool,
    /// The devices NVML lists per pid (refreshed by the owner).
    pub nvml_devices: BTreeMap<u32, Vec<i16>>,
    /// Allocations whose device was assumed (rule 5), per pid.
    pub assumed: BTreeMap<u32, u64>,
    /// Incarnations ended because their pid came back with another start time.
    pub reused: u64,
    /// With `forget_on_exit` off: how many exited processes keep their final maps; the oldest
    /// beyond it are let go (their maps forgotten) and counted in [`ProcessTable::let_go`].
    pub keep_exited_max: usize,
    /// Exited processes whose maps were let go for the cap.
    pub let_go: u64,
    /// Exited incarnations, oldest first.
    exited_order: VecDeque<(u32, u64)>,
    /// `ProcessExec` events with [`F_PARTIAL`](crate::event::F_PARTIAL) for processes declared
    /// inexact after they were registered, for the owner to apply ([`ProcessTable::take_partial`]).
    partial: Vec<Event>,
}

fn allocation_like(kind: EventKind) -> bool {
    segment_kind(kind) || matches!(kind, EventKind::PoolTrim | EventKind::BlockAlloc | EventKind::AllocFailed | EventKind::DeviceInfo)
}

impl ProcessTable {
    /// An empty table.
    pub fn new(forget_on_exit: bool) -> ProcessTable {
        ProcessTable { forget_on_exit, keep_exited_max: usize::MAX, ..ProcessTable::default() }
    }

    /// Exited incarnations beyond the caps leave the table (and, when their maps were kept,
    /// the state: a `Forget`, counted in `let_go`).
    fn bound_exited(&mut self, out: &mut Vec<Action>) {
        let cap = if self.forget_on_exit { EXITED_REMEMBERED } else { self.keep_exited_max.min(EXITED_REMEMBERED) };
        while self.exited_order.len() > cap {
            let Some((pid, start)) = self.exited_order.pop_front() else { break };
            if self.procs.get(&pid).is_some_and(|p| p.exited && p.start_time == start) {
                self.procs.remove(&pid);
                self.assumed.remove(&pid);
                if !self.forget_on_exit {
                    self.let_go += 1;
                    out.push(Action::Forget(pid));
                }
            }
        }
    }

    /// Incarnations in the table (live and remembered exited ones).
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The current incarnation of `pid`.
    pub fn get(&self, pid: u32) -> Option<&Incarnation> {
        self.procs.get(&pid)
    }

    /// Every process, current incarnations.
    pub fn all(&self) -> impl Iterator<Item = &Incarnation> {
        self.procs.values()
    }

    /// Whether `pid` (in its current incarnation) is known and alive.
    pub fn knows_live(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| !p.exited)
    }

    fn end(&mut self, pid: u32, ts_ns: u64, out: &mut Vec<Action>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if !p.exited {
                p.exited = true;
                out.push(Action::Apply(Event { ts_ns, ..Event::new(EventKind::ProcessExit, pid, -1) }));
                self.exited_order.push_back((pid, p.start_time));
            }
            if self.forget_on_exit {
                out.push(Action::Forget(pid));
            }
        }
        self.bound_exited(out);
    }

    /// Registers the process `pid` started at `start_time`. A different incarnation of the same
    /// pid is ended first (ProcessExit, then its maps are forgotten): PID reuse never mixes two
    /// processes. Registering the same incarnation again changes nothing.
    pub fn register(&mut self, pid: u32, start_time: u64, name: String, exact: bool, ts_ns: u64) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(p) = self.procs.get(&pid) {
            if p.start_time == start_time && !p.exited {
                return out;
            }
            if p.start_time != start_time {
                self.reused += 1;
                let keep = self.forget_on_exit;
                self.forget_on_exit = true;
                self.end(pid, ts_ns, &mut out);
                self.forget_on_exit = keep;
            } else {
                // Same start time, marked exited: an exec'd image or a late event; forget the old maps.
                out.push(Action::Forget(pid));
            }
        }
        self.procs.insert(
            pid,
            Incarnation {
                pid,
                start_time,
                name,
                exact,
                exited: false,
                last_device: None,
                first_segment_ns: None,
                handle_device: HashMap::new(),
            },
        );
        // Not traced from its start: the stream says so, and its OOMs are inconclusive.
        let flags = if exact { 0 } else { crate::event::F_PARTIAL };
        out.push(Action::Apply(Event { ts_ns, flags, ..Event::new(EventKind::ProcessExec, pid, -1) }));
        out
    }

    /// The device an event of `pid` with no device of its own will be given (rules 3 to 5).
    pub fn likely_device(&self, pid: u32) -> i16 {
        let nvml_one = self.nvml_devices.get(&pid).filter(|d| d.len() == 1).map(|d| d[0]);
        self.procs.get(&pid).and_then(|p| p.last_device).or(nvml_one).unwrap_or(0)
    }

    /// Marks a process not exact (attached mid-run, or events of it were lost).
    /// The stream hears of it as a `ProcessExec` with [`F_PARTIAL`](crate::event::F_PARTIAL)
    /// ([`ProcessTable::take_partial`]).
    pub fn mark_inexact(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.exact && !p.exited {
                self.partial.push(Event {
                    ts_ns: crate::source::now_ns(),
                    flags: crate::event::F_PARTIAL,
                    ..Event::new(EventKind::ProcessExec, pid, -1)
                });
            }
            p.exact = false;
        }
    }

    /// The `ProcessExec` events with [`F_PARTIAL`](crate::event::F_PARTIAL) of processes
    /// declared inexact since the last call, to apply.
    pub fn take_partial(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.partial).into_iter().map(Action::Apply).collect()
    }

    /// Ends `pid` (seen gone by a poll of `/proc`).
    pub fn exited(&mut self, pid: u32, ts_ns: u64) -> Vec<Action> {
        let mut out = Vec::new();
        self.end(pid, ts_ns, &mut out);
        out
    }

    /// Pids known and not exited whose process is gone or changed (start time differs).
    pub fn stale(&self, lookup: &dyn ProcLookup) -> Vec<u32> {
        self.procs.values().filter(|p| !p.exited && lookup.start_time(p.pid) != Some(p.start_time)).map(|p| p.pid).collect()
    }

    /// One event from the probes. `exact_if_new` says whether a process first seen now was
    /// traced from its start.
    pub fn on_event(&mut self, mut ev: Event, lookup: &dyn ProcLookup, exact_if_new: &dyn Fn(u32, u64) -> bool) -> Vec<Action> {
        let mut out = Vec::new();
        let pid = ev.pid;
        let Some(kind) = ev.kind() else {
            out.push(Action::Apply(ev));
            return out;
        };
        match kind {
            EventKind::Dropped => {
                out.push(Action::Apply(ev));
                return out;
            }
            EventKind::ProcessExit => {
                // A process gone before /proc was read is named by the kernel's comm at its exit.
                if let (Some(p), Some(comm)) = (self.procs.get_mut(&pid), ev.comm()) {
                    if p.name.is_empty() {
                        p.name = comm;
                    }
                }
                self.end(pid, ev.ts_ns, &mut out);
                return out;
            }
            EventKind::ProcessExec => {
                // rc 1: a traced process exec'd (its CUDA state is gone); else a fork of one.
                let start = lookup.start_time(pid).unwrap_or(0);
                // A fork names its parent in `handle`; a child gone already keeps its parent's name.
                let mut name = lookup.name(pid);
                if name.is_empty() && ev.handle != 0 {
                    name = self.procs.get(&(ev.handle as u32)).map(|p| p.name.clone()).unwrap_or_default();
                }
                if ev.rc == 1 && self.procs.contains_key(&pid) {
                    self.end(pid, ev.ts_ns, &mut out);
                    if !self.forget_on_exit {
                        out.push(Action::Forget(pid));
                    }
                    // The new image is a fresh incarnation (same pid and start time: not a reuse).
                    self.procs.remove(&pid);
                }
                out.extend(self.register(pid, start, name, true, ev.ts_ns));
                return out;
            }
            _ => {}
        }
        match self.procs.get(&pid) {
            Some(p) if !p.exited => {}
            Some(p) => {
                // An event after the exit: late from the same process, or a new holder of the pid.
                let start = lookup.start_time(pid);
                if start.is_some_and(|s| s != p.start_time) {
                    let start = start.unwrap_or(0);
                    let exact = exact_if_new(pid, start);
                    out.extend(self.register(pid, start, lookup.name(pid), exact, ev.ts_ns));
                }
            }
            None => {
                let start = lookup.start_time(pid).unwrap_or(0);
                let exact = exact_if_new(pid, start);
                out.extend(self.register(pid, start, lookup.name(pid), exact, ev.ts_ns));
            }
        }
        let nvml_one = self.nvml_devices.get(&pid).filter(|d| d.len() == 1).map(|d| d[0]);
        let Some(p) = self.procs.get_mut(&pid) else { return out };
        if ev.device < 0 && allocation_like(kind) {
            let from_handle = (kind == EventKind::Map).then(|| p.handle_device.get(&ev.handle).copied()).flatten();
            ev.device = match from_handle.or(p.last_device).or(nvml_one) {
                Some(d) => d,
                None => {
                    *self.assumed.entry(pid).or_insert(0) += 1;
                    0
                }
            };
        }
        if segment_like(kind, ev.rc) && p.first_segment_ns.is_none_or(|t| ev.ts_ns < t) {
            p.first_segment_ns = Some(ev.ts_ns);
        }
        if ev.device >= 0 {
            p.last_device = Some(ev.device);
            if kind == EventKind::PhysCreate && ev.rc == 0 {
                p.handle_device.insert(ev.handle, ev.device);
            }
        }
        out.push(Action::Apply(ev));
        out
    }
}

/// Coverage of every known process on every device it has in `state` or in NVML.
/// `nvml_used` holds, per (pid, device), NVML's used bytes at its last sample and the bytes
/// traced at that same moment: their difference is what the trace cannot place.
pub fn coverage(table: &ProcessTable, state: &crate::ingest::State, nvml_used: &BTreeMap<(u32, i16), (u64, u64)>) -> Vec<Coverage> {
    let mut out = Vec::new();
    for p in table.all() {
        let mut devices: Vec<i16> = state.spaces.keys().filter(|(pid, _)| *pid == p.pid).map(|&(_, d)| d).collect();
        devices.extend(nvml_used.keys().filter(|(pid, _)| *pid == p.pid).map(|&(_, d)| d));
        devices.sort_unstable();
        devices.dedup();
        for d in devices {
            let traced = state.traced_bytes(p.pid, d);
            let sample = nvml_used.get(&(p.pid, d)).copied();
            out.push(Coverage {
                pid: p.pid,
                start_time: p.start_time,
                name: p.name.clone(),
                device: d,
                traced,
                nvml_used: sample.map(|(u, _)| u),
                unattributed: sample.map(|(u, t)| u.saturating_sub(t)),
                exact: p.exact,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::State;
    use std::cell::RefCell;

    struct Fake(RefCell<BTreeMap<u32, u64>>);
    impl ProcLookup for Fake {
        fn start_time(&self, pid: u32) -> Option<u64> {
            self.0.borrow().get(&pid).copied()
        }
        fn name(&self, pid: u32) -> String {
            format!("p{pid}")
        }
    }

    fn alloc(pid: u32, addr: u64, size: u64, device: i16) -> Event {
        Event { addr, size, requested: size, ..Event::new(EventKind::MemAlloc, pid, device) }
    }

    fn drive(state: &mut State, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Apply(e) => state.apply(&e),
                Action::Forget(pid) => state.forget(pid),
            }
        }
    }

    #[test]
    fn pid_reuse_with_another_start_time_does_not_mix_processes() {
        let fake = Fake(RefCell::new(BTreeMap::from([(100, 5000)])));
        let mut t = ProcessTable::new(false);
        let mut s = State::default();
        let exact = |_: u32, _: u64| true;
        drive(&mut s, t.on_event(alloc(100, 0x1000_0000, 4 << 20, 0), &fake, &exact));
        assert_eq!(s.device_figures(0).reserved, 4 << 20);
        // The first holder of pid 100 is gone without an exit event (lost); the pid is reused.
        fake.0.borrow_mut().insert(100, 9000);
        assert_eq!(t.stale(&fake), vec![100]);
        let acts = t.register(100, 9000, "new".into(), true, 7);
        assert!(acts.contains(&Action::Forget(100)), "{acts:?}");
        assert!(matches!(acts[0], Action::Apply(e) if e.kind() == Some(EventKind::ProcessExit)));
        drive(&mut s, acts);
        drive(&mut s, t.on_event(alloc(100, 0x2000_0000, 2 << 20, 0), &fake, &exact));
        assert_eq!(s.device_figures(0).reserved, 2 << 20, "the old holder's 4 MiB segment is not the new one's");
        assert_eq!(t.get(100).map(|p| p.start_time), Some(9000));
        assert_eq!(t.reused, 1);
        // The old segment's address now freed by the new process is an anomaly, not a silent mix.
        drive(&mut s, t.on_event(Event { addr: 0x1000_0000, ..Event::new(EventKind::MemFree, 100, -1) }, &fake, &exact));
        assert_eq!(s.anomaly_count, 1);
        assert_eq!(s.device_figures(0).reserved, 2 << 20);
    }

    #[test]
    fn exit_forgets_only_when_asked_and_a_late_pid_is_a_new_process() {
        let fake = Fake(RefCell::new(BTreeMap::from([(7, 1)])));
        let exact = |_: u32, _: u64| false;
        for forget in [false, true] {
            let mut t = ProcessTable::new(forget);
            let mut s = State::default();
            drive(&mut s, t.on_event(alloc(7, 0x1000, 1 << 20, 1), &fake, &exact));
            assert!(!t.get(7).expect("known").exact);
            drive(&mut s, t.on_event(Event::new(EventKind::ProcessExit, 7, -1), &fake, &exact));
            assert!(s.exited.contains_key(&7));
            assert_eq!(s.spaces.is_empty(), forget);
            assert!(t.get(7).expect("still listed").exited);
            // A second exit (BPF and the poll both see it) emits nothing new.
            assert!(!t.exited(7, 0).iter().any(|a| matches!(a, Action::Apply(_))));
        }
    }

    #[test]
    fn exec_of_a_traced_process_drops_its_old_image() {
        let fake = Fake(RefCell::new(BTreeMap::from([(9, 3)])));
        let exact = |_: u32, _: u64| true;
        let mut t = ProcessTable::new(false);
        let mut s = State::default();
        drive(&mut s, t.on_event(alloc(9, 0x1000, 1 << 20, 0), &fake, &exact));
        drive(&mut s, t.on_event(Event { rc: 1, ..Event::new(EventKind::ProcessExec, 9, -1) }, &fake, &exact));
        assert!(s.spaces.is_empty());
        assert!(t.knows_live(9));
        assert_eq!(t.reused, 0, "an exec is not a reuse");
    }

    #[test]
    fn device_rules() {
        let fake = Fake(RefCell::new(BTreeMap::from([(1, 1), (2, 1), (3, 1)])));
        let exact = |_: u32, _: u64| true;
        let mut t = ProcessTable::new(false);
        // rule 3: last known device
        t.on_event(Event { handle: 0xa, size: 2 << 20, ..Event::new(EventKind::PhysCreate, 1, 3) }, &fake, &exact);
        let a = t.on_event(alloc(1, 0x1000, 10, -1), &fake, &exact);
        assert!(matches!(a.last(), Some(Action::Apply(e)) if e.device == 3));
        // rule 1: a map takes its handle's device, whatever came last
        t.on_event(alloc(1, 0x9000, 10, 5), &fake, &exact);
        let a = t.on_event(Event { handle: 0xa, addr: 0x20_0000, size: 2 << 20, ..Event::new(EventKind::Map, 1, -1) }, &fake, &exact);
        assert!(matches!(a.last(), Some(Action::Apply(e)) if e.device == 3));
        // rule 2: frees stay unresolved
        let a = t.on_event(Event { addr: 0x1000, ..Event::new(EventKind::MemFree, 1, -1) }, &fake, &exact);
        assert!(matches!(a.last(), Some(Action::Apply(e)) if e.device == -1));
        // rule 4: NVML's one device
        t.nvml_devices.insert(2, vec![6]);
        let a = t.on_event(alloc(2, 0x1000, 10, -1), &fake, &exact);
        assert!(matches!(a.last(), Some(Action::Apply(e)) if e.device == 6));
        // rule 5: assumed 0, counted
        let a = t.on_event(alloc(3, 0x1000, 10, -1), &fake, &exact);
        assert!(matches!(a.last(), Some(Action::Apply(e)) if e.device == 0));
        assert_eq!(t.assumed.get(&3), Some(&1));
    }

    #[test]
    fn coverage_subtracts_traced_from_nvml() {
        let fake = Fake(RefCell::new(BTreeMap::from([(4, 1)])));
        let mut t = ProcessTable::new(false);
        let mut s = State::default();
        drive(&mut s, t.on_event(alloc(4, 0x1000_0000, 20 << 20, 0), &fake, &|_, _| false));
        let nv = BTreeMap::from([((4, 0), (100 << 20, 20 << 20))]);
        let c = coverage(&t, &s, &nv);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].traced, c[0].unattributed, c[0].exact), (20 << 20, Some(80 << 20), false));
    }
}
