//! The live pipeline that `run`, `attach` and `agent` share ([`Live`]): every message a source
//! hands over (the consumer's channel for the shim and the Python hook, the eBPF session's
//! returned messages) is applied to the [`State`], written to the record file and given to the
//! observers (exporters, live feed, report writers); each OOM verdict is printed the moment the
//! state decides it is one (crate::ingest::oom_rule: a failed driver call waits for its retry or
//! its framework's report); the status line and the summary come from here.
//!
//! The computed fix. The events applied are kept (up to [`FIX_EVENTS_KEPT`]) so that the first
//! OOM gets the fix `analyze` computes (crate::sim::verdict: the whatif sweep over the trace up
//! to the failure), simulated on a thread of its own, never on the path that takes events, and
//! waited for at most [`FIX_BOUND`] before the OOM is printed without it. The result is put in
//! the state (`State::computed_fix`), so the live line, the summary, the report and `top` show
//! the one sentence; where it is skipped (the bound passed, the trace past what is kept, the
//! process's blocks not traced from its start), the note says why.

use crate::analysis::summary::Summary;
use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FAILED};
use crate::ingest::State;
use crate::record;
use crate::source::{now_ns, Msg};
use crate::units::human_bytes;
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// The live pipeline of `run`, `attach` and `agent`: applies messages, records, reports OOMs as
/// they happen.
pub struct Live {
    /// The state.
    pub state: State,
    record: Option<record::Rotating>,
    record_error: Option<String>,
    /// Processes whose Python hook connected.
    pub python_pids: BTreeSet<u32>,
    /// Warnings for the summary.
    pub warnings: Vec<String>,
    /// How each Python hook brings its process's PyTorch blocks: (trace tracker, the hook's note).
    pub blocks_sources: BTreeMap<u32, (bool, String)>,
    oom_seen: usize,
    quiet: bool,
    /// Processes that connected, with their names.
    pub processes: std::collections::VecDeque<(u32, String)>,
    /// Exporters, live feeds, report writers.
    pub observers: Vec<Box<dyn crate::observe::Observer>>,
    /// The frameworks' own statistics from Python hooks: the latest per (pid, device, framework)
    /// and kind of read (`periodic`, `oom`, `exit`; any other `when` is kept as `other`), so the
    /// last periodic read survives the one at exit (JAX has freed everything by then).
    pub framework_reports: BTreeMap<(u32, i16, crate::alloc::Framework, &'static str), crate::alloc::FrameworkReport>,
    /// Final OOMs whose device free may still come from a reading that follows the failure
    /// (see `crate::ingest`): printed once [`READING_HOLD`] has passed.
    held_ooms: Vec<(usize, Instant)>,
    /// Who each process is and which node GPU each of its CUDA ordinals is: every event is
    /// filed under the node's GPU index before it is applied.
    pub attribution: crate::attribution::Attribution,
    /// NVML's process list at each OOM: the untraced holders (`crate::ingest::holders`).
    pub holder_reader: crate::ebpf::nvml::HolderReader,
    /// The events applied and their texts (by index), kept for the computed fix; `None` once
    /// [`FIX_EVENTS_KEPT`] were passed or the fix was settled.
    fix_trace: Option<KeptTrace>,
    /// No trace is kept for the computed fix at all ([`Live::without_fix_trace`]: the agent).
    fix_off: bool,
    /// The computed fix's simulation under way, and since when.
    fix_running: Option<(std::sync::mpsc::Receiver<Result<crate::sim::ComputedFix, String>>, Instant)>,
    /// The live prediction of each PyTorch process's coming peak (`crate::foresight::watch`):
    /// fed each applied event, its worker's forecasts applied as events.
    foresight: crate::foresight::watch::Watch,
    /// Per process: the steps ahead of the last warning printed.
    warned: BTreeMap<(u32, i16), u64>,
}

/// The events applied, and the texts of those that have one (by index into them): what a record
/// of the run holds, as [`crate::record::Recording`] does.
type KeptTrace = (Vec<Event>, Vec<(usize, Box<[u8]>)>);

/// How many applied events the live pipeline keeps for the computed fix (80 bytes each): past
/// them the fix is skipped with a note (`gpufrag analyze` of the record computes it).
pub const FIX_EVENTS_KEPT: usize = 1_000_000;

/// How long an OOM waits for its computed fix before it is printed without it (the fix is then
/// skipped, with a note).
pub const FIX_BOUND: Duration = Duration::from_secs(3);

/// How many process names [`Live::processes`] keeps (the most recent).
pub const PROCESSES_KEPT: usize = 4096;

/// How long an OOM without a device free of its own event waits for a reading that follows it
/// before it is printed (the reorder window of the eBPF path plus the reading window).
const READING_HOLD: Duration = Duration::from_millis(300);

impl Live {
    /// A live state with every output the command line asked for: the record file, the metrics
    /// exporters, the reports and live views (`run`, `attach` and `agent` alike).
    pub fn with_outputs(
        record: Option<&Path>,
        quiet: bool,
        export: &crate::export::ExportArgs,
        views: &crate::views::ViewArgs,
        summary_json: Option<&Path>,
    ) -> anyhow::Result<Live> {
        // Every other output is set up (and its arguments checked) before the record file is
        // created: a bad argument must not truncate an existing record.
        let mut observers = crate::export::observers(export)?;
        observers.extend(crate::views::observers(views, summary_json)?);
        let mut live = Live::new(record, quiet)?;
        live.attribution = crate::attribution::Attribution::for_node(export.nvml_lib.as_deref());
        live.holder_reader = crate::ebpf::nvml::HolderReader::new(export.nvml_lib.as_deref());
        live.observers = observers;
        Ok(live)
    }

