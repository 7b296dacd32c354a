// Shared by the build scripts of simcuda/driver, simcuda/runtime and simcuda/nvml (through
// `include!`): gives the cdylib its real SONAME and stages it under its real names.
//
// Cargo writes the cdylib as `<target>/<profile>/deps/lib<name>.so`; programs look for
// `libcuda.so.1`, `libcudart.so.13`, `libnvidia-ml.so.1`. So each build script links
// `<target>/<profile>/simcuda/<real name>` → `../deps/lib<name>.so` (relative, so the target
// directory can move), before the cdylib exists; the link resolves once cargo has built it.
// `LD_LIBRARY_PATH=<target>/<profile>/simcuda` then finds the stand-ins; `simcuda/stage.sh` copies
// them elsewhere instead.

use std::path::PathBuf;

fn stage(cdylib_file: &str, soname: &str, aliases: &[&str]) {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../build_support.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=OUT_DIR unset: not staging {cdylib_file}");
        return;
    };
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let Some(profile_dir) = out_dir.ancestors().nth(3) else {
        println!("cargo:warning=unexpected OUT_DIR {}: not staging {cdylib_file}", out_dir.display());
        return;
    };
    let stage_dir = profile_dir.join("simcuda");
    if let Err(e) = std::fs::create_dir_all(&stage_dir) {
        println!("cargo:warning=cannot create {}: {e}", stage_dir.display());
        return;
    }
    for alias in aliases {
        let link = stage_dir.join(alias);
        let _ = std::fs::remove_file(&link);
        if let Err(e) = std::os::unix::fs::symlink(format!("../deps/{cdylib_file}"), &link) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                println!("cargo:warning=cannot link {}: {e}", link.display());
            }
        }
    }
}
