//! MIG instances as devices of their own: a GPU in MIG mode is split into instances, each with its
//! own `MIG-…` UUID and its own memory, and a CUDA process on one sees that instance alone (its
//! `cuDeviceGetUuid` is the MIG UUID, its `cuMemGetInfo` total the instance's memory). This module
//! owns how the node's instances are read from NVML and how they are numbered as node devices.
//!
//! Enumeration ([`walk`]), through NVML's MIG handles, for each GPU NVML counts: its mode
//! (`nvmlDeviceGetMigMode`; `NVML_ERROR_NOT_SUPPORTED` is a GPU without MIG, silently), the most
//! instances it may hold (`nvmlDeviceGetMaxMigDeviceCount`), then each index below that
//! (`nvmlDeviceGetMigDeviceHandleByIndex`; `NVML_ERROR_NOT_FOUND` is an empty index, skipped).
//! On each instance's handle its UUID (`nvmlDeviceGetUUID`) and its memory
//! (`nvmlDeviceGetMemoryInfo`: total is the instance's). An NVML without the MIG functions (an
//! old library) or any other error is a note said once, and those instances are not known: a
//! process placed on one is then a counted gap and its limit unknown, never a guessed one.
//!
//! Numbering: the node's devices are NVML's GPUs `0..n` (PCI order), then the instances in the
//! order of the walk (by GPU, then by MIG index): instance k is node device `n + k`. The eBPF
//! path's NVML reader ([`crate::ebpf::nvml`]) walks the same way, so both agree on the index.

/// One MIG instance of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigInstance {
    /// Its UUID as NVML prints it (`MIG-…`).
    pub uuid: String,
    /// The NVML index of its GPU.
    pub parent: u32,
    /// Its index among its GPU's MIG handles.
    pub mig_index: u32,
    /// Its memory (NVML's total on its handle), when NVML gave it.
    pub total: Option<u64>,
}

/// Why a MIG query failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigError {
    /// `NVML_ERROR_NOT_SUPPORTED`: this GPU has no MIG.
    NotSupported,
    /// `NVML_ERROR_NOT_FOUND`: no instance at this index.
    NotFound,
    /// Anything else (the function missing from the library, NVML's error), in words.
    Other(String),
}

/// The MIG queries of an NVML (nvml-wrapper's in [`crate::attribution::node_gpus`], a table in
/// tests).
pub trait MigNvml {
    /// A MIG device handle.
    type Handle;
    /// `nvmlDeviceGetMigMode`'s current mode of GPU `gpu`: enabled or not.
    fn mig_mode(&self, gpu: u32) -> Result<bool, MigError>;
    /// `nvmlDeviceGetMaxMigDeviceCount` of GPU `gpu`.
    fn max_count(&self, gpu: u32) -> Result<u32, MigError>;
    /// `nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)`.
    fn by_index(&self, gpu: u32, index: u32) -> Result<Self::Handle, MigError>;
}

/// What [`walk`] found: (GPU, MIG index, handle) in node order, and what went wrong (one line
/// each, at most one per GPU).
pub type Walk<H> = (Vec<(u32, u32, H)>, Vec<String>);

/// The instances of `gpus` GPUs (see [`Walk`]).
pub fn walk<N: MigNvml>(nvml: &N, gpus: u32) -> Walk<N::Handle> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for g in 0..gpus {
        match nvml.mig_mode(g) {
            Ok(true) => {}
            Ok(false) | Err(MigError::NotSupported) => continue,
            Err(MigError::NotFound) => continue,
            Err(MigError::Other(e)) => {
                problems.push(format!("GPU {g}: nvmlDeviceGetMigMode: {e}: its MIG instances, if any, are not known"));
                continue;
            }
        }
        let max = match nvml.max_count(g) {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!("GPU {g}: nvmlDeviceGetMaxMigDeviceCount: {}: its MIG instances are not known", words(&e)));
                continue;
            }
        };
        for k in 0..max {
            match nvml.by_index(g, k) {
                Ok(h) => out.push((g, k, h)),
                Err(MigError::NotFound) => {}
                Err(e) => {
                    problems.push(format!(
                        "GPU {g}: nvmlDeviceGetMigDeviceHandleByIndex({k}): {}: later instances of it are not known",
                        words(&e)
                    ));
                    break;
                }
            }
        }
    }
    (out, problems)
}

fn words(e: &MigError) -> String {
    match e {
        MigError::NotSupported => "not supported".to_string(),
        MigError::NotFound => "not found".to_string(),
        MigError::Other(s) => s.clone(),
    }
}

