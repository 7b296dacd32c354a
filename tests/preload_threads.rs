//! Many threads through the shim at once (`simcuda-workload threads 32 100000`: 32 threads ×
//! 100,000 cudaMalloc/cudaFree pairs): no crash, no deadlock, the workload's output unchanged,
//! and every event the shim produced either received by the consumer or counted as dropped,
//! exactly. One run drains a ring large enough to keep up; one uses a 1,024-slot ring so that
//! drops are certain.

mod preload_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpufrag_wire::event::{Event, EventKind};
use preload_common::*;

const THREADS: u64 = 32;
const CALLS: u64 = 100_000;

/// Events the shim must have produced for a `threads` run that reported `ok` pairs: an
/// allocation and a free per pair, the first-allocation device sample, the two device totals the
/// workload asks for (cudaMemGetInfo before and after), and ProcessExit.
fn produced(ok: u64) -> u64 {
    2 * ok + 1 + 2 + 1
}

/// What the consumer checks on the fly (6.4 M events are not kept): per thread, every
/// allocation is followed by the free of the same address.
#[derive(Default)]
struct Pairing {
    open: HashMap<u32, u64>,
    allocs: u64,
    frees: u64,
    other: u64,
    unpaired: u64,
}

impl Pairing {
    fn take(&mut self, e: &Event) {
        match e.kind() {
            Some(EventKind::MemAlloc) => {
                self.allocs += 1;
                self.unpaired += u64::from(self.open.insert(e.tid, e.addr).is_some());
            }
            Some(EventKind::MemFree) => {
                self.frees += 1;
                self.unpaired += u64::from(self.open.remove(&e.tid) != Some(e.addr));
            }
            _ => self.other += 1,
        }
    }
}

fn run_threads(capacity: &str) -> (Run, u64, Pairing) {
    let args = ["threads", &THREADS.to_string(), &CALLS.to_string()];
    let args: Vec<&str> = args.iter().map(|s| s.as_ref()).collect();
    let pairing = Arc::new(Mutex::new(Pairing::default()));
    let p = Arc::clone(&pairing);
    let sink: Sink = Box::new(move |e| p.lock().expect("pairing").take(e));
    let run = traced_run_with(&args, &[("GPUFRAG_RING_CAPACITY", capacity)], Some(sink));
    assert!(run.output.status.success(), "{:?}\n{}", run.output.status, String::from_utf8_lossy(&run.output.stderr));
    let bare = bare_run(&args);
    assert_eq!(normalized(&run.output.stdout), normalized(&bare.stdout), "the shim changed the workload's output");
    let result = &lines_with(&run.stdout(), "RESULT")[0];
    let ok = num(result, "ok");
    assert_eq!(ok, THREADS * CALLS);
    assert_eq!(field(result, "failed"), "0");
    let pairing = std::mem::take(&mut *pairing.lock().expect("pairing"));
    (run, ok, pairing)
}

#[test]
fn many_threads_with_a_ring_that_keeps_up() {
    let (run, ok, pairing) = run_threads(&(1u64 << 20).to_string());
    let t = run.only();
    eprintln!("received {}, dropped {}", t.received, t.dropped);
    // Plus the shim's placement event(s) of device 0 (DeviceUuid, asked before the first allocation).
    assert!(!t.placements.is_empty(), "device 0 placed");
    assert_eq!(t.received + t.dropped, produced(ok) + t.placements.len() as u64, "received {} + dropped {}", t.received, t.dropped);
    assert_eq!(t.pushed, t.received, "every pushed event was received");
    if t.dropped == 0 {
        assert_eq!((pairing.allocs, pairing.frees, pairing.other), (ok, ok, 4));
        assert_eq!(pairing.unpaired, 0);
        assert!(pairing.open.is_empty());
    }
}

#[test]
fn many_threads_with_a_small_ring_drop_and_count() {
    let (run, ok, _) = run_threads("1024");
    let t = run.only();
    eprintln!("received {}, dropped {}", t.received, t.dropped);
    assert!(t.dropped > 0, "a 1,024-slot ring cannot hold 6.4 M events");
    // Plus the shim's placement event(s) of device 0 (DeviceUuid, asked before the first allocation).
    assert!(!t.placements.is_empty(), "device 0 placed");
    assert_eq!(t.received + t.dropped, produced(ok) + t.placements.len() as u64, "received {} + dropped {}", t.received, t.dropped);
    assert_eq!(t.pushed, t.received);
}
