//! `gpufrag analyze FILE [--json] [--device N]`: the figures, the segments that strand the most,
//! and every OOM with its verdict, for a snapshot pickle or a record file.

use crate::analysis::render::render;
use crate::analysis::summary::Summary;
use crate::input;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `analyze`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A PyTorch memory snapshot (.pickle or .pickle.gz, from torch.cuda.memory._snapshot() or
    /// _dump_snapshot()) or a gpufrag record file (run --record, attach --record).
    pub file: PathBuf,
    /// Print the summary as JSON (exact bytes; schema in docs/metrics.md).
    #[arg(long)]
    pub json: bool,
    /// Only this device.
    #[arg(long)]
    pub device: Option<i16>,
    /// The most bytes a gzipped snapshot may inflate to (a gzip bomb is refused past it).
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_INFLATED_BYTES", default_value_t = crate::snapshot::DEFAULT_INFLATE_LIMIT)]
    pub max_inflated_bytes: u64,
    /// The most memory this command may hold for what grows with the input (bytes, or with a
    /// unit: 2GiB); past it, a one-line error naming the file. Default: 3/4 of `ulimit -v` when
    /// set, else of the machine's memory.
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_MEMORY")]
    pub max_memory: Option<String>,
}

/// The summary of a file, as `analyze` computes it.
pub fn summarize(file: &std::path::Path, device: Option<i16>) -> anyhow::Result<Summary> {
    // opened, told apart and decoded once: the replay and the computed fix read the same input
    let opened = input::open(file, input::Accept::Traces)?;
    let loaded = opened.load_state()?;
    let mut s = Summary::from_state(&loaded.state, &file.display().to_string());
    s.exact &= loaded.complete;
    let mut notes = loaded.notes;
    notes.append(&mut s.notes);
    s.notes = notes;
    crate::sim::apply_to_summary(&mut s, |cut| crate::sim::stream_of(&opened, cut));
    if let Some(d) = device {
        s.devices.retain(|x| x.device == d);
        s.processes.retain(|x| x.figures.device == d);
        s.ooms.retain(|x| x.device == d);
    }
    Ok(s)
}

/// Runs `analyze`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    crate::snapshot::set_inflate_limit(args.max_inflated_bytes);
    super::set_memory_budget(args.max_memory.as_deref())?;
    let s = summarize(&args.file, args.device)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &s)?;
        writeln!(out)?;
    } else {
        out.write_all(crate::terminal::escape(&render(&s)).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
