//! `gpufrag agent`: traces every GPU process of the node through eBPF: every libcuda file that a
//! process maps (in any container, reached through `/proc/PID/root`) is probed once, new
//! processes and libraries are noticed within a scan interval, and an exited process's maps are
//! dropped so that a long-running agent stays bounded. The state feeds the same `Live` as `run`
//! and `attach` (status line, OOM verdicts, record file, exporters, the views' live feed).

use crate::cli::attach::{probe_error, trace, LoopOptions};
use crate::cli::run::Live;
use crate::ebpf::session::{Session, SessionOptions, Target};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the summary as JSON when the agent stops (the schema of `analyze --json`, plus
    /// `coverage`).
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
    /// Write every event to a record file.
    #[arg(long, value_name = "PATH")]
    pub record: Option<PathBuf>,
    /// No live status line and no summary on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Keep exited processes' final maps (for the summary) instead of dropping them.
    #[arg(long)]
    pub keep_exited: bool,
    /// Also probe this library up front: a libcuda.so* or a libc10_cuda.so* (by file name).
    #[arg(long = "lib", alias = "libcuda", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// Ring buffer bytes (a power of two, at least 4096).
    #[arg(long, value_name = "BYTES")]
    pub ring_bytes: Option<u32>,
    /// Milliseconds between scans of /proc for new processes and libraries.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    pub scan_interval_ms: u64,
    /// Metrics export.
    #[command(flatten)]
    pub export: crate::export::ExportArgs,
    /// Reports and live views.
    #[command(flatten)]
    pub views: crate::views::ViewArgs,
}

/// Runs `agent`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if let Some(n) = args.ring_bytes {
        if !n.is_power_of_two() || n < 4096 {
            anyhow::bail!("--ring-bytes must be a power of two of at least 4096, not {n}");
        }
    }
    let opts = SessionOptions {
        target: Target::All,
        libs: args.libs.clone(),
        scan_interval: Duration::from_millis(args.scan_interval_ms.max(10)),
        ring_bytes: args.ring_bytes,
        forget_on_exit: !args.keep_exited,
        drain_delay: Duration::ZERO,
    };
    let session = Session::start(opts, "gpufrag agent").map_err(probe_error)?;
    let mut live = Live::new(args.record.as_deref(), args.quiet)?;
    live.observers.extend(crate::export::observers(&args.export)?);
    live.observers.extend(crate::views::observers(&args.views, args.summary_json.as_deref())?);
    if !args.quiet {
        eprintln!("[gpufrag] agent: tracing every GPU process ({} probes)", session.link_count());
    }
    let duration = args.duration.filter(|d| d.is_finite() && *d > 0.0).map(Duration::from_secs_f64);
    trace(session, live, LoopOptions { summary_json: args.summary_json.as_deref(), quiet: args.quiet, source: "agent".into(), duration })
}
