//! Drawing `top`: a title line (live or replay, with the replay's position), the table (one row
//! per device in index order with its processes under it, one for all devices when there are
//! several; the sort column marked ▼ or ▲; exited processes dimmed, their figures in parentheses;
//! on a narrow terminal columns dropped by priority, never the pid; NVML's used bytes beside the
//! traced reserved, and on device rows the GPU's name, shortened to fit, and its utilization, `-`
//! where NVML did not say), the selected row's history
//! as sparklines, the strip map of its segments, the key line, and the help screen over all of
//! it while it is open. Reads [`App`] only.

use super::app::{App, Mode, RowKey, RowView, Sort};
use crate::units::human_bytes;
use crate::views::strip::{ProcessStrip, SegmentStrip};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Sparkline, Table, TableState};
use ratatui::Frame as TermFrame;

const LIVE: Color = Color::Blue;
const STRANDED: Color = Color::Yellow;
const RELEASABLE: Color = Color::Green;
const RAW: Color = Color::DarkGray;
const LARGEST: Color = Color::Red;

/// Draws the whole screen: title, last OOM, table, history, strip map, key line (and help).
pub fn draw(f: &mut TermFrame<'_>, app: &App) {
    let area = f.area();
    let rows = app.rows();
    let table_h = (rows.len() as u16 + 3).clamp(4, (area.height / 2).max(4));
    let [title, oom, table, hist, strip, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(table_h),
        Constraint::Length(5),
        Constraint::Min(4),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_title(f, app, title);
    draw_oom(f, app, oom);
    draw_table(f, app, &rows, table);
    draw_history(f, app, hist);
    draw_strip(f, app, strip);
    draw_keys(f, app, help);
    if app.help {
        draw_help(f, area);
    }
}

/// One frame for `--once`: the title, the last OOM and the whole table, nothing interactive.
pub fn draw_once(f: &mut TermFrame<'_>, app: &App) {
    let rows = app.rows();
    let [title, oom, table] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Length(rows.len() as u16 + 3)]).areas(f.area());
    draw_title(f, app, title);
    draw_oom(f, app, oom);
    draw_table(f, app, &rows, table);
}

/// The height `--once` needs for `app`'s rows.
pub fn once_height(app: &App) -> u16 {
    app.rows().len() as u16 + 5
}

/// ▲ or ▼: the order of the sort column.
fn order(app: &App) -> &'static str {
    if app.sort.ascending() ^ app.reversed {
        "▲"
    } else {
        "▼"
    }
}

/// The title line: what feeds the screen, then its state.
fn draw_title(f: &mut TermFrame<'_>, app: &App, area: Rect) {
    let tag = |text: String, bg: Color| Span::styled(text, Style::default().fg(Color::Black).bg(bg));
    let mut title_spans = vec![Span::styled("gpufrag top ", Style::default().add_modifier(Modifier::BOLD))];
    let mut position = String::new();
    match &app.mode {
        Mode::Live => title_spans.push(tag(" live ".into(), Color::Green)),
        Mode::Replay(c) => {
            title_spans.push(tag(" replay ".into(), Color::Cyan));
            let p = c.position();
            position = format!(" event {}/{} · {} of {} ·", p.done, p.total, seconds(p.at_ns), seconds(p.span_ns));
        }
    }
    if app.paused {
        title_spans.push(Span::raw(" "));
        title_spans.push(tag(" PAUSED ".into(), Color::Yellow));
    }
    match (&app.ended, &app.frame) {
        (Some(why), _) => {
            title_spans.push(Span::raw(" "));
            title_spans.push(tag(format!(" ended: {why} "), Color::Gray));
        }
        (None, None) => {
            title_spans.push(Span::raw(" "));
            title_spans.push(tag(" waiting for the first frame ".into(), Color::Gray));
        }
        (None, Some(_)) => {}
    }
    let (events, dropped, exact) = app.frame.as_ref().map_or((0, 0, true), |fr| (fr.summary.events, fr.summary.dropped, fr.summary.exact));
    // OOMs and recovered allocations by the one rule (crate::ingest::oom_rule), as the summary has them.
    let (ooms, retries) = app.frame.as_ref().map_or((0, 0), |fr| (fr.summary.ooms.len(), fr.summary.retries));
    // Foresight's warnings (predicted OOMs), as the summary lists them.
    let warned = app.frame.as_ref().map_or(0, |fr| fr.summary.warnings.len());
    if warned > 0 {
        title_spans.push(tag(format!(" {warned} predicted OOM warning(s) "), Color::Yellow));
        title_spans.push(Span::raw(" "));
    }
    // The source (a path, any length) goes last: a narrow terminal cuts it, not the figures.
    title_spans.push(Span::raw(format!(
        "{position} sort: {}{} · {} events · dropped {} · {ooms} OOMs · {retries} retries · {} · {}",
        app.sort.name(),
        order(app),
        events,
        dropped,
        if exact { "exact" } else { "NOT exact" },
        app.source
    )));
    f.render_widget(Paragraph::new(Line::from(title_spans)), area);
}

