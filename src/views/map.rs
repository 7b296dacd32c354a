//! The memory map picture: every segment of one process on one device as a bar, its live blocks,
//! its stranded free runs and releasable space in their colours, and under it, TO THE SAME SCALE,
//! the failed request, the largest free run, all stranded pieces side by side and what the driver
//! still has free, so that the eye sees at once that the request fits nowhere.
//!
//! One SVG, no script. Big maps stay light: each bar is drawn at one sample per pixel (a stretch
//! of tiny blocks becomes one pixel whose opacity says how much of it is live), neighbouring
//! pixels alike merge into one rectangle, and past [`ROW_LAYOUT_MAX`] segments the bars are packed
//! into rows without per-segment labels. Every number the picture shows is also on its element as
//! a `data-` attribute (exact bytes), under stable ids, for tests and scripts.

use super::strip::{largest_free_run, live_fractions};
use super::svg::{self as s, esc, put, short_bytes};
use crate::ingest::ProcessDevice;
use crate::map::Segment;

/// Up to this many segments, one labelled row each; more are packed.
pub const ROW_LAYOUT_MAX: usize = 40;
/// Most rectangles drawn for live runs across the whole map; past it bars are sampled coarser.
pub const MAX_LIVE_RECTS: usize = 20_000;

const W: f64 = 1200.0;
const X0: f64 = 210.0;
const PLOT_W: f64 = 640.0;
const NOTE_X: f64 = X0 + PLOT_W + 14.0;
const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";

/// The reference bars drawn under the segments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bars {
    /// The failed request, if the map is drawn at a failure.
    pub requested: Option<u64>,
    /// The largest free run inside one segment.
    pub largest_free_block: u64,
    /// Free bytes on the device, when measured.
    pub device_free: Option<u64>,
    /// Stranded bytes in all.
    pub stranded: u64,
    /// The stranded free runs, one entry each, when known (empty: drawn as one bar).
    pub stranded_pieces: Vec<u64>,
    /// Releasable bytes.
    pub releasable: u64,
}

impl Bars {
    /// The bars of a map: its stranded free runs and largest free run, with the request and the
    /// device's free bytes at the moment drawn.
    pub fn of_space(space: &ProcessDevice, requested: Option<u64>, device_free: Option<u64>) -> Bars {
        let m = &space.map;
        let f = m.figures();
        let mut pieces = Vec::new();
        for seg in m.segments().filter(|g| g.stranded() > 0) {
            pieces.extend(m.free_runs_in(seg.start, seg.end()).map(|(_, l)| l));
        }
        Bars {
            requested,
            largest_free_block: f.largest_free_block,
            device_free,
            stranded: f.stranded,
            stranded_pieces: pieces,
            releasable: f.releasable,
        }
    }
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct MapSpec<'a> {
    /// The process's map on one device (absent: only the reference bars, e.g. from a summary).
    pub space: Option<&'a ProcessDevice>,
    /// First line.
    pub title: String,
    /// Second line.
    pub subtitle: String,
    /// The reference bars.
    pub bars: Bars,
}

fn seg_title(g: &Segment, largest: u64) -> String {
    let mut t = format!("{:#x}: {} segment of {} ({} B)", g.start, g.kind.name(), short_bytes(g.size), g.size);
    if !g.framework {
        t.push_str(", not the caching allocator's: in use in full");
    } else if g.live_blocks == 0 {
        t.push_str(&format!(", no live block: {} releasable", short_bytes(g.size)));
    } else {
        t.push_str(&format!(
            ", {} live in {} block{}, {} stranded, largest free run {}",
            short_bytes(g.live_bytes),
            g.live_blocks,
            if g.live_blocks == 1 { "" } else { "s" },
            short_bytes(g.stranded()),
            short_bytes(largest)
        ));
    }
    t
}

struct Ctx {
    out: String,
    scale: f64,
}

impl Ctx {
    fn px(&self, b: u64) -> f64 {
        b as f64 * self.scale
    }
    #[allow(clippy::too_many_arguments)]
    fn text(&mut self, x: f64, y: f64, size: f64, anchor: &str, fill: &str, extra: &str, body: &str) {
        put(
            &mut self.out,
            format_args!(
                "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\" fill=\"{fill}\"{extra}>{}</text>\n",
                esc(body)
            ),
        );
    }
}

