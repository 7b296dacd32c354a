//! Shared by the `tests/ebpf_*.rs` tests: compiles the C fixtures (a CUDA driver client and two
//! stand-in libc10_cuda.so, one with PyTorch's USDT probes, one with its .symtab functions, each
//! with a stand-in libc10.so beside it that exports PyTorch's OOM report and a stand-in
//! libtorch_python.so with its memory-fraction setter, and a C++ program with its own pool by RMM's
//! rules, rmm_pool.cpp), finds
//! the simcuda stand-in libcuda.so.1 next to the gpufrag binary, says whether this kernel lets us
//! load eBPF at all (the only reason a test may skip), and drives `gpufrag attach` against a
//! program held at a gate until the probes are in.

#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;

pub fn gpufrag() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpufrag"))
}

/// `<target>/<profile>/simcuda`, where simcuda's build stages libcuda.so.1 and friends.
pub fn simcuda_dir() -> PathBuf {
    let dir = gpufrag().parent().expect("binary in a directory").join("simcuda");
    assert!(
        dir.join("libcuda.so.1").exists(),
        "{} has no libcuda.so.1: build the workspace (cargo build --workspace) so that simcuda is staged",
        dir.display()
    );
    dir
}

pub struct Fixtures {
    pub dir: PathBuf,
    pub prog: PathBuf,
    pub usdt_lib: PathBuf,
    pub symbols_lib: PathBuf,
    pub xla_lib: PathBuf,
    /// TensorFlow's framework library (`tensorflow/libtensorflow_framework.so.2`): the same BFC
    /// allocator, its symbols exported in `.dynsym` and `.symtab` stripped, as in TensorFlow's wheel.
    pub tf_lib: PathBuf,
    /// A program with its own pool allocator by RMM's `pool_memory_resource` rules
    /// (rmm_pool.cpp), announcing its blocks as RMM's through include/gpufrag_annotate.h.
    pub rmm_prog: PathBuf,
    /// The same program built against the annotation header from before the allocator id
    /// (annotate_v1/): the plain calls, as every program built then.
    pub rmm_prog_v1: PathBuf,
}

fn compile(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e} (install gcc, g++)"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed:\n{}\n(the USDT fixture needs <sys/sdt.h>: apt-get install systemtap-sdt-dev)",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ebpf_fixtures");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ebpf-fixtures-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("usdt")).expect("fixture dir");
        std::fs::create_dir_all(dir.join("symbols")).expect("fixture dir");
        std::fs::create_dir_all(dir.join("jax_plugins/xla_cuda13")).expect("fixture dir");
        std::fs::create_dir_all(dir.join("tensorflow")).expect("fixture dir");
        let prog = dir.join("cuda_prog");
        let usdt_lib = dir.join("usdt/libc10_cuda.so");
        let symbols_lib = dir.join("symbols/libc10_cuda.so");
        let xla_lib = dir.join("jax_plugins/xla_cuda13/xla_cuda_plugin.so");
        let tf_lib = dir.join("tensorflow/libtensorflow_framework.so.2");
        let s = |p: &str| src.join(p).display().to_string();
        compile("cc", &["-O1", "-g", "-Wall", "-o", &prog.display().to_string(), &s("cuda_prog.c"), "-ldl", "-lpthread"]);
        compile("cc", &["-O1", "-g", "-shared", "-fPIC", "-o", &usdt_lib.display().to_string(), &s("fake_c10_usdt.c")]);
        compile(
            "c++",
            &["-O1", "-g", "-shared", "-fPIC", "-fvisibility=hidden", "-o", &symbols_lib.display().to_string(), &s("fake_c10_symbols.cpp")],
        );
        // PyTorch's libc10.so beside each libc10_cuda.so: its OOM report; and libtorch_python.so:
        // its memory-fraction setter.
        for d in ["usdt", "symbols"] {
            compile(
                "cc",
                &[
                    "-O1",
                    "-g",
                    "-shared",
                    "-fPIC",
                    "-o",
                    &dir.join(d).join("libtorch_python.so").display().to_string(),
                    &s("fake_torch_python.c"),
                ],
            );
            compile(
                "c++",
                &[
                    "-O1",
                    "-g",
                    "-shared",
                    "-fPIC",
                    "-fvisibility=hidden",
                    "-o",
                    &dir.join(d).join("libc10.so").display().to_string(),
                    &s("fake_c10.cpp"),
                ],
            );
        }
        compile(
            "c++",
            &["-O1", "-g", "-shared", "-fPIC", "-fvisibility=hidden", "-o", &xla_lib.display().to_string(), &s("fake_xla_bfc.cpp")],
        );
        // -s: no .symtab, so the probes can only find BFC through the exported .dynsym.
        compile(
            "c++",
            &["-O1", "-g0", "-shared", "-fPIC", "-fvisibility=default", "-s", "-o", &tf_lib.display().to_string(), &s("fake_xla_bfc.cpp")],
        );
        let rmm_prog = dir.join("rmm_pool");
        let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include").display().to_string();
        let rmm_prog_v1 = dir.join("rmm_pool_v1");
        for (include, out) in [(include, &rmm_prog), (s("annotate_v1"), &rmm_prog_v1)] {
            compile(
                "c++",
                &["-std=c++17", "-O1", "-g", "-Wall", "-I", &include, "-o", &out.display().to_string(), &s("rmm_pool.cpp"), "-ldl"],
            );
        }
        Fixtures { dir, prog, usdt_lib, symbols_lib, xla_lib, tf_lib, rmm_prog, rmm_prog_v1 }
    })
}

