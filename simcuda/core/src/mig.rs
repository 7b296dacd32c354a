//! MIG instances of the simulated GPUs: `SIMCUDA_MIG` splits a GPU into instances, each a device
//! of its own with its own `MIG-…` UUID and its own memory, as a GPU in MIG mode is split into
//! GPU instances (one compute instance each). This module owns the variable's form, the
//! instances' UUIDs and the numbering of memory domains that the driver and NVML share: domain
//! `g < devices` is GPU g; domain `devices + k` is the k-th instance listed in `SIMCUDA_MIG`.
//! Every domain has its own slots in the state file, so one instance's allocations never use
//! another's memory, and a GPU with instances is in MIG mode: CUDA reaches its memory only
//! through them.
//!
//! Form: `GPU:SIZE+SIZE...`, GPUs separated by `;` (`0:4GiB+8GiB;1:18GiB`). An instance's memory
//! is what NVML's `nvmlDeviceGetMemoryInfo` on its handle reports as total and what
//! `cuMemGetInfo`/`cuDeviceTotalMem` report (no driver reserve of its own); the instances of one
//! GPU must fit in its usable memory (`SIMCUDA_MEM` − `SIMCUDA_RESERVE`).

use crate::config::{parse_size, GRANULARITY};

/// The most instances one GPU holds (the H100/H200's seven `1g` slices).
pub const MAX_PER_GPU: u32 = 7;
/// The most instances `SIMCUDA_MIG` may list in all.
pub const MAX_INSTANCES: u32 = 16;

/// One MIG instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigInstance {
    /// The GPU it is a slice of.
    pub parent: u32,
    /// Its index among its GPU's instances (`nvmlDeviceGetMigDeviceHandleByIndex`), also its
    /// GPU instance id as NVML's process list gives it.
    pub index: u32,
    /// Its memory, bytes.
    pub size: u64,
}

/// Parses `SIMCUDA_MIG` for a machine of `devices` GPUs whose usable memory is `usable` each.
pub fn parse(value: &str, devices: u32, usable: u64) -> Result<Vec<MigInstance>, String> {
    let mut out: Vec<MigInstance> = Vec::new();
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (gpu, sizes) = part.split_once(':').ok_or_else(|| format!("{part:?} is not GPU:SIZE+SIZE..."))?;
        let parent: u32 = gpu.trim().parse().map_err(|_| format!("{:?} is not a GPU index", gpu.trim()))?;
        if parent >= devices {
            return Err(format!("GPU {parent} does not exist (SIMCUDA_DEVICES={devices})"));
        }
        if out.iter().any(|m| m.parent == parent) {
            return Err(format!("GPU {parent} is listed twice"));
        }
        let mut sum = 0u64;
        for (index, s) in sizes.split('+').enumerate() {
            let size = parse_size(s).map_err(|e| format!("{s:?}: {e}"))?;
            if size < GRANULARITY {
                return Err(format!("instance {index} of GPU {parent}: {size} bytes, less than 2 MiB"));
            }
            if index as u32 >= MAX_PER_GPU {
                return Err(format!("GPU {parent}: more than {MAX_PER_GPU} instances"));
            }
            sum = sum.saturating_add(size);
            out.push(MigInstance { parent, index: index as u32, size });
        }
        if sum > usable {
            return Err(format!("GPU {parent}: its instances ({sum} bytes) do not fit in its usable memory ({usable} bytes)"));
        }
    }
    if out.len() as u32 > MAX_INSTANCES {
        return Err(format!("more than {MAX_INSTANCES} instances"));
    }
    Ok(out)
}

/// The 16 bytes of the UUID of instance `index` of GPU `parent`: stable, distinct from every
/// GPU's, RFC 4122 version 4.
pub fn uuid(parent: u32, index: u32) -> [u8; 16] {
    crate::uuid_from_seed(0x3d16_0000_0000_0000 ^ (u64::from(parent) << 8) ^ u64::from(index))
}

/// The UUID as NVML prints it for a MIG device (R470 and later): `MIG-xxxxxxxx-xxxx-...`.
pub fn uuid_string(parent: u32, index: u32) -> String {
    crate::uuid_text("MIG-", &uuid(parent, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn instances_parse_and_must_fit() {
        let m = parse("0:4GiB+8GiB; 1:2GiB", 2, 15 * GIB).expect("valid");
        assert_eq!(
            m,
            vec![
                MigInstance { parent: 0, index: 0, size: 4 * GIB },
                MigInstance { parent: 0, index: 1, size: 8 * GIB },
                MigInstance { parent: 1, index: 0, size: 2 * GIB },
            ]
        );
        assert!(parse("0:8GiB+8GiB", 1, 15 * GIB).is_err(), "16 GiB of instances on a 15 GiB GPU");
        assert!(parse("2:1GiB", 2, 15 * GIB).is_err());
        assert!(parse("0:1GiB;0:1GiB", 1, 15 * GIB).is_err());
        assert!(parse("0:lots", 1, 15 * GIB).is_err());
        assert!(parse("0", 1, 15 * GIB).is_err());
        assert!(parse("0:1MiB", 1, 15 * GIB).is_err());
        assert!(parse("0:1G+1G+1G+1G+1G+1G+1G+1G", 1, 15 * GIB).is_err(), "eight instances");
        assert_eq!(parse("", 1, GIB), Ok(Vec::new()));
    }

    #[test]
    fn uuids_are_mig_ones_and_distinct() {
        let a = uuid_string(0, 0);
        assert!(a.starts_with("MIG-") && a.len() == 40, "{a}");
        assert_ne!(a, uuid_string(0, 1));
        assert_ne!(a, uuid_string(1, 0));
        assert_ne!(&a[4..], &crate::device_uuid_string(0)[4..]);
    }
}
