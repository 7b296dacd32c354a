//! The capacity answers of `gpufrag whatif`, checked from outside: every least memory that
//! `--min-memory` finds is simulated again by a plain `whatif --memory-limit` run at that limit
//! (every request succeeds) and one allocation granule below it (a request fails), on the real
//! H200 traces of tests/fixtures; `--together` is checked against what each trace needs alone.

#![allow(clippy::unwrap_used)] // the CLI's JSON output is read in helpers, outside #[test] functions

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GRANULE: u64 = 2 << 20;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn gpufrag(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).output().expect("run gpufrag")
}

fn json(args: &[&str]) -> Value {
    let out = gpufrag(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Does the trace survive under `conf` with `limit` allowed bytes, by a plain whatif run on an
/// H200 (the card `--min-memory` assumes; not the card the trace's own OOM implies)? The
/// trace's own setting is the baseline row, any other the scenario row.
fn survives(file: &str, conf: &str, own: bool, limit: u64) -> bool {
    let l = limit.to_string();
    let v = json(&["whatif", file, "--json", "--alloc-conf", conf, "--memory-limit", &l, "--device-memory", "150109880320"]);
    let row = if own { &v["scenarios"][0] } else { &v["scenarios"][1] };
    assert_eq!(row["alloc_conf"], conf, "{row}");
    assert_eq!(row["memory_limit"], limit, "{row}");
    !row["oom"].as_bool().unwrap()
}

fn check_min_memory(name: &str, settings_checked: &mut usize) {
    let f = fixture(name);
    let file = f.to_str().unwrap();
    let v = json(&["whatif", file, "--min-memory", "--json"]);
    assert_eq!(v["granule"], GRANULE);
    let floor = v["peak_live_requested"].as_u64().unwrap();
    let rows = v["min_memory"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "{name}: the trace's own settings and the 11 others of the sweep");
    for r in rows {
        let conf = r["alloc_conf"].as_str().unwrap();
        let own = r["own"].as_bool().unwrap();
        let x = r["bytes"].as_u64().unwrap_or_else(|| panic!("{name} {conf}: no least memory found: {r}"));
        assert_eq!(x % GRANULE, 0, "{name} {conf}: {x} is not a whole number of granules");
        assert!(x >= floor, "{name} {conf}: {x} below the {floor} bytes the program held at once");
        assert!(survives(file, conf, own, x), "{name} {conf}: does not survive at the found {x} bytes");
        assert!(!survives(file, conf, own, x - GRANULE), "{name} {conf}: survives one granule below, at {} bytes", x - GRANULE);
        *settings_checked += 1;
    }
    let s = v["sentence"].as_str().unwrap();
    assert!(s.starts_with("fits in ") || s.starts_with("needs "), "{name}: {s}");
}

#[test]
fn min_memory_survives_at_the_found_limit_and_fails_one_granule_below_on_real_traces() {
    let mut checked = 0;
    for name in ["frag_oom.pickle", "pinned_splits.pickle", "whatif/kvcache_s0_nolimit.pickle.gz", "whatif/train_s0_nolimit.pickle.gz"] {
        check_min_memory(name, &mut checked);
    }
    assert_eq!(checked, 48);
}

#[test]
fn min_memory_sentence_names_expandable_segments_and_the_defaults_for_the_fragmentation_trace() {
    let f = fixture("frag_oom.pickle");
    let v = json(&["whatif", f.to_str().unwrap(), "--min-memory", "--json"]);
    let by = |c: &str| v["min_memory"].as_array().unwrap().iter().find(|r| r["alloc_conf"] == c).unwrap()["bytes"].as_u64().unwrap();
    // the H200 run: 12 GiB allowed fails under the defaults (frag_s0_lim12g), expandable
    // segments peak at 10.31 GiB
    assert_eq!(by(""), 13_170_114_560, "defaults");
    assert_eq!(by("expandable_segments:True"), 11_072_962_560, "expandable segments");
    assert_eq!(v["sentence"], "fits in 10.31 GiB with expandable segments; needs 12.27 GiB with the defaults");
    let text = gpufrag(&["whatif", f.to_str().unwrap(), "--min-memory"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("fits in 10.31 GiB with expandable segments; needs 12.27 GiB with the defaults"));
}

#[test]
fn together_fits_on_a_card_with_room_and_not_on_one_below_what_one_trace_holds_alone() {
    let a = fixture("frag_oom.pickle");
    let b = fixture("pinned_splits.pickle");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let alone = |f: &str| json(&["whatif", f, "--min-memory", "--json"])["peak_live_requested"].as_u64().unwrap();
    let (la, lb) = (alone(a), alone(b));
    // a card holding both unlimited peaks side by side: every setting fits
    let roomy = json(&["whatif", a, b, "--together", "--device-memory", "24GiB", "--json"]);
    let rows = roomy["together"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "each its own settings, then the 11 others of the sweep");
    assert_eq!(rows[0]["alloc_conf"], "own");
    for r in rows {
        assert_eq!(r["fits"], true, "{r}");
        let p = r["peak_reserved"].as_array().unwrap();
        assert!(r["peak_combined"].as_u64().unwrap() <= 24 << 30, "{r}");
        assert!(r["peak_combined"].as_u64().unwrap() >= la.max(lb), "{r}");
        assert!(p[0].as_u64().unwrap() >= la && p[1].as_u64().unwrap() >= lb, "{r}");
    }
    assert_eq!(roomy["sentence"], "They fit together as they are.");
    // a card smaller than what the two held at once at their peaks cannot hold them
    let card = (la + lb) * 9 / 10;
    let tight = json(&["whatif", a, b, "--together", "--device-memory", &card.to_string(), "--json"]);
    let rows = tight["together"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["fits"] == false), "{tight}");
    for r in rows.iter().filter(|r| r["fits"] == false) {
        assert!(r["first_oom_requested"].as_u64().unwrap() > 0, "{r}");
        assert!(r["failed_index"].as_u64().unwrap() <= 1, "{r}");
    }
}

#[test]
fn a_second_trace_without_together_and_together_without_a_second_trace_are_errors() {
    let a = fixture("frag_oom.pickle");
    let a = a.to_str().unwrap();
    let out = gpufrag(&["whatif", a, a]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--together"));
    let out = gpufrag(&["whatif", a, "--together"]);
    assert_ne!(out.status.code(), Some(0));
}
