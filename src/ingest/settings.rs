//! The facts a process's framework states about itself, applied from events like every other
//! fact (so that a record replays to what the live run said): its caching-allocator settings at
//! start and at each change ([`EventKind::AllocSettings`]), its memory fraction
//! ([`EventKind::MemoryFraction`]), which framework it is ([`EventKind::FrameworkInfo`]) and the
//! framework's own figures at its OOM ([`EventKind::FrameworkFigures`]).
//!
//! A settings text that does not parse, or names a key PyTorch does not know, changes nothing:
//! it is a counted note with PyTorch's own one-line reason ([`State::fact_notes`]), as is a
//! framework's OOM figures for a process with no OOM, and an OOM report's allowed bytes for a
//! process no event told of.

use super::{OomRecord, State};
use crate::alloc::pytorch::AllocConf;
use crate::alloc::Framework;
use crate::event::{Event, EventKind};

/// How many notes on unusable facts are kept verbatim (all are counted).
pub const KEPT_FACT_NOTES: usize = 20;

/// A process's allocator settings as its events stated them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSettings {
    /// The settings in force (the start's, with every change applied), parsed as PyTorch does.
    pub conf: AllocConf,
    /// The settings it started with (`PYTORCH_CUDA_ALLOC_CONF` at exec, or its first settings
    /// event), as written.
    pub at_start: String,
    /// Changes applied at run time, in order, as written.
    pub changes: Vec<String>,
    /// Per device: the allowed bytes of `set_per_process_memory_fraction`, and the fraction as set.
    pub fractions: std::collections::BTreeMap<i16, (u64, String)>,
    /// The framework that said it manages the process's memory, with its name and version.
    pub framework: Option<(Framework, String)>,
}

impl State {
    /// The settings `pid`'s events stated, if any (foresight and whatif read them).
    pub fn settings_of(&self, pid: u32) -> Option<&ProcessSettings> {
        self.settings.get(&pid)
    }

    /// A fact that could not be used: counted, the first few kept with their reason.
    pub(super) fn fact_note(&mut self, note: String) {
        self.fact_note_count += 1;
        if self.fact_notes.len() < KEPT_FACT_NOTES {
            self.fact_notes.push(note);
        }
    }

    /// Applies a fact event and its text.
    pub(super) fn apply_fact(&mut self, ev: &Event, kind: EventKind, text: &[u8]) {
        let pid = ev.pid;
        let index = self.events.saturating_sub(1);
        match kind {
            EventKind::AllocSettings => {
                let Ok(t) = std::str::from_utf8(text) else {
                    self.fact_note(format!("event {index}: pid {pid}: allocator settings that are not UTF-8: ignored"));
                    return;
                };
                let first = !self.settings.contains_key(&pid);
                let current = self.settings.get(&pid).map(|s| s.conf.conf.clone()).unwrap_or_default();
                // A change replaces the keys it names (PyTorch parses it over the settings in
                // force): the keys given last win.
                let merged = if first || current.is_empty() {
                    t.to_string()
                } else if t.is_empty() {
                    current.clone()
                } else {
                    format!("{current},{t}")
                };
                match AllocConf::parse(&merged) {
                    Ok(conf) => {
                        let rules = conf.rules.clone();
                        let s = self.settings.entry(pid).or_default();
                        if first {
                            s.at_start = t.to_string();
                        } else {
                            s.changes.push(t.to_string());
                        }
                        s.conf = conf;
                        for ((p, _), pd) in self.spaces.iter_mut() {
                            if *p == pid {
                                pd.map.set_rules(rules.clone());
                            }
                        }
                    }
                    Err(e) => self.fact_note(format!(
                        "event {index}: pid {pid}: allocator settings {t:?} do not parse ({e}): ignored, the settings in force stay"
                    )),
                }
            }
            EventKind::MemoryFraction => {
                let fraction = String::from_utf8_lossy(text).into_owned();
                self.settings.entry(pid).or_default().fractions.insert(ev.device, (ev.size, fraction));
            }
            EventKind::FrameworkInfo => {
                let name = String::from_utf8_lossy(text).into_owned();
                self.settings.entry(pid).or_default().framework = Some((Framework::from_flags(ev.flags), name));
            }
            EventKind::FrameworkFigures => {
                let device = ev.device;
                let latest = self.ooms.iter_mut().rev().find(|o: &&mut OomRecord| o.pid == pid && o.device == device);
                match latest {
                    Some(o) => {
                        // Under `run` XLA's pool is one mapping with nothing visible inside: the
                        // OOM's figures are the ones BFC itself reported right after the failure.
                        let (pool, used) = (ev.size, ev.requested);
                        o.figures.reserved = pool;
                        o.figures.allocated = used;
                        o.figures.stranded = pool.saturating_sub(used);
                        o.figures.releasable = 0;
                        o.figures.largest_free_block = ev.handle;
                        o.figures.framework_seen = true;
                    }
                    None => self.fact_note(format!(
                        "event {index}: pid {pid}: a framework's OOM figures on device {device} for a process with no OOM there: ignored"
                    )),
                }
            }
            _ => {}
        }
    }

    /// The allowed bytes `pid`'s memory fraction on `device` gives, when one was set.
    ///
    /// A fraction stated without its allowed bytes (the eBPF probe of the setter sees the fraction;
    /// PyTorch 2.9 and later multiply it by the device's `totalGlobalMem`, read once, not by a
    /// `cuMemGetInfo` inside the setter) takes the total of the process's own latest
    /// `cuMemGetInfo` on that device, the same figure (CUDA's total, not NVML's): `(size_t)(fraction
    /// × total)` as PyTorch computes it.
    pub fn allowed_of(&self, pid: u32, device: i16) -> Option<u64> {
        let (allowed, fraction) = self.settings.get(&pid)?.fractions.get(&device)?;
        if *allowed > 0 {
            return Some(*allowed);
        }
        let f: f64 = fraction.trim().parse().ok()?;
        let total = self.readings.get(&(pid, device)).map(|r| r.total).filter(|&t| t > 0)?;
        (f > 0.0 && f <= 1.0).then_some((f * total as f64) as u64)
    }
}
