//! Who held the device at an OOM: the other traced processes on that GPU (pid, name, container
//! or pod, the bytes they reserved and the cache their allocator could release) and the
//! processes NVML lists there that gpufrag does not trace (pid, used bytes). A process that
//! fails because a neighbour holds the card is told so by name ("process 695 (python3, pod
//! ns/name) holds 120.51 GiB"), in the explanation, the fix, the summary (`ooms[].holders`),
//! the report, `top` and the OOM metric's bounded `gpufrag.oom.holders` attribute.
//!
//! The traced holders are taken from the state when the failure is applied (so a replayed
//! record names them too); NVML's list is read by the live pipeline the moment it applies the
//! failure ([`add_untraced`]) and is not in a record file. The figure a holder "holds" is
//! NVML's used bytes where NVML listed it (what PyTorch's own OOM message prints: "Process N
//! has X GiB memory in use"), else the bytes traced for it.

use crate::attribution::Identity;
use crate::units::human_bytes;
use serde::{Deserialize, Serialize};

/// Most holders kept per OOM (the largest first); the rest are counted in [`Holders::more`].
pub const KEPT: usize = 8;

/// The values of the OOM metric's `gpufrag.oom.holders` attribute (an OOM nobody else held
/// memory at, `none`, is not counted there).
pub const HELD_KINDS: [&str; 3] = ["traced", "untraced", "both"];

/// One process holding memory on the failing device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Process id (as NVML or the capture saw it).
    pub pid: u32,
    /// Executable name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// `pod NS/NAME` or `container ID12`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<String>,
    /// Whether gpufrag traces it (its reserved and releasable bytes are known).
    pub traced: bool,
    /// Bytes the capture saw it reserve on the device (0 for an untraced process).
    pub reserved: u64,
    /// Of those, the cache its allocator could release (`empty_cache()`): what it could give back.
    pub releasable: u64,
    /// NVML's used bytes for it on the device (context included), when NVML listed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_used: Option<u64>,
}

impl Holder {
    /// What it holds: NVML's figure where there is one, else the traced bytes.
    pub fn holds(&self) -> u64 {
        self.nvml_used.unwrap_or(self.reserved)
    }

    /// `process 695 (python3, pod ns/name) holds 120.51 GiB` (and what of it is releasable).
    pub fn sentence(&self) -> String {
        let mut who: Vec<String> = Vec::new();
        if let Some(e) = &self.exe {
            who.push(e.clone());
        }
        if let Some(p) = &self.place {
            who.push(p.clone());
        }
        if !self.traced {
            who.push("not traced".to_string());
        }
        let who = if who.is_empty() { String::new() } else { format!(" ({})", who.join(", ")) };
        let mut s = format!("process {}{who} holds {}", self.pid, human_bytes(self.holds()));
        if self.traced && self.releasable > 0 {
            s.push_str(&format!(", {} of it releasable cache", human_bytes(self.releasable)));
        }
        s
    }
}

/// What sharing the GPU meant at one OOM: who else held it, and the sharing layer's limit the
/// process ran under (`crate::limits`), when one was set. One field of the OOM record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shared {
    /// Who else held the device.
    pub holders: Holders,
    /// The process's limit on this device, judged against the request.
    pub limit: Option<crate::limits::LimitHit>,
}

/// The holders of one OOM.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holders {
    /// The largest holders, by [`Holder::holds`], at most [`KEPT`].
    pub list: Vec<Holder>,
    /// Holders beyond the kept ones.
    #[serde(default)]
    pub more: u32,
    /// Whether NVML's process list was read for this OOM.
    #[serde(default)]
    pub nvml_read: bool,
}

/// `pod NS/NAME`, `container ID12`, or nothing.
pub fn place_of(id: &Identity) -> Option<String> {
    let p = id.place();
    if p.is_empty() {
        None
    } else if id.pod_name.is_some() {
        Some(format!("pod {p}"))
    } else {
        Some(format!("container {p}"))
    }
}

impl Holders {
    /// The other traced processes on `device` at this moment, from `state`: those with bytes
    /// reserved there and no exit seen.
    pub fn traced(state: &crate::ingest::State, pid: u32, device: i16) -> Holders {
        let mut list = Vec::new();
        for s in state.spaces.values().filter(|s| s.device == device && s.pid != pid && !state.exited.contains_key(&s.pid)) {
            let f = s.map.figures();
            if f.reserved == 0 {
                continue;
            }
            let id = state.identities.get(&s.pid);
            list.push(Holder {
                pid: s.pid,
                exe: id.map(|i| i.exe.clone()),
                place: id.and_then(|i| place_of(i)),
                traced: true,
                reserved: f.reserved,
                releasable: f.releasable,
                nvml_used: None,
            });
        }
        let mut h = Holders { list, more: 0, nvml_read: false };
        h.bound();
        h
    }

    fn bound(&mut self) {
        self.list.sort_by(|a, b| b.holds().cmp(&a.holds()).then(a.pid.cmp(&b.pid)));
        if self.list.len() > KEPT {
            self.more = self.more.saturating_add((self.list.len() - KEPT) as u32);
            self.list.truncate(KEPT);
        }
    }