/// A bar clipped to the plot, with a break mark when it is longer.
#[allow(clippy::too_many_arguments)]
fn bar(c: &mut Ctx, id: &str, y: f64, h: f64, bytes: u64, fill: &str, stroke: Option<&str>, label: &str, note: &str) {
    let full = c.px(bytes);
    let w = full.min(PLOT_W);
    c.text(X0 - 8.0, y + h * 0.75, 12.0, "end", "#222", "", label);
    let st = stroke.map(|s| format!(" stroke=\"{s}\" stroke-width=\"2\"")).unwrap_or_default();
    put(
        &mut c.out,
        format_args!(
            "<rect id=\"{id}\" data-bytes=\"{bytes}\" x=\"{X0:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{fill}\"{st}><title>{}</title></rect>\n",
            w.max(if bytes > 0 { 1.0 } else { 0.0 }),
            esc(&format!("{label}: {} ({bytes} B)", short_bytes(bytes)))
        ),
    );
    if full > PLOT_W + 0.5 {
        let bx = X0 + PLOT_W - 18.0;
        put(
            &mut c.out,
            format_args!(
                "<path d=\"M{:.1} {:.1} l6 {h:.1} M{:.1} {:.1} l6 {h:.1}\" stroke=\"#fff\" stroke-width=\"3\"/>\n",
                bx,
                y,
                bx + 6.0,
                y
            ),
        );
    }
    c.text(NOTE_X, y + h * 0.75, 12.0, "start", "#222", "", note);
}

/// Where the segments go: one row each (up to [`ROW_LAYOUT_MAX`]) or packed rows, and the
/// height of the whole picture.
struct Placement {
    rows_layout: bool,
    bar_h: f64,
    /// Each segment's (x, y, width).
    placed: Vec<(f64, f64, f64)>,
    /// Packed layout: each row's y and its first segment.
    row_starts: Vec<(f64, usize)>,
    bars_top: f64,
    height: f64,
}

/// The map as one SVG document: the header and legend, the byte axis, the segments, and the
/// reference bars on the same scale.
pub fn svg(spec: &MapSpec<'_>) -> String {
    let b = &spec.bars;
    let segs: Vec<&Segment> = spec.space.map(|s| s.map.segments().collect()).unwrap_or_default();
    let max_seg = segs.iter().map(|g| g.size).max().unwrap_or(0);
    let domain = max_seg.max(b.requested.unwrap_or(0)).max(b.largest_free_block).max(1);
    let mut c = Ctx { out: String::with_capacity(64 * 1024), scale: PLOT_W / domain as f64 };
    let pl = place(&c, &segs, b.releasable > 0);
    header(&mut c, spec, &segs, &pl, domain);
    let axis_y = 100.0;
    axis(&mut c, domain, axis_y, pl.height);
    segments(&mut c, spec, &segs, &pl);
    reference_bars(&mut c, b, pl.bars_top, axis_y);
    c.out.push_str("</svg>\n");
    c.out
}

/// Lays the segments out (see [`Placement`]).
fn place(c: &Ctx, segs: &[&Segment], releasable_bar: bool) -> Placement {
    let rows_layout = segs.len() <= ROW_LAYOUT_MAX;
    // Geometry of the segment area.
    let (bar_h, pitch) = if rows_layout { (16.0, 22.0) } else { (12.0, 17.0) };
    let top = 112.0;
    let mut placed: Vec<(f64, f64, f64)> = Vec::with_capacity(segs.len()); // (x, y, w)
    let mut row_starts: Vec<(f64, usize)> = Vec::new();
    if rows_layout {
        for (i, g) in segs.iter().enumerate() {
            let y = top + i as f64 * pitch;
            placed.push((X0, y, c.px(g.size).max(1.0)));
        }
    } else {
        let gap = 3.0;
        let (mut x, mut y) = (0.0f64, top);
        row_starts.push((y, 0));
        for (i, g) in segs.iter().enumerate() {
            let w = c.px(g.size).max(1.0);
            if x > 0.0 && x + w > PLOT_W {
                x = 0.0;
                y += pitch;
                row_starts.push((y, i));
            }
            placed.push((X0 + x, y, w.min(PLOT_W)));
            x += w + gap;
        }
    }
    let seg_bottom = placed.last().map_or(top, |p| p.1 + pitch);
    let n_bars = 4 + usize::from(releasable_bar);
    let bars_top = seg_bottom + 34.0;
    let height = bars_top + n_bars as f64 * 26.0 + 28.0;

    Placement { rows_layout, bar_h, placed, row_starts, bars_top, height }
}

