//! A long-running `gpufrag agent` stays bounded: 10,000 short processes (each allocates, reads
//! its device free, frees and exits) pass through the agent's process table and the live
//! pipeline, and the heap held afterwards is what it was halfway (the caps on remembered exited
//! processes, kept maps, exit times and names are reached, nothing else grows). The heap is
//! measured by a counting global allocator around the real `ProcessTable` and `Live`.

use gpufrag::ebpf::processes::{Action, ProcLookup, ProcessTable};
use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};
use gpufrag::live::Live;
use gpufrag::source::Msg;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: p came from System.alloc with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `/proc` as the agent would see it: each pid's start time, or gone.
struct FakeProc(RefCell<BTreeMap<u32, u64>>);

impl ProcLookup for FakeProc {
    fn start_time(&self, pid: u32) -> Option<u64> {
        self.0.borrow().get(&pid).copied()
    }
    fn name(&self, pid: u32) -> String {
        format!("short-{pid}")
    }
}

fn feed(table: &mut ProcessTable, live: &mut Live, actions: Vec<Action>) {
    for a in actions {
        match a {
            Action::Apply(e) => {
                if e.kind() == Some(EventKind::ProcessExec) {
                    let name = table.get(e.pid).map(|p| p.name.clone()).unwrap_or_default();
                    live.handle(Msg::Named { pid: e.pid, name });
                }
                live.handle(Msg::Event(e));
            }
            Action::Forget(pid) => live.handle(Msg::Forget(pid)),
        }
    }
}

/// One short process: pid `pid` (reused every 30,000), allocate 2 MiB, read device free, free, exit.
fn one_process(i: u64, table: &mut ProcessTable, live: &mut Live, procs: &FakeProc) {
    let pid = 10_000 + (i % 30_000) as u32;
    let t = i * 1_000_000;
    procs.0.borrow_mut().insert(pid, 1_000 + i);
    let exact = |_: u32, _: u64| true;
    let events = [
        Event { ts_ns: t + 1, addr: 0x7f00_0000_0000, size: 2 << 20, requested: 2 << 20, ..Event::new(EventKind::MemAlloc, pid, 0) },
        Event {
            ts_ns: t + 2,
            size: 16 << 30,
            device_free: 15 << 30,
            flags: F_DEVICE_FREE_KNOWN,
            ..Event::new(EventKind::DeviceInfo, pid, 0)
        },
        Event { ts_ns: t + 3, addr: 0x7f00_0000_0000, ..Event::new(EventKind::MemFree, pid, -1) },
        Event { ts_ns: t + 4, ..Event::new(EventKind::ProcessExit, pid, -1) },
    ];
    for e in events {
        let acts = table.on_event(e, procs, &exact);
        feed(table, live, acts);
    }
    procs.0.borrow_mut().remove(&pid);
}

fn heap_after(n: u64, forget_on_exit: bool, keep_max: usize) -> (i64, i64, usize, usize) {
    let procs = FakeProc(RefCell::new(BTreeMap::new()));
    let mut table = ProcessTable::new(forget_on_exit);
    table.keep_exited_max = keep_max;
    let mut live = Live::new(None, true).expect("live");
    // The agent's pipeline (src/cli/agent.rs): no trace kept for the live computed fix.
    live.without_fix_trace();
    let mut half = 0;
    for i in 0..n {
        one_process(i, &mut table, &mut live, &procs);
        if i + 1 == n / 2 {
            half = LIVE_BYTES.load(Ordering::Relaxed);
        }
    }
    let end = LIVE_BYTES.load(Ordering::Relaxed);
    assert_eq!(live.state.events, n * 5, "every event applied (exec, alloc, info, free, exit)");
    (half, end, table.len(), live.state.spaces.len())
}

/// One test, not several: the heap counter is the whole process's, so nothing else may run
/// beside the measurements.
#[test]
fn memory_is_flat_over_ten_thousand_short_processes_and_keep_exited_is_capped() {
    // The agent's default: an exited process's maps are forgotten at once.
    let (half, end, table, spaces) = heap_after(10_000, true, usize::MAX);
    assert!(end - half < 64 << 10, "heap grew by {} bytes from process 5,000 to 10,000 (from {half} to {end})", end - half);
    assert!(table <= gpufrag::ebpf::processes::EXITED_REMEMBERED, "{table} incarnations remembered");
    assert_eq!(spaces, 0, "no exited process keeps a map");

    // --keep-exited --keep-exited-max 100: the 100 most recent keep their maps, the rest are
    // let go and counted.
    let procs = FakeProc(RefCell::new(BTreeMap::new()));
    let mut table = ProcessTable::new(false);
    table.keep_exited_max = 100;
    let mut live = Live::new(None, true).expect("live");
    // The agent's pipeline (src/cli/agent.rs): no trace kept for the live computed fix.
    live.without_fix_trace();
    for i in 0..1_000 {
        one_process(i, &mut table, &mut live, &procs);
    }
    assert_eq!(live.state.spaces.len(), 100, "the 100 most recent exited processes keep their maps");
    assert_eq!(table.let_go, 900);
    let kept: Vec<u32> = live.state.spaces.keys().map(|&(p, _)| p).collect();
    assert_eq!(kept.first(), Some(&(10_000 + 900)), "the oldest were let go");
    drop((table, live));
    let (half, end, _, spaces) = heap_after(10_000, false, 100);
    assert_eq!(spaces, 100);
    assert!(end - half < 64 << 10, "heap grew by {} bytes from process 5,000 to 10,000 with --keep-exited-max 100", end - half);
}
