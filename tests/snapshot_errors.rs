//! Bad input never panics the snapshot loader: each case gives an error whose one-line message
//! names the file, and the byte offset where the decoder knows it. Covers missing files, empty
//! files, random bytes, truncations and byte flips of every fixture, corrupt gzip, pickles that
//! are not snapshots, and fields of the wrong type.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use gpufrag::snapshot::{self, SnapshotError, SnapshotErrorKind};
use serde_pickle::{HashableValue, SerOptions, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

const FIXTURES: [&str; 4] = ["frag_oom.pickle", "frag_oom_expandable.pickle", "pinned_splits.pickle", "gpt2_varlen.pickle.gz"];

/// xorshift64*: deterministic bytes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A scratch directory of this test binary's own, removed by the OS eventually.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufrag-snapshot-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

/// Decodes `bytes` as the file `name`, expecting failure, and checks the message's shape.
fn expect_err(bytes: &[u8], name: &str) -> SnapshotError {
    let e = match snapshot::from_bytes(bytes, Path::new(name)) {
        Ok(s) => panic!("{name}: decoded {} entries from bad input", s.entry_count()),
        Err(e) => e,
    };
    check_message(&e, name);
    e
}

fn check_message(e: &SnapshotError, name: &str) {
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{name}: ")), "message does not name the file: {msg}");
    assert!(!msg.contains('\n'), "not one line: {msg}");
    assert!(!matches!(e.kind(), SnapshotErrorKind::Internal(_)), "decoder panicked: {msg}");
    if let Some(off) = e.offset() {
        assert!(msg.contains(&format!("at byte {off}")), "offset not shown: {msg}");
    }
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(b), &mut out).expect("fixture gunzips");
    out
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b).expect("gzip");
    gz.finish().expect("gzip")
}

#[test]
fn missing_file_and_directory() {
    let path = scratch("does-not-exist.pickle");
    let e = snapshot::load(&path).expect_err("missing");
    assert!(matches!(e.kind(), SnapshotErrorKind::NotFound), "{e}");
    assert_eq!(e.to_string(), format!("{}: file not found", path.display()));

    let dir = scratch("a-directory.pickle");
    std::fs::create_dir_all(&dir).expect("dir");
    let e = snapshot::load(&dir).expect_err("directory");
    assert!(matches!(e.kind(), SnapshotErrorKind::Io(_)), "{e}");
    assert!(e.to_string().starts_with(&format!("{}: cannot read", dir.display())), "{e}");
}

#[test]
fn empty_file_and_empty_gzip() {
    let path = scratch("empty.pickle");
    std::fs::write(&path, b"").expect("write");
    let e = snapshot::load(&path).expect_err("empty");
    assert!(matches!(e.kind(), SnapshotErrorKind::Empty), "{e}");
    check_message(&e, &path.display().to_string());
    let e = expect_err(&gzip(b""), "empty.gz");
    assert!(matches!(e.kind(), SnapshotErrorKind::Empty), "{e}");
}

#[test]
fn random_bytes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for len in [1usize, 2, 3, 7, 64, 1000, 65_536] {
        for round in 0..50 {
            let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if round % 2 == 1 {
                // Half of them start like a protocol-4 pickle, to get past the first opcode.
                b.splice(0..0, [0x80, 0x04]);
            }
            if round % 5 == 4 {
                b.splice(0..0, [0x1f, 0x8b]);
            }
            expect_err(&b, "random.bin");
        }
    }
}

