//! Sharing layers as limits: a GPU shared through MPS or a preload quota fails a process at a
//! limit below the device's memory, and an OOM there is that layer's, not the device's. The
//! limits are read from the process's environment when it is first seen:
//!
//! - **MPS**: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `ORDINAL=SIZE` pairs separated by commas
//!   (`0=4G,1=512M`), the limit the MPS server puts on the client's device memory per CUDA
//!   ordinal. Sizes as the MPS documentation writes them (`G`, `M`, `K`, optionally with `B`), taken as
//!   binary units. Where the environment sets none, the MPS control daemon's own default
//!   (`set_default_device_pinned_mem_limit`) is asked of its control client by
//!   `crate::attribution::mps` and added beside these.
//! - **Preload quotas**: HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT` (every device) and
//!   `CUDA_DEVICE_MEMORY_LIMIT_N` (ordinal N, over the former), sizes as HAMi-core reads them
//!   (a number with `k`, `m`, `g` in either case, else bytes). The quota library is named from
//!   `LD_PRELOAD` (HAMi-core is `libvgpu.so`); a quota variable without a preload that could
//!   enforce it is still read, and the library is said to be unknown.
//!
//! - **MIG**: a MIG instance is a device of its own, placed by its `MIG-…` UUID
//!   (`crate::attribution::gpu`, `crate::attribution::mig`); its memory (NVML's total on its
//!   handle) is the limit of every process on it ([`Limit::mig`]). Unlike the two above it is
//!   shared by the instance's processes: an OOM there is judged with what the instance held
//!   (its memory less the free bytes the driver reported at the failure), not with the
//!   process's bytes alone ([`LimitHit::judge_oom`]).
//!
//! A value that does not parse is a counted note and no limit (never a guessed one); a MIG UUID
//! with no instance NVML lists is a counted note too, and no limit.

use crate::units::human_bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A sharing layer that limits a process's device memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    /// `mps`, `quota` or `mig`.
    pub layer: String,
    /// The variable that set it (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT_0`);
    /// for MIG, the instance's UUID (`MIG-…`).
    pub variable: String,
    /// For a quota: the library enforcing it (`HAMi-core (libvgpu.so)`, the preload's file
    /// name, or `unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    /// The limit, bytes.
    pub bytes: u64,
    /// For MIG: the UUID of the GPU the instance is a slice of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl Limit {
    /// The limit of MIG instance `uuid` of GPU `parent`, whose memory is `bytes`.
    pub fn mig(uuid: &str, parent: &str, bytes: u64) -> Limit {
        Limit { layer: "mig".into(), variable: uuid.into(), library: None, bytes, parent: Some(parent.into()) }
    }

    /// `the MPS pinned memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) of 4.00 GiB`;
    /// `the MIG instance MIG-… (4.00 GiB of GPU-…)`.
    pub fn name(&self) -> String {
        match self.layer.as_str() {
            "mps" => format!("the MPS pinned memory limit ({}) of {}", self.variable, human_bytes(self.bytes)),
            "mig" => format!(
                "the MIG instance {} ({} of {})",
                self.variable,
                human_bytes(self.bytes),
                self.parent.as_deref().unwrap_or("its GPU")
            ),
            _ => format!(
                "the quota of {} ({} through {})",
                human_bytes(self.bytes),
                self.variable,
                self.library.as_deref().unwrap_or("an unknown preload")
            ),
        }
    }
}

/// An OOM judged against its process's limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitHit {
    /// The limit.
    pub limit: Limit,
    /// What the process held on the device when it asked (its traced reserved bytes).
    pub used: u64,
    /// The request.
    pub requested: u64,
    /// `used + requested − limit` when positive: the request passed the limit by this much;
    /// 0 when it did not (the limit was not what refused it).
    pub over: u64,
}

