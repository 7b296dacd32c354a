//! The stand-ins across processes: NVML in one process sees what another holds (and forgets a
//! process that died without freeing), a forked child allocates on its own and its `exec`
//! releases what it held, and an LD_PRELOAD interposer of `cuMemAlloc_v2` alone sees none of a
//! `cudaMalloc` workload's calls (the runtime fetches the driver through cuGetProcAddress). MIG
//! instances hold their own memory: what one holds leaves another's room as it was, and NVML's
//! MIG handles show each instance's memory and processes.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::*;

/// Starts `hold SIZE` and waits for its READY line; returns the child and its pid.
fn hold(sim: &Sim, size: &str) -> (Child, u32) {
    let mut child = sim.cmd(&["hold", size]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn hold");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped")).read_line(&mut line).expect("READY line");
    let ready = lines(&line, "READY");
    assert_eq!(ready.len(), 1, "{line}");
    (child, num(&ready[0], "pid") as u32)
}

#[test]
fn nvml_in_another_process_sees_the_memory_and_the_process() {
    let sim = Sim::new("nvml", "1GiB", "64MiB").env("SIMCUDA_DEVICES", "2");
    let usable = 960 * MIB;
    let (mut holder, pid) = hold(&sim, "100MiB");

    let out = sim.run(&["nvml"]);
    let devices = lines(&out, "RESULT");
    assert_eq!(devices.len(), 2);
    assert_fields(
        &devices[0],
        &[
            ("device", 0),
            ("total", GIB),
            ("reserved", 64 * MIB),
            ("used", 100 * MIB),
            ("free", usable - 100 * MIB),
            ("v1_used", 164 * MIB),
            ("v1_free", usable - 100 * MIB),
            ("processes", 1),
            ("count_query_rc", 7),
            ("driver_uuid_match", 1),
        ],
    );
    assert_fields(&devices[1], &[("device", 1), ("used", 0), ("free", usable), ("processes", 0), ("driver_uuid_match", 1)]);
    assert_ne!(devices[0]["uuid"], devices[1]["uuid"]);
    assert!(devices[0]["uuid"].starts_with("GPU-") && devices[0]["uuid"].len() == 40);
    let procs = lines(&out, "PROCESS");
    assert_eq!(procs.len(), 1);
    assert_fields(&procs[0], &[("device", 0), ("pid", u64::from(pid)), ("used", 100 * MIB)]);
    assert!(out.contains("INFO device=0 name=NVIDIA H200 (simcuda)"));

    // The device's memory is shared: the holder's 100 MiB is not available here.
    let basic = sim.run(&["basic", "8MiB"]);
    assert_eq!(num(&lines(&basic, "RESULT")[0], "device_free"), usable - 108 * MIB);

    drop(holder.stdin.take());
    assert!(holder.wait().expect("holder exits").success());
    let after = lines(&sim.run(&["nvml"]), "RESULT");
    assert_fields(&after[0], &[("used", 0), ("free", usable), ("processes", 0), ("count_query_rc", 0)]);
}

#[test]
fn a_killed_process_stops_counting() {
    let sim = Sim::new("killed", "1GiB", "64MiB");
    let (mut holder, _) = hold(&sim, "200MiB");
    assert_fields(&lines(&sim.run(&["nvml"]), "RESULT")[0], &[("used", 200 * MIB), ("processes", 1)]);
    holder.kill().expect("kill -9");
    holder.wait().expect("reap");
    assert_fields(&lines(&sim.run(&["nvml"]), "RESULT")[0], &[("used", 0), ("processes", 0), ("free", 960 * MIB)]);
}

#[test]
fn fork_child_allocates_and_exec_releases_what_it_held() {
    let sim = Sim::new("fork-exec", "1GiB", "64MiB");
    let out = sim.run(&["fork-exec"]);
    let usable = 960 * MIB;
    let r = lines(&out, "RESULT");
    assert_eq!(r.len(), 4, "{out}");
    let (parent, child, exec, wait) = (&r[0], &r[1], &r[2], &r[3]);
    assert_eq!((parent["role"].as_str(), child["role"].as_str(), exec["test"].as_str()), ("parent", "child", "basic"));
    assert_fields(parent, &[("device_free", usable - 64 * MIB)]);
    assert_fields(child, &[("rc", 0), ("device_free", usable - 96 * MIB)]);
    // After exec, the child's 32 MiB is gone; the new image holds its own 16 MiB.
    assert_eq!(exec["pid"], child["pid"]);
    assert_fields(exec, &[("size", 16 * MIB), ("device_free", usable - 80 * MIB)]);
    assert_fields(wait, &[("child_exit", 0), ("device_free", usable - 64 * MIB), ("child_pid", num(child, "pid"))]);
}

