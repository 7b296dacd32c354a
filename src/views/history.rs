//! What a picture of a whole trace needs beyond the final state: the figures over time (per
//! device, downsampled to a bounded number of points) and the address map of the process at the
//! moment of each failed allocation.
//!
//! [`History::observe`] is called after each event is applied to a [`State`]; the figures it reads
//! are O(1) per address space, so sampling every event costs no more than applying it. Points are
//! kept in buckets of `stride` events, each the *maximum* of its stretch (memory pictures are about
//! peaks); when the buffer fills, neighbouring buckets merge and the stride doubles, so a trace of
//! any length ends with between `max_points / 2` and `max_points` points.

use crate::event::{Event, EventKind};
use crate::ingest::{OomRecord, ProcessDevice, State};
use std::collections::BTreeMap;

/// Points kept per device by default.
pub const DEFAULT_POINTS: usize = 1200;

/// Failed allocations whose address map is kept: the first ones, plus always the latest.
pub const KEPT_OOM_MAPS: usize = 16;

/// The figures of one device at one moment (the maxima over a stretch of events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Point {
    /// Time stamp of the stretch's last event, ns.
    pub t_ns: u64,
    /// Index of the stretch's last event.
    pub index: u64,
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Stranded bytes.
    pub stranded: u64,
    /// Releasable bytes.
    pub releasable: u64,
    /// Device free, as last measured.
    pub device_free: Option<u64>,
}

impl Point {
    fn merge(&mut self, o: &Point) {
        self.t_ns = self.t_ns.max(o.t_ns);
        self.index = self.index.max(o.index);
        self.reserved = self.reserved.max(o.reserved);
        self.allocated = self.allocated.max(o.allocated);
        self.stranded = self.stranded.max(o.stranded);
        self.releasable = self.releasable.max(o.releasable);
        if o.device_free.is_some() {
            self.device_free = o.device_free;
        }
    }
}

/// One device's figures over time.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Completed points, oldest first.
    pub points: Vec<Point>,
    open: Option<Point>,
    in_open: u64,
    stride: u64,
}

impl Series {
    fn add(&mut self, p: Point, max_points: usize) {
        match self.open.as_mut() {
            Some(o) => o.merge(&p),
            None => self.open = Some(p),
        }
        self.in_open += 1;
        if self.in_open >= self.stride.max(1) {
            self.close(max_points);
        }
    }

    fn close(&mut self, max_points: usize) {
        if let Some(o) = self.open.take() {
            self.points.push(o);
        }
        self.in_open = 0;
        if self.points.len() >= max_points.max(2) {
            let merged: Vec<Point> = self
                .points
                .chunks(2)
                .map(|c| {
                    let mut p = c[0];
                    if let Some(q) = c.get(1) {
                        p.merge(q);
                    }
                    p
                })
                .collect();
            self.points = merged;
            self.stride = self.stride.max(1) * 2;
        }
    }

    /// The points with the open stretch, if any, at the end.
    pub fn all(&self) -> Vec<Point> {
        let mut v = self.points.clone();
        if let Some(o) = self.open {
            v.push(o);
        }
        v
    }
}

/// A failed allocation with the map of its process and device at that moment.
#[derive(Clone, Debug)]
pub struct OomCapture {
    /// Its position in `State::ooms` (0-based).
    pub index: usize,
    /// The record.
    pub record: OomRecord,
    /// The map at the failure (absent when the process had no map on that device).
    pub space: Option<ProcessDevice>,
}

/// A failed allocation on the time axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomMark {
    /// Position in `State::ooms`.
    pub index: usize,
    /// Time stamp, ns.
    pub t_ns: u64,
    /// Index of the event.
    pub event_index: u64,
    /// Device.
    pub device: i16,
    /// Bytes requested.
    pub requested: u64,
}

/// Figures over time and maps at failures, built event by event.
#[derive(Clone, Debug)]
pub struct History {
    /// Per device.
    pub series: BTreeMap<i16, Series>,
    /// Every failed allocation, in order.
    pub marks: Vec<OomMark>,
    /// Maps at failures: the first [`KEPT_OOM_MAPS`] − 1 and the latest.
    pub captures: Vec<OomCapture>,
    /// Events observed.
    pub events: u64,
    max_points: usize,
}

