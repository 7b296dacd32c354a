//! simcuda's stand-in NVML, built as `libnvml.so` with SONAME `libnvidia-ml.so.1` (staged as
//! `libnvidia-ml.so.1` and `libnvidia-ml.so`): device count, handles, names, UUIDs (the same as
//! the driver stand-in's `cuDeviceGetUuid`), memory info (v1 and v2) and the running compute
//! processes (v1, v2, v3 layouts, with NVML's insufficient-size protocol), all read from the state
//! file that the driver stand-ins of every process update. Figures, per device:
//! total = `SIMCUDA_MEM`, reserved = `SIMCUDA_RESERVE`, used = what processes hold,
//! free = total − reserved − used (what cuMemGetInfo reports as free); the v1 struct's `used`
//! counts the reserve too, as NVML documents ("sum of reserved and allocated").
//!
//! Utilization (`nvmlDeviceGetUtilizationRates`) is what `SIMCUDA_UTILIZATION` says
//! (`GPU:MEM` percent, one pair for every GPU or one per GPU): simcuda runs no kernels, so
//! unset it answers `NVML_ERROR_NOT_SUPPORTED`, as NVML does where it cannot measure.
//!
//! MIG (`SIMCUDA_MIG`, `simcuda_core::mig`): a GPU split into instances reports MIG mode enabled
//! (`nvmlDeviceGetMigMode`), `nvmlDeviceGetMaxMigDeviceCount` 7 (0 when not in MIG mode), and a
//! handle per instance (`nvmlDeviceGetMigDeviceHandleByIndex`: `NVML_ERROR_NOT_FOUND` where no
//! instance is at the index), which `nvmlDeviceIsMigDeviceHandle` tells apart and
//! `nvmlDeviceGetDeviceHandleFromMigDeviceHandle` leads back to the GPU. On an instance's handle
//! `nvmlDeviceGetUUID` is its `MIG-…` UUID, the memory info is the instance's (total = its size,
//! no reserve) and the process list is of the processes on it, their GPU instance id set (compute
//! instance 0). The GPU's own handle counts every instance's processes and used memory. MIG
//! handles are not counted by `nvmlDeviceGetCount` nor reached by `nvmlDeviceGetHandleByIndex`,
//! as in NVML; `nvmlDeviceGetHandleByUUID` takes a MIG UUID too.

#![allow(non_snake_case, non_camel_case_types, non_upper_case_globals, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use simcuda_core::state::SharedState;
use simcuda_core::{write_c_string, Config, DEVICE_NAME, DRIVER_VERSION, MAX_DOMAINS};

pub type nvmlReturn_t = c_int;
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// The driver version string NVML reports.
const DRIVER_VERSION_STRING: &str = "580.159.04";

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: `NVML_STRUCT_VERSION(Memory, 2)`.
pub const nvmlMemory_v2: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
}

/// `nvmlProcessInfo_t` (v3) and `nvmlProcessInfo_v2_t`, which share one layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

const _: () = assert!(std::mem::size_of::<nvmlMemory_v2_t>() == 40);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_t>() == 24);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_v1_t>() == 16);

/// Not in MIG mode: instance ids read as NVML's "not available".
const NOT_AVAILABLE: c_uint = 0xFFFF_FFFF;

/// `NVML_DEVICE_MIG_ENABLE` / `NVML_DEVICE_MIG_DISABLE`.
pub const NVML_DEVICE_MIG_ENABLE: c_uint = 1;
pub const NVML_DEVICE_MIG_DISABLE: c_uint = 0;
/// What `nvmlDeviceGetMaxMigDeviceCount` reports for a GPU in MIG mode (the H200's seven slices).
const MAX_MIG_DEVICES: c_uint = simcuda_core::mig::MAX_PER_GPU;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
static SYSTEM: OnceLock<Result<(Config, SharedState), String>> = OnceLock::new();
/// Device handles: an nvmlDevice_t is the address of one of these bytes.
static DEVICES: [u8; MAX_DOMAINS as usize] = [0; MAX_DOMAINS as usize];

