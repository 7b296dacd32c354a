//! The timeline picture: reserved, allocated, stranded and device-free bytes of one device across
//! the trace, with every failed allocation marked where it happened. Points come from
//! [`History`](super::history::History) (each the maximum of its stretch of events); the x axis
//! is time when the events carry time stamps, else the event index. The time axis starts at the
//! first event that holds memory (or fails), and says how long after the trace's first event
//! that was: a program's start-up is not drawn as an empty stretch.

use super::history::{OomMark, Point};
use super::svg::{self as s, esc, put, short_bytes};

const W: f64 = 1200.0;
const H: f64 = 300.0;
const X0: f64 = 90.0;
const X1: f64 = 1170.0;
const Y0: f64 = 60.0;
const Y1: f64 = 250.0;
const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";

/// Where a time (or event index) and a byte count fall on the picture.
struct Scale {
    /// The x axis is time from its start, `t_min` (else the event index).
    by_time: bool,
    /// Where the time axis starts: the first event that holds memory or fails ([`axis_start`]).
    t_min: u64,
    t_max: u64,
    /// How long before `t_min` the trace's first time-stamped event came (0: it is `t_min`).
    lead_ns: u64,
    /// The last point's event index (the x axis's end without time stamps).
    last_index: u64,
    /// The y axis's top, in bytes (the highest tick).
    y_top: f64,
}

/// Where the time axis starts, and the trace's first time stamp: the first point that holds
/// memory (reserved or allocated above 0) or the first OOM, whichever is earlier; without
/// either, the first time-stamped event. A process's start-up before its first allocation (a
/// device-free reading at `cuInit`, then the program's own set-up) is no part of the picture: it
/// left 95 % of the demo's axis empty (issue 27). Earlier points are drawn at the axis's start.
fn axis_start(points: &[Point], marks: &[&OomMark]) -> (u64, u64) {
    let stamped = |t: &u64| *t > 0;
    let first = points.iter().map(|p| p.t_ns).chain(marks.iter().map(|m| m.t_ns)).filter(stamped).min().unwrap_or(0);
    let held = points
        .iter()
        .filter(|p| p.reserved > 0 || p.allocated > 0)
        .map(|p| p.t_ns)
        .chain(marks.iter().map(|m| m.t_ns))
        .filter(stamped)
        .min()
        .unwrap_or(first);
    (held, first)
}

impl Scale {
    fn new(points: &[Point], marks: &[&OomMark], y_top: f64) -> Scale {
        let (t_min, first) = axis_start(points, marks);
        let t_max = points.iter().map(|p| p.t_ns).chain(marks.iter().map(|m| m.t_ns)).max().unwrap_or(0);
        Scale {
            by_time: t_max > t_min,
            t_min,
            t_max,
            lead_ns: t_min.saturating_sub(first),
            last_index: points.last().map_or(1, |p| p.index.max(1)),
            y_top,
        }
    }

    fn x(&self, t_ns: u64, index: u64) -> f64 {
        let (v, hi) = if self.by_time {
            (t_ns.saturating_sub(self.t_min) as f64, (self.t_max - self.t_min) as f64)
        } else {
            (index as f64, self.last_index as f64)
        };
        X0 + v / hi.max(1.0) * (X1 - X0)
    }

    fn y(&self, b: u64) -> f64 {
        Y1 - b as f64 / self.y_top * (Y1 - Y0)
    }
}

/// The timeline of one device as one SVG document.
pub fn svg(device: i16, points: &[Point], marks: &[OomMark]) -> String {
    let mut out = String::with_capacity(32 * 1024);
    let marks: Vec<&OomMark> = marks.iter().filter(|m| m.device == device).collect();
    let y_max = points
        .iter()
        .map(|p| p.reserved.max(p.allocated).max(p.stranded).max(p.device_free.unwrap_or(0)))
        .chain(marks.iter().map(|m| m.requested))
        .max()
        .unwrap_or(0)
        .max(1);
    let ticks = s::byte_ticks(y_max);
    let scale = Scale::new(points, &marks, (*ticks.last().unwrap_or(&y_max)).max(y_max) as f64);
    let peak = points.iter().map(|p| p.reserved).max().unwrap_or(0);
    put(
        &mut out,
        format_args!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"timeline-dev{device}\" class=\"timeline\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" font-family=\"{FONT}\" \
data-device=\"{device}\" data-points=\"{}\" data-ooms=\"{}\" data-peak-reserved=\"{peak}\" data-axis=\"{}\">\n<rect width=\"{W}\" height=\"{H}\" fill=\"#fff\"/>\n",
            points.len(),
            marks.len(),
            if scale.by_time { "time" } else { "events" }
        ),
    );
    put(
        &mut out,
        format_args!("<text x=\"16\" y=\"24\" font-size=\"16\" font-weight=\"bold\" fill=\"#111\">Device {device} over the trace</text>\n"),
    );
    legend(&mut out);
    axes(&mut out, &scale, &ticks);
    series(&mut out, device, points, &scale);
    oom_marks(&mut out, &marks, &scale);
    out.push_str("</svg>\n");
    out
}