/// The `<svg>` element with the figures as data attributes, the title, subtitle and legend.
fn header(c: &mut Ctx, spec: &MapSpec<'_>, segs: &[&Segment], pl: &Placement, domain: u64) {
    let b = &spec.bars;
    let (rows_layout, height) = (pl.rows_layout, pl.height);
    let fig = spec.space.map(|s| s.map.figures()).unwrap_or_default();
    let (pid, device) = spec.space.map_or((String::new(), String::new()), |s| (s.pid.to_string(), s.device.to_string()));
    put(
        &mut c.out,
        format_args!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"memory-map\" viewBox=\"0 0 {W} {height:.0}\" width=\"{W}\" height=\"{height:.0}\" font-family=\"{FONT}\" \
data-segments=\"{}\" data-layout=\"{}\" data-pid=\"{pid}\" data-device=\"{device}\" data-requested=\"{}\" data-largest-free-block=\"{}\" data-stranded=\"{}\" \
data-releasable=\"{}\" data-reserved=\"{}\" data-allocated=\"{}\" data-device-free=\"{}\" data-scale-bytes=\"{domain}\">\n",
            segs.len(),
            if rows_layout { "rows" } else { "packed" },
            b.requested.map(|r| r.to_string()).unwrap_or_default(),
            b.largest_free_block,
            b.stranded,
            b.releasable,
            fig.reserved,
            fig.allocated,
            b.device_free.map(|r| r.to_string()).unwrap_or_default(),
        ),
    );
    put(&mut c.out, format_args!("<rect width=\"{W}\" height=\"{height:.0}\" fill=\"#fff\"/>\n"));
    c.text(16.0, 26.0, 17.0, "start", "#111", " font-weight=\"bold\"", &spec.title);
    c.text(16.0, 46.0, 12.5, "start", "#555", "", &spec.subtitle);

    // Legend.
    let legend: [(&str, &str, &str); 6] = [
        ("live block", s::LIVE, ""),
        ("stranded: free, segment still in use", s::STRANDED, ""),
        ("releasable: free segment", s::RELEASABLE, ""),
        ("not the allocator's", s::RAW, ""),
        ("largest free run", "none", s::REQUEST),
        ("failed request", s::REQUEST, ""),
    ];
    let mut lx = 16.0;
    for (name, fill, stroke) in legend {
        let st = if stroke.is_empty() { String::new() } else { format!(" stroke=\"{stroke}\" stroke-width=\"2\"") };
        put(&mut c.out, format_args!("<rect x=\"{lx:.1}\" y=\"58\" width=\"12\" height=\"12\" fill=\"{fill}\"{st}/>\n"));
        c.text(lx + 17.0, 68.5, 12.0, "start", "#333", "", name);
        lx += 17.0 + name.len() as f64 * 6.6 + 18.0;
    }
}

/// The byte axis, with grid lines through the segment area and the bars.
fn axis(c: &mut Ctx, domain: u64, axis_y: f64, height: f64) {
    // Axis with grid lines through the segment area and the bars.
    put(&mut c.out, format_args!("<g id=\"map-axis\" font-size=\"11\" fill=\"#555\">\n"));
    c.text(X0 - 16.0, axis_y - 4.0, 11.0, "end", "#555", "", "bytes, one scale for every bar");
    for t in s::byte_ticks(domain) {
        let x = X0 + c.px(t);
        if x > X0 + PLOT_W + 0.5 {
            break;
        }
        put(
            &mut c.out,
            format_args!(
                "<line x1=\"{x:.1}\" y1=\"{axis_y}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
                height - 20.0,
                axis_y - 4.0,
                esc(&short_bytes(t))
            ),
        );
    }
    put(&mut c.out, format_args!("<line x1=\"{X0}\" y1=\"{axis_y}\" x2=\"{:.1}\" y2=\"{axis_y}\" stroke=\"#888\"/>\n</g>\n", X0 + PLOT_W));
}

