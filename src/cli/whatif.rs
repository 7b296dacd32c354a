//! `gpufrag whatif FILE [--alloc-conf CONF]... [--memory-limit BYTES] [--device-memory SIZE]
//! [--json]`: the trace's requests replayed through the simulated caching allocator (`crate::sim`)
//! under other settings and limits, after a self-check that the simulation reproduces the trace
//! under its own settings. One scenario per `--alloc-conf`, in the order given; without one, the
//! sweep of `sim::sweep_confs` and a ranked recommendation. The baseline (the trace's own
//! settings) is always the first row.

use crate::input::UnusableInput;
use crate::sim::{self, Outcome, RequestStream};
use crate::units::{human_bytes, parse_bytes};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `whatif`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A PyTorch memory snapshot with allocation history (.pickle, .pickle.gz, a memory_viz
    /// export) or a gpufrag record file with block events (run/attach/agent --record).
    pub file: PathBuf,
    /// A second trace, for `--together`.
    pub other: Option<PathBuf>,
    /// A PYTORCH_CUDA_ALLOC_CONF to simulate (repeatable; "" is PyTorch's defaults). Without
    /// one, a sweep of the settings people try.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    pub alloc_conf: Vec<String>,
    /// The allowed bytes of torch.cuda.set_per_process_memory_fraction (fraction × total), for
    /// every scenario and the self-check; units accepted (16GiB).
    #[arg(long, value_name = "BYTES")]
    pub memory_limit: Option<String>,
    /// Would it fit on a card of this size (80GB, 80GiB)? The trace's memory outside the caching
    /// allocator is counted against it.
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// For each setting, the least allowed memory under which the trace survives (a search over
    /// the simulated limit, to the 2 MiB allocation granule).
    #[arg(long)]
    pub min_memory: bool,
    /// Do FILE and OTHER fit on one card (--device-memory, else an H200's) together, and under
    /// which settings? Each process its own allocator, one device, interleaved by time.
    #[arg(long, requires = "other")]
    pub together: bool,
    /// Print JSON (exact bytes; fields in docs/metrics.md).
    #[arg(long)]
    pub json: bool,
    /// The most memory this command may hold for what grows with the input (bytes, or with a
    /// unit: 2GiB); past it, a one-line error naming the file. Default: 3/4 of `ulimit -v` when
    /// set, else of the machine's memory.
    #[arg(long, value_name = "BYTES", env = "GPUFRAG_MAX_MEMORY")]
    pub max_memory: Option<String>,
}

/// Reads the request stream of any trace gpufrag reads; unusable input is exit 2.
pub fn load_stream(path: &Path) -> anyhow::Result<RequestStream> {
    let opened = crate::input::open(path, crate::input::Accept::Traces)?;
    sim::stream_of(&opened, None).map_err(|e| UnusableInput(e).into())
}

fn size_arg(flag: &str, v: &str) -> anyhow::Result<u64> {
    parse_bytes(v)
        .filter(|&b| b > 0)
        .ok_or_else(|| UnusableInput(format!("{flag} {v:?}: expected a size in bytes, or with a unit (16GiB, 80GB)")).into())
}

/// Everything `whatif` computed.
pub struct WhatIf {
    /// The trace's requests.
    pub stream: RequestStream,
    /// The self-check.
    pub check: sim::Check,
    /// The baseline first, then the scenarios.
    pub outcomes: Vec<Outcome>,
    /// The ranking over `outcomes`.
    pub ranked: Vec<sim::Ranked>,
    /// The sentence.
    pub recommendation: String,
    /// The device memory asked about, if any.
    pub device_memory: Option<u64>,
    /// Settings simulated and never recommended, with why.
    pub left_out: Vec<(usize, String)>,
}

/// Runs the self-check, the baseline and every scenario of `confs` (parsed first: a bad one is
/// an error before anything runs) through `sim::drive`.
pub fn evaluate(stream: RequestStream, confs: &[String], memory_limit: Option<u64>, device_memory: Option<u64>) -> anyhow::Result<WhatIf> {
    let confs = sim::parse_confs(confs).map_err(UnusableInput)?;
    let d = sim::drive(&stream, &sim::Ask { confs, memory_limit, device_memory, stop_unfaithful: false });
    Ok(WhatIf {
        stream,
        check: d.check,
        outcomes: d.outcomes,
        ranked: d.ranked,
        recommendation: d.recommendation,
        device_memory,
        left_out: d.left_out,
    })
}