    /// The bounded attribute value for metrics: `none`, `traced`, `untraced` or `both`.
    pub fn kind(&self) -> &'static str {
        let t = self.list.iter().any(|h| h.traced);
        let u = self.list.iter().any(|h| !h.traced);
        match (t, u) {
            (false, false) => "none",
            (true, false) => "traced",
            (false, true) => "untraced",
            (true, true) => "both",
        }
    }

    /// Bytes all holders hold.
    pub fn total(&self) -> u64 {
        self.list.iter().map(Holder::holds).sum()
    }

    /// `; on this GPU process 695 (…) holds 120.51 GiB, process …` or nothing.
    pub fn clause(&self) -> String {
        if self.list.is_empty() {
            return String::new();
        }
        let mut parts: Vec<String> = self.list.iter().map(Holder::sentence).collect();
        if self.more > 0 {
            parts.push(format!("{} more", self.more));
        }
        format!("; on this GPU {}", parts.join(", "))
    }

    /// The explanation with who holds the device added.
    pub fn explain(&self, explanation: String) -> String {
        if self.list.is_empty() {
            return explanation;
        }
        format!("{}{}", explanation.trim_end_matches('.'), self.clause())
    }

    /// The fix with the largest holder named: its memory is what the request lacks.
    pub fn fix(&self, fix: String) -> String {
        let Some(top) = self.list.first() else { return fix };
        if top.holds() == 0 {
            return fix;
        }
        let what = if top.traced && top.releasable > 0 {
            "stop it, move one of the two to another GPU, or have it release its cache (torch.cuda.empty_cache())"
        } else {
            "stop it or move one of the two to another GPU"
        };
        format!("{} ({what}); else: {fix}", top.sentence())
    }
}

/// What NVML's process list gave for an OOM's device: `(pid, used bytes)` per process, or the
/// error it returned.
pub type NvmlList = Result<Vec<(u32, Option<u64>)>, String>;

/// What adding NVML's list found wrong (counted; the live pipeline turns them into notes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmlProblems {
    /// The list could not be read.
    pub errors: u64,
    /// It named a pid with no `/proc` entry here (another pid namespace, or gone).
    pub unknown_pids: u64,
}

/// Adds NVML's list to `h`: a traced holder gets its used bytes, an untraced one is added (its
/// name from `name_of`, `None` when the pid is unknown here: counted), the failing process
/// itself is skipped. An error leaves the holders as they were and is counted.
pub fn add_untraced(h: &mut Holders, failing: u32, list: &NvmlList, mut name_of: impl FnMut(u32) -> Option<String>) -> NvmlProblems {
    let mut p = NvmlProblems::default();
    let procs = match list {
        Ok(l) => l,
        Err(_) => {
            p.errors += 1;
            return p;
        }
    };
    h.nvml_read = true;
    for &(pid, used) in procs {
        if pid == failing {
            continue;
        }
        if let Some(t) = h.list.iter_mut().find(|x| x.pid == pid) {
            t.nvml_used = used;
            continue;
        }
        let exe = name_of(pid);
        if exe.is_none() {
            p.unknown_pids += 1;
        }
        let Some(used) = used else { continue };
        if used == 0 {
            continue;
        }
        h.list.push(Holder { pid, exe, place: None, traced: false, reserved: 0, releasable: 0, nvml_used: Some(used) });
    }
    h.bound();
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn traced(pid: u32, reserved: u64, releasable: u64) -> Holder {
        Holder { pid, exe: Some("python3".into()), place: Some("pod ns/train".into()), traced: true, reserved, releasable, nvml_used: None }
    }

    #[test]
    fn the_neighbour_is_named_with_its_bytes() {
        let h = Holders { list: vec![traced(695, 12 * GIB, 0)], more: 0, nvml_read: false };
        assert_eq!(h.list[0].sentence(), "process 695 (python3, pod ns/train) holds 12.00 GiB");
        let e = h.explain("more was asked than the device has free.".into());
        assert_eq!(e, "more was asked than the device has free; on this GPU process 695 (python3, pod ns/train) holds 12.00 GiB");
        assert!(h.fix("reduce the batch".into()).starts_with("process 695 (python3, pod ns/train) holds 12.00 GiB (stop it"));
        assert_eq!(h.kind(), "traced");
    }

    #[test]
    fn nvml_gives_used_bytes_and_untraced_holders() {
        let mut h = Holders { list: vec![traced(695, 12 * GIB, GIB)], more: 0, nvml_read: false };
        let list: NvmlList =
            Ok(vec![(695, Some(12 * GIB + (500 << 20))), (700, Some(2 * GIB)), (1, Some(0)), (800, Some(GIB)), (42, Some(GIB))]);
        let p = add_untraced(&mut h, 42, &list, |pid| (pid == 700).then(|| "ollama".to_string()));
        assert_eq!(p, NvmlProblems { errors: 0, unknown_pids: 2 }, "800 and 1 have no /proc entry");
        let pids: Vec<u32> = h.list.iter().map(|x| x.pid).collect();
        assert_eq!(pids, vec![695, 700, 800], "largest first; the failing process and a 0-byte entry left out");
        assert_eq!(h.list[0].holds(), 12 * GIB + (500 << 20), "NVML's figure, as PyTorch prints it");
        assert_eq!(h.list[1].sentence(), "process 700 (ollama, not traced) holds 2.00 GiB");
        assert_eq!(h.list[2].sentence(), "process 800 (not traced) holds 1024.00 MiB", "as PyTorch prints sizes");
        assert_eq!(h.kind(), "both");
        let before = h.clone();
        let p = add_untraced(&mut h, 42, &Err("NVML_ERROR_UNKNOWN".into()), |_| None);
        assert_eq!(p.errors, 1);
        assert_eq!(h, before, "an error changes nothing");
    }

    #[test]
    fn holders_are_bounded() {
        let mut h = Holders::default();
        let list: NvmlList = Ok((1..=20).map(|p| (p, Some(u64::from(p) * GIB))).collect());
        add_untraced(&mut h, 0, &list, |_| Some("x".into()));
        assert_eq!((h.list.len(), h.more), (KEPT, 12));
        assert_eq!(h.list[0].pid, 20);
        assert!(h.clause().ends_with("12 more"));
    }
}
