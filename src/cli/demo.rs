//! `gpufrag demo`: the whole story on any machine, no GPU needed. Runs the simcuda stand-in's
//! `frag-oom` workload (the H200 fragmentation OOM, reproduced by a small caching allocator) under
//! the LD_PRELOAD shim: the live line, the OOM the moment it happens, the verdict and the fix
//! (the simulated program's own lines only with `--program-output`). It ends on its point: the
//! last lines are the verdict, the fix as a command to copy and the report's path, bold and
//! coloured on a terminal (`NO_COLOR` honoured). Each scenario shows only the OOM it exists to
//! show (small-pages fills the device to the last page the driver grants, `small-pages fit`,
//! instead of until an allocation fails).
//! `--print-env` prints what to export to run your own program against the stand-ins.

use super::run;
use crate::analysis::summary::Summary;
use crate::units::human_bytes;
use crate::views::point;
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the environment that points programs at the simcuda stand-ins, and exit.
    #[arg(long)]
    pub print_env: bool,
    /// Which workload: frag-oom (a fragmentation OOM) or small-pages (sub-2 MiB allocations
    /// strand 2 MiB pages).
    #[arg(long, default_value = "frag-oom")]
    pub scenario: String,
    /// Simulated device memory.
    #[arg(long, default_value = "16GiB")]
    pub mem: String,
    /// Show the simulated program's own output (its RESULT/EVENT lines and its PyTorch-style
    /// OOM message) as well.
    #[arg(long)]
    pub program_output: bool,
    /// Write the summary as JSON.
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
}

/// Where the stand-ins live: `simcuda/` and `simcuda-workload` next to this executable (cargo's
/// target directory, where `cargo build --workspace` puts them).
fn simcuda_dir() -> anyhow::Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let libs = dir.join("simcuda");
    let workload = dir.join("simcuda-workload");
    if !libs.join("libcuda.so.1").exists() || !workload.is_file() {
        bail!(
            "the simcuda stand-ins are not built next to {} (expected {} and {}); run `cargo build --release --workspace`",
            exe.display(),
            libs.display(),
            workload.display()
        );
    }
    Ok((libs, workload))
}

