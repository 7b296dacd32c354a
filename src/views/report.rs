//! The post-mortem report: one self-contained HTML file (inline CSS, SVG and a few lines of
//! script; nothing fetched when it is opened) with the verdict in plain words, the memory map at
//! the failure, the figures over the trace, and the tables of `analyze`.
//!
//! Inputs: a snapshot pickle or a record file (replayed event by event for the timeline and the
//! map at each OOM; the tables come from the same [`crate::input`] path as `analyze`, so the
//! numbers agree with it to the byte), or a summary JSON (`analyze --json`, `run --summary-json`).
//! A summary carries figures, not the address map: its report has the verdict, the tables and the
//! same-scale bars of the failed request against the largest free block, stranded and device free
//! memory, but no per-segment map and no timeline (keep a record file with `run --record` for
//! those). Every number shown is also on its element as exact bytes in a `data-` attribute under
//! a stable id (`#verdict`, `#memory-map`, `#timeline-devN`, `#devices-table`, `#stranded-table`,
//! `#ooms-table`).

use super::history::History;
use super::map::{self, Bars, MapSpec};
use super::memviz::TraceLog;
use super::svg::{esc, put, short_bytes};
use super::timeline;
use crate::analysis::summary::{DeviceSummary, OomSummary, Summary};
use crate::ingest::{ProcessDevice, State};
use crate::input::{self, UnusableInput};
use crate::units::{human_bytes, thousands as group};
use std::path::Path;

/// Most per-process maps drawn when no allocation failed.
pub const MAX_MAPS: usize = 8;

/// Everything a report is drawn from.
#[derive(Debug)]
pub struct ReportData {
    /// The figures, as `analyze` computes them.
    pub summary: Summary,
    /// The replayed final state (absent for a summary input).
    pub state: Option<State>,
    /// Figures over time and maps at failures (absent for a summary input).
    pub history: Option<History>,
    /// The trace entries, when asked for (memviz export).
    pub log: Option<TraceLog>,
}

/// Loads any input `report` accepts. `log_entries`: keep the trace for a memviz export.
pub fn load(path: &Path, max_points: usize, log_entries: Option<usize>) -> anyhow::Result<ReportData> {
    // opened, told apart and decoded once: the replay, the computed fix and the timeline read it
    let opened = input::open(path, input::Accept::TracesOrSummary)?;
    if let input::Body::Summary(text) = &opened.body {
        let summary: Summary =
            serde_json::from_str(text).map_err(|e| UnusableInput(format!("{}: not a gpufrag summary JSON: {e}", path.display())))?;
        return Ok(ReportData { summary, state: None, history: None, log: None });
    }
    let loaded = opened.load()?;
    let mut summary = Summary::from_state(&loaded.state, &path.display().to_string());
    summary.exact &= loaded.complete;
    let mut notes = loaded.notes.clone();
    notes.append(&mut summary.notes);
    summary.notes = notes;
    crate::sim::apply_to_summary(&mut summary, |cut| crate::sim::stream_of(&opened, cut));
    let mut state = State::new(loaded.rules.clone());
    let mut history = History::new(max_points);
    let mut log = log_entries.map(TraceLog::new);
    for (i, e) in loaded.replay.iter().enumerate() {
        state.apply_text(e, loaded.replay_texts.get(&i).map_or(&[][..], |t| t.as_slice()));
        history.observe(&state, e);
        if let Some(l) = log.as_mut() {
            l.observe(&state, e);
        }
    }
    // The end of the trace decides what nothing recovered, as the loaded state's summary did.
    state.settle_all();
    history.observe_state(&state, loaded.replay.last().map_or(0, |e| e.ts_ns));
    Ok(ReportData { summary, state: Some(state), history: Some(history), log })
}

/// Which OOM the report is about: `wanted` (1-based) or the last one.
pub fn pick_oom(summary: &Summary, wanted: Option<usize>) -> Option<usize> {
    let n = summary.ooms.len();
    match wanted {
        Some(k) if k >= 1 && k <= n => Some(k - 1),
        _ if n > 0 => Some(n - 1),
        _ => None,
    }
}

