//! `gpufrag run [OPTIONS] -- CMD ARGS...`: runs CMD under the LD_PRELOAD shim (and, for Python,
//! the start-up hook that brings PyTorch's blocks), keeps the live state, shows a status line,
//! prints each OOM verdict the moment it happens and the summary at exit, and exits with CMD's
//! own code.

use crate::analysis::render::render_after_live;
use crate::consumer::Consumer;
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The summary JSON, the record file, quiet.
    #[command(flatten)]
    pub out: super::LiveArgs,
    /// Trace only CMD itself, not the processes it starts.
    #[arg(long)]
    pub no_follow: bool,
    /// Do not load the Python start-up hook (no PyTorch block-level figures).
    #[arg(long)]
    pub no_python_hook: bool,
    /// Seconds between the Python hook's allocator snapshots.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    pub python_interval: f64,
    /// How PyTorch's blocks are captured: `auto` uses PyTorch's allocator trace tracker (event
    /// level, O(1) per allocation) when its library is cached, else allocator snapshots for this
    /// run while a background process builds the library for the next; `build` builds it first
    /// (once, before the program's first allocation); `off` takes snapshots.
    #[arg(long, value_enum, default_value_t = TorchTracker::Auto, value_name = "WHEN")]
    pub torch_tracker: TorchTracker,
    /// Events each traced process's rings hold, all lanes together (a power of two, default
    /// 1048576; split evenly over GPUFRAG_RING_LANES lanes, 16 by default); when full, events are
    /// dropped and counted, never waited for.
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
    /// Whether CMD's own stdout and stderr are shown (the demo hides the simulator's lines).
    #[arg(skip = true)]
    pub program_output: bool,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// When `run` uses PyTorch's allocator trace tracker (python/torch_tracker.cpp).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchTracker {
    /// The tracker when its library is cached; else snapshots, and the library built in the
    /// background for the next run.
    Auto,
    /// Build the library now if it is not cached (the program waits for it once).
    Build,
    /// Snapshots only.
    Off,
}

impl TorchTracker {
    /// The value the Python hook reads (GPUFRAG_TORCH_TRACKER).
    fn env(self) -> &'static str {
        match self {
            TorchTracker::Auto => "auto",
            TorchTracker::Build => "build",
            TorchTracker::Off => "off",
        }
    }
}

/// The Python start-up hook (python/: the entry point, its package, and the trace tracker's
/// source and translation header, which the hook builds: see python/torch_tracker.cpp), written
/// into the consumer's private directory by their paths under python/.
const PYTHON_HOOK: [(&str, &str); 10] = [
    ("sitecustomize.py", include_str!("../../python/sitecustomize.py")),
    ("_gpufrag/__init__.py", include_str!("../../python/_gpufrag/__init__.py")),
    ("_gpufrag/conn.py", include_str!("../../python/_gpufrag/conn.py")),
    ("_gpufrag/frameworks.py", include_str!("../../python/_gpufrag/frameworks.py")),
    ("_gpufrag/imports.py", include_str!("../../python/_gpufrag/imports.py")),
    ("_gpufrag/oom_errors.py", include_str!("../../python/_gpufrag/oom_errors.py")),
    ("_gpufrag/torch_blocks.py", include_str!("../../python/_gpufrag/torch_blocks.py")),
    ("_gpufrag/tracker.py", include_str!("../../python/_gpufrag/tracker.py")),
    ("torch_tracker.cpp", include_str!("../../python/torch_tracker.cpp")),
    ("torch_trace.h", include_str!("../../python/torch_trace.h")),
];

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
    for cand in
        [dir.join("libgpufrag_preload.so"), dir.join("../deps/libgpufrag_preload.so"), dir.join("../lib/gpufrag/libgpufrag_preload.so")]
    {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
        tried.push(cand.display().to_string());
    }
    bail!(
        "libgpufrag_preload.so not found (looked at {}); build it with `cargo build --release --workspace` or pass --preload",
        tried.join(", ")
    )
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

/// The record file's error, as the summary notes it.
fn live_record_error(summary: &crate::analysis::summary::Summary) -> Option<String> {
    summary.notes.iter().find(|n| n.starts_with("the record file stopped at an error: ")).cloned()
}

fn exit_code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => 1,
    }
}

/// Every argument checked before anything is started or written: numbers, the command, and every
/// output path (issue 14: a bad argument truncated an existing record; a missing directory was
/// found only after the workload ran).
fn check_args(args: &Args) -> anyhow::Result<()> {
    let bad = |m: String| -> anyhow::Result<()> { Err(crate::input::UnusableInput(m).into()) };
    if let Some(c) = args.ring_capacity {
        if !c.is_power_of_two() {
            return bad(format!("--ring-capacity must be a power of two, not {c}"));
        }
    }
    if !(args.python_interval.is_finite() && args.python_interval > 0.0 && args.python_interval <= 86_400.0) {
        return bad(format!("--python-interval {}: give a number of seconds above 0, at most 86400", args.python_interval));
    }
    crate::cli::outputs::check_command(&args.cmd[0])?;
    let views = &args.views;
    let outputs = [
        ("--record", args.out.record.clone()),
        ("--summary-json", args.out.summary_json.clone()),
        ("--memviz", views.memviz.clone()),
        (
            "--report",
            if views.no_report {
                None
            } else {
                crate::views::postmortem::report_path(views.report.as_deref(), args.out.summary_json.as_deref())
            },
        ),
        ("--feed", views.feed.clone()),
    ];
    for (flag, path) in &outputs {
        if let Some(p) = path {
            crate::cli::outputs::check_output(flag, p)?;
        }
    }
    let named: Vec<(&str, &Path)> = outputs.iter().filter_map(|(f, p)| Some((*f, p.as_deref()?))).collect();
    let mut inputs: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(p) = &args.preload {
        inputs.push(("--preload", p.clone()));
    }
    if Path::new(&args.cmd[0]).components().count() > 1 {
        inputs.push(("CMD", PathBuf::from(&args.cmd[0])));
    }
    let inputs: Vec<(&str, &Path)> = inputs.iter().map(|(f, p)| (*f, p.as_path())).collect();
    crate::cli::outputs::check_distinct(&named, &inputs)?;
    if let Some(p) = &views.feed {
        use std::os::unix::fs::FileTypeExt;
        if std::fs::symlink_metadata(p).is_ok_and(|m| !m.file_type().is_socket()) {
            return bad(format!("--feed {}: exists and is not a socket; it is left as it is", p.display()));
        }
    }
    Ok(())
}