fn scenario_json(o: &Outcome, rank: usize, baseline: bool, left_out: Option<&String>) -> Value {
    let f = o.first_oom.as_ref();
    json!({
        "alloc_conf": o.alloc_conf,
        "baseline": baseline,
        "rank": (rank > 0).then_some(rank),
        "left_out": left_out,
        "memory_limit": o.memory_limit,
        "oom": f.is_some(),
        "first_oom_requested": f.map(|f| f.oom.requested),
        "first_oom_index": f.map(|f| f.entry),
        "first_oom_request": f.map(|f| f.request),
        "first_oom_rounded": f.map(|f| f.oom.rounded),
        "first_oom_alloc_size": f.map(|f| f.oom.alloc_size),
        "first_oom_limit": f.map(|f| match f.oom.limit { sim::OomLimit::MemoryFraction => "memory_fraction", sim::OomLimit::Device => "device" }),
        "peak_reserved": o.counters.peak_reserved,
        "peak_allocated": o.counters.peak_allocated,
        "num_alloc_retries": o.counters.num_alloc_retries,
        "num_device_alloc": o.counters.num_device_alloc,
        "num_device_free": o.counters.num_device_free,
        "num_ooms": o.counters.num_ooms,
        "reserved": o.figures.reserved,
        "allocated": o.figures.allocated,
        "stranded": o.figures.stranded,
        "releasable": o.figures.releasable,
        "largest_free_block": o.figures.largest_free_block,
        "inactive_split": o.figures.inactive_split,
        "segments": o.figures.segments,
        "simulated_requests": o.simulated,
    })
}

/// The JSON document.
pub fn to_json(w: &WhatIf, file: &Path) -> Value {
    let ranks: Vec<usize> = {
        let mut r = vec![0; w.outcomes.len()];
        for x in &w.ranked {
            r[x.index] = x.rank;
        }
        r
    };
    json!({
        "file": file.display().to_string(),
        "faithful": w.check.faithful,
        "check": {
            "faithful": w.check.faithful,
            "divergence_index": w.check.divergence.as_ref().and_then(|d| d.entry),
            "divergence": w.check.divergence.as_ref().map(|d| d.what.clone()),
            "ops_compared": w.check.ops_compared,
            "blocks_compared": w.check.blocks_compared,
            "memory_limit": w.check.limits.memory_limit,
            "device_capacity": w.check.limits.device_capacity,
        },
        "trace": {
            "source": w.stream.source,
            "device": w.stream.device,
            "entries": w.stream.entries,
            "requests": w.stream.requests.len(),
            "alloc_conf": w.stream.conf.conf,
            "peak_reserved": w.stream.peak_reserved,
            "ooms": w.stream.trace_ooms.len(),
            "non_framework_peak": w.stream.non_framework_peak,
        },
        "device_memory": w.device_memory,
        "scenarios": w.outcomes.iter().enumerate().map(|(i, o)| scenario_json(o, ranks[i], i == 0, w.left_out.iter().find(|(j, _)| *j == i).map(|x| &x.1))).collect::<Vec<_>>(),
        "ipc_exports": w.stream.ipc_exports.len(),
        "recommendation": w.recommendation,
        "notes": w.stream.notes,
    })
}

