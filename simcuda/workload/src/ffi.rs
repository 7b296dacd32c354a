//! The CUDA functions the workload calls by ordinary dynamic linking: the runtime
//! (`libcudart.so.13`) for most of its work, and a few driver functions (`libcuda.so.1`) that
//! real programs also call directly (a raw `cuMemAlloc_v2` balloon, the VMM API, pools, the
//! per-thread-stream variants). Other routes (dlsym, cuGetProcAddress, cudaGetDriverEntryPoint)
//! are in `routes`.

#![allow(non_snake_case, non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

pub use simcuda_core::ffi::*;

pub type cudaError_t = c_int;
pub type cudaStream_t = *mut c_void;
pub type cudaMemPool_t = *mut c_void;

#[link(name = "cudart")]
extern "C" {
    pub fn cudaMalloc(devPtr: *mut *mut c_void, size: usize) -> cudaError_t;
    pub fn cudaFree(devPtr: *mut c_void) -> cudaError_t;
    pub fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t;
    pub fn cudaMallocAsync(devPtr: *mut *mut c_void, size: usize, stream: cudaStream_t) -> cudaError_t;
    pub fn cudaFreeAsync(devPtr: *mut c_void, stream: cudaStream_t) -> cudaError_t;
    pub fn cudaMemPoolTrimTo(pool: cudaMemPool_t, minBytesToKeep: usize) -> cudaError_t;
    pub fn cudaDeviceGetDefaultMemPool(pool: *mut cudaMemPool_t, device: c_int) -> cudaError_t;
    pub fn cudaMemPoolGetAttribute(pool: cudaMemPool_t, attr: c_int, value: *mut c_void) -> cudaError_t;
    pub fn cudaMemPoolSetAttribute(pool: cudaMemPool_t, attr: c_int, value: *mut c_void) -> cudaError_t;
    pub fn cudaStreamSynchronize(stream: cudaStream_t) -> cudaError_t;
    pub fn cudaGetDriverEntryPoint(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        flags: c_ulonglong,
        driverStatus: *mut c_int,
    ) -> cudaError_t;
    pub fn cudaGetDriverEntryPointByVersion(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        cudaVersion: c_uint,
        flags: c_ulonglong,
        driverStatus: *mut c_int,
    ) -> cudaError_t;
    pub fn cudaGetErrorName(error: cudaError_t) -> *const c_char;
}

#[link(name = "cuda")]
extern "C" {
    pub fn cuInit(flags: c_uint) -> CUresult;
    pub fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
    pub fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
    pub fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    pub fn cuIpcGetMemHandle(pHandle: *mut [u8; 64], dptr: CUdeviceptr) -> CUresult;
    pub fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) -> CUresult;
    pub fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult;
    pub fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int) -> CUresult;
    pub fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) -> CUresult;
    pub fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
    pub fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: c_ulonglong,
    ) -> CUresult;
    pub fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    pub fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult;
    pub fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
    pub fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult;
    pub fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult;
    pub fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    pub fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult;
    pub fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult;
    pub fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) -> CUresult;
    pub fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult;
}

/// A `CUmemAllocationProp` for pinned memory on `device`.
pub fn device_prop(device: c_int) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: CUmemAllocFlags::default(),
    }
}

/// A `CUmemPoolProps` for a device pool on `device`.
pub fn pool_props(device: c_int) -> CUmemPoolProps {
    CUmemPoolProps {
        alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
        handle_types: 0,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        win32_security_attributes: std::ptr::null_mut(),
        max_size: 0,
        usage: 0,
        reserved: [0; 54],
    }
}
