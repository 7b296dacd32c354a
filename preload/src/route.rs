//! The driver's own lookup routes: `cuGetProcAddress` / `cuGetProcAddress_v2` and the runtime's
//! `cudaGetDriverEntryPoint` / `cudaGetDriverEntryPointByVersion`. libcudart fetches every
//! driver entry point this way, and so do PyTorch's expandable segments, NCCL and JAX.
//!
//! Each wrapper calls the real lookup, then identifies which exported function the returned
//! pointer is (`table::identify`: the symbol at exactly that address, cross-checked against the
//! requested base name, else the driver's rules of name, version and stream flags), stores the
//! real pointer in that ABI's slot and returns the wrapper of that same ABI. A legacy ABI (v1
//! `cuMemAlloc` for a caller below CUDA 3.2) or an untracked function passes through. A lookup
//! never records an event, and swapping does not depend on the re-entrancy guard: the pointer
//! handed out outlives the call that fetched it.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use crate::cuda::*;
use crate::state;
use crate::table::{self, real_fn, Identity, Sym};

/// The CUDA version assumed for `cudaGetDriverEntryPoint`, which names none: the newest ABIs.
const LATEST: i32 = i32::MAX;

/// Replaces the pointer at `pfn` with our wrapper when it is a tracked ABI's real function.
///
/// # Safety
/// `pfn` must be null or point to a `void*`; `symbol` must be null or NUL-terminated.
unsafe fn swap_out(pfn: *mut *mut c_void, symbol: *const c_char, cuda_version: i32, flags: u64) {
    if pfn.is_null() || symbol.is_null() || !state::swapping() {
        return;
    }
    let done = std::panic::catch_unwind(|| {
        // SAFETY: non-null, written by the real lookup that just succeeded.
        let found = unsafe { pfn.read() };
        // SAFETY: symbol is non-null and NUL-terminated per the caller's contract.
        if let Identity::Tracked(s) = unsafe { table::identify(found, symbol, cuda_version, flags) } {
            if table::store(s, found as usize) {
                // SAFETY: as above.
                unsafe { pfn.write(table::wrapper(s) as *mut c_void) };
            }
        }
    });
    if done.is_err() {
        state::disable_after_panic();
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: u64) -> CUresult {
    // SAFETY: CuGetProcAddressFn is cuGetProcAddress's C type.
    let Some(real) = (unsafe { real_fn::<CuGetProcAddressFn>(Sym::CuGetProcAddress) }) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(symbol, pfn, cudaVersion, flags) };
    if rc == 0 {
        // SAFETY: the lookup succeeded, so pfn holds what it wrote.
        unsafe { swap_out(pfn, symbol, cudaVersion, flags) };
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
    symbolStatus: *mut c_int,
) -> CUresult {
    // SAFETY: CuGetProcAddressV2Fn is cuGetProcAddress_v2's C type.
    let Some(real) = (unsafe { real_fn::<CuGetProcAddressV2Fn>(Sym::CuGetProcAddressV2) }) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(symbol, pfn, cudaVersion, flags, symbolStatus) };
    if rc == 0 {
        // SAFETY: the lookup succeeded, so pfn holds what it wrote.
        unsafe { swap_out(pfn, symbol, cudaVersion, flags) };
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    funcPtr: *mut *mut c_void,
    flags: c_ulonglong,
    driverStatus: *mut c_int,
) -> cudaError_t {
    // SAFETY: CudaGetDriverEntryPointFn is cudaGetDriverEntryPoint's C type (CUDA 12; a CUDA 11
    // caller passes three arguments, and the fourth register is forwarded as it came).
    let Some(real) = (unsafe { real_fn::<CudaGetDriverEntryPointFn>(Sym::CudaGetDriverEntryPoint) }) else {
        return CUDA_ERROR_SYMBOL_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(symbol, funcPtr, flags, driverStatus) };
    if rc == 0 {
        // SAFETY: the lookup succeeded, so funcPtr holds what it wrote.
        unsafe { swap_out(funcPtr, symbol, LATEST, flags) };
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    funcPtr: *mut *mut c_void,
    cudaVersion: c_uint,
    flags: c_ulonglong,
    driverStatus: *mut c_int,
) -> cudaError_t {
    // SAFETY: CudaGetDriverEntryPointByVersionFn is this function's C type.
    let Some(real) = (unsafe { real_fn::<CudaGetDriverEntryPointByVersionFn>(Sym::CudaGetDriverEntryPointByVersion) }) else {
        return CUDA_ERROR_SYMBOL_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(symbol, funcPtr, cudaVersion, flags, driverStatus) };
    if rc == 0 {
        let version = i32::try_from(cudaVersion).unwrap_or(LATEST);
        // SAFETY: the lookup succeeded, so funcPtr holds what it wrote.
        unsafe { swap_out(funcPtr, symbol, version, flags) };
    }
    rc
}
