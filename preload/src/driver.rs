//! Wrappers of the driver's memory API, under the real exported names and C signatures: the
//! program's own calls reach them by direct linking (the preload comes first in the global
//! scope), and every lookup route hands them out in place of the real functions.
//!
//! Each wrapper finds the real function in its ABI's slot, enters the re-entrancy guard, makes
//! the real call with the caller's arguments unchanged, records it, and returns the real result.
//! A release (`cuMemFree_v2`, `cuMemFreeAsync*`, `cuMemUnmap`, `cuMemRelease`,
//! `cuMemAddressFree`) is recorded *before* the real call, so that no other thread can be handed
//! the memory and record it first; if the call then fails, a second event of the same kind with
//! the `rc` and `F_FAILED` follows (see `hook::release_around`).
//! What each call records (see `hook` for devices and samples):
//!
//! | call | event |
//! |---|---|
//! | `cuMemAlloc_v2` | `MemAlloc{addr, size}` |
//! | `cuMemAllocPitch_v2` | `MemAllocPitch{addr, size = pitch × height, requested = width × height}` |
//! | `cuMemAllocManaged` | `MemAllocManaged{addr, size}` |
//! | `cuMemFree_v2` | `MemFree{addr}` (not for 0) |
//! | `cuMemAddressReserve` / `cuMemAddressFree` | `AddressReserve{addr, size}` / `AddressFree{addr, size}` |
//! | `cuMemCreate` / `cuMemRelease` | `PhysCreate{handle, size}` (device from the properties) / `PhysRelease{handle}` |
//! | `cuMemMap` / `cuMemUnmap` | `Map{addr, size, handle, requested = offset}` / `Unmap{addr, size}` |
//! | `cuMemAllocAsync[_ptsz]` | `PoolAlloc{addr, size, handle = the device's current pool, stream}` |
//! | `cuMemAllocFromPoolAsync[_ptsz]` | `PoolAlloc{addr, size, handle = pool, stream}` |
//! | `cuMemFreeAsync[_ptsz]` | `PoolFree{addr, stream}` |
//! | `cuMemPoolTrimTo` | `PoolTrim{handle = pool, size = minBytesToKeep}`, then the pool's `PoolReserved` |
//! | `cuMemPoolGetAttribute(RESERVED_MEM_CURRENT)` | `PoolReserved{handle = pool, size = the value}` (other attributes: nothing) |
//! | `cuMemGetInfo_v2` | `DeviceInfo{size = total, device_free = free}` |
//! | `cuIpcGetMemHandle` | `IpcExport{addr = dptr, rc}` |
//!
//! A failed allocation becomes `AllocFailed{requested, rc, op}` (see `hook::alloc`). A failed
//! release is its event followed by the same event with `rc` and `F_FAILED`. The state refuses a
//! release the driver would refuse (an unmap that cuts a mapping, an address free with memory
//! mapped, an unknown handle) and leaves itself unchanged; the failed twin then takes that
//! anomaly back (`ingest::State::refused_release`).

#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use gpufrag_wire::event::EventKind;

use crate::caller;
use crate::cuda::*;
use crate::hook::{self, out, Call, Pool};
use crate::table::{real_fn, Sym};

/// Looks up the real function of `$sym` as `$ty`, or returns `CUDA_ERROR_NOT_FOUND`.
macro_rules! real {
    ($sym:ident, $ty:ty) => {
        // SAFETY: `$ty` is the C type of the function named by `Sym::$sym`.
        match unsafe { real_fn::<$ty>(Sym::$sym) } {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_FOUND,
        }
    };
}

caller::thunk!(cuMemAlloc_v2 => with_caller_cuMemAlloc_v2, x86_64: "rdx", aarch64: "x2");

/// `cuMemAlloc_v2`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize, caller: usize) -> CUresult {
    let real = real!(CuMemAllocV2, CuMemAllocFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged, to the function the caller meant to call.
    let rc = unsafe { real(dptr, bytesize) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote the address through the caller's pointer.
            let addr = if rc == 0 { unsafe { out(dptr) } } else { 0 };
            let size = bytesize as u64;
            hook::alloc(
                Call { addr, size, requested: size, caller: caller as u64, ..Call::new(EventKind::MemAlloc, rc) },
                None,
                Pool::Given,
            );
        });
    }
    rc
}

caller::thunk!(cuMemAllocPitch_v2 => with_caller_cuMemAllocPitch_v2, x86_64: "r9", aarch64: "x5");

