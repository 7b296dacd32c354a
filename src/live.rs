//! The live pipeline that `run`, `attach` and `agent` share ([`Live`]): every message a source
//! hands over (the consumer's channel for the shim and the Python hook, the eBPF session's
//! returned messages) is applied to the [`State`], written to the record file and given to the
//! observers (exporters, live feed, report writers); each OOM verdict is printed the moment the
//! state decides it is one (crate::ingest::oom_rule: a failed driver call waits for its retry or
//! its framework's report); the status line and the summary come from here.

use crate::analysis::summary::Summary;
use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FAILED};
use crate::ingest::State;
use crate::record;
use crate::source::{now_ns, Msg};
use crate::units::human_bytes as h;
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
    /// The live prediction of each PyTorch process's coming peak (`crate::foresight::watch`):
    /// fed each applied event, its worker's forecasts applied as events.
    foresight: crate::foresight::watch::Watch,
    /// Per process: the steps ahead of the last warning printed.
    warned: BTreeMap<(u32, i16), u64>,
}

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
        let ooms = self.state.ooms.len();
        self.state.apply_text(e, text);
        if self.state.ooms.len() > ooms && e.pid != 0 {
            // Who else holds the GPU, as NVML lists it right now (crate::ingest::holders), and the
            // sharing layer's limit the process runs under (crate::limits).
            if let Some(o) = self.state.ooms.last_mut() {
                self.holder_reader.add(&mut o.shared.holders, o.pid, o.device);
                o.shared.limit =
                    self.attribution.limit_on(o.pid, o.device).map(|l| crate::limits::LimitHit::judge(&l, o.figures.reserved, o.requested));
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

    /// Applies one source's message.
    pub fn handle(&mut self, m: Msg) {
        match m {
            Msg::Event(e) => self.apply(&e),
            Msg::Fact { event, text } => self.apply_text(&event, text.as_bytes()),
            Msg::Connected { hello, proc } => {
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
            Msg::PyOom { pid, device, requested, device_free, allowed } => {
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
            Msg::FrameworkOom { pid, framework, device, requested, device_free, requested_text } => {
                if let Some(t) = requested_text {
                    self.warnings.push(format!(
                        "pid {pid}: the {} OOM's requested size {requested} B is parsed from the error message's \"{t}\", which is rounded (two decimals of its unit): the program's own request may differ by up to half the last digit",
                        framework.allocator()
                    ));
                }
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
                if let (crate::alloc::Framework::Xla, Some(r)) = (framework, self.framework_reports.get(&(pid, device, framework, "oom"))) {
                    let st = |k: &str| r.stats.get(k).copied().unwrap_or(0);
                    let figures = Event {
                        ts_ns: e.ts_ns,
                        size: st("pool_bytes"),
                        requested: st("bytes_in_use"),
                        handle: st("largest_free_block_bytes"),
                        flags: framework.flags(),
                        ..Event::new(EventKind::FrameworkFigures, pid, device)
                    };
                    self.apply(&figures);
                }
            }
            Msg::Named { pid, name } => {
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
        while self.oom_seen < self.state.oom_log().len() {
            let i = self.state.oom_log()[self.oom_seen];
            self.oom_seen += 1;
            if self.state.ooms[i].device_free_source != crate::ingest::DeviceFreeSource::FailureEvent {
                self.held_ooms.push((i, Instant::now()));
                continue;
            }
            self.print_oom(i);
        }
        self.flush_held_ooms(false);
    }

    /// Prints held OOMs whose reading window passed ([`READING_HOLD`]; all of them with `all`).
    fn flush_held_ooms(&mut self, all: bool) {
        let due: Vec<usize> = self.held_ooms.iter().filter(|(_, t)| all || t.elapsed() >= READING_HOLD).map(|&(i, _)| i).collect();
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
                        h(peak),
                        h(f.available),
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
        // The live line as it stood at the failure stays on screen above the verdict.
        let clear = if std::io::stderr().is_terminal() { "\r\x1b[K" } else { "" };
        eprintln!(
            "{clear}{}\n[gpufrag] OOM in pid {} on device {}: {} requested: {}\n[gpufrag]   {}\n[gpufrag]   fix: {}",
            self.status_line(),
            o.pid,
            o.device,
            h(o.requested),
            inputs.verdict().name(),
            inputs.explanation(),
            inputs.fix()
        );
    }

    /// Gives every observer the current state.
    pub fn tick(&mut self) {
        self.report_new_ooms();
        for o in self.observers.iter_mut() {
            o.tick(&self.state);
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
                h(f.reserved),
                h(f.allocated),
                h(f.largest_free_block),
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
        if self.python_pids.is_empty() && s.devices.iter().any(|d| d.level == "segment") {
            s.notes.push(
                "segment level only: no caching allocator's blocks were seen, so allocated equals reserved and nothing counts as stranded"
                    .into(),
            );
        }
        for r in self.framework_reports.values() {
            s.notes.push(format!("reported by the framework itself: {}", r.line()));
        }
        if s.ooms.iter().any(|o| o.framework == Some(crate::alloc::Framework::Xla))
            && self.framework_reports.keys().any(|k| k.2 == crate::alloc::Framework::Xla && k.3 == "oom")
        {
            s.notes.push("an XLA OOM's figures (pool, in use, free, largest free chunk) are jax.Device.memory_stats() read right after the failure (recorded as a framework_figures event: a replay of the record gives the same)".into());
        }
        s.framework_stats = self.framework_reports.values().cloned().collect();
        if let Some(r) = self.record.as_ref().filter(|r| r.rotations > 0) {
            s.notes.push(format!("the record file reached its size cap and rotated {} time(s): the part before the current one is kept as FILE.1, older parts were let go; a part after the first starts mid-stream", r.rotations));
        }
        if let Some(e) = &self.record_error {
            s.notes.push(format!("the record file stopped at an error: {e}"));
        }
        for w in &self.warnings {
            s.notes.push(w.clone());
        }
        s.notes.extend(self.attribution.notes());
        s.notes.extend(self.holder_reader.notes());
        s.notes.extend(self.foresight.summary_notes(&self.state));
        s.attribute(&self.state, &self.attribution);
        Ok(s)
    }
}

/// The allocator settings in a process's environment block (NUL-separated `KEY=value`), as
/// PyTorch reads them: the first of `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF` that is set;
/// `""` (PyTorch's defaults) when neither is; `None` when the environment could not be read.
fn alloc_conf_of(environ: &Result<Vec<u8>, String>) -> Option<String> {
    let env = environ.as_ref().ok()?;
    let set = ["PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF="].iter().find_map(|key| {
        env.split(|&b| b == 0).find_map(|kv| kv.strip_prefix(key.as_bytes())).map(|v| String::from_utf8_lossy(v).into_owned())
    });
    Some(set.unwrap_or_default())
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
