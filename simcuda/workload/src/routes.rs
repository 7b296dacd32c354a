//! Every way a program reaches a driver allocation function, each with its own sizes so that a
//! tracer test can tell them apart (`routes`), and the check that every lookup route returns the
//! very function `dlsym` finds under the versioned name (`procaddr`).
//!
//! Each route allocates A then B, frees A then B, printing one line per call:
//! `OP route=R fn=SYMBOL size=BYTES addr=0x.. rc=N` (allocations), `OP route=R fn=SYMBOL addr=0x.. rc=N`
//! (frees). Sizes in MiB: direct 3,5; dlsym 7,9; getproc 11,13; getproc-v1 15,17; entrypoint
//! 19,21; entrypoint-noversion 23,25; ptsz 27,29; getproc-ptsz 31,33; runtime 35,37.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::ffi::*;
use crate::{hex, init_runtime, ok, result, Outcome};

const MIB: u64 = 1 << 20;

type AllocFn = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
type FreeFn = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
type AllocAsyncFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
type FreeAsyncFn = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type GetProcV2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

/// (route, first size in MiB)
pub const ROUTES: [(&str, u64); 9] = [
    ("direct", 3),
    ("dlsym", 7),
    ("getproc", 11),
    ("getproc-v1", 15),
    ("entrypoint", 19),
    ("entrypoint-noversion", 23),
    ("ptsz", 27),
    ("getproc-ptsz", 31),
    ("runtime", 35),
];

enum Pair {
    Driver(AllocFn, FreeFn, &'static str, &'static str),
    Async(AllocAsyncFn, FreeAsyncFn, &'static str, &'static str),
    Runtime,
}

fn libcuda() -> Result<*mut c_void, String> {
    // SAFETY: dlopen of a NUL-terminated name (already loaded: this binary links it).
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        Err("dlopen(libcuda.so.1) failed".to_string())
    } else {
        Ok(h)
    }
}

fn sym(h: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        Err(format!("dlsym({name:?}) failed"))
    } else {
        Ok(p)
    }
}

fn get_proc_v2(h: *mut c_void) -> Result<GetProcV2, String> {
    // SAFETY: cuGetProcAddress_v2 has this signature (cuda.h, CUDA 12).
    Ok(unsafe { std::mem::transmute::<*mut c_void, GetProcV2>(sym(h, c"cuGetProcAddress_v2")?) })
}

fn get_proc_v1(h: *mut c_void) -> Result<GetProcV1, String> {
    // SAFETY: cuGetProcAddress has this signature (cuda.h, CUDA 11.3).
    Ok(unsafe { std::mem::transmute::<*mut c_void, GetProcV1>(sym(h, c"cuGetProcAddress")?) })
}

/// Looks `name` up by one of the lookup routes; returns the pointer, the rc and the status.
fn lookup(route: &str, h: *mut c_void, name: &CStr, version: c_int, flags: u64) -> Result<(*mut c_void, i32, i32), String> {
    let mut p = std::ptr::null_mut();
    let mut status = -1;
    // SAFETY: each lookup function gets a NUL-terminated name and valid out-pointers.
    let rc = unsafe {
        match route {
            "getproc" => get_proc_v2(h)?(name.as_ptr(), &mut p, version, flags, &mut status),
            "getproc-v1" => get_proc_v1(h)?(name.as_ptr(), &mut p, version, flags),
            "entrypoint" => cudaGetDriverEntryPointByVersion(name.as_ptr(), &mut p, version as u32, flags, &mut status),
            "entrypoint-noversion" => cudaGetDriverEntryPoint(name.as_ptr(), &mut p, flags, &mut status),
            _ => return Err(format!("{route} is not a lookup route")),
        }
    };
    Ok((p, rc, status))
}

fn found(route: &str, h: *mut c_void, name: &CStr, version: c_int, flags: u64) -> Result<*mut c_void, String> {
    let (p, rc, _) = lookup(route, h, name, version, flags)?;
    ok(&format!("{route} lookup of {name:?}"), rc)?;
    Ok(p)
}

fn pair(route: &str) -> Result<Pair, String> {
    let h = libcuda()?;
    // SAFETY (all transmutes below): the pointers are the driver's functions for these names,
    // whose C signatures are the types transmuted to (cuda.h).
    unsafe {
        let driver = |a: *mut c_void, f: *mut c_void| {
            Pair::Driver(
                std::mem::transmute::<*mut c_void, AllocFn>(a),
                std::mem::transmute::<*mut c_void, FreeFn>(f),
                "cuMemAlloc_v2",
                "cuMemFree_v2",
            )
        };
        Ok(match route {
            "direct" => Pair::Driver(cuMemAlloc_v2, cuMemFree_v2, "cuMemAlloc_v2", "cuMemFree_v2"),
            "dlsym" => driver(sym(h, c"cuMemAlloc_v2")?, sym(h, c"cuMemFree_v2")?),
            "getproc" | "entrypoint" | "entrypoint-noversion" => {
                driver(found(route, h, c"cuMemAlloc", 12000, 0)?, found(route, h, c"cuMemFree", 12000, 0)?)
            }
            "getproc-v1" => driver(found(route, h, c"cuMemAlloc", 11030, 0)?, found(route, h, c"cuMemFree", 11030, 0)?),
            "ptsz" => Pair::Async(cuMemAllocAsync_ptsz, cuMemFreeAsync_ptsz, "cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz"),
            "getproc-ptsz" => {
                let pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
                Pair::Async(
                    std::mem::transmute::<*mut c_void, AllocAsyncFn>(found("getproc", h, c"cuMemAllocAsync", 13000, pt)?),
                    std::mem::transmute::<*mut c_void, FreeAsyncFn>(found("getproc", h, c"cuMemFreeAsync", 13000, pt)?),
                    "cuMemAllocAsync_ptsz",
                    "cuMemFreeAsync_ptsz",
                )
            }
            "runtime" => Pair::Runtime,
            _ => return Err(format!("unknown route {route:?}")),
        })
    }
}

