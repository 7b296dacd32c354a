//! Shared by the simcuda integration tests: where the staged stand-ins are, how to run
//! `simcuda-workload` against a private simulated machine (its own `SIMCUDA_STATE_DIR`, so tests
//! running in parallel never share device memory), and how to read its `KEY k=v ...` lines.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The simcuda-workload binary cargo built for these tests.
pub fn workload_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_simcuda-workload"))
}

/// `<target>/<profile>/simcuda`: the stand-ins under their real names (made by the build scripts).
pub fn stage_dir() -> PathBuf {
    let dir = workload_bin().parent().expect("binary in a directory").join("simcuda");
    for lib in ["libcuda.so.1", "libcudart.so.13", "libcudart.so.12", "libnvidia-ml.so.1"] {
        assert!(dir.join(lib).exists(), "{} missing: build the workspace first", dir.join(lib).display());
    }
    dir
}

const VARS: [&str; 9] = [
    "SIMCUDA_DEVICES",
    "SIMCUDA_MEM",
    "SIMCUDA_RESERVE",
    "SIMCUDA_SLACK",
    "SIMCUDA_STATE_DIR",
    "SIMCUDA_TRACE",
    "SIMCUDA_MIG",
    "CUDA_VISIBLE_DEVICES",
    "LD_PRELOAD",
];

/// A simulated machine: a fresh state directory plus `SIMCUDA_*` settings.
pub struct Sim {
    pub state_dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Sim {
    /// A machine named after the test, with `SIMCUDA_MEM` = `mem` and `SIMCUDA_RESERVE` = `reserve`.
    pub fn new(test: &str, mem: &str, reserve: &str) -> Sim {
        let state_dir = std::env::temp_dir().join(format!("simcuda-tests-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::create_dir_all(&state_dir).expect("state dir");
        Sim { state_dir, env: vec![] }.env("SIMCUDA_MEM", mem).env("SIMCUDA_RESERVE", reserve)
    }

    pub fn env(mut self, k: &str, v: &str) -> Sim {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// `simcuda-workload ARGS` on this machine.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(workload_bin());
        for v in VARS {
            c.env_remove(v);
        }
        c.args(args).env("LD_LIBRARY_PATH", stage_dir()).env("SIMCUDA_STATE_DIR", &self.state_dir);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs `simcuda-workload ARGS` and returns its output, whatever its exit status.
    pub fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run simcuda-workload")
    }

    /// Runs `simcuda-workload ARGS`, requires exit 0, returns stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.output(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "simcuda-workload {args:?} exited {:?}\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

pub type Line = BTreeMap<String, String>;

/// The `key=value` pairs of every line that starts with `kind ` (e.g. `RESULT`).
pub fn lines(stdout: &str, kind: &str) -> Vec<Line> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(kind)?.strip_prefix(' '))
        .map(|rest| rest.split(' ').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
        .collect()
}

/// The one `RESULT` line whose `step` is `step`.
pub fn step(stdout: &str, step: &str) -> Line {
    let found: Vec<Line> = lines(stdout, "RESULT").into_iter().filter(|l| l.get("step").map(String::as_str) == Some(step)).collect();
    assert_eq!(found.len(), 1, "one RESULT with step={step} in:\n{stdout}");
    found.into_iter().next().expect("checked")
}

/// `line[key]` as a number.
pub fn num(line: &Line, key: &str) -> u64 {
    line.get(key).unwrap_or_else(|| panic!("no {key} in {line:?}")).parse().unwrap_or_else(|_| panic!("{key} in {line:?}"))
}

/// Asserts `line` has exactly these values for these keys.
pub fn assert_fields(line: &Line, expected: &[(&str, u64)]) {
    for (k, v) in expected {
        assert_eq!(num(line, k), *v, "{k} in {line:?}");
    }
}

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