/// The map SVGs of a report: at the chosen OOM, or the final state of each process.
pub fn map_svgs(data: &ReportData, oom: Option<usize>) -> Vec<String> {
    let s = &data.summary;
    if let Some(i) = oom {
        let o = &s.ooms[i];
        let requested = Some(o.requested);
        let device_free = o.device_free_known.then_some(o.device_free);
        let title = format!("Why {} fits nowhere: pid {} on device {} at OOM {}", short_bytes(o.requested), o.pid, o.device, i + 1);
        if let Some(cap) = data.history.as_ref().and_then(|h| h.capture(i)) {
            if let Some(space) = &cap.space {
                let f = space.map.figures();
                let subtitle = format!(
                    "{} segments holding {}: {} live, {} stranded in split segments, {} releasable. The dashed line is the request.",
                    f.segments,
                    short_bytes(f.reserved),
                    short_bytes(f.allocated),
                    short_bytes(f.stranded),
                    short_bytes(f.releasable)
                );
                return vec![map::svg(&MapSpec {
                    space: Some(space),
                    title,
                    subtitle,
                    bars: Bars::of_space(space, requested, device_free),
                })];
            }
        }
        let bars = Bars {
            requested,
            largest_free_block: o.map.largest_free_block,
            device_free,
            stranded: o.map.stranded,
            stranded_pieces: Vec::new(),
            releasable: o.map.releasable,
        };
        let subtitle = "No address map in this input (a summary): the request against the figures at the failure, to scale.".to_string();
        return vec![map::svg(&MapSpec { space: None, title, subtitle, bars })];
    }
    let Some(state) = &data.state else {
        return s
            .devices
            .iter()
            .take(MAX_MAPS)
            .map(|d| {
                let bars = Bars {
                    requested: None,
                    largest_free_block: d.map.largest_free_block,
                    device_free: d.device_free,
                    stranded: d.map.stranded,
                    stranded_pieces: Vec::new(),
                    releasable: d.map.releasable,
                };
                map::svg(&MapSpec {
                    space: None,
                    title: format!("Device {}: free memory, to scale", d.device),
                    subtitle: "No address map in this input (a summary).".into(),
                    bars,
                })
            })
            .collect();
    };
    let mut spaces: Vec<&ProcessDevice> = state.spaces.values().filter(|sp| sp.map.figures().segments > 0).collect();
    spaces.sort_by_key(|s| std::cmp::Reverse(s.map.figures().reserved));
    spaces
        .into_iter()
        .take(MAX_MAPS)
        .map(|space| {
            let f = space.map.figures();
            let free = state.devices.get(&space.device).and_then(|d| d.free);
            let title = format!("Memory map: pid {} on device {} at the end of the trace", space.pid, space.device);
            let subtitle = format!(
                "{} segments holding {}: {} live, {} stranded, {} releasable; largest free run {}",
                f.segments,
                short_bytes(f.reserved),
                short_bytes(f.allocated),
                short_bytes(f.stranded),
                short_bytes(f.releasable),
                short_bytes(f.largest_free_block)
            );
            map::svg(&MapSpec { space: Some(space), title, subtitle, bars: Bars::of_space(space, None, free) })
        })
        .collect()
}

fn bytes_td(field: &str, b: u64) -> String {
    format!("<td class=\"num\" data-field=\"{field}\" data-bytes=\"{b}\" title=\"{} B\">{}</td>", group(b), esc(&human_bytes(b)))
}

/// `text` after its opening "fragmentation OOM ...: " / "true OOM: " clause, when it has one.
fn without_verdict(text: &str) -> &str {
    let lower = text.to_lowercase();
    let opens = ["fragmentation oom", "true oom", "allowed limit", "inconclusive"].iter().any(|v| lower.starts_with(v));
    match text.split_once(": ") {
        Some((_, rest)) if opens => rest,
        _ => text,
    }
}