    /// Once 500 ms have passed since `last`: the periodic work ([`Live::tick`]) and, on a
    /// terminal (`tty`), the status line redrawn in place on stderr.
    pub fn status_tick(&mut self, last: &mut Instant, tty: bool) {
        // The prediction's requests go to its worker about every 100 ms (the loops call this
        // that often), its answers come back as events.
        self.foresight.flush(&self.state);
        let said = self.foresight.said();
        self.apply_forecasts(said);
        if last.elapsed() < Duration::from_millis(500) {
            return;
        }
        *last = Instant::now();
        self.tick();
        if tty {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K{}", self.status_line());
            let _ = e.flush();
        }
    }

    /// Caps the record file at `max_bytes`, rotating it (see [`record::Rotating`]); it restarts
    /// the file.
    pub fn cap_record(&mut self, path: &Path, max_bytes: u64) -> anyhow::Result<()> {
        if self.record.is_some() {
            self.record = Some(
                record::Rotating::create(path, Some(max_bytes)).with_context(|| format!("creating the record file {}", path.display()))?,
            );
        }
        Ok(())
    }

    /// A live state; `record` receives every applied event.
    pub fn new(record: Option<&Path>, quiet: bool) -> anyhow::Result<Live> {
        let record = match record {
            Some(p) => Some(record::Rotating::create(p, None).with_context(|| format!("creating the record file {}", p.display()))?),
            None => None,
        };
        Ok(Live {
            state: State::default(),
            record,
            record_error: None,
            python_pids: BTreeSet::new(),
            warnings: Vec::new(),
            blocks_sources: BTreeMap::new(),
            oom_seen: 0,
            quiet,
            processes: std::collections::VecDeque::new(),
            observers: Vec::new(),
            held_ooms: Vec::new(),
            framework_reports: BTreeMap::new(),
            attribution: crate::attribution::Attribution::for_node(std::env::var("GPUFRAG_NVML_LIB").ok().as_deref()),
            holder_reader: crate::ebpf::nvml::HolderReader::new(std::env::var("GPUFRAG_NVML_LIB").ok().as_deref()),
            fix_trace: Some((Vec::new(), Vec::new())),
            fix_off: false,
            fix_running: None,
            foresight: crate::foresight::watch::Watch::new(),
            warned: BTreeMap::new(),
        })
    }

    /// Reads who a process is when it starts (or is first seen), and files the event under the
    /// node GPU behind the process's CUDA ordinal.
    fn place(&mut self, e: &mut Event) {
        if e.pid == 0 {
            return;
        }
        let fresh = e.kind() == Some(EventKind::ProcessExec);
        if fresh || !self.state.identities.contains_key(&e.pid) {
            let id = if fresh { self.attribution.identify(e.pid) } else { self.attribution.identity(e.pid) };
            for p in self.processes.iter_mut().filter(|p| p.0 == e.pid && (p.1.is_empty() || p.1 == "unknown")) {
                p.1 = id.exe.clone();
            }
            self.state.identities.insert(e.pid, id);
        }
        if e.kind() == Some(EventKind::DeviceUuid) {
            self.attribution.driver_uuid(e.pid, e.device, &crate::attribution::gpu::event_uuid(e));
        }
        e.device = self.attribution.node_device(e.pid, e.device);
    }

    fn apply(&mut self, e: &Event) {
        self.apply_text(e, b"");
    }

    /// Applies an event with its text (a fact: settings, fraction, framework), placed.
    fn apply_text(&mut self, e: &Event, text: &[u8]) {
        let mut e = *e;
        self.place(&mut e);
        self.apply_placed_text(&e, text);
    }

    /// Forgets a process that is gone: its maps and who it was.
    pub fn forget(&mut self, pid: u32) {
        self.state.forget(pid);
        self.attribution.forget(pid);
    }

    /// Applies an event whose device is already the node's GPU index.
    fn apply_placed(&mut self, e: &Event) {
        self.apply_placed_text(e, b"");
    }

    /// Applies an event (and its text) whose device is already the node's GPU index, and records
    /// both.
    fn apply_placed_text(&mut self, e: &Event, text: &[u8]) {
        let text = &text[..text.len().min(u16::MAX as usize)];
        let e = &Event { text_len: text.len() as u16, ..*e };
        // A record part about to fill begins the next with the state before this event, so that
        // each part replays exactly on its own.
        if let Some(w) = self.record.as_mut().filter(|w| w.rotates_before(text.len())) {
            if let Err(err) = w.rotate(e.ts_ns, &self.state.seed_events(e.ts_ns)) {
                self.record_error = Some(err.to_string());
                self.record = None;
            }
        }
        let ooms = self.state.ooms.len();
        self.state.apply_text(e, text);
        self.keep_for_fix(e, text);
        if self.state.ooms.len() > ooms && e.pid != 0 {
            // Who else holds the GPU, as NVML lists it right now (crate::ingest::holders), and the
            // sharing layer's limit the process runs under (crate::limits).
            if let Some(o) = self.state.ooms.last_mut() {
                self.holder_reader.add(&mut o.shared.holders, o.pid, o.device);
                o.shared.limit = self
                    .attribution
                    .limit_on(o.pid, o.device)
                    .map(|l| crate::limits::LimitHit::judge_oom(&l, o.figures.reserved, o.device_free, o.requested));
            }
        }
        self.foresight.observe(&self.state, e);
        for o in self.observers.iter_mut() {
            o.event(&self.state, e);
        }
        if let Some(w) = self.record.as_mut() {
            if let Err(err) = w.write_text(e, text) {
                self.record_error = Some(err.to_string());
                self.record = None;
            }
        }
    }