impl LimitHit {
    /// Judges a request of `requested` bytes by a process holding `used` against `limit`.
    pub fn judge(limit: &Limit, used: u64, requested: u64) -> LimitHit {
        LimitHit { limit: limit.clone(), used, requested, over: used.saturating_add(requested).saturating_sub(limit.bytes) }
    }

    /// Judges an OOM: a request of `requested` bytes by a process holding `reserved` (its traced
    /// bytes), with `device_free` the free bytes the driver reported at the failure. A per-process
    /// layer (MPS, a quota) counts the process's bytes; a MIG instance, shared by its processes,
    /// counts what it held: its memory less the free bytes (at least the process's own), or the
    /// process's bytes when the free bytes are unknown.
    pub fn judge_oom(limit: &Limit, reserved: u64, device_free: Option<u64>, requested: u64) -> LimitHit {
        let used = match (limit.layer.as_str(), device_free) {
            ("mig", Some(free)) => limit.bytes.saturating_sub(free).max(reserved),
            _ => reserved,
        };
        LimitHit::judge(limit, used, requested)
    }

    /// Whether the request passed the limit.
    pub fn hit(&self) -> bool {
        self.over > 0
    }

    /// The explanation of an OOM at the limit.
    pub fn explanation(&self) -> String {
        if self.limit.layer == "mig" {
            return format!(
                "the request passed {}: the instance's processes held {} and this one asked {}, {} over the limit; the instance's own memory was the limit, not the whole GPU's",
                self.limit.name(),
                human_bytes(self.used),
                human_bytes(self.requested),
                human_bytes(self.over)
            );
        }
        format!(
            "the request passed {}: the process held {} and asked {}, {} over the limit; the device itself was not the limit",
            self.limit.name(),
            human_bytes(self.used),
            human_bytes(self.requested),
            human_bytes(self.over)
        )
    }

    /// The fix of an OOM at the limit.
    pub fn fix(&self) -> String {
        match self.limit.layer.as_str() {
            "mps" => format!(
                "raise {} for this client (it needs at least {}), or need less: a smaller batch or sequence, activation checkpointing",
                self.limit.variable,
                human_bytes(self.used.saturating_add(self.requested))
            ),
            "mig" => format!(
                "run on a larger MIG instance (a profile with at least {} of memory, or the whole GPU {}), or need less: a smaller batch or sequence, activation checkpointing",
                human_bytes(self.used.saturating_add(self.requested)),
                self.limit.parent.as_deref().unwrap_or("it is a slice of")
            ),
            _ => format!(
                "ask for a larger GPU memory share (the quota behind {}; it needs at least {}), or need less: a smaller batch or sequence, activation checkpointing",
                self.limit.variable,
                human_bytes(self.used.saturating_add(self.requested))
            ),
        }
    }
}

/// The limits of one process, by CUDA ordinal (`None`: every ordinal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Limits by ordinal; an ordinal's own limit and the all-devices one are both kept.
    pub by_ordinal: BTreeMap<Option<i16>, Vec<Limit>>,
    /// Values that could not be read (one line each, naming the variable and the value).
    pub bad: Vec<String>,
}

/// Parses `4G`, `512M`, `1024MB`, `4096` (bytes), as the MPS documentation writes sizes.
pub(crate) fn mps_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    let m: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        "T" | "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(m).filter(|&b| b > 0)
}

/// Parses a size as HAMi-core does: digits, then optionally `k`, `m` or `g` (either case).
fn hami_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, m) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1u64 << 10),
        'm' | 'M' => (&v[..v.len() - 1], 1 << 20),
        'g' | 'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<u64>().ok()?.checked_mul(m).filter(|&b| b > 0)
}

/// The quota library `LD_PRELOAD` names, if any: HAMi-core's `libvgpu.so` by name, else the
/// first preloaded file that is not gpufrag's own shim.
fn quota_library(env: &HashMap<String, String>) -> Option<String> {
    let pre = env.get("LD_PRELOAD")?;
    let files: Vec<&str> = pre.split([':', ' ']).filter(|s| !s.is_empty()).collect();
    let base = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
    if let Some(f) = files.iter().find(|f| base(f).starts_with("libvgpu.so")) {
        return Some(format!("HAMi-core ({})", base(f)));
    }
    files.iter().map(|f| base(f)).find(|b| !b.starts_with("libgpufrag_preload"))
}

