//! A scratch folder with the trace tracker's stand-ins built into `lib/` (libc10_cuda.so from
//! tests/python_hook/tracker/standin_c10_cuda.cpp against the stand-in torch's headers, and an
//! empty libc10.so), with `cache/` and `state/` beside them, removed when dropped. Shared by the
//! tests that run the stand-in torch under `gpufrag run` with the tracker (run_torch_tracker,
//! foresight_live).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The scratch folder; `lib/`, `cache/`, `state/` inside.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    /// `$TMPDIR/gpufrag-PREFIX-PID-NAME`, emptied, with the stand-ins built.
    pub fn new(prefix: &str, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("gpufrag-{prefix}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["lib", "cache", "state"] {
            std::fs::create_dir_all(dir.join(d)).expect("scratch dir");
        }
        let t = root().join("tests/python_hook/tracker");
        let out = Command::new("c++")
            .args(["-O1", "-shared", "-fPIC", "-std=c++20", "-I"])
            .arg(t.join("torch/include"))
            .arg(t.join("standin_c10_cuda.cpp"))
            .arg("-o")
            .arg(dir.join("lib/libc10_cuda.so"))
            .output()
            .expect("c++ (the tracker tests need a C++ compiler)");
        assert!(out.status.success(), "building the stand-in libc10_cuda.so: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(dir.join("c10.c"), "int gpufrag_standin_c10;\n").expect("c10.c");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC"])
            .arg(dir.join("c10.c"))
            .arg("-o")
            .arg(dir.join("lib/libc10.so"))
            .output()
            .expect("cc");
        assert!(out.status.success(), "building the stand-in libc10.so: {}", String::from_utf8_lossy(&out.stderr));
        Scratch { dir }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
