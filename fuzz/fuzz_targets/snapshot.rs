//! PyTorch snapshot pickles (plain): the pickle VM, the walk into typed segments and traces, the
//! replay (with the undo of a truncated ring), the summary and its rendering.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    gpufrag::snapshot::set_inflate_limit(16 << 20);
    if let Ok(snap) = gpufrag::snapshot::from_bytes_unguarded(data, std::path::Path::new("fuzz.pickle")) {
        let loaded = gpufrag::input::replay_snapshot(&snap);
        common::after_decoding(&loaded.state);
    }
});