const INTERPOSER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned long calls;

int cuMemAlloc_v2(uint64_t *dptr, size_t bytesize) {
    int (*real)(uint64_t *, size_t) = (int (*)(uint64_t *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    calls++;
    return real(dptr, bytesize);
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("INTERPOSE_COUNT_FILE");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) { fprintf(f, "%lu\n", calls); fclose(f); }
}
"#;

#[test]
fn an_interposer_of_cu_mem_alloc_v2_sees_no_cuda_malloc() {
    let sim = Sim::new("interpose", "1GiB", "64MiB");
    let src = sim.state_dir.join("interpose.c");
    let so = sim.state_dir.join("interpose.so");
    std::fs::write(&src, INTERPOSER).expect("write interposer source");
    let cc = Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o"]).arg(&so).arg(&src).arg("-ldl").status().expect("run cc");
    assert!(cc.success(), "cc failed");
    let count_file = sim.state_dir.join("count");
    let calls = |args: &[&str]| -> u64 {
        let _ = std::fs::remove_file(&count_file);
        let out = sim.cmd(args).env("LD_PRELOAD", &so).env("INTERPOSE_COUNT_FILE", &count_file).output().expect("run");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(&count_file).expect("count written").trim().parse().expect("a number")
    };
    // cudaMalloc (cuMemAlloc_v2 underneath, fetched through cuGetProcAddress_v2): invisible.
    assert_eq!(calls(&["basic", "4MiB"]), 0);
    assert_eq!(calls(&["routes", "runtime", "getproc", "entrypoint", "dlsym"]), 0);
    // A direct call through the dynamic linker: seen, so the interposer itself works.
    assert_eq!(calls(&["routes", "direct"]), 2);
}

#[test]
fn mig_instances_hold_their_own_memory_and_nvml_shows_each() {
    let sim = Sim::new("mig", "1GiB", "64MiB").env("SIMCUDA_MIG", "0:256MiB+512MiB");
    let out = sim.run(&["nvml"]);
    let migs = lines(&out, "MIG");
    assert_eq!(migs.len(), 2, "{out}");
    let uuid = |k: usize| migs[k]["uuid"].clone();
    assert!(uuid(0).starts_with("MIG-") && uuid(0) != uuid(1), "{out}");
    assert_fields(&migs[1], &[("index", 1), ("total", 512 * MIB), ("free", 512 * MIB), ("parent_match", 1), ("is_mig", 1)]);
    // 200 MiB held on the 512 MiB instance.
    let mut c = sim.cmd(&["hold", "200MiB"]);
    let mut holder = c.env("CUDA_VISIBLE_DEVICES", uuid(1)).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn hold");
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().expect("piped")).read_line(&mut line).expect("READY line");
    assert!(line.starts_with("READY "), "{line}");
    let out = sim.run(&["nvml"]);
    let migs = lines(&out, "MIG");
    assert_fields(&migs[0], &[("used", 0), ("free", 256 * MIB), ("processes", 0)]);
    assert_fields(&migs[1], &[("used", 200 * MIB), ("free", 312 * MIB), ("processes", 1)]);
    assert_fields(&lines(&out, "RESULT")[0], &[("used", 200 * MIB), ("processes", 1)]);
    // The other instance's room is untouched: all of it but the slack, and not a byte more.
    let basic = |size: &str| {
        let o = sim.cmd(&["basic", size]).env("CUDA_VISIBLE_DEVICES", uuid(0)).output().expect("basic");
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    let fits = basic("252MiB");
    assert_fields(&lines(&fits, "RESULT")[0], &[("rc", 0), ("device_free", 4 * MIB)]);
    assert!(basic("253MiB").contains("cudaErrorMemoryAllocation"), "past the instance's 256 MiB less the slack");
    let unknown =
        sim.cmd(&["basic", "1MiB"]).env("CUDA_VISIBLE_DEVICES", "MIG-00000000-0000-4000-8000-000000000000").output().expect("basic");
    assert!(!unknown.status.success(), "a MIG UUID naming no instance leaves no device");
    drop(holder.stdin.take());
    assert!(holder.wait().expect("wait").success());
}
