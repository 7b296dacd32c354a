//! simcuda's stand-in CUDA runtime, built as `libcudart.so` with SONAME `libcudart.so.13` (staged
//! as `.13` and `.12`): the runtime memory API under its real names and C signatures, each a thin
//! layer over the driver reached through `dlopen` + `cuGetProcAddress_v2` (`driver`), as the real
//! runtime does. Like it, initialisation is lazy (the first call loads the driver, `cuInit`, and
//! retains the current device's primary context, made current on each calling thread), the
//! current device is per thread (device 0 by default), and a failing call sets the thread's last
//! error.

#![allow(non_snake_case, non_camel_case_types, non_upper_case_globals, clippy::missing_safety_doc)]

mod driver;
mod errors;

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::OnceLock;

use simcuda_core::ffi::*;
use simcuda_core::MAX_DOMAINS;

use driver::{driver, Driver, RUNTIME_VERSION};
pub use errors::*;

pub type cudaStream_t = *mut c_void;
pub type cudaMemPool_t = *mut c_void;

/// `cudaPitchedPtr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `cudaExtent`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaDriverEntryPointQueryResult`.
pub const cudaDriverEntryPointSuccess: c_int = 0;
pub const cudaDriverEntryPointSymbolNotFound: c_int = 1;
pub const cudaDriverEntryPointVersionNotSufficent: c_int = 2;

thread_local! {
    static CURRENT_DEVICE: Cell<c_int> = const { Cell::new(0) };
    /// The device whose primary context this thread has made current; -1 = none yet.
    static BOUND_DEVICE: Cell<c_int> = const { Cell::new(-1) };
    static LAST_ERROR: Cell<cudaError_t> = const { Cell::new(cudaSuccess) };
}

/// Each device's primary context, retained once per process on first use.
static PRIMARY: [OnceLock<std::result::Result<usize, cudaError_t>>; MAX_DOMAINS as usize] =
    [const { OnceLock::new() }; MAX_DOMAINS as usize];

type Result<T> = std::result::Result<T, cudaError_t>;

/// Runs an exported function's body: no panic crosses the C boundary; an error becomes the
/// thread's last error.
#[inline(always)]
fn rt(name: &'static str, body: impl FnOnce() -> Result<()>) -> cudaError_t {
    let rc = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => cudaSuccess,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("simcuda runtime: internal error (panic) in {name}");
            cudaErrorUnknown
        }
    };
    if rc != cudaSuccess {
        LAST_ERROR.with(|e| e.set(rc));
    }
    rc
}

fn check(rc: CUresult) -> Result<()> {
    if rc == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(from_driver(rc))
    }
}

/// The driver, with the current device's primary context current on this thread.
fn ctx() -> Result<&'static Driver> {
    let drv = driver()?;
    let dev = CURRENT_DEVICE.with(Cell::get);
    if BOUND_DEVICE.with(Cell::get) != dev {
        let slot = PRIMARY.get(dev as usize).ok_or(cudaErrorInvalidDevice)?;
        let ctx = *slot.get_or_init(|| {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: a driver function with its declared signature; ctx is a valid out-pointer.
            check(unsafe { (drv.primary_ctx_retain)(&mut ctx, dev) }).map(|()| ctx as usize)
        });
        // SAFETY: as above; ctx is the primary context the driver handed out.
        check(unsafe { (drv.ctx_set_current)(ctx? as CUcontext) })?;
        BOUND_DEVICE.with(|b| b.set(dev));
    }
    Ok(drv)
}