/// The segments: each one's background by what it is, its live blocks, its outline and labels;
/// the largest free run outlined.
fn segments(c: &mut Ctx, spec: &MapSpec<'_>, segs: &[&Segment], pl: &Placement) {
    let (rows_layout, bar_h, placed) = (pl.rows_layout, pl.bar_h, &pl.placed);
    // Segments.
    let total_px: f64 = placed.iter().map(|p| p.2).sum();
    let px_per_bin = if total_px > MAX_LIVE_RECTS as f64 { total_px / MAX_LIVE_RECTS as f64 } else { 1.0 };
    let largest = spec.space.and_then(|sp| largest_free_run(&sp.map));
    let mut largest_rect: Option<(f64, f64, f64, u64)> = None;
    put(&mut c.out, format_args!("<g id=\"segments\">\n"));
    for (i, g) in segs.iter().enumerate() {
        let Some(space) = spec.space else { break };
        let (x, y, w) = placed[i];
        let largest_here = space.map.free_runs_in(g.start, g.end()).map(|(_, l)| l).max().unwrap_or(0);
        let bg = if !g.framework {
            s::RAW
        } else if g.live_blocks == 0 {
            s::RELEASABLE
        } else {
            s::STRANDED
        };
        put(
            &mut c.out,
            format_args!(
                "<g class=\"segment\" data-address=\"{}\" data-size=\"{}\" data-kind=\"{}\" data-framework=\"{}\" data-live=\"{}\" data-live-blocks=\"{}\" data-stranded=\"{}\" data-releasable=\"{}\" data-largest-free-run=\"{}\">\n<title>{}</title>\n<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{bar_h}\" fill=\"{bg}\"/>\n",
                g.start,
                g.size,
                g.kind.name(),
                g.framework,
                if g.framework { g.live_bytes } else { g.size },
                g.live_blocks,
                g.stranded(),
                g.releasable(),
                largest_here,
                esc(&seg_title(g, largest_here)),
            ),
        );
        if g.framework && g.live_blocks > 0 {
            live_rects(c, &space.map, g, (x, y, w), bar_h, px_per_bin);
        }
        put(&mut c.out, format_args!("<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{bar_h}\" fill=\"none\" stroke=\"#333\" stroke-width=\"0.6\"/>\n"));
        if let Some((ls, ll)) = largest {
            if ls >= g.start && ls < g.end() {
                let lx = x + (ls - g.start) as f64 / g.size as f64 * w;
                let lw = (ll as f64 / g.size as f64 * w).max(1.5);
                largest_rect = Some((lx, y, lw, ll));
            }
        }
        if rows_layout {
            c.text(
                X0 - 8.0,
                y + bar_h * 0.78,
                11.0,
                "end",
                "#333",
                " font-family=\"DejaVu Sans Mono, monospace\"",
                &format!("{:#x}  {:>8}", g.start, short_bytes(g.size)),
            );
            let note = if !g.framework {
                "in use (not the allocator's)".to_string()
            } else if g.live_blocks == 0 {
                format!("{} releasable", short_bytes(g.size))
            } else if g.stranded() == 0 {
                format!("{} live, full", short_bytes(g.live_bytes))
            } else {
                format!("{} live · {} stranded", short_bytes(g.live_bytes), short_bytes(g.stranded()))
            };
            c.text(NOTE_X, y + bar_h * 0.78, 11.5, "start", "#333", "", &note);
        }
        c.out.push_str("</g>\n");
    }
    if !rows_layout {
        packed_row_labels(c, segs, &pl.row_starts, bar_h);
    }
    c.out.push_str("</g>\n");
    if let Some((lx, ly, lw, ll)) = largest_rect {
        put(
            &mut c.out,
            format_args!(
                "<rect id=\"largest-free-run\" data-bytes=\"{ll}\" x=\"{lx:.2}\" y=\"{:.1}\" width=\"{lw:.2}\" height=\"{:.1}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"><title>largest free run: {} ({ll} B)</title></rect>\n",
                ly - 1.0,
                bar_h + 2.0,
                s::REQUEST,
                esc(&short_bytes(ll))
            ),
        );
    }
}

