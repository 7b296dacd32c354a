//! `cudaError_t` values, names and messages of the runtime stand-in, and the mapping from the
//! driver's CUresult (the same numbers for every code the stand-ins produce).

#![allow(non_camel_case_types, non_upper_case_globals)]

use simcuda_core::ffi::CUresult;

pub type cudaError_t = std::ffi::c_int;

pub const cudaSuccess: cudaError_t = 0;
pub const cudaErrorInvalidValue: cudaError_t = 1;
pub const cudaErrorMemoryAllocation: cudaError_t = 2;
pub const cudaErrorInitializationError: cudaError_t = 3;
pub const cudaErrorCudartUnloading: cudaError_t = 4;
pub const cudaErrorInsufficientDriver: cudaError_t = 35;
pub const cudaErrorNoDevice: cudaError_t = 100;
pub const cudaErrorInvalidDevice: cudaError_t = 101;
pub const cudaErrorDeviceUninitialized: cudaError_t = 201;
pub const cudaErrorInvalidResourceHandle: cudaError_t = 400;
pub const cudaErrorSymbolNotFound: cudaError_t = 500;
pub const cudaErrorNotPermitted: cudaError_t = 800;
pub const cudaErrorNotSupported: cudaError_t = 801;
pub const cudaErrorUnknown: cudaError_t = 999;

/// `(code, name, message)`, NUL-terminated for the C API.
pub const ERRORS: &[(cudaError_t, &str, &str)] = &[
    (cudaSuccess, "cudaSuccess\0", "no error\0"),
    (cudaErrorInvalidValue, "cudaErrorInvalidValue\0", "invalid argument\0"),
    (cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation\0", "out of memory\0"),
    (cudaErrorInitializationError, "cudaErrorInitializationError\0", "initialization error\0"),
    (cudaErrorCudartUnloading, "cudaErrorCudartUnloading\0", "driver shutting down\0"),
    (cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver\0", "CUDA driver version is insufficient for CUDA runtime version\0"),
    (cudaErrorNoDevice, "cudaErrorNoDevice\0", "no CUDA-capable device is detected\0"),
    (cudaErrorInvalidDevice, "cudaErrorInvalidDevice\0", "invalid device ordinal\0"),
    (cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized\0", "invalid device context\0"),
    (cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle\0", "invalid resource handle\0"),
    (cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound\0", "named symbol not found\0"),
    (cudaErrorNotPermitted, "cudaErrorNotPermitted\0", "operation not permitted\0"),
    (cudaErrorNotSupported, "cudaErrorNotSupported\0", "operation not supported\0"),
    (cudaErrorUnknown, "cudaErrorUnknown\0", "unknown error\0"),
];

/// The runtime error for a driver result.
pub fn from_driver(rc: CUresult) -> cudaError_t {
    if ERRORS.iter().any(|e| e.0 == rc) {
        rc
    } else {
        cudaErrorUnknown
    }
}