/// Messages applied between two looks at the child and the clock.
const RECV_BATCH: usize = 4096;

/// Runs `run`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    check_args(args)?;
    let preload = find_preload(args.preload.as_deref())?;
    let consumer = Consumer::start(1 << 16).context("starting the consumer socket")?;
    let mut cmd = Command::new(&args.cmd[0]);
    cmd.args(&args.cmd[1..]);
    cmd.env("LD_PRELOAD", prepend_path("LD_PRELOAD", &preload));
    cmd.env("GPUFRAG_SOCK", consumer.socket_path());
    cmd.env("GPUFRAG_CONSUMER_PID", std::process::id().to_string());
    if !args.program_output {
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    }
    if args.no_follow {
        cmd.env("GPUFRAG_NO_FOLLOW", "1");
    }
    if let Some(c) = args.ring_capacity {
        cmd.env("GPUFRAG_RING_CAPACITY", c.to_string());
    }
    if !args.no_python_hook {
        let dir = consumer.dir().join("python");
        for (name, text) in PYTHON_HOOK {
            let file = dir.join(name);
            file.parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&file, text))
                .with_context(|| format!("writing the Python hook {}", file.display()))?;
        }
        cmd.env("GPUFRAG_TORCH_TRACKER", args.torch_tracker.env());
        cmd.env("PYTHONPATH", prepend_path("PYTHONPATH", &dir));
        cmd.env("GPUFRAG_PY_INTERVAL", args.python_interval.to_string());
    }
    let mut live = args.out.live(&args.export, &args.views)?;
    // SAFETY: installs plain handlers; forward_signal only calls kill.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward_signal as *const () as libc::sighandler_t);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let name = args.cmd[0].to_string_lossy();
            if let Some(n) = super::NotStarted::from_spawn(&name, &e) {
                return Err(n.into());
            }
            return Err(anyhow::Error::new(e).context(format!("starting {name}")));
        }
    };
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    live.capture_started();
    let tty = std::io::stderr().is_terminal() && !args.out.quiet;
    let rx = consumer.receiver().clone();
    let mut last_status = Instant::now();
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => {
                live.handle(m);
                // What else is queued, before the periodic work and the look at the child: one
                // `wait4` and one clock read per message cost this thread as much as applying
                // the message, and it shares the machine with the drainer and the program.
                for m in rx.try_iter().take(RECV_BATCH) {
                    live.handle(m);
                }
            }
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
    let mut summary = live.summary(&source)?;
    summary.capture = Some("shim".into());
    if tty {
        eprint!("\r\x1b[K");
    }
    if !args.out.quiet {
        eprint!("\n[gpufrag] summary\n{}", crate::terminal::escape(&render_after_live(&summary)));
    }
    let code = exit_code_of(status);
    if let Some(p) = &args.out.summary_json {
        // A write error names the file, leaves no partial file of its own making (a path that
        // existed before is never removed), and keeps CMD's exit code (the run itself happened).
        let existed = std::fs::symlink_metadata(p).is_ok();
        let written = serde_json::to_vec_pretty(&summary).map_err(std::io::Error::from).and_then(|mut b| {
            b.push(b'\n');
            std::fs::write(p, b)
        });
        if let Err(e) = written {
            if !existed {
                let _ = std::fs::remove_file(p);
            }
            eprintln!("gpufrag: writing the summary {}: {e}", p.display());
            return Ok(ExitCode::from(if code == 0 { 1 } else { code }));
        }
    }
    if let Some(e) = &live_record_error(&summary) {
        eprintln!("gpufrag: {e}");
    }
    Ok(ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    use super::PYTHON_HOOK;

    /// Every file of python/ is written out with the hook (a module left out of the list would
    /// fail to import in the traced program, and the hook swallows its own errors).
    #[test]
    fn the_python_hook_written_out_is_every_file_of_python() {
        fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).expect("python/") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    if p.file_name().is_some_and(|n| n != "__pycache__") {
                        walk(&p, base, out);
                    }
                } else {
                    out.push(p.strip_prefix(base).expect("under python/").to_string_lossy().into_owned());
                }
            }
        }
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
        let mut on_disk = Vec::new();
        walk(&base, &base, &mut on_disk);
        on_disk.sort();
        let mut listed: Vec<String> = PYTHON_HOOK.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(listed, on_disk, "src/cli/run.rs's PYTHON_HOOK against the files of python/");
    }
}
