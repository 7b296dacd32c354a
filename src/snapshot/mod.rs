//! The PyTorch memory snapshot importer: the pickle that `torch.cuda.memory._snapshot()` returns
//! and pytorch.org/memory_viz reads, plain or gzipped, turned into typed segments and trace rings
//! ([`Snapshot`]) and from there into the wire [`Event`](crate::event::Event)s the core ingests.
//!
//! [`load`] reads a file, [`from_file`] a file already open; [`from_bytes`] decodes bytes already
//! in memory. All three detect gzip by its magic bytes, never by the extension, and fail with a
//! one-line [`SnapshotError`] naming the file, the offset where the decoder knows it, and what is
//! wrong; no input makes them panic.
//!
//! Files: `model.rs` (the types), `pickle.rs` (a pickle VM for plain data: serde-pickle 1.2
//! cannot decode snapshots with stack frames, see there), `decode.rs` (bytes → types),
//! `events.rs` (types → events), `mapped.rs` (a file mapped read-only, its read pages given back), `stats.rs` (figures the final segments imply), `error.rs`.

mod decode;
mod error;
mod events;
mod mapped;
mod model;
mod pickle;
mod stats;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub use error::{SnapshotError, SnapshotErrorKind};
pub use events::CUDA_ERROR_OUT_OF_MEMORY;
pub use model::{Action, AllocatorSettings, BlockState, DeviceTrace, Pool, SnapBlock, SnapSegment, Snapshot, TraceEntry};
pub use stats::{DeviceStats, OomEntry, PoolStats};

/// Default for [`inflate_limit`]: 1 GiB of decompressed pickle (PyTorch's snapshots of 100 k
/// blocks with history are a few hundred MB).
pub const DEFAULT_INFLATE_LIMIT: u64 = 1 << 30;

static INFLATE_LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_INFLATE_LIMIT);

/// The most bytes a gzipped snapshot may inflate to; past it loading fails with
/// [`SnapshotErrorKind::InflateLimit`] (a gzip bomb inflates 2 MB into gigabytes).
pub fn inflate_limit() -> u64 {
    INFLATE_LIMIT.load(Ordering::Relaxed)
}

/// Sets [`inflate_limit`] for the whole process (`--max-inflated-bytes`).
pub fn set_inflate_limit(bytes: u64) {
    INFLATE_LIMIT.store(bytes, Ordering::Relaxed);
}

/// Loads a snapshot file, `.pickle` or gzipped (detected by content): opens it and decodes it
/// with [`from_file`]. The commands open their input once with `crate::input::open`, which calls
/// [`from_file`] on the file it opened.
pub fn load(path: &Path) -> Result<Snapshot, SnapshotError> {
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    from_file(&file, path)
}

fn io_error(path: &Path, e: std::io::Error) -> SnapshotError {
    let kind = if e.kind() == std::io::ErrorKind::NotFound { SnapshotErrorKind::NotFound } else { SnapshotErrorKind::Io(e) };
    SnapshotError::new(path, kind)
}

/// Decodes the snapshot an open regular file holds (`path` names it in errors). A plain pickle
/// is mapped, not read: the decoder walks it once, front to back, and the pages it has passed are
/// given back as it goes ([`mapped::Mapped::release_before`]), so the file is never held whole (a
/// 24 MB snapshot of 253,000 entries is decoded in about 48 MB, docs/benchmarks.md). The file's
/// own offset is not moved unless it cannot be mapped (an empty file, a file system without mmap):
/// then it is read from where it stands, which must be its start.
pub fn from_file(file: &std::fs::File, path: &Path) -> Result<Snapshot, SnapshotError> {
    let map = match mapped::Mapped::of(file) {
        Ok(Some(m)) => m,
        // empty, or not mappable (a file system without mmap): read it
        Ok(None) | Err(_) => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut &*file, &mut bytes).map_err(|e| io_error(path, e))?;
            return from_bytes(&bytes, path);
        }
    };
    guarded(path, || decode::decode_behind(map.bytes(), path, &mut |pos| map.release_before(pos)))
}

/// Runs a decode, turning a panic (none is known) into an error naming the file rather than an
/// unwinding thread.
fn guarded(name: &Path, f: impl FnOnce() -> Result<Snapshot, SnapshotError>) -> Result<Snapshot, SnapshotError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_string());
        Err(SnapshotError::new(name, SnapshotErrorKind::Internal(what)))
    })
}

