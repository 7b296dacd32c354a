//! How the runtime stand-in reaches the driver, exactly as the real libcudart does: at the first
//! runtime call, `dlopen("libcuda.so.1")`, `dlsym(handle, "cuGetProcAddress_v2")`, then every
//! driver function through that pointer by base name and CUDA version. There is no link-time
//! reference to any `cu*` symbol (a test checks `nm -D --undefined-only`), so an LD_PRELOAD
//! interposer of `cuMemAlloc_v2` alone never sees a `cudaMalloc`; a shim must wrap `dlsym` and
//! `cuGetProcAddress` to see it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use simcuda_core::ffi::*;

use crate::errors::*;

/// The CUDA version the runtime asks the driver for (CUDA 13.0).
pub const RUNTIME_VERSION: c_int = 13000;

pub type GetProcAddressV2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

macro_rules! driver_table {
    ($($field:ident = $name:literal, $flags:expr, fn($($arg:ty),*);)*) => {
        /// The driver functions the runtime calls, fetched through cuGetProcAddress_v2.
        #[allow(non_snake_case)]
        pub struct Driver {
            pub get_proc_address: GetProcAddressV2,
            $(pub $field: unsafe extern "C" fn($($arg),*) -> CUresult,)*
        }

        fn resolve_all(gpa: GetProcAddressV2) -> Result<Driver, cudaError_t> {
            Ok(Driver {
                get_proc_address: gpa,
                $($field: {
                    let p = lookup(gpa, concat!($name, "\0"), $flags)?;
                    // SAFETY: the driver returned its function for this base name and version,
                    // whose C signature is the one declared here (cuda.h).
                    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CUresult>(p) }
                },)*
            })
        }
    };
}

const LEGACY: u64 = CU_GET_PROC_ADDRESS_DEFAULT;
const PTSZ: u64 = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

driver_table! {
    init = "cuInit", LEGACY, fn(c_uint);
    device_get_count = "cuDeviceGetCount", LEGACY, fn(*mut c_int);
    driver_get_version = "cuDriverGetVersion", LEGACY, fn(*mut c_int);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain", LEGACY, fn(*mut CUcontext, CUdevice);
    ctx_set_current = "cuCtxSetCurrent", LEGACY, fn(CUcontext);
    ctx_synchronize = "cuCtxSynchronize", LEGACY, fn();
    stream_synchronize = "cuStreamSynchronize", LEGACY, fn(CUstream);
    stream_synchronize_ptsz = "cuStreamSynchronize", PTSZ, fn(CUstream);
    mem_get_info = "cuMemGetInfo", LEGACY, fn(*mut usize, *mut usize);
    mem_alloc = "cuMemAlloc", LEGACY, fn(*mut CUdeviceptr, usize);
    mem_alloc_pitch = "cuMemAllocPitch", LEGACY, fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    mem_alloc_managed = "cuMemAllocManaged", LEGACY, fn(*mut CUdeviceptr, usize, c_uint);
    mem_free = "cuMemFree", LEGACY, fn(CUdeviceptr);
    mem_alloc_async = "cuMemAllocAsync", LEGACY, fn(*mut CUdeviceptr, usize, CUstream);
    mem_alloc_async_ptsz = "cuMemAllocAsync", PTSZ, fn(*mut CUdeviceptr, usize, CUstream);
    mem_alloc_from_pool_async = "cuMemAllocFromPoolAsync", LEGACY, fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    mem_alloc_from_pool_async_ptsz = "cuMemAllocFromPoolAsync", PTSZ, fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    mem_free_async = "cuMemFreeAsync", LEGACY, fn(CUdeviceptr, CUstream);
    mem_free_async_ptsz = "cuMemFreeAsync", PTSZ, fn(CUdeviceptr, CUstream);
    pool_create = "cuMemPoolCreate", LEGACY, fn(*mut CUmemoryPool, *const CUmemPoolProps);
    pool_destroy = "cuMemPoolDestroy", LEGACY, fn(CUmemoryPool);
    pool_trim_to = "cuMemPoolTrimTo", LEGACY, fn(CUmemoryPool, usize);
    pool_get_attribute = "cuMemPoolGetAttribute", LEGACY, fn(CUmemoryPool, c_int, *mut c_void);
    pool_set_attribute = "cuMemPoolSetAttribute", LEGACY, fn(CUmemoryPool, c_int, *mut c_void);
    device_get_default_mem_pool = "cuDeviceGetDefaultMemPool", LEGACY, fn(*mut CUmemoryPool, CUdevice);
}

fn lookup(gpa: GetProcAddressV2, name: &'static str, flags: u64) -> Result<*mut c_void, cudaError_t> {
    let mut p = std::ptr::null_mut();
    let mut status = 0;
    // SAFETY: name is NUL-terminated; p and status are valid out-pointers.
    let rc = unsafe { gpa(name.as_ptr().cast(), &mut p, RUNTIME_VERSION, flags, &mut status) };
    if rc != CUDA_SUCCESS || p.is_null() {
        eprintln!("simcuda runtime: the driver has no {} (rc {rc})", name.trim_end_matches('\0'));
        return Err(cudaErrorInsufficientDriver);
    }
    Ok(p)
}

fn load() -> Result<Driver, cudaError_t> {
    let lib = c"libcuda.so.1";
    // SAFETY: dlopen with a NUL-terminated name.
    let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated message.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            String::new()
        } else {
            // SAFETY: non-null NUL-terminated string from dlerror.
            unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
        };
        eprintln!("simcuda runtime: cannot load libcuda.so.1: {why}");
        return Err(cudaErrorInsufficientDriver);
    }
    // SAFETY: handle is a live dlopen handle; the name is NUL-terminated.
    let gpa = unsafe { libc::dlsym(handle, c"cuGetProcAddress_v2".as_ptr()) };
    if gpa.is_null() {
        eprintln!("simcuda runtime: libcuda.so.1 has no cuGetProcAddress_v2");
        return Err(cudaErrorInsufficientDriver);
    }
    // SAFETY: cuGetProcAddress_v2 has this C signature (cuda.h, CUDA 12).
    let gpa = unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(gpa) };
    let driver = resolve_all(gpa)?;
    // SAFETY: a driver function with its declared signature.
    match unsafe { (driver.init)(0) } {
        CUDA_SUCCESS => Ok(driver),
        CUDA_ERROR_NO_DEVICE => Err(cudaErrorNoDevice),
        rc => Err(from_driver(rc)),
    }
}

/// The driver, loaded and initialised on first use (the runtime's lazy initialisation).
pub fn driver() -> Result<&'static Driver, cudaError_t> {
    static DRIVER: OnceLock<Result<Driver, cudaError_t>> = OnceLock::new();
    DRIVER.get_or_init(load).as_ref().map_err(|&e| e)
}