type Result<T, E = nvmlReturn_t> = std::result::Result<T, E>;

/// `SIMCUDA_UTILIZATION` per GPU (`simcuda_core::parse_utilization`); `None` when unset.
static UTILIZATION: OnceLock<Option<Vec<(u32, u32)>>> = OnceLock::new();

fn open_system() -> Result<(Config, SharedState), String> {
    let cfg = Config::from_env()?;
    let util = match std::env::var("SIMCUDA_UTILIZATION") {
        Ok(v) => Some(simcuda_core::parse_utilization(&v, cfg.devices).map_err(|e| format!("SIMCUDA_UTILIZATION={v}: {e}"))?),
        Err(_) => None,
    };
    let _ = UTILIZATION.set(util);
    let shared = SharedState::open(&cfg.state_dir).unwrap_or_else(|e| {
        eprintln!("simcuda nvml: cannot use {}: {e}; no process is visible", cfg.state_dir.display());
        SharedState::anonymous()
    });
    Ok((cfg, shared))
}

fn system() -> Result<&'static (Config, SharedState)> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    SYSTEM.get().and_then(|s| s.as_ref().ok()).ok_or(NVML_ERROR_UNINITIALIZED)
}

/// The memory domain (a GPU, or a MIG instance: `simcuda_core::mig`) a handle is.
fn device_index(device: nvmlDevice_t) -> Result<u32> {
    let (cfg, _) = system()?;
    let off = (device as usize).checked_sub(DEVICES.as_ptr() as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    u32::try_from(off).ok().filter(|&i| i < cfg.domains()).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// The GPU a handle is (not a MIG instance's).
fn gpu_index(device: nvmlDevice_t) -> Result<u32> {
    let (cfg, _) = system()?;
    device_index(device).ok().filter(|&i| i < cfg.devices).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn handle_of(index: u32) -> nvmlDevice_t {
    std::ptr::addr_of!(DEVICES[index as usize]) as nvmlDevice_t
}

#[inline(always)]
fn nvml(name: &'static str, body: impl FnOnce() -> Result<()>) -> nvmlReturn_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("simcuda nvml: internal error (panic) in {name}");
            NVML_ERROR_UNKNOWN
        }
    }
}

/// # Safety
/// `p` must be null (rejected) or valid for a write.
unsafe fn put<T>(p: *mut T, v: T) -> Result<()> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid per the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// # Safety
/// `buf` must be null (rejected) or valid for `len` bytes.
unsafe fn put_str(s: &str, buf: *mut c_char, len: c_uint) -> Result<()> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) <= s.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: buf holds len bytes, more than s needs with its NUL.
    unsafe { write_c_string(s, buf, len as usize) };
    Ok(())
}

// ---- init ----

