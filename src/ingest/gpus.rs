//! What NVML said of the node's GPUs at the live pipeline's last reading ([`GpuReadings`]): each
//! GPU's name (`nvmlDeviceGetName`), its utilization (`nvmlDeviceGetUtilizationRates`: the share
//! of the last sample period a kernel ran, and that device memory was read or written) and the
//! used bytes of each compute process NVML lists on it (`nvmlDeviceGetComputeRunningProcesses`).
//!
//! The live pipeline reads it once per tick (`crate::ebpf::nvml::HolderReader::read_gpus`) and
//! keeps it in the state, so one read serves every view of that state (the feed `gpufrag top`
//! reads, the summary). A record or a snapshot played back has none, and every figure that
//! NVML would give is then unknown (`None`), never 0. Keyed by node device: NVML's index for a
//! GPU, `n + k` for MIG instance k (`crate::attribution::mig`).

use std::collections::BTreeMap;

/// One GPU (or MIG instance) as NVML answered; each `None` where NVML did not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuReading {
    /// The product name (`NVIDIA H200`).
    pub name: Option<String>,
    /// Percent of the last sample period a kernel ran (0–100).
    pub utilization_gpu: Option<u32>,
    /// Percent of the last sample period device memory was read or written (0–100).
    pub utilization_memory: Option<u32>,
    /// Used bytes per pid, as NVML lists them; `None` when the list could not be read. A pid
    /// NVML lists without a figure (MIG without privileges) is left out.
    pub processes: Option<BTreeMap<u32, u64>>,
}

/// The node's GPUs at one reading.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuReadings {
    /// When it was read, ns since the Unix epoch.
    pub at_ns: u64,
    /// Per node device.
    pub gpus: BTreeMap<i16, GpuReading>,
}

impl GpuReadings {
    /// What NVML says `pid` uses on `device`; `None` when NVML was not read there or does not
    /// list the pid (gone, or in another pid namespace).
    pub fn used_by(&self, pid: u32, device: i16) -> Option<u64> {
        self.gpus.get(&device)?.processes.as_ref()?.get(&pid).copied()
    }

    /// The sum over every process NVML lists on `device` (untraced ones too); `None` when the
    /// list could not be read.
    pub fn used_on(&self, device: i16) -> Option<u64> {
        Some(self.gpus.get(&device)?.processes.as_ref()?.values().fold(0u64, |a, b| a.saturating_add(*b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_is_none_never_zero() {
        let mut r = GpuReadings::default();
        assert_eq!((r.used_by(7, 0), r.used_on(0)), (None, None), "nothing read");
        r.gpus.insert(0, GpuReading { processes: None, ..GpuReading::default() });
        assert_eq!((r.used_by(7, 0), r.used_on(0)), (None, None), "the list failed");
        r.gpus.insert(0, GpuReading { processes: Some(BTreeMap::from([(7, 3 << 20), (9, 5 << 20)])), ..GpuReading::default() });
        assert_eq!((r.used_by(7, 0), r.used_by(8, 0), r.used_on(0)), (Some(3 << 20), None, Some(8 << 20)));
    }
}
