//! The Python start-up hook's plumbing under `gpufrag run`: the import hook wraps
//! `torch.cuda._lazy_init`, the hook says a caching allocator is in charge, attaches the OOM
//! observer, sends allocator snapshots and the OOM, and the consumer turns them into block-level
//! figures and a fragmentation verdict. CI has no PyTorch: tests/python_hook/torch is a stand-in
//! for the handful of torch functions the hook calls, returning the real frag_oom snapshot
//! recorded on the H200. The real PyTorch path is checked on the GPU (docs/gpu-validation.md).

use gpufrag::event::EventKind;
use gpufrag::ingest::State;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

#[test]
fn hook_brings_blocks_and_the_oom_verdict() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("gpufrag-pyhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let summary = dir.join("summary.json");
    let preload = Path::new(env!("CARGO_BIN_EXE_gpufrag")).with_file_name("libgpufrag_preload.so");
    if !preload.exists() {
        let st = Command::new(env!("CARGO")).args(["build", "-p", "gpufrag-preload"]).arg(if cfg!(debug_assertions) { "--profile=dev" } else { "--release" }).status().expect("cargo build");
        assert!(st.success());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "-q", "--no-report", "--no-feed", "--python-interval", "0.05", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg("python3")
        .arg(root.join("tests/python_hook/train.py"))
        .env("PYTHONPATH", root.join("tests/python_hook"))
        .env("FAKE_TORCH_SNAPSHOT", root.join("tests/fixtures/frag_oom.pickle"))
        .output()
        .expect("run gpufrag");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "gpufrag run failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("TRAIN done 1"), "the OOM observer was not attached at lazy init: {stdout}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let p = &s["processes"][0];
    assert_eq!(p["level"], "block", "{s:#}");
    assert_eq!(p["stranded"].as_u64(), Some(2_097_152_000), "{s:#}");
    assert_eq!(p["largest_free_block"].as_u64(), Some(209_715_200));
    assert_eq!(p["allocated"].as_u64(), Some(8_388_608_000));
    let ooms = s["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{s:#}");
    assert_eq!(ooms[0]["verdict"], "fragmentation");
    assert_eq!(ooms[0]["requested"].as_u64(), Some(2_684_354_560));
    assert_eq!(ooms[0]["device_free"].as_u64(), Some(2_398_224_384));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --record` with the hook: the record holds the hook's block events (each with its
/// requested size and its segment's stream), and replaying it gives exactly the snapshot's live
/// blocks (issue 15: a replay of the allocator's decisions reads block events from `run` records).
#[test]
fn a_run_record_holds_the_hooks_blocks_and_replays_to_the_snapshots_blocks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("gpufrag-pyhook-rec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rec = dir.join("run.rec");
    let fixture = root.join("tests/fixtures/frag_oom.pickle");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "-q", "--no-report", "--no-feed", "--python-interval", "0.05", "--record"])
        .arg(&rec)
        .arg("--")
        .arg("python3")
        .arg(root.join("tests/python_hook/train.py"))
        .env("PYTHONPATH", root.join("tests/python_hook"))
        .env("FAKE_TORCH_SNAPSHOT", &fixture)
        .output()
        .expect("run gpufrag");
    assert!(out.status.success(), "gpufrag run failed: {}", String::from_utf8_lossy(&out.stderr));
    let events = gpufrag::record::read(&rec).expect("the record").events;
    let snap = gpufrag::snapshot::load(&fixture).expect("the fixture");
    // The snapshot's live blocks: (address, extent, requested size, its segment's stream).
    let want: BTreeSet<(u64, u64, u64, u64)> = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().filter(|b| b.state.is_active()).map(move |b| (b.address, b.size, b.requested_size, s.stream)))
        .collect();
    assert!(!want.is_empty());
    let allocs: BTreeSet<(u64, u64, u64, u64)> = events
        .iter()
        .filter(|e| e.kind() == Some(EventKind::BlockAlloc))
        .map(|e| (e.addr, e.size, e.requested, e.stream))
        .collect();
    assert_eq!(allocs, want, "the record's BlockAlloc events are not the snapshot's blocks");
    let mut state = State::default();
    state.apply_all(&events);
    let got: BTreeSet<(u64, u64, u64)> = state.spaces.values().flat_map(|s| s.map.blocks().map(|b| (b.addr, b.size, b.requested))).collect();
    let want3: BTreeSet<(u64, u64, u64)> = want.iter().map(|&(a, s, r, _)| (a, s, r)).collect();
    assert_eq!(got.len(), want3.len(), "replayed {} blocks, the snapshot has {}", got.len(), want3.len());
    assert_eq!(got, want3, "the replayed blocks differ from the snapshot's");
    let _ = std::fs::remove_dir_all(&dir);
}
