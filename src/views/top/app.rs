//! What `top` shows, without the terminal: the latest frame, the rows (one per device, one for
//! all devices when there are several, one per process) sorted and filtered, the selection,
//! per-row history for the sparklines, exited processes and when they go (their figures out of
//! their device's totals), who each live process
//! is, the help screen, and the keys. Kept apart from drawing so that it can be tested with plain
//! values.
//!
//! Keys follow nvitop's where they do not clash with ours: `h`/`?` help (any key closes it),
//! `q` quit, `Esc` clears the selection and the filter, `,`/`.` the previous/next sort column,
//! Home/End. nvitop's `/` inverts the sort, but here `/` filters (as in htop and less), so the
//! order is inverted with htop's `I`; `r` (and Ctrl-L) redraws the screen, as in nvitop. Our own: `s` next sort column, `p`/Space pause,
//! `x` drops exited processes now.

use super::procinfo::Owner;
use super::replay::Control;
use crate::analysis::summary::{DeviceSummary, Summary};
use crate::views::feed::{Frame, Update};
use crate::views::strip::ProcessStrip;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples of history kept per row.
pub const HISTORY: usize = 240;

/// How long an exited process stays on screen (dimmed) before its row goes.
pub const EXITED_SHOWN: Duration = Duration::from_secs(30);

/// What a row is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowKey {
    /// All devices together (shown when there are several).
    Total,
    /// A device, summed over processes.
    Device(i16),
    /// A process on a device.
    Process(u32, i16),
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct RowView {
    /// What it is about.
    pub key: RowKey,
    /// `gpu 0`, `pid 1234 gpu 0`, `all gpus`.
    pub label: String,
    /// The figures.
    pub figures: DeviceSummary,
    /// The process ended (its figures are its last).
    pub exited: bool,
    /// Its command line (or executable name), when known.
    pub command: String,
    /// Its user, when known.
    pub user: String,
    /// A process row's caching allocator (`pytorch`, `xla`, `cupy`), when one was seen.
    pub framework: Option<crate::alloc::Framework>,
}

/// The columns `s`, `,` and `.` sort by, in their order on screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// By device and pid.
    Id,
    /// Most reserved first.
    Reserved,
    /// Most allocated first.
    Allocated,
    /// Most stranded first.
    Stranded,
    /// Largest free block first.
    LargestFree,
    /// Most fragmented first.
    Fragmentation,
}

impl Sort {
    const ALL: [Sort; 6] = [Sort::Id, Sort::Reserved, Sort::Allocated, Sort::Stranded, Sort::LargestFree, Sort::Fragmentation];

    /// The next column.
    pub fn next(self) -> Sort {
        let i = Sort::ALL.iter().position(|s| *s == self).unwrap_or(0);
        Sort::ALL[(i + 1) % Sort::ALL.len()]
    }
    /// The previous column.
    pub fn previous(self) -> Sort {
        let i = Sort::ALL.iter().position(|s| *s == self).unwrap_or(0);
        Sort::ALL[(i + Sort::ALL.len() - 1) % Sort::ALL.len()]
    }
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Sort::Reserved => "reserved",
            Sort::Allocated => "allocated",
            Sort::Stranded => "stranded",
            Sort::Fragmentation => "fragmentation",
            Sort::LargestFree => "largest free",
            Sort::Id => "id",
        }
    }
    /// Whether its natural order is ascending (ids), not largest first.
    pub fn ascending(self) -> bool {
        self == Sort::Id
    }
}

/// One history sample of a row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Stranded bytes.
    pub stranded: u64,
}

/// Where the frames come from.
#[derive(Clone, Debug)]
pub enum Mode {
    /// A running command's live feed.
    Live,
    /// A file played back; its pause switch and position.
    Replay(Arc<Control>),
}