    /// Foresight predicts `steps` steps ahead (0: off). Before the first event.
    pub fn foresee(&mut self, steps: usize) {
        if steps != crate::foresight::HORIZON {
            self.foresight = crate::foresight::watch::Watch::with_horizon(steps);
        }
    }

    /// The node agent's pipeline: the node's events are not kept for the live computed fix (a
    /// long-running agent's memory stays flat whatever the number of processes it sees, up to
    /// the 1,000,000 events the fix would otherwise keep); each OOM's note says so, and `gpufrag
    /// analyze` of the agent's record computes the fix from the file.
    pub fn without_fix_trace(&mut self) {
        self.fix_trace = None;
        self.fix_off = true;
    }

    /// Keeps an applied event (its index in the stream is its index here, as in the record) for
    /// the computed fix, while the fix is not settled and the bound of what is kept holds.
    fn keep_for_fix(&mut self, e: &Event, text: &[u8]) {
        let Some((events, texts)) = self.fix_trace.as_mut() else { return };
        if events.len() >= FIX_EVENTS_KEPT || events.len() as u64 + 1 != self.state.events {
            self.fix_trace = None;
            if self.state.computed_fix.is_none() {
                self.state.computed_fix = Some(Err(format!(
                    "no simulated fix live: the trace passed the {FIX_EVENTS_KEPT} events the live run keeps for the simulation (gpufrag analyze of the record computes it)"
                )));
            }
            return;
        }
        if !text.is_empty() {
            texts.push((events.len(), text.into()));
        }
        events.push(*e);
    }

    /// Starts the computed fix's simulation for the first OOM the state decided (once), or
    /// settles it at once where it cannot run.
    fn start_fix(&mut self) {
        if self.state.computed_fix.is_some() || self.fix_running.is_some() {
            return;
        }
        let Some(&first) = self.state.oom_log().first() else { return };
        let o = &self.state.ooms[first];
        let framework = o.framework;
        let input = crate::sim::FixInput {
            device: o.device,
            allowed: o.allowed,
            cut: Some(o.event),
            other_allocator: framework.filter(|f| *f != crate::alloc::Framework::PYTORCH),
            missing: o.partial.map(crate::ingest::Partial::missing),
        };
        let Some((events, texts)) = self.fix_trace.take() else {
            if self.fix_off {
                self.state.computed_fix = Some(Err(
                    "no simulated fix live: the node agent does not keep the node's events for the simulation (its memory stays flat over any number of processes); gpufrag analyze of its record (--record) computes it".into(),
                ));
            }
            return;
        };
        let end = (o.event as usize + 1).min(events.len());
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("gpufrag-fix".into()).spawn(move || {
            let fix = crate::sim::compute_fix(&input, || {
                crate::sim::from_events_upto(&events[..end], &texts, None).map_err(|e| format!("the live trace: {e}"))
            });
            let _ = tx.send(fix);
        });
        match spawned {
            Ok(_) => self.fix_running = Some((rx, Instant::now())),
            Err(e) => self.state.computed_fix = Some(Err(format!("no simulated fix live: could not start its thread: {e}"))),
        }
    }

    /// Takes the computed fix when it is done, or settles it as skipped once [`FIX_BOUND`] has
    /// passed (`wait`: block until one of the two). True when it is settled (or none runs).
    fn poll_fix(&mut self, wait: bool) -> bool {
        let Some((rx, since)) = self.fix_running.as_ref() else { return true };
        let left = FIX_BOUND.saturating_sub(since.elapsed());
        let got = if wait { rx.recv_timeout(left).ok() } else { rx.try_recv().ok() };
        let fix = match got {
            Some(f) => f,
            None if since.elapsed() >= FIX_BOUND => Err(format!(
                "no simulated fix live: the simulation did not finish within {} s of the OOM (gpufrag analyze of the record computes it)",
                FIX_BOUND.as_secs()
            )),
            None => return false,
        };
        self.fix_running = None;
        self.state.computed_fix = Some(fix);
        true
    }

