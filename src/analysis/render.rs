//! The human form of a [`Summary`]: sizes in GiB/MiB as PyTorch prints them, one block per
//! device, the segments that strand the most, and every OOM with its verdict and fix.

use super::summary::{DeviceSummary, Summary};
use crate::units::{human_bytes, thousands};
use std::fmt::Write;

fn line(out: &mut String, name: &str, bytes: u64) {
    let _ = writeln!(out, "  {name:<21}{:>12}  ({} B)", human_bytes(bytes), thousands(bytes));
}

/// A figure's line with a note after its exact bytes.
fn line_noted(out: &mut String, name: &str, bytes: u64, note: &str) {
    let _ = writeln!(out, "  {name:<21}{:>12}  ({} B, {note})", human_bytes(bytes), thousands(bytes));
}

/// A size distribution's line: `label count noun: p50 …, p90 …[, p99 …], max …`; none when empty.
fn sizes(out: &mut String, label: &str, noun: &str, d: &crate::ingest::histogram::Distribution, p99: bool) {
    if d.count == 0 {
        return;
    }
    let p99 = if p99 { format!(", p99 {}", human_bytes(d.p99)) } else { String::new() };
    let _ = writeln!(
        out,
        "  {label:<21}{} {noun}: p50 {}, p90 {}{p99}, max {}",
        d.count,
        human_bytes(d.p50),
        human_bytes(d.p90),
        human_bytes(d.max)
    );
}

fn device(out: &mut String, d: &DeviceSummary, title: &str) {
    let level = if d.map.framework_seen {
        "block level: figures inside the caching allocator's segments"
    } else {
        "segment level: driver allocations only, no framework blocks seen"
    };
    let _ = writeln!(out, "{title} ({level})");
    line(out, "reserved", d.map.reserved);
    if d.map.non_framework > 0 && d.map.framework_seen {
        // Both parts of reserved: the caching allocator's segments and driver memory beside them.
        line(out, "  held by the cache", d.map.framework_reserved);
        line(out, "  outside the cache", d.map.non_framework);
    }
    line(out, "allocated", d.map.allocated);
    let ratio = format!("{:.1} % of reserved; PyTorch's inactive_split: free, but not releasable", d.stranded_ratio * 100.0);
    line_noted(out, "stranded", d.map.stranded, &ratio);
    line_noted(out, "releasable", d.map.releasable, "what empty_cache() returns");
    line(out, "largest free block", d.map.largest_free_block);
    match d.device_free {
        Some(free) => line(out, "device free", free),
        None => {
            let _ = writeln!(out, "  {:<21}{:>12}", "device free", "not measured");
        }
    }
    line(out, "largest allocatable", d.largest_allocatable);
    let _ = writeln!(out, "  {:<21}{:>12.2}", "fragmentation", d.fragmentation);
    let _ = writeln!(out, "  {:<21}{:>12}  blocks {}", "segments", d.map.segments, d.map.blocks);
    if d.map.page_stranded > 0 {
        line(out, "page-stranded", d.map.page_stranded);
    }
    if d.map.pool_cached > 0 {
        line(out, "pool cached", d.map.pool_cached);
    }
    sizes(out, "allocation sizes", "allocations", &d.alloc_sizes, true);
    sizes(out, "free runs", "runs", &d.free_runs, false);
    if !d.top_stranded_segments.is_empty() {
        let _ = writeln!(out, "  segments stranding the most:");
        let _ = writeln!(out, "    {:<18} {:>8} {:>12} {:>12} {:>6} {:>14}", "address", "pid", "size", "stranded", "live", "largest free");
        for s in &d.top_stranded_segments {
            let _ = writeln!(
                out,
                "    {:<18} {:>8} {:>12} {:>12} {:>6} {:>14}",
                format!("{:#x}", s.address),
                s.pid,
                human_bytes(s.size),
                human_bytes(s.stranded),
                s.live_blocks,
                human_bytes(s.largest_free_run)
            );
        }
    }
}

