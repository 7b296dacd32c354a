//! `gpufrag attach PID`: traces a process that is already running through eBPF (uprobes on the
//! CUDA driver, USDT probes on PyTorch's allocator), with the same live status line, OOM verdicts,
//! record file and summary as `run`, until the process (and, with `--follow`, its children)
//! ends or the user interrupts. What the process allocated before attaching is not in the trace:
//! the summary says so (`exact: false`, per-process `unattributed` bytes from NVML).
//!
//! The loop itself ([`trace`]) is shared with `gpufrag agent`.

use crate::analysis::render::render_after_live;
use crate::ebpf::session::{Session, SessionOptions, Target};
use crate::ebpf::ProbeError;
use crate::live::Live;
use anyhow::Context;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Arguments of `attach`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The process to trace.
    pub pid: u32,
    /// Trace its children too (those alive now and those it starts).
    #[arg(long)]
    pub follow: bool,
    /// The summary JSON, the record file, quiet.
    #[command(flatten)]
    pub out: super::LiveArgs,
    /// Probes.
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Testing: milliseconds to sleep between ring drains (forces overflow with a small ring).
    #[arg(long, default_value_t = 0, hide = true)]
    pub drain_delay_ms: u64,
    /// Metrics export.
    #[command(flatten)]
    pub export: crate::export::ExportArgs,
    /// Reports and live views.
    #[command(flatten)]
    pub views: crate::views::ViewArgs,
}

/// The probe options `attach` and `agent` share.
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// Also probe this library up front, before a process maps it: a libcuda.so* or a
    /// libc10_cuda.so* (PyTorch's blocks), by file name. Repeatable.
    #[arg(long = "lib", alias = "libcuda", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// Ring buffer bytes between the probes and gpufrag (a power of two, at least 4096); when
    /// full, events are dropped and counted.
    #[arg(long, value_name = "BYTES")]
    pub ring_bytes: Option<u32>,
    /// Milliseconds between scans of /proc for new processes and libraries.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    pub scan_interval_ms: u64,
    /// The node's root file system as mounted into this container (a DaemonSet mounts the
    /// host's / at, say, /host): the libcuda files under it are probed at start too.
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,
}

impl ProbeArgs {
    /// The session these options describe, for `target`; an error names a bad `--ring-bytes`.
    pub fn session_options(&self, target: Target, forget_on_exit: bool, drain_delay: Duration) -> anyhow::Result<SessionOptions> {
        if let Some(h) = &self.host_root {
            if !h.is_dir() {
                anyhow::bail!("--host-root {}: not a directory", h.display());
            }
        }
        if let Some(n) = self.ring_bytes {
            if !n.is_power_of_two() || n < 4096 {
                anyhow::bail!("--ring-bytes must be a power of two of at least 4096, not {n}");
            }
        }
        Ok(SessionOptions {
            target,
            libs: self.libs.clone(),
            scan_interval: Duration::from_millis(self.scan_interval_ms.max(10)),
            ring_bytes: self.ring_bytes,
            forget_on_exit,
            drain_delay,
            host_root: self.host_root.clone(),
            keep_exited_max: usize::MAX,
            exec_hold: None,
            lib_roots: None,
        })
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Turns a probe error into the user's message (privileges name the capabilities).
pub fn probe_error(e: ProbeError) -> anyhow::Error {
    match e {
        ProbeError::Privileges(m) => anyhow::anyhow!("{m}"),
        other => anyhow::Error::new(other),
    }
}

/// What the shared loop needs besides the session.
pub struct LoopOptions<'a> {
    /// Where the summary JSON goes.
    pub summary_json: Option<&'a std::path::Path>,
    /// Quiet.
    pub quiet: bool,
    /// The summary's `source`.
    pub source: String,
    /// Stop after this long (agent `--duration`).
    pub duration: Option<Duration>,
}

/// Runs a session until its target ends (attach), the duration passes, or SIGINT/SIGTERM.
pub fn trace(mut session: Session, mut live: Live, opts: LoopOptions<'_>) -> anyhow::Result<ExitCode> {
    // SAFETY: installs plain handlers that only store to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    for m in session.begin() {
        live.handle(m);
    }
    live.capture_started();
    let tty = std::io::stderr().is_terminal() && !opts.quiet;
    let started = Instant::now();
    let mut last_status = Instant::now();
    loop {
        for m in session.step(Duration::from_millis(100)) {
            live.handle(m);
        }
        for m in session.sample_nvml(&live.state) {
            live.handle(m);
        }
        live.status_tick(&mut last_status, tty);
        if INTERRUPTED.load(Ordering::Relaxed) || opts.duration.is_some_and(|d| started.elapsed() >= d) || !session.target_alive() {
            break;
        }
    }
    for m in session.finish() {
        live.handle(m);
    }
    for m in session.sample_nvml(&live.state) {
        live.handle(m);
    }
    live.finish();
    let mut summary = live.summary(&opts.source)?;
    summary.capture = Some("ebpf".into());
    summary.coverage = Some(session.coverage(&live.state));
    if !session.all_exact() {
        summary.exact = false;
    }
    summary.notes.retain(|n| !n.contains("LD_PRELOAD shim"));
    summary.notes.extend(session.notes.iter().cloned());
    summary.notes.extend(session.coverage_notes(&live.state));
    if tty {
        eprint!("\r\x1b[K");
    }
    if !opts.quiet {
        eprint!("\n[gpufrag] summary\n{}", render_after_live(&summary));
    }
    if let Some(p) = opts.summary_json {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        serde_json::to_writer_pretty(f, &summary)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `attach`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let target = Target::Pid { pid: args.pid, follow: args.follow };
    let opts = args.probe.session_options(target, false, Duration::from_millis(args.drain_delay_ms))?;
    let session = Session::start(opts, "gpufrag attach").map_err(probe_error)?;
    let live = args.out.live(&args.export, &args.views)?;
    if !args.out.quiet {
        eprintln!("[gpufrag] attached to pid {} ({} probes)", args.pid, session.link_count());
        if !session.driver_probed() {
            eprintln!(
                "[gpufrag] pid {} maps no libcuda yet and none was found where it would load one: waiting for it (scanning /proc every {} ms; --lib PATH probes a library up front)",
                args.pid, args.probe.scan_interval_ms
            );
        }
    }
    let source = format!("pid {} ({})", args.pid, crate::ebpf::procfs::exe_name(args.pid));
    trace(session, live, LoopOptions { summary_json: args.out.summary_json.as_deref(), quiet: args.out.quiet, source, duration: None })
}