    /// Applies one source's message.
    pub fn handle(&mut self, m: Msg) {
        match m {
            Msg::Event(e) => self.apply(&e),
            Msg::Fact { event, text } => self.apply_text(&event, text.as_bytes()),
            Msg::Connected { hello, proc } => self.connected(&hello, proc),
            Msg::Blocks { pid, mut snapshot } => {
                self.python_pids.insert(pid);
                for seg in snapshot.segments.iter_mut() {
                    seg.device = self.attribution.node_device(pid, seg.device);
                }
                let events = crate::consumer::blocks::sync_events(&self.state, pid, &snapshot, now_ns());
                for e in &events {
                    self.apply_placed(e);
                }
            }
            Msg::BlocksSource { pid, tracker, note } => {
                self.python_pids.insert(pid);
                self.blocks_sources.insert(pid, (tracker, note));
            }
            Msg::Armed { pid, device } => {
                // Adopt at address 0: a caching allocator manages this process's memory on the
                // device, so its failed driver calls are retries, not verdicts.
                self.python_pids.insert(pid);
                self.apply(&Event { ts_ns: now_ns(), ..Event::new(EventKind::Adopt, pid, device) });
            }
            Msg::PyOom { pid, device, requested, device_free, allowed } => self.py_oom(pid, device, requested, device_free, allowed),
            Msg::PyOomAllowed { pid, device, requested, allowed } => {
                // An amendment, recorded like any event: it gives the tracker's OOM entry (before
                // or after it in time) its allowed bytes.
                let e = Event {
                    ts_ns: now_ns(),
                    requested,
                    size: allowed,
                    rc: 2,
                    op: EventKind::BlockAlloc as u16,
                    flags: F_FAILED | crate::event::F_ALLOWED_KNOWN | crate::event::F_OOM_AMEND,
                    ..Event::new(EventKind::AllocFailed, pid, device)
                };
                self.apply(&e);
            }
            Msg::FrameworkStats(r) => {
                let when = match r.when.as_str() {
                    "periodic" => "periodic",
                    "oom" => "oom",
                    "exit" => "exit",
                    _ => "other",
                };
                self.framework_reports.insert((r.pid, r.device, r.framework, when), r);
            }
            Msg::FrameworkOom { pid, framework, device, requested, device_free, requested_text, pool_total } => {
                if let Some(t) = requested_text {
                    self.warnings.push(format!(
                        "pid {pid}: the {} OOM's requested size {requested} B is parsed from the error message's \"{t}\", which is rounded (two decimals of its unit): the program's own request may differ by up to half the last digit",
                        framework.allocator()
                    ));
                }
                let ts_ns = self.framework_oom(pid, framework, device, requested, device_free);
                if let Some(total) = pool_total {
                    self.check_pool_total(pid, framework, ts_ns, total);
                }
            }
            Msg::Named { pid, name } => self.named(pid, name),
            Msg::Proc { pid, read } => {
                // The eBPF path reads a process's /proc when its first probe event arrives, before
                // its events are applied: its allocator settings at exec are its environment's
                // PYTORCH_CUDA_ALLOC_CONF, stated as an event (the agent and attach size blocks
                // by them; a record of the agent replays the same).
                if let Some(c) = alloc_conf_of(&read.environ).filter(|_| self.state.settings_of(pid).is_none()) {
                    self.apply_text(&Event { ts_ns: now_ns(), ..Event::new(EventKind::AllocSettings, pid, -1) }, c.as_bytes());
                }
                self.attribution.prefetch(pid, *read)
            }
            Msg::Forget(pid) => self.forget(pid),
            Msg::Warning(w) => {
                if !self.quiet {
                    eprintln!("gpufrag: {w}");
                }
                self.warnings.push(w);
            }
        }
        self.report_new_ooms();
    }

    /// A process connected: its `/proc` read handed to the attribution, an exec after a fork
    /// told apart from a new process, its start stated as an event, and its allocator settings
    /// at exec (from its environment) stated as one too.
    fn connected(&mut self, hello: &crate::hello::Hello, proc: Option<Box<crate::attribution::ProcRead>>) {
        let conf = proc.as_ref().and_then(|p| alloc_conf_of(&p.environ));
        if let Some(p) = proc {
            self.attribution.prefetch(hello.pid, *p);
        }
        // A pid seen before that connects again without the fork flag is the same process
        // after exec: the old image's memory went with it (its maps are dropped, not kept
        // as a false anomaly), and it stays one process (issue 14).
        let exec = hello.flags & crate::hello::HELLO_F_FORKED == 0 && self.processes.iter().any(|(p, _)| *p == hello.pid);
        if exec {
            self.state.forget(hello.pid);
            self.processes.retain(|(p, _)| *p != hello.pid);
        }
        self.name_process(hello.pid, hello.exe_name());
        let ts_ns = now_ns();
        self.apply(&Event { ts_ns, ..Event::new(EventKind::ProcessExec, hello.pid, -1) });
        // Block events that carry only the requested size (the trace tracker's, USDT's)
        // are sized by the process's own allocator settings: its environment at exec, an
        // event like any other (the state notes settings PyTorch would reject, and keeps
        // the defaults: PyTorch itself would not have started).
        if let Some(c) = conf.filter(|_| self.state.settings_of(hello.pid).is_none()) {
            self.apply_text(&Event { ts_ns, ..Event::new(EventKind::AllocSettings, hello.pid, -1) }, c.as_bytes());
        }
    }

