//! The Python hook's framing (`GFPY`, type, length, body): snapshot frames decoded and turned into
//! block events on a state, OOM and ARMED frames, and whatever a hostile hook sends instead.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    gpufrag::snapshot::set_inflate_limit(16 << 20);
    let hello = gpufrag::hello::Hello {
        pid: 42,
        ppid: 1,
        ring_bytes: 0,
        start_time: 0,
        flags: 0,
        source: gpufrag::hello::SOURCE_PYTHON,
        exe: [0; 24],
    };
    let mut state = gpufrag::ingest::State::default();
    gpufrag::consumer::python_reader(hello, data, |m| {
        if let gpufrag::source::Msg::Blocks { pid, snapshot } = m {
            let events = gpufrag::consumer::blocks::sync_events(&state, pid, &snapshot, 1);
            state.apply_all(&events);
        }
    });
    common::after_decoding(&state);
});
