//! Build script of simcuda-workload: links the binary against the stand-ins staged in
//! `<target>/<profile>/simcuda/` by the driver's and runtime's build scripts (`-lcudart -lcuda`,
//! giving DT_NEEDED `libcudart.so.13` and `libcuda.so.1`, like a real CUDA program), and gives
//! it a RUNPATH to that directory (`$ORIGIN/simcuda` from `target/<profile>/`, `$ORIGIN` for a copy
//! staged beside the libraries by `simcuda/stage.sh`,
//! `$ORIGIN/../simcuda` from `deps/`). LD_LIBRARY_PATH still comes first, so a real driver and
//! runtime can be put in front.
//!
//! It also compiles `src/annotate.c`, the caching allocator's announcements through
//! `include/gpufrag_annotate.h` (USDT probes and the shim's functions), as a C allocator would.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/annotate.c");
    println!("cargo:rerun-if-changed=../../include/gpufrag_annotate.h");
    cc::Build::new().file("src/annotate.c").include("../../include").opt_level(2).warnings(true).compile("simcuda_announce");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let profile_dir = out_dir.ancestors().nth(3).expect("OUT_DIR has the layout cargo gives it");
    println!("cargo:rustc-link-search=native={}", profile_dir.join("simcuda").display());
    println!("cargo:rustc-link-arg-bins=-Wl,-rpath,$ORIGIN:$ORIGIN/simcuda:$ORIGIN/../simcuda");
}
