//! Libraries loaded after a process started (issue 26 item 3), against simcuda and the stand-in
//! libc10_cuda.so with PyTorch's USDT probes: `gpufrag agent` with only the driver named, then a
//! program that dlopens the stand-in allocator library after its start (as `import torch` loads
//! PyTorch's) and makes its blocks. Where the agent's start-up scan of the node's library roots
//! found the file, the program is exact from its first block; where it did not, the loader's
//! breakpoint (`_dl_debug_state`) gets the file probed within milliseconds; a filesystem mounted
//! after the start (a container's rootfs) is scanned when its first exec is held; the coverage
//! notes say, per process and library, the time from the load to the probe; a process whose
//! first segment came before its allocator's probes is not claimed exact. Tests skip (printing
//! why) only where the kernel refuses eBPF.

#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;

struct Agent {
    child: Child,
    err: Lines,
    summary: PathBuf,
}

/// `gpufrag agent` with nothing in its environment but PATH, only the driver named.
fn start_agent(args: &[&str]) -> Agent {
    let summary = unique("late-agent.json");
    let lib = simcuda_dir().join("libcuda.so.1");
    let mut cmd = clean_agent_command(&summary, &["--keep-exited"]);
    cmd.arg("--lib").arg(&lib).args(args);
    let (child, err) = start_tracing(cmd);
    Agent { child, err, summary }
}

fn stop(mut a: Agent) -> (Value, String) {
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) }, 0);
    let st = wait_timeout(&mut a.child, Duration::from_secs(60));
    let log = a.err.rest();
    assert!(st.success(), "agent: {st}\n{log}");
    let text = std::fs::read_to_string(&a.summary).unwrap_or_else(|e| panic!("{e}\n{log}"));
    (serde_json::from_str(&text).expect("json"), log)
}

/// A fresh copy of the stand-in libc10_cuda.so (and the libc10.so beside it) under `dir`: a
/// file no agent has probed.
fn fresh_torch_lib(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("lib dir");
    let src = fixtures().usdt_lib.parent().expect("fixture dir").to_path_buf();
    for name in ["libc10_cuda.so", "libc10.so"] {
        std::fs::copy(src.join(name), dir.join(name)).unwrap_or_else(|e| panic!("copying {name}: {e}"));
    }
    dir.join("libc10_cuda.so")
}

/// Runs `cuda_prog ARGS` on a fresh simulated device; its pid and stdout.
fn run_prog(args: &[&str]) -> (u32, String) {
    run_exe(&fixtures().prog, args)
}

/// Runs the program `exe` (a copy of cuda_prog) with `args` on a fresh simulated device.
fn run_exe(exe: &Path, args: &[&str]) -> (u32, String) {
    let mut cmd = Command::new(exe);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::inherit());
    Machine::new(1).env(&mut cmd);
    let child = cmd.spawn().expect("cuda_prog");
    let pid = child.id();
    let out = child.wait_with_output().expect("cuda_prog");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "cuda_prog {args:?}: {}\n{stdout}", out.status);
    (pid, stdout)
}

fn process(s: &Value, pid: u32) -> Value {
    s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
        .cloned()
        .unwrap_or_else(|| panic!("pid {pid} not in the summary: {s:#}"))
}

fn coverage_exact(s: &Value, pid: u32) -> Option<bool> {
    let cov: Vec<&Value> =
        s["coverage"].as_array().expect("coverage").iter().filter(|c| c["pid"].as_u64() == Some(u64::from(pid))).collect();
    (!cov.is_empty()).then(|| cov.iter().all(|c| c["exact"] == Value::Bool(true)))
}

fn notes(s: &Value) -> Vec<String> {
    s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).map(str::to_string).collect()
}

/// The coverage note of `pid` about `lib`, and the load-to-probe milliseconds it states.
fn load_note(s: &Value, pid: u32, lib: &str) -> (String, Option<f64>) {
    let head = format!("pid {pid} (");
    let note = notes(s)
        .into_iter()
        .find(|n| n.starts_with(&head) && n.contains(&format!("): {lib} ")))
        .unwrap_or_else(|| panic!("no coverage note for pid {pid} and {lib}: {:#}", s["notes"]));
    let ms = note.split("load to probe ").nth(1).and_then(|r| r.split(" ms").next()).and_then(|v| v.parse().ok());
    (note, ms)
}

/// The stand-in's blocks, as the program makes them: 4 MiB + 2 MiB (freed) + (1 MiB + 1
/// rounded to 512), then 3 MiB and 1 MiB (freed) through the raw entry points: three live blocks
/// in a 20 MiB segment.
fn assert_every_block(s: &Value, pid: u32, stdout: &str, log: &str) {
    let p = process(s, pid);
    assert_eq!(
        (u(&p, "reserved"), u(&p, "allocated"), u(&p, "blocks")),
        (20 * MIB, 4 * MIB + MIB + 512 + 3 * MIB, 3),
        "pid {pid}: {p:#}\nnotes {:#}\n{stdout}\n{log}",
        s["notes"]
    );
}

