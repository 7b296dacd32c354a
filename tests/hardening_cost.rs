//! Issue 23, item 4 (part): the OOM bookkeeping is linear. Each event ran `retain` over every OOM
//! awaiting a device-free reading: 25 k / 50 k / 100 k OOMs analysed in 0.61 / 3.18 / 11.2 s.

use gpufrag::event::{Event, EventKind, F_FAILED};
use std::time::Instant;

/// 100,000 failed driver allocations of one process, 1 µs apart (all inside the reading window),
/// none with a device-free reading: every one awaits a reading.
#[test]
fn regression_one_hundred_thousand_ooms_are_applied_in_under_a_second() {
    let n = 100_000u64;
    let base = Event { addr: 0x7f00_0000_0000, size: 2 << 20, ts_ns: 1, ..Event::new(EventKind::MemAlloc, 7, 0) };
    let mut events = vec![base];
    for i in 0..n {
        let e = Event {
            size: 1 << 40,
            ts_ns: 1_000 + i * 1_000,
            flags: F_FAILED,
            op: EventKind::MemAlloc as u16,
            rc: 2,
            ..Event::new(EventKind::AllocFailed, 7, 0)
        };
        events.push(e);
    }
    let t0 = Instant::now();
    let mut state = gpufrag::ingest::State::default();
    state.apply_all(&events);
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(state.ooms.len() as u64, n);
    assert!(secs < 1.0, "{n} OOMs applied in {secs:.2} s (want < 1 s)");
    let per_oom = std::mem::size_of::<gpufrag::ingest::OomRecord>();
    eprintln!("{n} OOMs applied in {secs:.3} s; {per_oom} B kept per OOM ({} KiB for the {n})", (state.ooms.capacity() * per_oom) >> 10);
}