/// A sentence: its first letter upper-case, a full stop at its end.
fn sentence(text: &str) -> String {
    let mut c = text.trim().chars();
    let mut out: String = c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default();
    if !out.ends_with('.') {
        out.push('.');
    }
    out
}

/// What to do: the command to copy (a setting) in a code block with a copy button, then the
/// fix's other options as a list, one clause each.
fn fix_block(out: &mut String, o: &OomSummary) {
    out.push_str("<div class=\"fix\" id=\"fix\"><b>What to do</b>\n");
    if let Some(cmd) = crate::views::point::fix_command(o) {
        put(
            out,
            format_args!(
                "<div class=\"cmd\"><pre><code id=\"fix-command\">{}</code></pre><button type=\"button\" id=\"copy-fix\" onclick=\"navigator.clipboard&&navigator.clipboard.writeText(document.getElementById('fix-command').textContent)\">copy</button></div>\n",
                esc(&cmd)
            ),
        );
    }
    out.push_str("<ul>\n");
    for part in o.fix.split("; or ").flat_map(|p| p.split(", or ")) {
        put(out, format_args!("<li>{}</li>\n", esc(&sentence(part))));
    }
    out.push_str("</ul></div>\n");
}

/// The card that makes a fragmentation OOM visible: free in all against the largest free piece,
/// with the request between them, as bars on one scale.
fn free_card(out: &mut String, o: &OomSummary) {
    let (all, largest) = crate::views::point::free_pieces(o);
    let max = all.max(largest).max(o.requested).max(1) as f64;
    let pct = |b: u64| b as f64 / max * 100.0;
    put(
        out,
        format_args!(
            "<div class=\"freecard\" id=\"card-free-vs-largest\" data-free-in-all=\"{all}\" data-largest-piece=\"{largest}\" data-requested=\"{}\">\n\
<div class=\"fc-row\"><span class=\"fc-k\">free in all</span><span class=\"fc-bar\"><i style=\"width:{:.1}%;background:#2ca02c\"></i></span><span class=\"fc-v\">{}</span></div>\n\
<div class=\"fc-row\"><span class=\"fc-k\">requested</span><span class=\"fc-bar\"><i style=\"width:{:.1}%;background:var(--red)\"></i></span><span class=\"fc-v\">{}</span></div>\n\
<div class=\"fc-row\"><span class=\"fc-k\">largest free piece</span><span class=\"fc-bar\"><i style=\"width:{:.1}%;background:var(--orange)\"></i></span><span class=\"fc-v\">{}</span></div>\n</div>\n",
            o.requested,
            pct(all),
            esc(&human_bytes(all)),
            pct(o.requested),
            esc(&human_bytes(o.requested)),
            pct(largest),
            esc(&human_bytes(largest)),
        ),
    );
}

