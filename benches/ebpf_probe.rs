//! What gpufrag's uprobes cost a CUDA program: the time of one `cuMemAlloc_v2` + `cuMemFree_v2`
//! pair on the simcuda stand-in driver, with no probe, with a bare empty uprobe+uretprobe pair on
//! each of the two functions (the floor any uprobe tracer pays: the trap), and with gpufrag's own
//! programs on the same two functions (argument saving, out-pointer reads, ring buffer). The
//! figure that matters is the ratio of the last two (target: at most 1.2). A uprobe hit costs
//! about 16 µs on a virtualised CI machine against about 2.7 µs on the H200 host: compare ratios.
//!
//! `cargo bench -p gpufrag --bench ebpf_probe` (needs root or CAP_BPF + CAP_PERFMON, and a
//! built workspace for simcuda). `GPUFRAG_BENCH_PAIRS` sets the pairs per run (default 20000);
//! `GPUFRAG_BENCH_CUDA_PROG` names the test program's C source when the checkout has moved.

use gpufrag::ebpf::{ProbeError, ProbeOptions, Probes};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    None,
    Empty,
    Gpufrag,
}

fn profile_dir() -> PathBuf {
    // target/<profile>/deps/ebpf_probe-HASH
    let exe = std::env::current_exe().expect("bench executable");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

fn build_prog(dir: &Path) -> PathBuf {
    // GPUFRAG_BENCH_CUDA_PROG: the source elsewhere (a binary carried to a machine without
    // this checkout at its build path).
    let src = std::env::var_os("GPUFRAG_BENCH_CUDA_PROG")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ebpf_fixtures/cuda_prog.c"));
    let out = dir.join("cuda_prog_bench");
    let st = Command::new("cc").args(["-O2", "-o"]).arg(&out).arg(&src).args(["-ldl", "-lpthread"]).status().expect("cc");
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// One run: ns per pair as the program measured it, and the BPF programs' own run time per
/// pair (kernel run-time statistics), when probes were attached.
fn run_once(prog: &Path, simcuda: &Path, mode: Mode, pairs: u32) -> Result<(f64, Option<f64>), ProbeError> {
    let state = std::env::temp_dir().join(format!("gpufrag-bench-{}", std::process::id()));
    std::fs::create_dir_all(&state).ok();
    let gate = state.join("gate");
    let _ = std::fs::remove_file(&gate);
    let mut child = Command::new(prog)
        .arg("gate")
        .arg(&gate)
        .args(["bench", &pairs.to_string()])
        .env("LD_LIBRARY_PATH", simcuda)
        .env("SIMCUDA_STATE_DIR", &state)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start cuda_prog");
    let lib = simcuda.join("libcuda.so.1");
    let pid = child.id();
    let attach = || -> Result<Option<Probes>, ProbeError> {
        if mode == Mode::None {
            return Ok(None);
        }
        let mut p = Probes::load(&ProbeOptions::default(), "the benchmark")?;
        p.trace(pid)?;
        for f in ["cuMemAlloc_v2", "cuMemFree_v2"] {
            match mode {
                Mode::Empty => p.attach_empty(&lib, f)?,
                Mode::Gpufrag => p.attach_function(&lib, f)?,
                Mode::None => {}
            }
        }
        Ok(Some(p))
    };
    let mut probes = match attach() {
        Ok(p) => p,
        Err(e) => {
            // The program waits at its gate: end it rather than leave it behind.
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    std::fs::write(&gate, b"go").expect("gate");
    let mut events = 0usize;
    while child.try_wait().expect("wait").is_none() {
        if let Some(p) = probes.as_mut() {
            events += p.poll(Duration::from_millis(20)).len();
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(p) = probes.as_mut() {
        events += p.drain().len();
        if mode == Mode::Gpufrag {
            assert!(events >= 2 * pairs as usize, "gpufrag's probes reported {events} events for {pairs} pairs");
            assert_eq!(p.lost(), 0, "events lost during the benchmark");
        }
    }
    let bpf_ns = probes.as_ref().map(|p| {
        let stats = p.program_stats();
        if std::env::var_os("GPUFRAG_BENCH_VERBOSE").is_some() {
            for (n, cnt, ns) in stats.iter().filter(|(_, c, _)| *c > 0) {
                eprintln!("  {mode:?} {n}: {cnt} runs, {:.0} ns per run", *ns as f64 / *cnt as f64);
            }
        }
        let per_pair: u64 = stats.iter().filter(|(n, cnt, _)| *cnt > 0 && !n.starts_with("on_")).map(|(_, _, ns)| ns).sum();
        // The warm-up pairs ran under the probes too.
        per_pair as f64 / f64::from(pairs + 100)
    });
    let out = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout);
    let ns = text
        .lines()
        .find_map(|l| l.strip_prefix("BENCH ").and_then(|r| r.split("ns_per_pair=").nth(1)).and_then(|v| v.trim().parse::<f64>().ok()))
        .unwrap_or_else(|| panic!("no BENCH line in {text}"));
    Ok((ns, bpf_ns))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` runs bench targets with no `--bench` flag: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let simcuda = profile_dir().join("simcuda");
    if !simcuda.join("libcuda.so.1").exists() {
        eprintln!("ebpf_probe: {} has no libcuda.so.1; build the workspace first", simcuda.display());
        return;
    }
    let tmp = std::env::temp_dir().join(format!("gpufrag-bench-prog-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp");
    let prog = build_prog(&tmp);
    let pairs: u32 = std::env::var("GPUFRAG_BENCH_PAIRS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let reps = 7;
    let modes = [Mode::None, Mode::Empty, Mode::Gpufrag];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut bpf_runs: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let started = Instant::now();
    // Rounds interleave the modes, so that a machine whose speed drifts (shared cores) affects
    // each mode alike; the median of each mode is reported.
    for _ in 0..reps {
        for (i, &mode) in modes.iter().enumerate() {
            match run_once(&prog, &simcuda, mode, pairs) {
                Ok((ns, _)) => runs[i].push(ns),
                Err(e) => {
                    eprintln!("ebpf_probe: SKIPPED: {e}");
                    return;
                }
            }
        }
    }
    // Then, with the kernel's run-time statistics on (they add about 50 ns to every program run,
    // so the wall-clock rounds above run without them), the time spent inside the programs.
    {
        let _stats = Probes::enable_run_time_stats();
        for _ in 0..3 {
            for (i, &mode) in modes.iter().enumerate().skip(1) {
                if let Ok((_, Some(bpf))) = run_once(&prog, &simcuda, mode, pairs) {
                    bpf_runs[i].push(bpf);
                }
            }
        }
    }
    let mut results = Vec::new();
    for (mode, v) in modes.iter().zip(&runs) {
        let m = median(v.clone());
        println!("ebpf_probe/{mode:?}: median {m:.0} ns per alloc+free pair ({reps} runs of {pairs} pairs: {v:.0?})");
        results.push(m);
    }
    let (none, empty, ours) = (results[0], results[1], results[2]);
    if !bpf_runs[1].is_empty() && !bpf_runs[2].is_empty() {
        let (be, bo) = (median(bpf_runs[1].clone()), median(bpf_runs[2].clone()));
        println!("ebpf_probe: time inside the BPF programs per pair (kernel run-time stats): empty {be:.0} ns, gpufrag {bo:.0} ns");
    }
    println!(
        "ebpf_probe: gpufrag probes / empty uprobe+uretprobe pairs = {:.3} (target <= 1.2); probe cost per pair: empty {:.0} ns, gpufrag {:.0} ns ({:.2}x); {:.0} s",
        ours / empty,
        empty - none,
        ours - none,
        (ours - none) / (empty - none).max(1.0),
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
