//! Non-framework memory by owner (issue 25, item 3) under `run`: two stand-in libraries built
//! here, named as cuBLAS's and NCCL's (`libcublas.so.12`, `libnccl.so.2`), allocate from
//! simcuda: the cuBLAS one through the runtime (`cudaMalloc`, which reaches the driver from
//! libcudart: the segment is cuBLAS's, the outermost caller's), the NCCL one from the driver
//! (`cuMemAlloc_v2`). The program allocates some itself (`cudaMalloc` from the executable:
//! `other`). The summary's `owners` must give each library its bytes, the rest to `other`,
//! summed to the process's driver bytes, and the record must replay to the same owners.
//!
//! Under eBPF (`attach`, `agent`; as root) the same program gives the same owners: the uprobes
//! on libcudart's allocation functions name the runtime call's caller, the driver's own caller
//! otherwise (bpf/gpufrag.bpf.c, `owner_address`), mapped to files by the same consumer code.
//! Under `attach` the program waits at a gate until the probes are in; under `agent` it holds
//! its memory (READY, then a go file) until the agent's summary is taken.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;

const CUBLAS_MIB: u64 = 64;
const NCCL_MIB: u64 = 32;
const OWN_MIB: u64 = 16;

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("cc");
    assert!(out.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Builds the two libraries and the program that calls them; the program's path.
fn build(dir: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    let sim = simcuda_dir().display().to_string();
    let d = |n: &str| dir.join(n).display().to_string();
    std::fs::write(
        dir.join("cublas.c"),
        "#include <stddef.h>\nint cudaMalloc(void **p, size_t n);\n\
         int stub_cublas_workspace(size_t n) { void *p; return cudaMalloc(&p, n); }\n",
    )
    .expect("src");
    std::fs::write(
        dir.join("nccl.c"),
        "#include <stddef.h>\nint cuMemAlloc_v2(unsigned long long *p, size_t n);\n\
         int stub_nccl_buffers(size_t n) { unsigned long long p; return cuMemAlloc_v2(&p, n); }\n",
    )
    .expect("src");
    std::fs::write(
        dir.join("main.c"),
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include <unistd.h>\nint cudaMalloc(void **p, size_t n);\n\
             int stub_cublas_workspace(size_t n); int stub_nccl_buffers(size_t n);\n\
             static void wait_file(const char *f) {{ while (access(f, F_OK) != 0) usleep(10000); }}\n\
             int main(int argc, char **argv) {{ void *p; if (argc > 1 && argv[1][0] != '-') wait_file(argv[1]);\n\
             int a = cudaMalloc(&p, {OWN_MIB}ull << 20);\n\
             int b = stub_cublas_workspace({CUBLAS_MIB}ull << 20); int c = stub_nccl_buffers({NCCL_MIB}ull << 20);\n\
             printf(\"rc %d %d %d\\n\", a, b, c); fflush(stdout);\n\
             if (argc > 2) {{ printf(\"READY\\n\"); fflush(stdout); wait_file(argv[2]); }}\n\
             return a || b || c; }}\n"
        ),
    )
    .expect("src");
    cc(&["-O1", "-shared", "-fPIC", "-o", &d("libcublas.so.12"), &d("cublas.c"), "-L", &sim, "-l:libcudart.so.12"]);
    cc(&["-O1", "-shared", "-fPIC", "-o", &d("libnccl.so.2"), &d("nccl.c"), "-L", &sim, "-l:libcuda.so.1"]);
    let prog = dir.join("owners_prog");
    let p = prog.display().to_string();
    cc(&[
        "-O1",
        "-o",
        &p,
        &d("main.c"),
        &d("libcublas.so.12"),
        &d("libnccl.so.2"),
        &format!("-Wl,-rpath-link,{sim}"),
        "-L",
        &sim,
        "-l:libcudart.so.12",
    ]);
    prog
}

/// The program's environment: the simulated machine, its two libraries and simcuda.
fn prog_env(m: &Machine, dir: &Path, cmd: &mut Command) {
    m.env(cmd);
    cmd.env("LD_LIBRARY_PATH", format!("{}:{}", dir.display(), simcuda_dir().display()));
}

/// `processes[]` of `pid` in a summary.
fn process_of(s: &Value, pid: u32) -> &Value {
    let procs = s["processes"].as_array().unwrap_or_else(|| panic!("{s:#}"));
    let mine: Vec<&Value> = procs.iter().filter(|p| p["pid"].as_u64() == Some(u64::from(pid))).collect();
    assert_eq!(mine.len(), 1, "one entry for pid {pid}: {s:#}");
    mine[0]
}

/// The owners `run` names for the program (the reference the eBPF captures must equal).
fn run_owners(dir: &Path, prog: &Path) -> Value {
    let summary = dir.join("run-summary.json");
    let m = Machine::new(1);
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"]).arg(&summary).arg("--").arg(prog);
    prog_env(&m, dir, &mut cmd);
    let res = cmd.stderr(Stdio::piped()).stdout(Stdio::piped()).output().expect("gpufrag run");
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    owners_of(&s)["owners"].clone()
}

fn owners_of(s: &Value) -> &Value {
    let procs = s["processes"].as_array().unwrap_or_else(|| panic!("{s:#}"));
    assert_eq!(procs.len(), 1, "{s:#}");
    &procs[0]
}

fn check(p: &Value) {
    let o = &p["owners"];
    let mib = |k: &str| o[k].as_u64().unwrap_or(0);
    assert_eq!(mib("cublas"), CUBLAS_MIB * MIB, "cuBLAS's cudaMalloc is cuBLAS's, not libcudart's: {p:#}");
    assert_eq!(mib("nccl"), NCCL_MIB * MIB, "{p:#}");
    assert_eq!(mib("other"), OWN_MIB * MIB, "the program's own: {p:#}");
    let sum: u64 = o.as_object().map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    assert_eq!(sum, p["reserved"].as_u64().unwrap_or(0), "the owners sum to the driver's bytes: {p:#}");
}

#[test]
fn run_names_the_libraries_that_took_driver_memory_and_replay_agrees() {
    let dir = unique("owners");
    let prog = build(&dir);
    let summary = dir.join("summary.json");
    let record = dir.join("trace.gfrec");
    let m = Machine::new(1);
    let mut cmd = Command::new(gpufrag());
    cmd.args(["run", "--quiet", "--no-report", "--no-feed", "--summary-json"])
        .arg(&summary)
        .arg("--record")
        .arg(&record)
        .arg("--")
        .arg(&prog);
    m.env(&mut cmd);
    let lib_path = format!("{}:{}", dir.display(), simcuda_dir().display());
    cmd.env("LD_LIBRARY_PATH", lib_path);
    let res = cmd.stderr(Stdio::piped()).stdout(Stdio::piped()).output().expect("gpufrag run");
    assert!(res.status.success(), "{}\n{}", String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr));
    let live: Value = serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    check(owners_of(&live));
    let replay = analyze(&record);
    assert_eq!(owners_of(&replay)["owners"], owners_of(&live)["owners"], "a replay names the same owners");

    // The text summary and the report show the same owners, from the same record.
    let text = Command::new(gpufrag()).arg("analyze").arg(&record).output().expect("gpufrag analyze");
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text.lines().find(|l| l.contains("cublas ")).unwrap_or_else(|| panic!("no owners line in the text summary:\n{text}"));
    assert!(line.contains("cublas 64.00 MiB, nccl 32.00 MiB, other 16.00 MiB"), "largest first, as PyTorch prints sizes: {line:?}");
    let html = dir.join("report.html");
    let rep = Command::new(gpufrag()).arg("report").arg(&record).arg("-o").arg(&html).output().expect("gpufrag report");
    assert!(rep.status.success(), "{}", String::from_utf8_lossy(&rep.stderr));
    let html = std::fs::read_to_string(&html).expect("report");
    let table = &html[html.find("<table id=\"owners-table\">").unwrap_or_else(|| panic!("no owners table in the report"))..];
    let table = &table[..table.find("</table>").expect("the table ends")];
    for (owner, mib) in [("cublas", CUBLAS_MIB), ("nccl", NCCL_MIB), ("other", OWN_MIB)] {
        let row = table
            .split("<tr ")
            .find(|r| r.contains(&format!("data-owner=\"{owner}\"")))
            .unwrap_or_else(|| panic!("no {owner} row in the report's owners table: {table}"));
        assert!(row.contains(&format!("data-bytes=\"{}\"", mib * MIB)), "{owner}: {row}");
    }
    assert_eq!(table.matches("data-owner=").count(), 3, "one row per owner said: {table}");
}

#[test]
fn attach_names_the_same_owners_as_run() {
    require_ebpf!();
    let dir = unique("owners-attach");
    let prog = build(&dir);
    let reference = run_owners(&dir, &prog);
    let (gate, summary, record) = (dir.join("gate"), dir.join("summary.json"), dir.join("trace.gfrec"));
    let m = Machine::new(1);
    let mut p = Command::new(&prog);
    p.arg(&gate).stdout(Stdio::piped());
    prog_env(&m, &dir, &mut p);
    let mut child = p.spawn().expect("owners_prog");
    let pid = child.id();
    let mut cmd = Command::new(gpufrag());
    cmd.arg("attach").arg(pid.to_string()).arg("--summary-json").arg(&summary).arg("--record").arg(&record);
    cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    m.env(&mut cmd);
    let mut gf = cmd.spawn().expect("gpufrag attach");
    let mut err = Lines::new(gf.stderr.take().expect("stderr"));
    if !err.wait_for("attached to pid", Duration::from_secs(120)) {
        let _ = child.kill();
        let _ = gf.kill();
        panic!("gpufrag attach did not attach:\n{}", err.rest());
    }
    std::fs::write(&gate, b"go").expect("open the gate");
    assert!(wait_timeout(&mut child, Duration::from_secs(60)).success(), "owners_prog failed");
    let st = wait_timeout(&mut gf, Duration::from_secs(60));
    let log = err.rest();
    assert!(st.success(), "gpufrag attach: {st}\n{log}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("{e}\n{log}"))).expect("json");
    let p = process_of(&s, pid);
    check(p);
    assert_eq!(p["owners"], reference, "attach names run's owners");
    assert_eq!(process_of(&analyze(&record), pid)["owners"], reference, "a replay of attach's record too");
}

fn stop(mut agent: Child, err: &mut Lines, summary: &Path) -> Value {
    stop_agent(&mut agent, err, summary).0
}

#[test]
fn agent_names_the_same_owners_as_run() {
    require_ebpf!();
    let dir = unique("owners-agent");
    let prog = build(&dir);
    let reference = run_owners(&dir, &prog);
    let (go, summary) = (dir.join("go"), dir.join("agent.json"));
    let m = Machine::new(1);
    let mut cmd = Command::new(gpufrag());
    cmd.args(["agent", "--summary-json"]).arg(&summary).stderr(Stdio::piped()).stdout(Stdio::null());
    m.env(&mut cmd);
    let mut agent = cmd.spawn().expect("agent");
    let mut err = Lines::new(agent.stderr.take().expect("stderr"));
    assert!(err.wait_for("agent: tracing", Duration::from_secs(120)), "{}", err.rest());
    // Started after the agent, no --lib: its libcudart was probed up front (the agent's
    // LD_LIBRARY_PATH names simcuda's), its libraries are read at its loader's report.
    let mut p = Command::new(&prog);
    p.arg("-").arg(&go).stdout(Stdio::piped());
    prog_env(&m, &dir, &mut p);
    let mut child = p.spawn().expect("owners_prog");
    let pid = child.id();
    let mut out = Lines::new(child.stdout.take().expect("stdout"));
    assert!(out.wait_for("READY", Duration::from_secs(60)), "{}", out.rest());
    std::thread::sleep(Duration::from_millis(800));
    let s = stop(agent, &mut err, &summary);
    std::fs::write(&go, b"go").expect("go");
    assert!(wait_timeout(&mut child, Duration::from_secs(60)).success(), "owners_prog failed");
    let p = process_of(&s, pid);
    check(p);
    assert_eq!(p["owners"], reference, "the agent names run's owners");
}
