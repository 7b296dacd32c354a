//! The four recorded PyTorch snapshots (`tests/fixtures`, described in
//! `tests/fixtures/README.md`) load, match their `torch.cuda.memory_stats()` ground truth,
//! and turn into events that replay to the snapshot's own final state, forward from empty and
//! backward from the final state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use gpufrag::event::{Event, EventKind, F_BLOCK_SIZE_KNOWN, F_DEVICE_FREE_KNOWN, F_FRAMEWORK_OWNED, F_SRC_SNAPSHOT};
use gpufrag::snapshot::{self, Action, BlockState, Snapshot};

const FIXTURES: [(&str, &str, usize, usize); 4] = [
    ("frag_oom", "frag_oom.pickle", 71, 20),
    ("frag_oom_expandable", "frag_oom_expandable.pickle", 82, 11),
    ("pinned_splits", "pinned_splits.pickle", 456, 8),
    ("gpt2_varlen", "gpt2_varlen.pickle.gz", 38_927, 204),
];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn load(file: &str) -> Snapshot {
    snapshot::load(&fixture(file)).unwrap_or_else(|e| panic!("{e}"))
}

fn stats_json(stem: &str) -> BTreeMap<String, serde_json::Value> {
    let text = std::fs::read_to_string(fixture(&format!("{stem}.stats.json"))).expect("stats.json");
    serde_json::from_str(&text).expect("stats.json parses")
}

#[test]
fn all_fixtures_load_with_the_documented_counts() {
    for (_, file, entries, segments) in FIXTURES {
        let s = load(file);
        assert_eq!(s.traces.len(), 1, "{file}: one device");
        assert_eq!(s.traces[0].device, 0);
        assert_eq!(s.entry_count(), entries, "{file}");
        assert_eq!(s.segments.len(), segments, "{file}");
        assert!(s.warnings.is_empty(), "{file}: {:?}", s.warnings);
        assert_eq!(s.devices(), vec![0], "{file}");
        let counts = s.action_counts();
        assert_eq!(counts.get(&Action::Unknown), None, "{file}");
        assert_eq!(counts.get(&Action::FreeRequested), counts.get(&Action::FreeCompleted), "{file}");
    }
}

#[test]
fn gpt2_keeps_frame_counts_not_frames() {
    let s = load("gpt2_varlen.pickle.gz");
    assert_eq!(s.frame_count(), 175_120);
    assert_eq!(s.traces[0].entries.iter().filter(|e| e.frames > 0).count(), 16_292);
    assert_eq!(s.traces[0].entries.iter().map(|e| e.frames).max(), Some(21));
    let counts = s.action_counts();
    assert_eq!(counts[&Action::Alloc], 13_207);
    assert_eq!(counts[&Action::FreeCompleted], 12_758);
    assert_eq!(counts[&Action::SegmentAlloc], 204);
    assert_eq!(load("frag_oom.pickle").frame_count(), 0);
}

/// Every `*.current` figure the snapshot can reproduce equals `memory_stats()`.
#[test]
fn segment_sums_equal_memory_stats() {
    let names = [
        "segment",
        "reserved_bytes",
        "allocation",
        "allocated_bytes",
        "active",
        "active_bytes",
        "requested_bytes",
        "inactive_split",
        "inactive_split_bytes",
    ];
    for (stem, file, _, _) in FIXTURES {
        let s = load(file);
        let st = s.device_stats(0);
        let truth = stats_json(stem);
        for name in names {
            for pool in ["all", "small_pool", "large_pool"] {
                let key = format!("{name}.{pool}.current");
                let want = truth.get(&key).and_then(|v| v.as_u64()).unwrap_or_else(|| panic!("{stem}: no {key}"));
                assert_eq!(st.current(&key), Some(want), "{stem}: {key}");
            }
        }
    }
}