    /// PyTorch's OOM observer fired: the failure as an event.
    fn py_oom(&mut self, pid: u32, device: i16, requested: u64, device_free: u64, allowed: Option<u64>) {
        self.python_pids.insert(pid);
        // The allowed bytes, when the hook found a memory fraction set, say exactly whether
        // the allocator's cap refused the request (the verdict compares them with reserved).
        let e = Event {
            ts_ns: now_ns(),
            requested,
            device_free,
            size: allowed.unwrap_or(0),
            rc: 2,
            op: EventKind::BlockAlloc as u16,
            flags: F_DEVICE_FREE_KNOWN | F_FAILED | if allowed.is_some() { crate::event::F_ALLOWED_KNOWN } else { 0 },
            ..Event::new(EventKind::AllocFailed, pid, device)
        };
        self.apply(&e);
    }

    /// A framework's own OOM error: the failure as an event, then the figures the framework
    /// reported right after it (XLA's BFC), as an event too. Returns the failure's time.
    fn framework_oom(
        &mut self,
        pid: u32,
        framework: crate::alloc::Framework,
        device: i16,
        requested: u64,
        device_free: Option<u64>,
    ) -> u64 {
        let e = Event {
            ts_ns: now_ns(),
            requested,
            device_free: device_free.unwrap_or(0),
            rc: 2,
            op: EventKind::BlockAlloc as u16,
            flags: F_FAILED | framework.flags() | if device_free.is_some() { F_DEVICE_FREE_KNOWN } else { 0 },
            ..Event::new(EventKind::AllocFailed, pid, device)
        };
        self.apply(&e);
        // Under `run` XLA's pool is one mapping with nothing visible inside: the OOM's
        // figures are the ones BFC itself reported right after the failure, stated as an
        // event (a replay of the record gives the same verdict).
        let report = self.framework_reports.get(&(pid, device, framework, "oom"));
        if let (Some([pool, in_use, largest]), Some(r)) = (framework.model().oom_report_keys(), report) {
            let st = |k: &str| r.stats.get(k).copied().unwrap_or(0);
            let figures = Event {
                ts_ns: e.ts_ns,
                size: st(pool),
                requested: st(in_use),
                handle: st(largest),
                flags: framework.flags(),
                ..Event::new(EventKind::FrameworkFigures, pid, device)
            };
            self.apply(&figures);
        }
        e.ts_ns
    }

    /// CuPy's error names its pool's total: the map built from its MemoryHook's chunks must hold
    /// the same (a warning says where it does not).
    fn check_pool_total(&mut self, pid: u32, framework: crate::alloc::Framework, ts_ns: u64, total: u64) {
        let o = self.state.ooms.iter().rev().find(|o| o.pid == pid && o.op == Some(EventKind::BlockAlloc) && o.ts_ns == ts_ns);
        if let Some(o) = o.filter(|o| o.figures.reserved != total) {
            self.warnings.push(format!(
                "pid {pid}: {}'s own error gives its pool's total at the OOM as {total} B, the traced reserved is {} B",
                framework.allocator(),
                o.figures.reserved
            ));
        }
    }

    /// A process's name: given to its identity and its entry in the process list when those
    /// have none yet.
    fn named(&mut self, pid: u32, name: String) {
        // A process gone before /proc was read has no name there: the one read early.
        let name = if name.is_empty() || name == "unknown" {
            self.state.identities.get(&pid).map(|i| i.exe.clone()).unwrap_or(name)
        } else {
            name
        };
        if !name.is_empty() {
            if let Some(id) = self.state.identities.get_mut(&pid).filter(|id| id.exe.is_empty() || id.exe == "unknown") {
                std::sync::Arc::make_mut(id).exe = name.clone();
            }
        }
        match self.processes.iter_mut().find(|(p, _)| *p == pid) {
            // Named at its start before its name could be read: the name found later.
            Some((_, known)) if known.is_empty() && !name.is_empty() => *known = name,
            Some(_) => {}
            None => self.name_process(pid, name),
        }
    }

    /// Remembers a process's name; a long-running agent keeps the most recent
    /// [`PROCESSES_KEPT`] only.
    fn name_process(&mut self, pid: u32, name: String) {
        if self.processes.len() >= PROCESSES_KEPT {
            self.processes.pop_front();
        }
        self.processes.push_back((pid, name));
    }

    /// Prints the OOMs the state decided since the last call (crate::ingest::oom_rule decides;
    /// a failed driver call undecided for 500 ms is settled by the clock here). One without a
    /// device free of its own event waits [`READING_HOLD`] for a reading that follows it.
    fn report_new_ooms(&mut self) {
        self.state.settle(now_ns());
        self.start_fix();
        let fix_settled = self.poll_fix(false);
        while self.oom_seen < self.state.oom_log().len() {
            let i = self.state.oom_log()[self.oom_seen];
            self.oom_seen += 1;
            // Held until its reading window passed, and until the computed fix is settled.
            if self.state.ooms[i].device_free_source != crate::ingest::DeviceFreeSource::FailureEvent || !fix_settled {
                self.held_ooms.push((i, Instant::now()));
                continue;
            }
            self.print_oom(i);
        }
        self.flush_held_ooms(false);
    }

    /// Prints held OOMs whose reading window passed ([`READING_HOLD`]; all of them with `all`),
    /// once the computed fix is settled (waited for, within its bound, with `all`).
    fn flush_held_ooms(&mut self, all: bool) {
        if !self.poll_fix(all) {
            return;
        }
        let due: Vec<usize> = self
            .held_ooms
            .iter()
            .filter(|&&(i, t)| {
                all || t.elapsed() >= READING_HOLD || self.state.ooms[i].device_free_source == crate::ingest::DeviceFreeSource::FailureEvent
            })
            .map(|&(i, _)| i)
            .collect();
        self.held_ooms.retain(|(i, _)| !due.contains(i));
        for i in due {
            self.print_oom(i);
        }
    }

