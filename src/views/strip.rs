//! What a stretch of a segment holds, at any resolution: the one reduction of the block map that
//! both pictures use (the report's memory map, pixel by pixel, and `top`'s strip map, cell by
//! cell), and the per-segment strips the live feed sends.

use crate::ingest::ProcessDevice;
use crate::map::{AddressSpace, Segment};
use serde::{Deserialize, Serialize};

/// Cells per segment in a feed strip.
pub const STRIP_CELLS: usize = 64;

/// Segments per process a feed frame carries (the largest first when there are more).
pub const STRIP_SEGMENTS: usize = 1024;

/// The share of each of `bins` equal stretches of `seg` held by live blocks (1.0 for a segment no
/// framework owns: it is in use in full). O(free runs in the segment + bins).
pub fn live_fractions(map: &AddressSpace, seg: &Segment, bins: usize) -> Vec<f64> {
    let bins = bins.max(1);
    if !seg.framework {
        return vec![1.0; bins];
    }
    let mut free = vec![0.0f64; bins];
    let width = seg.size as f64 / bins as f64;
    for (start, len) in map.free_runs_in(seg.start, seg.end()) {
        let lo = (start - seg.start) as f64;
        let hi = (lo + len as f64).min(seg.size as f64);
        let first = ((lo / width).floor() as usize).min(bins - 1);
        let last = (((hi / width).ceil() as usize).max(first + 1)).min(bins);
        for (i, f) in free.iter_mut().enumerate().take(last).skip(first) {
            let b_lo = i as f64 * width;
            let b_hi = b_lo + width;
            let overlap = hi.min(b_hi) - lo.max(b_lo);
            if overlap > 0.0 {
                *f += overlap / width;
            }
        }
    }
    free.into_iter().map(|f| (1.0 - f).clamp(0.0, 1.0)).collect()
}

/// The start and length of the largest free run of a map (the lowest address among equals).
pub fn largest_free_run(map: &AddressSpace) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    for (s, l) in map.free_runs() {
        if best.is_none_or(|(_, bl)| l > bl) {
            best = Some((s, l));
        }
    }
    best
}

/// One segment as the feed sends it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SegmentStrip {
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// How the driver handed it out (`driver`, `mapped`, `pool`, ...).
    pub kind: String,
    /// Owned by a caching allocator (its free space is cache).
    pub framework: bool,
    /// Live blocks inside.
    pub live_blocks: u64,
    /// Bytes in live blocks (the whole segment when no framework owns it).
    pub live_bytes: u64,
    /// Free bytes held hostage by live blocks.
    pub stranded: u64,
    /// Bytes `empty_cache()` would return (the whole segment when it holds no live block).
    pub releasable: u64,
    /// The largest free run inside.
    pub largest_free_run: u64,
    /// [`STRIP_CELLS`] digits, one per equal stretch of the segment: `0` no live byte, `8` all
    /// live, `1`..`7` the share of live bytes in eighths (never 0 or 8 unless exactly so).
    pub cells: String,
}

/// One process's segments on one device, as the feed sends them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessStrip {
    /// Process id.
    pub pid: u32,
    /// Device.
    pub device: i16,
    /// Start of the largest free run (0 when there is none).
    pub largest_free_run_address: u64,
    /// Its length.
    pub largest_free_run: u64,
    /// Segments in address order (at most [`STRIP_SEGMENTS`]).
    pub segments: Vec<SegmentStrip>,
    /// Segments left out (the smallest) when there were more.
    pub left_out: u64,
}

/// A live share as an eighths digit.
pub fn eighths(f: f64) -> char {
    let d = if f <= 0.0 {
        0
    } else if f >= 1.0 {
        8
    } else {
        ((f * 8.0).round() as u32).clamp(1, 7)
    };
    char::from_digit(d, 10).unwrap_or('0')
}

/// The strip of one process on one device.
pub fn process_strip(space: &ProcessDevice) -> ProcessStrip {
    let map = &space.map;
    let mut segs: Vec<&Segment> = map.segments().collect();
    let mut left_out = 0;
    if segs.len() > STRIP_SEGMENTS {
        left_out = (segs.len() - STRIP_SEGMENTS) as u64;
        segs.sort_by(|a, b| b.size.cmp(&a.size).then(a.start.cmp(&b.start)));
        segs.truncate(STRIP_SEGMENTS);
        segs.sort_by_key(|s| s.start);
    }
    let segments = segs
        .into_iter()
        .map(|s| SegmentStrip {
            address: s.start,
            size: s.size,
            kind: s.kind.name().to_string(),
            framework: s.framework,
            live_blocks: s.live_blocks,
            live_bytes: if s.framework { s.live_bytes } else { s.size },
            stranded: s.stranded(),
            releasable: s.releasable(),
            largest_free_run: map.free_runs_in(s.start, s.end()).map(|(_, l)| l).max().unwrap_or(0),
            cells: live_fractions(map, s, STRIP_CELLS).into_iter().map(eighths).collect(),
        })
        .collect();
    let (addr, len) = largest_free_run(map).unwrap_or((0, 0));
    ProcessStrip { pid: space.pid, device: space.device, largest_free_run_address: addr, largest_free_run: len, segments, left_out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::SegmentKind;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_split_segment_shows_its_live_part_and_its_free_tail() {
        let mut m = AddressSpace::default();
        m.driver_alloc(1 << 40, 500 * MIB, SegmentKind::Driver, true, 0).expect("test setup");
        m.block_alloc(1 << 40, 300 * MIB, None).expect("test setup");
        let seg = m.segments().next().expect("test setup").clone();
        let f = live_fractions(&m, &seg, 5);
        assert_eq!(f, vec![1.0, 1.0, 1.0, 0.0, 0.0]);
        let f = live_fractions(&m, &seg, 2);
        assert!((f[0] - 1.0).abs() < 1e-9 && (f[1] - 0.2).abs() < 1e-9, "{f:?}");
        assert_eq!(largest_free_run(&m), Some(((1 << 40) + 300 * MIB, 200 * MIB)));
        let space = ProcessDevice {
            pid: 1,
            device: 0,
            map: m,
            block_sizes: Default::default(),
            segment_sizes: Default::default(),
            allocs: 1,
            frees: 0,
            framework: None,
            owners: Default::default(),
        };
        let s = process_strip(&space);
        assert_eq!(s.segments[0].cells.len(), STRIP_CELLS);
        assert!(s.segments[0].cells.starts_with("8888"));
        assert!(s.segments[0].cells.ends_with("0000"));
        assert_eq!(s.segments[0].stranded, 200 * MIB);
    }

    #[test]
    fn eighths_never_round_a_partial_share_to_empty_or_full() {
        assert_eq!(eighths(0.0), '0');
        assert_eq!(eighths(0.001), '1');
        assert_eq!(eighths(0.999), '7');
        assert_eq!(eighths(1.0), '8');
    }
}
