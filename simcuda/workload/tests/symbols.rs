//! The stand-ins' ELF interfaces: libcuda.so.1 exports the driver API under its real names as
//! distinct functions (uprobes need real, separate symbols); libcudart.so.13 has no link-time
//! reference to any `cu*` symbol (it must reach the driver through dlopen + cuGetProcAddress, the
//! trap that makes a `cuMemAlloc_v2` interposer blind); every lookup route returns exactly what
//! `dlsym` returns for the versioned name; SONAMEs are the real ones.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use common::*;

fn nm(lib: &Path, flag: &str) -> String {
    let out = Command::new("nm").args(["-D", flag]).arg(lib).output().expect("run nm (binutils)");
    assert!(out.status.success(), "nm {flag} {}", lib.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `name → (type, address)` of the defined dynamic symbols.
fn exports(lib: &Path) -> BTreeMap<String, (String, String)> {
    nm(lib, "--defined-only")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3).then(|| (f[2].split('@').next().unwrap_or(f[2]).to_string(), (f[1].to_string(), f[0].to_string())))
        })
        .collect()
}

const DRIVER_EXPORTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolTrimTo",
    "cuMemPoolGetAttribute",
    "cuMemPoolSetAttribute",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetMemPool",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuMemsetD8_v2",
    "cuMemsetD8_v2_ptds",
];

#[test]
fn the_driver_exports_each_function_as_its_own_symbol() {
    let ex = exports(&stage_dir().join("libcuda.so.1"));
    for name in DRIVER_EXPORTS {
        let (kind, _) = ex.get(*name).unwrap_or_else(|| panic!("libcuda.so.1 does not export {name}"));
        assert_eq!(kind, "T", "{name} is not a function in .text");
    }
    let cu: Vec<_> = ex.iter().filter(|(n, _)| n.starts_with("cu")).collect();
    let addresses: BTreeSet<_> = cu.iter().map(|(_, (_, a))| a).collect();
    assert_eq!(addresses.len(), cu.len(), "two exported driver functions share an address");
    let others: Vec<_> = ex.keys().filter(|n| !n.starts_with("cu")).collect();
    assert!(others.is_empty(), "libcuda.so.1 exports more than the driver API: {others:?}");
}

#[test]
fn the_runtime_reaches_the_driver_only_at_run_time() {
    for lib in ["libcudart.so.13", "libcudart.so.12"] {
        let undefined = nm(&stage_dir().join(lib), "--undefined-only");
        let cu: Vec<&str> = undefined.lines().filter_map(|l| l.split_whitespace().last()).filter(|s| s.starts_with("cu")).collect();
        assert!(cu.is_empty(), "{lib} references driver symbols at link time: {cu:?}");
        assert!(undefined.contains("dlsym"), "{lib} should look the driver up with dlsym");
    }
    let ex = exports(&stage_dir().join("libcudart.so.13"));
    for name in ["cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion"] {
        assert!(ex.contains_key(name), "libcudart.so.13 does not export {name}");
    }
}

#[test]
fn sonames_are_the_real_ones() {
    for (file, soname) in [
        ("libcuda.so.1", "libcuda.so.1"),
        ("libcudart.so.13", "libcudart.so.13"),
        ("libcudart.so.12", "libcudart.so.13"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.1"),
    ] {
        let out = Command::new("readelf").arg("-d").arg(stage_dir().join(file)).output().expect("run readelf");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("Library soname: [{soname}]")), "{file}:\n{text}");
    }
}

#[test]
fn every_lookup_route_returns_what_dlsym_returns() {
    let sim = Sim::new("procaddr", "1GiB", "64MiB");
    let out = sim.run(&["procaddr"]);
    let checks = lines(&out, "CHECK");
    assert_eq!(checks.len(), 52);
    for c in &checks {
        for route in ["getproc", "getproc-v1", "entrypoint"] {
            assert_eq!(c[route], "1", "{route} differs from dlsym({}) for {c:?}", c["symbol"]);
        }
        assert_eq!((c["getproc_status"].as_str(), c["entrypoint_status"].as_str()), ("0", "0"), "{c:?}");
    }
    assert_fields(
        &lines(&out, "RESULT")[0],
        &[
            ("mismatches", 0),
            ("unknown_rc", 500),
            ("unknown_status", 1),
            ("versioned_name_rc", 500),
            ("versioned_name_status", 1),
            ("old_version_rc", 500),
            ("old_version_status", 2),
            ("entrypoint_unknown_rc", 500),
            ("entrypoint_unknown_status", 1),
            ("null_pointers", 1),
        ],
    );
}