/// `Err(reason)` when this kernel (or these privileges) refuse eBPF: the one case where an eBPF
/// test skips, printing the reason.
pub fn ebpf_refused() -> Option<String> {
    static R: OnceLock<Option<String>> = OnceLock::new();
    R.get_or_init(|| match gpufrag::ebpf::Probes::load(&gpufrag::ebpf::ProbeOptions::default(), "the eBPF tests") {
        Ok(_) => None,
        Err(gpufrag::ebpf::ProbeError::Privileges(m)) => Some(format!("no privileges for eBPF: {m}")),
        Err(gpufrag::ebpf::ProbeError::Unsupported(m)) => Some(format!("the kernel refuses eBPF: {m}")),
        Err(e) => panic!("loading the eBPF programs failed for a reason other than the kernel's refusal: {e}"),
    })
    .clone()
}

#[macro_export]
macro_rules! require_ebpf {
    () => {
        if let Some(why) = support::ebpf_refused() {
            $crate::tool_support::missing("eBPF", &format!("{why}: run as root on a kernel with BPF and BTF"));
            return;
        }
    };
}

/// Reads a child's stderr lines into a channel (and keeps them all for failure messages).
pub struct Lines {
    rx: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(r: impl std::io::Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// Waits for a line containing `needle`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.rx.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    self.seen.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    pub fn rest(&mut self) -> String {
        while let Ok(l) = self.rx.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        self.seen.join("\n")
    }
}

/// The PATH a test gives a process whose environment it clears (the agent as an operator starts
/// it: nothing else inherited).
pub const CLEAN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `gpufrag agent ARGS --summary-json SUMMARY`, its stderr piped and its stdout dropped, for
/// [`start_tracing`]; the caller adds its environment.
pub fn agent_command(summary: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(gpufrag());
    cmd.arg("agent").args(args).arg("--summary-json").arg(summary).stderr(Stdio::piped()).stdout(Stdio::null());
    cmd
}

/// [`agent_command`] with nothing in its environment but [`CLEAN_PATH`].
pub fn clean_agent_command(summary: &Path, args: &[&str]) -> Command {
    let mut cmd = agent_command(summary, args);
    cmd.env_clear().env("PATH", CLEAN_PATH);
    cmd
}

/// Starts the agent `cmd` (from [`agent_command`]) and waits, at most 120 s, until it says
/// "agent: tracing" (its probes are in); fails with what it said otherwise.
pub fn start_tracing(mut cmd: Command) -> (Child, Lines) {
    let mut child = cmd.spawn().expect("agent");
    let mut err = Lines::new(child.stderr.take().expect("stderr"));
    assert!(err.wait_for("agent: tracing", Duration::from_secs(120)), "{}", err.rest());
    (child, err)
}