/// The state of the UI.
#[derive(Debug)]
pub struct App {
    /// Where the frames come from, for the title.
    pub source: String,
    /// Live or replay.
    pub mode: Mode,
    /// The frame shown.
    pub frame: Option<Box<Frame>>,
    /// A newer frame received while paused.
    pub pending: Option<Box<Frame>>,
    /// Why the feed ended, once it did.
    pub ended: Option<String>,
    /// Display frozen (and, for a replay, the replay itself).
    pub paused: bool,
    /// `r` (or Ctrl-L) asked for the whole screen to be drawn anew.
    pub refresh: bool,
    /// Sort column.
    pub sort: Sort,
    /// The sort column's natural order inverted.
    pub reversed: bool,
    /// Rows shown contain this (case-insensitive).
    pub filter: String,
    /// The filter being typed, while `/` is active.
    pub editing: Option<String>,
    /// Selected row (index into the visible rows); none after `Esc`.
    pub selected: Option<usize>,
    /// The help screen is shown.
    pub help: bool,
    /// Per row, oldest first.
    pub history: HashMap<RowKey, VecDeque<Sample>>,
    /// Frames received.
    pub frames: u64,
    /// The time of the last [`App::tick`].
    pub now: Instant,
    /// Processes seen exited, and when `top` first saw it.
    pub exited_since: HashMap<u32, Instant>,
    /// Exited processes whose rows are dropped (after [`EXITED_SHOWN`], or by `x`).
    pub dropped: std::collections::HashSet<u32>,
    /// Who each live process is, read once (`None`: could not be read).
    pub owners: HashMap<u32, Option<Owner>>,
}

fn device_label(d: i16) -> String {
    format!("gpu {d}")
}

impl App {
    /// An empty UI for frames from `source`.
    pub fn new(source: &str, mode: Mode) -> App {
        App {
            source: source.to_string(),
            mode,
            frame: None,
            pending: None,
            ended: None,
            paused: false,
            refresh: false,
            sort: Sort::Reserved,
            reversed: false,
            filter: String::new(),
            editing: None,
            selected: Some(0),
            help: false,
            history: HashMap::new(),
            frames: 0,
            now: Instant::now(),
            exited_since: HashMap::new(),
            dropped: Default::default(),
            owners: HashMap::new(),
        }
    }

    fn show(&mut self, f: Box<Frame>) {
        for r in rows_of(&f.summary) {
            let h = self.history.entry(r.key).or_default();
            h.push_back(Sample { reserved: r.figures.map.reserved, allocated: r.figures.map.allocated, stranded: r.figures.map.stranded });
            while h.len() > HISTORY {
                h.pop_front();
            }
        }
        for p in f.summary.processes.iter().filter(|p| p.exited) {
            self.exited_since.entry(p.pid).or_insert(self.now);
        }
        self.frame = Some(f);
    }

    /// Takes one update from the feed.
    pub fn update(&mut self, u: Update) {
        match u {
            Update::Frame(f) => {
                self.frames += 1;
                if self.paused {
                    self.pending = Some(f);
                } else {
                    self.show(f);
                }
            }
            Update::Ended(why) => self.ended = Some(why),
        }
    }

    /// Moves the UI's clock to `now`: exited processes shown for [`EXITED_SHOWN`] are dropped.
    pub fn tick(&mut self, now: Instant) {
        self.now = now;
        for (pid, since) in &self.exited_since {
            if now.saturating_duration_since(*since) >= EXITED_SHOWN {
                self.dropped.insert(*pid);
            }
        }
    }

    /// Reads who each process of the frame is that is running and not read yet, with `read`
    /// ([`super::procinfo::read`] for a live feed).
    pub fn learn_owners(&mut self, read: impl Fn(u32, Option<&str>) -> Option<Owner>) {
        let Some(f) = &self.frame else { return };
        for p in f.summary.processes.iter().filter(|p| !p.exited && p.pid != 0) {
            self.owners.entry(p.pid).or_insert_with(|| read(p.pid, p.exe.as_deref()));
        }
    }

    /// The rows shown, sorted and filtered: all devices, then devices, then processes.
    pub fn rows(&self) -> Vec<RowView> {
        let Some(f) = &self.frame else { return Vec::new() };
        let mut rows = rows_of(&f.summary);
        rows.retain(|r| !matches!(r.key, RowKey::Process(pid, _) if self.dropped.contains(&pid)));
        for r in rows.iter_mut() {
            if let RowKey::Process(pid, _) = r.key {
                if let Some(Some(o)) = self.owners.get(&pid) {
                    r.command = o.command.clone();
                    r.user = o.user.clone();
                }
            }
        }
        let needle = self.editing.as_deref().unwrap_or(&self.filter).to_lowercase();
        if !needle.is_empty() {
            rows.retain(|r| {
                r.label.to_lowercase().contains(&needle)
                    || r.command.to_lowercase().contains(&needle)
                    || r.user.to_lowercase().contains(&needle)
            });
        }
        let value = |r: &RowView| -> u64 {
            match self.sort {
                Sort::Reserved => r.figures.map.reserved,
                Sort::Allocated => r.figures.map.allocated,
                Sort::Stranded => r.figures.map.stranded,
                Sort::Fragmentation => (r.figures.fragmentation * 1e6) as u64,
                Sort::LargestFree => r.figures.map.largest_free_block,
                Sort::Id => 0,
            }
        };
        // Devices in index order, each followed by its processes (sorted by the sort column);
        // all devices first. Only processes re-sort.
        let place = |r: &RowView| match r.key {
            RowKey::Total => (0u8, 0i16, 0u8),
            RowKey::Device(d) => (1, d, 0),
            RowKey::Process(_, d) => (1, d, 1),
        };
        let descending = !self.sort.ascending() ^ self.reversed;
        rows.sort_by(|a, b| {
            let within = value(a).cmp(&value(b)).then(a.key.cmp(&b.key));
            place(a).cmp(&place(b)).then(if descending { within.reverse() } else { within })
        });
        without_exited(&mut rows);
        rows
    }