/// The live blocks of segment `g` drawn at `(x, y, w)`: its width in bins of `px_per_bin`, each
/// bin's live share in four levels, runs of one level one rectangle.
fn live_rects(c: &mut Ctx, map: &crate::map::AddressSpace, g: &Segment, (x, y, w): (f64, f64, f64), bar_h: f64, px_per_bin: f64) {
    let bins = ((w / px_per_bin).ceil() as usize).clamp(1, 4096);
    let f = live_fractions(map, g, bins);
    let q = |v: f64| -> u8 {
        if v <= 0.0 {
            0
        } else if v < 0.5 {
            1
        } else if v < 0.999 {
            2
        } else {
            3
        }
    };
    let bw = w / bins as f64;
    let mut i0 = 0;
    while i0 < bins {
        let level = q(f[i0]);
        let mut i1 = i0 + 1;
        while i1 < bins && q(f[i1]) == level {
            i1 += 1;
        }
        if level > 0 {
            let op = [0.0, 0.4, 0.72, 1.0][level as usize];
            let op = if level == 3 { String::new() } else { format!(" fill-opacity=\"{op}\"") };
            put(
                &mut c.out,
                format_args!(
                    "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{bar_h}\" fill=\"{}\"{op}/>\n",
                    x + i0 as f64 * bw,
                    (i1 - i0) as f64 * bw,
                    s::LIVE
                ),
            );
        }
        i0 = i1;
    }
}

/// The packed layout's row labels: each row's first address and its segments' numbers.
fn packed_row_labels(c: &mut Ctx, segs: &[&Segment], row_starts: &[(f64, usize)], bar_h: f64) {
    for (k, &(y, first)) in row_starts.iter().enumerate() {
        let last = row_starts.get(k + 1).map_or(segs.len(), |r| r.1) - 1;
        c.text(
            X0 - 8.0,
            y + bar_h * 0.85,
            11.0,
            "end",
            "#333",
            " font-family=\"DejaVu Sans Mono, monospace\"",
            &format!("{:#x}", segs[first].start),
        );
        c.text(NOTE_X, y + bar_h * 0.85, 11.0, "start", "#666", "", &format!("segments {}–{}", first + 1, last + 1));
    }
}