/// Writes a device pointer out-parameter.
///
/// # Safety
/// `p` must be null (rejected) or valid for a write.
unsafe fn put<T>(p: *mut T, v: T) -> Result<()> {
    if p.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    // SAFETY: non-null and valid per the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

// ---- devices ----

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> cudaError_t {
    rt("cudaGetDeviceCount", || {
        let drv = driver()?;
        let mut n = 0;
        // SAFETY: a driver function with its declared signature; n is a valid out-pointer.
        check(unsafe { (drv.device_get_count)(&mut n) })?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(count, n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaSetDevice(device: c_int) -> cudaError_t {
    rt("cudaSetDevice", || {
        let drv = driver()?;
        let mut n = 0;
        // SAFETY: as in cudaGetDeviceCount.
        check(unsafe { (drv.device_get_count)(&mut n) })?;
        if !(0..n).contains(&device) {
            return Err(cudaErrorInvalidDevice);
        }
        CURRENT_DEVICE.with(|d| d.set(device));
        ctx().map(drop)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(device: *mut c_int) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    rt("cudaGetDevice", || unsafe { put(device, CURRENT_DEVICE.with(Cell::get)) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> cudaError_t {
    rt("cudaDeviceSynchronize", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.ctx_synchronize)() })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(stream: cudaStream_t) -> cudaError_t {
    rt("cudaStreamSynchronize", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.stream_synchronize)(stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize_ptsz(stream: cudaStream_t) -> cudaError_t {
    rt("cudaStreamSynchronize_ptsz", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.stream_synchronize_ptsz)(stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(version: *mut c_int) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    rt("cudaRuntimeGetVersion", || unsafe { put(version, RUNTIME_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(version: *mut c_int) -> cudaError_t {
    rt("cudaDriverGetVersion", || {
        let drv = driver()?;
        let mut v = 0;
        // SAFETY: a driver function with its declared signature; v is a valid out-pointer.
        check(unsafe { (drv.driver_get_version)(&mut v) })?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(version, v) }
    })
}

// ---- errors ----

fn error_entry(error: cudaError_t) -> Option<&'static (cudaError_t, &'static str, &'static str)> {
    ERRORS.iter().find(|e| e.0 == error)
}

#[no_mangle]
pub extern "C" fn cudaGetErrorString(error: cudaError_t) -> *const c_char {
    error_entry(error).map_or(c"unrecognized error code".as_ptr(), |e| e.2.as_ptr().cast())
}

#[no_mangle]
pub extern "C" fn cudaGetErrorName(error: cudaError_t) -> *const c_char {
    error_entry(error).map_or(c"unrecognized error code".as_ptr(), |e| e.1.as_ptr().cast())
}

#[no_mangle]
pub extern "C" fn cudaGetLastError() -> cudaError_t {
    LAST_ERROR.with(|e| e.replace(cudaSuccess))
}

#[no_mangle]
pub extern "C" fn cudaPeekAtLastError() -> cudaError_t {
    LAST_ERROR.with(Cell::get)
}

// ---- allocation ----

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(devPtr: *mut *mut c_void, size: usize) -> cudaError_t {
    rt("cudaMalloc", || {
        let drv = ctx()?;
        if devPtr.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        let mut p = 0;
        if size > 0 {
            // SAFETY: a driver function with its declared signature; p is a valid out-pointer.
            check(unsafe { (drv.mem_alloc)(&mut p, size) })?;
        }
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(devPtr, p as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(devPtr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> cudaError_t {
    rt("cudaMallocPitch", || {
        let drv = ctx()?;
        if devPtr.is_null() || pitch.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        let (mut p, mut pt) = (0, 0);
        if width > 0 && height > 0 {
            // SAFETY: a driver function with its declared signature; valid out-pointers.
            check(unsafe { (drv.mem_alloc_pitch)(&mut p, &mut pt, width, height, 4) })?;
        }
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            put(pitch, pt)?;
            put(devPtr, p as *mut c_void)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc3D(pitchedDevPtr: *mut cudaPitchedPtr, extent: cudaExtent) -> cudaError_t {
    rt("cudaMalloc3D", || {
        let drv = ctx()?;
        if pitchedDevPtr.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        let rows = extent.height.checked_mul(extent.depth).ok_or(cudaErrorMemoryAllocation)?;
        let (mut p, mut pitch) = (0, 0);
        if extent.width > 0 && rows > 0 {
            // SAFETY: a driver function with its declared signature; valid out-pointers.
            check(unsafe { (drv.mem_alloc_pitch)(&mut p, &mut pitch, extent.width, rows, 4) })?;
        }
        let out = cudaPitchedPtr { ptr: p as *mut c_void, pitch, xsize: extent.width, ysize: extent.height };
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(pitchedDevPtr, out) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(devPtr: *mut *mut c_void, size: usize, flags: c_uint) -> cudaError_t {
    rt("cudaMallocManaged", || {
        let drv = ctx()?;
        if devPtr.is_null() || size == 0 {
            return Err(cudaErrorInvalidValue);
        }
        let mut p = 0;
        // SAFETY: a driver function with its declared signature; p is a valid out-pointer.
        check(unsafe { (drv.mem_alloc_managed)(&mut p, size, flags) })?;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { put(devPtr, p as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(devPtr: *mut c_void) -> cudaError_t {
    rt("cudaFree", || {
        let drv = ctx()?;
        if devPtr.is_null() {
            return Ok(());
        }
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.mem_free)(devPtr as CUdeviceptr) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t {
    rt("cudaMemGetInfo", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature; it rejects null pointers.
        check(unsafe { (drv.mem_get_info)(free, total) })
    })
}

// ---- stream-ordered allocation and pools ----

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(devPtr: *mut *mut c_void, size: usize, stream: cudaStream_t) -> cudaError_t {
    rt("cudaMallocAsync", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature; CUdeviceptr and void* have the
        // same size on 64-bit Linux, and the driver rejects null.
        check(unsafe { (drv.mem_alloc_async)(devPtr.cast(), size, stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(devPtr: *mut *mut c_void, size: usize, stream: cudaStream_t) -> cudaError_t {
    rt("cudaMallocAsync_ptsz", || {
        let drv = ctx()?;
        // SAFETY: as in cudaMallocAsync.
        check(unsafe { (drv.mem_alloc_async_ptsz)(devPtr.cast(), size, stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    memPool: cudaMemPool_t,
    stream: cudaStream_t,
) -> cudaError_t {
    rt("cudaMallocFromPoolAsync", || {
        let drv = ctx()?;
        // SAFETY: as in cudaMallocAsync.
        check(unsafe { (drv.mem_alloc_from_pool_async)(ptr.cast(), size, memPool, stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync_ptsz(
    ptr: *mut *mut c_void,
    size: usize,
    memPool: cudaMemPool_t,
    stream: cudaStream_t,
) -> cudaError_t {
    rt("cudaMallocFromPoolAsync_ptsz", || {
        let drv = ctx()?;
        // SAFETY: as in cudaMallocAsync.
        check(unsafe { (drv.mem_alloc_from_pool_async_ptsz)(ptr.cast(), size, memPool, stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(devPtr: *mut c_void, stream: cudaStream_t) -> cudaError_t {
    rt("cudaFreeAsync", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.mem_free_async)(devPtr as CUdeviceptr, stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(devPtr: *mut c_void, stream: cudaStream_t) -> cudaError_t {
    rt("cudaFreeAsync_ptsz", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.mem_free_async_ptsz)(devPtr as CUdeviceptr, stream) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetDefaultMemPool(memPool: *mut cudaMemPool_t, device: c_int) -> cudaError_t {
    rt("cudaDeviceGetDefaultMemPool", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature; it rejects null.
        check(unsafe { (drv.device_get_default_mem_pool)(memPool, device) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolCreate(memPool: *mut cudaMemPool_t, poolProps: *const CUmemPoolProps) -> cudaError_t {
    rt("cudaMemPoolCreate", || {
        let drv = ctx()?;
        // SAFETY: cudaMemPoolProps has CUmemPoolProps's layout; the driver rejects null.
        check(unsafe { (drv.pool_create)(memPool, poolProps) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolDestroy(memPool: cudaMemPool_t) -> cudaError_t {
    rt("cudaMemPoolDestroy", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.pool_destroy)(memPool) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolTrimTo(memPool: cudaMemPool_t, minBytesToKeep: usize) -> cudaError_t {
    rt("cudaMemPoolTrimTo", || {
        let drv = ctx()?;
        // SAFETY: a driver function with its declared signature.
        check(unsafe { (drv.pool_trim_to)(memPool, minBytesToKeep) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolGetAttribute(memPool: cudaMemPool_t, attr: c_int, value: *mut c_void) -> cudaError_t {
    rt("cudaMemPoolGetAttribute", || {
        let drv = ctx()?;
        // SAFETY: cudaMemPoolAttr has CUmemPool_attribute's values; the driver rejects null.
        check(unsafe { (drv.pool_get_attribute)(memPool, attr, value) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(memPool: cudaMemPool_t, attr: c_int, value: *mut c_void) -> cudaError_t {
    rt("cudaMemPoolSetAttribute", || {
        let drv = ctx()?;
        // SAFETY: as in cudaMemPoolGetAttribute.
        check(unsafe { (drv.pool_set_attribute)(memPool, attr, value) })
    })
}

// ---- driver entry points ----

fn entry_point(
    symbol: *const c_char,
    funcPtr: *mut *mut c_void,
    version: c_int,
    flags: c_ulonglong,
    driverStatus: *mut c_int,
) -> Result<()> {
    let drv = driver()?;
    if symbol.is_null() || funcPtr.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    let mut status = cudaDriverEntryPointSymbolNotFound;
    // SAFETY: symbol is NUL-terminated per the C contract; funcPtr and status are valid.
    let rc = unsafe { (drv.get_proc_address)(symbol, funcPtr, version, flags, &mut status) };
    if !driverStatus.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { driverStatus.write(status) };
    }
    if std::env::var_os("SIMCUDA_TRACE").is_some_and(|v| v != "0") {
        // SAFETY: as above.
        let name = unsafe { CStr::from_ptr(symbol) };
        eprintln!("simcuda runtime: entry point {name:?} v{version} flags {flags} -> rc {rc} status {status}");
    }
    check(rc)
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    funcPtr: *mut *mut c_void,
    flags: c_ulonglong,
    driverStatus: *mut c_int,
) -> cudaError_t {
    rt("cudaGetDriverEntryPoint", || entry_point(symbol, funcPtr, RUNTIME_VERSION, flags, driverStatus))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    funcPtr: *mut *mut c_void,
    cudaVersion: c_uint,
    flags: c_ulonglong,
    driverStatus: *mut c_int,
) -> cudaError_t {
    rt("cudaGetDriverEntryPointByVersion", || {
        let version = c_int::try_from(cudaVersion).map_err(|_| cudaErrorInvalidValue)?;
        entry_point(symbol, funcPtr, version, flags, driverStatus)
    })
}