    /// States each forecast of the worker as an event (recorded: a record replays to the same
    /// warnings) and prints a warning's line: the first of a process, then each time the step
    /// that does not fit comes nearer.
    fn apply_forecasts(&mut self, said: Vec<crate::foresight::watch::Said>) {
        for s in said {
            let Ok(f) = s.result else { continue };
            let (pid, device) = s.key;
            let (peak, ahead, fix) = match &f.warning {
                Some(w) => (w.predicted_peak, w.steps_ahead as u64, w.fix_text.clone()),
                None => (f.predicted_peak, 0, String::new()),
            };
            let capped = self.state.allowed_of(pid, device).is_some_and(|c| c == f.available);
            let e = Event {
                ts_ns: now_ns(),
                size: peak,
                requested: f.available,
                handle: ahead,
                addr: f.horizon as u64,
                op: u16::from(capped),
                ..Event::new(EventKind::Forecast, pid, device)
            };
            self.apply_placed_text(&e, fix.as_bytes());
            if ahead > 0 && self.warned.get(&s.key).is_none_or(|&last| ahead < last) {
                self.warned.insert(s.key, ahead);
                if !self.quiet {
                    let clear = if std::io::stderr().is_terminal() { "\r\x1b[K" } else { "" };
                    eprintln!(
                        "{clear}[gpufrag] WARNING pid {pid} on device {device}: predicted OOM {ahead} step(s) ahead ({} step: {} requests): peak {} reserved, {} {}; checkpoint now\n[gpufrag]   fix: {fix}",
                        f.step.growth.name(),
                        f.step.period,
                        human_bytes(peak),
                        human_bytes(f.available),
                        if capped { "allowed (its cap)" } else { "available on the device" },
                    );
                }
            }
        }
    }

    fn print_oom(&self, i: usize) {
        let o = &self.state.ooms[i];
        if self.quiet {
            return;
        }
        let inputs = crate::analysis::OomInputs::of(o);
        let verdict = crate::analysis::sharing::verdict(o);
        // The fix the summary gives: the computed one where the simulation ran for this device
        // (crate::sim::verdict), else the verdict's own, with the note saying why not.
        let own = crate::analysis::sharing::fix(o, &inputs);
        let (fix, why_not) = match &self.state.computed_fix {
            Some(Ok(f)) if f.device == o.device => (crate::analysis::summary::fix_text(f, verdict, &own), None),
            Some(Err(note)) => (own, Some(note.as_str())),
            _ => (own, None),
        };
        // The live line as it stood at the failure stays on screen above the verdict.
        let clear = if std::io::stderr().is_terminal() { "\r\x1b[K" } else { "" };
        eprintln!(
            "{clear}{}\n[gpufrag] OOM in pid {} on device {}: {} requested: {}\n[gpufrag]   {}\n[gpufrag]   fix: {}{}",
            self.status_line(),
            o.pid,
            o.device,
            human_bytes(o.requested),
            verdict.name(),
            crate::analysis::sharing::explanation(o, &inputs),
            fix,
            why_not.map_or(String::new(), |n| format!("\n[gpufrag]   ({n})"))
        );
    }

    /// The capture is in place: tells every observer (readiness, for the health endpoint).
    pub fn capture_started(&mut self) {
        for o in self.observers.iter_mut() {
            o.capture_started();
        }
    }

    /// Gives every observer the current state.
    pub fn tick(&mut self) {
        self.refresh_pods();
        self.report_new_ooms();
        // NVML read once here for every view of the state (crate::ingest::gpus).
        self.state.gpus = self.holder_reader.read_gpus();
        for o in self.observers.iter_mut() {
            o.tick(&self.state);
        }
    }

    /// What the kubelet's pod-resources socket said since the last tick, matched against the
    /// processes: their identities as it names them or gives them GPUs.
    fn refresh_pods(&mut self) {
        for (pid, id) in self.attribution.refresh_pods() {
            if self.state.identities.contains_key(&pid) {
                self.state.identities.insert(pid, id);
            }
        }
    }

    /// Gives every observer the final state and ends the record file with its end marker (a
    /// record without one reads as cut).
    pub fn finish(&mut self) {
        // The worker answers what was queued before the end is settled.
        let said = self.foresight.finish(&self.state);
        self.apply_forecasts(said);
        // The end of the run: what nothing recovered is an OOM.
        self.state.settle_all();
        self.report_new_ooms();
        self.flush_held_ooms(true);
        self.state.gpus = self.holder_reader.read_gpus();
        for o in self.observers.iter_mut() {
            o.finish(&self.state);
        }
        if let Some(w) = self.record.as_mut() {
            if let Err(err) = w.finish_at(now_ns()) {
                self.record_error = Some(err.to_string());
                self.record = None;
            }
        }
    }

