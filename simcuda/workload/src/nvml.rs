//! `nvml`: what a monitor sees, through `dlopen("libnvidia-ml.so.1")` as nvidia-smi and
//! nvml-wrapper do, without creating a CUDA context of its own (only `cuInit` and
//! `cuDeviceGetUuid_v2`, to compare UUIDs). Per device it prints
//! `RESULT test=nvml device=I uuid=.. driver_uuid_match=0|1 total=.. reserved=.. free=.. used=.. v1_free=.. v1_used=.. processes=K count_query_rc=R`
//! then `PROCESS device=I pid=P used=BYTES` for each compute process and
//! `INFO device=I name=NAME` (the name may contain spaces, so it ends its line); for a GPU in
//! MIG mode, `MIG device=I index=K uuid=MIG-.. total=.. free=.. used=.. parent_match=0|1
//! is_mig=0|1 processes=N` per instance (through NVML's MIG handles); last
//! `INFO driver_version=VERSION` (`nvmlSystemGetDriverVersion`).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::ffi::*;
use crate::{ok, result, Outcome};

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

type Device = *mut c_void;

/// Looks up an NVML function by name as `$ty`.
macro_rules! nvml_fn {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym($lib, concat!($name, "\0").as_ptr().cast()) };
        if p.is_null() {
            return Err(format!("libnvidia-ml.so.1 has no {}", $name));
        }
        // SAFETY: the NVML function of that name has this C signature (nvml.h).
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

fn nvml_ok(call: &str, rc: c_int) -> Outcome {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed: NVML error {rc}"))
    }
}