#[test]
fn documented_figures() {
    let expect = [
        // file, reserved, allocated, inactive_split, largest free block
        ("frag_oom.pickle", 10_485_760_000u64, 8_388_608_000u64, 2_097_152_000u64, 209_715_200u64),
        ("frag_oom_expandable.pickle", 11_072_962_560, 11_072_962_560, 0, 0),
        ("pinned_splits.pickle", 8_589_934_592, 6_710_886_400, 805_306_368, 1_073_741_824),
        ("gpt2_varlen.pickle.gz", 26_505_904_128, 1_563_406_848, 384_847_360, 2_703_228_928),
    ];
    for (file, reserved, allocated, stranded, largest) in expect {
        let st = load(file).device_stats(0);
        assert_eq!(st.all.reserved_bytes, reserved, "{file}");
        assert_eq!(st.all.allocated_bytes, allocated, "{file}");
        assert_eq!(st.all.inactive_split_bytes, stranded, "{file}");
        assert_eq!(st.largest_free_block, largest, "{file}");
        assert_eq!(
            st.releasable_bytes + st.all.inactive_split_bytes + st.all.active_bytes,
            st.all.reserved_bytes,
            "{file}: every reserved byte is active, stranded or releasable"
        );
    }
}

#[test]
fn expandable_ranges_are_segment_entries_but_not_pytorch_segments() {
    let st = load("frag_oom_expandable.pickle").device_stats(0);
    assert_eq!(st.segment_entries, 11);
    assert_eq!(st.expandable_ranges, 11);
    assert_eq!(st.all.segment, 0, "memory_stats counts no segment for expandable ranges");
    let st = load("frag_oom.pickle").device_stats(0);
    assert_eq!((st.segment_entries, st.expandable_ranges, st.all.segment), (20, 0, 20));
}

#[test]
fn frag_oom_has_one_oom_entry_with_the_device_free() {
    let s = load("frag_oom.pickle");
    let ooms = s.ooms();
    assert_eq!(ooms.len(), 1);
    let o = ooms[0];
    assert_eq!((o.device, o.requested, o.device_free), (0, 2_684_354_560, Some(2_398_224_384)));
    assert_eq!(s.traces[0].entries[o.index].action, Action::Oom);
    assert_eq!(s.device_stats(0).ooms, 1);

    let failed: Vec<Event> = s.events().into_iter().filter(|e| e.kind() == Some(EventKind::AllocFailed)).collect();
    assert_eq!(failed.len(), 1);
    let e = failed[0];
    assert_eq!(e.requested, 2_684_354_560);
    assert_eq!(e.device_free(), Some(2_398_224_384));
    assert_eq!(e.rc, 2);
    assert_eq!(e.failed_op(), Some(EventKind::BlockAlloc));
    assert!(e.flags & F_DEVICE_FREE_KNOWN != 0);
    for (_, file, _, _) in &FIXTURES[1..] {
        assert!(load(file).ooms().is_empty(), "{file}");
    }
}

#[test]
fn settings() {
    for (_, file, _, _) in FIXTURES {
        let s = load(file);
        let expandable = file == "frag_oom_expandable.pickle";
        assert_eq!(s.settings.expandable_segments, expandable, "{file}");
        assert_eq!(s.settings.conf, if expandable { "expandable_segments:True" } else { "" }, "{file}");
        assert_eq!(s.settings.max_split_size, None, "{file}: -1 means no limit");
        assert_eq!(s.settings.roundup_power2_divisions.len(), 16, "{file}");
        assert_eq!(s.settings.roundup_power2_divisions[0], (1 << 20, 0));
        assert_eq!(s.settings.roundup_power2_divisions[15], (32_768u64 << 20, 0));
        assert_eq!(s.settings.divisions_for(5 << 30), 0);
        assert!(s.segments.iter().all(|g| g.is_expandable == expandable), "{file}");
    }
}

#[test]
fn events_follow_the_trace_with_snapshot_flags() {
    for (_, file, _, _) in FIXTURES {
        let s = load(file);
        let ev = s.events();
        let converted = s
            .traces
            .iter()
            .flat_map(|t| &t.entries)
            .filter(|e| !matches!(e.action, Action::FreeRequested | Action::Snapshot | Action::UserDefined))
            .count();
        assert_eq!(ev.len(), converted, "{file}");
        assert_eq!(ev, s.device_events(0), "{file}");
        let mut last = 0;
        for (e, t) in ev.iter().zip(s.traces[0].entries.iter().filter(|e| e.action != Action::FreeRequested)) {
            assert_eq!(e.flags & F_SRC_SNAPSHOT, F_SRC_SNAPSHOT);
            assert_eq!((e.pid, e.device), (0, 0));
            assert_eq!(e.ts_ns, t.time_us * 1000);
            assert!(e.ts_ns >= last, "{file}: trace order");
            last = e.ts_ns;
            if e.kind() == Some(EventKind::BlockAlloc) {
                assert_eq!((e.size, e.requested, e.addr), (0, t.size, t.addr), "{file}: size left to the rules");
            }
        }
    }
}

