//! The live side of foresight: what `run`, `attach` and `agent` do with each traced PyTorch
//! process whose blocks are traced from its first allocation. The pipeline's thread turns each
//! block event into a request (O(1): a hash-map insert or remove, a push), and about every
//! 100 ms ([`Watch::flush`], from the status tick, never per event) hands each process's new
//! requests, with what it may hold, to one worker thread. The worker keeps a [`Predictor`] per
//! process (the simulated allocator at the process's current state) and, once a whole step of
//! new requests has come, predicts the next [`HORIZON`] steps (`--foresight-steps`; 0 turns it off); its answers come back to the
//! pipeline ([`Watch::said`]), which states each forecast as an event (recorded, so a record
//! replays to the same warnings). The simulation never runs on the pipeline's thread; when the
//! worker falls behind it runs the requests queued and predicts once.
//!
//! Who is predicted: PyTorch's caching allocator's blocks, one event per request (the trace
//! tracker, USDT): blocks from snapshots (their sizes known, not every request seen), or a
//! block freed that was never seen allocated (tracing began late), give a note and no
//! prediction. A process's prediction stops at its OOM or its exit.

use super::{Available, Forecast, Predictor, HORIZON};
use crate::alloc::pytorch::AllocConf;
use crate::alloc::Framework;
use crate::event::{Event, EventKind, F_OOM_AMEND};
use crate::ingest::State;
use crate::sim::Request;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::mpsc;

/// Requests a process may queue on the pipeline's side before they are handed over at once.
const BATCH: usize = 4096;

/// One process on one device.
type Key = (u32, i16);

/// What the worker is handed, in order.
enum Item {
    Request(Request),
    /// What the driver can give the allocator from here on (a reading of device free).
    Capacity(u64),
}

#[derive(Default)]
struct Tracked {
    /// Live blocks' addresses → allocation index.
    alloc_of: HashMap<u64, u32>,
    allocs: u32,
    batch: Vec<Item>,
    /// The settings to start the predictor with (sent with the first batch).
    conf: Option<AllocConf>,
    /// A segment was returned to the driver since the last request and nothing was allocated
    /// from it: an `empty_cache()` (a malloc's own release and retry allocates next).
    segment_freed: bool,
    ipc: bool,
    /// Bytes the process took from the driver since its last request (a segment its next
    /// request's block will be in: not yet the allocator's in the state).
    fresh: u64,
    /// No more predictions (a note says why, or it ended).
    off: bool,
}

enum Job {
    /// New requests and readings; `cap`: the process's memory fraction's allowed bytes.
    Requests {
        key: Key,
        conf: Option<Box<AllocConf>>,
        items: Vec<Item>,
        cap: Option<u64>,
        ipc: bool,
    },
    Stop(Key),
}

/// A worker's answer for one process.
pub struct Said {
    /// The process and device.
    pub key: (u32, i16),
    /// The forecast, or why there is none.
    pub result: Result<Forecast, String>,
}

/// The pipeline's side of foresight (see the module header).
pub struct Watch {
    procs: HashMap<Key, Tracked>,
    tx: Option<mpsc::Sender<Job>>,
    rx: mpsc::Receiver<Said>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// Per process: why it has no prediction (the latest reason).
    pub notes: BTreeMap<Key, String>,
    /// Processes that had a forecast.
    pub forecasted: BTreeSet<Key>,
    /// Processes whose prediction ended (their OOM, their exit): late answers are dropped.
    ended: BTreeSet<Key>,
    /// Per device: the latest reading of free bytes.
    readings: HashMap<i16, u64>,
    /// Steps predicted ahead (`--foresight-steps`); 0: foresight off, nothing tracked.
    horizon: usize,
}

impl Default for Watch {
    fn default() -> Watch {
        Watch::new()
    }
}

impl Watch {
    /// A watch with its worker thread, predicting [`HORIZON`] steps ahead.
    pub fn new() -> Watch {
        Watch::with_horizon(HORIZON)
    }