/// nvml-wrapper's error as a [`MigError`] (a missing symbol: an NVML without MIG support).
pub fn from_nvml(e: nvml_wrapper::error::NvmlError) -> MigError {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::NotSupported => MigError::NotSupported,
        NvmlError::NotFound => MigError::NotFound,
        NvmlError::FailedToLoadSymbol(s) => MigError::Other(format!("this NVML has no MIG support (no {s})")),
        e => MigError::Other(e.to_string()),
    }
}

/// nvml-wrapper's NVML as a [`MigNvml`].
pub struct Wrapper<'n>(pub &'n nvml_wrapper::Nvml);

impl<'n> MigNvml for Wrapper<'n> {
    type Handle = nvml_wrapper::Device<'n>;
    fn mig_mode(&self, gpu: u32) -> Result<bool, MigError> {
        let d = self.0.device_by_index(gpu).map_err(from_nvml)?;
        d.mig_mode().map(|m| m.current == 1).map_err(from_nvml)
    }
    fn max_count(&self, gpu: u32) -> Result<u32, MigError> {
        self.0.device_by_index(gpu).and_then(|d| d.mig_device_count()).map_err(from_nvml)
    }
    fn by_index(&self, gpu: u32, index: u32) -> Result<Self::Handle, MigError> {
        self.0.device_by_index(gpu).and_then(|d| d.mig_device_by_index(index)).map_err(from_nvml)
    }
}

/// The node's instances from nvml-wrapper's NVML over its `gpus` GPUs, and the problems met.
pub fn read(nvml: &nvml_wrapper::Nvml, gpus: u32) -> (Vec<MigInstance>, Vec<String>) {
    let (found, mut problems) = walk(&Wrapper(nvml), gpus);
    let mut out = Vec::new();
    for (parent, mig_index, h) in found {
        match h.uuid() {
            Ok(uuid) => out.push(MigInstance { uuid, parent, mig_index, total: h.memory_info().ok().map(|m| m.total) }),
            Err(e) => problems.push(format!("GPU {parent}: MIG instance {mig_index}: nvmlDeviceGetUUID: {e}: not known")),
        }
    }
    (out, problems)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A table NVML: per GPU its mode answer, max count, and the instances by index.
    struct Table {
        mode: BTreeMap<u32, Result<bool, MigError>>,
        max: u32,
        at: BTreeMap<(u32, u32), Result<&'static str, MigError>>,
    }

    impl MigNvml for Table {
        type Handle = &'static str;
        fn mig_mode(&self, gpu: u32) -> Result<bool, MigError> {
            self.mode.get(&gpu).cloned().unwrap_or(Err(MigError::NotSupported))
        }
        fn max_count(&self, _gpu: u32) -> Result<u32, MigError> {
            Ok(self.max)
        }
        fn by_index(&self, gpu: u32, index: u32) -> Result<&'static str, MigError> {
            self.at.get(&(gpu, index)).cloned().unwrap_or(Err(MigError::NotFound))
        }
    }

    #[test]
    fn instances_are_walked_by_gpu_then_index_skipping_empty_indices() {
        let t = Table {
            mode: [(0, Ok(false)), (1, Ok(true)), (2, Ok(true))].into(),
            max: 7,
            at: [((1, 0), Ok("a")), ((1, 3), Ok("b")), ((2, 6), Ok("c")), ((0, 0), Ok("never: GPU 0 is not in MIG mode"))].into(),
        };
        let (found, problems) = walk(&t, 4);
        assert_eq!(found, vec![(1, 0, "a"), (1, 3, "b"), (2, 6, "c")]);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn an_nvml_without_mig_support_is_said_not_guessed() {
        let t = Table {
            mode: [(0, Err(MigError::Other("this NVML has no MIG support (no nvmlDeviceGetMigMode)".into())))].into(),
            max: 7,
            at: BTreeMap::new(),
        };
        let (found, problems) = walk(&t, 1);
        assert!(found.is_empty());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no MIG support"), "{problems:?}");
        let broken = Table {
            mode: [(0, Ok(true))].into(),
            max: 3,
            at: [((0, 0), Ok("a")), ((0, 1), Err(MigError::Other("GPU lost".into())))].into(),
        };
        let (found, problems) = walk(&broken, 1);
        assert_eq!(found, vec![(0, 0, "a")], "what was read before the error is kept");
        assert!(problems[0].contains("GPU lost"), "{problems:?}");
    }
}