/// The last OOM, in words; or foresight's last warning when it came after the last OOM (the
/// marker: a predicted OOM, checkpoint now).
fn draw_oom(f: &mut TermFrame<'_>, app: &App, area: Rect) {
    let warning = app.frame.as_ref().and_then(|fr| fr.summary.warnings.last());
    let last_oom_ts = app.frame.as_ref().and_then(|fr| fr.summary.ooms.last()).map(|o| o.ts_ns);
    if let Some(w) = warning.filter(|w| last_oom_ts.is_none_or(|t| w.ts_ns > t)) {
        let text = format!(
            "PREDICTED OOM pid {} gpu {}: {} step(s) ahead, peak {} of {} {}: checkpoint now; fix: {}",
            w.pid,
            w.device,
            w.steps_ahead,
            human_bytes(w.predicted_peak),
            human_bytes(w.available),
            if w.capped { "allowed" } else { "available" },
            w.fix
        );
        f.render_widget(
            Paragraph::new(Line::from(Span::styled(text, Style::default().fg(Color::Yellow).add_modifier(Modifier::BOLD)))),
            area,
        );
        return;
    }
    let Some(o) = app.frame.as_ref().and_then(|fr| fr.summary.ooms.last()) else { return };
    let text = format!(
        "OOM pid {} gpu {}: {} requested: {} (largest free block {}, stranded {}, device free {}{}{}){} · fix: {}",
        o.pid,
        o.device,
        human_bytes(o.requested),
        o.verdict.name(),
        human_bytes(o.map.largest_free_block),
        human_bytes(o.map.stranded),
        if o.device_free_known { human_bytes(o.device_free) } else { "not measured".into() },
        // Driver-level fragmentation: free bytes in partly used 2 MiB pages.
        if o.map.page_stranded > 0 { format!(", page-stranded {}", human_bytes(o.map.page_stranded)) } else { String::new() },
        o.allowed.map_or(String::new(), |a| format!(", allowed {}", human_bytes(a))),
        // Who else held the GPU (crate::holders): the largest holder.
        o.holders.list.first().map_or(String::new(), |h| format!("; {}", h.sentence())),
        // The summary's fix: the computed one where the simulation ran (crate::sim::verdict).
        crate::views::point::fix_line(o)
    );
    f.render_widget(Paragraph::new(Line::from(Span::styled(text, Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)))), area);
}

/// The table's columns, in the order shown, each with its width and its priority: on a narrow
/// terminal the columns of the highest `drop` go first (the label, with the pid, never).
struct Column {
    name: String,
    width: u16,
    drop: u8,
}

