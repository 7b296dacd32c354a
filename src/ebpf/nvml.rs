//! NVML as the eBPF path's yardstick: per-process used bytes (running compute processes) to say
//! how much of a process's memory was allocated before gpufrag attached, and device free bytes
//! for an OOM seen by a uprobe. `libnvidia-ml.so.1` is loaded at run time (nvml-wrapper): a
//! machine without it simply has no coverage figures.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::collections::BTreeMap;

/// A loaded NVML.
pub struct DeviceMonitor {
    nvml: Nvml,
}

impl DeviceMonitor {
    /// Loads NVML; the error says why not (no driver, no library).
    pub fn open() -> Result<DeviceMonitor, String> {
        Nvml::init().map(|nvml| DeviceMonitor { nvml }).map_err(|e| format!("NVML unavailable: {e}"))
    }

    /// Used bytes per (pid, device) as NVML reports them, for every compute process.
    pub fn process_used(&self) -> BTreeMap<(u32, i16), u64> {
        let mut out = BTreeMap::new();
        let n = self.nvml.device_count().unwrap_or(0);
        for i in 0..n {
            let Ok(dev) = self.nvml.device_by_index(i) else { continue };
            let Ok(procs) = dev.running_compute_processes() else { continue };
            for p in procs {
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    *out.entry((p.pid, i as i16)).or_insert(0) += b;
                }
            }
        }
        out
    }

    /// (total, free) bytes of device `index`.
    pub fn device_memory(&self, index: i16) -> Option<(u64, u64)> {
        let dev = self.nvml.device_by_index(u32::try_from(index).ok()?).ok()?;
        let m = dev.memory_info().ok()?;
        Some((m.total, m.free))
    }

    /// Number of devices.
    pub fn device_count(&self) -> u32 {
        self.nvml.device_count().unwrap_or(0)
    }
}
