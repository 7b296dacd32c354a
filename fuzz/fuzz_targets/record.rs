//! Record files: the header and 80-byte records, every event applied to the state, the summary.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(rec) = gpufrag::record::parse(std::path::Path::new("fuzz.rec"), data) {
        let mut state = gpufrag::ingest::State::default();
        state.apply_all(&rec.events);
        common::after_decoding(&state);
    }
});