/// [`from_bytes`] without its panic guard: for the fuzz targets (fuzz/), which must see a panic
/// as the crash it is. Not for callers that face users.
#[doc(hidden)]
pub fn from_bytes_unguarded(bytes: &[u8], name: &Path) -> Result<Snapshot, SnapshotError> {
    decode::decode(bytes, name)
}

/// Decodes a snapshot from bytes in memory (gzip detected by content); `name` is the file name
/// that errors report.
pub fn from_bytes(bytes: &[u8], name: &Path) -> Result<Snapshot, SnapshotError> {
    guarded(name, || decode::decode(bytes, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventKind, F_BLOCK_SIZE_KNOWN, F_DEVICE_FREE_KNOWN, F_SRC_SNAPSHOT};
    use serde_pickle::{HashableValue, SerOptions, Value};
    use std::collections::BTreeMap;

    fn s(x: &str) -> Value {
        Value::String(x.to_string())
    }
    fn i(x: i64) -> Value {
        Value::I64(x)
    }
    fn dict(items: Vec<(&str, Value)>) -> Value {
        let mut d = BTreeMap::new();
        for (k, v) in items {
            d.insert(HashableValue::String(k.to_string()), v);
        }
        Value::Dict(d)
    }
    fn entry(action: &str, addr: i64, size: i64, t: i64) -> Value {
        dict(vec![("action", s(action)), ("addr", i(addr)), ("size", i(size)), ("stream", i(0)), ("time_us", i(t))])
    }
    fn pickle(v: &Value) -> Vec<u8> {
        serde_pickle::value_to_vec(v, SerOptions::new()).expect("serialize")
    }
    fn tiny(entries: Vec<Value>) -> Value {
        let block = |addr: i64, size: i64, state: &str| {
            dict(vec![("address", i(addr)), ("size", i(size)), ("requested_size", i(size - 10)), ("state", s(state))])
        };
        let seg = dict(vec![
            ("device", i(0)),
            ("address", i(0x1000_0000)),
            ("total_size", i(0x20_0000)),
            ("allocated_size", i(0x8_0000)),
            ("active_size", i(0x10_0000)),
            ("requested_size", i(0x10_0000 - 20)),
            ("stream", i(0)),
            ("segment_type", s("small")),
            ("segment_pool_id", Value::Tuple(vec![i(0), i(0)])),
            ("is_expandable", Value::Bool(false)),
            (
                "blocks",
                Value::List(vec![
                    block(0x1000_0000, 0x8_0000, "active_allocated"),
                    block(0x1008_0000, 0x8_0000, "active_pending_free"),
                    block(0x1010_0000, 0x10_0000, "inactive"),
                ]),
            ),
        ]);
        dict(vec![
            ("segments", Value::List(vec![seg])),
            ("device_traces", Value::List(vec![Value::List(entries)])),
            (
                "allocator_settings",
                dict(vec![
                    ("PYTORCH_CUDA_ALLOC_CONF", s("roundup_power2_divisions:[256:1,>:4]")),
                    ("max_split_size", i(-1)),
                    ("expandable_segments", Value::Bool(false)),
                    ("garbage_collection_threshold", Value::F64(0.0)),
                    ("roundup_power2_divisions", dict(vec![("1", i(0)), ("2", i(0)), ("256", i(1)), ("512", i(4)), ("32768", i(4))])),
                ]),
            ),
        ])
    }

    fn load_value(v: &Value) -> Result<Snapshot, SnapshotError> {
        from_bytes(&pickle(v), Path::new("mem.pickle"))
    }

    #[test]
    fn every_pytorch_action_is_known_and_each_maps_as_specified() {
        let mut entries = vec![
            entry("segment_alloc", 0x1000_0000, 0x20_0000, 1),
            entry("alloc", 0x1000_0000, 1000, 2),
            entry("free_requested", 0x1000_0000, 1000, 3),
            entry("free_completed", 0x1000_0000, 1000, 4),
            entry("segment_free", 0x1000_0000, 0x20_0000, 5),
            entry("segment_map", 0x2000_0000, 0x40_0000, 6),
            entry("segment_unmap", 0x2000_0000, 0x20_0000, 7),
            entry("snapshot", 0, 0x10_0000, 8),
            entry("user_defined", 0, 0, 9),
            entry("workspace_snapshot", 0, 0, 10),
        ];
        entries.push(dict(vec![("action", s("oom")), ("device_free", i(123)), ("size", i(4096)), ("stream", i(7)), ("time_us", i(11))]));
        let snap = load_value(&tiny(entries)).expect("load");
        let actions: Vec<Action> = snap.traces[0].entries.iter().map(|e| e.action).collect();
        assert_eq!(actions.len(), 11);
        assert_eq!(actions[9], Action::Unknown);
        for a in Action::KNOWN {
            assert!(actions.contains(&a), "{a} decoded");
        }
        assert!(snap.warnings.iter().any(|w| w.contains("workspace_snapshot")), "{:?}", snap.warnings);

        let ev = snap.events();
        let kinds: Vec<EventKind> = ev.iter().filter_map(|e| e.kind()).collect();
        assert_eq!(
            kinds,
            vec![
                EventKind::MemAlloc,
                EventKind::BlockAlloc,
                EventKind::BlockFree,
                EventKind::MemFree,
                EventKind::Map,
                EventKind::Unmap,
                EventKind::AllocFailed,
            ]
        );
        for e in &ev {
            assert_eq!((e.pid, e.device), (0, 0));
            assert!(e.flags & F_SRC_SNAPSHOT != 0);
        }
        assert_eq!((ev[1].addr, ev[1].requested, ev[1].size, ev[1].ts_ns), (0x1000_0000, 1000, 0, 2000));
        assert_eq!((ev[2].addr, ev[2].requested), (0x1000_0000, 1000));
        assert_eq!((ev[4].addr, ev[4].size, ev[4].handle), (0x2000_0000, 0x40_0000, 0));
        let oom = ev[6];
        assert_eq!(
            (oom.requested, oom.rc, oom.failed_op(), oom.device_free(), oom.stream),
            (4096, CUDA_ERROR_OUT_OF_MEMORY, Some(EventKind::BlockAlloc), Some(123), 7)
        );
        assert!(oom.flags & F_DEVICE_FREE_KNOWN != 0);

        let rev = snap.reverse_events(0);
        let kinds: Vec<EventKind> = rev.iter().filter_map(|e| e.kind()).collect();
        assert_eq!(
            kinds,
            vec![EventKind::Map, EventKind::Unmap, EventKind::MemAlloc, EventKind::BlockAlloc, EventKind::BlockFree, EventKind::MemFree,]
        );
        assert_eq!((rev[0].addr, rev[0].size), (0x2000_0000, 0x20_0000));
        assert_eq!((rev[3].requested, rev[3].size), (1000, 0));
        assert!(snap.reverse_events(1).is_empty());
        assert!(snap.reverse_events(-1).is_empty());
    }

    #[test]
    fn seed_events_and_stats_follow_block_states() {
        let snap = load_value(&tiny(vec![entry("alloc", 0x1000_0000, 1000, 5)])).expect("load");
        let seed = snap.seed_events();
        assert_eq!(seed.len(), 3, "one segment, two active blocks");
        assert_eq!((seed[0].kind(), seed[0].addr, seed[0].size), (Some(EventKind::MemAlloc), 0x1000_0000, 0x20_0000));
        assert_eq!(seed[0].ts_ns, 5000);
        for b in &seed[1..] {
            assert_eq!(b.kind(), Some(EventKind::BlockAlloc));
            assert_eq!(b.flags, F_SRC_SNAPSHOT | F_BLOCK_SIZE_KNOWN);
            assert_eq!(b.size, 0x8_0000);
            assert_eq!(b.requested, 0x8_0000 - 10);
        }
        let st = snap.device_stats(0);
        assert_eq!(st.all.allocated_bytes, 0x8_0000, "pending-free blocks are not allocated");
        assert_eq!(st.all.active_bytes, 0x10_0000, "but they are active");
        assert_eq!(st.all.allocation, 1);
        assert_eq!(st.all.active, 2);
        assert_eq!(st.all.inactive_split_bytes, 0x10_0000);
        assert_eq!(st.small_pool, st.all);
        assert_eq!(st.large_pool, PoolStats::default());
        assert_eq!(st.largest_free_block, 0x10_0000);
        assert_eq!(st.releasable_bytes, 0);
        assert_eq!(st.current("reserved_bytes.small_pool.current"), Some(0x20_0000));
        assert_eq!(st.current("reserved_bytes.all.peak"), None);
        assert_eq!(snap.settings.max_split_size, None);
        assert_eq!(snap.settings.divisions_for(1 << 20), 0);
        assert_eq!(snap.settings.divisions_for(300 << 20), 1);
        assert_eq!(snap.settings.divisions_for(600 << 20), 4);
        assert_eq!(snap.settings.divisions_for(100 << 30), 4);
        assert_eq!(snap.settings.conf, "roundup_power2_divisions:[256:1,>:4]");
    }

    #[test]
    fn wrong_types_name_the_field_and_the_entry() {
        let mut bad = entry("alloc", 0x10, 5, 1);
        if let Value::Dict(d) = &mut bad {
            d.insert(HashableValue::String("size".into()), s("five"));
        }
        let e = load_value(&tiny(vec![entry("alloc", 0, 1, 0), bad])).expect_err("bad size");
        let msg = e.to_string();
        assert!(msg.starts_with("mem.pickle: "), "{msg}");
        assert!(msg.contains("device_traces[0][1].size"), "{msg}");
        assert!(msg.contains("str \"five\""), "{msg}");

        let missing = dict(vec![("action", s("alloc")), ("size", i(5))]);
        let e = load_value(&tiny(vec![missing])).expect_err("no addr");
        assert!(matches!(e.kind(), SnapshotErrorKind::MissingField { field } if field == "device_traces[0][0].addr"));

        let negative = entry("segment_alloc", -5, 5, 0);
        let e = load_value(&tiny(vec![negative])).expect_err("negative addr");
        assert!(e.to_string().contains("int -5"), "{e}");

        let e = load_value(&Value::List(vec![])).expect_err("list");
        assert!(matches!(e.kind(), SnapshotErrorKind::NotASnapshot(_)), "{e}");
        let e = load_value(&dict(vec![("segments", Value::List(vec![]))])).expect_err("no traces");
        assert!(e.to_string().contains("`device_traces`"), "{e}");
    }

    #[test]
    fn old_snapshots_without_optional_fields_load() {
        let seg = dict(vec![
            ("device", i(0)),
            ("address", i(4096)),
            ("total_size", i(2048)),
            ("segment_type", s("large")),
            (
                "blocks",
                Value::List(vec![
                    dict(vec![("size", i(1024)), ("state", s("active_allocated"))]),
                    dict(vec![("size", i(1024)), ("state", s("inactive"))]),
                ]),
            ),
        ]);
        let entry = dict(vec![("action", s("alloc")), ("addr", i(4096)), ("size", i(1000))]);
        let top = dict(vec![("segments", Value::List(vec![seg])), ("device_traces", Value::List(vec![Value::List(vec![entry])]))]);
        let snap = load_value(&top).expect("load");
        assert_eq!(snap.segments[0].blocks[1].address, 4096 + 1024);
        assert_eq!(snap.segments[0].allocated_size, 1024);
        assert_eq!(snap.traces[0].entries[0].time_us, 0);
        assert_eq!(snap.warnings.len(), 1, "{:?}", snap.warnings);
    }

    #[test]
    fn gzip_is_detected_by_content() {
        use std::io::Write;
        let raw = pickle(&tiny(vec![entry("alloc", 0x1000_0000, 1, 0)]));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).expect("gzip");
        let gz = gz.finish().expect("gzip");
        let a = from_bytes(&gz, Path::new("plain-name.pickle")).expect("gz");
        let b = from_bytes(&raw, Path::new("x.pickle.gz")).expect("raw");
        assert_eq!(a, b);
        let e = from_bytes(&gz[..gz.len() / 2], Path::new("half.gz")).expect_err("truncated gzip");
        assert!(e.to_string().starts_with("half.gz: "), "{e}");
        let e = from_bytes(&raw[..raw.len() - 3], Path::new("cut.pickle")).expect_err("truncated");
        assert!(matches!(e.kind(), SnapshotErrorKind::TruncatedPickle), "{e}");
        assert!(e.offset().is_some(), "{e}");
    }

    #[test]
    fn deeply_nested_pickles_fail_cleanly() {
        let p = pickle::nested_lists(100_000);
        let e = from_bytes(&p, Path::new("deep.pickle")).expect_err("not a snapshot");
        assert!(matches!(e.kind(), SnapshotErrorKind::NotASnapshot(_)), "{e}");
    }
}
