//! Build script of the root package: compiles the eBPF programs in `bpf/` with clang and
//! generates their Rust skeleton (libbpf-cargo's `SkeletonBuilder`) into `OUT_DIR`, where
//! `src/ebpf/mod.rs` includes it. The skeleton is never committed.
//!
//! Needs Debian's `clang`, `libelf-dev`, `zlib1g-dev`, `pkg-config` and `linux-libc-dev` (for the
//! UAPI `<linux/bpf.h>` and `<asm/ptrace.h>`); libbpf itself and its BPF headers come vendored
//! with libbpf-sys. `.ci/run` installs them.

use libbpf_cargo::SkeletonBuilder;
use std::path::PathBuf;

const SOURCE: &str = "bpf/gpufrag.bpf.c";

fn main() {
    for f in [SOURCE, "include/gpufrag_event.h", "build.rs"] {
        println!("cargo:rerun-if-changed={f}");
    }
    if let Ok(dir) = std::fs::read_dir("bpf") {
        for e in dir.flatten() {
            println!("cargo:rerun-if-changed={}", e.path().display());
        }
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    // Debian keeps the architecture's <asm/*.h> in a multiarch directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let include = manifest.join("include");
    let mut builder = SkeletonBuilder::new();
    builder.source(manifest.join(SOURCE)).clang_args([
        "-I".to_string(),
        include.display().to_string(),
        "-I".to_string(),
        multiarch,
        "-Wall".to_string(),
        "-Wno-unused-function".to_string(),
    ]);
    if let Err(e) = builder.build_and_generate(out.join("gpufrag.skel.rs")) {
        panic!(
            "building the eBPF programs ({SOURCE}) failed: {e:#}\n\
             It needs clang, libelf-dev, zlib1g-dev, pkg-config and linux-libc-dev \
             (Debian: apt-get install clang libelf-dev zlib1g-dev pkg-config linux-libc-dev)."
        );
    }
}