/// A dumb model of what the events say: mapped/allocated byte ranges and live block addresses.
#[derive(Default, Debug, PartialEq)]
struct Model {
    /// start → end of held driver memory (segments and mapped ranges), merged when touching.
    ranges: BTreeMap<u64, u64>,
    blocks: BTreeSet<u64>,
}

impl Model {
    fn add(&mut self, start: u64, len: u64) {
        let (mut s, mut e) = (start, start + len);
        let overlapping: Vec<(u64, u64)> = self.ranges.range(..=e).filter(|&(&a, &b)| b >= s && a <= e).map(|(&a, &b)| (a, b)).collect();
        for (a, b) in overlapping {
            assert!(b <= s || a >= e, "range [{s:#x},{e:#x}) overlaps held [{a:#x},{b:#x})");
            self.ranges.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.ranges.insert(s, e);
    }

    fn remove(&mut self, start: u64, len: u64) {
        let end = start + len;
        let (&a, &b) = self.ranges.range(..=start).next_back().expect("removing memory that is held");
        assert!(b >= end, "removing [{start:#x},{end:#x}) beyond held [{a:#x},{b:#x})");
        self.ranges.remove(&a);
        if a < start {
            self.ranges.insert(a, start);
        }
        if end < b {
            self.ranges.insert(end, b);
        }
    }

    fn apply(&mut self, e: &Event) {
        match e.kind() {
            Some(EventKind::MemAlloc | EventKind::Map) => self.add(e.addr, e.size),
            Some(EventKind::MemFree | EventKind::Unmap) => self.remove(e.addr, e.size),
            Some(EventKind::BlockAlloc) => assert!(self.blocks.insert(e.addr), "block {:#x} allocated twice", e.addr),
            Some(EventKind::BlockFree) => assert!(self.blocks.remove(&e.addr), "block {:#x} freed, not live", e.addr),
            Some(EventKind::AllocFailed) => {}
            other => panic!("unexpected event {other:?}"),
        }
    }

    fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }
}

#[test]
fn forward_replay_from_empty_reaches_the_final_segments() {
    for (_, file, _, _) in FIXTURES {
        let s = load(file);
        let mut forward = Model::default();
        s.events().iter().for_each(|e| forward.apply(e));
        let mut seeded = Model::default();
        s.seed_events().iter().for_each(|e| seeded.apply(e));
        assert_eq!(forward, seeded, "{file}");
        assert_eq!(forward.bytes(), s.device_stats(0).all.reserved_bytes, "{file}");
    }
}

#[test]
fn reverse_replay_from_the_final_state_reaches_empty() {
    for (_, file, _, _) in FIXTURES {
        let s = load(file);
        let mut m = Model::default();
        s.seed_events().iter().for_each(|e| m.apply(e));
        s.reverse_events(0).iter().for_each(|e| m.apply(e));
        assert_eq!(m, Model::default(), "{file}: history recording began before the first allocation");
    }
}