/// Which columns fit `width` (the table's inner width less the highlight symbol), by priority,
/// and the width left over.
fn columns_that_fit(cols: &[Column], width: u16) -> (Vec<usize>, u16) {
    let mut by_priority: Vec<usize> = (0..cols.len()).collect();
    by_priority.sort_by_key(|&i| cols[i].drop);
    let mut kept = Vec::new();
    let mut used = 0u16;
    for i in by_priority {
        let w = cols[i].width + if kept.is_empty() { 0 } else { 1 };
        if used + w <= width || kept.is_empty() {
            used += w;
            kept.push(i);
        }
    }
    kept.sort_unstable();
    (kept, width.saturating_sub(used))
}

/// A GPU's name from longest to shortest, as a narrow table shortens it: whole
/// (`NVIDIA H200 (simcuda)`), without the vendor (`H200 (simcuda)`), without what follows the
/// model in parentheses (`H200`).
pub fn name_forms(name: &str) -> Vec<String> {
    let mut forms = vec![name.trim().to_string()];
    let bare = name.trim().strip_prefix("NVIDIA ").unwrap_or(name.trim()).to_string();
    forms.push(bare.clone());
    forms.push(bare.split(" (").next().unwrap_or(&bare).trim().to_string());
    forms.dedup();
    forms.retain(|f| !f.is_empty());
    forms
}

/// A device row's label with as much of the GPU's name as fits `width` (a gap of one kept):
/// `gpu 0 NVIDIA H200`, `gpu 0 H200`, or `gpu 0` alone.
fn device_label(label: &str, name: Option<&str>, width: usize) -> String {
    name.map(name_forms)
        .unwrap_or_default()
        .into_iter()
        .map(|n| format!("{label} {n}"))
        .find(|l| l.chars().count() < width)
        .unwrap_or_else(|| label.to_string())
}

/// The table of devices (in index order) and their processes under each, as many columns as fit.
fn draw_table(f: &mut TermFrame<'_>, app: &App, rows: &[RowView], area: Rect) {
    let exact = app.frame.as_ref().is_none_or(|fr| fr.summary.exact);
    let order = order(app);
    let marked = |name: &str, col: Sort| if app.sort == col { format!("{name}{order}") } else { name.to_string() };
    // The label column is as wide as its longest label: a pid is never cut.
    // (one more for a gap of two before the figures).
    let label_w = rows.iter().map(|r| r.label.chars().count() + 1).chain([10]).max().unwrap_or(10) as u16;
    let col = |name: String, width: u16, drop: u8| Column { name, width, drop };
    let cols = [
        col(marked("gpu / pid", Sort::Id), label_w, 0),
        col("user".into(), 8, 12),
        col("allocator".into(), 9, 11),
        col(marked("reserved", Sort::Reserved), 12, 1),
        // NVML's figure beside the traced one (crate::ingest::gpus).
        col("nvml used".into(), 10, 2),
        col(marked("allocated", Sort::Allocated), 12, 10),
        col(marked("stranded", Sort::Stranded), 12, 3),
        col(marked("largest free", Sort::LargestFree), 13, 6),
        col(marked("frag", Sort::Fragmentation), 5, 7),
        col("dev free".into(), 11, 8),
        col("dev total".into(), 11, 9),
        col("util".into(), 5, 5),
        col("state".into(), 7, 4),
        col("coverage".into(), 13, 14),
        col("command".into(), 8, 13),
    ];
    let (kept, left) = columns_that_fit(&cols, area.width.saturating_sub(4));
    // What is left widens the label column, as far as the longest GPU name needs, unless the
    // command column (the last, which takes what is left) is shown: a command line is cut
    // before a GPU's name is (the device rows' names are shortened to the width the label has).
    let left = if kept.contains(&(cols.len() - 1)) { 0 } else { left };
    let named =
        rows.iter().filter_map(|r| Some(r.label.chars().count() + 2 + r.figures.gpu_name.as_deref()?.chars().count())).max().unwrap_or(0)
            as u16;
    let label_w = label_w + left.min(named.saturating_sub(label_w));
    let pick = |cells: Vec<Cell<'static>>| -> Vec<Cell<'static>> {
        cells.into_iter().enumerate().filter(|(i, _)| kept.contains(i)).map(|(_, c)| c).collect()
    };
    let header =
        Row::new(pick(cols.iter().map(|c| Cell::from(c.name.clone())).collect())).style(Style::default().add_modifier(Modifier::BOLD));
    let body: Vec<Row> = rows.iter().map(|r| table_row(r, exact, label_w as usize, &pick)).collect();
    let widths: Vec<Constraint> = kept
        .iter()
        .map(|&i| match i {
            0 => Constraint::Length(label_w),
            _ if i == cols.len() - 1 => Constraint::Min(cols[i].width),
            _ => Constraint::Length(cols[i].width),
        })
        .collect();
    let mut ts = TableState::default();
    if !rows.is_empty() {
        ts.select(app.selected.map(|s| s.min(rows.len() - 1)));
    }
    f.render_stateful_widget(
        Table::new(body, widths)
            .header(header)
            .block(Block::default().borders(Borders::ALL).title(" devices and processes "))
            .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
            .highlight_symbol("> "),
        area,
        &mut ts,
    );
}