#[test]
fn truncations_of_every_fixture() {
    for f in FIXTURES {
        let bytes = std::fs::read(fixture(f)).expect("fixture");
        let name = format!("cut-{f}");
        let cuts = [0, 1, 2, 3, 10, 100, bytes.len() / 3, bytes.len() / 2, bytes.len() - 2, bytes.len() - 1];
        for cut in cuts.into_iter().filter(|&c| c < bytes.len()) {
            let e = expect_err(&bytes[..cut], &name);
            if cut == 0 {
                assert!(matches!(e.kind(), SnapshotErrorKind::Empty), "{e}");
                continue;
            }
            if f.ends_with(".gz") && cut >= 2 {
                assert!(matches!(e.kind(), SnapshotErrorKind::TruncatedGzip | SnapshotErrorKind::CorruptGzip(_)), "{f} cut at {cut}: {e}");
            } else if cut > 2 {
                assert!(matches!(e.kind(), SnapshotErrorKind::TruncatedPickle), "{f} cut at {cut}: {e}");
                assert_eq!(e.offset(), Some(cut as u64), "{e}");
            }
        }
        // The decompressed pickle, truncated, inside a valid gzip: the offset counts pickle bytes.
        if f.ends_with(".gz") {
            let raw = gunzip(&bytes);
            for cut in [3, raw.len() / 2, raw.len() - 1] {
                let e = expect_err(&gzip(&raw[..cut]), &name);
                assert!(matches!(e.kind(), SnapshotErrorKind::TruncatedPickle), "{e}");
                assert!(e.offset_is_decompressed());
                assert!(e.to_string().contains(&format!("at byte {cut} of the decompressed pickle")), "{e}");
            }
        }
    }
}

#[test]
fn byte_flips_of_every_fixture_never_panic() {
    let mut rng = Rng(42);
    for f in FIXTURES {
        let bytes = std::fs::read(fixture(f)).expect("fixture");
        let raw = if f.ends_with(".gz") { gunzip(&bytes) } else { bytes };
        let rounds = if raw.len() > 100_000 { 40 } else { 300 };
        for _ in 0..rounds {
            let mut b = raw.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            // Either it still decodes (a flipped digit of a size) or it fails cleanly.
            if let Err(e) = snapshot::from_bytes(&b, Path::new("flipped.pickle")) {
                check_message(&e, "flipped.pickle");
            }
        }
    }
}

#[test]
fn corrupt_gzip() {
    let raw = std::fs::read(fixture("frag_oom.pickle")).expect("fixture");
    let mut gz = gzip(&raw);
    let mid = gz.len() / 2;
    for b in &mut gz[mid..mid + 8] {
        *b ^= 0x5a;
    }
    let e = expect_err(&gz, "corrupt.pickle.gz");
    assert!(matches!(e.kind(), SnapshotErrorKind::CorruptGzip(_) | SnapshotErrorKind::TruncatedGzip), "{e}");
    assert!(e.offset().is_some() && !e.offset_is_decompressed(), "{e}");

    // A valid gzip header followed by garbage.
    let e = expect_err(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff], "garbage.gz");
    assert!(matches!(e.kind(), SnapshotErrorKind::CorruptGzip(_) | SnapshotErrorKind::TruncatedGzip), "{e}");
}

fn s(x: &str) -> Value {
    Value::String(x.into())
}
fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (HashableValue::String(k.into()), v)).collect::<BTreeMap<_, _>>())
}
fn pickle(v: &Value) -> Vec<u8> {
    serde_pickle::value_to_vec(v, SerOptions::new()).expect("serialize")
}
fn alloc(addr: Value, size: Value) -> Value {
    dict(vec![("action", s("alloc")), ("addr", addr), ("size", size), ("stream", Value::I64(0)), ("time_us", Value::I64(1))])
}
fn snap(entries: Vec<Value>) -> Value {
    dict(vec![("segments", Value::List(vec![])), ("device_traces", Value::List(vec![Value::List(entries)]))])
}

