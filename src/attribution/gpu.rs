//! Which physical GPU a process's CUDA ordinal is: the node's GPUs as NVML lists them (index and
//! UUID), narrowed by the process's own environment the way the NVIDIA container toolkit and
//! the CUDA driver narrow them.
//!
//! 1. `NVIDIA_VISIBLE_DEVICES` (set by the container toolkit or the Kubernetes device plugin):
//!    the GPUs mounted into the container, as indices or UUIDs; `all` (or unset) is every GPU,
//!    `none`/`void`/empty none. Inside the container CUDA enumerates them in the node's order.
//! 2. `CUDA_VISIBLE_DEVICES`: indices into what step 1 left, or UUIDs (`GPU-...`, a unique
//!    prefix, `GPU-` optional); the list ends at the first entry that names no device, as the
//!    driver reads it.
//!
//! Ordinal N is then the Nth GPU left, in PCI order (NVML's): right when the process runs with
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID` or its GPUs are alike; the driver's default order
//! (`FASTEST_FIRST`) may differ on a machine of unlike GPUs, and a program may set either variable
//! itself before its first CUDA call. That is why this is the fallback only: the driver's own word
//! ([`NodeGpus::by_driver_uuid`], the UUID the process's driver gives for the ordinal, which the
//! shim asks and the eBPF path reads from NVML's process list) comes first.
//!
//! What cannot be resolved is said, not guessed: a MIG
//! instance (`MIG-...`: its memory is not the GPU's), a UUID without NVML to look it up, an
//! ordinal past the end, a value in a form not listed here (the toolkit's
//! `/var/run/nvidia-container-devices` volume strategy, CDI names).

/// One GPU of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpu {
    /// NVML's index (PCI order).
    pub index: u32,
    /// NVML's UUID (`GPU-...`), when NVML is there.
    pub uuid: Option<String>,
}

/// The node's GPUs: from NVML, or, without it, nothing but indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeGpus {
    /// UUIDs by NVML index; `None` when NVML is absent (then indices are taken at their word).
    pub uuids: Option<Vec<String>>,
}

/// A process's two variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VisibleEnv {
    /// `NVIDIA_VISIBLE_DEVICES`.
    pub nvidia: Option<String>,
    /// `CUDA_VISIBLE_DEVICES`.
    pub cuda: Option<String>,
}

/// Why an ordinal has no GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// A MIG instance: its memory is a slice of the GPU's.
    Mig(String),
    /// A UUID, and no NVML to say which GPU it is.
    NoNvml(String),
    /// The ordinal is past the devices the process sees.
    Beyond {
        /// The ordinal.
        ordinal: i16,
        /// How many it sees.
        visible: usize,
    },
    /// A value of a form gpufrag does not read.
    Form(String),
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresolved::Mig(e) => write!(f, "MIG instance {e}: its memory is not the GPU's, not modelled"),
            Unresolved::NoNvml(e) => write!(f, "device {e} names a UUID and NVML is absent"),
            Unresolved::Beyond { ordinal, visible } => write!(f, "CUDA ordinal {ordinal} but the process sees {visible} device(s)"),
            Unresolved::Form(v) => write!(f, "visible-devices value {v:?} is not a form gpufrag reads"),
        }
    }
}

enum Entry {
    Gpu(u32),
    Stop,
    Fail(Unresolved),
}

impl NodeGpus {
    /// The GPU an entry names among `among` (node indices), or why not.
    fn entry(&self, e: &str, among: &[u32], by_position: bool) -> Entry {
        let e = e.trim();
        if e.is_empty() {
            return Entry::Stop;
        }
        if e.starts_with("MIG-") {
            return Entry::Fail(Unresolved::Mig(e.to_string()));
        }
        if e.bytes().all(|b| b.is_ascii_digit()) {
            let Ok(i) = e.parse::<usize>() else { return Entry::Stop };
            let got = if by_position { among.get(i).copied() } else { among.iter().copied().find(|&g| g as usize == i) };
            return got.map_or(Entry::Stop, Entry::Gpu);
        }
        let looks_uuid = e.starts_with("GPU-") || e.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        if !looks_uuid {
            return Entry::Fail(Unresolved::Form(e.to_string()));
        }
        let Some(uuids) = &self.uuids else {
            return Entry::Fail(Unresolved::NoNvml(e.to_string()));
        };
        let want = e.strip_prefix("GPU-").unwrap_or(e).to_ascii_lowercase();
        let hits: Vec<u32> = among
            .iter()
            .copied()
            .filter(|&g| uuids.get(g as usize).is_some_and(|u| u.strip_prefix("GPU-").unwrap_or(u).to_ascii_lowercase().starts_with(&want)))
            .collect();
        if hits.len() == 1 {
            Entry::Gpu(hits[0])
        } else {
            Entry::Stop
        }
    }

    fn all(&self, fallback_count: u32) -> Vec<u32> {
        match &self.uuids {
            Some(u) => (0..u.len() as u32).collect(),
            None => (0..fallback_count).collect(),
        }
    }

    /// The node GPUs a process with `env` sees, in its ordinal order.
    pub fn visible(&self, env: &VisibleEnv) -> Result<Vec<u32>, Unresolved> {
        // Without NVML the node's size is unknown: indices are taken as they are written.
        let unbounded = 1024;
        let base: Vec<u32> = match env.nvidia.as_deref().map(str::trim) {
            None | Some("all") => self.all(unbounded),
            Some("none") | Some("void") | Some("") => Vec::new(),
            Some(v) => {
                let all = self.all(unbounded);
                let mut out = Vec::new();
                for e in v.split(',') {
                    match self.entry(e, &all, false) {
                        Entry::Gpu(g) if !out.contains(&g) => out.push(g),
                        Entry::Gpu(_) => {}
                        Entry::Stop => return Err(Unresolved::Form(v.to_string())),
                        Entry::Fail(u) => return Err(u),
                    }
                }
                // The container sees its GPUs in the node's order.
                out.sort_unstable();
                out
            }
        };
        let Some(cuda) = env.cuda.as_deref() else { return Ok(base) };
        let mut out = Vec::new();
        for e in cuda.split(',') {
            match self.entry(e, &base, true) {
                Entry::Gpu(g) if !out.contains(&g) => out.push(g),
                Entry::Gpu(_) | Entry::Stop => break,
                Entry::Fail(u) => {
                    if out.is_empty() {
                        return Err(u);
                    }
                    break;
                }
            }
        }
        Ok(out)
    }

    /// The node GPU whose UUID is these 16 bytes (a `CUuuid` as `cuDeviceGetUuid` writes it),
    /// `None` when NVML is absent or lists no such GPU (a MIG instance's UUID, for one).
    pub fn by_driver_uuid(&self, bytes: &[u8; 16]) -> Option<NodeGpu> {
        let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let uuids = self.uuids.as_ref()?;
        let i = uuids.iter().position(|u| uuid_hex(u).as_deref() == Some(want.as_str()))?;
        Some(NodeGpu { index: i as u32, uuid: Some(uuids[i].clone()) })
    }

    /// The node GPU of CUDA ordinal `ordinal` for a process with `env`.
    pub fn resolve(&self, env: &VisibleEnv, ordinal: i16) -> Result<NodeGpu, Unresolved> {
        let seen = self.visible(env)?;
        let at = usize::try_from(ordinal).ok().and_then(|o| seen.get(o).copied());
        let Some(index) = at else {
            return Err(Unresolved::Beyond { ordinal, visible: seen.len() });
        };
        if self.uuids.as_ref().is_some_and(|u| index as usize >= u.len()) {
            return Err(Unresolved::Beyond { ordinal, visible: seen.len() });
        }
        Ok(NodeGpu { index, uuid: self.uuids.as_ref().and_then(|u| u.get(index as usize).cloned()) })
    }
}

/// The 32 hex digits of a UUID as NVML prints it (`GPU-…` or `MIG-…`, dashes anywhere),
/// lowercase; `None` when it is not 16 bytes of hex.
pub fn uuid_hex(s: &str) -> Option<String> {
    let body = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("MIG-")).unwrap_or(s);
    let hex: String = body.chars().filter(|&c| c != '-').map(|c| c.to_ascii_lowercase()).collect();
    (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// The 16 bytes of a UUID as NVML prints it (the inverse of `cuDeviceGetUuid`'s bytes).
pub fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let hex = uuid_hex(s)?;
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A `DeviceUuid` event's 16 bytes (`addr` then `size`, big-endian).
pub fn event_uuid(e: &crate::event::Event) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&e.addr.to_be_bytes());
    out[8..].copy_from_slice(&e.size.to_be_bytes());
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(n: usize) -> NodeGpus {
        NodeGpus { uuids: Some((0..n).map(|i| format!("GPU-{i:08x}-1111-2222-3333-44445555666{i}")).collect()) }
    }

    fn env(nvidia: Option<&str>, cuda: Option<&str>) -> VisibleEnv {
        VisibleEnv { nvidia: nvidia.map(str::to_string), cuda: cuda.map(str::to_string) }
    }

    fn idx(g: &NodeGpus, e: &VisibleEnv, o: i16) -> Result<u32, Unresolved> {
        g.resolve(e, o).map(|g| g.index)
    }

    #[test]
    fn cuda_visible_devices_remaps_ordinals() {
        let g = node(4);
        assert_eq!(idx(&g, &env(None, None), 0), Ok(0));
        assert_eq!(idx(&g, &env(None, Some("2")), 0), Ok(2));
        assert_eq!(idx(&g, &env(None, Some("3")), 0), Ok(3));
        assert_eq!(idx(&g, &env(None, Some("3,1")), 1), Ok(1));
        assert_eq!(g.resolve(&env(None, Some("2")), 0).unwrap().uuid.as_deref(), Some("GPU-00000002-1111-2222-3333-444455556662"));
        assert_eq!(idx(&g, &env(None, Some("GPU-00000003")), 0), Ok(3), "a UUID prefix");
        assert_eq!(idx(&g, &env(None, Some("00000001-1111")), 0), Ok(1), "GPU- is optional");
        assert_eq!(
            idx(&g, &env(None, Some("2,9,1")), 1),
            Err(Unresolved::Beyond { ordinal: 1, visible: 1 }),
            "the list ends at a device that does not exist"
        );
    }

    #[test]
    fn the_container_toolkit_narrows_first() {
        let g = node(4);
        // The device plugin gave the container GPUs 3 and 1: inside, ordinal 0 is GPU 1.
        assert_eq!(idx(&g, &env(Some("GPU-00000003,GPU-00000001"), None), 0), Ok(1));
        assert_eq!(idx(&g, &env(Some("3,1"), None), 1), Ok(3));
        // CUDA_VISIBLE_DEVICES indexes what the container sees.
        assert_eq!(idx(&g, &env(Some("2,3"), Some("1")), 0), Ok(3));
        assert_eq!(idx(&g, &env(Some("all"), Some("2")), 0), Ok(2));
        assert!(matches!(idx(&g, &env(Some("none"), None), 0), Err(Unresolved::Beyond { .. })));
        assert!(matches!(idx(&g, &env(Some("/var/run/nvidia-container-devices"), None), 0), Err(Unresolved::Form(_))));
    }

    #[test]
    fn a_driver_uuid_names_its_gpu_and_nothing_else() {
        let g = node(4);
        let u = uuid_bytes("GPU-00000003-1111-2222-3333-444455556663").unwrap();
        assert_eq!(g.by_driver_uuid(&u).map(|g| g.index), Some(3));
        let e = crate::event::Event {
            addr: u64::from_be_bytes(u[..8].try_into().unwrap()),
            size: u64::from_be_bytes(u[8..].try_into().unwrap()),
            ..Default::default()
        };
        assert_eq!(event_uuid(&e), u);
        assert_eq!(g.by_driver_uuid(&[0xab; 16]), None, "no GPU has it (a MIG instance's, say)");
        assert_eq!(NodeGpus { uuids: None }.by_driver_uuid(&u), None);
        assert_eq!(uuid_bytes("GPU-0000"), None);
        assert_eq!(uuid_hex("MIG-00000003-1111-2222-3333-444455556663").as_deref(), Some("00000003111122223333444455556663"));
    }

    #[test]
    fn mig_and_missing_nvml_are_unresolved_not_guessed() {
        let g = node(2);
        assert!(matches!(idx(&g, &env(None, Some("MIG-4b5c6d7e-0000-1111-2222-333344445555")), 0), Err(Unresolved::Mig(_))));
        let blind = NodeGpus { uuids: None };
        assert_eq!(idx(&blind, &env(None, Some("2")), 0), Ok(2), "an index needs no NVML");
        assert!(matches!(idx(&blind, &env(None, Some("GPU-00000002")), 0), Err(Unresolved::NoNvml(_))));
        assert_eq!(blind.resolve(&env(None, Some("3")), 0).unwrap().uuid, None);
    }
}
