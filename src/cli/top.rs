//! `gpufrag top [--connect SOCK | --replay FILE [--speed X]]`: the live terminal view. With no
//! argument it connects to the newest live feed of a `gpufrag run` of this user. `--once` prints
//! one frame as text (as nvitop's `--once` does) instead; without it, `top` needs a terminal and
//! says so when it has none.

use crate::views::feed;
use crate::views::top::{self, Source};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `top`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Connect to this live feed socket (default: the newest one in $XDG_RUNTIME_DIR/gpufrag/).
    #[arg(long, value_name = "SOCK", conflicts_with = "replay")]
    pub connect: Option<PathBuf>,
    /// Play a record file or a snapshot back instead of watching a live run.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// Playback speed for --replay: 1 is real time, 10 ten times faster, 0 at once (idle
    /// stretches longer than 2 s are cut short).
    #[arg(long, value_name = "X", default_value_t = 1.0, requires = "replay")]
    pub speed: f64,
    /// The most bytes a gzipped snapshot may inflate to (a gzip bomb is refused past it).
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_INFLATED_BYTES", default_value_t = crate::snapshot::DEFAULT_INFLATE_LIMIT)]
    pub max_inflated_bytes: u64,
    /// The most memory this command may hold for what grows with the input (bytes, or with a
    /// unit: 2GiB); past it, a one-line error naming the file. Default: 3/4 of `ulimit -v` when
    /// set, else of the machine's memory.
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_MEMORY")]
    pub max_memory: Option<String>,
    /// Print one frame to stdout as text and exit (a live feed's first frame, a file's last):
    /// no terminal needed.
    #[arg(long)]
    pub once: bool,
    /// Columns of the --once frame (default: the terminal's, else $COLUMNS, else 80).
    #[arg(long, value_name = "N", requires = "once", value_parser = clap::value_parser!(u16).range(40..=1000))]
    pub width: Option<u16>,
}

/// The width of a --once frame: --width, the terminal's, $COLUMNS, else 80.
fn once_width(args: &Args) -> u16 {
    args.width
        .or_else(|| ratatui::crossterm::terminal::size().ok().filter(|_| std::io::stdout().is_terminal()).map(|(w, _)| w))
        .or_else(|| std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()))
        .unwrap_or(80)
        .max(40)
}

/// Runs `top`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    crate::snapshot::set_inflate_limit(args.max_inflated_bytes);
    super::set_memory_budget(args.max_memory.as_deref())?;
    let source = if let Some(p) = &args.replay {
        if !(args.speed >= 0.0 && args.speed.is_finite()) {
            return Err(crate::input::UnusableInput(format!("--speed {}: give a speed of 0 or more", args.speed)).into());
        }
        Source::Replay { path: p.clone(), speed: args.speed }
    } else if let Some(p) = &args.connect {
        Source::Connect(p.clone())
    } else {
        let socks = feed::live_sockets().map_err(|e| crate::input::UnusableInput(format!("the feed folder {e}")))?;
        match socks.into_iter().next() {
            Some(p) => Source::Connect(p),
            None => anyhow::bail!(
                "no live gpufrag feed in {} (start one with `gpufrag run -- CMD`, or use --connect SOCK or --replay FILE)",
                feed::feed_dir().display()
            ),
        }
    };
    let contain: top::Contain = |file, f| crate::guard::contain(file, f);
    if args.once {
        let text = match &source {
            Source::Replay { path, .. } => crate::guard::contain(path, || top::once(&source, contain, once_width(args)))?,
            Source::Connect(_) => top::once(&source, contain, once_width(args))?,
        };
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    if !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        // What is wrong with the source is said first (a missing or undecodable file, a refused
        // feed), then that a terminal is needed.
        match &source {
            // The whole file is decoded (at once, off screen), so a file cut short or badly
            // encoded is named with its offset, as every other reader names it.
            Source::Replay { path, .. } => drop(crate::guard::contain(path, || top::once(&source, contain, 80))?),
            Source::Connect(p) => drop(feed::connect(p).map_err(|e| anyhow::anyhow!("connecting to the live feed {}: {e}", p.display()))?),
        }
        anyhow::bail!("gpufrag top needs a terminal (its stdin and stdout are not both one): run it in a terminal, or print one frame as text with `gpufrag top --once`");
    }
    match &source {
        // A panic while replaying or drawing a replay is an input error naming the file (exit 2),
        // the same guard as decoding; the terminal is put back by the unwinding.
        Source::Replay { path, .. } => crate::guard::contain(path, || top::run(&source, contain))?,
        Source::Connect(_) => top::run(&source, contain)?,
    }
    Ok(ExitCode::SUCCESS)
}