fn verdict_section(out: &mut String, s: &Summary, oom: Option<usize>) {
    match oom {
        Some(i) => {
            let o = &s.ooms[i];
            let total = o.device_free + o.map.stranded + o.map.releasable;
            put(
                out,
                format_args!(
                    "<section id=\"verdict\" class=\"verdict v-{v}\" data-verdict=\"{v}\" data-oom=\"{}\" data-ooms=\"{}\" data-requested=\"{}\" data-largest-free-block=\"{}\" data-stranded=\"{}\" data-releasable=\"{}\" data-device-free=\"{}\" data-device-free-known=\"{}\" data-free-in-all=\"{total}\" data-pid=\"{}\" data-device=\"{}\">\n",
                    i + 1,
                    s.ooms.len(),
                    o.requested,
                    o.map.largest_free_block,
                    o.map.stranded,
                    o.map.releasable,
                    o.device_free,
                    o.device_free_known,
                    o.pid,
                    o.device,
                    v = o.verdict.name()
                ),
            );
            put(
                out,
                format_args!(
                    "<div class=\"tag\">{}</div>\n<h2>{}</h2>\n",
                    esc(&o.verdict.name().replace('_', " ")),
                    esc(&crate::views::point::headline(o))
                ),
            );
            // The one sentence per verdict (crate::views::point::headline, as the demo says it),
            // then the explanation without its opening verdict clause: the headline just said it.
            put(out, format_args!("<p class=\"why\">{}</p>\n", esc(&sentence(without_verdict(&o.explanation)))));
            fix_block(out, o);
            free_card(out, o);
            // Who else held the GPU (crate::ingest::holders; a minimal addition of the shared-GPU work).
            if !o.holders.list.is_empty() {
                out.push_str("<ul class=\"holders\" id=\"holders\">\n");
                for h in &o.holders.list {
                    put(
                        out,
                        format_args!(
                            "<li data-pid=\"{}\" data-holds=\"{}\" data-traced=\"{}\">{}</li>\n",
                            h.pid,
                            h.holds(),
                            h.traced,
                            esc(&h.sentence())
                        ),
                    );
                }
                out.push_str("</ul>\n");
            }
            put(out, format_args!("<div class=\"cards\">\n"));
            let free = if o.device_free_known { human_bytes(o.device_free) } else { "not measured".into() };
            for (id, name, val, bytes) in [
                ("requested", "requested", human_bytes(o.requested), Some(o.requested)),
                ("largest-free-block", "largest free block", human_bytes(o.map.largest_free_block), Some(o.map.largest_free_block)),
                ("stranded", "stranded in split segments", human_bytes(o.map.stranded), Some(o.map.stranded)),
                ("releasable", "releasable (empty_cache)", human_bytes(o.map.releasable), Some(o.map.releasable)),
                ("device-free", "device free (driver)", free, o.device_free_known.then_some(o.device_free)),
                ("reserved", "reserved", human_bytes(o.map.reserved), Some(o.map.reserved)),
                (
                    "page-stranded",
                    "page-stranded (partly used 2 MiB driver pages)",
                    human_bytes(o.map.page_stranded),
                    Some(o.map.page_stranded),
                ),
                (
                    "allowed",
                    "allowed (memory fraction)",
                    o.allowed.map_or_else(|| "not set or not seen".to_string(), human_bytes),
                    o.allowed,
                ),
            ] {
                let b = bytes.map(|b| format!(" data-bytes=\"{b}\" title=\"{} B\"", group(b))).unwrap_or_default();
                put(
                    out,
                    format_args!(
                        "<div class=\"card\" id=\"card-{id}\"{b}><div class=\"k\">{}</div><div class=\"v\">{}</div></div>\n",
                        esc(name),
                        esc(&val)
                    ),
                );
            }
            out.push_str("</div>\n");
            if let Some(w) = &s.whatif {
                whatif_table(out, w);
            }
            if s.ooms.len() > 1 {
                put(out, format_args!("<p class=\"more\">This trace has {} failed allocations; this report shows number {} (choose another with <code>--oom N</code>). All are listed in the table below.</p>\n", s.ooms.len(), i + 1));
            }
            out.push_str("</section>\n");
        }
        None => {
            out.push_str("<section id=\"verdict\" class=\"verdict v-none\" data-verdict=\"none\" data-ooms=\"0\">\n<div class=\"tag\">no OOM</div>\n");
            out.push_str("<h2>No allocation failed in this trace.</h2>\n");
            for d in &s.devices {
                put(
                    out,
                    format_args!(
                        "<p class=\"why\">Device {}: one request could get at most {} now (largest free block {}, device free {}); {} of the free memory is out of reach of a single request (fragmentation {:.2}).</p>\n",
                        d.device,
                        esc(&human_bytes(d.largest_allocatable)),
                        esc(&human_bytes(d.map.largest_free_block)),
                        esc(&d.device_free.map(human_bytes).unwrap_or_else(|| "not measured".into())),
                        format_args!("{:.0} %", d.fragmentation * 100.0),
                        d.fragmentation
                    ),
                );
            }
            out.push_str("</section>\n");
        }
    }
}