/// The table and the sentence.
pub fn render(w: &WhatIf, file: &Path) -> String {
    let mut s = String::new();
    let c = &w.check;
    s.push_str(&format!(
        "{}: {} requests from {} {} entries, device {}, own settings {:?}\n",
        file.display(),
        w.stream.requests.len(),
        w.stream.entries,
        w.stream.source,
        w.stream.device,
        w.stream.conf.conf
    ));
    match &c.divergence {
        None => s.push_str(&format!(
            "self-check: faithful (the simulation under the trace's own settings reproduces its {} driver calls and {} block addresses)\n",
            c.ops_compared, c.blocks_compared
        )),
        Some(d) => {
            s.push_str(&format!("self-check: NOT faithful{}: {}\n", d.entry.map(|e| format!(" at entry {e}")).unwrap_or_default(), d.what))
        }
    }
    for n in &w.stream.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    let mut rank = vec![0; w.outcomes.len()];
    for x in &w.ranked {
        rank[x.index] = x.rank;
    }
    s.push_str(&format!(
        "\n{:>4}  {:<56} {:>14} {:>14} {:>8} {:>12}  {}\n",
        "rank", "setting", "peak reserved", "peak alloc", "retries", "stranded", "OOM"
    ));
    for (i, o) in w.outcomes.iter().enumerate() {
        let name = if o.alloc_conf.is_empty() { "\"\" (defaults)".to_string() } else { o.alloc_conf.clone() };
        let name = if i == 0 { format!("{name} [baseline]") } else { name };
        let oom = match &o.first_oom {
            None => "no".to_string(),
            Some(f) => format!("{} at entry {}", human_bytes(f.oom.requested), f.entry),
        };
        s.push_str(&format!(
            "{:>4}  {:<56} {:>14} {:>14} {:>8} {:>12}  {}\n",
            if rank[i] == 0 { "-".to_string() } else { rank[i].to_string() },
            name,
            human_bytes(o.counters.peak_reserved),
            human_bytes(o.counters.peak_allocated),
            o.counters.num_alloc_retries,
            human_bytes(o.figures.stranded),
            oom
        ));
    }
    for (i, why) in &w.left_out {
        s.push_str(&format!("{} (rank -): {why}\n", w.outcomes[*i].alloc_conf));
    }
    if let Some(l) = w.outcomes[0].memory_limit {
        s.push_str(&format!("memory limit: {} allowed ({} bytes)\n", human_bytes(l), l));
    }
    if let Some(d) = w.device_memory {
        s.push_str(&format!(
            "device memory: {} ({} outside the caching allocator counted)\n",
            human_bytes(d),
            human_bytes(w.stream.non_framework_peak)
        ));
    }
    s.push_str(&format!("\n{}\n", w.recommendation));
    s
}