/// One row's cells (every column; `pick` keeps those that fit). An exited process's figures are
/// in parentheses: no longer on the device, and left out of its device's totals. What NVML did
/// not say (no NVML, a replay, a pid it does not list) is `-`, never 0.
fn table_row(r: &RowView, exact: bool, label_w: usize, pick: &dyn Fn(Vec<Cell<'static>>) -> Vec<Cell<'static>>) -> Row<'static> {
    let d = &r.figures;
    let process = matches!(r.key, RowKey::Process(..));
    let total = r.key == RowKey::Total;
    let known = |v: Option<u64>| v.map_or_else(|| "-".to_string(), human_bytes);
    let fig = |v: u64| if r.exited { format!("({})", human_bytes(v)) } else { human_bytes(v) };
    let label = match r.key {
        RowKey::Device(_) => device_label(&r.label, d.gpu_name.as_deref(), label_w),
        _ => r.label.clone(),
    };
    let cells = vec![
        Cell::from(label),
        Cell::from(r.user.clone()),
        Cell::from(r.framework.map_or("", |f| f.name())),
        Cell::from(fig(d.map.reserved)),
        Cell::from(known(d.nvml_used)),
        Cell::from(fig(d.map.allocated)),
        Cell::from(fig(d.map.stranded)).style(if d.map.stranded > 0 && !r.exited {
            Style::default().fg(STRANDED)
        } else {
            Style::default()
        }),
        Cell::from(if total { String::new() } else { fig(d.map.largest_free_block) }),
        Cell::from(if total { String::new() } else { format!("{:.2}", d.fragmentation) }),
        // Free and total are the device's: shown on device rows only.
        Cell::from(if process { String::new() } else { known(d.device_free) }),
        Cell::from(if process { String::new() } else { known(d.device_total) }),
        // Utilization is a GPU's: on device rows only.
        Cell::from(match r.key {
            RowKey::Device(_) => d.utilization_gpu.map_or_else(|| "-".to_string(), |u| format!("{u}%")),
            _ => String::new(),
        }),
        Cell::from(match (process, r.exited) {
            (true, true) => "exited",
            (true, false) => "running",
            _ => "",
        }),
        Cell::from(if total { String::new() } else { format!("{} {}", if exact { "exact" } else { "approx" }, d.map.level()) }),
        Cell::from(r.command.clone()),
    ];
    let row = Row::new(pick(cells));
    if r.exited {
        row.style(Style::default().fg(Color::DarkGray).add_modifier(Modifier::DIM))
    } else if total {
        row.style(Style::default().add_modifier(Modifier::BOLD))
    } else {
        row
    }
}