impl Default for History {
    fn default() -> Self {
        History::new(DEFAULT_POINTS)
    }
}

impl History {
    /// An empty history keeping at most `max_points` points per device.
    pub fn new(max_points: usize) -> History {
        History { series: BTreeMap::new(), marks: Vec::new(), captures: Vec::new(), events: 0, max_points: max_points.max(4) }
    }

    fn sample(&mut self, state: &State, device: i16, t_ns: u64) {
        let f = state.device_figures(device);
        let p = Point {
            t_ns,
            index: self.events,
            reserved: f.reserved,
            allocated: f.allocated,
            stranded: f.stranded,
            releasable: f.releasable,
            device_free: state.devices.get(&device).and_then(|d| d.free),
        };
        let max = self.max_points;
        self.series.entry(device).or_default().add(p, max);
    }

    /// Records the state after `ev` was applied to it.
    pub fn observe(&mut self, state: &State, ev: &Event) {
        self.events += 1;
        let kind = ev.kind();
        if matches!(kind, Some(EventKind::ProcessExec | EventKind::Dropped)) {
            return;
        }
        if ev.device >= 0 {
            self.sample(state, ev.device, ev.ts_ns);
        } else {
            let devices: Vec<i16> = state.spaces.keys().filter(|(p, _)| *p == ev.pid).map(|(_, d)| *d).collect();
            for d in devices {
                self.sample(state, d, ev.ts_ns);
            }
        }
        self.note_ooms(state, ev.ts_ns);
    }

    /// Records the state at a tick, for front ends that see no individual events.
    pub fn observe_state(&mut self, state: &State, t_ns: u64) {
        self.events = self.events.max(state.events);
        for d in state.device_ids() {
            self.sample(state, d, t_ns);
        }
        self.note_ooms(state, t_ns);
    }

    fn note_ooms(&mut self, state: &State, t_ns: u64) {
        // The OOMs as the state decided them (crate::ingest::oom_rule): the k-th mark is the
        // summary's k-th OOM.
        while self.marks.len() < state.oom_log().len() {
            let index = self.marks.len();
            let o = &state.ooms[state.oom_log()[index]];
            self.marks.push(OomMark {
                index,
                t_ns: if o.ts_ns > 0 { o.ts_ns } else { t_ns },
                event_index: self.events,
                device: o.device,
                requested: o.requested,
            });
            let capture = OomCapture { index, record: o.clone(), space: state.spaces.get(&(o.pid, o.device)).cloned() };
            if self.captures.len() < KEPT_OOM_MAPS {
                self.captures.push(capture);
            } else if let Some(last) = self.captures.last_mut() {
                *last = capture;
            }
        }
    }

    /// The points of one device.
    pub fn points(&self, device: i16) -> Vec<Point> {
        self.series.get(&device).map(Series::all).unwrap_or_default()
    }

    /// The capture of OOM `index` (0-based), if its map was kept.
    pub fn capture(&self, index: usize) -> Option<&OomCapture> {
        self.captures.iter().find(|c| c.index == index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_traces_keep_a_bounded_number_of_points_and_their_peaks() {
        let mut state = State::default();
        let mut h = History::new(100);
        let base = 1u64 << 40;
        for i in 0..10_000u64 {
            let mut e = Event::new(if i % 2 == 0 { EventKind::MemAlloc } else { EventKind::MemFree }, 1, 0);
            e.addr = base;
            e.size = if i == 5001 - 1 { 7 << 30 } else { 1 << 21 };
            e.ts_ns = i;
            state.apply(&e);
            h.observe(&state, &e);
        }
        let pts = h.points(0);
        assert!(pts.len() <= 100 && pts.len() >= 50, "{}", pts.len());
        assert_eq!(pts.iter().map(|p| p.reserved).max(), Some(7 << 30), "the peak survives downsampling");
    }
}
