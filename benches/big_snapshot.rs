//! `gpufrag analyze` of a 253k-entry GPT-2 snapshot against CPython's own `pickle.load` of the
//! same file, as whole processes (issue 23's target: at most half the time). The snapshot is
//! scripts/big_snapshot.py's (the GPT-2 fixture's ring played 7 times, the last 253,000 entries
//! kept: 24.1 MB of protocol-4 pickle), made once into the target directory. The two commands
//! are measured in one run, A then B, each sample a spawn of the whole process. The memory half
//! of the target is a test (`big_inputs`): peak memory does not move with the machine's load.
//!
//! Run: `cargo bench --bench big_snapshot`; medians and the ratio in docs/benchmarks.md. Needs
//! the release build of `gpufrag` (`cargo build --release`) and python3.

use criterion::{criterion_group, Criterion};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The 253k-entry snapshot, made on first use beside the build's output.
fn snapshot() -> PathBuf {
    let out = root().join("target/tmp/bench-gpt2_253k.pickle");
    if !out.exists() {
        std::fs::create_dir_all(out.parent().expect("parent")).expect("target/tmp");
        let made = Command::new("python3")
            .arg(root().join("scripts/big_snapshot.py"))
            .arg(root().join("tests/fixtures/gpt2_varlen.pickle.gz"))
            .arg(&out)
            .output()
            .expect("python3 runs scripts/big_snapshot.py");
        assert!(made.status.success(), "big_snapshot.py: {}", String::from_utf8_lossy(&made.stderr));
    }
    out
}

fn run(cmd: &mut Command) {
    let st = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().expect("spawn");
    assert!(st.success(), "{cmd:?}: {st}");
}

fn benches(c: &mut Criterion) {
    let snap = snapshot();
    let gpufrag = root().join("target/release/gpufrag");
    assert!(gpufrag.is_file(), "build it first: cargo build --release ({})", gpufrag.display());
    let load = format!("import pickle; pickle.load(open({:?}, 'rb'))", snap.display().to_string());
    let mut g = c.benchmark_group("snapshot_253k");
    g.sample_size(10).measurement_time(Duration::from_secs(15));
    g.bench_function("gpufrag_analyze", |b| b.iter(|| run(Command::new(&gpufrag).arg("analyze").arg(&snap))));
    g.bench_function("cpython_pickle_load", |b| b.iter(|| run(Command::new("python3").args(["-c", &load]))));
    g.finish();
}

criterion_group!(group, benches);

fn main() {
    group();
    criterion::Criterion::default().configure_from_args().final_summary();
}
