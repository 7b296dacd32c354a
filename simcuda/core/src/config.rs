//! The simulated machine, read from the environment: how many devices, how much memory each has,
//! the driver's reserve, the allocation slack, and where the shared state file lives. Every
//! process sharing one `SIMCUDA_STATE_DIR` must see the same values (the file shares usage, not
//! configuration).

use std::path::PathBuf;

/// Physical page size and VMM granularity of the simulated device (the H200's).
pub const GRANULARITY: u64 = 2 << 20;
/// The most devices `SIMCUDA_DEVICES` may ask for.
pub const MAX_DEVICES: u32 = 16;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What the stand-ins simulate, from `SIMCUDA_*` variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `SIMCUDA_DEVICES` (default 1, at most [`MAX_DEVICES`]).
    pub devices: u32,
    /// `SIMCUDA_MEM` (default 16 GiB): each device's physical memory, what NVML reports as total.
    pub total: u64,
    /// `SIMCUDA_RESERVE` (default 615 MiB, the H200's): memory the driver keeps for itself;
    /// `cuMemGetInfo` total = total − reserve, NVML v2 reports it as `reserved`.
    pub reserve: u64,
    /// `SIMCUDA_SLACK` (default 4 MiB): a request for new pages succeeds only while it leaves
    /// this much free, so the largest request that succeeds is `free − slack` (measured on the H200).
    pub slack: u64,
    /// `SIMCUDA_STATE_DIR` (default `/tmp/simcuda-$UID`): holds the state file shared by processes.
    pub state_dir: PathBuf,
    /// The memory domains this process sees, in ordinal order: every GPU in the driver's
    /// enumeration order (a GPU in MIG mode through its first instance), or what
    /// `CUDA_VISIBLE_DEVICES` lists (see [`visible_domains`]). The driver's ordinal N is domain
    /// `visible[N]` (a GPU `< devices`, else a MIG instance: `crate::mig`); NVML ignores the
    /// variable and always lists every GPU in PCI order (physical index order), as the real one does.
    pub visible: Vec<u32>,
    /// `SIMCUDA_FASTEST_FIRST` (a permutation of the physical indices, `3,1,0,2`): the order in
    /// which the driver enumerates devices when `CUDA_DEVICE_ORDER` is unset or `FASTEST_FIRST`,
    /// as a real machine with unlike GPUs does; NVML keeps PCI order. Unset: PCI order.
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes the driver use PCI order whatever this says.
    pub fastest_first: Option<Vec<u32>>,
    /// This process's own limit per physical device, from the sharing layers simcuda models:
    /// MPS's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`ORDINAL=SIZE,...`: the MPS server's limit on a
    /// client, as if a server served this process) and, when `LD_PRELOAD` names HAMi-core's
    /// `libvgpu.so`, its quota `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_MEMORY_LIMIT_N` (what
    /// that library enforces, and the total its `cuMemGetInfo` reports). The tightest applies.
    /// Without `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, the MPS control daemon's default as simcuda
    /// models it: where the pipe folder (`CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`)
    /// holds a `control` entry, the `ORDINAL=SIZE` lines of its `simcuda-mps-defaults` file
    /// (what the stand-in control client `simcuda/mps/nvidia-cuda-mps-control` answers).
    /// A value that does not parse sets no limit (and is said on stderr).
    pub own_limit: Vec<Option<u64>>,
    /// Whether `own_limit` comes from the quota preload (its `cuMemGetInfo` shows the quota).
    pub quota_preloaded: bool,
    /// `SIMCUDA_MIG` (`crate::mig`): the MIG instances the GPUs are split into; instance k is
    /// memory domain `devices + k`. A GPU with instances is in MIG mode.
    pub mig: Vec<crate::mig::MigInstance>,
}

