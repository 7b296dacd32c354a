//! What a snapshot says without replaying it: the per-device figures implied by its final
//! `segments` (named as `torch.cuda.memory_stats()` names them), its OOM entries, and counts over
//! its traces.
//!
//! The sums follow `DeviceCachingAllocator::snapshot()` and the allocator's stat updates:
//! `allocated` counts `active_allocated` blocks only; `active` adds `active_pending_free` blocks
//! (freed by the caller, still in use on another stream); `requested` sums the requested sizes of
//! active blocks; `inactive_split` is the free bytes in segments that still hold an active block
//! (stranded), while a segment with no active block is releasable. PyTorch's `segment` count
//! covers `cudaMalloc` segments only: the mapped ranges of expandable segments are not counted.

use std::collections::BTreeMap;

use super::model::{Action, BlockState, DeviceTrace, Pool, SnapSegment, Snapshot};

/// Figures for one pool (or both), named after the `memory_stats()` keys they reproduce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// `segment`: `cudaMalloc` segments held (expandable ranges excluded, as PyTorch counts).
    pub segment: u64,
    /// `reserved_bytes`: bytes held from the driver (Σ `total_size`; mapped bytes for expandable).
    pub reserved_bytes: u64,
    /// `allocation`: blocks handed out (`active_allocated`).
    pub allocation: u64,
    /// `allocated_bytes`: Σ size of `active_allocated` blocks.
    pub allocated_bytes: u64,
    /// `active`: blocks allocated or pending free.
    pub active: u64,
    /// `active_bytes`: Σ size of active blocks.
    pub active_bytes: u64,
    /// `requested_bytes`: Σ requested size of active blocks.
    pub requested_bytes: u64,
    /// `inactive_split`: free blocks in segments that hold an active block.
    pub inactive_split: u64,
    /// `inactive_split_bytes`: their bytes, the stranded memory.
    pub inactive_split_bytes: u64,
}

impl PoolStats {
    /// Adds one segment. `count_blocks` false leaves its blocks out: a `driver_only` segment next
    /// to the caching allocator's (its one block is driver memory in use, not an allocation of
    /// the cache; the capture counted it as `non_framework`, and so does the replay).
    fn add_segment(&mut self, s: &SnapSegment, count_blocks: bool) {
        if !s.is_expandable {
            self.segment += 1;
        }
        self.reserved_bytes = self.reserved_bytes.saturating_add(s.total_size);
        if !count_blocks {
            return;
        }
        let live = s.has_active_block();
        for b in &s.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    self.allocation += 1;
                    self.allocated_bytes = self.allocated_bytes.saturating_add(b.size);
                }
                BlockState::ActivePending => {}
                BlockState::Inactive => {
                    if live {
                        self.inactive_split += 1;
                        self.inactive_split_bytes = self.inactive_split_bytes.saturating_add(b.size);
                    }
                    continue;
                }
            }
            self.active += 1;
            self.active_bytes = self.active_bytes.saturating_add(b.size);
            self.requested_bytes = self.requested_bytes.saturating_add(b.requested_size);
        }
    }

    /// The figure `memory_stats()` calls `name` (`"reserved_bytes"`, `"allocation"`, ...).
    pub fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "segment" => self.segment,
            "reserved_bytes" => self.reserved_bytes,
            "allocation" => self.allocation,
            "allocated_bytes" => self.allocated_bytes,
            "active" => self.active,
            "active_bytes" => self.active_bytes,
            "requested_bytes" => self.requested_bytes,
            "inactive_split" => self.inactive_split,
            "inactive_split_bytes" => self.inactive_split_bytes,
            _ => return None,
        })
    }
}

/// What the final `segments` imply for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// CUDA device ordinal.
    pub device: i16,
    /// Both pools.
    pub all: PoolStats,
    /// The small pool (2 MiB segments for requests of 1 MiB or less).
    pub small_pool: PoolStats,
    /// The large pool.
    pub large_pool: PoolStats,
    /// Entries in the snapshot's `segments` for this device: segments plus expandable mapped
    /// ranges (what memory_viz draws), unlike [`PoolStats::segment`].
    pub segment_entries: u64,
    /// Of those, mapped ranges of expandable segments.
    pub expandable_ranges: u64,
    /// Bytes in segments with no active block: what `empty_cache()` would return.
    pub releasable_bytes: u64,
    /// The largest free block: the largest free run inside one segment.
    pub largest_free_block: u64,
    /// `oom` entries in this device's trace.
    pub ooms: u64,
}

