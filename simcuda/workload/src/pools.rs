//! `async`: stream-ordered allocation. Through the runtime on the default pool: freed memory
//! stays reserved by the pool (and counted against the device) and is reused, until
//! `cudaMemPoolTrimTo`; a synchronisation gives back what exceeds the release threshold (0 by
//! default, "keep everything" when set to the maximum, as PyTorch's cudaMallocAsync backend does).
//! Then the driver forms on a created pool.

use std::ffi::c_void;

use crate::ffi::*;
use crate::{hex, init_runtime, mem_info, ok, result, Outcome};

const MIB: u64 = 1 << 20;

fn attr(pool: cudaMemPool_t, attr: i32) -> Result<u64, String> {
    let mut v = 0u64;
    // SAFETY: a u64 out-value for a 64-bit attribute.
    ok("cudaMemPoolGetAttribute", unsafe { cudaMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) })?;
    Ok(v)
}

fn malloc_async(size: u64) -> Result<u64, String> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; stream 0 is the legacy default stream.
    ok("cudaMallocAsync", unsafe { cudaMallocAsync(&mut p, size as usize, std::ptr::null_mut()) })?;
    Ok(p as u64)
}

fn free_async(p: u64) -> Outcome {
    // SAFETY: a pointer from cudaMallocAsync.
    ok("cudaFreeAsync", unsafe { cudaFreeAsync(p as *mut c_void, std::ptr::null_mut()) })
}

fn free() -> Result<u64, String> {
    mem_info().map(|(f, _)| f)
}

pub fn pools() -> Outcome {
    init_runtime()?;
    let mut pool: cudaMemPool_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok("cudaDeviceGetDefaultMemPool", unsafe { cudaDeviceGetDefaultMemPool(&mut pool, 0) })?;
    let reserved = |p| attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    let used = |p| attr(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    let free0 = free()?;

    let blocks: Vec<u64> = (0..3).map(|_| malloc_async(64 * MIB)).collect::<Result<_, _>>()?;
    result!(
        "test" = "async",
        "step" = "alloc",
        "pool_reserved" = reserved(pool)?,
        "pool_used" = used(pool)?,
        "device_free" = free()?,
        "device_free_at_start" = free0,
    );
    for b in &blocks {
        free_async(*b)?;
    }
    result!("test" = "async", "step" = "free", "pool_reserved" = reserved(pool)?, "pool_used" = used(pool)?, "device_free" = free()?);
    let again = malloc_async(64 * MIB)?;
    result!(
        "test" = "async",
        "step" = "reuse",
        "addr" = hex(again),
        "same_addr" = u8::from(again == blocks[0]),
        "pool_reserved" = reserved(pool)?,
        "device_free" = free()?,
    );
    free_async(again)?;
    // SAFETY: the default pool.
    ok("cudaMemPoolTrimTo", unsafe { cudaMemPoolTrimTo(pool, 64 * MIB as usize) })?;
    result!("test" = "async", "step" = "trim_keep", "keep" = 64 * MIB, "pool_reserved" = reserved(pool)?, "device_free" = free()?);
    // SAFETY: the default pool.
    ok("cudaMemPoolTrimTo", unsafe { cudaMemPoolTrimTo(pool, 0) })?;
    result!("test" = "async", "step" = "trim", "pool_reserved" = reserved(pool)?, "device_free" = free()?);

    // Release threshold 0 (the default): a synchronisation gives idle memory back.
    free_async(malloc_async(64 * MIB)?)?;
    let before_sync = reserved(pool)?;
    // SAFETY: stream 0.
    ok("cudaStreamSynchronize", unsafe { cudaStreamSynchronize(std::ptr::null_mut()) })?;
    let after_sync = reserved(pool)?;
    // Release threshold "all": it stays.
    let mut keep_all = u64::MAX;
    // SAFETY: a u64 value for a 64-bit attribute.
    ok("cudaMemPoolSetAttribute", unsafe {
        cudaMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut keep_all as *mut u64).cast())
    })?;
    free_async(malloc_async(64 * MIB)?)?;
    // SAFETY: stream 0.
    ok("cudaStreamSynchronize", unsafe { cudaStreamSynchronize(std::ptr::null_mut()) })?;
    let kept = reserved(pool)?;
    // SAFETY: the default pool.
    ok("cudaMemPoolTrimTo", unsafe { cudaMemPoolTrimTo(pool, 0) })?;
    result!(
        "test" = "async",
        "step" = "sync",
        "pool_reserved_before_sync" = before_sync,
        "pool_reserved_after_sync" = after_sync,
        "pool_reserved_after_sync_threshold_max" = kept,
    );

    // The driver forms, on a pool of our own.
    let props = pool_props(0);
    let mut own: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out-pointer and props.
    ok("cuMemPoolCreate", unsafe { cuMemPoolCreate(&mut own, &props) })?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: valid out-pointers, a live pool, stream 0.
    unsafe {
        ok("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&mut a, 10 * MIB as usize, own, std::ptr::null_mut()))?;
        ok("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&mut b, 1000, own, std::ptr::null_mut()))?;
        ok("cuMemFreeAsync", cuMemFreeAsync(a, std::ptr::null_mut()))?;
    }
    let (mut res, mut use_) = (0u64, 0u64);
    // SAFETY: u64 out-values for 64-bit attributes.
    unsafe {
        ok("cuMemPoolGetAttribute", cuMemPoolGetAttribute(own, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, (&mut res as *mut u64).cast()))?;
        ok("cuMemPoolGetAttribute", cuMemPoolGetAttribute(own, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, (&mut use_ as *mut u64).cast()))?;
    }
    result!("test" = "async", "step" = "driver_pool", "pool_reserved" = res, "pool_used" = use_, "device_free" = free()?);
    // SAFETY: b came from this pool; then trim and destroy the (now empty) pool.
    let (trim_rc, destroy_rc) = unsafe {
        ok("cuMemFreeAsync", cuMemFreeAsync(b, std::ptr::null_mut()))?;
        (cuMemPoolTrimTo(own, 0), cuMemPoolDestroy(own))
    };
    let free_end = free()?;
    result!(
        "test" = "async",
        "step" = "driver_trim",
        "trim_rc" = trim_rc,
        "destroy_rc" = destroy_rc,
        "device_free" = free_end,
        "device_free_at_start" = free0,
    );
    if free_end == free0 && trim_rc == 0 && destroy_rc == 0 {
        Ok(())
    } else {
        Err(format!("device free {free0} at start, {free_end} at the end"))
    }
}
