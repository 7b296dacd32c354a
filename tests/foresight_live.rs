//! foresight live (issue 24 item 1): `gpufrag run` of a stand-in PyTorch training loop
//! (tests/python_hook/tracker/grow.py on the stand-in torch and libc10_cuda.so, its trace
//! tracker built by the hook, its driver calls through the real shim on simcuda with a memory
//! limit) whose activation grows each step until it OOMs: the warning comes at least one step
//! before the failing step starts, its predicted peak is the failing request's figures (reserved
//! then + the request, as the program itself printed them at its OOM), and `analyze` of the
//! run's record gives the same warnings. Under a cap (`set_per_process_memory_fraction`) the
//! prediction is judged against the allowed bytes, not the device; `--foresight-steps` sets how
//! far it looks (0: off). A loop that repeats with room gives forecasts and no
//! warning; one too short to show a step gives a note and no warning.

use gpufrag::event::EventKind;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

use tracker::root;

#[path = "common/tracker.rs"]
mod tracker;

/// The stand-ins' scratch folder (tests/common/tracker.rs) and this test's runs in it.
struct Scratch(tracker::Scratch);

impl std::ops::Deref for Scratch {
    type Target = tracker::Scratch;
    fn deref(&self) -> &tracker::Scratch {
        &self.0
    }
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(tracker::Scratch::new("foresight", name))
    }

    /// `gpufrag run --record` of grow.py with `args` on a 256 MiB simulated device (16 MiB the
    /// driver's): (summary, output, record path).
    fn run(&self, tag: &str, args: &[&str]) -> (Value, Output, PathBuf) {
        self.run_with(tag, &[], args, &[])
    }

    /// [`Scratch::run`] with more `gpufrag run` flags and environment for the program.
    fn run_with(&self, tag: &str, flags: &[&str], args: &[&str], env: &[(&str, &str)]) -> (Value, Output, PathBuf) {
        let bin = Path::new(env!("CARGO_BIN_EXE_gpufrag"));
        let simcuda = bin.with_file_name("simcuda");
        assert!(simcuda.join("libcuda.so.1").exists(), "{} has no libcuda.so.1: build the workspace", simcuda.display());
        let summary = self.dir.join(format!("{tag}.json"));
        let rec = self.dir.join(format!("{tag}.rec"));
        let out = Command::new(bin)
            .args(["run", "--no-report", "--no-feed", "--torch-tracker=build", "--summary-json"])
            .arg(&summary)
            .arg("--record")
            .arg(&rec)
            .args(flags)
            .arg("--")
            .arg("python3")
            .arg(root().join("tests/python_hook/tracker/grow.py"))
            .args(args)
            .env("PYTHONPATH", root().join("tests/python_hook/tracker"))
            .env("FAKE_TORCH_LIB", self.dir.join("lib"))
            .env("XDG_CACHE_HOME", self.dir.join("cache"))
            .env("LD_LIBRARY_PATH", &simcuda)
            .env("SIMCUDA_MEM", "256MiB")
            .env("SIMCUDA_RESERVE", "16MiB")
            .env("SIMCUDA_STATE_DIR", self.dir.join("state"))
            .env_remove("CXX")
            .envs(env.iter().copied())
            .output()
            .expect("run gpufrag");
        let text = std::fs::read_to_string(&summary).unwrap_or_else(|e| {
            panic!("no summary: {e}\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        });
        (serde_json::from_str(&text).expect("summary json"), out, rec)
    }
}

fn notes(s: &Value) -> String {
    s["notes"].as_array().map(|n| n.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n")).unwrap_or_default()
}

/// `key=value` of the program's line starting with `head`.
fn field(stdout: &str, head: &str, key: &str) -> Option<u64> {
    let line = stdout.lines().find(|l| l.starts_with(head))?;
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).and_then(|v| v.parse().ok())
}

fn analyze(rec: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("analyze").arg("--json").arg(rec).output().expect("analyze");
    assert!(out.status.code().is_some_and(|c| c <= 1), "analyze of the record: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("analyze json: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn a_growing_sequence_length_is_warned_a_step_before_its_oom_with_the_failing_requests_figures_and_the_record_replays_the_warnings() {
    let sc = Scratch::new("grow");
    // weights 40 MiB; per step an activation of 20 + 8k MiB and a 16 MiB temporary; 0.2 s a step
    let (s, out, rec) = sc.run("grow", &["40", "20", "8", "16", "60", "0.2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let n = field(&stdout, "OOM ", "step").unwrap_or_else(|| panic!("the program did not OOM:\n{stdout}\n{stderr}"));
    let oom_reserved = field(&stdout, "OOM ", "reserved").expect("reserved");
    let oom_request = field(&stdout, "OOM ", "request").expect("request");
    let step_start = |k: u64| field(&stdout, &format!("STEP {k} "), "t").unwrap_or_else(|| panic!("no STEP {k}:\n{stdout}"));
    let warnings = s["warnings"].as_array().unwrap_or_else(|| panic!("no warnings list: {s:#}"));
    assert!(!warnings.is_empty(), "no warning before the OOM at step {n}:\n{}\n{stderr}", notes(&s));
    let first = &warnings[0];
    let ts = first["ts_ns"].as_u64().expect("ts_ns");
    eprintln!(
        "OOM at step {n} (reserved {} MiB + {} MiB asked); {} warning(s), the first {:.2} s before step {n} began, {} step(s) ahead: {first}",
        oom_reserved / MIB,
        oom_request / MIB,
        warnings.len(),
        (step_start(n) as f64 - ts as f64) / 1e9,
        first["steps_ahead"]
    );
    assert!(ts < step_start(n), "the first warning ({ts}) came after the failing step {n} began ({}): {first}", step_start(n));
    for w in warnings {
        assert_eq!(w["pid"], s["ooms"][0]["pid"], "{w}");
        assert_eq!(w["device"].as_i64(), Some(0), "{w}");
        assert!(w["steps_ahead"].as_u64().is_some_and(|a| a >= 1), "{w}");
        assert!(w["ts_ns"].as_u64().is_some_and(|t| t < step_start(n)), "a warning after the failing step began: {w}");
        assert_eq!(
            w["predicted_peak"].as_u64(),
            Some(oom_reserved + oom_request),
            "predicted peak vs the program's own OOM figures ({oom_reserved} reserved + {oom_request} asked): {w}"
        );
        assert!(w["available"].as_u64().is_some_and(|a| a < oom_reserved + oom_request), "{w}");
        let fix = w["fix"].as_str().unwrap_or("");
        assert!(fix.contains("PYTORCH_CUDA_ALLOC_CONF=") || fix.contains("checkpoint now"), "{fix}");
    }
    // gpufrag's own OOM record says the same figures
    let o = &s["ooms"][0];
    assert_eq!((o["reserved"].as_u64(), o["requested"].as_u64()), (Some(oom_reserved), Some(oom_request)), "{o}");
    assert!(stderr.contains("WARNING pid") && stderr.contains("predicted OOM"), "the live line: {stderr}");
    // the record replays to the same warnings
    let a = analyze(&rec);
    assert_eq!(a["warnings"], s["warnings"], "analyze of the record vs the live run");
}

#[test]
fn a_loop_that_repeats_with_room_is_forecast_and_never_warned() {
    let sc = Scratch::new("periodic");
    let (s, out, rec) = sc.run("periodic", &["40", "30", "0", "16", "12", "0.1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("DONE steps=12"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(s["warnings"].as_array().map(Vec::len), Some(0), "{:#}", s["warnings"]);
    let events = gpufrag::record::read(&rec).expect("record").events;
    let forecasts: Vec<_> = events.iter().filter(|e| e.kind() == Some(EventKind::Forecast)).collect();
    assert!(!forecasts.is_empty(), "no forecast was made: {}", notes(&s));
    // every forecast fits: 40 + 30 + 16 MiB of a 236 MiB device's allocatable memory
    for f in &forecasts {
        assert_eq!(f.handle, 0, "{f:?}");
        assert_eq!(f.size, 86 * MIB, "the predicted peak of a periodic step is what it holds: {f:?}");
    }
}

#[test]
fn a_run_too_short_to_show_a_step_gets_a_note_and_no_warning() {
    let sc = Scratch::new("short");
    let (s, out, _) = sc.run("short", &["40", "30", "100", "16", "2", "0.3"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("DONE steps=2"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(s["warnings"].as_array().map(Vec::len), Some(0), "{:#}", s["warnings"]);
    let n = notes(&s);
    assert!(
        n.contains("foresight for process") && n.contains("no prediction") && (n.contains("too few") || n.contains("no repeating step")),
        "{n}"
    );
}

#[test]
fn under_a_memory_fraction_the_warning_is_judged_against_the_allowed_bytes_before_the_cap_oom() {
    let sc = Scratch::new("cap");
    // a device whose total is 240 MiB (256 MiB less simcuda's 16 MiB) capped at half: 120 MiB
    // allowed; per step 40 + (20 + 4k) + 16 MiB, so the cap fails step 12 while the device alone
    // would last to step 40
    let (s, out, rec) = sc.run_with("cap", &[], &["40", "20", "4", "16", "60", "0.15"], &[("GROW_FRACTION", "0.5")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let n = field(&stdout, "OOM ", "step").unwrap_or_else(|| panic!("the program did not OOM at its cap:\n{stdout}\n{stderr}"));
    let allowed = field(&stdout, "OOM ", "allowed").expect("allowed");
    assert_eq!(allowed, 120 * MIB, "the program's own cap");
    assert_eq!(n, 12, "the cap fails step 12 (40 + 20 + 4*12 + 16 > 120 MiB): {stdout}");
    let oom_reserved = field(&stdout, "OOM ", "reserved").expect("reserved");
    let oom_request = field(&stdout, "OOM ", "request").expect("request");
    let step_start = |k: u64| field(&stdout, &format!("STEP {k} "), "t").unwrap_or_else(|| panic!("no STEP {k}:\n{stdout}"));
    let warnings = s["warnings"].as_array().unwrap_or_else(|| panic!("no warnings list: {s:#}"));
    assert!(!warnings.is_empty(), "no warning before the cap's OOM at step {n}:\n{}\n{stderr}", notes(&s));
    eprintln!("cap OOM at step {n}; {} warning(s), the first: {}", warnings.len(), warnings[0]);
    for w in warnings {
        assert!(w["ts_ns"].as_u64().is_some_and(|t| t < step_start(n)), "a warning after the failing step began: {w}");
        assert_eq!(w["available"].as_u64(), Some(allowed), "judged against the cap ({allowed} B), not the device: {w}");
        assert_eq!(
            w["predicted_peak"].as_u64(),
            Some(oom_reserved + oom_request),
            "vs the program's OOM ({oom_reserved} + {oom_request}): {w}"
        );
    }
    assert_eq!(s["ooms"][0]["allowed"].as_u64(), Some(allowed), "the OOM's allowed bytes: {:#}", s["ooms"][0]);
    assert_eq!(analyze(&rec)["warnings"], s["warnings"], "analyze of the record vs the live run");
}

#[test]
fn foresight_steps_sets_how_far_ahead_and_zero_turns_it_off() {
    let sc = Scratch::new("steps");
    let args = ["40", "20", "8", "16", "60", "0.15"];
    let (s, out, _) = sc.run_with("two", &["--foresight-steps", "2"], &args, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let n = field(&stdout, "OOM ", "step").unwrap_or_else(|| panic!("the program did not OOM:\n{stdout}"));
    let warnings = s["warnings"].as_array().expect("warnings");
    assert!(!warnings.is_empty(), "no warning with 2 steps ahead: {}", notes(&s));
    for w in warnings {
        assert!(w["steps_ahead"].as_u64().is_some_and(|a| (1..=2).contains(&a)), "looked further than 2 steps: {w}");
    }
    let (s, out, rec) = sc.run_with("off", &["--foresight-steps", "0"], &args, &[]);
    assert_eq!(field(&String::from_utf8_lossy(&out.stdout), "OOM ", "step"), Some(n), "the same program");
    assert_eq!(s["warnings"].as_array().map(Vec::len), Some(0), "{:#}", s["warnings"]);
    assert!(notes(&s).contains("foresight: off (--foresight-steps 0)"), "{}", notes(&s));
    let events = gpufrag::record::read(&rec).expect("record").events;
    assert_eq!(events.iter().filter(|e| e.kind() == Some(EventKind::Forecast)).count(), 0, "a forecast with foresight off");
    assert_eq!(s["ooms"].as_array().map(Vec::len), Some(1), "the OOM is still judged: {:#}", s["ooms"]);
}
