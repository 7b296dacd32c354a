//! `hw.id` for a CUDA ordinal: the GPU's UUID from NVML (`nvml-wrapper` loads
//! `libnvidia-ml.so.1` at run time), else `gpu-<index>`.
//!
//! A CUDA ordinal is an index into the devices the traced process sees: `CUDA_VISIBLE_DEVICES`,
//! when set, lists them (by index or by UUID); otherwise ordinal N is taken to be NVML's device
//! N. (CUDA's default order, fastest first, equals NVML's PCI order on machines of one GPU model,
//! which is what a training node is; set `CUDA_DEVICE_ORDER=PCI_BUS_ID` on mixed machines.)

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

/// Names GPUs.
pub struct GpuIds {
    nvml: Option<nvml_wrapper::Nvml>,
    visible: Option<Vec<String>>,
    cache: BTreeMap<i16, Arc<str>>,
    /// Why NVML is not used, when it is not.
    pub nvml_error: Option<String>,
}

impl GpuIds {
    /// Loads NVML from `lib` (default `libnvidia-ml.so.1`; `none` to not use NVML) and reads
    /// `CUDA_VISIBLE_DEVICES`.
    pub fn new(lib: Option<&str>) -> GpuIds {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect());
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
        GpuIds { nvml, visible, cache: BTreeMap::new(), nvml_error }
    }

    /// No NVML, no `CUDA_VISIBLE_DEVICES`: `gpu-<ordinal>`.
    pub fn without_nvml() -> GpuIds {
        GpuIds { nvml: None, visible: None, cache: BTreeMap::new(), nvml_error: Some("disabled".to_string()) }
    }

    /// The `hw.id` of CUDA ordinal `device`.
    pub fn id(&mut self, device: i16) -> Arc<str> {
        if let Some(id) = self.cache.get(&device) {
            return id.clone();
        }
        let id: Arc<str> = Arc::from(self.resolve(device).as_str());
        self.cache.insert(device, id.clone());
        id
    }

    fn resolve(&self, device: i16) -> String {
        let Ok(ordinal) = usize::try_from(device) else {
            return format!("gpu-{device}");
        };
        let entry = self.visible.as_ref().and_then(|v| v.get(ordinal)).cloned();
        let index: Option<u32> = match &entry {
            Some(e) => e.parse().ok(),
            None => u32::try_from(ordinal).ok(),
        };
        if let Some(nvml) = &self.nvml {
            if let Some(i) = index {
                if let Ok(uuid) = nvml.device_by_index(i).and_then(|d| d.uuid()) {
                    return uuid;
                }
            } else if let Some(e) = &entry {
                // A UUID, possibly abbreviated: NVML's full one.
                let n = nvml.device_count().unwrap_or(0);
                for i in 0..n {
                    if let Ok(uuid) = nvml.device_by_index(i).and_then(|d| d.uuid()) {
                        if uuid.starts_with(e.as_str()) {
                            return uuid;
                        }
                    }
                }
            }
        }
        match (entry, index) {
            (Some(e), None) => e,
            (_, Some(i)) => format!("gpu-{i}"),
            (None, None) => format!("gpu-{device}"),
        }
    }
}