/// The trace's own settings and the best simulated one, side by side.
fn whatif_table(out: &mut String, w: &crate::analysis::summary::WhatIfSummary) {
    let name = |c: &str| if c.is_empty() { "PyTorch's defaults".to_string() } else { c.to_string() };
    let oom = |b: &crate::analysis::summary::ScenarioBrief| match b.first_oom_requested {
        Some(r) if b.oom => format!("OOM at a {} request", human_bytes(r)),
        _ => "finishes".to_string(),
    };
    put(out, format_args!("<table id=\"whatif\" data-scenarios=\"{}\"><caption>Simulated ({} settings, gpufrag whatif)</caption>\n<tr><th></th><th>this run</th><th>best setting</th></tr>\n", w.scenarios, w.scenarios));
    put(
        out,
        format_args!(
            "<tr><th>setting</th><td>{}</td><td id=\"whatif-best\">{}</td></tr>\n",
            esc(&name(&w.baseline.alloc_conf)),
            esc(&name(&w.best.alloc_conf))
        ),
    );
    put(out, format_args!("<tr><th>outcome</th><td>{}</td><td>{}</td></tr>\n", esc(&oom(&w.baseline)), esc(&oom(&w.best))));
    put(
        out,
        format_args!(
            "<tr><th>peak reserved</th><td>{}</td><td data-bytes=\"{}\">{}</td></tr>\n",
            esc(&human_bytes(w.baseline.peak_reserved)),
            w.best.peak_reserved,
            esc(&human_bytes(w.best.peak_reserved))
        ),
    );
    put(
        out,
        format_args!(
            "<tr><th>peak allocated</th><td>{}</td><td>{}</td></tr>\n",
            esc(&human_bytes(w.baseline.peak_allocated)),
            esc(&human_bytes(w.best.peak_allocated))
        ),
    );
    put(
        out,
        format_args!("<tr><th>retries</th><td>{}</td><td>{}</td></tr>\n</table>\n", w.baseline.num_alloc_retries, w.best.num_alloc_retries),
    );
}

fn device_row(out: &mut String, label: &str, d: &DeviceSummary, id_attr: &str) {
    put(out, format_args!("<tr{id_attr} data-device=\"{}\"><td>{}</td>", d.device, esc(label)));
    for (f, v) in [
        ("reserved", d.map.reserved),
        ("allocated", d.map.allocated),
        ("stranded", d.map.stranded),
        ("releasable", d.map.releasable),
        ("largest_free_block", d.map.largest_free_block),
    ] {
        out.push_str(&bytes_td(f, v));
    }
    match d.device_free {
        Some(v) => out.push_str(&bytes_td("device_free", v)),
        None => out.push_str("<td class=\"num\" data-field=\"device_free\">not measured</td>"),
    }
    out.push_str(&bytes_td("largest_allocatable", d.largest_allocatable));
    put(out, format_args!("<td class=\"num\" data-field=\"fragmentation\" data-value=\"{}\">{:.2}</td><td class=\"num\" data-field=\"segments\" data-value=\"{}\">{}</td><td class=\"num\" data-field=\"blocks\" data-value=\"{}\">{}</td><td>{}</td></tr>\n", d.fragmentation, d.fragmentation, d.map.segments, d.map.segments, d.map.blocks, d.map.blocks, esc(d.map.level())));
}

