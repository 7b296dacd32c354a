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
//! A MIG instance (`MIG-…`, in either variable: a unique prefix of a UUID NVML lists for an
//! instance, [`super::mig`]) is a node device of its own, numbered after the GPUs; a GPU in MIG
//! mode reached by index is reached through its first instance, as CUDA does.
//!
//! Ordinal N is then the Nth GPU left, in PCI order (NVML's): right when the process runs with
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID` or its GPUs are alike; the driver's default order
//! (`FASTEST_FIRST`) may differ on a machine of unlike GPUs, and a program may set either variable
//! itself before its first CUDA call. That is why this is the fallback only: the driver's own word
//! ([`NodeGpus::by_driver_uuid`], the UUID the process's driver gives for the ordinal, which the
//! shim asks and the eBPF path reads from NVML's process list) comes first.
//!
//! What cannot be resolved is said, not guessed: a MIG UUID NVML lists no instance for (or an
//! NVML without MIG support; the old `MIG-GPU-<uuid>/<gi>/<ci>` form), a UUID without NVML to
//! look it up, an ordinal past the end, a value in a form not listed here (the toolkit's
//! `/var/run/nvidia-container-devices` volume strategy, CDI names).

use super::mig::MigInstance;

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
    /// The MIG instances NVML lists (node device `uuids.len() + k` is instance k).
    pub migs: Vec<MigInstance>,
    /// Why the MIG instances could not all be read (NVML without MIG support, its errors).
    pub mig_problems: Vec<String>,
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
    /// A MIG UUID that names no instance NVML lists (why, when NVML said).
    Mig(String, Option<String>),
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
            Unresolved::Mig(e, None) => write!(f, "MIG instance {e}: NVML lists no such instance; its memory and limit are unknown"),
            Unresolved::Mig(e, Some(why)) => {
                write!(f, "MIG instance {e}: NVML lists no such instance ({why}); its memory and limit are unknown")
            }
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
        if let Some(rest) = e.strip_prefix("MIG-") {
            let want = rest.to_ascii_lowercase();
            let n = self.gpu_count();
            let new_form = !rest.is_empty() && !rest.starts_with("GPU-");
            let hits: Vec<u32> = (0..self.migs.len() as u32)
                .filter(|_| new_form)
                .filter(|&k| {
                    let m = &self.migs[k as usize];
                    m.uuid.strip_prefix("MIG-").unwrap_or(&m.uuid).to_ascii_lowercase().starts_with(&want)
                        && (among.contains(&(n + k)) || among.contains(&m.parent))
                })
                .map(|k| n + k)
                .collect();
            return match hits.as_slice() {
                [one] => Entry::Gpu(*one),
                _ => Entry::Fail(Unresolved::Mig(e.to_string(), self.mig_problems.first().cloned())),
            };
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

    /// How many GPUs NVML counts (the first MIG instance's node index).
    pub fn gpu_count(&self) -> u32 {
        self.uuids.as_ref().map_or(0, |u| u.len() as u32)
    }

    /// The MIG instance node device `index` is, if it is one.
    pub fn mig(&self, index: u32) -> Option<&MigInstance> {
        index.checked_sub(self.gpu_count()).and_then(|k| self.migs.get(k as usize))
    }

    /// The UUID of node device `index` (a GPU's or a MIG instance's), when NVML gave it.
    pub fn uuid(&self, index: u32) -> Option<&str> {
        match self.mig(index) {
            Some(m) => Some(m.uuid.as_str()),
            None => self.uuids.as_ref()?.get(index as usize).map(String::as_str),
        }
    }

    /// The device CUDA reaches node device `index` through: a GPU in MIG mode, its first instance.
    fn through(&self, index: u32) -> u32 {
        let n = self.gpu_count();
        if index >= n {
            return index;
        }
        self.migs.iter().position(|m| m.parent == index).map_or(index, |k| n + k as u32)
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

    /// The node device whose UUID is these 16 bytes (a `CUuuid` as `cuDeviceGetUuid` writes it:
    /// a GPU's, or on a MIG instance the instance's), `None` when NVML is absent or lists no such
    /// GPU or instance.
    pub fn by_driver_uuid(&self, bytes: &[u8; 16]) -> Option<NodeGpu> {
        let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let uuids = self.uuids.as_ref()?;
        if let Some(i) = uuids.iter().position(|u| uuid_hex(u).as_deref() == Some(want.as_str())) {
            return Some(NodeGpu { index: i as u32, uuid: Some(uuids[i].clone()) });
        }
        let k = self.migs.iter().position(|m| uuid_hex(&m.uuid).as_deref() == Some(want.as_str()))?;
        Some(NodeGpu { index: self.gpu_count() + k as u32, uuid: Some(self.migs[k].uuid.clone()) })
    }

    /// The node GPU of CUDA ordinal `ordinal` for a process with `env`.
    pub fn resolve(&self, env: &VisibleEnv, ordinal: i16) -> Result<NodeGpu, Unresolved> {
        let seen = self.visible(env)?;
        let at = usize::try_from(ordinal).ok().and_then(|o| seen.get(o).copied());
        let Some(index) = at else {
            return Err(Unresolved::Beyond { ordinal, visible: seen.len() });
        };
        if self.uuids.as_ref().is_some_and(|u| index as usize >= u.len() + self.migs.len()) {
            return Err(Unresolved::Beyond { ordinal, visible: seen.len() });
        }
        let index = self.through(index);
        Ok(NodeGpu { index, uuid: self.uuid(index).map(str::to_string) })
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
        NodeGpus { uuids: Some((0..n).map(|i| format!("GPU-{i:08x}-1111-2222-3333-44445555666{i}")).collect()), ..NodeGpus::default() }
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
        assert_eq!(NodeGpus::default().by_driver_uuid(&u), None);
        assert_eq!(uuid_bytes("GPU-0000"), None);
        assert_eq!(uuid_hex("MIG-00000003-1111-2222-3333-444455556663").as_deref(), Some("00000003111122223333444455556663"));
    }

    #[test]
    fn mig_and_missing_nvml_are_unresolved_not_guessed() {
        let g = node(2);
        assert!(matches!(idx(&g, &env(None, Some("MIG-4b5c6d7e-0000-1111-2222-333344445555")), 0), Err(Unresolved::Mig(_, None))));
        let blind = NodeGpus::default();
        assert_eq!(idx(&blind, &env(None, Some("2")), 0), Ok(2), "an index needs no NVML");
        assert!(matches!(idx(&blind, &env(None, Some("GPU-00000002")), 0), Err(Unresolved::NoNvml(_))));
        assert_eq!(blind.resolve(&env(None, Some("3")), 0).unwrap().uuid, None);
    }

    fn with_migs() -> NodeGpus {
        let mut g = node(2);
        g.migs = vec![
            MigInstance { uuid: "MIG-aaaaaaaa-0000-4000-8000-000000000001".into(), parent: 1, mig_index: 0, total: Some(4 << 30) },
            MigInstance { uuid: "MIG-bbbbbbbb-0000-4000-8000-000000000002".into(), parent: 1, mig_index: 2, total: Some(2 << 30) },
        ];
        g
    }

    #[test]
    fn a_mig_instance_is_a_node_device_of_its_own() {
        let g = with_migs();
        assert_eq!(idx(&g, &env(None, Some("MIG-bbbbbbbb-0000-4000-8000-000000000002")), 0), Ok(3), "GPUs 0, 1, then the instances");
        assert_eq!(idx(&g, &env(None, Some("MIG-aaaa")), 0), Ok(2), "a unique prefix");
        assert_eq!(idx(&g, &env(None, Some("1")), 0), Ok(2), "GPU 1 in MIG mode is reached through its first instance");
        assert_eq!(idx(&g, &env(None, Some("0")), 0), Ok(0));
        assert_eq!(idx(&g, &env(Some("MIG-bbbbbbbb-0000-4000-8000-000000000002"), None), 0), Ok(3), "the device plugin's MIG strategy");
        assert_eq!(idx(&g, &env(Some("0"), Some("MIG-bbbbbbbb")), 0).ok(), None, "an instance of a GPU the container does not have");
        assert_eq!(g.uuid(3), Some("MIG-bbbbbbbb-0000-4000-8000-000000000002"));
        assert_eq!(g.mig(3).map(|m| m.parent), Some(1));
        assert_eq!(g.mig(1), None);
        let u = uuid_bytes("MIG-aaaaaaaa-0000-4000-8000-000000000001").unwrap();
        assert_eq!(g.by_driver_uuid(&u).map(|d| d.index), Some(2), "the driver's MIG UUID names the instance");
    }

    #[test]
    fn a_mig_uuid_with_no_instance_is_unresolved_with_why() {
        let mut g = with_migs();
        assert!(matches!(idx(&g, &env(None, Some("MIG-cccc")), 0), Err(Unresolved::Mig(_, None))));
        assert!(matches!(idx(&g, &env(None, Some("MIG-GPU-00000001-1111/1/0")), 0), Err(Unresolved::Mig(_, None))), "the old form");
        g.migs.clear();
        g.mig_problems.push("GPU 1: nvmlDeviceGetMigMode: this NVML has no MIG support (no nvmlDeviceGetMigMode)".into());
        let why = idx(&g, &env(None, Some("MIG-aaaaaaaa")), 0).unwrap_err().to_string();
        assert!(why.contains("no MIG support") && why.contains("limit are unknown"), "{why}");
    }
}