/// The selected row's reserved and stranded bytes over time, on one scale.
fn draw_history(f: &mut TermFrame<'_>, app: &App, area: Rect) {
    let sel = app.selected_row();
    let hist_data = sel.as_ref().and_then(|r| app.history.get(&r.key));
    let [h_res, h_str] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let width = h_res.width.saturating_sub(2) as usize;
    let tail = |get: fn(&super::app::Sample) -> u64| -> Vec<u64> {
        hist_data.map(|h| h.iter().rev().take(width).rev().map(get).collect()).unwrap_or_default()
    };
    let reserved = tail(|s| s.reserved);
    let stranded = tail(|s| s.stranded);
    let max = reserved.iter().copied().max().unwrap_or(1).max(1);
    let spark = |title: String, data: &[u64], color: Color| {
        Sparkline::default()
            .block(Block::default().borders(Borders::ALL).title(title))
            .data(data)
            .max(max)
            .style(Style::default().fg(color))
    };
    let last = |v: &[u64]| v.last().map_or("-".into(), |v| human_bytes(*v));
    f.render_widget(spark(format!(" reserved {} ", last(&reserved)), &reserved, Color::Cyan), h_res);
    f.render_widget(spark(format!(" stranded {} (same scale) ", last(&stranded)), &stranded, STRANDED), h_str);
}

/// The strip map of the selected row's segments, with its legend.
fn draw_strip(f: &mut TermFrame<'_>, app: &App, area: Rect) {
    let sel = app.selected_row();
    let strip_title = match (app.selected_strip(), sel.as_ref().map(|r| r.key)) {
        (Some(s), _) => format!(
            " segments of pid {} on gpu {}: {}, largest free run {} (red) ",
            s.pid,
            s.device,
            s.segments.len(),
            human_bytes(s.largest_free_run)
        ),
        (None, Some(RowKey::Device(d))) => format!(" gpu {d}: no segments "),
        (None, Some(RowKey::Total)) => " all gpus: no segments ".to_string(),
        _ => " segments ".to_string(),
    };
    let block = Block::default().borders(Borders::ALL).title(strip_title);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if let Some(s) = app.selected_strip() {
        let request = app
            .frame
            .as_ref()
            .and_then(|fr| fr.summary.ooms.iter().rev().find(|o| o.pid == s.pid && o.device == s.device))
            .map(|o| o.requested);
        let lines = strip_lines(s, inner.width as usize, inner.height.saturating_sub(1) as usize, request);
        f.render_widget(Paragraph::new(lines), Rect { height: inner.height.saturating_sub(1), ..inner });
    }
    let legend = Line::from(vec![
        Span::styled("█", Style::default().fg(LIVE)),
        Span::raw(" live  "),
        Span::styled("░", Style::default().fg(STRANDED)),
        Span::raw(" stranded  "),
        Span::styled("·", Style::default().fg(RELEASABLE)),
        Span::raw(" releasable  "),
        Span::styled("█", Style::default().fg(RAW)),
        Span::raw(" not the allocator's  "),
        Span::styled("░", Style::default().fg(LARGEST)),
        Span::raw(" largest free run  "),
        Span::styled("▀", Style::default().fg(LARGEST)),
        Span::raw(" failed request (same scale)"),
    ]);
    if inner.height > 0 {
        f.render_widget(Paragraph::new(legend), Rect { y: inner.y + inner.height - 1, height: 1, ..inner });
    }
}