#[test]
fn pickles_that_are_not_snapshots() {
    let cases: Vec<(Value, &str)> = vec![
        (Value::List(vec![Value::I64(1), Value::I64(2)]), "a list of 2 items"),
        (Value::I64(7), "int 7"),
        (Value::None, "None"),
        (dict(vec![("segments", Value::List(vec![]))]), "no `device_traces`"),
        (dict(vec![("device_traces", Value::List(vec![]))]), "no `segments`"),
        (dict(vec![("hello", s("world"))]), "no `segments` and `device_traces` (its keys: \"hello\")"),
    ];
    for (v, says) in cases {
        let e = expect_err(&pickle(&v), "other.pickle");
        assert!(matches!(e.kind(), SnapshotErrorKind::NotASnapshot(_)), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    // A pickle of a Python object rather than plain data.
    // pickle.dumps(C(), protocol=4) for `class C: pass` in __main__
    let obj = b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x08__main__\x94\x8c\x01C\x94\x93\x94)\x81\x94.";
    let e = expect_err(obj, "object.pickle");
    assert!(matches!(e.kind(), SnapshotErrorKind::Pickle(_)), "{e}");
    assert!(e.offset().is_some(), "{e}");
}

#[test]
fn fields_of_the_wrong_type_name_the_field_and_the_entry() {
    let good = || alloc(Value::I64(4096), Value::I64(512));
    let cases: Vec<(Value, &str)> = vec![
        (
            snap(vec![good(), good(), alloc(Value::I64(4096), s("512"))]),
            "`device_traces[0][2].size`: expected a non-negative integer below 2^64, found str \"512\"",
        ),
        (
            snap(vec![good(), alloc(Value::F64(1.5), Value::I64(1))]),
            "`device_traces[0][1].addr`: expected a non-negative integer below 2^64, found float 1.5",
        ),
        (
            snap(vec![alloc(Value::I64(-1), Value::I64(1))]),
            "`device_traces[0][0].addr`: expected a non-negative integer below 2^64, found int -1",
        ),
        (snap(vec![good(), Value::I64(3)]), "`device_traces[0][1]`: expected a dict, found int 3"),
        (snap(vec![dict(vec![("action", Value::I64(1))])]), "`device_traces[0][0].action`: expected a str, found int 1"),
        (snap(vec![dict(vec![("action", s("alloc")), ("size", Value::I64(1))])]), "`device_traces[0][0].addr` is missing"),
        (
            dict(vec![("segments", Value::List(vec![dict(vec![("device", Value::I64(0))])])), ("device_traces", Value::List(vec![]))]),
            "`segments[0].address` is missing",
        ),
        (dict(vec![("segments", Value::I64(0)), ("device_traces", Value::List(vec![]))]), "`segments`: expected a list, found int 0"),
        (
            dict(vec![
                ("segments", Value::List(vec![])),
                ("device_traces", Value::List(vec![])),
                ("allocator_settings", dict(vec![("expandable_segments", s("yes"))])),
            ]),
            "`allocator_settings.expandable_segments`: expected a bool, found str \"yes\"",
        ),
    ];
    for (v, says) in cases {
        let e = expect_err(&pickle(&v), "typed.pickle");
        let msg = e.to_string();
        assert!(msg.contains(says), "{msg}\n  wanted: {says}");
        assert!(e.offset().is_some(), "the enclosing dict's offset: {msg}");
    }
}

#[test]
fn unknown_actions_are_counted_warnings_not_errors() {
    let mut entries = vec![alloc(Value::I64(4096), Value::I64(512))];
    for _ in 0..3 {
        entries.push(dict(vec![("action", s("workspace_snapshot")), ("addr", Value::I64(0)), ("size", Value::I64(0))]));
    }
    let sn = snapshot::from_bytes(&pickle(&snap(entries)), Path::new("w.pickle")).expect("loads");
    assert_eq!(sn.entry_count(), 4);
    assert_eq!(sn.events().len(), 1);
    assert_eq!(sn.warnings.len(), 2, "{:?}", sn.warnings);
    assert!(sn.warnings.iter().any(|w| w.contains("3 entries with unknown action \"workspace_snapshot\"")), "{:?}", sn.warnings);
}
