//! What `top` shows, without the terminal: the latest frame, the rows (one per device and per
//! process) sorted and filtered, the selection, per-row history for the sparklines, and the keys.
//! Kept apart from drawing so that it can be tested with plain values.

use crate::analysis::summary::{DeviceSummary, Summary};
use crate::views::feed::{Frame, Update};
use crate::views::strip::ProcessStrip;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::{HashMap, VecDeque};

/// Samples of history kept per row.
pub const HISTORY: usize = 240;

/// What a row is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowKey {
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
    /// `gpu 0`, `pid 1234 gpu 0`.
    pub label: String,
    /// The figures.
    pub figures: DeviceSummary,
    /// A process row's caching allocator (`pytorch`, `xla`, `cupy`), when one was seen.
    pub framework: Option<crate::framework::Framework>,
}

/// The sort orders `s` cycles through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// Most reserved first.
    Reserved,
    /// Most stranded first.
    Stranded,
    /// Most fragmented first.
    Fragmentation,
    /// Largest free block first.
    LargestFree,
    /// By device and pid.
    Id,
}

impl Sort {
    /// The next order.
    pub fn next(self) -> Sort {
        match self {
            Sort::Reserved => Sort::Stranded,
            Sort::Stranded => Sort::Fragmentation,
            Sort::Fragmentation => Sort::LargestFree,
            Sort::LargestFree => Sort::Id,
            Sort::Id => Sort::Reserved,
        }
    }
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Sort::Reserved => "reserved",
            Sort::Stranded => "stranded",
            Sort::Fragmentation => "fragmentation",
            Sort::LargestFree => "largest free",
            Sort::Id => "id",
        }
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

/// The state of the UI.
#[derive(Debug)]
pub struct App {
    /// Where the frames come from, for the title.
    pub source: String,
    /// The frame shown.
    pub frame: Option<Box<Frame>>,
    /// A newer frame received while paused.
    pub pending: Option<Box<Frame>>,
    /// Why the feed ended, once it did.
    pub ended: Option<String>,
    /// Display frozen.
    pub paused: bool,
    /// Row order.
    pub sort: Sort,
    /// Rows shown contain this (case-insensitive).
    pub filter: String,
    /// The filter being typed, while `/` is active.
    pub editing: Option<String>,
    /// Selected row (index into the visible rows).
    pub selected: usize,
    /// Per row, oldest first.
    pub history: HashMap<RowKey, VecDeque<Sample>>,
    /// Frames received.
    pub frames: u64,
}

fn device_label(d: i16) -> String {
    format!("gpu {d}")
}

impl App {
    /// An empty UI for frames from `source`.
    pub fn new(source: &str) -> App {
        App { source: source.to_string(), frame: None, pending: None, ended: None, paused: false, sort: Sort::Reserved, filter: String::new(), editing: None, selected: 0, history: HashMap::new(), frames: 0 }
    }

    fn show(&mut self, f: Box<Frame>) {
        for r in rows_of(&f.summary) {
            let h = self.history.entry(r.key).or_default();
            h.push_back(Sample { reserved: r.figures.reserved, allocated: r.figures.allocated, stranded: r.figures.stranded });
            while h.len() > HISTORY {
                h.pop_front();
            }
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

    /// The rows shown, sorted and filtered: devices first, then processes.
    pub fn rows(&self) -> Vec<RowView> {
        let Some(f) = &self.frame else { return Vec::new() };
        let mut rows = rows_of(&f.summary);
        let needle = self.editing.as_deref().unwrap_or(&self.filter).to_lowercase();
        if !needle.is_empty() {
            rows.retain(|r| r.label.to_lowercase().contains(&needle));
        }
        let key = |r: &RowView| -> (u8, std::cmp::Reverse<u64>, RowKey) {
            let group = u8::from(matches!(r.key, RowKey::Process(..)));
            let v = match self.sort {
                Sort::Reserved => r.figures.reserved,
                Sort::Stranded => r.figures.stranded,
                Sort::Fragmentation => (r.figures.fragmentation * 1e6) as u64,
                Sort::LargestFree => r.figures.largest_free_block,
                Sort::Id => 0,
            };
            (group, std::cmp::Reverse(v), r.key)
        };
        rows.sort_by_key(key);
        rows
    }

    /// The selected row, if any.
    pub fn selected_row(&self) -> Option<RowView> {
        let rows = self.rows();
        rows.get(self.selected.min(rows.len().saturating_sub(1))).cloned()
    }

    /// The strip map for the selected row: its process, or the largest process on its device.
    pub fn selected_strip(&self) -> Option<&ProcessStrip> {
        let f = self.frame.as_ref()?;
        match self.selected_row()?.key {
            RowKey::Process(pid, d) => f.strips.iter().find(|s| s.pid == pid && s.device == d),
            RowKey::Device(d) => f.strips.iter().filter(|s| s.device == d).max_by_key(|s| s.segments.iter().map(|g| g.size).sum::<u64>()),
        }
    }

    /// Handles a key; true when `top` should quit.
    pub fn key(&mut self, k: KeyEvent) -> bool {
        if let Some(text) = self.editing.as_mut() {
            match k.code {
                KeyCode::Enter => {
                    self.filter = self.editing.take().unwrap_or_default();
                    self.selected = 0;
                }
                KeyCode::Esc => self.editing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return true,
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            return false;
        }
        let n = self.rows().len();
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => return true,
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return true,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('/') => self.editing = Some(self.filter.clone()),
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = !self.paused;
                if !self.paused {
                    if let Some(f) = self.pending.take() {
                        self.show(f);
                    }
                }
            }
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.selected = (self.selected + 1).min(n.saturating_sub(1)),
            KeyCode::Home => self.selected = 0,
            KeyCode::End => self.selected = n.saturating_sub(1),
            _ => {}
        }
        false
    }
}

/// One row per device and per process of a summary, unsorted.
pub fn rows_of(s: &Summary) -> Vec<RowView> {
    let mut rows: Vec<RowView> = s.devices.iter().map(|d| RowView { key: RowKey::Device(d.device), label: device_label(d.device), figures: d.clone(), framework: None }).collect();
    for p in &s.processes {
        rows.push(RowView { key: RowKey::Process(p.pid, p.figures.device), label: format!("{} {}", crate::analysis::summary::Summary::process_label(p), device_label(p.figures.device)), figures: p.figures.clone(), framework: p.framework });
    }
    rows
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

    #[test]
    fn rows_sort_filter_select_and_pause() {
        let mut app = App::new("t");
        app.update(Update::Frame(Box::new(crate::views::feed::frame(&state(), "t", 1, false))));
        let labels: Vec<String> = app.rows().into_iter().map(|r| r.label).collect();
        assert_eq!(labels, vec!["gpu 0", "pid 20 gpu 0", "pid 10 gpu 0"]);
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
}
