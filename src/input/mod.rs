//! Any input `analyze` (and `report`) accepts, recognised by its first bytes, turned into a
//! [`State`]: a PyTorch snapshot pickle (plain or gzipped) or a gpufrag record file.
//!
//! A snapshot's trace ring is replayed from empty. When the ring was truncated (`max_entries`),
//! that replay cannot reach the snapshot's own final `segments`; then the state at the start of
//! the ring is rebuilt by undoing the ring, newest entry first, from the final segments and blocks,
//! and the ring is replayed forward from there, so that every OOM in it is judged on the state of
//! its moment. The output says which way was taken. This is the one place that rebuilds a
//! truncated ring: [`Loaded::replay`] carries the events it replayed, so that the views that play
//! an input back event by event (the report's timeline, `top --replay`) follow the same path.
//!
//! The file is opened, told apart and decoded once, by [`open`] (open.rs); [`Opened::load`] and
//! [`Opened::load_state`] replay what it holds, and the simulator takes the same [`Opened`] input
//! (`crate::sim::stream_of`).
//!
//! An input that cannot be used fails with an [`UnusableInput`] in its error chain; the command
//! line turns that kind into its exit code.

mod open;

pub use open::{open, Accept, Body, Bytes, BytesReader, Opened, PIPE_SILENCE};

use crate::alloc::pytorch::{AllocatorRules, ROUNDUP_INTERVALS};
use crate::event::Event;
use crate::ingest::State;
use crate::record;
use crate::snapshot::{AllocatorSettings, Snapshot};
use std::path::Path;

/// The error kind of an input that cannot be used (unreadable, of no format gpufrag knows,
/// corrupt, or asking for what it does not hold); the message names the file and, where it
/// applies, the offset.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UnusableInput(pub String);

/// What kind of file an input was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A PyTorch memory snapshot.
    Snapshot,
    /// A gpufrag record file.
    Record,
}

/// An input turned into state.
#[derive(Debug)]
pub struct Loaded {
    /// The replayed state.
    pub state: State,
    /// How the figures were obtained, for the user.
    pub notes: Vec<String>,
    /// False when the figures are known to be incomplete beyond what `state` counts.
    pub complete: bool,
    /// The kind of input.
    pub kind: InputKind,
    /// The allocator rules the replay followed.
    pub rules: AllocatorRules,
    /// The events that rebuild the replayed state from empty, in order: a record file's events;
    /// a snapshot's trace ring, preceded (when the ring does not start from an empty cache) by the
    /// events that build the state at its first entry. When the replay could not reproduce the
    /// snapshot's final segments (`complete` false), playing these gives the replay's end, not
    /// the final figures of `state`.
    pub replay: Vec<Event>,
    /// The text after each event of `replay` that has one (a record's settings and framework
    /// facts), by its index: playing `replay` back applies each with its text.
    pub replay_texts: std::collections::BTreeMap<usize, Vec<u8>>,
}

/// The caching allocator rules a snapshot's settings describe.
pub fn rules_from(settings: &AllocatorSettings) -> AllocatorRules {
    let mut divisions = [0u64; ROUNDUP_INTERVALS];
    for &(start, d) in &settings.roundup_power2_divisions {
        let mib = (start >> 20).max(1);
        let idx = (63 - mib.leading_zeros()) as usize;
        if idx < ROUNDUP_INTERVALS {
            divisions[idx] = d;
        }
    }
    AllocatorRules { max_split_size: settings.max_split_size.unwrap_or(u64::MAX), roundup_power2_divisions: divisions }
}

/// Opens and loads `path`, keeping the events that rebuild its state ([`Opened::load`]): for the
/// callers that need nothing else of the file.
pub fn load(path: &Path) -> anyhow::Result<Loaded> {
    open(path, Accept::Traces)?.load()
}

/// How often (in events) the state's OOMs are checked against the memory budget.
const CHARGE_EVERY: usize = 1 << 16;

impl Opened {
    /// Replays the input, keeping the events that rebuild its state ([`Loaded::replay`]) for the
    /// views that play it back (the report's timeline, `top --replay`).
    pub fn load(&self) -> anyhow::Result<Loaded> {
        self.load_keeping(true)
    }

    /// Replays the input for its state only (`analyze`): a record is streamed entry by entry and
    /// nothing that grows with its length is kept but the state itself ([`Loaded::replay`] is
    /// empty).
    pub fn load_state(&self) -> anyhow::Result<Loaded> {
        self.load_keeping(false)
    }

    fn load_keeping(&self, keep_replay: bool) -> anyhow::Result<Loaded> {
        match &self.body {
            Body::Record(bytes) => Ok(load_record(bytes, &self.path, keep_replay)?),
            Body::Snapshot(snap) => {
                let mut loaded = replay_snapshot(snap);
                if !keep_replay {
                    loaded.replay = Vec::new();
                }
                Ok(loaded)
            }
            Body::Summary(_) => {
                Err(UnusableInput(format!("{}: a summary JSON, not a trace (a snapshot or a record)", self.path.display())).into())
            }
        }
    }
}

