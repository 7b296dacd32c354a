//! Gzipped snapshots: the inflate (multi-member, under the inflate limit) before the pickle. The
//! input is gzipped by the target half the time, so that mutations also reach the pickle inside.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Write;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    gpufrag::snapshot::set_inflate_limit(16 << 20);
    let (wrap, body) = match data.split_first() {
        Some((&flag, rest)) => (flag & 1 == 1, rest),
        None => return,
    };
    let bytes = if wrap {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let _ = enc.write_all(body);
        enc.finish().unwrap_or_default()
    } else {
        body.to_vec()
    };
    if let Ok(snap) = gpufrag::snapshot::from_bytes_unguarded(&bytes, std::path::Path::new("fuzz.pickle.gz")) {
        let loaded = gpufrag::input::replay_snapshot(&snap);
        common::after_decoding(&loaded.state);
    }
});
