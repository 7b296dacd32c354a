//! `gpufrag whatif FILE [--alloc-conf CONF]... [--memory-limit BYTES] [--device-memory SIZE]
//! [--json]`: the trace's requests replayed through the simulated caching allocator (`crate::sim`)
//! under other settings and limits, after a self-check that the simulation reproduces the trace
//! under its own settings. One scenario per `--alloc-conf`, in the order given; without one, the
//! sweep of `sim::sweep_confs` and a ranked recommendation. The baseline (the trace's own
//! settings) is always the first row.

use crate::alloc::pytorch::AllocConf;
use crate::input::UnusableInput;
use crate::sim::{self, Limits, Outcome, RequestStream, Scenario};
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
    /// Print JSON (exact bytes; fields in docs/metrics.md).
    #[arg(long)]
    pub json: bool,
}

/// Reads the request stream of any trace gpufrag reads; unusable input is exit 2.
pub fn load_stream(path: &Path) -> anyhow::Result<RequestStream> {
    sim::stream_of_file(path).map_err(|e| UnusableInput(e).into())
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
}

/// Runs the self-check, the baseline and every scenario of `confs` (parsed first: a bad one is
/// an error before anything runs).
pub fn evaluate(stream: RequestStream, confs: &[String], memory_limit: Option<u64>, device_memory: Option<u64>) -> anyhow::Result<WhatIf> {
    let parsed: Vec<(String, AllocConf)> = confs
        .iter()
        .map(|c| AllocConf::parse(c).map(|p| (c.clone(), p)).map_err(|e| UnusableInput(format!("--alloc-conf {c:?}: {e}"))))
        .collect::<Result<_, _>>()?;
    let mut limits = Limits { memory_limit, device_capacity: stream.device_capacity_hint, ..Limits::default() };
    let check = sim::self_check(&stream, &limits);
    if let Some(dm) = device_memory {
        limits.device_capacity = Some(dm.saturating_sub(stream.non_framework_peak));
        limits.device_total = dm;
    }
    let own = stream.conf.clone();
    let mut outcomes =
        vec![sim::simulate(&stream, &Scenario { alloc_conf: own.conf.clone(), conf: own.clone(), limits: limits.clone() }, true)];
    for (s, c) in parsed {
        outcomes.push(sim::simulate(&stream, &Scenario { alloc_conf: s, conf: c, limits: limits.clone() }, false));
    }
    let ranked = sim::rank(&outcomes);
    let recommendation = sim::recommendation(&outcomes);
    Ok(WhatIf { stream, check, outcomes, ranked, recommendation, device_memory })
}

fn scenario_json(o: &Outcome, rank: usize, baseline: bool) -> Value {
    let f = o.first_oom.as_ref();
    json!({
        "alloc_conf": o.alloc_conf,
        "baseline": baseline,
        "rank": rank,
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
        "scenarios": w.outcomes.iter().enumerate().map(|(i, o)| scenario_json(o, ranks[i], i == 0)).collect::<Vec<_>>(),
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
            rank[i],
            name,
            human_bytes(o.counters.peak_reserved),
            human_bytes(o.counters.peak_allocated),
            o.counters.num_alloc_retries,
            human_bytes(o.figures.stranded),
            oom
        ));
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
    let memory_limit = args.memory_limit.as_deref().map(|v| size_arg("--memory-limit", v)).transpose()?;
    let device_memory = args.device_memory.as_deref().map(|v| size_arg("--device-memory", v)).transpose()?;
    let confs: Vec<String> =
        if args.alloc_conf.is_empty() { sim::sweep_confs().into_iter().map(String::from).collect() } else { args.alloc_conf.clone() };
    // parse before reading the trace, so that a bad setting fails fast
    for c in &confs {
        AllocConf::parse(c).map_err(|e| UnusableInput(format!("--alloc-conf {c:?}: {e}")))?;
    }
    let stream = load_stream(&args.file)?;
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