/// Runs `whatif`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    super::set_memory_budget(args.max_memory.as_deref())?;
    let memory_limit = args.memory_limit.as_deref().map(|v| size_arg("--memory-limit", v)).transpose()?;
    let device_memory = args.device_memory.as_deref().map(|v| size_arg("--device-memory", v)).transpose()?;
    let confs: Vec<String> =
        if args.alloc_conf.is_empty() { sim::sweep_confs().into_iter().map(String::from).collect() } else { args.alloc_conf.clone() };
    // parse before reading the trace, so that a bad setting fails fast
    sim::parse_confs(&confs).map_err(UnusableInput)?;
    let stream = load_stream(&args.file)?;
    if args.other.is_some() && !args.together {
        return Err(UnusableInput("a second trace is for --together (do the two fit on one card?)".into()).into());
    }
    if let Some(other) = &args.other {
        return run_together(args, &stream, &load_stream(other)?, other, device_memory);
    }
    if args.min_memory {
        return run_min_memory(args, &stream);
    }
    let mut confs = confs;
    if args.alloc_conf.is_empty() {
        let own = stream.conf.conf.clone();
        confs.retain(|c| *c != own);
    }
    let w = evaluate(stream, &confs, memory_limit, device_memory)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &to_json(&w, &args.file))?;
        writeln!(out)?;
    } else {
        out.write_all(crate::terminal::escape(&render(&w, &args.file)).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn confs_for(args: &Args, stream: &RequestStream) -> anyhow::Result<Vec<(String, crate::alloc::pytorch::AllocConf)>> {
    if args.alloc_conf.is_empty() {
        Ok(sim::sweep_for(stream))
    } else {
        Ok(sim::parse_confs(&args.alloc_conf).map_err(UnusableInput)?.into_iter().filter(|(c, _)| *c != stream.conf.conf).collect())
    }
}

fn print(args: &Args, v: Value, text: String) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        out.write_all(text.as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `--min-memory`: the least allowed memory of the trace's own settings and each other one.
fn run_min_memory(args: &Args, stream: &RequestStream) -> anyhow::Result<ExitCode> {
    let confs = confs_for(args, stream)?;
    let device_total =
        args.device_memory.as_deref().map(|v| size_arg("--device-memory", v)).transpose()?.unwrap_or(sim::DEFAULT_DEVICE_TOTAL);
    let found = sim::min_memory(stream, &confs, device_total);
    let sentence = sim::min_memory_sentence(&found);
    let mut text = format!(
        "{}: {} requests, device {}; the least allowed memory (set_per_process_memory_fraction x total) under which every request succeeds, to {}:\n\n",
        args.file.display(),
        stream.requests.len(),
        stream.device,
        human_bytes(sim::GRANULE)
    );
    text.push_str(&format!("{:<56} {:>14} {:>14}\n", "setting", "least memory", "peak reserved"));
    for (i, m) in found.iter().enumerate() {
        let name = if m.alloc_conf.is_empty() { "\"\" (defaults)".to_string() } else { m.alloc_conf.clone() };
        let name = if i == 0 { format!("{name} [own]") } else { name };
        let b = m.bytes.map_or("none found".to_string(), human_bytes);
        text.push_str(&format!("{name:<56} {b:>14} {:>14}\n", human_bytes(m.peak_reserved)));
    }
    if stream.non_framework_peak > 0 {
        text.push_str(&format!("plus {} outside the caching allocator on the card\n", human_bytes(stream.non_framework_peak)));
    }
    for n in &stream.notes {
        text.push_str(&format!("note: {n}\n"));
    }
    text.push_str(&format!("\n{}\n", sentence));
    let v = json!({
        "file": args.file.display().to_string(),
        "granule": sim::GRANULE,
        "peak_live_requested": sim::peak_live_requested(stream),
        "non_framework_peak": stream.non_framework_peak,
        "min_memory": found.iter().enumerate().map(|(i, m)| json!({
            "alloc_conf": m.alloc_conf,
            "own": i == 0,
            "bytes": m.bytes,
            "peak_reserved": m.peak_reserved,
            "simulations": m.simulations,
        })).collect::<Vec<_>>(),
        "sentence": sentence,
        "notes": stream.notes,
    });
    print(args, v, text)
}

/// `A B --together`: both traces on one card.
fn run_together(args: &Args, a: &RequestStream, b: &RequestStream, other: &Path, device_memory: Option<u64>) -> anyhow::Result<ExitCode> {
    let confs = confs_for(args, a)?;
    let card = device_memory.unwrap_or(sim::DEFAULT_DEVICE_TOTAL);
    let rows = sim::together(a, b, &confs, card);
    let names = [args.file.display().to_string(), other.display().to_string()];
    let mut text = format!(
        "{} ({} requests) and {} ({} requests) on one card of {}{}:\n\n",
        names[0],
        a.requests.len(),
        names[1],
        b.requests.len(),
        human_bytes(card),
        if device_memory.is_none() { " (an H200; --device-memory for another)" } else { "" }
    );
    text.push_str(&sim::together_lines(&rows, card, [&names[0], &names[1]]));
    let fitting: Vec<&str> = rows.iter().filter(|r| r.fits).map(|r| r.alloc_conf.as_str()).collect();
    let sentence = if fitting.is_empty() {
        "They do not fit together under any setting tried.".to_string()
    } else if fitting[0] == "own" {
        "They fit together as they are.".to_string()
    } else {
        format!("They fit together with {} (each process under it).", sim::plain_name(fitting[0]))
    };
    text.push_str(&format!("\n{sentence}\n"));
    let v = json!({
        "files": names,
        "device_memory": card,
        "together": rows.iter().map(|r| json!({
            "alloc_conf": r.alloc_conf,
            "fits": r.fits,
            "failed": r.failed.as_ref().map(|(w, _)| names[*w].clone()),
            "failed_index": r.failed.as_ref().map(|(w, _)| *w),
            "first_oom_requested": r.failed.as_ref().map(|(_, f)| f.oom.requested),
            "first_oom_index": r.failed.as_ref().map(|(_, f)| f.entry),
            "peak_combined": r.peak_combined,
            "peak_reserved": r.peaks,
        })).collect::<Vec<_>>(),
        "sentence": sentence,
    });
    print(args, v, text)
}