/// The legend line under the title.
fn legend(out: &mut String) {
    let legend = [
        ("reserved", s::RESERVED, ""),
        ("allocated", s::LIVE, ""),
        ("stranded", s::STRANDED, ""),
        ("device free", s::DEVICE_FREE, " stroke-dasharray=\"5 3\""),
        ("OOM", s::REQUEST, ""),
    ];
    let mut lx = 16.0;
    for (name, color, dash) in legend {
        put(out, format_args!("<line x1=\"{lx}\" y1=\"42\" x2=\"{:.0}\" y2=\"42\" stroke=\"{color}\" stroke-width=\"2.5\"{dash}/><text x=\"{:.0}\" y=\"46\" font-size=\"12\" fill=\"#333\">{name}</text>\n", lx + 22.0, lx + 27.0));
        lx += 27.0 + name.len() as f64 * 7.0 + 20.0;
    }
    put(
        out,
        format_args!(
            "<text x=\"{:.0}\" y=\"46\" font-size=\"11\" fill=\"#777\">each point is the maximum over its stretch of events</text>\n",
            lx + 10.0
        ),
    );
}

/// The byte ticks, the time (or event) axis and the two axis lines.
fn axes(out: &mut String, scale: &Scale, ticks: &[u64]) {
    for t in ticks {
        let y = scale.y(*t);
        put(out, format_args!("<line x1=\"{X0}\" y1=\"{y:.1}\" x2=\"{X1}\" y2=\"{y:.1}\" stroke=\"#ececec\"/><text x=\"{:.0}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{}</text>\n", X0 - 6.0, y + 4.0, esc(&short_bytes(*t))));
    }
    if scale.by_time {
        let span = (scale.t_max - scale.t_min) as f64 / 1e9;
        let ticks = s::second_ticks(span);
        let step = ticks.get(1).copied().unwrap_or(1.0);
        for t in ticks {
            let x = X0 + t / span.max(1e-12) * (X1 - X0);
            put(out, format_args!("<line x1=\"{x:.1}\" y1=\"{Y1}\" x2=\"{x:.1}\" y2=\"{:.0}\" stroke=\"#888\"/><text x=\"{x:.1}\" y=\"{:.0}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n", Y1 + 4.0, Y1 + 17.0, esc(&s::seconds_label(t, step))));
        }
        // Say where the axis starts: the first event that holds memory, and how long the
        // program ran before it.
        let label = if scale.lead_ns > 0 {
            format!(
                "time since the first allocation ({} after the trace's first event)",
                s::seconds_label(scale.lead_ns as f64 / 1e9, scale.lead_ns as f64 / 1e9 / 10.0)
            )
        } else {
            "time since the first event".to_string()
        };
        put(
            out,
            format_args!(
                "<text class=\"axis-start\" data-t0-ns=\"{}\" data-lead-ns=\"{}\" x=\"{:.0}\" y=\"{:.0}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n",
                scale.t_min,
                scale.lead_ns,
                (X0 + X1) / 2.0,
                Y1 + 34.0,
                esc(&label)
            ),
        );
    } else {
        put(out, format_args!("<text x=\"{:.0}\" y=\"{:.0}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">events (no time stamps in this trace)</text>\n", (X0 + X1) / 2.0, Y1 + 24.0));
    }
    put(out, format_args!("<line x1=\"{X0}\" y1=\"{Y1}\" x2=\"{X1}\" y2=\"{Y1}\" stroke=\"#888\"/><line x1=\"{X0}\" y1=\"{Y0}\" x2=\"{X0}\" y2=\"{Y1}\" stroke=\"#888\"/>\n"));
}

/// Reserved (a light area and a line), allocated, stranded and device free as step lines.
fn series(out: &mut String, device: i16, points: &[Point], scale: &Scale) {
    type Get = Box<dyn Fn(&Point) -> Option<u64>>;
    let series: [(&str, &str, &str, Get); 4] = [
        ("reserved", s::RESERVED, "", Box::new(|p: &Point| Some(p.reserved))),
        ("allocated", s::LIVE, "", Box::new(|p: &Point| Some(p.allocated))),
        ("stranded", s::STRANDED, "", Box::new(|p: &Point| Some(p.stranded))),
        ("device-free", s::DEVICE_FREE, " stroke-dasharray=\"5 3\"", Box::new(|p: &Point| p.device_free)),
    ];
    for (name, color, dash, get) in series.iter() {
        let mut d = String::new();
        let mut prev_y: Option<f64> = None;
        let mut last = None;
        for p in points {
            let Some(v) = get(p) else {
                prev_y = None;
                continue;
            };
            let x = scale.x(p.t_ns, p.index);
            let y = scale.y(v);
            match prev_y {
                None => put(&mut d, format_args!("M{x:.1} {y:.1}")),
                Some(py) if (py - y).abs() < 0.05 => put(&mut d, format_args!("H{x:.1}")),
                Some(_) => put(&mut d, format_args!("H{x:.1}V{y:.1}")),
            }
            prev_y = Some(y);
            last = Some(v);
        }
        if d.is_empty() {
            continue;
        }
        if *name == "reserved" {
            // Reserved as a light area: what the process holds; the lines inside show what is in it.
            if let Some(first) = points.first() {
                let x0 = scale.x(first.t_ns, first.index);
                put(out, format_args!("<path d=\"{d}V{Y1}H{x0:.1}Z\" fill=\"#dfe4ec\" stroke=\"none\"/>\n"));
            }
        }
        let n_pts = d.matches('M').count() + d.matches('H').count();
        put(out, format_args!("<path class=\"series\" id=\"series-{name}-dev{device}\" data-last=\"{}\" d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>\n", last.unwrap_or(0)));
        if *name == "device-free" && n_pts <= 2 {
            // Measured once or twice (a snapshot knows it only at its OOM): show the measurements.
            if let Some(p) = points.iter().find(|p| p.device_free.is_some()) {
                let v = p.device_free.unwrap_or(0);
                let (x, y) = (scale.x(p.t_ns, p.index), scale.y(v));
                put(out, format_args!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"{color}\">device free {}</text>\n", x - 7.0, y + 4.0, esc(&short_bytes(v))));
            }
        }
    }
}

/// Each OOM as a vertical line with its label, on as many rows as it takes for none to overlap
/// another.
fn oom_marks(out: &mut String, marks: &[&OomMark], scale: &Scale) {
    const LABEL_W: f64 = 175.0;
    let mut rows_end: Vec<(f64, f64)> = Vec::new(); // each label row's occupied span (left, right)
    for m in marks {
        let x = scale.x(m.t_ns, m.event_index);
        let (tx, anchor) = if x > X0 + 240.0 { (x - 4.0, "end") } else { (x + 4.0, "start") };
        let span = if anchor == "end" { (tx - LABEL_W, tx) } else { (tx, tx + LABEL_W) };
        let row = match rows_end.iter().position(|&(l, r)| span.1 < l || span.0 > r) {
            Some(k) => {
                let (l, r) = rows_end[k];
                rows_end[k] = (l.min(span.0), r.max(span.1));
                k
            }
            None => {
                rows_end.push(span);
                rows_end.len() - 1
            }
        };
        put(
            out,
            format_args!(
                "<g class=\"oom-mark\" data-requested=\"{}\" data-index=\"{}\" data-label-row=\"{row}\"><line x1=\"{x:.1}\" y1=\"{Y0}\" x2=\"{x:.1}\" y2=\"{Y1}\" stroke=\"{}\" stroke-width=\"2\"/><text x=\"{tx:.1}\" y=\"{:.0}\" font-size=\"11.5\" text-anchor=\"{anchor}\" fill=\"{}\">OOM {}: {} requested</text></g>\n",
                m.requested,
                m.index + 1,
                s::REQUEST,
                Y0 + 12.0 + 14.0 * row as f64,
                s::REQUEST,
                m.index + 1,
                esc(&short_bytes(m.requested))
            ),
        );
    }
}