/// Stops an agent started by [`start_tracing`] as an operator does (SIGINT), waits at most 60 s
/// for it to end well, and reads its summary: the summary and what the agent said, which every
/// failure shows.
pub fn stop_agent(agent: &mut Child, err: &mut Lines, summary: &Path) -> (Value, String) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGINT) }, 0);
    let st = wait_timeout(agent, Duration::from_secs(60));
    let log = err.rest();
    assert!(st.success(), "agent: {st}\n{log}");
    let text = std::fs::read_to_string(summary).unwrap_or_else(|e| panic!("{}: {e}\n{log}", summary.display()));
    (serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{log}", summary.display())), log)
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("process {} did not end within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fixture program started at a gate (it waits for a file before touching CUDA).
pub struct Gated {
    pub child: Child,
    pub gate: PathBuf,
    pub machine: Machine,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub fn unique(name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    fixtures().dir.join(format!("{name}-{n}"))
}

/// A simulated machine: `devices` devices and a state directory of their own (processes, and
/// gpufrag's NVML, that share it see the same devices).
#[derive(Clone, Debug)]
pub struct Machine {
    pub devices: u32,
    pub state: PathBuf,
    /// `SIMCUDA_MEM`, when not the default 16 GiB.
    pub mem: Option<String>,
    /// Further `SIMCUDA_*` settings (`SIMCUDA_FASTEST_FIRST`, the sharing layers).
    pub extra: Vec<(String, String)>,
}

impl Machine {
    pub fn new(devices: u32) -> Machine {
        let state = unique("simcuda-state");
        std::fs::create_dir_all(&state).expect("state dir");
        Machine { devices, state, mem: None, extra: Vec::new() }
    }

    pub fn with_mem(mut self, mem: &str) -> Machine {
        self.mem = Some(mem.to_string());
        self
    }

    /// Sets one more variable on every process of the machine.
    pub fn with_env(mut self, key: &str, value: &str) -> Machine {
        self.extra.push((key.to_string(), value.to_string()));
        self
    }

    pub fn env(&self, cmd: &mut Command) {
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
        cmd.env("LD_LIBRARY_PATH", simcuda_dir());
        cmd.env("SIMCUDA_DEVICES", self.devices.to_string());
        cmd.env("SIMCUDA_STATE_DIR", &self.state);
        if let Some(m) = &self.mem {
            cmd.env("SIMCUDA_MEM", m);
        }
    }
}

pub fn start_gated(args: &[&str], machine: &Machine) -> Gated {
    start_gated_prog(&fixtures().prog, args, machine)
}

/// `prog gate FILE ARGS...` (a fixture program that takes the gate as cuda_prog does).
pub fn start_gated_prog(prog: &Path, args: &[&str], machine: &Machine) -> Gated {
    let gate = unique("gate");
    let mut cmd = Command::new(prog);
    cmd.arg("gate").arg(&gate).args(args).stdout(Stdio::piped()).stderr(Stdio::inherit());
    machine.env(&mut cmd);
    let child = cmd.spawn().unwrap_or_else(|e| panic!("start {}: {e}", prog.display()));
    Gated { child, gate, machine: machine.clone() }
}

/// The result of tracing one program.
pub struct Traced {
    pub summary: Value,
    pub record: PathBuf,
    pub stdout: String,
    pub stderr: String,
    pub pid: u32,
}

/// Runs `cuda_prog SCENARIO...` under `gpufrag attach` from its start: the program waits at its
/// gate until the probes are in.
pub fn attach_from_start(args: &[&str], devices: u32, extra: &[&str]) -> Traced {
    attach_prog_from_start(&fixtures().prog, args, &Machine::new(devices), extra)
}

/// [`attach_from_start`] for the fixture program `prog` on `machine`.
pub fn attach_prog_from_start(prog: &Path, args: &[&str], machine: &Machine, extra: &[&str]) -> Traced {
    let mut g = start_gated_prog(prog, args, machine);
    let pid = g.child.id();
    let summary = unique("summary.json");
    let record = unique("trace.rec");
    let mut cmd = Command::new(gpufrag());
    cmd.arg("attach").arg(pid.to_string()).arg("--summary-json").arg(&summary).arg("--record").arg(&record).args(extra);
    cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    g.machine.env(&mut cmd);
    let mut gf = cmd.spawn().expect("start gpufrag attach");
    let mut err = Lines::new(gf.stderr.take().expect("stderr"));
    if !err.wait_for("attached to pid", Duration::from_secs(120)) {
        let _ = g.child.kill();
        let _ = gf.kill();
        panic!("gpufrag attach did not attach:\n{}", err.rest());
    }
    std::fs::write(&g.gate, b"go").expect("open the gate");
    let mut stdout = String::new();
    std::io::Read::read_to_string(g.child.stdout.as_mut().expect("stdout"), &mut stdout).expect("read stdout");
    let st = wait_timeout(&mut g.child, Duration::from_secs(120));
    assert!(st.success(), "{} {args:?} failed: {st}\n{stdout}", prog.display());
    let st = wait_timeout(&mut gf, Duration::from_secs(60));
    let stderr = err.rest();
    assert!(st.success(), "gpufrag attach failed: {st}\n{stderr}");
    let text = std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("no summary {}: {e}\n{stderr}", summary.display()));
    Traced { summary: serde_json::from_str(&text).expect("summary JSON"), record, stdout, stderr, pid }
}

/// The `FIGURES key=value ...` lines a fixture printed, by device.
pub fn printed_figures(stdout: &str) -> BTreeMap<i64, BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.starts_with("FIGURES ")) {
        let kv: BTreeMap<String, u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect();
        out.insert(kv.get("device").copied().unwrap_or(0) as i64, kv);
    }
    out
}

/// The summary's figures of one device, as a map of field → number.
pub fn device(summary: &Value, dev: i64) -> &Value {
    summary["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|x| x["device"].as_i64() == Some(dev)))
        .unwrap_or_else(|| panic!("no device {dev} in {summary:#}"))
}

pub fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v:#}"))
}

/// `gpufrag analyze --json RECORD`.
pub fn analyze(record: &Path) -> Value {
    let out = Command::new(gpufrag()).arg("analyze").arg("--json").arg(record).output().expect("analyze");
    assert!(out.status.success(), "analyze failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("analyze JSON")
}
