//! The state as events: what a rotated record's later part begins with (`--record-max-bytes`,
//! [`crate::record::Rotating::rotate`]), so that every part replays exactly on its own. The
//! events rebuild, from an empty state, what the figures and verdicts of the events after them
//! depend on: each process's allocator settings (at start, then each change, so the settings in
//! force and their history are the same), memory fractions and framework, the devices' totals,
//! each process's latest reading of its device, and each (process, device) address map (reservations, handles, segments, every live block with
//! its exact extent: [`crate::map::AddressSpace::to_events`]). Counters, OOMs and notes of the
//! earlier part stay in it: a part tells the story of its own stretch of time.

use super::State;
use crate::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};

impl State {
    /// The events (each with its text) that rebuild this state's settings, devices and maps from
    /// empty, stamped `ts_ns`.
    pub fn seed_events(&self, ts_ns: u64) -> Vec<(Event, Vec<u8>)> {
        let mut out = Vec::new();
        let at = |e: Event| Event { ts_ns, ..e };
        for (&pid, s) in &self.settings {
            for text in std::iter::once(&s.at_start).chain(&s.changes) {
                out.push((at(Event::new(EventKind::AllocSettings, pid, -1)), text.as_bytes().to_vec()));
            }
            for (&device, (allowed, fraction)) in &s.fractions {
                out.push((
                    at(Event { size: *allowed, ..Event::new(EventKind::MemoryFraction, pid, device) }),
                    fraction.as_bytes().to_vec(),
                ));
            }
            if let Some((framework, text)) = &s.framework {
                out.push((
                    at(Event { flags: framework.flags(), ..Event::new(EventKind::FrameworkInfo, pid, -1) }),
                    text.as_bytes().to_vec(),
                ));
            }
        }
        for (&device, d) in &self.devices {
            if let Some(total) = d.total {
                let (free, flags) = d.free.map_or((0, 0), |f| (f, F_DEVICE_FREE_KNOWN));
                out.push((at(Event { size: total, device_free: free, flags, ..Event::new(EventKind::DeviceInfo, 0, device) }), Vec::new()));
            }
        }
        // Each process's latest reading of the device (the free and total a later OOM may take).
        for (&(pid, device), r) in &self.readings {
            out.push((
                at(Event {
                    size: r.total,
                    device_free: r.free,
                    flags: F_DEVICE_FREE_KNOWN,
                    ..Event::new(EventKind::DeviceInfo, pid, device)
                }),
                Vec::new(),
            ));
        }
        for s in self.spaces.values() {
            out.extend(s.map.to_events(s.pid, s.device).into_iter().map(|e| (at(e), Vec::new())));
        }
        out
    }
}