/// The file of a pipe folder in which simcuda keeps its MPS daemon's default limits
/// (`ORDINAL=SIZE` lines; a `mode=hang` or `mode=garbage` line makes the stand-in control client
/// hang or answer what is no size).
pub const MPS_DEFAULTS_FILE: &str = "simcuda-mps-defaults";

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config, String> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the configuration through `get` (a stand-in for the environment, for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let size = |key: &str, default: u64| -> Result<u64, String> {
            match get(key) {
                None => Ok(default),
                Some(v) => parse_size(&v).map_err(|e| format!("{key}={v}: {e}")),
            }
        };
        let devices = match get("SIMCUDA_DEVICES") {
            None => 1,
            Some(v) => v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_DEVICES).contains(n))
                .ok_or_else(|| format!("SIMCUDA_DEVICES={v}: expected 1..={MAX_DEVICES}"))?,
        };
        let total = size("SIMCUDA_MEM", 16 * GIB)?;
        let reserve = size("SIMCUDA_RESERVE", 615 * MIB)?;
        let slack = size("SIMCUDA_SLACK", 4 * MIB)?;
        if total < GRANULARITY || reserve >= total {
            return Err(format!("SIMCUDA_MEM ({total} bytes) must be at least 2 MiB and above SIMCUDA_RESERVE ({reserve} bytes)"));
        }
        let mig = match get("SIMCUDA_MIG") {
            None => Vec::new(),
            Some(v) => crate::mig::parse(&v, devices, total - reserve).map_err(|e| format!("SIMCUDA_MIG={v}: {e}"))?,
        };
        let state_dir = match get("SIMCUDA_STATE_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => {
                // SAFETY: getuid has no preconditions and cannot fail.
                let uid = unsafe { libc::getuid() };
                std::env::temp_dir().join(format!("simcuda-{uid}"))
            }
        };
        let fastest_first = match get("SIMCUDA_FASTEST_FIRST") {
            None => None,
            Some(v) => Some(permutation(&v, devices).map_err(|e| format!("SIMCUDA_FASTEST_FIRST={v}: {e}"))?),
        };
        let pci = get("CUDA_DEVICE_ORDER").is_some_and(|o| o.trim() == "PCI_BUS_ID");
        let order: Vec<u32> = match (&fastest_first, pci) {
            (Some(p), false) => p.clone(),
            _ => (0..devices).collect(),
        };
        let visible = match get("CUDA_VISIBLE_DEVICES") {
            None => order.iter().map(|&g| first_domain(g, devices, &mig)).collect(),
            Some(v) => visible_domains(&v, &order, devices, &mig),
        };
        let mut own_limit = vec![None; (devices as usize) + mig.len()];
        let mut tighten = |ordinal: usize, v: &str, key: &str| match parse_size(v) {
            Ok(b) if b > 0 => {
                if let Some(&p) = visible.get(ordinal) {
                    let l = &mut own_limit[p as usize];
                    *l = Some(l.map_or(b, |x: u64| x.min(b)));
                }
            }
            _ => eprintln!("simcuda: {key}={v:?}: not a size, no limit set"),
        };
        let daemon_default = || {
            let dir = get("CUDA_MPS_PIPE_DIRECTORY").filter(|d| !d.is_empty()).unwrap_or_else(|| "/tmp/nvidia-mps".into());
            let dir = std::path::Path::new(&dir);
            if std::fs::symlink_metadata(dir.join("control")).is_err() {
                return None;
            }
            let text = std::fs::read_to_string(dir.join(MPS_DEFAULTS_FILE)).ok()?;
            let pairs: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| l.split_once('=').is_some_and(|(o, _)| o.parse::<usize>().is_ok()))
                .map(String::from)
                .collect();
            Some(pairs.join(","))
        };
        if let Some(v) = get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").or_else(daemon_default) {
            for pair in v.split(',').filter(|p| !p.trim().is_empty()) {
                match pair.split_once('=').and_then(|(o, s)| Some((o.trim().parse::<usize>().ok()?, s))) {
                    Some((o, s)) => tighten(o, s, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
                    None => eprintln!("simcuda: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v:?}: {pair:?} is not ORDINAL=SIZE"),
                }
            }
        }
        let quota_preloaded = get("LD_PRELOAD")
            .is_some_and(|p| p.split([':', ' ']).any(|f| f.rsplit('/').next().is_some_and(|b| b.starts_with("libvgpu.so"))));
        if quota_preloaded {
            for o in 0..visible.len() {
                let own = get(&format!("CUDA_DEVICE_MEMORY_LIMIT_{o}"));
                let key = if own.is_some() { format!("CUDA_DEVICE_MEMORY_LIMIT_{o}") } else { "CUDA_DEVICE_MEMORY_LIMIT".to_string() };
                if let Some(v) = own.or_else(|| get("CUDA_DEVICE_MEMORY_LIMIT")) {
                    tighten(o, &v, &key);
                }
            }
        }
        Ok(Config { devices, total, reserve, slack, state_dir, visible, fastest_first, own_limit, quota_preloaded, mig })
    }

    /// What `cuMemGetInfo` reports as total: the device less the driver's reserve.
    pub fn usable(&self) -> u64 {
        self.total - self.reserve
    }

    /// The most bytes all processes together may hold on one device (usable − slack).
    pub fn allocation_limit(&self) -> u64 {
        self.usable().saturating_sub(self.slack)
    }

    /// How many memory domains there are: the GPUs, then the MIG instances.
    pub fn domains(&self) -> u32 {
        self.devices + self.mig.len() as u32
    }

    /// The MIG instance that memory domain `d` is, if it is one.
    pub fn mig_of(&self, d: u32) -> Option<&crate::mig::MigInstance> {
        d.checked_sub(self.devices).and_then(|k| self.mig.get(k as usize))
    }

    /// The domains of GPU `gpu`'s MIG instances, in their index order (empty: not in MIG mode).
    pub fn instances_of(&self, gpu: u32) -> Vec<u32> {
        (0..self.mig.len() as u32).filter(|&k| self.mig[k as usize].parent == gpu).map(|k| self.devices + k).collect()
    }

    /// NVML's total of domain `d`: a GPU's `SIMCUDA_MEM`, an instance's own size.
    pub fn domain_total(&self, d: u32) -> u64 {
        self.mig_of(d).map_or(self.total, |m| m.size)
    }

    /// The driver's reserve on domain `d` (an instance has none of its own).
    pub fn domain_reserve(&self, d: u32) -> u64 {
        if self.mig_of(d).is_some() {
            0
        } else {
            self.reserve
        }
    }

    /// What `cuMemGetInfo` reports as total on domain `d`.
    pub fn domain_usable(&self, d: u32) -> u64 {
        self.domain_total(d) - self.domain_reserve(d)
    }

    /// The most bytes all processes together may hold on domain `d` (usable − slack).
    pub fn domain_allocation_limit(&self, d: u32) -> u64 {
        self.domain_usable(d).saturating_sub(self.slack)
    }

    /// The UUID bytes `cuDeviceGetUuid` gives for domain `d` (an instance's MIG UUID).
    pub fn domain_uuid(&self, d: u32) -> [u8; 16] {
        self.mig_of(d).map_or_else(|| crate::device_uuid(d), |m| crate::mig::uuid(m.parent, m.index))
    }

    /// Domain `d`'s UUID as NVML prints it.
    pub fn domain_uuid_string(&self, d: u32) -> String {
        self.mig_of(d).map_or_else(|| crate::device_uuid_string(d), |m| crate::mig::uuid_string(m.parent, m.index))
    }
}

