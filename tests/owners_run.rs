//! Non-framework memory by owner (issue 25, item 3) under `run`: two stand-in libraries built
//! here, named as cuBLAS's and NCCL's (`libcublas.so.12`, `libnccl.so.2`), allocate from
//! simcuda: the cuBLAS one through the runtime (`cudaMalloc`, which reaches the driver from
//! libcudart: the segment is cuBLAS's, the outermost caller's), the NCCL one from the driver
//! (`cuMemAlloc_v2`). The program allocates some itself (`cudaMalloc` from the executable:
//! `other`). The summary's `owners` must give each library its bytes, the rest to `other`,
//! summed to the process's driver bytes, and the record must replay to the same owners.

#[path = "ebpf_fixtures/support.rs"]
mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
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
            "#include <stdio.h>\n#include <stddef.h>\nint cudaMalloc(void **p, size_t n);\n\
             int stub_cublas_workspace(size_t n); int stub_nccl_buffers(size_t n);\n\
             int main(void) {{ void *p; int a = cudaMalloc(&p, {OWN_MIB}ull << 20);\n\
             int b = stub_cublas_workspace({CUBLAS_MIB}ull << 20); int c = stub_nccl_buffers({NCCL_MIB}ull << 20);\n\
             printf(\"rc %d %d %d\\n\", a, b, c); return a || b || c; }}\n"
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
