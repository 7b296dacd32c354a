//! `gpufrag run [OPTIONS] -- CMD ARGS...`: runs CMD under the LD_PRELOAD shim (and, for Python,
//! the start-up hook that brings PyTorch's blocks), keeps the live state, shows a status line,
//! prints each OOM verdict the moment it happens and the summary at exit, and exits with CMD's
//! own code.

use crate::analysis::render::render;
use crate::analysis::summary::Summary;
use crate::consumer::{self, Consumer, Msg};
use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN, F_FAILED};
use crate::ingest::State;
use crate::record;
use crate::units::human_bytes as h;
use anyhow::{bail, Context};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the summary as JSON (the schema of `analyze --json`).
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
    /// Write every event to a record file that `gpufrag analyze` replays to the same figures.
    #[arg(long, value_name = "PATH")]
    pub record: Option<PathBuf>,
    /// Trace only CMD itself, not the processes it starts.
    #[arg(long)]
    pub no_follow: bool,
    /// Do not load the Python start-up hook (no PyTorch block-level figures).
    #[arg(long)]
    pub no_python_hook: bool,
    /// No live status line and no summary on stderr (files are still written).
    #[arg(long, short)]
    pub quiet: bool,
    /// Seconds between the Python hook's allocator snapshots.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    pub python_interval: f64,
    /// Events each traced process's rings hold, all lanes together (a power of two; split evenly
    /// over GPUFRAG_RING_LANES lanes, 16 by default); when full, events are dropped and counted,
    /// never waited for.
    #[arg(long, value_name = "N")]
    pub ring_capacity: Option<u64>,
    /// The shim to preload (default: libgpufrag_preload.so next to this executable).
    #[arg(long, value_name = "PATH", env = "GPUFRAG_PRELOAD")]
    pub preload: Option<PathBuf>,
    /// Metrics export.
    #[command(flatten)]
    pub export: crate::export::ExportArgs,
    /// Reports and live views.
    #[command(flatten)]
    pub views: crate::views::ViewArgs,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// The Python start-up hook, written into the consumer's private directory.
const PYTHON_HOOK: &str = include_str!("../../python/sitecustomize.py");