#[test]
fn seed_events_describe_segments_then_active_blocks() {
    for (_, file, _, _) in FIXTURES {
        let s = load(file);
        let seed = s.seed_events();
        let active: Vec<_> =
            s.segments.iter().flat_map(|g| g.blocks.iter().map(move |b| (g, b))).filter(|(_, b)| b.state.is_active()).collect();
        assert_eq!(seed.len(), s.segments.len() + active.len(), "{file}");
        let last_ts = s.traces[0].entries.last().map_or(0, |e| e.time_us * 1000);
        for (e, g) in seed.iter().zip(&s.segments) {
            let want = if g.is_expandable { EventKind::Map } else { EventKind::MemAlloc };
            assert_eq!((e.kind(), e.addr, e.size, e.handle), (Some(want), g.address, g.total_size, 0), "{file}");
            // Every segment of PyTorch's snapshot is the caching allocator's.
            assert_eq!((e.flags, e.ts_ns), (F_SRC_SNAPSHOT | F_FRAMEWORK_OWNED, last_ts));
        }
        for (e, (_, b)) in seed[s.segments.len()..].iter().zip(&active) {
            assert_eq!(e.kind(), Some(EventKind::BlockAlloc));
            assert_eq!((e.addr, e.size, e.requested), (b.address, b.size, b.requested_size), "{file}");
            assert_eq!(e.flags, F_SRC_SNAPSHOT | F_BLOCK_SIZE_KNOWN);
            assert_eq!(b.state, BlockState::ActiveAllocated, "{file}: no pending frees in these traces");
        }
    }
}

/// A snapshot PyTorch took without history recording (`torch.cuda.memory._snapshot()` after a
/// GPT-2 run on the H200, its tensors gone: no trace, 203 segments of which 194 hold no block).
/// Every segment is the caching allocator's, empty or not: `gpufrag analyze` must say what the
/// segments say (releasable = what `empty_cache()` would return, the largest free block among
/// all of them), which it did not when segments were taken to be the cache's only once a block
/// was seen in them (non_framework 24,027,070,464, releasable 0, largest free block 8 MiB).
#[test]
fn a_snapshot_without_history_counts_its_empty_segments_as_cache() {
    let file = "gpt2_cache_no_history.pickle";
    let snap = load(file);
    assert_eq!(snap.entry_count(), 0, "no history was recorded");
    let st = snap.device_stats(0);
    // What the segments themselves say (PyTorch's own sums; reserved and the largest free block
    // are also what the script printed from memory_stats() and the same snapshot).
    assert_eq!(st.all.reserved_bytes, 24_104_665_088);
    assert_eq!(st.largest_free_block, 2_703_228_928);
    assert_eq!(st.releasable_bytes, 24_027_070_464);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["analyze", "--json"])
        .arg(fixture(file))
        .output()
        .expect("run gpufrag");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let d = &v["devices"][0];
    let got = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("no {k} in {d}"));
    assert_eq!(got("reserved"), st.all.reserved_bytes);
    assert_eq!(got("framework_reserved"), st.all.reserved_bytes);
    assert_eq!(got("non_framework"), 0);
    assert_eq!(got("allocated"), st.all.allocated_bytes);
    assert_eq!(got("stranded"), st.all.inactive_split_bytes);
    assert_eq!(got("releasable"), st.releasable_bytes);
    assert_eq!(got("largest_free_block"), st.largest_free_block);
    assert_eq!(got("segments"), st.segment_entries);
}

/// The one replay (`input::Loaded::replay`, which the report's timeline and `top --replay` play)
/// rebuilds, from empty, the state `analyze` reports, for every fixture and for each of them
/// with its ring cut to its second half (a truncated ring: the replay starts from the rebuilt
/// state at the ring's first entry).
#[test]
fn loaded_replay_rebuilds_the_analyzed_state_whole_and_truncated_rings() {
    for (_, file, _, _) in FIXTURES {
        let whole = gpufrag::input::load(&fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut cut = load(file);
        let n = cut.traces[0].entries.len();
        cut.traces[0].entries.drain(..n / 2);
        let truncated = gpufrag::input::replay_snapshot(&cut);
        for (what, loaded) in [("whole", whole), ("truncated", truncated)] {
            let mut replayed = gpufrag::ingest::State::new(loaded.rules.clone());
            replayed.apply_all(&loaded.replay);
            assert!(loaded.complete, "{file} ({what}): the replay should reproduce the final segments; notes {:?}", loaded.notes);
            for d in loaded.state.device_ids() {
                let (got, want) = (replayed.device_figures(d), loaded.state.device_figures(d));
                assert_eq!(got, want, "{file} ({what}) device {d}: replay {got:?} vs loaded {want:?}; notes {:?}", loaded.notes);
            }
            assert_eq!(replayed.ooms.len(), loaded.state.ooms.len(), "{file} ({what}): OOMs replayed vs loaded");
        }
    }
}
