//! whatif against ground truth measured on an H200 with PyTorch 2.11 (`gpu/whatif_truth.sh`,
//! fixtures in `tests/fixtures/whatif/`, described in docs/gpu-validation.md): three deterministic
//! workloads (variable-shape training, a `torch.cat` KV cache, a fragmentation OOM), each run once
//! per allocator setting in a fresh process with history on, without a limit and under memory
//! fractions. The simulation of the defaults run's trace must predict every run: peak reserved to
//! the byte where it finished, and where it ran out of memory, that it did and the size of the
//! first request that failed. And the simulation of every kept trace under its own settings must
//! reproduce it (the self-check).

#![allow(clippy::unwrap_used)] // the JSON ground truth is read in helpers, outside #[test] functions

use gpufrag::alloc::pytorch::AllocConf;
use gpufrag::sim::{self, Limits, Scenario};
use gpufrag::snapshot;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

#[derive(Debug)]
struct Run {
    tag: String,
    workload: String,
    alloc_conf: String,
    allowed: Option<u64>,
    device_total: u64,
    oom: bool,
    oom_rounded: Option<u64>,
    oom_alloc_size: Option<u64>,
    peak_reserved: u64,
    peak_allocated: u64,
    num_alloc_retries: u64,
    num_device_alloc: u64,
    num_device_free: u64,
}