/// Where the shim is: the flag or env, else next to this executable (cargo's target dir), else
/// `../lib/gpufrag/` (an installed layout).
pub fn find_preload(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("the preload library {} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut tried = Vec::new();
    for cand in [dir.join("libgpufrag_preload.so"), dir.join("../deps/libgpufrag_preload.so"), dir.join("../lib/gpufrag/libgpufrag_preload.so")] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
        tried.push(cand.display().to_string());
    }
    bail!("libgpufrag_preload.so not found (looked at {}); build it with `cargo build --release --workspace` or pass --preload", tried.join(", "))
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

fn prepend_path(var: &str, first: &Path) -> OsString {
    let mut v = OsString::from(first.as_os_str());
    if let Some(old) = std::env::var_os(var).filter(|o| !o.is_empty()) {
        v.push(if var == "LD_PRELOAD" { " " } else { ":" });
        v.push(old);
    }
    v
}

/// The live side of `run` and `attach`: applies messages, records, reports OOMs as they happen.
pub struct Live {
    /// The state.
    pub state: State,
    record: Option<record::Writer<std::fs::File>>,
    record_error: Option<String>,
    /// Processes whose Python hook connected.
    pub python_pids: BTreeSet<u32>,
    /// Warnings for the summary.
    pub warnings: Vec<String>,
    oom_seen: usize,
    quiet: bool,
    /// Processes that connected, with their names.
    pub processes: Vec<(u32, String)>,
    /// Exporters, live feeds, report writers.
    pub observers: Vec<Box<dyn crate::observe::Observer>>,
    /// Driver failures held back: (index in `state.ooms`, when seen).
    pending_ooms: Vec<(usize, Instant)>,
    /// Final OOMs whose device free may still come from a reading that follows the failure
    /// (see `crate::ingest`): printed once [`READING_HOLD`] has passed.
    held_ooms: Vec<(usize, Instant)>,
}

/// How long an OOM without a device free of its own event waits for a reading that follows it
/// before it is printed (the reorder window of the eBPF path plus the reading window).
const READING_HOLD: Duration = Duration::from_millis(300);

/// How long a caching allocator's failed driver call waits for the allocator's own OOM report
/// before it is printed as the verdict.
const OOM_HOLD: Duration = Duration::from_millis(500);

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
        let mut live = Live::new(record, quiet)?;
        live.observers.extend(crate::export::observers(export)?);
        live.observers.extend(crate::views::observers(views, summary_json)?);
        Ok(live)
    }

    /// Once 500 ms have passed since `last`: the periodic work ([`Live::tick`]) and, on a
    /// terminal (`tty`), the status line redrawn in place on stderr.
    pub fn status_tick(&mut self, last: &mut Instant, tty: bool) {
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

    /// A live state; `record` receives every applied event.
    pub fn new(record: Option<&Path>, quiet: bool) -> anyhow::Result<Live> {
        let record = match record {
            Some(p) => Some(record::Writer::create(p).with_context(|| format!("creating the record file {}", p.display()))?),
            None => None,
        };
        Ok(Live { state: State::default(), record, record_error: None, python_pids: BTreeSet::new(), warnings: Vec::new(), oom_seen: 0, quiet, processes: Vec::new(), observers: Vec::new(), pending_ooms: Vec::new(), held_ooms: Vec::new() })
    }

    fn apply(&mut self, e: &Event) {
        self.state.apply(e);
        for o in self.observers.iter_mut() {
            o.event(&self.state, e);
        }
        if let Some(w) = self.record.as_mut() {
            if let Err(err) = w.write(e) {
                self.record_error = Some(err.to_string());
                self.record = None;
            }
        }
    }

    /// Applies one consumer message.
    pub fn handle(&mut self, m: Msg) {
        match m {
            Msg::Event(e) => self.apply(&e),
            Msg::Connected { hello } => {
                self.processes.push((hello.pid, hello.exe_name()));
                self.apply(&Event { ts_ns: consumer::now_ns(), ..Event::new(EventKind::ProcessExec, hello.pid, -1) });
            }
            Msg::Blocks { pid, snapshot } => {
                self.python_pids.insert(pid);
                let events = consumer::blocks::sync_events(&self.state, pid, &snapshot, consumer::now_ns());
                for e in &events {
                    self.apply(e);
                }
            }
            Msg::Armed { pid, device } => {
                // Adopt at address 0: a caching allocator manages this process's memory on the
                // device, so its failed driver calls are retries, not verdicts.
                self.python_pids.insert(pid);
                self.apply(&Event { ts_ns: consumer::now_ns(), ..Event::new(EventKind::Adopt, pid, device) });
            }
            Msg::PyOom { pid, device, requested, device_free } => {
                self.python_pids.insert(pid);
                let e = Event {
                    ts_ns: consumer::now_ns(),
                    requested,
                    device_free,
                    rc: 2,
                    op: EventKind::BlockAlloc as u16,
                    flags: F_DEVICE_FREE_KNOWN | F_FAILED,
                    ..Event::new(EventKind::AllocFailed, pid, device)
                };
                self.apply(&e);
            }
            Msg::Warning(w) => {
                if !self.quiet {
                    eprintln!("gpufrag: {w}");
                }
                self.warnings.push(w);
            }
        }
        self.report_new_ooms();
    }

    fn report_new_ooms(&mut self) {
        while self.oom_seen < self.state.ooms.len() {
            let i = self.oom_seen;
            self.oom_seen += 1;
            let o = &self.state.ooms[i];
            let key = (o.pid, o.device);
            if o.is_framework_retry() {
                // A caching allocator's try: it frees cache and retries, and reports its own OOM
                // if the request fails for good. Held back until that report comes, or until
                // OOM_HOLD passes without one (eBPF has no such report: then this is the verdict).
                self.pending_ooms.retain(|&(j, _)| (self.state.ooms[j].pid, self.state.ooms[j].device) != key);
                self.pending_ooms.push((i, Instant::now()));
                continue;
            }
            self.pending_ooms.retain(|&(j, _)| (self.state.ooms[j].pid, self.state.ooms[j].device) != key);
            if o.device_free_source != crate::ingest::DeviceFreeSource::FailureEvent {
                self.held_ooms.push((i, Instant::now()));
                continue;
            }
            self.print_oom(i);
        }
        self.flush_pending_ooms(false);
    }

    /// Prints held-back driver failures whose allocator said nothing within [`OOM_HOLD`] (all of
    /// them with `all`).
    fn flush_pending_ooms(&mut self, all: bool) {
        let mut due: Vec<usize> = self.pending_ooms.iter().filter(|(_, t)| all || t.elapsed() >= OOM_HOLD).map(|&(i, _)| i).collect();
        due.extend(self.held_ooms.iter().filter(|(_, t)| all || t.elapsed() >= READING_HOLD).map(|&(i, _)| i));
        self.pending_ooms.retain(|(i, _)| !due.contains(i));
        self.held_ooms.retain(|(i, _)| !due.contains(i));
        due.sort_unstable();
        for i in due {
            self.print_oom(i);
        }
    }

    fn print_oom(&self, i: usize) {
        let o = &self.state.ooms[i];
        if self.quiet {
            return;
        }
        let inputs = crate::analysis::OomInputs::of(o);
        let clear = if std::io::stderr().is_terminal() { "\r\x1b[K" } else { "" };
        eprintln!(
            "{clear}[gpufrag] OOM in pid {} on device {}: {} requested: {}\n[gpufrag]   {}\n[gpufrag]   fix: {}",
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
        self.flush_pending_ooms(false);
        for o in self.observers.iter_mut() {
            o.tick(&self.state);
        }
    }

    /// Gives every observer the final state.
    pub fn finish(&mut self) {
        self.flush_pending_ooms(true);
        for o in self.observers.iter_mut() {
            o.finish(&self.state);
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
        format!("[gpufrag] {} | dropped {}", parts.join(" | "), self.state.dropped)
    }

    /// The summary, with notes on how block figures were obtained.
    pub fn summary(&mut self, source: &str) -> anyhow::Result<Summary> {
        if let Some(w) = self.record.as_mut() {
            w.flush().context("flushing the record file")?;
        }
        let mut s = Summary::from_state(&self.state, source);
        if !self.python_pids.is_empty() {
            s.notes.push(format!(
                "block-level figures (allocated, stranded, largest free block) come from PyTorch's allocator snapshots sent by the Python hook of pid {}; segment-level figures from the LD_PRELOAD shim",
                self.python_pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ));
        } else if s.devices.iter().any(|d| d.level == "segment") {
            s.notes.push("segment level only: no caching allocator's blocks were seen, so allocated equals reserved and nothing counts as stranded".into());
        }
        if let Some(e) = &self.record_error {
            s.notes.push(format!("the record file stopped at an error: {e}"));
        }
        for w in &self.warnings {
            s.notes.push(w.clone());
        }
        Ok(s)
    }
}

fn exit_code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => 1,
    }
}