    /// A watch predicting `horizon` steps ahead; 0 turns foresight off (no worker, no request
    /// kept, no forecast: the summary says so once).
    pub fn with_horizon(horizon: usize) -> Watch {
        let (tx, jobs) = mpsc::channel::<Job>();
        let (said, rx) = mpsc::channel::<Said>();
        let worker = if horizon == 0 {
            None
        } else {
            std::thread::Builder::new().name("gpufrag-foresight".into()).spawn(move || work(jobs, said, horizon)).ok()
        };
        Watch {
            procs: HashMap::new(),
            tx: worker.as_ref().map(|_| tx),
            rx,
            worker,
            notes: BTreeMap::new(),
            forecasted: BTreeSet::new(),
            ended: BTreeSet::new(),
            readings: HashMap::new(),
            horizon,
        }
    }

    /// Whether foresight is off (`--foresight-steps 0`).
    pub fn off(&self) -> bool {
        self.horizon == 0
    }

    fn note(&mut self, key: Key, note: String) {
        self.notes.insert(key, note);
    }

    /// Takes in one event the state has applied (O(1); nothing is simulated here).
    pub fn observe(&mut self, state: &State, e: &Event) {
        if self.horizon == 0 {
            return;
        }
        let Some(kind) = e.kind() else { return };
        match kind {
            EventKind::BlockAlloc if e.device >= 0 => {
                let key = (e.pid, e.device);
                if self.ended.contains(&key) {
                    return;
                }
                if !self.procs.contains_key(&key) {
                    let mut t = Tracked::default();
                    if Framework::from_flags(e.flags) != Framework::PYTORCH {
                        t.off = true;
                        self.note(key, format!("its blocks are {}'s, not PyTorch's caching allocator's: the simulation models PyTorch's only, no prediction", Framework::from_flags(e.flags).allocator()));
                    } else if crate::event::sampled_block(e.flags) {
                        // Blocks synced from snapshots (the tracker's and the annotations' blocks
                        // come with their size too, one event per request: those are predicted).
                        t.off = true;
                        self.note(
                            key,
                            "its blocks come from allocator snapshots, not from every request since its first allocation: no prediction"
                                .into(),
                        );
                    } else {
                        t.conf = Some(state.settings_of(e.pid).map(|s| s.conf.clone()).unwrap_or_default());
                        // a reading before its first block (the shim reads at the first allocation)
                        if let Some(&free) = self.readings.get(&e.device) {
                            t.batch.push(Item::Capacity(capacity(state, key, 0, free)));
                        }
                    }
                    self.procs.insert(key, t);
                }
                let Some(t) = self.procs.get_mut(&key).filter(|t| !t.off) else { return };
                if std::mem::take(&mut t.segment_freed) {
                    t.batch.push(Item::Request(Request::EmptyCache { entry: usize::MAX }));
                }
                t.alloc_of.insert(e.addr, t.allocs);
                t.allocs += 1;
                t.batch.push(Item::Request(Request::Alloc {
                    size: e.requested,
                    stream: e.stream,
                    entry: usize::MAX,
                    traced: Some(e.addr),
                }));
                t.fresh = 0;
                if t.batch.len() >= BATCH {
                    self.send(state, key);
                }
            }
            EventKind::BlockFree => {
                let keys: Vec<Key> = self.procs.keys().filter(|k| k.0 == e.pid).copied().collect();
                let mut unknown = None;
                for key in keys {
                    let Some(t) = self.procs.get_mut(&key).filter(|t| !t.off) else { continue };
                    if let Some(a) = t.alloc_of.remove(&e.addr) {
                        if std::mem::take(&mut t.segment_freed) {
                            t.batch.push(Item::Request(Request::EmptyCache { entry: usize::MAX }));
                        }
                        t.batch.push(Item::Request(Request::FreeRequested { alloc: a, entry: usize::MAX }));
                        t.batch.push(Item::Request(Request::FreeCompleted { alloc: a, entry: usize::MAX }));
                        t.fresh = 0;
                        return;
                    }
                    unknown = Some(key);
                }
                if let Some(key) = unknown {
                    self.stop(key);
                    self.note(key, format!("a block at {:#x} was freed that was never seen allocated: its blocks are not traced from its first allocation, no prediction", e.addr));
                }
            }
            EventKind::MemFree | EventKind::Unmap => self.for_pid(e.pid, |t| t.segment_freed = true),
            EventKind::MemAlloc | EventKind::Map => self.for_pid(e.pid, |t| {
                t.segment_freed = false;
                t.fresh += e.size;
            }),
            EventKind::IpcExport if e.rc == 0 => self.for_pid(e.pid, |t| t.ipc = true),
            EventKind::AllocFailed if e.flags & F_OOM_AMEND == 0 && e.op == EventKind::BlockAlloc as u16 => {
                // the allocator's OOM: the process raised; what it does next is not a step
                let keys: Vec<Key> = self.procs.keys().filter(|k| k.0 == e.pid).copied().collect();
                for key in keys {
                    self.stop(key);
                }
            }
            EventKind::ProcessExit => {
                let keys: Vec<Key> = self.procs.keys().filter(|k| k.0 == e.pid).copied().collect();
                for key in keys {
                    self.stop(key);
                }
            }
            EventKind::DeviceInfo => {
                if let Some(free) = e.device_free() {
                    self.readings.insert(e.device, free);
                    for (key, t) in self.procs.iter_mut().filter(|(k, t)| k.1 == e.device && !t.off) {
                        t.batch.push(Item::Capacity(capacity(state, *key, t.fresh, free)));
                    }
                }
            }
            _ => {}
        }
    }