/// The domain CUDA reaches GPU `gpu` through: the GPU itself, or, in MIG mode, its first instance.
fn first_domain(gpu: u32, devices: u32, mig: &[crate::mig::MigInstance]) -> u32 {
    mig.iter().position(|m| m.parent == gpu).map_or(gpu, |k| devices + k as u32)
}

/// [`visible_devices_in`] with MIG: an entry naming a GPU in MIG mode reaches its first instance,
/// and `MIG-<uuid>` (or a unique prefix of it) names an instance. The old form
/// `MIG-GPU-<uuid>/<gi>/<ci>` is not modelled (the list ends there, as at any unknown entry).
pub fn visible_domains(value: &str, order: &[u32], devices: u32, mig: &[crate::mig::MigInstance]) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in value.split(',') {
        let e = entry.trim();
        let found = match e.strip_prefix("MIG-") {
            Some(rest) if !rest.is_empty() && !rest.starts_with("GPU-") => {
                let want = rest.to_ascii_lowercase();
                let hits: Vec<u32> = (0..mig.len())
                    .filter(|&k| crate::mig::uuid_string(mig[k].parent, mig[k].index)["MIG-".len()..].starts_with(&want))
                    .map(|k| devices + k as u32)
                    .collect();
                (hits.len() == 1).then(|| hits[0])
            }
            Some(_) => None,
            None => visible_devices_in(e, order).first().map(|&g| first_domain(g, devices, mig)),
        };
        match found {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

/// The physical devices a `CUDA_VISIBLE_DEVICES` value makes visible, in order, the way the CUDA
/// driver reads it: comma-separated entries, each a device index (`2`) or a UUID as NVML prints
/// it (`GPU-5ec1...`, or any unique prefix of it, `GPU-` optional). The list ends at the first
/// entry that names no device, names one twice, or is a form this reader does not take (a MIG
/// instance, `MIG-...`: [`visible_domains`] takes those); an empty value hides every device.
pub fn visible_devices(value: &str, devices: u32) -> Vec<u32> {
    visible_devices_in(value, &(0..devices).collect::<Vec<u32>>())
}

/// [`visible_devices`] where the driver enumerates the physical devices in `order`: an index
/// entry is a position in that order (a UUID names its device wherever it is).
pub fn visible_devices_in(value: &str, order: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in value.split(',') {
        let e = entry.trim();
        let found = if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
            e.parse::<usize>().ok().and_then(|i| order.get(i).copied())
        } else if e.is_empty() || e.starts_with("MIG-") {
            None
        } else {
            let want = e.strip_prefix("GPU-").unwrap_or(e).to_ascii_lowercase();
            let matches: Vec<u32> =
                order.iter().copied().filter(|&i| crate::device_uuid_string(i)["GPU-".len()..].starts_with(&want)).collect();
            (matches.len() == 1).then(|| matches[0])
        };
        match found {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

/// A comma-separated permutation of `0..devices`.
fn permutation(v: &str, devices: u32) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for e in v.split(',') {
        let i: u32 = e.trim().parse().map_err(|_| format!("{:?} is not a device index", e.trim()))?;
        if i >= devices || out.contains(&i) {
            return Err(format!("expected each of 0..{devices} once"));
        }
        out.push(i);
    }
    if out.len() != devices as usize {
        return Err(format!("expected each of 0..{devices} once"));
    }
    Ok(out)
}

/// `SIMCUDA_UTILIZATION`: what NVML's `nvmlDeviceGetUtilizationRates` reports, as
/// `GPU:MEM` percentages, one pair per GPU in index order separated by `,` (`37:12,80:40`), or
/// one pair for every GPU. simcuda runs no kernels, so it has no utilization of its own: unset,
/// NVML answers `NVML_ERROR_NOT_SUPPORTED`. Returns the pair of each of `devices` GPUs.
pub fn parse_utilization(value: &str, devices: u32) -> Result<Vec<(u32, u32)>, String> {
    let pairs: Vec<(u32, u32)> = value
        .split(',')
        .map(|p| {
            let (g, m) = p.split_once(':').ok_or_else(|| format!("{p:?} is not GPU:MEM"))?;
            let pct =
                |v: &str| v.trim().parse::<u32>().ok().filter(|v| *v <= 100).ok_or_else(|| format!("{v:?} is not a percentage 0-100"));
            Ok((pct(g)?, pct(m)?))
        })
        .collect::<Result<_, String>>()?;
    match pairs.len() {
        1 => Ok(vec![pairs[0]; devices as usize]),
        n if n == devices as usize => Ok(pairs),
        n => Err(format!("{n} pairs for {devices} GPU(s): give one, or one per GPU")),
    }
}

/// Parses `12GiB`, `615 MiB`, `1.5G`, `4096`, `2MB` (decimal), `512KiB` into bytes. A bare
/// letter (`K`, `M`, `G`, `T`) and the `i` forms are binary; `KB`, `MB`, `GB`, `TB` are decimal.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return Err("no number".to_string());
    }
    let digits = |d: &str| -> Result<u128, String> {
        if d.is_empty() {
            Ok(0)
        } else {
            d.parse::<u128>().map_err(|e| e.to_string())
        }
    };
    if frac.len() > 18 {
        return Err("too many decimals".to_string());
    }
    let scale = 10u128.pow(frac.len() as u32);
    let frac_bytes = digits(frac)? * mult / scale;
    let bytes = digits(int)?.checked_mul(mult).and_then(|b| b.checked_add(frac_bytes)).ok_or("too large")?;
    u64::try_from(bytes).map_err(|_| "too large".to_string())
}

#[cfg(test)]
mod utilization_tests {
    use super::parse_utilization;

    #[test]
    fn one_pair_for_all_or_one_per_gpu() {
        assert_eq!(parse_utilization("37:12", 2), Ok(vec![(37, 12), (37, 12)]));
        assert_eq!(parse_utilization("37:12, 80:40", 2), Ok(vec![(37, 12), (80, 40)]));
        assert!(parse_utilization("37:12,80:40", 3).is_err());
        assert!(parse_utilization("101:0", 1).is_err());
        assert!(parse_utilization("37", 1).is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("12GiB"), Ok(12 << 30));
        assert_eq!(parse_size("615 MiB"), Ok(615 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn visible_devices_follow_cudas_rules() {
        assert_eq!(visible_devices("2", 4), vec![2]);
        assert_eq!(visible_devices("3,1", 4), vec![3, 1]);
        assert_eq!(visible_devices(" 1 , 0 ", 4), vec![1, 0]);
        assert_eq!(visible_devices("1,7,2", 4), vec![1], "the list ends at the first device that does not exist");
        assert_eq!(visible_devices("1,1", 4), vec![1]);
        assert_eq!(visible_devices("", 4), Vec::<u32>::new());
        assert_eq!(visible_devices("-1", 4), Vec::<u32>::new());
        let uuid = crate::device_uuid_string(3);
        assert_eq!(visible_devices(&uuid, 4), vec![3]);
        assert_eq!(visible_devices(&uuid[..12], 4), vec![3], "a unique prefix names the device");
        assert_eq!(visible_devices(&uuid["GPU-".len()..], 4), vec![3], "GPU- is optional");
        assert_eq!(visible_devices(&format!("MIG-{}", &uuid[4..]), 4), Vec::<u32>::new());
    }

    #[test]
    fn mig_instances_are_domains_of_their_own() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            Config::from_lookup(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).expect("valid")
        };
        let c = env(&[("SIMCUDA_DEVICES", "2"), ("SIMCUDA_MIG", "1:4GiB+2GiB")]);
        assert_eq!(c.domains(), 4);
        assert_eq!(c.visible, vec![0, 2], "GPU 1 in MIG mode is reached through its first instance");
        assert_eq!((c.domain_total(2), c.domain_usable(2), c.domain_total(3)), (4 << 30, 4 << 30, 2 << 30));
        assert_eq!(c.domain_usable(0), (16 << 30) - (615 << 20));
        assert_eq!(c.instances_of(1), vec![2, 3]);
        let second = crate::mig::uuid_string(1, 1);
        let v = visible_domains(&second, &[0, 1], 2, &c.mig);
        assert_eq!(v, vec![3], "a MIG UUID names its instance");
        assert_eq!(visible_domains(&second[..12], &[0, 1], 2, &c.mig), vec![3], "a unique prefix");
        assert_eq!(visible_domains(&format!("{second},0"), &[0, 1], 2, &c.mig), vec![3, 0]);
        assert_eq!(visible_domains("MIG-00000000-dead-beef-0000-000000000000", &[0, 1], 2, &c.mig), Vec::<u32>::new(), "no such instance");
        assert_eq!(visible_domains(&format!("MIG-{}/1/0", crate::device_uuid_string(1)), &[0, 1], 2, &c.mig), Vec::<u32>::new());
        assert_eq!(c.domain_uuid_string(3), second);
        assert!(Config::from_lookup(|k| (k == "SIMCUDA_MIG").then(|| "0:20GiB".to_string())).is_err(), "does not fit");
    }

    #[test]
    fn the_driver_enumerates_fastest_first_unless_told_pci_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            Config::from_lookup(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).expect("valid")
        };
        let c = env(&[("SIMCUDA_DEVICES", "4"), ("SIMCUDA_FASTEST_FIRST", "3,1,0,2")]);
        assert_eq!(c.visible, vec![3, 1, 0, 2]);
        let c = env(&[("SIMCUDA_DEVICES", "4"), ("SIMCUDA_FASTEST_FIRST", "3,1,0,2"), ("CUDA_VISIBLE_DEVICES", "1")]);
        assert_eq!(c.visible, vec![1], "an index counts in the driver's order");
        let c = env(&[("SIMCUDA_DEVICES", "4"), ("SIMCUDA_FASTEST_FIRST", "3,1,0,2"), ("CUDA_VISIBLE_DEVICES", "0")]);
        assert_eq!(c.visible, vec![3]);
        let c = env(&[
            ("SIMCUDA_DEVICES", "4"),
            ("SIMCUDA_FASTEST_FIRST", "3,1,0,2"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("CUDA_VISIBLE_DEVICES", "0"),
        ]);
        assert_eq!(c.visible, vec![0], "PCI_BUS_ID: NVML's order");
        for bad in ["3,1,0", "3,1,1,0", "0,1,2,4", "a,b,c,d"] {
            let r = Config::from_lookup(|k| match k {
                "SIMCUDA_DEVICES" => Some("4".to_string()),
                "SIMCUDA_FASTEST_FIRST" => Some(bad.to_string()),
                _ => None,
            });
            assert!(r.is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_and_errors() {
        let c = Config::from_lookup(|_| None).expect("defaults are valid");
        assert_eq!((c.devices, c.total, c.reserve, c.slack), (1, 16 << 30, 615 << 20, 4 << 20));
        let bad = Config::from_lookup(|k| (k == "SIMCUDA_DEVICES").then(|| "0".to_string()));
        assert!(bad.is_err());
        let bad = Config::from_lookup(|k| (k == "SIMCUDA_MEM").then(|| "512MiB".to_string()));
        assert!(bad.is_err(), "reserve above total");
    }
}