fn init() -> Result<()> {
    match SYSTEM.get_or_init(open_system) {
        Ok(_) => {
            INIT_COUNT.fetch_add(1, Ordering::AcqRel);
            Ok(())
        }
        Err(e) => {
            eprintln!("simcuda nvml: {e}");
            Err(NVML_ERROR_DRIVER_NOT_LOADED)
        }
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    nvml("nvmlInit_v2", init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    nvml("nvmlInit", init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvml("nvmlInitWithFlags", init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    nvml("nvmlShutdown", || {
        INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).map(drop).map_err(|_| NVML_ERROR_UNINITIALIZED)
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// ---- system ----

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    nvml("nvmlSystemGetDriverVersion", || {
        system()?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(DRIVER_VERSION_STRING, version, length) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    nvml("nvmlSystemGetCudaDriverVersion", || unsafe { put(v, DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    nvml("nvmlSystemGetCudaDriverVersion_v2", || unsafe { put(v, DRIVER_VERSION) })
}

// ---- devices ----

fn device_count(count: *mut c_uint) -> Result<()> {
    let (cfg, _) = system()?;
    // SAFETY: out-pointer from the caller.
    unsafe { put(count, cfg.devices) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetCount_v2", || device_count(deviceCount))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetCount", || device_count(deviceCount))
}

fn handle_by_index(index: c_uint, device: *mut nvmlDevice_t) -> Result<()> {
    let (cfg, _) = system()?;
    if index >= cfg.devices {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: out-pointer from the caller.
    unsafe { put(device, handle_of(index)) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetHandleByIndex_v2", || handle_by_index(index, device))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetHandleByIndex", || handle_by_index(index, device))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetHandleByUUID", || {
        let (cfg, _) = system()?;
        if uuid.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: a NUL-terminated string per the C contract.
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
        let index = (0..cfg.domains()).find(|&i| cfg.domain_uuid_string(i) == wanted).ok_or(NVML_ERROR_NOT_FOUND)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(device, handle_of(index)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetIndex", || {
        let i = gpu_index(device)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(index, i) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetUUID", || {
        let i = device_index(device)?;
        let (cfg, _) = system()?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(&cfg.domain_uuid_string(i), uuid, length) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetName", || {
        device_index(device)?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(DEVICE_NAME, name, length) }
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// What `SIMCUDA_UTILIZATION` says of a GPU; `NVML_ERROR_NOT_SUPPORTED` when it is unset (simcuda
/// runs no kernels: it has no utilization to measure) and on a MIG instance's handle (as NVML).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetUtilizationRates", || {
        let i = device_index(device)?;
        let (cfg, _) = system()?;
        if i >= cfg.devices {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let table = UTILIZATION.get().and_then(|u| u.as_ref()).ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let &(gpu, memory) = table.get(i as usize).ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(utilization, nvmlUtilization_t { gpu, memory }) }
    })
}

/// `(total, reserved, free, used)` of `device`, other processes included, dead ones reaped.
fn memory(device: nvmlDevice_t) -> Result<(u64, u64, u64, u64)> {
    let i = device_index(device)?;
    let (cfg, shared) = system()?;
    shared.reap_dead();
    // A GPU in MIG mode: its own memory is what its instances hold.
    let used: u64 = std::iter::once(i).chain(cfg.instances_of(i)).map(|d| shared.device_used(d)).sum();
    Ok((cfg.domain_total(i), cfg.domain_reserve(i), cfg.domain_usable(i).saturating_sub(used), used))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory_out: *mut nvmlMemory_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetMemoryInfo", || {
        let (total, reserved, free, used) = memory(device)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(memory_out, nvmlMemory_t { total, free, used: reserved + used }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory_out: *mut nvmlMemory_v2_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetMemoryInfo_v2", || {
        let (total, reserved, free, used) = memory(device)?;
        if memory_out.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to an nvmlMemory_v2_t per the C contract.
        if unsafe { (*memory_out).version } != nvmlMemory_v2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        // SAFETY: as above.
        unsafe { put(memory_out, nvmlMemory_v2_t { version: nvmlMemory_v2, total, reserved, free, used }) }
    })
}

/// The compute processes of `device` into `infos` (capacity `*infoCount`), NVML's way: when they
/// do not fit, `*infoCount` becomes the number needed and the result NVML_ERROR_INSUFFICIENT_SIZE.
/// `make(pid, used, GPU instance id)`: the id is `None` off MIG.
fn processes<T>(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut T, make: impl Fn(u32, u64, Option<u32>) -> T) -> Result<()> {
    let i = device_index(device)?;
    let (cfg, shared) = system()?;
    if infoCount.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    shared.reap_dead();
    // An instance's own processes; a GPU in MIG mode lists those of all its instances.
    let gi = |d: u32| cfg.mig_of(d).map(|m| m.index);
    let procs: Vec<(u32, u64, Option<u32>)> = std::iter::once(i)
        .chain(cfg.instances_of(i))
        .flat_map(|d| shared.processes(d).into_iter().map(move |p| (p.pid, p.used, gi(d))))
        .collect();
    // SAFETY: non-null in/out count per the C contract.
    let capacity = unsafe { infoCount.read() } as usize;
    // SAFETY: as above.
    unsafe { infoCount.write(procs.len() as c_uint) };
    if procs.len() > capacity || (infos.is_null() && !procs.is_empty()) {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, p) in procs.iter().enumerate() {
        // SAFETY: infos holds `capacity` >= procs.len() entries per the C contract.
        unsafe { infos.add(k).write(make(p.0, p.1, p.2)) };
    }
    Ok(())
}

fn info_v3(pid: u32, used: u64, gi: Option<u32>) -> nvmlProcessInfo_t {
    let (gpuInstanceId, computeInstanceId) = gi.map_or((NOT_AVAILABLE, NOT_AVAILABLE), |g| (g, 0));
    nvmlProcessInfo_t { pid, usedGpuMemory: used, gpuInstanceId, computeInstanceId }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml("nvmlDeviceGetComputeRunningProcesses_v3", || processes(device, infoCount, infos, info_v3))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml("nvmlDeviceGetComputeRunningProcesses_v2", || processes(device, infoCount, infos, info_v3))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    nvml("nvmlDeviceGetComputeRunningProcesses", || {
        processes(device, infoCount, infos, |pid, used, _| nvmlProcessInfo_v1_t { pid, usedGpuMemory: used })
    })
}

fn no_processes(device: nvmlDevice_t, infoCount: *mut c_uint) -> Result<()> {
    device_index(device)?;
    // SAFETY: out-pointer from the caller.
    unsafe { put(infoCount, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml("nvmlDeviceGetGraphicsRunningProcesses_v3", || no_processes(device, infoCount))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml("nvmlDeviceGetMPSComputeRunningProcesses_v3", || no_processes(device, infoCount))
}

// ---- MIG ----

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(device: nvmlDevice_t, currentMode: *mut c_uint, pendingMode: *mut c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetMigMode", || {
        let g = gpu_index(device).map_err(|_| NVML_ERROR_NOT_SUPPORTED)?;
        let (cfg, _) = system()?;
        let mode = if cfg.instances_of(g).is_empty() { NVML_DEVICE_MIG_DISABLE } else { NVML_DEVICE_MIG_ENABLE };
        // SAFETY: out-pointers from the caller.
        unsafe {
            put(currentMode, mode)?;
            put(pendingMode, mode)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceGetMaxMigDeviceCount", || {
        let g = gpu_index(device)?;
        let (cfg, _) = system()?;
        let n = if cfg.instances_of(g).is_empty() { 0 } else { MAX_MIG_DEVICES };
        // SAFETY: out-pointer from the caller.
        unsafe { put(count, n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    nvml("nvmlDeviceGetMigDeviceHandleByIndex", || {
        let g = gpu_index(device)?;
        let (cfg, _) = system()?;
        let instances = cfg.instances_of(g);
        if instances.is_empty() {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        if index >= MAX_MIG_DEVICES {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let d = instances.into_iter().find(|&d| cfg.mig_of(d).is_some_and(|m| m.index == index)).ok_or(NVML_ERROR_NOT_FOUND)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(migDevice, handle_of(d)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: nvmlDevice_t, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    nvml("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", || {
        let d = device_index(migDevice)?;
        let (cfg, _) = system()?;
        let m = cfg.mig_of(d).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(device, handle_of(m.parent)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, isMigDevice: *mut c_uint) -> nvmlReturn_t {
    nvml("nvmlDeviceIsMigDeviceHandle", || {
        let d = device_index(device)?;
        let (cfg, _) = system()?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(isMigDevice, c_uint::from(cfg.mig_of(d).is_some())) }
    })
}