/// Must show: the agent with only the driver named, the stand-in PyTorch allocator library
/// installed where Python packages live on the node (`--host-root`, as a DaemonSet mounts the
/// host), then a program that dlopens it after its start and makes its blocks at once: the
/// start-up scan of the library roots probed the file before the load, so the process is exact
/// from its first block, and its coverage note gives the load-to-probe time (negative: before).
#[test]
fn a_library_under_a_scanned_root_is_probed_before_its_load_and_exact_from_its_first_block() {
    require_ebpf!();
    let host = unique("late-host");
    let lib = fresh_torch_lib(&host.join("usr/local/lib/python3.12/dist-packages/torch/lib"));
    let agent = start_agent(&["--host-root", &host.display().to_string()]);
    // Its blocks at once; it stays 500 ms after them, so that the agent reads its maps while it
    // lives (the note needs them; the exactness does not).
    let (pid, stdout) = run_prog(&["dlopen", &lib.display().to_string(), "0", "500"]);
    let (s, log) = stop(agent);
    assert_every_block(&s, pid, &stdout, &log);
    assert_eq!(coverage_exact(&s, pid), Some(true), "{:#}\n{log}", s["coverage"]);
    let roots = notes(&s).into_iter().find(|n| n.starts_with("library roots scanned at start")).expect("roots note");
    assert!(roots.contains(&lib.display().to_string()), "{roots}");
    let (note, ms) = load_note(&s, pid, "libc10_cuda.so");
    let ms = ms.unwrap_or_else(|| panic!("no load-to-probe time in {note}"));
    assert!(ms < 0.0 && note.contains("probed before its load"), "{note}");
    println!("{roots}\n{note}");
}

/// What the roots did not hold is probed at the dynamic loader's breakpoint: with the /proc scan
/// made rare (60 s), a library loaded from a directory nobody scanned is probed within
/// milliseconds of its load, before the program's blocks 300 ms later: every block is seen, the
/// process is exact (no segment came before the probe), and the note gives the time.
#[test]
fn a_library_found_later_is_probed_at_the_loaders_breakpoint_within_milliseconds() {
    require_ebpf!();
    let lib = fresh_torch_lib(&unique("late-unscanned"));
    let agent = start_agent(&["--scan-interval-ms", "60000"]);
    let (pid, stdout) = run_prog(&["dlopen", &lib.display().to_string(), "300"]);
    let (s, log) = stop(agent);
    assert_every_block(&s, pid, &stdout, &log);
    let (note, ms) = load_note(&s, pid, "libc10_cuda.so");
    let ms = ms.unwrap_or_else(|| panic!("no load-to-probe time in {note}"));
    assert!((0.0..300.0).contains(&ms) && note.contains("no segment before the probe"), "{note}\n{stdout}");
    assert_eq!(coverage_exact(&s, pid), Some(true), "{:#}\n{note}\n{log}", s["coverage"]);
    let cost = notes(&s).into_iter().find(|n| n.starts_with("dynamic loader's breakpoint:")).expect("cost note");
    println!("{note}\n{cost}");
}

/// A process whose first segment came before its allocator library's probes may have made
/// blocks unseen: it is not claimed exact, and the note says why with the times.
#[test]
fn a_segment_made_before_the_allocators_probe_is_not_claimed_exact() {
    require_ebpf!();
    let lib = fresh_torch_lib(&unique("late-segment"));
    let agent = start_agent(&["--scan-interval-ms", "60000"]);
    let (pid, stdout) = run_prog(&["segdlopen", &lib.display().to_string(), "300"]);
    let (s, log) = stop(agent);
    assert_every_block(&s, pid, &stdout, &log);
    let (note, _) = load_note(&s, pid, "libc10_cuda.so");
    assert!(note.contains("its first segment came") && note.contains("not exact"), "{note}");
    assert_eq!(coverage_exact(&s, pid), Some(false), "{:#}\n{note}\n{log}", s["coverage"]);
}

/// A tmpfs mounted for a test, unmounted (lazily) when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A filesystem mounted after the agent started (what a container's rootfs is to the agent)
/// holds a program and, where Python packages live, the stand-in allocator library: the first
/// exec from it is held while its library roots are scanned, so the library is probed before the
/// program loads it, and blocks made at once after the load are all seen (exact).
#[test]
fn a_filesystem_mounted_after_the_start_is_scanned_at_its_first_exec_so_its_library_is_probed_before_the_load() {
    require_ebpf!();
    let mnt = unique("late-rootfs");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let agent = start_agent(&[]);
    let st = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "gpufrag-test"]).arg(&mnt).status().expect("mount(8)");
    assert!(st.success(), "mount -t tmpfs {}: {st} (the test runs as root)", mnt.display());
    let _unmount = Mounted(mnt.clone());
    let lib = fresh_torch_lib(&mnt.join("usr/local/lib/python3.12/dist-packages/torch/lib"));
    std::fs::create_dir_all(mnt.join("bin")).expect("bin");
    let exe = mnt.join("bin/cuda_prog");
    std::fs::copy(&fixtures().prog, &exe).expect("copy cuda_prog");
    // The agent marks a new filesystem for the exec hold when the mount table changes.
    std::thread::sleep(Duration::from_millis(500));
    let (pid, stdout) = run_exe(&exe, &["dlopen", &lib.display().to_string(), "0", "500"]);
    let (s, log) = stop(agent);
    assert_every_block(&s, pid, &stdout, &log);
    assert_eq!(coverage_exact(&s, pid), Some(true), "{:#}\n{log}", s["coverage"]);
    let scanned = notes(&s)
        .into_iter()
        .find(|n| n.starts_with(&format!("new filesystem {}", mnt.display())))
        .unwrap_or_else(|| panic!("no note of the new filesystem's scan: {:#}", s["notes"]));
    assert!(scanned.contains(&lib.display().to_string()), "{scanned}");
    let (note, ms) = load_note(&s, pid, "libc10_cuda.so");
    assert!(ms.is_some_and(|m| m < 0.0) && note.contains("probed before its load"), "{note}");
    println!("{scanned}\n{note}");
}
