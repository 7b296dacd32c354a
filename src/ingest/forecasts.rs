//! Forecasts as state: gpufrag's own predictions of each process's coming peak
//! ([`crate::event::EventKind::Forecast`] events, made by the live pipeline's foresight worker
//! and recorded like any event), kept so that every output reads one figure: the latest forecast
//! per (process, device) for the metric `gpufrag.process.memory.predicted_peak` and `top`, and
//! each warning (a forecast whose simulated steps do not fit) for the summary, the warning
//! counter and the alert. A record replays to the same forecasts, hence the same warnings.

use super::State;
use crate::event::Event;
use serde::{Deserialize, Serialize};

/// How many warnings the state keeps (the first ones; all are counted).
pub const KEPT_WARNINGS: usize = 1024;

/// One forecast, as its event stated it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forecast {
    /// When it was made.
    pub ts_ns: u64,
    /// The process.
    pub pid: u32,
    /// The node's GPU index.
    pub device: i16,
    /// Reserved bytes at the predicted peak (for a warning: reserved then + the segment the
    /// failing request asks for, as PyTorch's OOM message counts).
    pub predicted_peak: u64,
    /// What the process may hold: the device's free bytes + what it holds, or its cap.
    pub available: u64,
    /// Whether `available` is the process's cap (`set_per_process_memory_fraction`).
    #[serde(default)]
    pub capped: bool,
    /// Steps ahead of the step that does not fit (0: every step simulated fits).
    pub steps_ahead: u64,
    /// Steps simulated.
    pub horizon: u64,
    /// The setting that would fit, from the simulation, and by how much (a warning's).
    #[serde(default)]
    pub fix: String,
}

impl Forecast {
    /// The forecast an event states.
    pub fn of(ev: &Event, text: &[u8]) -> Forecast {
        Forecast {
            ts_ns: ev.ts_ns,
            pid: ev.pid,
            device: ev.device,
            predicted_peak: ev.size,
            available: ev.requested,
            capped: ev.op == 1,
            steps_ahead: ev.handle,
            horizon: ev.addr,
            fix: String::from_utf8_lossy(text).into_owned(),
        }
    }

    /// True when a simulated step does not fit.
    pub fn warns(&self) -> bool {
        self.steps_ahead > 0
    }
}

impl State {
    /// Applies a forecast event.
    pub(super) fn apply_forecast(&mut self, ev: &Event, text: &[u8]) {
        let f = Forecast::of(ev, text);
        if f.warns() {
            *self.forecast_warning_counts.entry((f.pid, f.device)).or_default() += 1;
            if self.forecast_warnings.len() < KEPT_WARNINGS {
                self.forecast_warnings.push(f.clone());
            }
        }
        self.forecasts.insert((f.pid, f.device), f);
    }

    /// The latest forecast of `pid` on `device`.
    pub fn forecast_of(&self, pid: u32, device: i16) -> Option<&Forecast> {
        self.forecasts.get(&(pid, device))
    }

    /// Warnings of `pid` on `device` so far.
    pub fn forecast_warnings_of(&self, pid: u32, device: i16) -> u64 {
        self.forecast_warning_counts.get(&(pid, device)).copied().unwrap_or(0)
    }
}
