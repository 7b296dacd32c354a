//! The observers `run` (and `attach`) get from the view flags: the post-mortem report written
//! when an allocation failed, and the memviz export of what was captured.
//!
//! Both keep what they need event by event through [`Observer::event`]; a front end that only
//! ticks them still gets a report (the map at the first tick after the failure, the timeline at
//! tick resolution) and a memviz file with the final segments but no trace.

use super::history::History;
use super::memviz::{self, TraceLog};
use super::report::{self, ReportData};
use crate::analysis::summary::Summary;
use crate::event::Event;
use crate::ingest::State;
use crate::observe::Observer;
use std::path::{Path, PathBuf};

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Where the automatic report goes when the user named a place: `explicit`, else `report.html`
/// beside the summary JSON, unless that folder is shared with other users or a device folder
/// (`--summary-json /tmp/x.json`, `/dev/stdout`: then the default place); `None` means
/// [`default_report_path`] of the failed process.
pub fn report_path(explicit: Option<&Path>, summary_json: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    let s = summary_json?;
    let dir = match s.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if crate::private::is_shared_folder(dir) {
        return None;
    }
    Some(dir.join("report.html"))
}

/// The report of an OOM in `pid` when no place was named: `report-PID.html` in the state folder
/// ([`crate::private::state_dir`], `$XDG_STATE_HOME/gpufrag` or `~/.local/state/gpufrag`, a
/// private folder); `None` without a state folder (never a shared one like /tmp, never the
/// current directory).
pub fn default_report_path(pid: u32) -> Option<PathBuf> {
    crate::private::state_dir().map(|d| d.join(format!("report-{pid}.html")))
}

/// Writes report.html at the end of a run in which an allocation failed, and prints its path.
pub struct OomReportWriter {
    path: Option<PathBuf>,
    source: String,
    history: History,
    saw_events: bool,
    /// The report written, if any.
    pub written: Option<PathBuf>,
}

impl OomReportWriter {
    /// A writer that will write to `path` (`None`: [`default_report_path`] of the failed process)
    /// if an OOM happens.
    pub fn new(path: Option<PathBuf>, source: &str) -> OomReportWriter {
        OomReportWriter { path, source: source.to_string(), history: History::default(), saw_events: false, written: None }
    }
}

impl Observer for OomReportWriter {
    fn event(&mut self, state: &State, ev: &Event) {
        self.saw_events = true;
        self.history.observe(state, ev);
    }

    fn tick(&mut self, state: &State) {
        if !self.saw_events {
            self.history.observe_state(state, now_ns());
        }
    }

    fn finish(&mut self, state: &State) {
        if !state.ooms.iter().any(|o| o.counts_as_oom()) {
            return;
        }
        if !self.saw_events {
            self.history.observe_state(state, now_ns());
        }
        let mut summary = Summary::from_state(state, &self.source);
        summary.identify(state);
        if !self.saw_events {
            summary.notes.push("the map and the timeline were sampled at the live status interval, not event by event".into());
        }
        let data = ReportData { summary, state: Some(state.clone()), history: Some(self.history.clone()), log: None };
        let oom = report::pick_oom(&data.summary, None);
        let pid = oom.map_or(0, |i| data.summary.ooms[i].pid);
        let html = report::html(&data, oom);
        let written = match &self.path {
            Some(p) => {
                std::fs::write(p, html).map(|()| p.clone()).map_err(|e| format!("could not write the OOM report {}: {e}", p.display()))
            }
            None => match crate::private::state_dir() {
                None => {
                    Err("no OOM report written: there is no state folder ($XDG_STATE_HOME and $HOME are unset); give --report PATH".into())
                }
                Some(dir) => crate::private::PrivateDir::ensure(&dir)
                    .map_err(|e| format!("no OOM report written: {e}; give --report PATH"))
                    .and_then(|d| {
                        let name = format!("report-{pid}.html");
                        d.write(&name, html.as_bytes())
                            .map_err(|e| format!("could not write the OOM report {}: {e}", d.join(&name).display()))
                    }),
            },
        };
        match written {
            Ok(path) => {
                eprintln!("[gpufrag] OOM report: {}", path.display());
                self.written = Some(path);
            }
            Err(e) => eprintln!("[gpufrag] {e}"),
        }
    }
}

/// Writes what was captured as a PyTorch memory snapshot pickle at the end.
pub struct MemvizWriter {
    path: PathBuf,
    log: TraceLog,
    saw_events: bool,
}

impl MemvizWriter {
    /// A writer to `path` keeping at most `entries` trace entries.
    pub fn new(path: PathBuf, entries: usize) -> MemvizWriter {
        MemvizWriter { path, log: TraceLog::new(entries), saw_events: false }
    }
}

impl Observer for MemvizWriter {
    fn event(&mut self, state: &State, ev: &Event) {
        self.saw_events = true;
        self.log.observe(state, ev);
    }

    fn tick(&mut self, _state: &State) {}

    fn finish(&mut self, state: &State) {
        let log = self.saw_events.then_some(&self.log);
        match memviz::export_all(state, log, &self.path) {
            Ok(files) => {
                for f in files {
                    eprintln!("[gpufrag] memory_viz snapshot: {}", f.display());
                }
                if self.log.dropped > 0 {
                    eprintln!(
                        "[gpufrag] memory_viz trace kept the last {} entries ({} older ones dropped; raise --memviz-entries)",
                        self.log.entries().count(),
                        self.log.dropped
                    );
                }
            }
            Err(e) => eprintln!("[gpufrag] could not write the memory_viz snapshot {e}"),
        }
    }
}
