//! Wrappers of the CUDA runtime's memory API (`libcudart`), under the real names and C
//! signatures. A runtime call is recorded here, at the level the program called, and the driver
//! calls the runtime makes inside it pass through unrecorded (the re-entrancy guard), so each
//! allocation is recorded once whichever route the runtime uses to reach the driver.
//!
//! | call | event |
//! |---|---|
//! | `cudaMalloc` | `MemAlloc{addr, size}` |
//! | `cudaMallocPitch` | `MemAllocPitch{addr, size = pitch × height, requested = width × height}` |
//! | `cudaMalloc3D` | `MemAllocPitch{addr, size = pitch × height × depth, requested = width × height × depth}` |
//! | `cudaMallocManaged` | `MemAllocManaged{addr, size}` |
//! | `cudaMallocAsync[_ptsz]` | `PoolAlloc{addr, size, handle = the device's current pool, stream}` |
//! | `cudaMallocFromPoolAsync[_ptsz]` | `PoolAlloc{addr, size, handle = pool, stream}` |
//! | `cudaFree` | `MemFree{addr}` (not for `cudaFree(NULL)`, the usual context warm-up) |
//! | `cudaFreeAsync[_ptsz]` | `PoolFree{addr, stream}` |
//! | `cudaMemPoolTrimTo` | `PoolTrim{handle = pool, size = minBytesToKeep}` |
//! | `cudaMemGetInfo` | `DeviceInfo{size = total, device_free = free}` |
//! | `cudaIpcGetMemHandle` | `IpcExport{addr = devPtr, rc}` |
//!
//! `cudaFree` and `cudaFreeAsync*` are recorded before the real call, and a failure adds the same
//! event with `rc` and `F_FAILED` (see `hook::release_around` and the driver wrappers).

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};

use gpufrag_wire::event::EventKind;

use crate::caller;
use crate::cuda::*;
use crate::hook::{self, out, Call, Pool};
use crate::table::{real_fn, Sym};

/// Looks up the real function of `$sym` as `$ty`, or returns `cudaErrorSymbolNotFound`.
macro_rules! real {
    ($sym:ident, $ty:ty) => {
        // SAFETY: `$ty` is the C type of the function named by `Sym::$sym`.
        match unsafe { real_fn::<$ty>(Sym::$sym) } {
            Some(f) => f,
            None => return CUDA_ERROR_SYMBOL_NOT_FOUND,
        }
    };
}

/// Reads a `void**` out-parameter as an address.
///
/// # Safety
/// As [`out`].
unsafe fn out_ptr(p: *mut *mut c_void) -> u64 {
    // SAFETY: per the caller's contract.
    unsafe { out(p.cast_const()) as u64 }
}

caller::thunk!(cudaMalloc => with_caller_cudaMalloc, x86_64: "rdx", aarch64: "x2");

/// `cudaMalloc`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cudaMalloc(devPtr: *mut *mut c_void, size: usize, caller: usize) -> cudaError_t {
    let real = real!(CudaMalloc, CudaMallocFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged, to the function the caller meant to call.
    let rc = unsafe { real(devPtr, size) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the runtime wrote the address.
            let addr = if rc == 0 { unsafe { out_ptr(devPtr) } } else { 0 };
            let size = size as u64;
            hook::alloc(
                Call { addr, size, requested: size, caller: caller as u64, ..Call::new(EventKind::MemAlloc, rc) },
                None,
                Pool::Given,
            );
        });
    }
    rc
}

caller::thunk!(cudaMallocPitch => with_caller_cudaMallocPitch, x86_64: "r8", aarch64: "x4");

/// `cudaMallocPitch`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cudaMallocPitch(
    devPtr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    caller: usize,
) -> cudaError_t {
    let real = real!(CudaMallocPitch, CudaMallocPitchFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(devPtr, pitch, width, height) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the runtime wrote both out-parameters.
            let (addr, p) = if rc == 0 { unsafe { (out_ptr(devPtr), out(pitch)) } } else { (0, 0) };
            let c = Call {
                addr,
                size: (p as u64).saturating_mul(height as u64),
                requested: (width as u64).saturating_mul(height as u64),
                caller: caller as u64,
                ..Call::new(EventKind::MemAllocPitch, rc)
            };
            hook::alloc(c, None, Pool::Given);
        });
    }
    rc
}

caller::thunk!(cudaMalloc3D => with_caller_cudaMalloc3D, x86_64: "rsi", aarch64: "x2");

/// `cudaMalloc3D`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cudaMalloc3D(pitchedDevPtr: *mut cudaPitchedPtr, extent: cudaExtent, caller: usize) -> cudaError_t {
    let real = real!(CudaMalloc3D, CudaMalloc3DFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged (the extent is passed by value, as in C).
    let rc = unsafe { real(pitchedDevPtr, extent) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the runtime wrote the pitched pointer.
            let p = if rc == 0 { unsafe { pitchedDevPtr.as_ref() }.copied() } else { None };
            let (addr, pitch) = p.map_or((0, 0), |p| (p.ptr as u64, p.pitch as u64));
            let rows = (extent.height as u64).saturating_mul(extent.depth as u64);
            let c = Call {
                addr,
                size: pitch.saturating_mul(rows),
                requested: (extent.width as u64).saturating_mul(rows),
                caller: caller as u64,
                ..Call::new(EventKind::MemAllocPitch, rc)
            };
            hook::alloc(c, None, Pool::Given);
        });
    }
    rc
}

