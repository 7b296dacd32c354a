//! The typed form of a PyTorch memory snapshot: allocator settings, the final segments with their
//! blocks, and the per-device trace rings.
//!
//! These mirror what `torch.cuda.memory._snapshot()` returns (built by
//! `torch/csrc/cuda/memory_snapshot.cpp` from `c10/cuda/CUDACachingAllocator.h`'s `SegmentInfo`,
//! `BlockInfo` and `TraceEntry`), minus Python stack frames, which are counted and dropped to keep
//! a long trace small.

use std::fmt;

/// One MiB: the unit of the `roundup_power2_divisions` keys.
const MIB: u64 = 1 << 20;

/// A whole snapshot file, decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The allocator configuration in force when the snapshot was taken.
    pub settings: AllocatorSettings,
    /// The allocator's segments at snapshot time, sorted by address as PyTorch reports them. For
    /// expandable segments, each entry is one contiguous mapped range, not one reservation.
    pub segments: Vec<SnapSegment>,
    /// The trace ring of each device; the index is the CUDA device ordinal.
    pub traces: Vec<DeviceTrace>,
    /// Things the loader tolerated but a reader should know (unknown actions, absent settings).
    pub warnings: Vec<String>,
}

/// The caching allocator's settings (`allocator_settings` in the snapshot).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocatorSettings {
    /// `expandable_segments:True`: segments grow in place by mapping more physical memory.
    pub expandable_segments: bool,
    /// Blocks larger than this are never split; `None` when unlimited (PyTorch writes -1).
    pub max_split_size: Option<u64>,
    /// `(interval start in bytes, divisions)`, sorted by start. The snapshot's keys are MiB sizes
    /// `"1"`, `"2"`, ..., `"32768"`; key *k* covers requests of *k* MiB up to 2*k* MiB (the first
    /// also covers everything below 1 MiB, the last everything above 32 GiB). 0 divisions means
    /// plain rounding to 512 bytes. Empty when the snapshot has none.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// `garbage_collection_threshold` (0 when off).
    pub garbage_collection_threshold: f64,
    /// The raw `PYTORCH_CUDA_ALLOC_CONF` string the settings were parsed from.
    pub conf: String,
}

impl AllocatorSettings {
    /// The number of power-of-two divisions PyTorch's `round_size` uses for a request of `size`
    /// bytes (its `roundup_power2_divisions(size)`); 0 when rounding is plain.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let mut divisions = self.roundup_power2_divisions.first().map_or(0, |&(_, d)| d);
        for &(start, d) in &self.roundup_power2_divisions {
            if size >= start {
                divisions = d;
            }
        }
        divisions
    }

    /// The interval start for the snapshot key `k` (a MiB count).
    pub(crate) fn interval_start(k_mib: u64) -> u64 {
        k_mib.saturating_mul(MIB)
    }
}

/// Which of the caching allocator's two pools a segment belongs to (`segment_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// Requests of 1 MiB or less, packed into 2 MiB segments.
    Small,
    /// Everything else.
    Large,
}

/// One segment (`cudaMalloc`), or one mapped range of an expandable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapSegment {
    /// CUDA device ordinal.
    pub device: i16,
    /// Start address.
    pub address: u64,
    /// Bytes in the segment (Σ of its blocks' sizes).
    pub total_size: u64,
    /// Bytes in blocks handed out and not yet freed (`active_allocated`).
    pub allocated_size: u64,
    /// Bytes in active blocks: allocated, or freed but awaiting a stream event.
    pub active_size: u64,
    /// Bytes the callers of the active blocks asked for.
    pub requested_size: u64,
    /// The stream the segment was allocated on (a `cudaStream_t` value, 0 for the default).
    pub stream: u64,
    /// Small or large pool.
    pub pool: Pool,
    /// The private memory pool id (`segment_pool_id`, CUDA graphs and `MemPool`s); `(0, 0)` for
    /// the default pool.
    pub pool_id: (u64, u64),
    /// Part of an expandable segment: this entry is a mapped range, not a `cudaMalloc`.
    pub is_expandable: bool,
    /// Driver memory no caching allocator owns (a raw `cudaMalloc`, a library's workspace, a
    /// JAX mapping). Never in PyTorch's own snapshots, whose segments are all the caching
    /// allocator's; gpufrag's export writes such memory as a segment with one allocated block
    /// (so that memory_viz draws it in use) and the extra key `gpufrag_driver_only: True`, so
    /// that its re-import counts it as `non_framework` again, as the capture did.
    pub driver_only: bool,
    /// The blocks that tile the segment, in address order.
    pub blocks: Vec<SnapBlock>,
}