/// Each process's driver memory by the library that called the driver (the summary's `owners`),
/// with its share of the process's reserved bytes; only where two owners or more share it.
fn owners_table(out: &mut String, s: &Summary) {
    let per = s.owner_splits();
    if per.is_empty() {
        return;
    }
    out.push_str("<h3>Driver memory by owner</h3>\n<p>The library that called the driver for each live allocation (cuBLAS's workspaces, NCCL's buffers, the framework's segments, ...); each process's rows sum to its reserved bytes.</p>\n<table id=\"owners-table\">\n<tr><th>process</th><th>owner</th><th>bytes</th><th>share of its reserved</th></tr>\n");
    for (p, o) in per {
        for (owner, bytes) in o {
            let share = if p.figures.map.reserved > 0 { bytes as f64 * 100.0 / p.figures.map.reserved as f64 } else { 0.0 };
            put(
                out,
                format_args!(
                    "<tr data-pid=\"{}\" data-owner=\"{}\"><td>{}</td><td>{}</td>",
                    p.pid,
                    esc(owner),
                    esc(&Summary::process_label(p)),
                    esc(owner)
                ),
            );
            out.push_str(&bytes_td("bytes", bytes));
            put(out, format_args!("<td class=\"num\">{share:.1} %</td></tr>\n"));
        }
    }
    out.push_str("</table>\n");
}

fn tables(out: &mut String, s: &Summary) {
    let head = "<tr><th></th><th>reserved</th><th>allocated</th><th>stranded</th><th>releasable</th><th>largest free block</th><th>device free</th><th>largest allocatable</th><th>frag.</th><th>segments</th><th>blocks</th><th>level</th></tr>\n";
    out.push_str("<section id=\"tables\">\n<h2>Figures</h2>\n");
    let allocators: Vec<String> = s
        .processes
        .iter()
        .map(|p| format!("pid {}: {}", p.pid, p.framework.map_or("none seen (driver segments only)", |f| f.allocator())))
        .collect();
    if !allocators.is_empty() {
        put(out, format_args!("<p id=\"allocators\">Caching allocator: {}</p>\n", esc(&allocators.join("; "))));
    }
    out.push_str("<table id=\"devices-table\">\n");
    out.push_str(head);
    for d in &s.devices {
        device_row(out, &format!("device {}", d.device), d, "");
    }
    out.push_str("</table>\n");
    if s.processes.len() > 1 {
        out.push_str("<h3>Per process</h3>\n<table id=\"processes-table\">\n");
        out.push_str(head);
        for p in &s.processes {
            device_row(
                out,
                &format!("{} · device {}", crate::analysis::summary::Summary::process_label(p), p.figures.device),
                &p.figures,
                &format!(" data-pid=\"{}\"", p.pid),
            );
        }
        out.push_str("</table>\n");
    }
    owners_table(out, s);
    out.push_str("<h3>Segments stranding the most</h3>\n<table id=\"stranded-table\">\n<tr><th>device</th><th>pid</th><th>address</th><th>kind</th><th>size</th><th>stranded</th><th>live blocks</th><th>largest free run</th></tr>\n");
    let mut any = false;
    for d in &s.devices {
        for g in &d.top_stranded_segments {
            any = true;
            put(
                out,
                format_args!(
                    "<tr data-address=\"{}\"><td>{}</td><td>{}</td><td class=\"mono\">{:#x}</td><td>{}</td>",
                    g.address,
                    d.device,
                    g.pid,
                    g.address,
                    esc(&g.kind)
                ),
            );
            out.push_str(&bytes_td("size", g.size));
            out.push_str(&bytes_td("stranded", g.stranded));
            put(out, format_args!("<td class=\"num\">{}</td>", g.live_blocks));
            out.push_str(&bytes_td("largest_free_run", g.largest_free_run));
            out.push_str("</tr>\n");
        }
    }
    if !any {
        out.push_str("<tr><td colspan=\"8\">no segment strands memory</td></tr>\n");
    }
    out.push_str("</table>\n<h3>Failed allocations</h3>\n<table id=\"ooms-table\">\n<tr><th>#</th><th>device</th><th>pid</th><th>call</th><th>requested</th><th>largest free block</th><th>stranded</th><th>releasable</th><th>device free</th><th>verdict</th></tr>\n");
    for (i, o) in s.ooms.iter().enumerate() {
        put(
            out,
            format_args!(
                "<tr data-verdict=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                o.verdict.name(),
                i + 1,
                o.device,
                o.pid,
                esc(&o.op)
            ),
        );
        out.push_str(&bytes_td("requested", o.requested));
        out.push_str(&bytes_td("largest_free_block", o.map.largest_free_block));
        out.push_str(&bytes_td("stranded", o.map.stranded));
        out.push_str(&bytes_td("releasable", o.map.releasable));
        if o.device_free_known {
            out.push_str(&bytes_td("device_free", o.device_free));
        } else {
            out.push_str("<td class=\"num\">not measured</td>");
        }
        put(out, format_args!("<td>{}</td></tr>\n", esc(o.verdict.name())));
    }
    if s.ooms.is_empty() {
        out.push_str("<tr><td colspan=\"10\">none</td></tr>\n");
    }
    out.push_str("</table>\n");
    // Recovered allocations (crate::ingest::oom_rule): never OOMs, counted per process.
    let per: Vec<String> = s
        .processes
        .iter()
        .filter(|p| p.retries > 0)
        .map(|p| format!("pid {} on device {}: {}", p.pid, p.figures.device, p.retries))
        .collect();
    put(
        out,
        format_args!(
            "<p id=\"retries\">Recovered allocations (retries: the same thread's next allocation of that size succeeded after memory was released; not OOMs): {}{}</p>\n",
            s.retries,
            if per.is_empty() { String::new() } else { format!(" ({})", esc(&per.join(", "))) }
        ),
    );
    out.push_str("</section>\n");
}