/// Runs `demo`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (libs, workload) = simcuda_dir()?;
    let state_dir = std::env::temp_dir().join(format!("gpufrag-demo-{}", std::process::id()));
    if args.print_env {
        println!("export LD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}", libs.display());
        println!("export SIMCUDA_MEM={}", args.mem);
        println!("export SIMCUDA_STATE_DIR={}", std::env::temp_dir().join("simcuda-demo").display());
        println!("# then: gpufrag run -- YOUR_CUDA_PROGRAM   (or {} frag-oom)", workload.display());
        return Ok(ExitCode::SUCCESS);
    }
    let scenario = match args.scenario.as_str() {
        "frag-oom" | "small-pages" => args.scenario.clone(),
        other => bail!("unknown scenario {other:?}: frag-oom or small-pages"),
    };
    std::env::set_var("SIMCUDA_MEM", &args.mem);
    std::env::set_var("SIMCUDA_STATE_DIR", &state_dir);
    std::env::set_var("LD_LIBRARY_PATH", &libs);
    // gpufrag's own NVML is simcuda's too (this process's library path was read at its start, so
    // it is named by path): the demo's GPU then has the name, UUID and per-process figures the
    // stand-in driver gives it, as a real GPU has under NVML.
    let nvml = libs.join("libnvidia-ml.so.1");
    std::env::set_var("GPUFRAG_NVML_LIB", &nvml);
    eprintln!(
        "[gpufrag] demo: {scenario} on a simulated {} GPU (simcuda), traced by the LD_PRELOAD shim{}\n",
        args.mem,
        if args.program_output { "; the program's own output is mixed in" } else { " (--program-output shows the program's own lines)" }
    );
    // The summary is read back for the last lines: the user's file, else one in the state dir.
    // A private folder (0700, ours, no symlink followed): TMPDIR may be shared with other users.
    crate::private::PrivateDir::ensure(&state_dir).map_err(|e| anyhow::anyhow!("the demo's folder: {e}"))?;
    let summary_json = args.summary_json.clone().unwrap_or_else(|| state_dir.join("summary.json"));
    // Beside the user's summary as `run` puts it (never in a folder other users share, /tmp, or
    // a device folder, /dev/stdout's), else where every run's OOM report goes (the private
    // state folder, never the current directory: the demo leaves no file there).
    let beside = args.summary_json.as_deref().and_then(|s| crate::views::postmortem::report_path(None, Some(s)));
    let (report, no_report) = match beside {
        Some(r) => (Some(std::path::absolute(&r).unwrap_or(r)), None),
        None => match crate::private::state_dir().map(|d| crate::private::PrivateDir::ensure(&d)) {
            Some(Ok(d)) => (Some(d.join("demo-report.html")), None),
            Some(Err(e)) => (None, Some(format!("no OOM report written: {e}; give --summary-json PATH to have it beside that"))),
            None => (None, Some("no OOM report written: there is no state folder ($XDG_STATE_HOME and $HOME are unset); give --summary-json PATH to have it beside that".to_string())),
        },
    };
    let mut cmd = vec![OsString::from(workload.as_os_str()), OsString::from(&scenario)];
    if scenario == "small-pages" {
        cmd.push("fit".into());
    }
    let run_args = run::Args {
        torch_tracker: run::TorchTracker::Off,
        out: super::LiveArgs {
            summary_json: Some(summary_json.clone()),
            record: None,
            quiet: false,
            foresight_steps: crate::foresight::HORIZON,
        },
        no_follow: false,
        no_python_hook: true,
        python_interval: 1.0,
        ring_capacity: None,
        preload: None,
        export: crate::export::ExportArgs { nvml_lib: Some(nvml.display().to_string()), ..Default::default() },
        views: crate::views::ViewArgs { report: report.clone(), ..Default::default() },
        program_output: args.program_output,
        cmd,
    };
    let code = run::run(&run_args);
    let ending = std::fs::read_to_string(&summary_json)
        .ok()
        .and_then(|t| serde_json::from_str::<Summary>(&t).ok())
        .map(|s| ending(&s, report.as_deref(), no_report.as_deref(), Style::for_stderr()));
    let _ = std::fs::remove_dir_all(&state_dir);
    if let Some(text) = ending {
        eprint!("{text}");
    }
    code
}

/// Bold and colour on a terminal, none under `NO_COLOR` (any non-empty value) or into a file.
#[derive(Clone, Copy)]
struct Style {
    on: bool,
}

impl Style {
    fn for_stderr() -> Style {
        Style { on: std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) }
    }

    /// `text` in SGR `codes` (then reset), or plain.
    fn paint(self, codes: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{codes}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// The demo's last lines: the verdict of the OOM it shows (the last one), free in all against the
/// largest piece, the fix as a command to copy and the report's path.
fn ending(s: &Summary, report: Option<&Path>, no_report: Option<&str>, style: Style) -> String {
    let Some(o) = s.ooms.last() else {
        return format!("\n{} no allocation failed (the scenario should end in an OOM)\n", style.paint("1;33", "[gpufrag] verdict:"));
    };
    let (free_all, largest) = point::free_pieces(o);
    let mut out = String::from("\n");
    out += &format!("{} {}\n", style.paint("1", "[gpufrag] verdict:"), style.paint("1;31", &point::headline(o)));
    out += &format!("          {} free in all, the largest free piece {}\n", human_bytes(free_all), human_bytes(largest));
    match point::fix_command(o) {
        Some(c) => out += &format!("{} {}\n", style.paint("1", "[gpufrag] fix:    "), style.paint("1;32", &c)),
        None => out += &format!("{} {}\n", style.paint("1", "[gpufrag] fix:    "), style.paint("1;32", &point::fix_short(o))),
    }
    match report.filter(|r| r.is_file()) {
        Some(report) => out += &format!("{} {}\n", style.paint("1", "[gpufrag] report: "), style.paint("4", &report.display().to_string())),
        None => out += &format!("[gpufrag] {}\n", no_report.unwrap_or("no OOM report written")),
    }
    out
}