impl DeviceStats {
    /// The current value of a `memory_stats()` key such as `"reserved_bytes.all.current"` or
    /// `"inactive_split.large_pool.current"`; `None` for keys the snapshot cannot reproduce
    /// (peaks, cumulative counts, retries).
    pub fn current(&self, key: &str) -> Option<u64> {
        let mut parts = key.split('.');
        let (Some(name), Some(pool), Some("current"), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        let pool = match pool {
            "all" => &self.all,
            "small_pool" => &self.small_pool,
            "large_pool" => &self.large_pool,
            _ => return None,
        };
        pool.get(name)
    }
}

/// One `oom` trace entry: a request the allocator could not satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomEntry {
    /// CUDA device ordinal.
    pub device: i16,
    /// Index of the entry in its device's trace.
    pub index: usize,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// Bytes requested.
    pub requested: u64,
    /// Free bytes the device reported, when the snapshot records them.
    pub device_free: Option<u64>,
    /// The stream of the request.
    pub stream: u64,
}

impl Snapshot {
    /// The trace of `device`, if the snapshot has one.
    pub fn trace(&self, device: i16) -> Option<&DeviceTrace> {
        usize::try_from(device).ok().and_then(|i| self.traces.get(i))
    }

    /// Every device the snapshot mentions (with a trace or a segment), ascending.
    pub fn devices(&self) -> Vec<i16> {
        let mut d: Vec<i16> = self.traces.iter().map(|t| t.device).chain(self.segments.iter().map(|s| s.device)).collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Trace entries over all devices.
    pub fn entry_count(&self) -> usize {
        self.traces.iter().map(|t| t.entries.len()).sum()
    }

    /// Stack frames the trace entries carried before they were dropped on load.
    pub fn frame_count(&self) -> u64 {
        self.traces.iter().flat_map(|t| &t.entries).map(|e| u64::from(e.frames)).sum()
    }

    /// How many entries of each action the traces hold, over all devices.
    pub fn action_counts(&self) -> BTreeMap<Action, usize> {
        let mut m = BTreeMap::new();
        for e in self.traces.iter().flat_map(|t| &t.entries) {
            *m.entry(e.action).or_insert(0) += 1;
        }
        m
    }

    /// The segments of `device`, in address order.
    pub fn device_segments(&self, device: i16) -> impl Iterator<Item = &SnapSegment> + '_ {
        self.segments.iter().filter(move |s| s.device == device)
    }

    /// What the final `segments` imply for `device` (all zero for a device it does not mention).
    pub fn device_stats(&self, device: i16) -> DeviceStats {
        let mut st = DeviceStats { device, ..DeviceStats::default() };
        // As the map counts: driver memory is "allocated" only where no caching allocator is seen.
        let cache_seen = self.device_segments(device).any(|s| !s.driver_only);
        for s in self.device_segments(device) {
            let count_blocks = !s.driver_only || !cache_seen;
            st.all.add_segment(s, count_blocks);
            match s.pool {
                Pool::Small => st.small_pool.add_segment(s, count_blocks),
                Pool::Large => st.large_pool.add_segment(s, count_blocks),
            }
            st.segment_entries += 1;
            if s.is_expandable {
                st.expandable_ranges += 1;
            }
            if !s.has_active_block() {
                st.releasable_bytes = st.releasable_bytes.saturating_add(s.total_size);
            }
            for b in s.blocks.iter().filter(|b| b.state == BlockState::Inactive) {
                st.largest_free_block = st.largest_free_block.max(b.size);
            }
        }
        st.ooms = self.trace(device).map_or(0, |t| t.entries.iter().filter(|e| e.action == Action::Oom).count() as u64);
        st
    }

    /// [`Snapshot::device_stats`] for every device in [`Snapshot::devices`].
    pub fn stats(&self) -> Vec<DeviceStats> {
        self.devices().into_iter().map(|d| self.device_stats(d)).collect()
    }

    /// Every `oom` entry, device by device, in trace order.
    pub fn ooms(&self) -> Vec<OomEntry> {
        let mut out = Vec::new();
        for t in &self.traces {
            for (index, e) in t.entries.iter().enumerate().filter(|(_, e)| e.action == Action::Oom) {
                out.push(OomEntry {
                    device: t.device,
                    index,
                    time_us: e.time_us,
                    requested: e.size,
                    device_free: e.device_free,
                    stream: e.stream,
                });
            }
        }
        out
    }
}