caller::thunk!(cudaMallocManaged => with_caller_cudaMallocManaged, x86_64: "rcx", aarch64: "x3");

/// `cudaMallocManaged`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cudaMallocManaged(devPtr: *mut *mut c_void, size: usize, flags: c_uint, caller: usize) -> cudaError_t {
    let real = real!(CudaMallocManaged, CudaMallocManagedFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(devPtr, size, flags) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the runtime wrote the address.
            let addr = if rc == 0 { unsafe { out_ptr(devPtr) } } else { 0 };
            let size = size as u64;
            hook::alloc(
                Call { addr, size, requested: size, caller: caller as u64, ..Call::new(EventKind::MemAllocManaged, rc) },
                None,
                Pool::Given,
            );
        });
    }
    rc
}

/// `cudaMallocAsync` and its `_ptsz` form.
///
/// # Safety
/// As the C function.
#[inline(always)]
unsafe fn malloc_async(real: CudaMallocAsyncFn, devPtr: *mut *mut c_void, size: usize, stream: CUstream) -> cudaError_t {
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(devPtr, size, stream) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the runtime wrote the address.
            let addr = if rc == 0 { unsafe { out_ptr(devPtr) } } else { 0 };
            let size = size as u64;
            let c = Call { addr, size, requested: size, stream: stream as u64, ..Call::new(EventKind::PoolAlloc, rc) };
            hook::alloc(c, None, Pool::CurrentOfDevice);
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(devPtr: *mut *mut c_void, size: usize, hStream: CUstream) -> cudaError_t {
    let real = real!(CudaMallocAsync, CudaMallocAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { malloc_async(real, devPtr, size, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(devPtr: *mut *mut c_void, size: usize, hStream: CUstream) -> cudaError_t {
    let real = real!(CudaMallocAsyncPtsz, CudaMallocAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { malloc_async(real, devPtr, size, hStream) }
}

/// `cudaMallocFromPoolAsync` and its `_ptsz` form.
///
/// # Safety
/// As the C function.
#[inline(always)]
unsafe fn malloc_from_pool(
    real: CudaMallocFromPoolAsyncFn,
    devPtr: *mut *mut c_void,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> cudaError_t {
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(devPtr, size, pool, stream) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the runtime wrote the address.
            let addr = if rc == 0 { unsafe { out_ptr(devPtr) } } else { 0 };
            let size = size as u64;
            let c = Call { addr, size, requested: size, handle: pool as u64, stream: stream as u64, ..Call::new(EventKind::PoolAlloc, rc) };
            hook::alloc(c, None, Pool::Given);
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    memPool: CUmemoryPool,
    stream: CUstream,
) -> cudaError_t {
    let real = real!(CudaMallocFromPoolAsync, CudaMallocFromPoolAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { malloc_from_pool(real, ptr, size, memPool, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync_ptsz(
    ptr: *mut *mut c_void,
    size: usize,
    memPool: CUmemoryPool,
    stream: CUstream,
) -> cudaError_t {
    let real = real!(CudaMallocFromPoolAsyncPtsz, CudaMallocFromPoolAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { malloc_from_pool(real, ptr, size, memPool, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(devPtr: *mut c_void) -> cudaError_t {
    let real = real!(CudaFree, CudaFreeFn);
    let c = Call { addr: devPtr as u64, ..Call::new(EventKind::MemFree, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), !devPtr.is_null(), c, || unsafe { real(devPtr) })
}

/// `cudaFreeAsync` and its `_ptsz` form.
///
/// # Safety
/// As the C function.
#[inline(always)]
unsafe fn free_async(real: CudaFreeAsyncFn, devPtr: *mut c_void, stream: CUstream) -> cudaError_t {
    let c = Call { addr: devPtr as u64, stream: stream as u64, ..Call::new(EventKind::PoolFree, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), !devPtr.is_null(), c, || unsafe { real(devPtr, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(devPtr: *mut c_void, hStream: CUstream) -> cudaError_t {
    let real = real!(CudaFreeAsync, CudaFreeAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { free_async(real, devPtr, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(devPtr: *mut c_void, hStream: CUstream) -> cudaError_t {
    let real = real!(CudaFreeAsyncPtsz, CudaFreeAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { free_async(real, devPtr, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolTrimTo(memPool: CUmemoryPool, minBytesToKeep: usize) -> cudaError_t {
    let real = real!(CudaMemPoolTrimTo, CudaMemPoolTrimToFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(memPool, minBytesToKeep) };
    if let Some(g) = guard {
        g.record(|| hook::other(Call { handle: memPool as u64, size: minBytesToKeep as u64, ..Call::new(EventKind::PoolTrim, rc) }));
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t {
    let real = real!(CudaMemGetInfo, CudaMemGetInfoFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(free, total) };
    if let Some(g) = guard {
        if rc == 0 && !free.is_null() && !total.is_null() {
            // SAFETY: on success the runtime wrote both.
            g.record(|| unsafe { hook::device_info(free.read() as u64, total.read() as u64) });
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: *mut c_void, devPtr: *mut c_void) -> cudaError_t {
    let real = real!(CudaIpcGetMemHandle, CudaIpcGetMemHandleFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(handle, devPtr) };
    if let Some(g) = guard {
        g.record(|| hook::other(Call { addr: devPtr as u64, ..Call::new(EventKind::IpcExport, rc) }));
    }
    rc
}