fn truth() -> Vec<Run> {
    let text = std::fs::read_to_string(fixture("whatif/truth.json")).expect("truth.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("truth.json parses");
    let u = |x: &serde_json::Value, k: &str| x[k].as_u64();
    let n = |x: &serde_json::Value, k: &str| x[k].as_u64().unwrap_or_else(|| panic!("truth.json: {k} is a number"));
    let t = |x: &serde_json::Value, k: &str| x[k].as_str().unwrap_or_else(|| panic!("truth.json: {k} is a string")).to_string();
    v.as_array()
        .expect("truth.json is a list")
        .iter()
        .map(|x| Run {
            tag: t(x, "tag"),
            workload: t(x, "workload"),
            alloc_conf: t(x, "alloc_conf"),
            allowed: u(x, "allowed"),
            device_total: n(x, "device_total"),
            oom: x["oom"].as_bool().unwrap_or_else(|| panic!("truth.json: oom is a bool")),
            oom_rounded: u(x, "oom_rounded"),
            oom_alloc_size: u(x, "oom_alloc_size"),
            peak_reserved: n(x, "peak_reserved"),
            peak_allocated: n(x, "peak_allocated"),
            num_alloc_retries: n(x, "num_alloc_retries"),
            num_device_alloc: n(x, "num_device_alloc"),
            num_device_free: n(x, "num_device_free"),
        })
        .collect()
}

/// The 42 of the 80 H200 runs whose traces CI keeps (1.1 MB, docs/gpu-validation.md): every
/// frag run, the kvcache and train runs below. The self-check runs on exactly these, so a fixture
/// that goes missing, or one added without its ground truth, fails it.
const KEPT: &[&str] = &[
    "frag_s0_lim10g",
    "frag_s0_lim11g",
    "frag_s0_lim12g",
    "frag_s0_nolimit",
    "frag_s1_lim10g",
    "frag_s1_lim11g",
    "frag_s1_lim12g",
    "frag_s1_nolimit",
    "frag_s2_lim10g",
    "frag_s2_lim11g",
    "frag_s2_lim12g",
    "frag_s2_nolimit",
    "frag_s3_lim10g",
    "frag_s3_lim11g",
    "frag_s3_lim12g",
    "frag_s3_nolimit",
    "frag_s4_lim10g",
    "frag_s4_lim11g",
    "frag_s4_lim12g",
    "frag_s4_nolimit",
    "frag_s5_lim10g",
    "frag_s5_lim11g",
    "frag_s5_lim12g",
    "frag_s5_nolimit",
    "frag_s6_lim10g",
    "frag_s6_lim11g",
    "frag_s6_lim12g",
    "frag_s6_nolimit",
    "frag_s7_lim10g",
    "frag_s7_lim11g",
    "frag_s7_lim12g",
    "frag_s7_nolimit",
    "kvcache_s0_nolimit",
    "kvcache_s0_tight",
    "kvcache_s1_nolimit",
    "kvcache_s1_tight",
    "kvcache_s5_tight",
    "kvcache_s7_tight",
    "train_s0_nolimit",
    "train_s1_nolimit",
    "train_s3_tight",
    "train_s6_tight",
];

fn stream(file: &str) -> sim::RequestStream {
    let snap = snapshot::load(&fixture(file)).unwrap_or_else(|e| panic!("{e}"));
    sim::from_snapshot(&snap).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn the_defaults_trace_predicts_every_run_of_its_workload() {
    let runs = truth();
    assert_eq!(runs.len(), 80, "80 runs: 3 workloads × 8 settings × (no limit + 2 or 3 limits)");
    let mut exact = 0;
    let mut failures = Vec::new();
    let mut counters_differ = Vec::new();
    for w in ["train", "kvcache", "frag"] {
        let s = stream(&format!("whatif/{w}_s0_nolimit.pickle.gz"));
        for r in runs.iter().filter(|r| r.workload == w) {
            let conf = AllocConf::parse(&r.alloc_conf).unwrap();
            let limits = Limits { memory_limit: r.allowed, device_capacity: None, device_total: r.device_total };
            let o = sim::simulate(&s, &Scenario { alloc_conf: r.alloc_conf.clone(), conf, limits }, false);
            let ok = match (&o.first_oom, r.oom) {
                (None, false) => o.counters.peak_reserved == r.peak_reserved,
                (Some(f), true) => Some(f.oom.rounded) == r.oom_rounded && Some(f.oom.alloc_size) == r.oom_alloc_size,
                _ => false,
            };
            if ok {
                exact += 1;
            } else {
                failures.push(format!(
                    "{}: measured oom={} first failing {:?} (alloc {:?}) peak reserved {}; simulated oom={} first failing {:?} peak reserved {}",
                    r.tag,
                    r.oom,
                    r.oom_rounded,
                    r.oom_alloc_size,
                    r.peak_reserved,
                    o.first_oom.is_some(),
                    o.first_oom.as_ref().map(|f| f.oom.rounded),
                    o.counters.peak_reserved
                ));
            }
            let c = &o.counters;
            if (c.num_alloc_retries, c.num_device_alloc, c.num_device_free, c.peak_allocated)
                != (r.num_alloc_retries, r.num_device_alloc, r.num_device_free, r.peak_allocated)
            {
                counters_differ.push(r.tag.clone());
            }
        }
    }
    assert!(failures.is_empty(), "{exact} of {} exact; not exact:\n{}", runs.len(), failures.join("\n"));
    // the secondary counters agree everywhere but in one run, where the simulator's own driver
    // addresses break a tie between equal-sized blocks of two segments differently
    // (docs/gpu-validation.md); its own trace reproduces it exactly (see the self-check below)
    assert_eq!(counters_differ, vec!["train_s6_tight".to_string()], "runs whose retries/device calls/peak allocated differ");
}

#[test]
fn every_kept_trace_reproduces_itself_under_its_own_settings() {
    let runs = truth();
    let dir = fixture("whatif");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(tag) = name.strip_suffix(".pickle.gz") else { continue };
        let r = runs.iter().find(|r| r.tag == tag).unwrap_or_else(|| panic!("{tag} in truth.json"));
        let s = stream(&format!("whatif/{name}"));
        assert_eq!(s.conf, AllocConf::parse(&r.alloc_conf).unwrap(), "{tag}: the trace's own settings");
        let limits = Limits { memory_limit: r.allowed, device_capacity: None, device_total: r.device_total };
        let c = sim::self_check(&s, &limits);
        assert!(c.faithful, "{tag}: {:?}", c.divergence);
        let o = sim::simulate(&s, &Scenario { alloc_conf: r.alloc_conf.clone(), conf: s.conf.clone(), limits }, true);
        assert_eq!(
            (o.counters.peak_reserved, o.counters.num_alloc_retries, o.counters.num_device_alloc, o.counters.num_device_free),
            (r.peak_reserved, r.num_alloc_retries, r.num_device_alloc, r.num_device_free),
            "{tag}: peak reserved, retries, device allocs and frees of the replayed baseline"
        );
        assert_eq!(o.first_oom.is_some(), r.oom, "{tag}");
        checked.push(tag.to_string());
    }
    checked.sort();
    let mut kept: Vec<String> = KEPT.iter().map(|t| t.to_string()).collect();
    kept.sort();
    assert_eq!(checked, kept, "the traces checked are exactly the kept set");
}

#[test]
fn the_older_fixtures_reproduce_themselves() {
    // frag_oom ran against a balloon: its limit is the device, which its oom entry implies
    for (file, faithful) in [
        ("frag_oom.pickle", true),
        ("pinned_splits.pickle", true),
        ("gpt2_varlen.pickle.gz", true),
        // recorded against an unknown balloon with no oom entry: the limit that made PyTorch
        // unmap before mapping cannot be known from the trace, and the check says where
        ("frag_oom_expandable.pickle", false),
    ] {
        let s = stream(file);
        let limits = Limits { device_capacity: s.device_capacity_hint, ..Limits::default() };
        let c = sim::self_check(&s, &limits);
        assert_eq!(c.faithful, faithful, "{file}: {:?}", c.divergence);
        if !faithful {
            let d = c.divergence.unwrap();
            assert_eq!(d.entry, Some(70), "{file}: {}", d.what);
            assert!(d.what.contains("segment_unmap") && d.what.contains("--device-memory"), "{}", d.what);
        }
    }
}

#[test]
fn the_frag_oom_trace_predicts_its_expandable_twin() {
    // the same program with expandable_segments:True (traces/frag_oom_expandable): no OOM, and
    // its final reserved bytes
    let s = stream("frag_oom.pickle");
    let conf = AllocConf::parse("expandable_segments:True").unwrap();
    let limits = Limits { device_capacity: s.device_capacity_hint, ..Limits::default() };
    let o = sim::simulate(&s, &Scenario { alloc_conf: conf.conf.clone(), conf, limits }, false);
    assert!(o.first_oom.is_none());
    assert_eq!(o.figures.reserved, 11_072_962_560);
    assert_eq!(o.figures.allocated, 11_072_962_560);
}

/// Issue 13: the verdict of a failure under `set_per_process_memory_fraction` simulates the
/// settings under the same cap. frag's defaults run at 11 GiB allowed ran out of memory at its
/// 2.5 GiB request; on the H200 the same program fit under expandable segments and
/// `max_split_size_mb` (truth.json). The OOM entry carries the allowed bytes as `run` records them.
#[test]
fn regression_an_oom_under_the_allowed_bytes_is_simulated_under_the_same_cap() {
    let file = fixture("whatif/frag_s0_lim11g.pickle.gz");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("analyze").arg("--json").arg(&file).output().expect("analyze");
    let mut s: gpufrag::analysis::summary::Summary =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let runs = truth();
    let own = runs.iter().find(|r| r.tag == "frag_s0_lim11g").expect("the run");
    let allowed = own.allowed.expect("a cap");
    assert_eq!(s.ooms.len(), 1, "{:?}", s.ooms);
    s.ooms[0].allowed = Some(allowed);
    s.whatif = None;
    let opened = gpufrag::input::open(&file, gpufrag::input::Accept::Traces).expect("opens");
    gpufrag::sim::apply_to_summary(&mut s, |cut| gpufrag::sim::stream_of(&opened, cut));
    let w = s.whatif.as_ref().unwrap_or_else(|| panic!("no simulation: {:?}", s.notes));
    assert!(w.faithful);
    assert!(w.baseline.oom && w.baseline.first_oom_requested == Some(own.oom_rounded.expect("its OOM")), "{w:?}");
    assert!(!w.best.oom, "a setting fits under 11 GiB on the H200: {w:?}");
    let fits: Vec<&Run> = runs.iter().filter(|r| r.workload == "frag" && r.allowed == Some(allowed) && !r.oom).collect();
    // The trace ends at its OOM (the program stopped there), so the simulated peak is the peak up
    // to the failing request, not the whole program's: the setting is checked, not the peak.
    assert!(
        fits.iter().any(|r| r.alloc_conf == w.best.alloc_conf),
        "the best setting {w:?} is one that fit under the cap on the H200: {:?}",
        fits.iter().map(|r| (&r.alloc_conf, r.peak_reserved)).collect::<Vec<_>>()
    );
    assert!(w.best.peak_reserved <= allowed, "{w:?}");
    let fix = &s.ooms[0].fix;
    assert!(fix.starts_with("Under the allowed 11.00 GiB") && fix.contains(&format!("--memory-limit {allowed}")), "{fix}");
}