fn run_route(route: &str, first_mib: u64) -> Outcome {
    let pair = pair(route)?;
    let sizes = [first_mib * MIB, (first_mib + 2) * MIB];
    let mut addrs = [0u64; 2];
    for (i, &size) in sizes.iter().enumerate() {
        // SAFETY: valid out-pointers for functions of the declared signatures; stream 0.
        let (name, rc) = unsafe {
            match &pair {
                Pair::Driver(alloc, _, n, _) => (*n, alloc(&mut addrs[i], size as usize)),
                Pair::Async(alloc, _, n, _) => (*n, alloc(&mut addrs[i], size as usize, std::ptr::null_mut())),
                Pair::Runtime => {
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let rc = cudaMalloc(&mut p, size as usize);
                    addrs[i] = p as u64;
                    ("cudaMalloc", rc)
                }
            }
        };
        println!("OP route={route} fn={name} size={size} addr={} rc={rc}", hex(addrs[i]));
        ok(name, rc)?;
    }
    for addr in addrs {
        // SAFETY: freeing what the matching allocation function returned.
        let (name, rc) = unsafe {
            match &pair {
                Pair::Driver(_, free, _, n) => (*n, free(addr)),
                Pair::Async(_, free, _, n) => (*n, free(addr, std::ptr::null_mut())),
                Pair::Runtime => ("cudaFree", cudaFree(addr as *mut c_void)),
            }
        };
        println!("OP route={route} fn={name} addr={} rc={rc}", hex(addr));
        ok(name, rc)?;
    }
    Ok(())
}

pub fn routes(wanted: &[String]) -> Outcome {
    init_runtime()?;
    let mut ran = 0;
    for (route, first) in ROUTES {
        if wanted.is_empty() || wanted.iter().any(|w| w == route) {
            run_route(route, first)?;
            ran += 1;
        }
    }
    if let Some(unknown) = wanted.iter().find(|w| !ROUTES.iter().any(|(r, _)| r == w)) {
        return Err(format!("unknown route {unknown:?}"));
    }
    result!("test" = "routes", "routes" = ran);
    Ok(())
}