/// The key line, or the filter being typed.
fn draw_keys(f: &mut TermFrame<'_>, app: &App, area: Rect) {
    let help_line = match &app.editing {
        Some(t) => Line::from(vec![
            Span::styled("filter: ", Style::default().add_modifier(Modifier::BOLD)),
            Span::raw(t.clone()),
            Span::raw("▏  (Enter apply, Esc cancel)"),
        ]),
        None => Line::from(format!(
            "h help · q quit · s , . sort · I reverse · / filter{} · Esc clear · ↑↓ select · p pause{} · x drop exited · r refresh",
            if app.filter.is_empty() { String::new() } else { format!(" [{}]", app.filter) },
            if matches!(app.mode, Mode::Replay(_)) { " replay" } else { " screen" }
        )),
    };
    f.render_widget(Paragraph::new(help_line).style(Style::default().fg(Color::Gray)), area);
}

/// The help screen's text: every key, and what the columns are.
pub const HELP: &str = "gpufrag top: where GPU memory is, per device and per process

  h ?        this help (any key closes it)      q Ctrl-C   quit
  ↑ ↓ j k    select a row                       Esc        clear the selection and the filter
  Home End   first / last row                   /          filter rows (Enter apply, Esc cancel)
  s .  ,     next / previous sort column        I          reverse the sort order
  p Space    pause (a replay itself stops)      x          drop exited processes now
  r Ctrl-L   redraw the screen

Columns: gpu / pid (a device row adds the GPU's name from NVML, shortened to fit),
allocator (pytorch, xla, cupy), reserved (the allocator's and the driver's
segments gpufrag traced), nvml used (what NVML says the process uses; on a device row,
every process it lists there, untraced ones too; - where NVML is absent or does not list
the process), util (NVML's GPU utilization, device rows), allocated (live blocks), stranded (free inside segments that
hold live blocks: not releasable), largest free (the largest free block), frag
(1 − largest allocatable / free), dev free and dev total (the device's own figures, on
device rows), state (running / exited: an exited process is dimmed, its figures in
(parentheses) and out of its device's totals, and dropped 30 s later), coverage (exact or approximate, and the level seen: segment, block), command
and user (from /proc while it runs; a replay knows only what its file carries). The
sorted column is marked ▼ (largest first) or ▲.

Press any key to return.";

fn draw_help(f: &mut TermFrame<'_>, area: Rect) {
    let lines: Vec<Line> = HELP.lines().map(|l| Line::from(l.to_string())).collect();
    let w = (HELP.lines().map(|l| l.chars().count()).max().unwrap_or(0) as u16 + 4).min(area.width);
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, r);
    f.render_widget(Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" help ")), r);
}

/// Trace time for the replay's position: `12.3 s`, `4 min 05 s`.
fn seconds(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{} min {:02} s", (s / 60.0) as u64, (s % 60.0) as u64)
    }
}

/// The cells of one segment, `w` wide.
fn segment_cells(g: &SegmentStrip, w: usize, run: (u64, u64)) -> Vec<Span<'static>> {
    let digits: Vec<u32> = g.cells.chars().map(|c| c.to_digit(10).unwrap_or(0)).collect();
    let nd = digits.len().max(1);
    let mut out = Vec::with_capacity(w);
    for j in 0..w {
        let lo = j * nd / w;
        let hi = ((j + 1) * nd / w).max(lo + 1).min(nd);
        let live: f64 = digits.get(lo..hi).map_or(0.0, |d| d.iter().map(|&x| x as f64 / 8.0).sum::<f64>() / (hi - lo) as f64);
        let b_lo = g.address + (g.size as f64 * j as f64 / w as f64) as u64;
        let b_hi = g.address + (g.size as f64 * (j + 1) as f64 / w as f64) as u64;
        let in_largest = run.1 > run.0 && b_lo < run.1 && b_hi > run.0 && live < 1.0;
        let (ch, color) = if !g.framework {
            ("█", RAW)
        } else if in_largest {
            ("░", LARGEST)
        } else if live >= 0.75 {
            ("█", LIVE)
        } else if live >= 0.25 {
            ("▒", LIVE)
        } else if live > 0.0 {
            ("░", LIVE)
        } else if g.live_blocks > 0 {
            ("░", STRANDED)
        } else {
            ("·", RELEASABLE)
        };
        out.push(Span::styled(ch, Style::default().fg(color)));
    }
    out
}