fn load_record(bytes: &Bytes, path: &Path, keep_replay: bool) -> Result<Loaded, UnusableInput> {
    let mut reader = bytes.records(path).map_err(|e| UnusableInput(e.to_string()))?;
    let rules = AllocatorRules::default();
    let mut state = State::new(rules.clone());
    let mut events = Vec::new();
    let mut replay_texts = std::collections::BTreeMap::new();
    let (mut count, mut text_bytes) = (0usize, 0u64);
    for entry in reader.by_ref() {
        let entry = entry.map_err(|e| UnusableInput(e.to_string()))?;
        state.apply_text(&entry.event, entry.text.as_deref().unwrap_or(&[]));
        count += 1;
        if count.is_multiple_of(CHARGE_EVERY) {
            charge_state(path, &state).map_err(|e| UnusableInput(e.to_string()))?;
        }
        if !keep_replay {
            continue;
        }
        if let Some(t) = entry.text.filter(|t| !t.is_empty()) {
            text_bytes += t.len() as u64 + 48;
            replay_texts.insert(events.len(), t.into_vec());
        }
        if events.len() == events.capacity() {
            let held = crate::budget::vec_growth_bytes(&events) + text_bytes;
            crate::budget::charge(path, || format!("the replay of {}+ events", crate::units::thousands(events.len() as u64)), held)
                .map_err(|e| UnusableInput(e.to_string()))?;
        }
        events.push(entry.event);
    }
    // The end of the trace: a failure nothing recovered is an OOM (crate::ingest::oom_rule).
    state.settle_all();
    let end = reader.end().unwrap_or(record::End::Cut { at: reader.offset() });
    let mut notes = vec![format!("replayed {count} recorded events")];
    notes.extend(end.note(path));
    Ok(Loaded { state, notes, complete: end.is_whole(), kind: InputKind::Record, rules, replay: events, replay_texts })
}

/// What the state holds that grows with the input's length rather than with its live memory:
/// its OOMs (each kept with its verdict's figures), checked against the memory budget.
fn charge_state(path: &Path, state: &State) -> Result<(), crate::budget::Over> {
    let held = crate::budget::vec_bytes(&state.ooms);
    crate::budget::charge(path, || format!("the state of {} OOMs", crate::units::thousands(state.ooms.len() as u64)), held)
}

fn matches_final(state: &State, snap: &Snapshot) -> bool {
    state.exact()
        && snap.devices().into_iter().all(|d| {
            let f = state.device_figures(d);
            let s = snap.device_stats(d);
            f.reserved == s.all.get("reserved_bytes").unwrap_or(u64::MAX)
                && f.allocated == s.all.get("allocated_bytes").unwrap_or(u64::MAX)
                && f.segments == s.segment_entries
        })
}

/// Replays a snapshot's trace rings, rebuilding their starting state when they were truncated.
pub fn replay_snapshot(snap: &Snapshot) -> Loaded {
    let rules = rules_from(&snap.settings);
    let events = snap.events();
    let mut state = State::new(rules.clone());
    state.apply_all(&events);
    let mut notes = Vec::new();
    for w in &snap.warnings {
        notes.push(w.clone());
    }
    if matches_final(&state, snap) {
        notes.push(format!("replayed the complete trace ring ({} entries) from an empty cache", snap.entry_count()));
        return Loaded { state, notes, complete: true, kind: InputKind::Snapshot, rules, replay: events, replay_texts: Default::default() };
    }
    // Truncated ring: final segments and blocks, undo the ring, then replay it forward.
    let mut start = State::new(rules.clone());
    start.apply_all(&snap.seed_events());
    for d in snap.devices() {
        start.apply_all(&snap.reverse_events(d));
    }
    let undo_clean = start.exact();
    let mut replay: Vec<Event> = start.spaces.values().flat_map(|s| s.map.to_events(s.pid, s.device)).collect();
    let seeded = replay.len();
    replay.extend(events);
    let mut rebuilt = State::new(rules.clone());
    rebuilt.apply_all(&replay[..seeded]);
    rebuilt.events = 0;
    rebuilt.apply_all(&replay[seeded..]);
    let complete = undo_clean && matches_final(&rebuilt, snap);
    notes.push(format!(
        "the trace ring does not start from an empty cache (truncated by max_entries, or recording began late): the state at its first entry was rebuilt from the snapshot's segments by undoing its {} entries{}",
        snap.entry_count(),
        if complete {
            "; the replay then reproduces the final segments exactly"
        } else {
            "; that replay still differs from the final segments, so the final figures are taken from the segments themselves and the figures at OOMs are approximate"
        }
    ));
    if complete {
        return Loaded { state: rebuilt, notes, complete, kind: InputKind::Snapshot, rules, replay, replay_texts: Default::default() };
    }
    // The snapshot's segments and blocks are the truth about the end: the final figures come from
    // them; the replay contributes what only it knows (the OOMs with their moment's figures).
    let mut last = State::new(rules.clone());
    last.apply_all(&snap.seed_events());
    last.ooms = rebuilt.ooms;
    last.events = rebuilt.events;
    last.anomaly_count += rebuilt.anomaly_count;
    last.anomalies.extend(rebuilt.anomalies);
    Loaded { state: last, notes, complete: false, kind: InputKind::Snapshot, rules, replay, replay_texts: Default::default() }
}