    fn for_pid(&mut self, pid: u32, f: impl Fn(&mut Tracked)) {
        for (_, t) in self.procs.iter_mut().filter(|(k, t)| k.0 == pid && !t.off) {
            f(t);
        }
    }

    /// Ends a process's prediction: what it queued is let go, its worker state dropped.
    fn stop(&mut self, key: Key) {
        if let Some(t) = self.procs.get_mut(&key) {
            if !t.off {
                t.off = true;
                t.batch = Vec::new();
                t.alloc_of = HashMap::new();
                if let Some(tx) = &self.tx {
                    let _ = tx.send(Job::Stop(key));
                }
            }
        }
        self.ended.insert(key);
    }

    fn send(&mut self, state: &State, key: Key) {
        let Some(t) = self.procs.get_mut(&key) else { return };
        let cap = state.allowed_of(key.0, key.1);
        let job = Job::Requests { key, conf: t.conf.take().map(Box::new), items: std::mem::take(&mut t.batch), cap, ipc: t.ipc };
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }

    /// Hands every process's new requests to the worker (the status tick calls it).
    pub fn flush(&mut self, state: &State) {
        let keys: Vec<Key> = self.procs.iter().filter(|(_, t)| !t.off && !t.batch.is_empty()).map(|(k, _)| *k).collect();
        for key in keys {
            self.send(state, key);
        }
    }

    /// The worker's answers so far (none blocks); answers for processes whose prediction ended
    /// are dropped.
    pub fn said(&mut self) -> Vec<Said> {
        let mut out = Vec::new();
        while let Ok(s) = self.rx.try_recv() {
            if self.ended.contains(&s.key) {
                continue;
            }
            match &s.result {
                Ok(_) => {
                    self.forecasted.insert(s.key);
                    self.notes.remove(&s.key);
                }
                Err(n) => {
                    let n = n.clone();
                    self.note(s.key, n);
                }
            }
            out.push(s);
        }
        out
    }

    /// Hands over what is queued, waits for the worker to answer all of it, and stops it.
    pub fn finish(&mut self, state: &State) -> Vec<Said> {
        self.flush(state);
        self.tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        self.said()
    }

