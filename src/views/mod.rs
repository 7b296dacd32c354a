//! Views of the state, for people: the post-mortem report (one HTML file: the memory map at the
//! failure, the figures over time, the verdict), the memory map alone as SVG, the export to
//! PyTorch's memory_viz pickle, the live feed that `gpufrag top` reads, and `top` itself.
//!
//! Files: `report.rs` (the HTML page and the loading of any input for it), `map.rs` (the memory
//! map picture), `timeline.rs` (figures over time), `history.rs` (what a picture of a trace keeps
//! event by event), `strip.rs` (the per-segment live share both pictures use), `svg.rs` (shared
//! drawing helpers and the palette), `memviz.rs` + `pickle.rs` (the PyTorch snapshot export),
//! `feed.rs` (the live feed protocol, server and client), `point.rs` (one OOM's
//! headline, free in all against the largest piece, and the fix as a command), `postmortem.rs` (the observers `run`
//! gets from [`ViewArgs`]), `top/` (the terminal UI).

pub mod feed;
pub mod history;
pub mod map;
pub mod memviz;
pub mod pickler;
pub mod point;
pub mod postmortem;
pub mod report;
pub mod strip;
pub mod svg;
pub mod timeline;
pub mod top;

use std::path::{Path, PathBuf};

/// View flags shared by `run` and `attach`.
#[derive(clap::Args, Debug, Clone)]
pub struct ViewArgs {
    /// Write what was captured as a PyTorch memory snapshot pickle (open it in
    /// pytorch.org/memory_viz, or `gpufrag analyze` it); one file per process, `-PID` added to
    /// the name, when several were traced.
    #[arg(long, value_name = "PATH")]
    pub memviz: Option<PathBuf>,
    /// Trace entries kept for --memviz (the oldest go first past it, like PyTorch's max_entries).
    #[arg(long, value_name = "N", default_value_t = memviz::DEFAULT_ENTRIES)]
    pub memviz_entries: usize,
    /// Serve the live feed for `gpufrag top` on this socket (default:
    /// $XDG_RUNTIME_DIR/gpufrag/run-PID.sock, else /tmp/gpufrag-UID/run-PID.sock).
    #[arg(long, value_name = "SOCK", conflicts_with = "no_feed")]
    pub feed: Option<PathBuf>,
    /// Serve no live feed.
    #[arg(long)]
    pub no_feed: bool,
    /// Where to write the HTML report when an allocation fails (default: report.html beside
    /// --summary-json, else gpufrag/report-PID.html, PID the failed process, under
    /// $XDG_STATE_HOME or ~/.local/state).
    #[arg(long, value_name = "PATH", conflicts_with = "no_report")]
    pub report: Option<PathBuf>,
    /// Write no report when an allocation fails.
    #[arg(long)]
    pub no_report: bool,
}

impl Default for ViewArgs {
    fn default() -> Self {
        ViewArgs { memviz: None, memviz_entries: memviz::DEFAULT_ENTRIES, feed: None, no_feed: false, report: None, no_report: false }
    }
}

/// The traced command as this process was asked to run it (what follows `--`), for titles.
fn traced_command() -> String {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--") {
        Some(i) => args[i + 1..].join(" "),
        None => args.join(" "),
    }
}

/// The observers the flags ask for.
pub fn observers(args: &ViewArgs, summary_json: Option<&Path>) -> anyhow::Result<Vec<Box<dyn crate::observe::Observer>>> {
    let mut out: Vec<Box<dyn crate::observe::Observer>> = Vec::new();
    let source = traced_command();
    if !args.no_feed {
        let path = args.feed.clone().unwrap_or_else(feed::default_socket);
        match feed::FeedServer::bind(&path, &source) {
            Ok(server) => out.push(Box::new(server)),
            // An explicit socket that cannot be served is an error; the default one is a convenience.
            Err(e) if args.feed.is_some() => return Err(anyhow::anyhow!("serving the live feed on {}: {e}", path.display())),
            Err(e) => eprintln!("[gpufrag] no live feed for `gpufrag top` ({}: {e})", path.display()),
        }
    }
    if !args.no_report {
        out.push(Box::new(postmortem::OomReportWriter::new(postmortem::report_path(args.report.as_deref(), summary_json), &source)));
    }
    if let Some(p) = &args.memviz {
        out.push(Box::new(postmortem::MemvizWriter::new(p.clone(), args.memviz_entries)));
    }
    Ok(out)
}