/// Each process's driver memory by the library that called the driver (the summary's `owners`),
/// largest first; only where two owners or more share it ([`Summary::owner_splits`]).
fn owners(out: &mut String, s: &Summary) {
    let per = s.owner_splits();
    if per.is_empty() {
        return;
    }
    let _ = writeln!(out, "\ndriver memory by owner (the library that called the driver; sums to the process's reserved)");
    for (p, o) in per {
        let parts: Vec<String> = o.iter().map(|(k, b)| format!("{k} {}", human_bytes(*b))).collect();
        let who = Summary::process_label(p);
        let _ = writeln!(out, "  {who} on device {}: {}", p.figures.device, parts.join(", "));
    }
}

/// The whole summary as text.
pub fn render(s: &Summary) -> String {
    render_ooms(s, true)
}

/// The summary of a live command (`run`, `attach`, `agent`), whose OOM verdicts, explanations
/// and fixes were printed the moment each allocation failed: each OOM is one line here.
pub fn render_after_live(s: &Summary) -> String {
    render_ooms(s, false)
}

fn render_ooms(s: &Summary, explain: bool) -> String {
    let mut out = String::new();
    let exact = if s.exact { "exact" } else { "NOT exact: see notes" };
    let _ = writeln!(out, "gpufrag: {} ({} events, {exact})", s.source, s.events);
    for d in &s.devices {
        out.push('\n');
        let title = match (&d.hw_id, &d.mig_parent) {
            (Some(mig), Some(gpu)) => format!("device {} (MIG instance {mig} of {gpu})", d.device),
            _ => format!("device {}", d.device),
        };
        device(&mut out, d, &title);
    }
    if s.processes.len() > 1 {
        for p in &s.processes {
            out.push('\n');
            let who = super::summary::Summary::process_label(p);
            let gpu = p.figures.hw_id.as_deref().map(|u| format!(" ({u})")).unwrap_or_default();
            device(&mut out, &p.figures, &format!("process {} on device {}{gpu}", who.trim_start_matches("pid "), p.figures.device));
        }
    }
    owners(&mut out, s);
    if s.ooms.is_empty() {
        let _ = writeln!(out, "\nno failed allocation in this trace");
    }
    if s.retries > 0 {
        let per: Vec<String> = s.processes.iter().filter(|p| p.retries > 0).map(|p| format!("pid {}: {}", p.pid, p.retries)).collect();
        let _ = writeln!(
            out,
            "\n{} recovered allocation(s) (retries: the same thread's next allocation of that size succeeded after memory was released; not OOMs): {}",
            s.retries,
            per.join(", ")
        );
    }
    if !explain && !s.ooms.is_empty() {
        let _ = writeln!(out);
    }
    for (i, o) in s.ooms.iter().enumerate() {
        let ctr = o.container_id.as_deref().map(|c| format!(", container {}", &c[..c.len().min(12)])).unwrap_or_default();
        if !explain {
            let _ = writeln!(
                out,
                "OOM {} on device {} (pid {}{ctr}): {} requested: {} (explained above)",
                i + 1,
                o.device,
                o.pid,
                human_bytes(o.requested),
                o.verdict.name()
            );
            continue;
        }
        let _ = writeln!(out, "\nOOM {} on device {} (pid {}{ctr}): {} requested", i + 1, o.device, o.pid, human_bytes(o.requested));
        let _ = writeln!(out, "  verdict: {}", o.verdict.name());
        if o.driver_failures_before > 0 {
            let _ =
                writeln!(out, "  (after {} failed driver allocation(s): the allocator's own tries and retries)", o.driver_failures_before);
        }
        let _ = writeln!(out, "  {}", o.explanation);
        let _ = writeln!(out, "  fix: {}", o.fix);
    }
    if !s.notes.is_empty() {
        let _ = writeln!(out, "\nnotes:");
        for n in &s.notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    out
}
