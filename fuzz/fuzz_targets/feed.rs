//! The live feed as `gpufrag top` reads it: newline-delimited JSON frames, bounded lines.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut n = 0usize;
    gpufrag::views::feed::read_feed(data, "fuzz.sock", |_| {
        n += 1;
        n < 1_000
    });
});