/// The reference bars on the map's scale: the failed request, the largest free run, the
/// stranded pieces side by side, the device's free memory, releasable; the request's line.
fn reference_bars(c: &mut Ctx, b: &Bars, bars_top: f64, axis_y: f64) {
    // The reference bars, same scale.
    let sep = bars_top - 16.0;
    put(&mut c.out, format_args!("<line x1=\"16\" y1=\"{sep:.1}\" x2=\"{:.1}\" y2=\"{sep:.1}\" stroke=\"#bbb\"/>\n", W - 16.0));
    c.text(16.0, sep + 13.0, 11.5, "start", "#666", " font-style=\"italic\"", "the same scale:");
    let mut y = bars_top;
    let bh = 16.0;
    match b.requested {
        Some(r) => {
            let verdict_note = if r > b.largest_free_block {
                format!("{}: fits in no free run", short_bytes(r))
            } else {
                format!("{}: would fit in the largest free run", short_bytes(r))
            };
            bar(c, "bar-request", y, bh, r, s::REQUEST, None, "failed request", &verdict_note);
        }
        None => c.text(X0, y + bh * 0.75, 12.0, "start", "#666", " id=\"bar-request\"", "no failed request at this moment"),
    }
    y += 26.0;
    let ratio = match b.requested {
        Some(r) if b.largest_free_block > 0 && r > b.largest_free_block => {
            format!(" (the request is {:.1}× larger)", r as f64 / b.largest_free_block as f64)
        }
        _ => String::new(),
    };
    bar(
        c,
        "bar-largest-free",
        y,
        bh,
        b.largest_free_block,
        s::STRANDED,
        Some(s::REQUEST),
        "largest free run",
        &format!("{}{ratio}", short_bytes(b.largest_free_block)),
    );
    y += 26.0;
    // Stranded pieces side by side.
    c.text(X0 - 8.0, y + bh * 0.75, 12.0, "end", "#222", "", "stranded, all pieces");
    put(
        &mut c.out,
        format_args!(
            "<g id=\"bar-stranded\" data-bytes=\"{}\" data-pieces=\"{}\">\n",
            b.stranded,
            b.stranded_pieces.len().max(usize::from(b.stranded > 0))
        ),
    );
    let pieces: Vec<u64> = if b.stranded_pieces.is_empty() && b.stranded > 0 { vec![b.stranded] } else { b.stranded_pieces.clone() };
    let mut x = X0;
    let mut drawn = 0usize;
    for p in &pieces {
        let w = c.px(*p).max(1.0);
        if x + w > X0 + PLOT_W {
            break;
        }
        put(&mut c.out, format_args!("<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{bh}\" fill=\"{}\"/>\n", s::STRANDED));
        x += w + 2.0;
        drawn += 1;
    }
    c.out.push_str("</g>\n");
    let more = if drawn < pieces.len() { format!(" ({} more not drawn)", pieces.len() - drawn) } else { String::new() };
    let n = if b.stranded_pieces.is_empty() {
        String::new()
    } else {
        format!(" in {} piece{}", pieces.len(), if pieces.len() == 1 { "" } else { "s" })
    };
    c.text(NOTE_X, y + bh * 0.75, 12.0, "start", "#222", "", &format!("{}{n}{more}", short_bytes(b.stranded)));
    y += 26.0;
    match b.device_free {
        Some(free) => {
            let one = crate::analysis::largest_allocatable(0, free, 0);
            bar(
                c,
                "bar-device-free",
                y,
                bh,
                free,
                s::DEVICE_FREE,
                None,
                "device free (driver)",
                &format!("{}: a new segment gets at most {}", short_bytes(free), short_bytes(one)),
            );
        }
        None => {
            c.text(X0 - 8.0, y + bh * 0.75, 12.0, "end", "#222", "", "device free (driver)");
            c.text(X0, y + bh * 0.75, 12.0, "start", "#666", " id=\"bar-device-free\"", "not measured");
        }
    }
    y += 26.0;
    if b.releasable > 0 {
        bar(c, "bar-releasable", y, bh, b.releasable, s::RELEASABLE, None, "releasable (empty_cache)", &short_bytes(b.releasable));
    }
    if let Some(r) = b.requested {
        let x = X0 + c.px(r).min(PLOT_W);
        put(
            &mut c.out,
            format_args!(
                "<line id=\"request-line\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"5 4\"/>\n",
                axis_y,
                bars_top + bh,
                s::REQUEST
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::{AddressSpace, SegmentKind};

    const MIB: u64 = 1 << 20;

    fn frag_oom_space() -> ProcessDevice {
        let mut m = AddressSpace::default();
        let base = 0x7f00_0000_0000u64;
        for i in 0..20 {
            let a = base + i * 600 * MIB;
            m.driver_alloc(a, 500 * MIB, SegmentKind::Driver, true, 0).expect("test setup");
            m.block_alloc(a, 500 * MIB, None).expect("test setup");
        }
        for i in (0..20).step_by(2) {
            m.block_free(base + i * 600 * MIB).expect("test setup");
            m.block_alloc(base + i * 600 * MIB, 300 * MIB, None).expect("test setup");
        }
        ProcessDevice {
            pid: 0,
            device: 0,
            map: m,
            block_sizes: Default::default(),
            segment_sizes: Default::default(),
            allocs: 0,
            frees: 0,
            framework: None,
            owners: Default::default(),
        }
    }

    #[test]
    fn the_map_carries_its_numbers_and_one_group_per_segment() {
        let space = frag_oom_space();
        let bars = Bars::of_space(&space, Some(2_684_354_560), Some(2_398_224_384));
        assert_eq!(bars.stranded_pieces, vec![200 * MIB; 10]);
        let svg = svg(&MapSpec { space: Some(&space), title: "t".into(), subtitle: "s".into(), bars });
        assert_eq!(svg.matches("class=\"segment\"").count(), 20);
        assert!(svg.contains("data-requested=\"2684354560\""));
        assert!(svg.contains("data-largest-free-block=\"209715200\""));
        assert!(svg.contains("data-stranded=\"2097152000\""));
        assert!(svg.contains("id=\"largest-free-run\" data-bytes=\"209715200\""));
        assert!(svg.contains("id=\"bar-request\" data-bytes=\"2684354560\""));
    }
}
