//! The CUDA C types, constants and function-pointer types the shim's wrappers need, with the
//! layouts of `cuda.h` and `cuda_runtime_api.h` (CUDA 12/13). Only what the wrappers read or
//! forward is here; everything else passes through as opaque pointers.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

pub type CUresult = c_int;
pub type cudaError_t = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

/// `CUDA_ERROR_NOT_FOUND`: what a wrapper returns when the real function cannot be found at all.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// `cudaErrorSymbolNotFound`: the runtime's equivalent.
pub const CUDA_ERROR_SYMBOL_NOT_FOUND: cudaError_t = 500;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` (same bit as `cudaEnablePerThreadDefaultStream`).
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (= `cudaMemPoolAttrReservedMemCurrent`): the bytes a
/// pool holds from the device, a `cuuint64_t`.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// The head of `CUmemAllocationProp` (the shim reads only the location; the struct is never
/// copied, only read through the caller's pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationPropHead {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
}

/// `cudaPitchedPtr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `cudaExtent` (passed by value to `cudaMalloc3D`: 24 bytes, in memory on x86_64 SysV).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

// ---- driver ----
pub type CuMemAllocFn = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub type CuMemAllocPitchFn = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
pub type CuMemAllocManagedFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
pub type CuMemFreeFn = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
pub type CuMemAddressReserveFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) -> CUresult;
pub type CuMemAddressFreeFn = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub type CuMemCreateFn =
    unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationPropHead, c_ulonglong) -> CUresult;
pub type CuMemReleaseFn = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
pub type CuMemMapFn = unsafe extern "C" fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, c_ulonglong) -> CUresult;
pub type CuMemUnmapFn = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub type CuMemAllocAsyncFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
pub type CuMemAllocFromPoolAsyncFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
pub type CuMemFreeAsyncFn = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
pub type CuMemPoolTrimToFn = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
pub type CuMemPoolGetAttributeFn = unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult;
pub type CuMemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type CuGetProcAddressFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
pub type CuGetProcAddressV2Fn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
pub type CuCtxGetDeviceFn = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub type CuDeviceGetMemPoolFn = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
/// `cuDeviceGetUuid` / `cuDeviceGetUuid_v2`: 16 bytes (a `CUuuid`) for ordinal `dev`.
pub type CuDeviceGetUuidFn = unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult;

// ---- runtime ----
pub type CudaMallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> cudaError_t;
pub type CudaMallocPitchFn = unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> cudaError_t;
pub type CudaMalloc3DFn = unsafe extern "C" fn(*mut cudaPitchedPtr, cudaExtent) -> cudaError_t;
pub type CudaMallocManagedFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
pub type CudaMallocAsyncFn = unsafe extern "C" fn(*mut *mut c_void, usize, CUstream) -> cudaError_t;
pub type CudaMallocFromPoolAsyncFn = unsafe extern "C" fn(*mut *mut c_void, usize, CUmemoryPool, CUstream) -> cudaError_t;
pub type CudaFreeFn = unsafe extern "C" fn(*mut c_void) -> cudaError_t;
pub type CudaFreeAsyncFn = unsafe extern "C" fn(*mut c_void, CUstream) -> cudaError_t;
pub type CudaMemPoolTrimToFn = unsafe extern "C" fn(CUmemoryPool, usize) -> cudaError_t;
pub type CudaMemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> cudaError_t;
pub type CudaGetDriverEntryPointFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_ulonglong, *mut c_int) -> cudaError_t;
pub type CudaGetDriverEntryPointByVersionFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, c_ulonglong, *mut c_int) -> cudaError_t;

// ---- loader ----
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;
