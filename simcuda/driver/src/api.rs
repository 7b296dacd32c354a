//! The exported driver functions, with the names (`_v2`, `_ptsz`, `_ptds` variants included) and
//! C signatures of `cuda.h`. Each is a real function in `libcuda.so.1`'s dynamic symbol table,
//! with its own code (uprobes attach to them); each validates its arguments as the real driver
//! does and hands the work to the model under its lock.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void};
use std::sync::atomic::Ordering;

use simcuda_core::ffi::*;
use simcuda_core::{write_c_string, DEVICE_NAME, DRIVER_VERSION, GRANULARITY};

use crate::{
    check_device, config, context_of, current_device, device_of_context, entry, init, initialized, model, ordinal_of, put, CURRENT,
    PRIMARY_REFS,
};

// ---- initialisation, devices, contexts ----

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry("cuInit", || if flags != 0 { Err(CUDA_ERROR_INVALID_VALUE) } else { init() })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer or null (checked).
    entry("cuDriverGetVersion", || unsafe { put(driverVersion, DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", || {
        initialized()?;
        check_device(ordinal)?;
        // A CUdevice is the ordinal (the physical device stays behind it).
        // SAFETY: out-pointer from the caller, null checked by put.
        unsafe { put(device, ordinal as CUdevice) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", || {
        initialized()?;
        // SAFETY: out-pointer from the caller, null checked by put.
        unsafe { put(count, config()?.visible.len() as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", || {
        initialized()?;
        check_device(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a buffer of `len` bytes (or null, rejected).
        if unsafe { write_c_string(DEVICE_NAME, name, len) } {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

fn device_uuid(uuid: *mut CUuuid, dev: CUdevice) -> Result<(), CUresult> {
    initialized()?;
    let d = check_device(dev)?;
    // SAFETY: out-pointer from the caller, null checked by put.
    unsafe { put(uuid, CUuuid { bytes: config()?.domain_uuid(d) }) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid", || device_uuid(uuid, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid_v2", || device_uuid(uuid, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        initialized()?;
        let d = check_device(dev)?;
        // SAFETY: out-pointer from the caller, null checked by put.
        unsafe { put(bytes, config()?.domain_usable(d) as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        let mut m = model()?;
        let d = check_device(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        m.ensure_slot(d)?;
        PRIMARY_REFS[d as usize].fetch_add(1, Ordering::AcqRel);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(pctx, context_of(d)) }
    })
}

fn primary_release(dev: CUdevice) -> Result<(), CUresult> {
    initialized()?;
    let d = check_device(dev)?;
    PRIMARY_REFS[d as usize]
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .map(drop)
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease", || primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", || primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    entry("cuCtxSetCurrent", || {
        initialized()?;
        if ctx.is_null() {
            CURRENT.with(|c| c.set(0));
            return Ok(());
        }
        let d = device_of_context(ctx)
            .filter(|&d| ordinal_of(d).is_ok() && PRIMARY_REFS[d as usize].load(Ordering::Acquire) > 0)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        CURRENT.with(|c| c.set(d + 1));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxGetCurrent", || {
        initialized()?;
        let ctx = match CURRENT.with(std::cell::Cell::get) {
            0 => std::ptr::null_mut(),
            d => context_of(d - 1),
        };
        // SAFETY: out-pointer from the caller, null checked by put.
        unsafe { put(pctx, ctx) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    entry("cuCtxGetDevice", || {
        let d = ordinal_of(current_device()?)?;
        // SAFETY: out-pointer from the caller, null checked by put.
        unsafe { put(device, d) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", || {
        let d = current_device()?;
        model()?.synchronize(d);
        Ok(())
    })
}

fn stream_synchronize() -> Result<(), CUresult> {
    let d = current_device()?;
    model()?.synchronize(d);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(_hStream: CUstream) -> CUresult {
    entry("cuStreamSynchronize", stream_synchronize)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(_hStream: CUstream) -> CUresult {
    entry("cuStreamSynchronize_ptsz", stream_synchronize)
}

// ---- plain allocations ----

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        let d = current_device()?;
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (f, t) = model()?.mem_info(d);
        // SAFETY: both out-pointers are non-null and valid per the C contract.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// A legacy IPC handle: 64 bytes naming the allocation (its start), as the real driver's names
/// its allocation; `CUDA_ERROR_INVALID_VALUE` for VMM-mapped or pool memory, which the legacy
/// API cannot export.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(pHandle: *mut [u8; 64], dptr: CUdeviceptr) -> CUresult {
    entry("cuIpcGetMemHandle", || {
        if pHandle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let base = model()?.ipc_base(dptr)?;
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(&base.to_le_bytes());
        h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        // SAFETY: non-null out-pointer to 64 bytes from the caller.
        unsafe { put(pHandle, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        let d = current_device()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let addr = model()?.alloc(d, bytesize as u64, false)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(dptr, addr) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pPitch: *mut usize,
    WidthInBytes: usize,
    Height: usize,
    ElementSizeBytes: c_uint,
) -> CUresult {
    entry("cuMemAllocPitch_v2", || {
        let d = current_device()?;
        if dptr.is_null() || pPitch.is_null() || !matches!(ElementSizeBytes, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if WidthInBytes == 0 || Height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pitch = (WidthInBytes as u64).checked_next_multiple_of(crate::small::UNIT).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let bytes = pitch.checked_mul(Height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let addr = model()?.alloc(d, bytes, false)?;
        // SAFETY: both out-pointers are non-null and valid per the C contract.
        unsafe {
            put(pPitch, pitch as usize)?;
            put(dptr, addr)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    entry("cuMemAllocManaged", || {
        let d = current_device()?;
        if dptr.is_null() || !matches!(flags, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let addr = model()?.alloc(d, bytesize as u64, true)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(dptr, addr) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", || {
        current_device()?;
        model()?.free(dptr)
    })
}

fn memset(dst: CUdeviceptr, n: usize) -> Result<(), CUresult> {
    current_device()?;
    if n == 0 || model()?.is_device_memory(dst, n as u64) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dstDevice: CUdeviceptr, _uc: c_uchar, N: usize) -> CUresult {
    entry("cuMemsetD8_v2", || memset(dstDevice, N))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(dstDevice: CUdeviceptr, _uc: c_uchar, N: usize) -> CUresult {
    entry("cuMemsetD8_v2_ptds", || memset(dstDevice, N))
}

// ---- virtual memory management ----

/// The device a `CUmemAllocationProp` names, after checking what the real driver checks.
///
/// # Safety
/// `prop` must be null or point to a `CUmemAllocationProp`.
unsafe fn prop_device(prop: *const CUmemAllocationProp) -> Result<u32, CUresult> {
    // SAFETY: null or valid per the caller.
    let p = unsafe { prop.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_device(p.location.id)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_int,
) -> CUresult {
    entry("cuMemGetAllocationGranularity", || {
        initialized()?;
        // SAFETY: prop is null or valid per the C contract.
        unsafe { prop_device(prop) }?;
        if !matches!(option, CU_MEM_ALLOC_GRANULARITY_MINIMUM | CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: out-pointer from the caller, null checked by put.
        unsafe { put(granularity, GRANULARITY as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemAddressReserve", || {
        let mut m = model()?;
        if ptr.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let at = m.address_reserve(size as u64, alignment as u64, addr)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(ptr, at) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemAddressFree", || model()?.address_free(ptr, size as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemCreate", || {
        let mut m = model()?;
        // SAFETY: prop is null or valid per the C contract.
        let d = unsafe { prop_device(prop) }?;
        if handle.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = m.mem_create(d, size as u64)?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(handle, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    entry("cuMemRelease", || model()?.mem_release(handle))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemMap", || {
        let mut m = model()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        m.map(ptr, size as u64, offset as u64, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemUnmap", || model()?.unmap(ptr, size as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult {
    entry("cuMemSetAccess", || {
        let m = model()?;
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes `count` descriptors at `desc` (non-null, count > 0).
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for d in descs {
            let flags_ok =
                matches!(d.flags, CU_MEM_ACCESS_FLAGS_PROT_NONE | CU_MEM_ACCESS_FLAGS_PROT_READ | CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || !flags_ok {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            check_device(d.location.id)?;
        }
        m.set_access(ptr, size as u64)
    })
}

// ---- stream-ordered allocation and pools ----

fn pool_key(pool: CUmemoryPool) -> Result<usize, CUresult> {
    if pool.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(pool as usize)
    }
}

fn alloc_async(dptr: *mut CUdeviceptr, bytesize: usize) -> Result<(), CUresult> {
    let d = current_device()?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut m = model()?;
    let pool = m.default_pool(d);
    let addr = m.pool_alloc(pool, bytesize as u64)?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { put(dptr, addr) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, _hStream: CUstream) -> CUresult {
    entry("cuMemAllocAsync", || alloc_async(dptr, bytesize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, _hStream: CUstream) -> CUresult {
    entry("cuMemAllocAsync_ptsz", || alloc_async(dptr, bytesize))
}

fn alloc_from_pool(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool) -> Result<(), CUresult> {
    current_device()?;
    let key = pool_key(pool)?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let addr = model()?.pool_alloc(key, bytesize as u64)?;
    // SAFETY: non-null out-pointer from the caller.
    unsafe { put(dptr, addr) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    _hStream: CUstream,
) -> CUresult {
    entry("cuMemAllocFromPoolAsync", || alloc_from_pool(dptr, bytesize, pool))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    _hStream: CUstream,
) -> CUresult {
    entry("cuMemAllocFromPoolAsync_ptsz", || alloc_from_pool(dptr, bytesize, pool))
}

fn free_async(dptr: CUdeviceptr) -> Result<(), CUresult> {
    current_device()?;
    model()?.pool_free(dptr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, _hStream: CUstream) -> CUresult {
    entry("cuMemFreeAsync", || free_async(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, _hStream: CUstream) -> CUresult {
    entry("cuMemFreeAsync_ptsz", || free_async(dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps) -> CUresult {
    entry("cuMemPoolCreate", || {
        let mut m = model()?;
        // SAFETY: null or a valid CUmemPoolProps per the C contract.
        let props = unsafe { poolProps.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if pool.is_null() || props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let d = check_device(props.location.id)?;
        let key = m.pool_create(d);
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(pool, key as CUmemoryPool) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    entry("cuMemPoolDestroy", || model()?.pool_destroy(pool_key(pool)?))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult {
    entry("cuMemPoolTrimTo", || model()?.pool_trim(pool_key(pool)?, minBytesToKeep as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult {
    entry("cuMemPoolGetAttribute", || {
        let v = model()?.pool_attr(pool_key(pool)?, attr)?;
        // SAFETY: `value` points to a cuuint64_t for the 64-bit attributes and to an int for the
        // REUSE_* ones, per the C contract; null is rejected by put.
        unsafe {
            match v {
                Some(v) => put(value.cast::<u64>(), v),
                None => put(value.cast::<c_int>(), 1),
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult {
    entry("cuMemPoolSetAttribute", || {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let reuse = matches!(
            attr,
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
                | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
        );
        // SAFETY: non-null; an int for REUSE_*, a cuuint64_t otherwise, per the C contract.
        let v = unsafe {
            if reuse {
                value.cast::<c_int>().read() as u64
            } else {
                value.cast::<u64>().read()
            }
        };
        model()?.pool_set_attr(pool_key(pool)?, attr, v)
    })
}

fn default_pool(pool: *mut CUmemoryPool, dev: CUdevice) -> Result<(), CUresult> {
    let mut m = model()?;
    let d = check_device(dev)?;
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let key = m.default_pool(d);
    // SAFETY: non-null out-pointer from the caller.
    unsafe { put(pool, key as CUmemoryPool) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool_out: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetDefaultMemPool", || default_pool(pool_out, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetMemPool", || default_pool(pool, dev))
}

// ---- errors ----

fn error_text(error: CUresult, pStr: *mut *const c_char, name: bool) -> Result<(), CUresult> {
    if pStr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let found = CU_ERRORS.iter().find(|e| e.0 == error).map(|e| if name { e.1 } else { e.2 });
    let p = found.map_or(std::ptr::null(), |s| s.as_ptr().cast());
    // SAFETY: non-null out-pointer from the caller; the strings are NUL-terminated statics.
    unsafe { put(pStr, p) }?;
    found.map(drop).ok_or(CUDA_ERROR_INVALID_VALUE)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", || error_text(error, pStr, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", || error_text(error, pStr, true))
}