const CSS: &str = r#"
:root{--fg:#1d1f24;--muted:#5b6270;--line:#e3e5ea;--bg:#f7f8fa;--red:#d62728;--orange:#f28e2c;--blue:#3b6ea8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 "DejaVu Sans",Helvetica,Arial,sans-serif}
main{max-width:1260px;margin:0 auto;padding:20px 24px 60px}
header h1{font-size:22px;margin:0 0 2px}
header .src{color:var(--muted);margin:0}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:16px 20px;margin:18px 0}
h2{font-size:18px;margin:4px 0 10px}
h3{font-size:15px;margin:18px 0 6px}
.verdict{border-left:6px solid var(--muted)}
.v-fragmentation{border-left-color:var(--orange)}
.v-true_oom{border-left-color:var(--red)}
.tag{display:inline-block;text-transform:uppercase;letter-spacing:.06em;font-size:11px;font-weight:bold;color:#fff;background:var(--muted);border-radius:3px;padding:2px 7px}
.v-fragmentation .tag{background:var(--orange)}
.v-true_oom .tag{background:var(--red)}
.why{margin:6px 0}
.fix{margin:8px 0;padding:8px 10px;background:#f2f7ee;border-radius:5px}
.fix ul{margin:4px 0 0 18px;padding:0}
.cmd{display:flex;gap:8px;align-items:center;margin:6px 0}
.cmd pre{margin:0;padding:6px 10px;background:#1e1e1e;color:#eee;border-radius:4px;font-size:14px}
.freecard{margin:10px 0;max-width:720px}
.fc-row{display:grid;grid-template-columns:150px 1fr 110px;gap:8px;align-items:center;margin:3px 0}
.fc-bar{background:#eee;height:14px;border-radius:3px;overflow:hidden}
.fc-bar i{display:block;height:100%}
.fc-v{font-weight:bold;text-align:right}
.cards{display:grid;grid-template-columns:repeat(6,1fr);gap:10px;margin-top:12px}
.card{border:1px solid var(--line);border-radius:6px;padding:8px 10px}
.card .k{color:var(--muted);font-size:12px}
.card .v{font-size:18px;font-weight:bold}
#card-requested .v{color:var(--red)}
#card-largest-free-block .v{color:var(--orange)}
.figure{overflow-x:auto}
.figure svg{display:block;max-width:100%;height:auto}
#map-info{color:var(--muted);min-height:1.4em;font-family:"DejaVu Sans Mono",monospace;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;white-space:nowrap}
th{color:var(--muted);font-weight:normal}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.mono{font-family:"DejaVu Sans Mono",monospace}
.notes li{color:var(--muted)}
.more{color:var(--muted)}
footer{color:var(--muted);font-size:12px}
"#;

const SCRIPT: &str = r#"
(function(){
  var info=document.getElementById('map-info');
  document.querySelectorAll('svg g.segment').forEach(function(g){
    g.addEventListener('mouseenter',function(){var t=g.querySelector('title');if(info&&t){info.textContent=t.textContent;}});
  });
  var n=0;
  document.querySelectorAll('[data-bytes]').forEach(function(e){
    if(!e.title){e.title=Number(e.getAttribute('data-bytes')).toLocaleString('en-US')+' B';}
    n++;
  });
  document.body.setAttribute('data-ready','1');
  document.body.setAttribute('data-byte-fields',String(n));
})();
"#;

/// The whole report.
pub fn html(data: &ReportData, oom: Option<usize>) -> String {
    let s = &data.summary;
    let mut out = String::with_capacity(256 * 1024);
    let title = match oom {
        Some(i) => format!("gpufrag: {} at OOM {}", s.ooms[i].verdict.name().replace('_', " "), i + 1),
        None => "gpufrag report".to_string(),
    };
    put(&mut out, format_args!("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n<title>{}</title>\n<style>{CSS}</style></head>\n<body data-schema=\"1\" data-events=\"{}\" data-exact=\"{}\">\n<main>\n", esc(&title), s.events, s.exact));
    put(
        &mut out,
        format_args!(
            "<header><h1>Where the GPU memory is, and why no request fits</h1><p class=\"src\">{} · {} events · {}{}</p></header>\n",
            esc(&s.source),
            group(s.events),
            if s.exact { "exact figures" } else { "figures NOT exact (see notes)" },
            if s.dropped > 0 { format!(" · {} events dropped", group(s.dropped)) } else { String::new() }
        ),
    );
    verdict_section(&mut out, s, oom);
    out.push_str("<section id=\"map-section\">\n<h2>Memory map</h2>\n");
    out.push_str("<p class=\"more\">Each bar is a segment the process holds from the driver, drawn to scale: blue is live blocks, orange is free memory stranded behind them (it merges only inside its own segment), green is a cached segment with nothing live; a paler blue pixel is only partly live (blocks smaller than a pixel). Under the segments, to the same scale: the failed request, the largest free run, all stranded pieces side by side, and what the driver still has free.</p>\n");
    for svg in map_svgs(data, oom) {
        out.push_str("<div class=\"figure\">\n");
        out.push_str(&svg);
        out.push_str("</div>\n");
    }
    out.push_str("<p id=\"map-info\"></p>\n</section>\n");
    out.push_str("<section id=\"timeline-section\">\n<h2>Over the trace</h2>\n");
    match &data.history {
        Some(h) if !h.series.is_empty() => {
            for (&d, _) in h.series.iter().take(8) {
                out.push_str("<div class=\"figure\">\n");
                out.push_str(&timeline::svg(d, &h.points(d), &h.marks));
                out.push_str("</div>\n");
            }
        }
        Some(_) => out.push_str("<p class=\"more\" id=\"timeline-empty\">No memory events in this trace.</p>\n"),
        None => out.push_str("<p class=\"more\" id=\"timeline-empty\">A summary has no history: report from a record file (<code>gpufrag run --record</code>) or a snapshot to see the figures over time.</p>\n"),
    }
    out.push_str("</section>\n");
    tables(&mut out, s);
    if !s.notes.is_empty() {
        out.push_str("<section id=\"notes\" class=\"notes\"><h2>Notes</h2><ul>\n");
        for n in &s.notes {
            put(&mut out, format_args!("<li>{}</li>\n", esc(n)));
        }
        out.push_str("</ul></section>\n");
    }
    put(&mut out, format_args!("<footer>gpufrag {} · figures defined in docs/metrics.md · hover a segment for its numbers</footer>\n</main>\n<script>{SCRIPT}</script>\n</body></html>\n", env!("CARGO_PKG_VERSION")));
    out
}
