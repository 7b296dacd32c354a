//! The command line: argument definitions (clap derive), dispatch to one module per subcommand,
//! and the one place that turns errors into exit codes (unusable input 2, a broken pipe 0, any
//! other failure 1; `run` passes the traced command's own code through).

pub mod agent;
pub mod analyze;
pub mod attach;
pub mod demo;
pub mod docs;
pub mod outputs;
pub mod report;
pub mod run;
pub mod top;
pub mod whatif;

use crate::input::UnusableInput;
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// The outputs every live command (`run`, `attach`, `agent`) shares besides the exporters and
/// views: the summary JSON, the record file, and quiet.
#[derive(clap::Args, Debug, Clone)]
pub struct LiveArgs {
    /// Write the summary as JSON at the end (the schema of `analyze --json`, with `capture`, and
    /// `coverage` for eBPF: docs/metrics.md).
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
    /// Write every event to a record file that `gpufrag analyze` replays to the same figures.
    #[arg(long, value_name = "PATH")]
    pub record: Option<PathBuf>,
    /// No live status line and no summary on stderr (files are still written).
    #[arg(long, short)]
    pub quiet: bool,
    /// Steps ahead that foresight predicts each traced PyTorch process's peak (a warning when
    /// one of them would not fit); 0 turns foresight off.
    #[arg(long, value_name = "N", default_value_t = crate::foresight::HORIZON, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub foresight_steps: usize,
}

impl LiveArgs {
    /// The live pipeline with every output asked for: these, the exporters and the views.
    pub fn live(&self, export: &crate::export::ExportArgs, views: &crate::views::ViewArgs) -> anyhow::Result<crate::live::Live> {
        let mut live = crate::live::Live::with_outputs(self.record.as_deref(), self.quiet, export, views, self.summary_json.as_deref())?;
        live.foresee(self.foresight_steps);
        Ok(live)
    }
}

/// Sets the memory budget of a command that reads a file (`--max-memory`, [`crate::budget`]).
pub fn set_memory_budget(v: Option<&str>) -> anyhow::Result<()> {
    if let Some(v) = v {
        let bytes = crate::units::parse_bytes(v)
            .filter(|&b| b > 0)
            .ok_or_else(|| UnusableInput(format!("--max-memory {v:?}: expected a size in bytes, or with a unit (2GiB, 512MiB)")))?;
        crate::budget::set(bytes);
    }
    Ok(())
}

/// Why GPU jobs die of "out of memory" while nvidia-smi shows free memory.
#[derive(Parser, Debug)]
#[command(name = "gpufrag", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Analyse a PyTorch memory snapshot (.pickle, .pickle.gz) or a gpufrag record file.
    Analyze(analyze::Args),
    /// Run a command under the LD_PRELOAD shim and show where its GPU memory goes.
    Run(run::Args),
    /// Show the whole story on a simulated GPU (no GPU needed).
    Demo(demo::Args),
    /// Write the post-mortem report (one HTML file: memory map, timeline, verdict), the map as
    /// SVG, or a memory_viz pickle, from a snapshot, a record file or a summary JSON.
    Report(report::Args),
    /// Live terminal view of GPU memory per device and process (from `run`'s feed or a replay).
    Top(top::Args),
    /// Trace a running process through eBPF (uprobes, USDT); needs CAP_BPF and CAP_PERFMON.
    Attach(attach::Args),
    /// Trace every GPU process of this node through eBPF; needs CAP_BPF and CAP_PERFMON.
    Agent(agent::Args),
    /// Replay a trace under other allocator settings and memory limits (a simulation of
    /// PyTorch's caching allocator, checked against the trace first).
    Whatif(whatif::Args),
    /// Print shell completions (bash, zsh, fish, elvish, powershell), generated from this CLI.
    Completions(docs::CompletionArgs),
    /// Print the man page gpufrag(1), or with --dir write it and one page per subcommand.
    Man(docs::ManArgs),
}

/// The command `run` was given could not be started: 127 when there is no such command, 126 when
/// it is not executable (the shells' codes), with what to do.
#[derive(Debug)]
pub struct NotStarted {
    /// 127 or 126.
    pub code: u8,
    /// The one-line error.
    pub message: String,
}

impl std::fmt::Display for NotStarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NotStarted {}

impl NotStarted {
    /// The error for starting `cmd` failing with `e`, when the shells have a code for it.
    pub fn from_spawn(cmd: &str, e: &std::io::Error) -> Option<NotStarted> {
        match e.kind() {
            std::io::ErrorKind::NotFound => Some(NotStarted {
                code: 127,
                message: format!("{cmd}: command not found (check its name, or give its path; PATH is searched as the shell does)"),
            }),
            std::io::ErrorKind::PermissionDenied => Some(NotStarted {
                code: 126,
                message: format!(
                    "{cmd}: not executable (chmod +x it, or run it through its interpreter, e.g. `gpufrag run -- python3 {cmd}`)"
                ),
            }),
            _ => None,
        }
    }
}

/// Exit code for an error (docs/operations.md, "Exit codes"): 127/126 when `run`'s command could
/// not be started ([`NotStarted`]), 2 when an [`UnusableInput`] is in its chain, 0 for a closed
/// pipe, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(n) = cause.downcast_ref::<NotStarted>() {
            return n.code;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::BrokenPipe {
                return 0;
            }
        }
        if cause.downcast_ref::<UnusableInput>().is_some() {
            return 2;
        }
    }
    1
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        // Decoding, replay, summary and rendering of an input file: a panic is an input error.
        Command::Analyze(args) => crate::guard::contain(&args.file.clone(), || analyze::run(&args)),
        Command::Run(args) => run::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Report(args) => crate::guard::contain(&args.input.clone(), || report::run(&args)),
        Command::Top(args) => top::run(&args),
        Command::Attach(args) => attach::run(&args),
        Command::Agent(args) => agent::run(&args),
        Command::Whatif(args) => crate::guard::contain(&args.file.clone(), || whatif::run(&args)),
        Command::Completions(args) => docs::completions(&args),
        Command::Man(args) => docs::man(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            let code = exit_code(&err);
            if code != 0 {
                // The message names files and may quote an input: escaped (src/terminal.rs).
                let mut line = format!("gpufrag: {err}");
                for cause in err.chain().skip(1) {
                    line.push_str(&format!(": {cause}"));
                }
                let mut stderr = std::io::stderr().lock();
                let _ = writeln!(stderr, "{}", crate::terminal::escape(&line));
            }
            ExitCode::from(code)
        }
    }
}
