//! `gpufrag report INPUT [-o report.html] [--svg map.svg] [--memviz out.pickle] [--oom N]`: the
//! post-mortem report as one self-contained HTML file, the memory map alone as SVG, or the input
//! converted to a PyTorch memory_viz pickle. INPUT is a snapshot pickle, a record file or a
//! summary JSON (`analyze --json`, `run --summary-json`; no map or timeline then, see
//! `views::report`).

use crate::views::{memviz, report};
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A PyTorch memory snapshot (.pickle, .pickle.gz), a gpufrag record file, or a summary JSON.
    pub input: PathBuf,
    /// Write the HTML report here (default: report.html when neither --svg nor --memviz is given).
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Write the memory map alone as an SVG file.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// Write the input as a PyTorch memory snapshot pickle (pytorch.org/memory_viz); one file per
    /// process, `-PID` added to the name, when the input has several.
    #[arg(long, value_name = "PATH")]
    pub memviz: Option<PathBuf>,
    /// Which failed allocation to draw, 1-based (default: the last).
    #[arg(long, value_name = "N")]
    pub oom: Option<usize>,
    /// Points per device on the timeline (the trace is downsampled to this many).
    #[arg(long, value_name = "N", default_value_t = crate::views::history::DEFAULT_POINTS)]
    pub points: usize,
    /// The most bytes a gzipped snapshot may inflate to (a gzip bomb is refused past it).
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_INFLATED_BYTES", default_value_t = crate::snapshot::DEFAULT_INFLATE_LIMIT)]
    pub max_inflated_bytes: u64,
    /// The most memory this command may hold for what grows with the input (bytes, or with a
    /// unit: 2GiB); past it, a one-line error naming the file. Default: 3/4 of `ulimit -v` when
    /// set, else of the machine's memory.
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_MEMORY")]
    pub max_memory: Option<String>,
}

/// Runs `report`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    crate::snapshot::set_inflate_limit(args.max_inflated_bytes);
    super::set_memory_budget(args.max_memory.as_deref())?;
    {
        let default_html = (args.output.is_none() && args.svg.is_none() && args.memviz.is_none()).then(|| PathBuf::from("report.html"));
        let outs: Vec<(&str, &std::path::Path)> =
            [("-o", args.output.as_ref().or(default_html.as_ref())), ("--svg", args.svg.as_ref()), ("--memviz", args.memviz.as_ref())]
                .into_iter()
                .filter_map(|(f, p)| Some((f, p?.as_path())))
                .collect();
        crate::cli::outputs::check_distinct(&outs, &[("", args.input.as_path())])?;
    }
    let memviz_entries = args.memviz.as_ref().map(|_| usize::MAX);
    let data = report::load(&args.input, args.points, memviz_entries)?;
    let oom = report::pick_oom(&data.summary, args.oom);
    if let Some(k) = args.oom {
        if oom != Some(k.wrapping_sub(1)) {
            return Err(
                crate::input::UnusableInput(format!("--oom {k}: the input has {} failed allocation(s)", data.summary.ooms.len())).into()
            );
        }
    }
    let mut out = std::io::stdout().lock();
    let html_path = match (&args.output, &args.svg, &args.memviz) {
        (Some(p), _, _) => Some(p.clone()),
        (None, None, None) => Some(PathBuf::from("report.html")),
        _ => None,
    };
    if let Some(p) = &html_path {
        std::fs::write(p, report::html(&data, oom)).with_context(|| format!("writing {}", p.display()))?;
        writeln!(out, "report: {}", p.display())?;
    }
    if let Some(p) = &args.svg {
        let svgs = report::map_svgs(&data, oom);
        let first = svgs.into_iter().next().unwrap_or_default();
        std::fs::write(p, format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{first}"))
            .with_context(|| format!("writing {}", p.display()))?;
        writeln!(out, "map: {}", p.display())?;
    }
    if let Some(p) = &args.memviz {
        let Some(state) = &data.state else {
            return Err(crate::input::UnusableInput(format!(
                "{}: a summary JSON holds no blocks or events to export; use a record file or a snapshot",
                args.input.display()
            ))
            .into());
        };
        let (files, left) = memviz::export_all_counted(state, data.log.as_ref(), p).context("writing the memory_viz snapshot")?;
        for f in files {
            writeln!(out, "memory_viz snapshot: {}", f.display())?;
        }
        if left > 0 {
            writeln!(
                out,
                "memory_viz: {left} more process(es) left out: at most {} files, those with a failed allocation first, then the most reserved",
                memviz::MAX_FILES
            )?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
