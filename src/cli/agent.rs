//! `gpufrag agent`: traces every GPU process of the node through eBPF: every libcuda file that a
//! process maps (in any container, reached through `/proc/PID/root`) is probed once, new
//! processes and libraries are noticed within a scan interval, and an exited process's maps are
//! dropped so that a long-running agent stays bounded. The session's messages feed the same `Live` as `run`
//! and `attach` (status line, OOM verdicts, record file, exporters, the views' live feed).

use crate::cli::attach::{probe_error, trace, LoopOptions};
use crate::ebpf::session::{Session, Target};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The summary JSON (written when the agent stops), the record file, quiet.
    #[command(flatten)]
    pub out: super::LiveArgs,
    /// Cap the record file at this many bytes: when full it is renamed to PATH.1 (replacing
    /// the previous part) and a fresh PATH starts, so at most twice this is on disk.
    #[arg(long, value_name = "BYTES", requires = "record")]
    pub record_max_bytes: Option<u64>,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Keep exited processes' final maps (for the summary) instead of dropping them.
    #[arg(long)]
    pub keep_exited: bool,
    /// With --keep-exited: how many exited processes' maps are kept; the oldest beyond it are
    /// let go (and counted in the summary's notes).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub keep_exited_max: usize,
    /// Hold the first exec of each executable the agent has not looked at (fanotify
    /// FAN_OPEN_EXEC_PERM on the node's filesystems) until its annotation probes are in, at
    /// most this many milliseconds; 0 turns the hold off.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub exec_hold_ms: u64,
    /// Also scan this directory at start for the caching allocators' libraries (beside the
    /// node's usual library and Python roots, which are always scanned). Repeatable.
    #[arg(long = "lib-root", value_name = "DIR")]
    pub lib_roots: Vec<std::path::PathBuf>,
    /// The kubelet's pod-resources socket, read for each container's pod, namespace, container
    /// name and assigned GPUs (a bounded call off the event path: at start, on a new container,
    /// every 30 s); `none`, or a socket absent at start, turns it off (the names then come from
    /// the runtime's annotations, else the container's environment).
    #[arg(long, value_name = "PATH", default_value = crate::attribution::podres::DEFAULT_SOCKET)]
    pub pod_resources_socket: std::path::PathBuf,
    /// Testing: each pod-resources call's bound, in milliseconds.
    #[arg(long, hide = true, value_name = "MS", default_value_t = 1000)]
    pub pod_resources_timeout_ms: u64,
    /// Testing: never answer the hold of an executable whose path contains this (only the
    /// timeout, or the agent's end, releases it).
    #[arg(long, hide = true, value_name = "TEXT")]
    pub exec_hold_stall: Option<String>,
    /// Testing: start the outputs (the Prometheus endpoint with its probes), then wait until this
    /// file exists before attaching the eBPF session.
    #[arg(long, hide = true, value_name = "PATH")]
    pub attach_gate: Option<std::path::PathBuf>,
    /// Probes.
    #[command(flatten)]
    pub probe: crate::cli::attach::ProbeArgs,
    /// Metrics export.
    #[command(flatten)]
    pub export: crate::export::ExportArgs,
    /// Reports and live views.
    #[command(flatten)]
    pub views: crate::views::ViewArgs,
}

/// Runs `agent`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut opts = args.probe.session_options(Target::All, !args.keep_exited, Duration::ZERO)?;
    opts.keep_exited_max = args.keep_exited_max;
    opts.lib_roots = Some(args.lib_roots.clone());
    opts.exec_hold = (args.exec_hold_ms > 0).then(|| crate::ebpf::exec_hold::HoldOptions {
        timeout: Duration::from_millis(args.exec_hold_ms),
        stall: args.exec_hold_stall.clone(),
    });
    // The outputs first: the Prometheus endpoint's /healthz answers while the session attaches
    // (which can take a while on a node with many processes and libraries to probe), and its
    // /readyz says not ready until the capture is in place (`trace` says when).
    let mut live = args.out.live(&args.export, &args.views)?;
    live.without_fix_trace();
    if let (Some(path), Some(max)) = (&args.out.record, args.record_max_bytes) {
        live.cap_record(path, max)?;
    }
    live.attribution.set_pod_resources(pod_resources(args));
    if let Some(gate) = &args.attach_gate {
        while !gate.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let session = Session::start(opts, "gpufrag agent").map_err(probe_error)?;
    if !args.out.quiet {
        eprintln!("[gpufrag] agent: tracing every GPU process ({} probes)", session.link_count());
    }
    let duration = args.duration.filter(|d| d.is_finite() && *d > 0.0).map(Duration::from_secs_f64);
    trace(
        session,
        live,
        LoopOptions { summary_json: args.out.summary_json.as_deref(), quiet: args.out.quiet, source: "agent".into(), duration },
    )
}

/// The pod-resources socket's watch, or why it is off.
fn pod_resources(args: &Args) -> Result<crate::attribution::podres::Watch, String> {
    let timeout = Duration::from_millis(args.pod_resources_timeout_ms.clamp(1, 60_000));
    crate::attribution::podres::open(&args.pod_resources_socket, timeout)
}