    /// The selected row; the first row when none is selected (what the history and the strip
    /// map show).
    pub fn selected_row(&self) -> Option<RowView> {
        let rows = self.rows();
        rows.get(self.selected.unwrap_or(0).min(rows.len().saturating_sub(1))).cloned()
    }

    /// The strip map for the selected row: its process, or the largest process on its device
    /// (on all devices for the total row).
    pub fn selected_strip(&self) -> Option<&ProcessStrip> {
        let f = self.frame.as_ref()?;
        let largest = |s: &&ProcessStrip| s.segments.iter().map(|g| g.size).sum::<u64>();
        match self.selected_row()?.key {
            RowKey::Process(pid, d) => f.strips.iter().find(|s| s.pid == pid && s.device == d),
            RowKey::Device(d) => f.strips.iter().filter(|s| s.device == d).max_by_key(largest),
            RowKey::Total => f.strips.iter().max_by_key(largest),
        }
    }

    fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
        if let Mode::Replay(c) = &self.mode {
            c.set_paused(paused);
        }
        if !paused {
            if let Some(f) = self.pending.take() {
                self.show(f);
            }
        }
    }

    /// Handles a key; true when `top` should quit.
    pub fn key(&mut self, k: KeyEvent) -> bool {
        let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl_c {
            return true;
        }
        if self.help {
            self.help = false; // any key closes it
            return false;
        }
        if let Some(text) = self.editing.as_mut() {
            match k.code {
                KeyCode::Enter => {
                    self.filter = self.editing.take().unwrap_or_default();
                    self.selected = Some(0);
                }
                KeyCode::Esc => self.editing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            return false;
        }
        let n = self.rows().len();
        let last = n.saturating_sub(1);
        match k.code {
            KeyCode::Char('q') => return true,
            KeyCode::Esc => {
                self.selected = None;
                self.filter.clear();
            }
            KeyCode::Char('h') | KeyCode::Char('?') => self.help = true,
            KeyCode::Char('s') | KeyCode::Char('.') => self.sort = self.sort.next(),
            KeyCode::Char(',') => self.sort = self.sort.previous(),
            KeyCode::Char('I') => self.reversed = !self.reversed,
            // nvitop's refresh: redraw the whole screen now.
            KeyCode::Char('r') => self.refresh = true,
            KeyCode::Char('l') if k.modifiers.contains(KeyModifiers::CONTROL) => self.refresh = true,
            KeyCode::Char('/') => self.editing = Some(self.filter.clone()),
            KeyCode::Char('x') => self.dropped.extend(self.exited_since.keys().copied()),
            KeyCode::Char('p') | KeyCode::Char(' ') => self.set_paused(!self.paused),
            KeyCode::Up | KeyCode::Char('k') => self.selected = Some(self.selected.map_or(0, |s| s.min(last).saturating_sub(1))),
            KeyCode::Down | KeyCode::Char('j') => self.selected = Some(self.selected.map_or(0, |s| (s + 1).min(last))),
            KeyCode::Home => self.selected = Some(0),
            KeyCode::End => self.selected = Some(last),
            _ => {}
        }
        false
    }
}