impl ProcessLimits {
    /// The limits a process's environment sets.
    pub fn from_env(env: &HashMap<String, String>) -> ProcessLimits {
        let mut out = ProcessLimits::default();
        if let Some(v) = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").filter(|v| !v.trim().is_empty()) {
            for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let parsed =
                    pair.split_once('=').and_then(|(o, s)| Some((o.trim().parse::<i16>().ok().filter(|&o| o >= 0)?, mps_size(s)?)));
                match parsed {
                    Some((ordinal, bytes)) => out.add(
                        Some(ordinal),
                        Limit {
                            layer: "mps".into(),
                            variable: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                            library: None,
                            bytes,
                            parent: None,
                        },
                    ),
                    None => out.bad.push(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v:?}: {pair:?} is not ORDINAL=SIZE")),
                }
            }
        }
        let library = quota_library(env).or_else(|| Some("unknown (no LD_PRELOAD library seen)".to_string()));
        let quota = |key: &str, ordinal: Option<i16>, out: &mut ProcessLimits| {
            if let Some(v) = env.get(key) {
                match hami_size(v) {
                    Some(bytes) => out
                        .add(ordinal, Limit { layer: "quota".into(), variable: key.into(), library: library.clone(), bytes, parent: None }),
                    None => out.bad.push(format!("{key}={v:?} is not a size (digits, then k, m or g)")),
                }
            }
        };
        quota("CUDA_DEVICE_MEMORY_LIMIT", None, &mut out);
        let mut per: Vec<(i16, &String)> = env
            .keys()
            .filter_map(|k| {
                k.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_").and_then(|n| n.parse::<i16>().ok().filter(|&n| n >= 0)).map(|n| (n, k))
            })
            .collect();
        per.sort();
        for (n, k) in per {
            quota(k, Some(n), &mut out);
        }
        out
    }

    fn add(&mut self, ordinal: Option<i16>, l: Limit) {
        self.by_ordinal.entry(ordinal).or_default().push(l);
    }

    /// The tightest limit on CUDA ordinal `ordinal` (its own, a per-ordinal quota over the
    /// all-devices one, and MPS's beside them).
    pub fn on(&self, ordinal: i16) -> Option<&Limit> {
        let own = self.by_ordinal.get(&Some(ordinal));
        let mut quota_own = own.into_iter().flatten().filter(|l| l.layer == "quota").peekable();
        let quotas: Vec<&Limit> = if quota_own.peek().is_some() {
            quota_own.collect()
        } else {
            self.by_ordinal.get(&None).into_iter().flatten().filter(|l| l.layer == "quota").collect()
        };
        own.into_iter().flatten().filter(|l| l.layer == "mps").chain(quotas).min_by_key(|l| l.bytes)
    }

    /// Whether none was set.
    pub fn is_empty(&self) -> bool {
        self.by_ordinal.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn mps_limits_per_ordinal() {
        let l = ProcessLimits::from_env(&env(&[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4G,1=512MB")]));
        assert_eq!(l.on(0).map(|l| l.bytes), Some(4 * GIB));
        assert_eq!(l.on(1).map(|l| l.bytes), Some(512 << 20));
        assert_eq!(l.on(2), None);
        assert!(l.bad.is_empty());
        assert_eq!(l.on(0).unwrap().name(), "the MPS pinned memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) of 4.00 GiB");
    }

    #[test]
    fn hami_quotas_name_their_library_and_per_device_wins() {
        let e = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
            ("LD_PRELOAD", "/usr/lib/libgpufrag_preload.so:/usr/local/vgpu/libvgpu.so"),
        ]);
        let l = ProcessLimits::from_env(&e);
        assert_eq!(l.on(0).map(|l| l.bytes), Some(8 * GIB));
        assert_eq!(l.on(1).map(|l| (l.bytes, l.variable.as_str())), Some((2 * GIB, "CUDA_DEVICE_MEMORY_LIMIT_1")));
        assert_eq!(l.on(0).unwrap().library.as_deref(), Some("HAMi-core (libvgpu.so)"));
        let no_lib = ProcessLimits::from_env(&env(&[("CUDA_DEVICE_MEMORY_LIMIT", "4096")]));
        assert_eq!(no_lib.on(0).map(|l| l.bytes), Some(4096));
        assert_eq!(no_lib.on(0).unwrap().library.as_deref(), Some("unknown (no LD_PRELOAD library seen)"));
    }

    #[test]
    fn the_tightest_of_mps_and_quota_applies() {
        let l = ProcessLimits::from_env(&env(&[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=3G"), ("CUDA_DEVICE_MEMORY_LIMIT", "4g")]));
        assert_eq!(l.on(0).map(|l| l.layer.as_str()), Some("mps"));
        assert_eq!(l.on(1).map(|l| l.layer.as_str()), Some("quota"));
    }

    #[test]
    fn values_that_do_not_parse_are_noted_not_guessed() {
        let l = ProcessLimits::from_env(&env(&[
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=lots,x=4G,1=2G"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "8 gigs"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
        ]));
        assert_eq!(l.on(0), None, "no limit on 0: every value for it was bad: {l:?}");
        assert_eq!(l.on(1).map(|l| l.bytes), Some(2 * GIB), "the good pair is kept");
        assert_eq!(l.bad.len(), 4, "{:?}", l.bad);
        assert!(l.bad.iter().any(|b| b.contains("CUDA_DEVICE_MEMORY_LIMIT=\"8 gigs\"")), "{:?}", l.bad);
    }

    #[test]
    fn a_request_past_the_limit_is_judged_by_it() {
        let lim =
            Limit { layer: "mps".into(), variable: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), library: None, bytes: 4 * GIB, parent: None };
        let h = LimitHit::judge(&lim, 3 * GIB, 2 * GIB);
        assert!(h.hit());
        assert_eq!(h.over, GIB);
        assert_eq!(
            h.explanation(),
            "the request passed the MPS pinned memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) of 4.00 GiB: the process held 3.00 GiB and asked 2.00 GiB, 1024.00 MiB over the limit; the device itself was not the limit"
        );
        assert!(!LimitHit::judge(&lim, GIB, GIB).hit());
    }

    #[test]
    fn a_mig_instance_is_judged_by_what_the_instance_held() {
        let lim = Limit::mig("MIG-aaaaaaaa-0000-4000-8000-000000000001", "GPU-00000001-0000-4000-8000-000000000000", 4 * GIB);
        assert_eq!(
            lim.name(),
            "the MIG instance MIG-aaaaaaaa-0000-4000-8000-000000000001 (4.00 GiB of GPU-00000001-0000-4000-8000-000000000000)"
        );
        // This process holds 1 GiB; the instance has 512 MiB free: others hold 2.5 GiB.
        let h = LimitHit::judge_oom(&lim, GIB, Some(512 << 20), GIB);
        assert_eq!((h.used, h.over), (4 * GIB - (512 << 20), 512 << 20), "{h:?}");
        assert!(h.explanation().contains("the instance's processes held 3.50 GiB"), "{}", h.explanation());
        assert!(h.fix().starts_with("run on a larger MIG instance"), "{}", h.fix());
        // Free unknown: the process's own bytes; a per-process layer ignores the free bytes.
        assert_eq!(LimitHit::judge_oom(&lim, GIB, None, GIB).over, 0);
        let mps =
            Limit { layer: "mps".into(), variable: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), library: None, bytes: 4 * GIB, parent: None };
        assert_eq!(LimitHit::judge_oom(&mps, 3 * GIB, Some(0), 2 * GIB).used, 3 * GIB);
    }
}
