//! `hw.id` for a device: the GPU's UUID from NVML (`nvml-wrapper` loads `libnvidia-ml.so.1` at
//! run time), else `gpu-<index>`; and what the GPU semantic conventions recommend beside it on
//! `hw.gpu.*` series: `hw.model` (`nvmlDeviceGetName`), `hw.vendor` (`NVIDIA`: what NVML
//! answers for) and `hw.driver_version` (`nvmlSystemGetDriverVersion`). Without NVML these three
//! are left out rather than guessed.
//!
//! The device is the node's GPU index (NVML's order): the live front ends place each process's
//! CUDA ordinal on its GPU before they apply its events ([`crate::attribution`]), through the
//! process's own `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`, so nothing is remapped here.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

/// What NVML says of a GPU, for the `hw.gpu.*` series; each `None` when it did not answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hardware {
    /// `hw.model`: the product name (`NVIDIA H200`).
    pub model: Option<Arc<str>>,
    /// `hw.vendor`.
    pub vendor: Option<&'static str>,
    /// `hw.driver_version`: the kernel driver's version (`580.95.05`).
    pub driver_version: Option<Arc<str>>,
}

/// Names GPUs.
pub struct GpuIds {
    nvml: Option<nvml_wrapper::Nvml>,
    cache: BTreeMap<i16, Arc<str>>,
    hardware: BTreeMap<i16, Arc<Hardware>>,
    /// Why NVML is not used, when it is not.
    pub nvml_error: Option<String>,
}

impl GpuIds {
    /// Loads NVML from `lib` (default `libnvidia-ml.so.1`; `none` to not use NVML).
    pub fn new(lib: Option<&str>) -> GpuIds {
        let (nvml, nvml_error) = match lib {
            Some("none") => (None, Some("disabled".to_string())),
            Some(path) => match nvml_wrapper::Nvml::builder().lib_path(OsStr::new(path)).init() {
                Ok(n) => (Some(n), None),
                Err(e) => (None, Some(format!("{path}: {e}"))),
            },
            None => match nvml_wrapper::Nvml::init() {
                Ok(n) => (Some(n), None),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        GpuIds { nvml, cache: BTreeMap::new(), hardware: BTreeMap::new(), nvml_error }
    }

    /// No NVML: `gpu-<index>`.
    pub fn without_nvml() -> GpuIds {
        GpuIds { nvml: None, cache: BTreeMap::new(), hardware: BTreeMap::new(), nvml_error: Some("disabled".to_string()) }
    }

    /// The `hw.id` of node GPU `device`.
    pub fn id(&mut self, device: i16) -> Arc<str> {
        if let Some(id) = self.cache.get(&device) {
            return id.clone();
        }
        let id: Arc<str> = Arc::from(self.resolve(device).as_str());
        self.cache.insert(device, id.clone());
        id
    }

    /// Model, vendor and driver of node GPU `device` (asked of NVML once per device).
    pub fn hardware(&mut self, device: i16) -> Arc<Hardware> {
        if let Some(h) = self.hardware.get(&device) {
            return h.clone();
        }
        let mut h = Hardware::default();
        if let (Some(nvml), Ok(i)) = (&self.nvml, u32::try_from(device)) {
            if let Ok(d) = nvml.device_by_index(i) {
                h.model = d.name().ok().map(|n| Arc::from(n.as_str()));
                h.vendor = Some("NVIDIA");
                h.driver_version = nvml.sys_driver_version().ok().map(|v| Arc::from(v.as_str()));
            }
        }
        let h = Arc::new(h);
        self.hardware.insert(device, h.clone());
        h
    }

    fn resolve(&self, device: i16) -> String {
        if let (Some(nvml), Ok(i)) = (&self.nvml, u32::try_from(device)) {
            if let Ok(uuid) = nvml.device_by_index(i).and_then(|d| d.uuid()) {
                return uuid;
            }
        }
        format!("gpu-{device}")
    }
}