/// Exited processes' figures leave their device's row and the all-devices row (the driver took
/// their memory back); their own rows keep them, marked as exited.
fn without_exited(rows: &mut [RowView]) {
    let gone: Vec<(i16, DeviceSummary)> = rows
        .iter()
        .filter_map(|r| match r.key {
            RowKey::Process(_, d) if r.exited => Some((d, r.figures.clone())),
            _ => None,
        })
        .collect();
    for r in rows.iter_mut() {
        for (d, g) in &gone {
            if r.key == RowKey::Device(*d) || r.key == RowKey::Total {
                let f = &mut r.figures;
                f.map.reserved = f.map.reserved.saturating_sub(g.map.reserved);
                f.map.allocated = f.map.allocated.saturating_sub(g.map.allocated);
                f.map.stranded = f.map.stranded.saturating_sub(g.map.stranded);
                f.map.releasable = f.map.releasable.saturating_sub(g.map.releasable);
                f.map.framework_reserved = f.map.framework_reserved.saturating_sub(g.map.framework_reserved);
                f.map.non_framework = f.map.non_framework.saturating_sub(g.map.non_framework);
                f.map.segments = f.map.segments.saturating_sub(g.map.segments);
                f.map.blocks = f.map.blocks.saturating_sub(g.map.blocks);
            }
        }
    }
}

/// One row per device and per process of a summary (and one for all devices when there are
/// several), unsorted.
pub fn rows_of(s: &Summary) -> Vec<RowView> {
    let row = |key, label, figures: &DeviceSummary| RowView {
        key,
        label,
        figures: figures.clone(),
        exited: false,
        command: String::new(),
        user: String::new(),
        framework: None,
    };
    let mut rows: Vec<RowView> = s.devices.iter().map(|d| row(RowKey::Device(d.device), device_label(d.device), d)).collect();
    if let Some(total) = total_of(&s.devices).filter(|_| s.devices.len() > 1) {
        rows.push(row(RowKey::Total, "all gpus".into(), &total));
    }
    for p in &s.processes {
        let mut r = row(
            RowKey::Process(p.pid, p.figures.device),
            format!("{} {}", Summary::process_label(p), device_label(p.figures.device)),
            &p.figures,
        );
        r.exited = p.exited;
        r.command = p.exe.clone().unwrap_or_default();
        r.framework = p.framework;
        rows.push(r);
    }
    rows
}