pub fn nvml() -> Outcome {
    // SAFETY: dlopen of a NUL-terminated name.
    let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        return Err("dlopen(libnvidia-ml.so.1) failed".to_string());
    }
    let init = nvml_fn!(lib, "nvmlInit_v2", unsafe extern "C" fn() -> c_int);
    let shutdown = nvml_fn!(lib, "nvmlShutdown", unsafe extern "C" fn() -> c_int);
    let count = nvml_fn!(lib, "nvmlDeviceGetCount_v2", unsafe extern "C" fn(*mut c_uint) -> c_int);
    let handle = nvml_fn!(lib, "nvmlDeviceGetHandleByIndex_v2", unsafe extern "C" fn(c_uint, *mut Device) -> c_int);
    let uuid = nvml_fn!(lib, "nvmlDeviceGetUUID", unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int);
    let name = nvml_fn!(lib, "nvmlDeviceGetName", unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int);
    let driver = nvml_fn!(lib, "nvmlSystemGetDriverVersion", unsafe extern "C" fn(*mut c_char, c_uint) -> c_int);
    let mem_v1 = nvml_fn!(lib, "nvmlDeviceGetMemoryInfo", unsafe extern "C" fn(Device, *mut Memory) -> c_int);
    let mem_v2 = nvml_fn!(lib, "nvmlDeviceGetMemoryInfo_v2", unsafe extern "C" fn(Device, *mut MemoryV2) -> c_int);
    let procs =
        nvml_fn!(lib, "nvmlDeviceGetComputeRunningProcesses_v3", unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> c_int);
    let mig_mode = nvml_fn!(lib, "nvmlDeviceGetMigMode", unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> c_int);
    let mig_max = nvml_fn!(lib, "nvmlDeviceGetMaxMigDeviceCount", unsafe extern "C" fn(Device, *mut c_uint) -> c_int);
    let mig_by_index = nvml_fn!(lib, "nvmlDeviceGetMigDeviceHandleByIndex", unsafe extern "C" fn(Device, c_uint, *mut Device) -> c_int);
    let mig_parent = nvml_fn!(lib, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", unsafe extern "C" fn(Device, *mut Device) -> c_int);
    let is_mig = nvml_fn!(lib, "nvmlDeviceIsMigDeviceHandle", unsafe extern "C" fn(Device, *mut c_uint) -> c_int);
    // SAFETY: every call below gets valid out-pointers and buffers of the lengths passed.
    unsafe {
        nvml_ok("nvmlInit_v2", init())?;
        ok("cuInit", cuInit(0))?;
        let mut n = 0;
        nvml_ok("nvmlDeviceGetCount_v2", count(&mut n))?;
        for i in 0..n {
            let mut dev = std::ptr::null_mut();
            nvml_ok("nvmlDeviceGetHandleByIndex_v2", handle(i, &mut dev))?;
            let mut ubuf = [0 as c_char; 96];
            nvml_ok("nvmlDeviceGetUUID", uuid(dev, ubuf.as_mut_ptr(), ubuf.len() as c_uint))?;
            let nvml_uuid = CStr::from_ptr(ubuf.as_ptr()).to_string_lossy().into_owned();
            let mut cu = CUuuid::default();
            ok("cuDeviceGetUuid_v2", cuDeviceGetUuid_v2(&mut cu, i as CUdevice))?;
            let driver_uuid: String = cu.bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut nbuf = [0 as c_char; 96];
            nvml_ok("nvmlDeviceGetName", name(dev, nbuf.as_mut_ptr(), nbuf.len() as c_uint))?;
            let mut m1 = Memory::default();
            nvml_ok("nvmlDeviceGetMemoryInfo", mem_v1(dev, &mut m1))?;
            let mut m2 = MemoryV2 { version: std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24), ..MemoryV2::default() };
            nvml_ok("nvmlDeviceGetMemoryInfo_v2", mem_v2(dev, &mut m2))?;
            // NVML's protocol: ask with no room, learn the count, then fetch.
            let mut k: c_uint = 0;
            let count_rc = procs(dev, &mut k, std::ptr::null_mut());
            let mut infos = vec![ProcessInfo::default(); k as usize];
            if k > 0 {
                nvml_ok("nvmlDeviceGetComputeRunningProcesses_v3", procs(dev, &mut k, infos.as_mut_ptr()))?;
            }
            result!(
                "test" = "nvml",
                "device" = i,
                "uuid" = nvml_uuid,
                "driver_uuid_match" = u8::from(nvml_uuid.replace('-', "").trim_start_matches("GPU") == driver_uuid),
                "total" = m2.total,
                "reserved" = m2.reserved,
                "free" = m2.free,
                "used" = m2.used,
                "v1_free" = m1.free,
                "v1_used" = m1.used,
                "processes" = k,
                "count_query_rc" = count_rc,
            );
            for p in &infos[..k as usize] {
                println!("PROCESS device={i} pid={} used={}", p.pid, p.used_gpu_memory);
            }
            println!("INFO device={i} name={}", CStr::from_ptr(nbuf.as_ptr()).to_string_lossy());
            let (mut current, mut pending, mut max) = (0, 0, 0);
            nvml_ok("nvmlDeviceGetMigMode", mig_mode(dev, &mut current, &mut pending))?;
            nvml_ok("nvmlDeviceGetMaxMigDeviceCount", mig_max(dev, &mut max))?;
            for k in 0..if current == 1 { max } else { 0 } {
                let mut m = std::ptr::null_mut();
                match mig_by_index(dev, k, &mut m) {
                    0 => {}
                    6 => continue, // NVML_ERROR_NOT_FOUND: no instance at this index
                    rc => return Err(format!("nvmlDeviceGetMigDeviceHandleByIndex failed: NVML error {rc}")),
                }
                let mut ubuf = [0 as c_char; 96];
                nvml_ok("nvmlDeviceGetUUID", uuid(m, ubuf.as_mut_ptr(), ubuf.len() as c_uint))?;
                let mut mm = Memory::default();
                nvml_ok("nvmlDeviceGetMemoryInfo", mem_v1(m, &mut mm))?;
                let (mut parent, mut flag) = (std::ptr::null_mut(), 0);
                nvml_ok("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig_parent(m, &mut parent))?;
                nvml_ok("nvmlDeviceIsMigDeviceHandle", is_mig(m, &mut flag))?;
                let mut n: c_uint = 0;
                let _ = procs(m, &mut n, std::ptr::null_mut());
                println!(
                    "MIG device={i} index={k} uuid={} total={} free={} used={} parent_match={} is_mig={flag} processes={n}",
                    CStr::from_ptr(ubuf.as_ptr()).to_string_lossy(),
                    mm.total,
                    mm.free,
                    mm.used,
                    u8::from(parent == dev)
                );
            }
        }
        let mut vbuf = [0 as c_char; 96];
        nvml_ok("nvmlSystemGetDriverVersion", driver(vbuf.as_mut_ptr(), vbuf.len() as c_uint))?;
        println!("INFO driver_version={}", CStr::from_ptr(vbuf.as_ptr()).to_string_lossy());
        nvml_ok("nvmlShutdown", shutdown())?;
    }
    Ok(())
}