    /// The one-line status: per device reserved, allocated, largest free block, fragmentation, dropped.
    pub fn status_line(&self) -> String {
        let mut parts = Vec::new();
        for d in self.state.device_ids() {
            let f = self.state.device_figures(d);
            let free = self.state.devices.get(&d).and_then(|t| t.free).unwrap_or(0);
            let frag = crate::analysis::fragmentation(f.largest_free_block, free, f.stranded, f.releasable);
            let level = if f.framework_seen { "" } else { " (segments)" };
            parts.push(format!(
                "gpu{d}: reserved {} allocated {} largest free {} frag {:.2}{level}",
                human_bytes(f.reserved),
                human_bytes(f.allocated),
                human_bytes(f.largest_free_block),
                frag
            ));
        }
        if parts.is_empty() {
            parts.push("no CUDA memory traced yet".into());
        }
        // The same rule as every other output (crate::ingest::oom_rule).
        let ooms = self.state.ooms.iter().filter(|o| o.counts_as_oom()).count();
        let retries = self.state.retries_total();
        let tail = if ooms + retries as usize > 0 { format!(" | ooms {ooms} retries {retries}") } else { String::new() };
        format!("[gpufrag] {} | dropped {}{tail}", parts.join(" | "), self.state.dropped)
    }

    /// The summary, with notes on how block figures were obtained.
    pub fn summary(&mut self, source: &str) -> anyhow::Result<Summary> {
        if let Some(w) = self.record.as_mut() {
            if let Err(e) = w.flush() {
                self.record_error = Some(e.to_string());
                self.record = None;
            }
        }
        let mut s = Summary::from_state(&self.state, source);
        // A record that stopped short cannot replay to these figures.
        s.exact &= self.record_error.is_none();
        let list = |pids: Vec<u32>| pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let (tracked, snapped): (Vec<u32>, Vec<u32>) =
            self.python_pids.iter().partition(|p| self.blocks_sources.get(p).is_some_and(|b| b.0));
        if !tracked.is_empty() {
            s.notes.push(format!(
                "PyTorch blocks: trace tracker (event level): block-level figures (allocated, stranded, largest free block) come from every allocation and free PyTorch's caching allocator made in pid {}, through its allocator trace tracker and the LD_PRELOAD shim",
                list(tracked)
            ));
        }
        if !snapped.is_empty() {
            s.notes.push(format!(
                "block-level figures (allocated, stranded, largest free block) come from PyTorch's allocator snapshots sent by the Python hook of pid {}; segment-level figures from the LD_PRELOAD shim",
                list(snapped)
            ));
        }
        for (pid, (_, note)) in &self.blocks_sources {
            if !note.is_empty() {
                s.notes.push(format!("pid {pid}: {note}"));
            }
        }
        if self.python_pids.is_empty() && s.devices.iter().any(|d| !d.map.framework_seen) {
            s.notes.push(
                "segment level only: no caching allocator's blocks were seen, so allocated equals reserved and nothing counts as stranded"
                    .into(),
            );
        }
        for r in self.framework_reports.values() {
            s.notes.push(format!("reported by the framework itself: {}", r.line()));
        }
        if s.ooms.iter().any(|o| o.framework == Some(crate::alloc::Framework::XLA))
            && self.framework_reports.keys().any(|k| k.2 == crate::alloc::Framework::XLA && k.3 == "oom")
        {
            s.notes.push("an XLA OOM's figures (pool, in use, free, largest free chunk) are jax.Device.memory_stats() read right after the failure (recorded as a framework_figures event: a replay of the record gives the same)".into());
        }
        s.framework_stats = self.framework_reports.values().cloned().collect();
        if let Some(r) = self.record.as_ref().filter(|r| r.rotations > 0) {
            s.notes.push(format!("the record file reached its size cap and rotated {} time(s): the part before the current one is kept as FILE.1, older parts were let go; a part after the first begins with the state at its start (settings, devices, segments and live blocks), so it replays on its own", r.rotations));
        }
        if let Some(e) = &self.record_error {
            s.notes.push(format!("the record file stopped at an error: {e}"));
        }
        for w in &self.warnings {
            s.notes.push(w.clone());
        }
        self.refresh_pods();
        s.notes.extend(self.attribution.notes());
        s.notes.extend(self.holder_reader.notes());
        s.notes.extend(self.foresight.summary_notes(&self.state));
        s.attribute(&self.state, &self.attribution);
        Ok(s)
    }
}

/// The allocator settings a process's environment gives PyTorch (`hello::ALLOC_CONF_KEYS`'s
/// precedence; `""`, PyTorch's defaults, when neither variable is set); `None` when the
/// environment could not be read.
fn alloc_conf_of(environ: &Result<crate::hello::Environ, String>) -> Option<String> {
    environ.as_ref().ok().map(|env| env.alloc_conf().to_string())
}

#[cfg(test)]
mod exec_tests {
    use super::*;
    use crate::hello::{Hello, HELLO_F_FORKED, SOURCE_SHIM};

    fn hello(pid: u32, flags: u32) -> Msg {
        Msg::Connected { hello: Hello { pid, ppid: 1, ring_bytes: 0, start_time: 7, flags, source: SOURCE_SHIM, exe: [0; 24] }, proc: None }
    }