/// The devices' byte figures summed (device free and total summed over the devices that
/// measured them). Largest free block and fragmentation are per device and stay 0 here: no
/// request spans two devices.
/// `None` without devices.
pub fn total_of(devices: &[DeviceSummary]) -> Option<DeviceSummary> {
    let mut t = DeviceSummary { device: -1, ..devices.first()?.clone() };
    let sum_known = |get: fn(&DeviceSummary) -> Option<u64>| -> Option<u64> {
        devices.iter().map(get).collect::<Option<Vec<u64>>>().map(|v| v.into_iter().fold(0u64, u64::saturating_add))
    };
    t.hw_id = None;
    t.map = devices.iter().fold(crate::map::Figures::default(), |mut m, d| {
        m.merge(&d.map);
        m
    });
    t.device_free = sum_known(|d| d.device_free);
    t.nvml_used = sum_known(|d| d.nvml_used);
    // Name and utilization are a GPU's own.
    t.gpu_name = None;
    t.utilization_gpu = None;
    t.utilization_memory = None;
    t.device_total = sum_known(|d| d.device_total);
    t.map.largest_free_block = 0;
    t.largest_allocatable = 0;
    t.fragmentation = 0.0;
    t.stranded_ratio = 0.0;
    t.top_stranded_segments = Vec::new();
    t.alloc_sizes = Default::default();
    t.free_runs = Default::default();
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventKind};
    use crate::ingest::State;
    use ratatui::crossterm::event::{KeyEventKind, KeyEventState};

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent { code: c, modifiers: KeyModifiers::NONE, kind: KeyEventKind::Press, state: KeyEventState::NONE }
    }

    fn state() -> State {
        let mut st = State::default();
        for (pid, size) in [(10u32, 1u64 << 30), (20, 3 << 30)] {
            let mut e = Event::new(EventKind::MemAlloc, pid, 0);
            e.addr = (pid as u64) << 40;
            e.size = size;
            st.apply(&e);
        }
        st
    }

    fn app_of(st: &State) -> App {
        let mut app = App::new("t", Mode::Live);
        app.update(Update::Frame(Box::new(crate::views::feed::frame(st, "t", 1, false))));
        app
    }

    fn labels(app: &App) -> Vec<String> {
        app.rows().into_iter().map(|r| r.label).collect()
    }

    #[test]
    fn rows_sort_filter_select_and_pause() {
        let mut app = app_of(&state());
        assert_eq!(labels(&app), vec!["gpu 0", "pid 20 gpu 0", "pid 10 gpu 0"]);
        app.key(key(KeyCode::Down));
        assert_eq!(app.selected_strip().map(|s| s.pid), Some(20));
        app.key(key(KeyCode::Char('/')));
        for c in "pid 10".chars() {
            app.key(key(KeyCode::Char(c)));
        }
        app.key(key(KeyCode::Enter));
        assert_eq!(app.rows().len(), 1);
        assert_eq!(app.selected_strip().map(|s| s.pid), Some(10));
        app.key(key(KeyCode::Char('p')));
        app.update(Update::Frame(Box::new(crate::views::feed::frame(&State::default(), "t", 2, false))));
        assert_eq!(app.frame.as_ref().map(|f| f.seq), Some(1), "paused: the display stays");
        app.key(key(KeyCode::Char('p')));
        assert_eq!(app.frame.as_ref().map(|f| f.seq), Some(2));
        assert!(app.key(key(KeyCode::Char('q'))));
    }

    /// Issue 17: `top` had no help screen (nvitop: `h`, `?`; any key returns).
    #[test]
    fn help_opens_with_h_or_question_mark_and_any_key_closes_it() {
        let mut app = app_of(&state());
        for open in ['h', '?'] {
            assert!(!app.key(key(KeyCode::Char(open))));
            assert!(app.help, "{open} opens the help");
            // Even q only closes the help: it does not quit, nor sort, nor move.
            let sort = app.sort;
            assert!(!app.key(key(KeyCode::Char('q'))));
            assert!(!app.help);
            assert_eq!(app.sort, sort);
        }
        app.key(key(KeyCode::Char('?')));
        assert!(!app.key(key(KeyCode::Esc)));
        assert!(!app.help, "Esc closes it too");
    }

    /// Issue 17: `Esc` quit `top` (nvitop: it clears the selection).
    #[test]
    fn regression_esc_clears_the_selection_and_filter_instead_of_quitting() {
        let mut app = app_of(&state());
        app.key(key(KeyCode::Down));
        app.filter = "pid".into();
        assert!(!app.key(key(KeyCode::Esc)), "Esc does not quit");
        assert_eq!((app.selected, app.filter.as_str()), (None, ""));
        assert_eq!(labels(&app).len(), 3, "the filter is gone");
        // With nothing selected the first row is the one the history and strip show.
        assert_eq!(app.selected_row().map(|r| r.key), Some(RowKey::Device(0)));
        app.key(key(KeyCode::Down));
        assert_eq!(app.selected, Some(0), "an arrow selects again, from the top");
    }

    /// Issue 17: no sort marker and no reverse sort. `,` `.` move the column (nvitop), `I`
    /// inverts (htop; nvitop's `/` is our filter).
    #[test]
    fn sort_columns_move_with_comma_and_period_and_reverse_with_capital_i() {
        let mut app = app_of(&state());
        assert_eq!((app.sort, app.reversed), (Sort::Reserved, false));
        app.key(key(KeyCode::Char(',')));
        assert_eq!(app.sort, Sort::Id);
        assert_eq!(labels(&app), vec!["gpu 0", "pid 10 gpu 0", "pid 20 gpu 0"], "ids ascending");
        app.key(key(KeyCode::Char('I')));
        assert_eq!(labels(&app), vec!["gpu 0", "pid 20 gpu 0", "pid 10 gpu 0"], "ids descending");
        app.key(key(KeyCode::Char('.')));
        assert_eq!(app.sort, Sort::Reserved);
        assert_eq!(labels(&app), vec!["gpu 0", "pid 10 gpu 0", "pid 20 gpu 0"], "reversed: least reserved first");
        // `r` is nvitop's refresh (issue 27): the order stays, the screen is redrawn.
        app.key(key(KeyCode::Char('r')));
        assert!(app.refresh, "r asks for a redraw");
        assert_eq!(labels(&app), vec!["gpu 0", "pid 10 gpu 0", "pid 20 gpu 0"], "r does not reverse");
        app.key(key(KeyCode::Char('I')));
        assert_eq!(labels(&app), vec!["gpu 0", "pid 20 gpu 0", "pid 10 gpu 0"]);
        for _ in 0..Sort::ALL.len() {
            app.key(key(KeyCode::Char('s')));
        }
        assert_eq!(app.sort, Sort::Reserved, "s cycles through every column");
    }

    /// Issue 17: exited processes stayed as live-looking rows.
    #[test]
    fn regression_exited_processes_are_marked_then_dropped_after_a_while_or_with_x() {
        let mut st = state();
        st.apply(&Event::new(EventKind::ProcessExit, 10, -1));
        let t0 = Instant::now();
        let mut app = App::new("t", Mode::Live);
        app.tick(t0);
        app.update(Update::Frame(Box::new(crate::views::feed::frame(&st, "t", 1, false))));
        let exited: Vec<(String, bool)> = app.rows().into_iter().map(|r| (r.label, r.exited)).collect();
        assert_eq!(exited, vec![("gpu 0".into(), false), ("pid 20 gpu 0".into(), false), ("pid 10 gpu 0".into(), true)]);
        app.tick(t0 + EXITED_SHOWN - Duration::from_millis(1));
        assert_eq!(labels(&app).len(), 3, "shown, dimmed, for a while");
        app.tick(t0 + EXITED_SHOWN);
        assert_eq!(labels(&app), vec!["gpu 0", "pid 20 gpu 0"], "then dropped");

        let mut app = App::new("t", Mode::Live);
        app.update(Update::Frame(Box::new(crate::views::feed::frame(&st, "t", 1, false))));
        app.key(key(KeyCode::Char('x')));
        assert_eq!(labels(&app), vec!["gpu 0", "pid 20 gpu 0"], "x drops them at once");
    }

    /// Issue 17: no device free or total. Device rows carry the device's own figures; with two
    /// devices an `all gpus` row sums them.
    #[test]
    fn devices_show_free_and_total_and_several_get_an_all_gpus_row() {
        let mut st = state();
        for (d, total, free) in [(0i16, 80u64 << 30, 70u64 << 30), (1, 80 << 30, 60 << 30)] {
            st.apply(&Event {
                size: total,
                device_free: free,
                flags: crate::event::F_DEVICE_FREE_KNOWN,
                ..Event::new(EventKind::DeviceInfo, 0, d)
            });
        }
        let mut e = Event::new(EventKind::MemAlloc, 30, 1);
        e.addr = 1 << 44;
        e.size = 2 << 30;
        st.apply(&e);
        let app = app_of(&st);
        let rows = app.rows();
        let view: Vec<(&str, u64, Option<u64>, Option<u64>)> =
            rows.iter().map(|r| (r.label.as_str(), r.figures.map.reserved, r.figures.device_free, r.figures.device_total)).collect();
        // Devices in index order, each with its processes under it (issue 27).
        let order: Vec<(&str, u64)> = view.iter().map(|v| (v.0, v.1)).collect();
        assert_eq!(
            order,
            [
                ("all gpus", 6 << 30),
                ("gpu 0", 4 << 30),
                ("pid 20 gpu 0", 3 << 30),
                ("pid 10 gpu 0", 1 << 30),
                ("gpu 1", 2 << 30),
                ("pid 30 gpu 1", 2 << 30)
            ]
        );
        let devices: Vec<_> = view.iter().filter(|v| !v.0.starts_with("pid")).copied().collect();
        assert_eq!(
            devices,
            [
                ("all gpus", 6 << 30, Some(130 << 30), Some(160 << 30)),
                ("gpu 0", 4 << 30, Some(70 << 30), Some(80 << 30)),
                ("gpu 1", 2 << 30, Some(60 << 30), Some(80 << 30)),
            ],
            "{view:?}"
        );
    }

    /// Issue 17: rows showed no command or user. A live process's are read once, an exited
    /// one's never; the filter matches them too.
    #[test]
    fn command_and_user_are_read_once_for_running_processes_and_filter_rows() {
        let mut st = state();
        st.apply(&Event::new(EventKind::ProcessExit, 10, -1));
        let mut app = app_of(&st);
        let calls = std::cell::RefCell::new(Vec::new());
        let read = |pid: u32, _: Option<&str>| {
            calls.borrow_mut().push(pid);
            Some(Owner { command: format!("python train.py --rank {pid}"), user: "alice".into() })
        };
        app.learn_owners(read);
        app.learn_owners(read);
        assert_eq!(*calls.borrow(), vec![20], "once, and not for the exited pid 10");
        let r = app.rows().into_iter().find(|r| r.key == RowKey::Process(20, 0)).expect("row");
        assert_eq!((r.command.as_str(), r.user.as_str()), ("python train.py --rank 20", "alice"));
        app.filter = "rank 20".into();
        assert_eq!(labels(&app), vec!["pid 20 gpu 0"]);
    }
}