/// Runs `run`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let preload = find_preload(args.preload.as_deref())?;
    let consumer = Consumer::start(1 << 16).context("starting the consumer socket")?;
    let mut cmd = Command::new(&args.cmd[0]);
    cmd.args(&args.cmd[1..]);
    cmd.env("LD_PRELOAD", prepend_path("LD_PRELOAD", &preload));
    cmd.env("GPUFRAG_SOCK", consumer.socket_path());
    cmd.env("GPUFRAG_CONSUMER_PID", std::process::id().to_string());
    if args.no_follow {
        cmd.env("GPUFRAG_NO_FOLLOW", "1");
    }
    if let Some(c) = args.ring_capacity {
        if !c.is_power_of_two() {
            bail!("--ring-capacity must be a power of two, not {c}");
        }
        cmd.env("GPUFRAG_RING_CAPACITY", c.to_string());
    }
    if !args.no_python_hook {
        let dir = consumer.dir().join("python");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("sitecustomize.py"), PYTHON_HOOK)?;
        cmd.env("PYTHONPATH", prepend_path("PYTHONPATH", &dir));
        cmd.env("GPUFRAG_PY_INTERVAL", args.python_interval.to_string());
    }
    let mut live = Live::with_outputs(args.record.as_deref(), args.quiet, &args.export, &args.views, args.summary_json.as_deref())?;
    // SAFETY: installs plain handlers; forward_signal only calls kill.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward_signal as *const () as libc::sighandler_t);
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", args.cmd[0].to_string_lossy()))?;
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    let tty = std::io::stderr().is_terminal() && !args.quiet;
    let rx = consumer.receiver().clone();
    let mut last_status = Instant::now();
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => live.handle(m),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {}
        }
        live.status_tick(&mut last_status, tty);
        if let Some(st) = child.try_wait()? {
            break st;
        }
    };
    CHILD.store(0, Ordering::Relaxed);
    // Let the processes CMD started (and the rings of those that exited) finish talking.
    let deadline = Instant::now() + Duration::from_secs(3);
    while consumer.open_connections() > 0 && Instant::now() < deadline {
        while let Ok(m) = rx.recv_timeout(Duration::from_millis(20)) {
            live.handle(m);
        }
    }
    let rx = consumer.shutdown();
    while let Ok(m) = rx.try_recv() {
        live.handle(m);
    }
    live.finish();
    let source = args.cmd.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
    let summary = live.summary(&source)?;
    if tty {
        eprint!("\r\x1b[K");
    }
    if !args.quiet {
        eprint!("\n[gpufrag] summary\n{}", render(&summary));
    }
    if let Some(p) = &args.summary_json {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        serde_json::to_writer_pretty(f, &summary)?;
    }
    Ok(ExitCode::from(exit_code_of(status)))
}