    /// Issue 14: fork + exec under `run` kept the pre-exec image's allocations (a false anomaly,
    /// "NOT exact") and reported the process twice.
    #[test]
    fn regression_exec_drops_the_old_image_and_keeps_one_process() {
        let mut live = Live::new(None, true).expect("live");
        live.handle(hello(9, HELLO_F_FORKED));
        live.handle(Msg::Event(Event { addr: 1 << 40, size: 32 << 20, ..Event::new(EventKind::MemAlloc, 9, 0) }));
        live.handle(hello(9, 0)); // the exec'd image
        live.handle(Msg::Event(Event { addr: 2 << 40, size: 16 << 20, ..Event::new(EventKind::MemAlloc, 9, 0) }));
        live.handle(Msg::Event(Event { addr: 2 << 40, ..Event::new(EventKind::MemFree, 9, -1) }));
        assert_eq!(live.processes.len(), 1, "{:?}", live.processes);
        assert_eq!(live.state.device_figures(0).reserved, 0, "the pre-exec 32 MiB went with the old image");
        assert!(live.state.exact(), "{:?}", live.state.anomalies);
    }
}

#[cfg(test)]
mod rotation_tests {
    use super::*;
    use crate::event::F_DEVICE_FREE_KNOWN;

    const MIB: u64 = 1 << 20;

    type Story = (Vec<((u32, i16), crate::map::Figures)>, Vec<(u32, String, Vec<String>)>);

    /// Each space's figures and each process's settings: what a part's replay must reproduce.
    fn story(s: &State) -> Story {
        let figures = s.spaces.iter().map(|(k, v)| (*k, v.map.figures())).collect();
        let settings = [7u32].iter().filter_map(|&p| s.settings_of(p).map(|x| (p, x.at_start.clone(), x.changes.clone()))).collect();
        (figures, settings)
    }

    /// Issue 23 item 5: a part of a rotated record after the first began mid-stream (frees of
    /// blocks it never saw, figures inexact). Each part now begins with the state at its start:
    /// the last part replays alone to the live state at the end, the part before it to the live
    /// state at the moment it was closed; neither meets an anomaly, across a settings change.
    #[test]
    fn regression_every_part_of_a_rotated_record_replays_on_its_own_to_the_live_state_at_its_end() {
        let dir = std::env::temp_dir().join(format!("gpufrag-rotation-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.rec");
        let mut live = Live::new(Some(&path), true).expect("live");
        live.cap_record(&path, 64 * 80).expect("cap");
        let fact =
            |ts, text: &str| Msg::Fact { event: Event { ts_ns: ts, ..Event::new(EventKind::AllocSettings, 7, -1) }, text: text.into() };
        live.handle(fact(500, "roundup_power2_divisions:2"));
        let info = Event {
            ts_ns: 900,
            size: 16 << 30,
            device_free: 12 << 30,
            flags: F_DEVICE_FREE_KNOWN,
            ..Event::new(EventKind::DeviceInfo, 0, 0)
        };
        live.handle(Msg::Event(info));
        let base = 0x7f00_0000_0000u64;
        let mut ts = 1_000;
        let mut rotations_seen = Vec::new();
        for i in 0..60u64 {
            let seg = base + i * (64 * MIB);
            let mut events = vec![
                Event { addr: seg, size: 20 * MIB, ..Event::new(EventKind::MemAlloc, 7, 0) },
                // Sizes that the settings round differently from the defaults.
                Event { addr: seg, requested: 3 * MIB + 1000 + i, ..Event::new(EventKind::BlockAlloc, 7, 0) },
                Event { addr: seg + 6 * MIB, requested: 5 * MIB + 7, ..Event::new(EventKind::BlockAlloc, 7, 0) },
            ];
            if i % 3 == 0 {
                events.push(Event { addr: seg, ..Event::new(EventKind::BlockFree, 7, -1) });
            }
            for e in events {
                ts += 1_000;
                live.handle(Msg::Event(Event { ts_ns: ts, ..e }));
            }
            if i == 30 {
                ts += 1_000;
                live.handle(fact(ts, "max_split_size_mb:128"));
            }
            rotations_seen.push(live.record.as_ref().map_or(0, |r| r.rotations));
        }
        let rotations = live.record.as_ref().map_or(0, |r| r.rotations);
        assert!(rotations >= 3, "the cap rotates the record several times: {rotations} ({rotations_seen:?})");
        // (finish may still rotate: its last forecasts are events too.)
        live.finish();
        let seeded = live.record.as_ref().map_or(0, |r| r.seed_entries());
        let last = crate::input::load(&path).expect("last part");
        assert!(last.state.anomalies.is_empty(), "{:?}", last.state.anomalies);
        assert_eq!(story(&last.state), story(&live.state), "the last part replays to the live state at the end");
        assert!(last.state.exact(), "the last part is exact on its own");
        let previous = crate::input::load(&record::Rotating::previous_part(&path)).expect("previous part");
        assert!(previous.state.anomalies.is_empty(), "{:?}", previous.state.anomalies);
        // The state when the previous part closed: the current part's seed, replayed alone.
        let mut at_close = State::default();
        for entry in record::Reader::open(&path).expect("reader").take(seeded) {
            let entry = entry.expect("entry");
            at_close.apply_text(&entry.event, entry.text.as_deref().unwrap_or(&[]));
        }
        assert!(seeded > 0 && at_close.anomalies.is_empty(), "a seed of {seeded} entries");
        assert_eq!(story(&previous.state), story(&at_close), "the previous part replays to the live state when it was closed");
        assert!(previous.state.exact(), "the previous part is exact on its own");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
