//! `cuGetProcAddress` (CUDA 11.3) and `cuGetProcAddress_v2` (CUDA 12): a base name plus the
//! caller's CUDA version and stream flags select one exported function, as in the real driver
//! (`cuMemAlloc` at 3020 and later → `cuMemAlloc_v2`; `cuMemAllocAsync` with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` → `cuMemAllocAsync_ptsz`). The pointers are
//! the library's own definitions (the library is linked `-Bsymbolic`), hence exactly what
//! `dlsym(handle_of_libcuda, "cuMemAlloc_v2")` returns, and never an LD_PRELOAD interposer's. No
//! `dlsym` is called here, so a shim that wraps `dlsym` is not re-entered.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void, CStr};

use simcuda_core::ffi::*;

use crate::api::*;
use crate::{entry, put};

/// One version of one base name: from CUDA `since`, the legacy-stream symbol and, where one
/// exists, the per-thread-default-stream symbol.
struct Version {
    since: c_int,
    symbol: &'static str,
    func: *mut c_void,
    per_thread: Option<(&'static str, *mut c_void)>,
}

macro_rules! v {
    ($since:expr, $f:ident) => {
        Version { since: $since, symbol: stringify!($f), func: $f as *mut c_void, per_thread: None }
    };
    ($since:expr, $f:ident, $pt:ident) => {
        Version { since: $since, symbol: stringify!($f), func: $f as *mut c_void, per_thread: Some((stringify!($pt), $pt as *mut c_void)) }
    };
}

/// The versions of base name `name`, oldest first; empty when the driver has no such function.
fn versions(name: &str) -> Vec<Version> {
    match name {
        "cuInit" => vec![v!(2000, cuInit)],
        "cuDriverGetVersion" => vec![v!(2020, cuDriverGetVersion)],
        "cuDeviceGet" => vec![v!(2000, cuDeviceGet)],
        "cuDeviceGetCount" => vec![v!(2000, cuDeviceGetCount)],
        "cuDeviceGetName" => vec![v!(2000, cuDeviceGetName)],
        "cuDeviceGetUuid" => vec![v!(9020, cuDeviceGetUuid), v!(11040, cuDeviceGetUuid_v2)],
        "cuDeviceTotalMem" => vec![v!(3020, cuDeviceTotalMem_v2)],
        "cuDevicePrimaryCtxRetain" => vec![v!(7000, cuDevicePrimaryCtxRetain)],
        "cuDevicePrimaryCtxRelease" => {
            vec![v!(7000, cuDevicePrimaryCtxRelease), v!(11000, cuDevicePrimaryCtxRelease_v2)]
        }
        "cuCtxSetCurrent" => vec![v!(4000, cuCtxSetCurrent)],
        "cuCtxGetCurrent" => vec![v!(4000, cuCtxGetCurrent)],
        "cuCtxGetDevice" => vec![v!(2000, cuCtxGetDevice)],
        "cuCtxSynchronize" => vec![v!(2000, cuCtxSynchronize)],
        "cuStreamSynchronize" => vec![v!(2000, cuStreamSynchronize, cuStreamSynchronize_ptsz)],
        "cuMemGetInfo" => vec![v!(3020, cuMemGetInfo_v2)],
        "cuMemAlloc" => vec![v!(3020, cuMemAlloc_v2)],
        "cuIpcGetMemHandle" => vec![v!(4010, cuIpcGetMemHandle)],
        "cuMemAllocPitch" => vec![v!(3020, cuMemAllocPitch_v2)],
        "cuMemAllocManaged" => vec![v!(6000, cuMemAllocManaged)],
        "cuMemFree" => vec![v!(3020, cuMemFree_v2)],
        "cuMemsetD8" => vec![v!(3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds)],
        "cuMemAddressReserve" => vec![v!(10020, cuMemAddressReserve)],
        "cuMemAddressFree" => vec![v!(10020, cuMemAddressFree)],
        "cuMemCreate" => vec![v!(10020, cuMemCreate)],
        "cuMemRelease" => vec![v!(10020, cuMemRelease)],
        "cuMemMap" => vec![v!(10020, cuMemMap)],
        "cuMemUnmap" => vec![v!(10020, cuMemUnmap)],
        "cuMemSetAccess" => vec![v!(10020, cuMemSetAccess)],
        "cuMemGetAllocationGranularity" => vec![v!(10020, cuMemGetAllocationGranularity)],
        "cuMemAllocAsync" => vec![v!(11020, cuMemAllocAsync, cuMemAllocAsync_ptsz)],
        "cuMemAllocFromPoolAsync" => vec![v!(11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)],
        "cuMemFreeAsync" => vec![v!(11020, cuMemFreeAsync, cuMemFreeAsync_ptsz)],
        "cuMemPoolCreate" => vec![v!(11020, cuMemPoolCreate)],
        "cuMemPoolDestroy" => vec![v!(11020, cuMemPoolDestroy)],
        "cuMemPoolTrimTo" => vec![v!(11020, cuMemPoolTrimTo)],
        "cuMemPoolGetAttribute" => vec![v!(11020, cuMemPoolGetAttribute)],
        "cuMemPoolSetAttribute" => vec![v!(11020, cuMemPoolSetAttribute)],
        "cuDeviceGetDefaultMemPool" => vec![v!(11020, cuDeviceGetDefaultMemPool)],
        "cuDeviceGetMemPool" => vec![v!(11020, cuDeviceGetMemPool)],
        "cuGetProcAddress" => vec![v!(11030, cuGetProcAddress), v!(12000, cuGetProcAddress_v2)],
        "cuGetErrorString" => vec![v!(6000, cuGetErrorString)],
        "cuGetErrorName" => vec![v!(6000, cuGetErrorName)],
        _ => Vec::new(),
    }
}

/// Resolves `name` for `version` and `flags`: `Ok((symbol, pointer))` or `Err(query result)`.
pub fn resolve(name: &str, version: c_int, flags: u64) -> Result<(&'static str, *mut c_void), c_int> {
    let all = versions(name);
    if all.is_empty() {
        return Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    let v = all.into_iter().rev().find(|v| v.since <= version).ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)?;
    match v.per_thread {
        Some(pt) if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 => Ok(pt),
        _ => Ok((v.symbol, v.func)),
    }
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
    symbolStatus: *mut c_int,
) -> Result<(), CUresult> {
    let valid_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if symbol.is_null() || pfn.is_null() || flags & !valid_flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: pfn is non-null and points to a void* per the C contract.
    unsafe { pfn.write(std::ptr::null_mut()) };
    // SAFETY: symbol is a non-null NUL-terminated string per the C contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let (status, rc) = match resolve(name, cudaVersion, flags) {
        Ok((_, f)) => {
            // SAFETY: as above.
            unsafe { pfn.write(f) };
            (CU_GET_PROC_ADDRESS_SUCCESS, Ok(()))
        }
        Err(status) => (status, Err(CUDA_ERROR_NOT_FOUND)),
    };
    if !symbolStatus.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(symbolStatus, status) }?;
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: u64) -> CUresult {
    entry("cuGetProcAddress", || get_proc_address(symbol, pfn, cudaVersion, flags, std::ptr::null_mut()))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
    symbolStatus: *mut c_int,
) -> CUresult {
    entry("cuGetProcAddress_v2", || get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_stream_flags_pick_the_symbol() {
        let sym = |n, v, f| resolve(n, v, f).map(|(s, _)| s);
        assert_eq!(sym("cuMemAlloc", 13000, 0), Ok("cuMemAlloc_v2"));
        assert_eq!(sym("cuMemAlloc", 3000, 0), Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
        assert_eq!(sym("cuMemAlloc_v2", 13000, 0), Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(sym("cuMemAllocAsync", 12000, 2), Ok("cuMemAllocAsync_ptsz"));
        assert_eq!(sym("cuMemAllocAsync", 12000, 1), Ok("cuMemAllocAsync"));
        assert_eq!(sym("cuMemAlloc", 12000, 2), Ok("cuMemAlloc_v2"), "no per-thread variant");
        assert_eq!(sym("cuDevicePrimaryCtxRelease", 10020, 0), Ok("cuDevicePrimaryCtxRelease"));
        assert_eq!(sym("cuDevicePrimaryCtxRelease", 11000, 0), Ok("cuDevicePrimaryCtxRelease_v2"));
        assert_eq!(sym("cuGetProcAddress", 12000, 0), Ok("cuGetProcAddress_v2"));
        assert_eq!(sym("cuMemsetD8", 12000, 2), Ok("cuMemsetD8_v2_ptds"));
    }
}