/// A process's segments as coloured cells. When one line per segment fits, each segment is a
/// row, all to one scale (the largest segment, or the failed `request` when larger, spans the
/// width), labelled with its size, and the request gets a red row of its own at the same scale.
/// Otherwise the segments are packed, each as wide as its share of the bytes (at least one cell),
/// one space apart, wrapped to `width` × `height`.
pub fn strip_lines(s: &ProcessStrip, width: usize, height: usize, request: Option<u64>) -> Vec<Line<'static>> {
    if width == 0 || height == 0 || s.segments.is_empty() {
        return Vec::new();
    }
    let n = s.segments.len();
    let run = (s.largest_free_run_address, s.largest_free_run_address + s.largest_free_run);
    const LABEL: usize = 11;
    let rows_fit = n + usize::from(request.is_some()) <= height && width > LABEL + 20;
    if rows_fit {
        // Room after the request's bar for its size.
        let plot = width - LABEL - if request.is_some() { 10 } else { 0 };
        let max = s.segments.iter().map(|g| g.size).max().unwrap_or(1).max(request.unwrap_or(0)).max(1);
        let mut lines: Vec<Line<'static>> = s
            .segments
            .iter()
            .map(|g| {
                let w = ((g.size as f64 / max as f64) * plot as f64).round().max(1.0) as usize;
                let mut spans = vec![Span::styled(format!("{:>10} ", human_bytes(g.size)), Style::default().fg(Color::Gray))];
                spans.extend(segment_cells(g, w, run));
                Line::from(spans)
            })
            .collect();
        if let Some(r) = request {
            let w = ((r as f64 / max as f64) * plot as f64).round().max(1.0) as usize;
            lines.push(Line::from(vec![
                Span::styled(format!("{:>10} ", "request"), Style::default().fg(LARGEST).add_modifier(Modifier::BOLD)),
                Span::styled("▀".repeat(w), Style::default().fg(LARGEST)),
                Span::styled(format!(" {}", human_bytes(r)), Style::default().fg(LARGEST)),
            ]));
        }
        return lines;
    }
    let total: u64 = s.segments.iter().map(|g| g.size).sum::<u64>().max(1);
    let budget = (width * height).saturating_sub(n).max(n);
    let mut cells: Vec<Span<'static>> = Vec::new();
    for (i, g) in s.segments.iter().enumerate() {
        let w = ((g.size as f64 / total as f64) * budget as f64).floor().max(1.0) as usize;
        cells.extend(segment_cells(g, w, run));
        if i + 1 < n {
            cells.push(Span::raw(" "));
        }
    }
    let mut lines: Vec<Line<'static>> = cells.chunks(width).take(height).map(|c| Line::from(c.to_vec())).collect();
    if cells.len() > width * height {
        if let Some(last) = lines.last_mut() {
            last.spans.pop();
            last.spans.push(Span::styled("…", Style::default().fg(Color::Gray)));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_name_is_shortened_vendor_first_then_what_follows_the_model() {
        assert_eq!(name_forms("NVIDIA H200 (simcuda)"), ["NVIDIA H200 (simcuda)", "H200 (simcuda)", "H200"]);
        assert_eq!(name_forms("NVIDIA H200"), ["NVIDIA H200", "H200"]);
        assert_eq!(device_label("gpu 0", Some("NVIDIA H200 (simcuda)"), 21), "gpu 0 H200 (simcuda)");
        assert_eq!(device_label("gpu 0", Some("NVIDIA H200 (simcuda)"), 20), "gpu 0 H200", "a gap of one is kept");
        assert_eq!(device_label("gpu 0", Some("NVIDIA H200"), 8), "gpu 0");
        assert_eq!(device_label("gpu 0", None, 40), "gpu 0");
    }
}