/// (base name, CUDA version, flags, the symbol every lookup must return)
const CASES: &[(&CStr, c_int, u64, &CStr)] = &[
    (c"cuInit", 13000, 0, c"cuInit"),
    (c"cuDriverGetVersion", 13000, 0, c"cuDriverGetVersion"),
    (c"cuDeviceGet", 13000, 0, c"cuDeviceGet"),
    (c"cuDeviceGetCount", 13000, 0, c"cuDeviceGetCount"),
    (c"cuDeviceGetName", 13000, 0, c"cuDeviceGetName"),
    (c"cuDeviceGetUuid", 13000, 0, c"cuDeviceGetUuid_v2"),
    (c"cuDeviceGetUuid", 11000, 0, c"cuDeviceGetUuid"),
    (c"cuDeviceTotalMem", 13000, 0, c"cuDeviceTotalMem_v2"),
    (c"cuDevicePrimaryCtxRetain", 13000, 0, c"cuDevicePrimaryCtxRetain"),
    (c"cuDevicePrimaryCtxRelease", 13000, 0, c"cuDevicePrimaryCtxRelease_v2"),
    (c"cuDevicePrimaryCtxRelease", 10020, 0, c"cuDevicePrimaryCtxRelease"),
    (c"cuCtxSetCurrent", 13000, 0, c"cuCtxSetCurrent"),
    (c"cuCtxGetCurrent", 13000, 0, c"cuCtxGetCurrent"),
    (c"cuCtxGetDevice", 13000, 0, c"cuCtxGetDevice"),
    (c"cuCtxSynchronize", 13000, 0, c"cuCtxSynchronize"),
    (c"cuStreamSynchronize", 13000, 0, c"cuStreamSynchronize"),
    (c"cuStreamSynchronize", 13000, 2, c"cuStreamSynchronize_ptsz"),
    (c"cuMemGetInfo", 13000, 0, c"cuMemGetInfo_v2"),
    (c"cuMemAlloc", 13000, 0, c"cuMemAlloc_v2"),
    (c"cuMemAlloc", 3020, 0, c"cuMemAlloc_v2"),
    (c"cuMemAlloc", 13000, 2, c"cuMemAlloc_v2"),
    (c"cuMemAllocPitch", 13000, 0, c"cuMemAllocPitch_v2"),
    (c"cuMemAllocManaged", 13000, 0, c"cuMemAllocManaged"),
    (c"cuMemFree", 13000, 0, c"cuMemFree_v2"),
    (c"cuMemsetD8", 13000, 0, c"cuMemsetD8_v2"),
    (c"cuMemsetD8", 13000, 2, c"cuMemsetD8_v2_ptds"),
    (c"cuMemAddressReserve", 13000, 0, c"cuMemAddressReserve"),
    (c"cuMemAddressFree", 13000, 0, c"cuMemAddressFree"),
    (c"cuMemCreate", 13000, 0, c"cuMemCreate"),
    (c"cuMemRelease", 13000, 0, c"cuMemRelease"),
    (c"cuMemMap", 13000, 0, c"cuMemMap"),
    (c"cuMemUnmap", 13000, 0, c"cuMemUnmap"),
    (c"cuMemSetAccess", 13000, 0, c"cuMemSetAccess"),
    (c"cuMemGetAllocationGranularity", 13000, 0, c"cuMemGetAllocationGranularity"),
    (c"cuMemAllocAsync", 13000, 0, c"cuMemAllocAsync"),
    (c"cuMemAllocAsync", 13000, 1, c"cuMemAllocAsync"),
    (c"cuMemAllocAsync", 13000, 2, c"cuMemAllocAsync_ptsz"),
    (c"cuMemAllocFromPoolAsync", 13000, 0, c"cuMemAllocFromPoolAsync"),
    (c"cuMemAllocFromPoolAsync", 13000, 2, c"cuMemAllocFromPoolAsync_ptsz"),
    (c"cuMemFreeAsync", 13000, 0, c"cuMemFreeAsync"),
    (c"cuMemFreeAsync", 13000, 2, c"cuMemFreeAsync_ptsz"),
    (c"cuMemPoolCreate", 13000, 0, c"cuMemPoolCreate"),
    (c"cuMemPoolDestroy", 13000, 0, c"cuMemPoolDestroy"),
    (c"cuMemPoolTrimTo", 13000, 0, c"cuMemPoolTrimTo"),
    (c"cuMemPoolGetAttribute", 13000, 0, c"cuMemPoolGetAttribute"),
    (c"cuMemPoolSetAttribute", 13000, 0, c"cuMemPoolSetAttribute"),
    (c"cuDeviceGetDefaultMemPool", 13000, 0, c"cuDeviceGetDefaultMemPool"),
    (c"cuDeviceGetMemPool", 13000, 0, c"cuDeviceGetMemPool"),
    (c"cuGetProcAddress", 13000, 0, c"cuGetProcAddress_v2"),
    (c"cuGetProcAddress", 11030, 0, c"cuGetProcAddress"),
    (c"cuGetErrorString", 13000, 0, c"cuGetErrorString"),
    (c"cuGetErrorName", 13000, 0, c"cuGetErrorName"),
];

pub fn procaddr() -> Outcome {
    init_runtime()?;
    let h = libcuda()?;
    let mut mismatches = 0;
    for &(name, version, flags, symbol) in CASES {
        let want = sym(h, symbol)?;
        let mut line = format!("CHECK name={} version={version} flags={flags} symbol={}", name.to_string_lossy(), symbol.to_string_lossy());
        for route in ["getproc", "getproc-v1", "entrypoint"] {
            let (p, rc, status) = lookup(route, h, name, version, flags)?;
            let equal = p == want && rc == 0;
            mismatches += usize::from(!equal);
            line.push_str(&format!(" {route}={} {route}_rc={rc} {route}_status={status}", u8::from(equal)));
        }
        println!("{line}");
    }
    let miss = |name: &CStr, version| lookup("getproc", h, name, version, 0);
    let (p1, rc1, st1) = miss(c"cuNoSuchFunction", 13000)?;
    let (p2, rc2, st2) = miss(c"cuMemAlloc_v2", 13000)?;
    let (p3, rc3, st3) = miss(c"cuMemAllocAsync", 11000)?;
    let (p4, rc4, st4) = lookup("entrypoint", h, c"cuNoSuchFunction", 13000, 0)?;
    result!(
        "test" = "procaddr",
        "checks" = CASES.len(),
        "mismatches" = mismatches,
        "unknown_rc" = rc1,
        "unknown_status" = st1,
        "versioned_name_rc" = rc2,
        "versioned_name_status" = st2,
        "old_version_rc" = rc3,
        "old_version_status" = st3,
        "entrypoint_unknown_rc" = rc4,
        "entrypoint_unknown_status" = st4,
        "null_pointers" = u8::from([p1, p2, p3, p4].iter().all(|p| p.is_null())),
    );
    if mismatches == 0 {
        Ok(())
    } else {
        Err(format!("{mismatches} lookups differ from dlsym"))
    }
}