impl SnapSegment {
    /// True when some block is active (allocated or pending free): the segment cannot be released.
    pub fn has_active_block(&self) -> bool {
        self.blocks.iter().any(|b| b.state.is_active())
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.address.saturating_add(self.total_size)
    }
}

/// One block inside a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapBlock {
    /// Start address.
    pub address: u64,
    /// The block's extent in bytes (after rounding and splitting).
    pub size: u64,
    /// The size its last caller asked for. Stale for inactive blocks: PyTorch keeps the last
    /// value, so it can exceed `size` after a split.
    pub requested_size: u64,
    /// Allocated, pending free, or free.
    pub state: BlockState,
}

/// A block's state as the snapshot names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// `active_allocated`: handed out to a caller. Counted in `allocated_bytes`.
    ActiveAllocated,
    /// `active_pending_free`: freed by the caller but still used by another stream
    /// (`record_stream`); reusable once its events complete. Counted in `active_bytes`, not in
    /// `allocated_bytes`.
    ActivePending,
    /// `inactive`: free, cached.
    Inactive,
}

impl BlockState {
    /// Allocated or pending free.
    pub fn is_active(self) -> bool {
        !matches!(self, BlockState::Inactive)
    }

    /// The snapshot's spelling.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePending => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One device's trace ring, oldest entry first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceTrace {
    /// CUDA device ordinal (the index in `device_traces`).
    pub device: i16,
    /// The entries, in the order the allocator recorded them.
    pub entries: Vec<TraceEntry>,
}

/// What a trace entry records: `TraceEntry::Action` in `c10/cuda/CUDACachingAllocator.h`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// `alloc`: a caller asked the caching allocator for `size` bytes and got `addr`.
    Alloc,
    /// `free_requested`: a caller freed `addr`; the block may still be in use on another stream.
    FreeRequested,
    /// `free_completed`: the block at `addr` is really free (reusable) now.
    FreeCompleted,
    /// `segment_alloc`: `cudaMalloc` of `size` bytes at `addr`.
    SegmentAlloc,
    /// `segment_free`: `cudaFree` of the segment at `addr` (`empty_cache`, or a retry after OOM).
    SegmentFree,
    /// `segment_map`: `cuMemMap` of `size` bytes at `addr` (expandable segments).
    SegmentMap,
    /// `segment_unmap`: `cuMemUnmap` of `size` bytes at `addr` (expandable segments).
    SegmentUnmap,
    /// `snapshot`: a snapshot was taken here (`size` = total active bytes); marks time only.
    Snapshot,
    /// `oom`: the allocator raised OutOfMemoryError for `size` bytes; `device_free` bytes were
    /// free on the device.
    Oom,
    /// `user_defined`: an annotation recorded by user code; marks time only.
    UserDefined,
    /// An action this build does not know (a newer PyTorch, or a vendor fork such as
    /// `workspace_snapshot`); kept in place, produces no event, and counted in the warnings.
    #[default]
    Unknown,
}

impl Action {
    /// Every action PyTorch defines, in `TraceEntry::Action` order.
    pub const KNOWN: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::UserDefined,
    ];

    /// The snapshot's spelling; `"unknown"` for [`Action::Unknown`].
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::UserDefined => "user_defined",
            Action::Unknown => "unknown",
        }
    }

    /// Parses the snapshot's spelling; `None` for names PyTorch does not define.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::KNOWN.into_iter().find(|a| a.name() == name)
    }

    /// True for the actions whose `addr` and `size` describe memory (all but `snapshot`,
    /// `user_defined`, `oom` and unknown ones).
    pub fn touches_memory(self) -> bool {
        !matches!(self, Action::Snapshot | Action::UserDefined | Action::Oom | Action::Unknown)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One trace entry, frames dropped (their number kept in `frames`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: Action,
    /// The block or segment address; 0 for `oom` and for entries that carry none.
    pub addr: u64,
    /// Bytes: requested size for `alloc`/`free_*`, segment or range size for `segment_*`, the
    /// failed request for `oom`, total active bytes for `snapshot`.
    pub size: u64,
    /// The stream (a `cudaStream_t` value, 0 for the default stream).
    pub stream: u64,
    /// Microseconds since the Unix epoch (0 when the snapshot predates timestamps).
    pub time_us: u64,
    /// For `oom`: free bytes the device reported.
    pub device_free: Option<u64>,
    /// How many Python/C++ stack frames the entry carried (dropped on load).
    pub frames: u32,
    /// A `segment_*` entry about driver memory no caching allocator owns (see
    /// [`SnapSegment::driver_only`]; gpufrag's export only, key `gpufrag_driver_only`).
    pub driver_only: bool,
}