/// `cuMemAllocPitch_v2`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pPitch: *mut usize,
    WidthInBytes: usize,
    Height: usize,
    ElementSizeBytes: c_uint,
    caller: usize,
) -> CUresult {
    let real = real!(CuMemAllocPitchV2, CuMemAllocPitchFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote both out-parameters.
            let (addr, pitch) = if rc == 0 { unsafe { (out(dptr), out(pPitch)) } } else { (0, 0) };
            let requested = (WidthInBytes as u64).saturating_mul(Height as u64);
            let size = (pitch as u64).saturating_mul(Height as u64);
            hook::alloc(
                Call { addr, size, requested, caller: caller as u64, ..Call::new(EventKind::MemAllocPitch, rc) },
                None,
                Pool::Given,
            );
        });
    }
    rc
}

caller::thunk!(cuMemAllocManaged => with_caller_cuMemAllocManaged, x86_64: "rcx", aarch64: "x3");

/// `cuMemAllocManaged`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint, caller: usize) -> CUresult {
    let real = real!(CuMemAllocManaged, CuMemAllocManagedFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(dptr, bytesize, flags) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote the address.
            let addr = if rc == 0 { unsafe { out(dptr) } } else { 0 };
            let size = bytesize as u64;
            hook::alloc(
                Call { addr, size, requested: size, caller: caller as u64, ..Call::new(EventKind::MemAllocManaged, rc) },
                None,
                Pool::Given,
            );
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let real = real!(CuMemFreeV2, CuMemFreeFn);
    let c = Call { addr: dptr, ..Call::new(EventKind::MemFree, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), dptr != 0, c, || unsafe { real(dptr) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let real = real!(CuMemGetInfoV2, CuMemGetInfoFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(free, total) };
    if let Some(g) = guard {
        if rc == 0 && !free.is_null() && !total.is_null() {
            // SAFETY: on success the driver wrote both.
            g.record(|| unsafe { hook::device_info(free.read() as u64, total.read() as u64) });
        }
    }
    rc
}

/// A legacy IPC export of the allocation holding `dptr`: recorded after the call, with its result
/// (off the allocation path: whatif's advice reads it to keep expandable segments away).
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, dptr: CUdeviceptr) -> CUresult {
    let real = real!(CuIpcGetMemHandle, CuIpcGetMemHandleFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(handle, dptr) };
    if let Some(g) = guard {
        g.record(|| hook::other(Call { addr: dptr, ..Call::new(EventKind::IpcExport, rc) }));
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    let real = real!(CuMemAddressReserve, CuMemAddressReserveFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(ptr, size, alignment, addr, flags) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote the range's start.
            let start = if rc == 0 { unsafe { out(ptr) } } else { 0 };
            let size = size as u64;
            hook::alloc(Call { addr: start, size, requested: size, ..Call::new(EventKind::AddressReserve, rc) }, None, Pool::Given);
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    let real = real!(CuMemAddressFree, CuMemAddressFreeFn);
    let c = Call { addr: ptr, size: size as u64, ..Call::new(EventKind::AddressFree, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), true, c, || unsafe { real(ptr, size) })
}

caller::thunk!(cuMemCreate => with_caller_cuMemCreate, x86_64: "r8", aarch64: "x4");

/// `cuMemCreate`, given the return address of its caller (see `caller`).
unsafe extern "C" fn with_caller_cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationPropHead,
    flags: c_ulonglong,
    caller: usize,
) -> CUresult {
    let real = real!(CuMemCreate, CuMemCreateFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(handle, size, prop, flags) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote the handle.
            let h = if rc == 0 { unsafe { out(handle) } } else { 0 };
            // SAFETY: prop is null or the caller's CUmemAllocationProp, which starts with this head.
            let device = unsafe { prop.as_ref() }
                .filter(|p| p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE)
                .and_then(|p| i16::try_from(p.location.id).ok());
            let size = size as u64;
            hook::alloc(
                Call { handle: h, size, requested: size, caller: caller as u64, ..Call::new(EventKind::PhysCreate, rc) },
                device,
                Pool::Given,
            );
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    let real = real!(CuMemRelease, CuMemReleaseFn);
    let c = Call { handle, ..Call::new(EventKind::PhysRelease, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), true, c, || unsafe { real(handle) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    let real = real!(CuMemMap, CuMemMapFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(ptr, size, offset, handle, flags) };
    if let Some(g) = guard {
        g.record(|| hook::other(Call { addr: ptr, size: size as u64, requested: offset as u64, handle, ..Call::new(EventKind::Map, rc) }));
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let real = real!(CuMemUnmap, CuMemUnmapFn);
    let c = Call { addr: ptr, size: size as u64, ..Call::new(EventKind::Unmap, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), true, c, || unsafe { real(ptr, size) })
}

/// `cuMemAllocAsync` and its `_ptsz` form: same recording, different real function.
///
/// # Safety
/// As the C function.
#[inline(always)]
unsafe fn alloc_async(real: CuMemAllocAsyncFn, dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(dptr, bytesize, stream) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote the address.
            let addr = if rc == 0 { unsafe { out(dptr) } } else { 0 };
            let size = bytesize as u64;
            let c = Call { addr, size, requested: size, stream: stream as u64, ..Call::new(EventKind::PoolAlloc, rc) };
            hook::alloc(c, None, Pool::CurrentOfDevice);
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult {
    let real = real!(CuMemAllocAsync, CuMemAllocAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { alloc_async(real, dptr, bytesize, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult {
    let real = real!(CuMemAllocAsyncPtsz, CuMemAllocAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { alloc_async(real, dptr, bytesize, hStream) }
}

/// `cuMemAllocFromPoolAsync` and its `_ptsz` form.
///
/// # Safety
/// As the C function.
#[inline(always)]
unsafe fn alloc_from_pool(
    real: CuMemAllocFromPoolAsyncFn,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(dptr, bytesize, pool, stream) };
    if let Some(g) = guard {
        g.record(|| {
            // SAFETY: on success the driver wrote the address.
            let addr = if rc == 0 { unsafe { out(dptr) } } else { 0 };
            let size = bytesize as u64;
            let c = Call { addr, size, requested: size, handle: pool as u64, stream: stream as u64, ..Call::new(EventKind::PoolAlloc, rc) };
            hook::alloc(c, None, Pool::Given);
        });
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    let real = real!(CuMemAllocFromPoolAsync, CuMemAllocFromPoolAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { alloc_from_pool(real, dptr, bytesize, pool, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    let real = real!(CuMemAllocFromPoolAsyncPtsz, CuMemAllocFromPoolAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { alloc_from_pool(real, dptr, bytesize, pool, hStream) }
}

/// `cuMemFreeAsync` and its `_ptsz` form.
///
/// # Safety
/// As the C function.
#[inline(always)]
unsafe fn free_async(real: CuMemFreeAsyncFn, dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let c = Call { addr: dptr, stream: stream as u64, ..Call::new(EventKind::PoolFree, 0) };
    // SAFETY: the caller's arguments, unchanged.
    hook::release_around(hook::enter(), dptr != 0, c, || unsafe { real(dptr, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    let real = real!(CuMemFreeAsync, CuMemFreeAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { free_async(real, dptr, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    let real = real!(CuMemFreeAsyncPtsz, CuMemFreeAsyncFn);
    // SAFETY: forwarding the C contract.
    unsafe { free_async(real, dptr, hStream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult {
    let real = real!(CuMemPoolTrimTo, CuMemPoolTrimToFn);
    let guard = hook::enter();
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(pool, minBytesToKeep) };
    if let Some(g) = guard {
        g.record(|| {
            hook::other(Call { handle: pool as u64, size: minBytesToKeep as u64, ..Call::new(EventKind::PoolTrim, rc) });
            if rc == 0 {
                hook::sample_pool(pool as u64, None);
            }
        });
    }
    rc
}

/// Observed, never changed: when the program reads a pool's reserved bytes (PyTorch's
/// `memory_reserved()` under `backend:cudaMallocAsync` does), the value it got is recorded.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult {
    let real = real!(CuMemPoolGetAttribute, CuMemPoolGetAttributeFn);
    let guard = hook::enter();
    let wanted = guard.is_some() && attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && !value.is_null();
    // Stamped before the read (see `hook::pool_reserved`).
    let ts = if wanted { hook::stamp() } else { 0 };
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real(pool, attr, value) };
    if let Some(g) = guard.filter(|_| wanted && rc == 0) {
        g.record(|| {
            // SAFETY: the driver wrote a cuuint64_t there.
            let reserved = unsafe { (value as *const u64).read_unaligned() };
            hook::pool_reserved(ts, pool as u64, reserved, None);
        });
    }
    rc
}
