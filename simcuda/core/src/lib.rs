//! Shared pieces of the simcuda stand-ins (driver, runtime, NVML): the configuration read from
//! `SIMCUDA_*` environment variables (`config`), the state file through which processes share a
//! simulated device's physical memory (`state`), the CUDA C types and result codes with their real
//! layouts and values (`ffi`), the MIG instances a GPU may be split into (`mig`), and the
//! per-device identity (UUID, name) that the driver and NVML must agree on.

pub mod config;
pub mod ffi;
pub mod mig;
pub mod state;

pub use config::{parse_size, parse_utilization, Config, GRANULARITY, MAX_DEVICES};

/// The most memory domains (GPUs and MIG instances) a machine has: every per-domain table of the
/// driver and NVML is this long.
pub const MAX_DOMAINS: u32 = MAX_DEVICES + mig::MAX_INSTANCES;

/// The name every simulated device reports (cuDeviceGetName, nvmlDeviceGetName).
pub const DEVICE_NAME: &str = "NVIDIA H200 (simcuda)";

/// The driver version the stand-ins report (cuDriverGetVersion, cudaDriverGetVersion): CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;

/// The 16 bytes of device `index`'s UUID: stable per index, random-looking, RFC 4122 version 4.
pub fn device_uuid(index: u32) -> [u8; 16] {
    uuid_from_seed(0x5ec1_c0da_0000_0000_u64 ^ u64::from(index))
}

/// 16 random-looking bytes from `seed`, marked RFC 4122 version 4.
fn uuid_from_seed(mut state: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for half in out.chunks_mut(8) {
        half.copy_from_slice(&splitmix64(&mut state).to_be_bytes());
    }
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

/// Device `index`'s UUID as NVML prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn device_uuid_string(index: u32) -> String {
    uuid_text("GPU-", &device_uuid(index))
}

/// `PREFIXxxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn uuid_text(prefix: &str, b: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("{prefix}{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Copies `s` into the C buffer `buf` of `len` bytes, truncated, always NUL-terminated.
/// Returns false (and writes nothing) when `buf` is null or `len` is 0.
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
pub unsafe fn write_c_string(s: &str, buf: *mut std::ffi::c_char, len: usize) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let n = s.len().min(len - 1);
    // SAFETY: the caller guarantees `buf` holds `len` bytes and n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast(), buf, n);
        *buf.add(n) = 0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_stable_and_distinct_per_device() {
        assert_eq!(device_uuid_string(0), device_uuid_string(0));
        assert_ne!(device_uuid_string(0), device_uuid_string(1));
        let s = device_uuid_string(3);
        assert_eq!(s.len(), 40);
        assert!(s.starts_with("GPU-"));
        assert_eq!(&s[4 + 14..4 + 15], "4", "version nibble in {s}");
    }
}