    /// Notes for the summary: each process traced at block level that got no prediction, why;
    /// each process of `state` with memory on a device and no block events, that it has none.
    pub fn summary_notes(&self, state: &State) -> Vec<String> {
        let mut out = Vec::new();
        if self.horizon == 0 {
            out.push("foresight: off (--foresight-steps 0): no process's coming peak was predicted".to_string());
            return out;
        }
        for (key, s) in &state.spaces {
            if !self.procs.contains_key(key) && s.map.figures().reserved > 0 && state.forecast_of(key.0, key.1).is_none() {
                out.push(format!(
                    "foresight for process {} on device {}: no prediction: no caching-allocator block events (its segments only), so no step to find",
                    key.0, key.1
                ));
            }
        }
        for (key, note) in &self.notes {
            if self.forecasted.contains(key) {
                out.push(format!("foresight for process {} on device {}: the prediction stopped: {note}", key.0, key.1));
            } else {
                out.push(format!("foresight for process {} on device {}: no prediction: {note}", key.0, key.1));
            }
        }
        out
    }
}

/// What the driver can give the process's caching allocator in all, at a reading of the
/// device's `free` bytes: the allocator's segments (those it holds blocks in, and `fresh`, taken
/// since its last request for the next one) + free − the driver's slack (the largest request
/// that succeeds). O(1).
fn capacity(state: &State, key: Key, fresh: u64, free: u64) -> u64 {
    let held = state.spaces.get(&key).map_or(0, |s| s.map.figures().framework_reserved);
    (held + fresh + free).saturating_sub(crate::analysis::DRIVER_SLACK)
}

struct Worked {
    predictor: Predictor,
    /// Requests since the last prediction (or attempt).
    since: usize,
    period: Option<usize>,
}

/// The worker: runs each process's requests through its predictor and predicts once a whole
/// step of new requests came (one prediction per process per round of queued jobs).
fn work(jobs: mpsc::Receiver<Job>, said: mpsc::Sender<Said>, horizon: usize) {
    let mut procs: HashMap<Key, Worked> = HashMap::new();
    while let Ok(first) = jobs.recv() {
        let mut round: BTreeSet<Key> = BTreeSet::new();
        let mut next = Some(first);
        while let Some(job) = next {
            match job {
                Job::Requests { key, conf, items, cap, ipc } => {
                    let w = procs.entry(key).or_insert_with(|| Worked {
                        predictor: Predictor::new(conf.clone().map(|c| *c).unwrap_or_default()),
                        since: 0,
                        period: None,
                    });
                    if ipc {
                        w.predictor.set_ipc_export();
                    }
                    for it in items {
                        match it {
                            Item::Request(r) => {
                                w.since += 1;
                                w.predictor.push(r);
                            }
                            Item::Capacity(c) => {
                                let cap = w.predictor.current_limits().1;
                                w.predictor.set_limits(Some(c), cap);
                            }
                        }
                    }
                    let capacity = w.predictor.current_limits().0;
                    w.predictor.set_limits(capacity, cap);
                    round.insert(key);
                }
                Job::Stop(key) => {
                    procs.remove(&key);
                    round.remove(&key);
                }
            }
            next = jobs.try_recv().ok();
        }
        for key in round {
            let Some(w) = procs.get_mut(&key) else { continue };
            // what the allocator may hold: what the driver can give it, or its cap if less
            let (device, cap) = w.predictor.current_limits();
            let available = match (cap, device) {
                (Some(c), Some(d)) if d < c => Some(Available::Device(d)),
                (Some(c), _) => Some(Available::Cap(c)),
                (None, d) => d.map(Available::Device),
            };
            let due = match w.period {
                Some(p) => w.since >= p,
                None => w.since >= super::MIN_REPEATS * 2,
            };
            if !due {
                continue;
            }
            w.since = 0;
            let result = match available {
                None => {
                    Err("the device's free memory is not known yet (no reading of it) and no cap is set: nothing to predict against".into())
                }
                Some(a) => w.predictor.predict(a, horizon),
            };
            if let Ok(f) = &result {
                w.period = Some(f.step.period);
            }
            if said.send(Said { key, result }).is_err() {
                return;
            }
        }
    }
}
