//! The caching allocator's rules: how PyTorch's `CUDACachingAllocator` turns a requested size
//! into a block and decides whether the rest of a free run is split off or swallowed.
//!
//! These are the rules of c10/cuda/CUDACachingAllocator.cpp (`round_size`, `should_split`,
//! `get_allocation_size`, the oversize checks of `get_free_block`) and of the allocator
//! configuration (`PYTORCH_CUDA_ALLOC_CONF`, parsed as c10/core/AllocatorConfig.cpp parses it,
//! with its error messages: [`AllocConf::parse`]). The address map applies them when a block event
//! carries only the requested size (snapshot `alloc` entries, USDT `pytorch:malloc`), so that
//! replayed block extents are the allocator's own, byte for byte; the simulator (`crate::sim`)
//! applies the same functions, so replay, live capture and whatif share one copy of the rules.

/// Smallest block, and the rounding unit: 512 bytes.
pub const MIN_BLOCK: u64 = 512;
/// Requests of at most 1 MiB are served from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Small-pool segments are 2 MiB.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Large requests under 10 MiB get a 20 MiB segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// The segment size for large requests under [`MIN_LARGE_ALLOC`].
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Larger segments are rounded up to 2 MiB.
pub const ROUND_LARGE: u64 = 2 << 20;
/// The driver's page: sub-2 MiB driver allocations share these.
pub const DRIVER_PAGE: u64 = 2 << 20;
/// Number of power-of-two intervals (1 MiB .. 64 GiB) for `roundup_power2_divisions`.
pub const ROUNDUP_INTERVALS: usize = 16;

/// One allocator configuration (`PYTORCH_CUDA_ALLOC_CONF`), as the snapshot's
/// `allocator_settings` records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorRules {
    /// Blocks of this size or more are never split (`max_split_size_mb`); `u64::MAX` = unlimited.
    pub max_split_size: u64,
    /// Divisions per power-of-two interval starting at 1 MiB (index 0) up to 32 GiB (index 15);
    /// 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
}

impl Default for AllocatorRules {
    fn default() -> Self {
        AllocatorRules { max_split_size: u64::MAX, roundup_power2_divisions: [0; ROUNDUP_INTERVALS] }
    }
}

fn floor_log2(v: u64) -> u32 {
    63 - v.max(1).leading_zeros()
}

impl AllocatorRules {
    /// `roundup_power2_divisions(size)`: the divisions configured for the interval holding `size`.
    fn divisions(&self, size: u64) -> u64 {
        let log = floor_log2(size) as i64;
        let start = floor_log2(1 << 20) as i64;
        let idx = (log - start).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }

    /// `round_size(size)`: the block size the allocator carves for a request of `size` bytes.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions(size);
        if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
            return roundup_power2_next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }

    /// Whether a (rounded) block size is served from the small pool.
    pub fn is_small(rounded: u64) -> bool {
        rounded <= SMALL_SIZE
    }

    /// `should_split`: whether a free run of `run` bytes serving a block of `rounded` bytes is
    /// split (the rest stays a free block) or handed out whole (the block swallows the rest).
    ///
    /// `expandable`: the run lies in an expandable segment (a mapped range). PyTorch then splits
    /// any remainder of 512 bytes or more in both pools and ignores `max_split_size`
    /// (`block->pool->is_small || CUDAAllocatorConfig::expandable_segments()`).
    pub fn should_split(&self, run: u64, rounded: u64, expandable: bool) -> bool {
        let remaining = run.saturating_sub(rounded);
        if Self::is_small(rounded) || expandable {
            remaining >= MIN_BLOCK
        } else {
            rounded < self.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `get_allocation_size`: the segment the allocator asks the driver for, for a rounded size.
    pub fn segment_size(rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
        }
    }
}

/// `roundup_power2_next_division`: round up to the next of `divisions` steps between two powers
/// of two.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << floor_log2(size);
    let division = floor >> floor_log2(divisions);
    if division == 0 {
        return floor << 1;
    }
    let round_floor = size & !(division - 1);
    if round_floor == size {
        size
    } else {
        round_floor + division
    }
}

/// One MiB, the unit of the `*_mb` options.
const MB: u64 = 1 << 20;

/// A whole allocator configuration: the rules above plus the options that change where blocks
/// come from (`expandable_segments`, `garbage_collection_threshold`, `max_non_split_rounding_mb`).
#[derive(Clone, Debug, PartialEq)]
pub struct AllocConf {
    /// Rounding and split rules.
    pub rules: AllocatorRules,
    /// `max_non_split_rounding_mb`: how much larger than an oversize request (>= `max_split_size`)
    /// a cached block may be and still serve it whole; PyTorch's default is 20 MiB.
    pub max_non_split_rounding: u64,
    /// `garbage_collection_threshold` (0 = off); acts only under a memory fraction.
    pub garbage_collection_threshold: f64,
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// The string as given.
    pub conf: String,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            rules: AllocatorRules::default(),
            max_non_split_rounding: LARGE_BUFFER,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            conf: String::new(),
        }
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` PyTorch would reject, or one whatif cannot simulate; the message is
/// PyTorch's own where PyTorch rejects it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfError {
    /// The option the error is about, when there is one.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

fn conf_err(key: Option<&str>, message: String) -> ConfError {
    ConfError { key: key.map(str::to_string), message }
}

/// `lexArgs`: split on `,` `:` `[` `]` (kept as tokens), spaces dropped.
fn lex(conf: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in conf.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(ch.to_string());
        } else if ch != ' ' {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

/// C++ `stoi`/`stoul` on a token: leading digits (after an optional sign), else an error.
fn parse_uint(key: &str, tok: &str) -> Result<u64, ConfError> {
    let digits: String = tok.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse::<u64>().map_err(|_| conf_err(Some(key), format!("invalid value {tok:?} for CachingAllocator option {key}: stoi")))
}

impl AllocConf {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string as PyTorch 2.11 does (`AllocatorConfig::parseArgs`
    /// and the CUDA-specific keys of `CUDAAllocatorConfig`); `""` gives PyTorch's defaults.
    /// Options that do not change the device allocator's decisions (`release_lock_on_cudamalloc`,
    /// the `pinned_*` host options, `graph_capture_record_stream_reuse`) are accepted and ignored;
    /// `backend:cudaMallocAsync` is refused, since the driver's pool is not this allocator.
    pub fn parse(conf: &str) -> Result<AllocConf, ConfError> {
        let mut out = AllocConf { conf: conf.to_string(), ..AllocConf::default() };
        let t = lex(conf);
        let expect = |i: usize, c: &str| -> Result<(), ConfError> {
            if t.get(i).map(String::as_str) == Some(c) {
                Ok(())
            } else {
                Err(conf_err(None, format!("Error parsing CachingAllocator::AllocatorConfig settings, expected {c}")))
            }
        };
        let mut i = 0;
        while i < t.len() {
            let key = t[i].clone();
            let value = |i: usize| -> Result<&String, ConfError> {
                t.get(i).ok_or_else(|| conf_err(Some(&key), format!("Error, expecting {key} value")))
            };
            match key.as_str() {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    expect(i + 1, ":")?;
                    i += 2;
                    let v = parse_uint(&key, value(i)?)?;
                    if v < LARGE_BUFFER / MB {
                        return Err(conf_err(
                            Some(&key),
                            format!("CachingAllocator option {key} too small, must be >= {}", LARGE_BUFFER / MB),
                        ));
                    }
                    let bytes = v.min(u64::MAX / MB) * MB;
                    if key == "max_split_size_mb" {
                        out.rules.max_split_size = bytes;
                    } else {
                        out.max_non_split_rounding = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    expect(i + 1, ":")?;
                    i += 2;
                    let tok = value(i)?;
                    let v: f64 = tok
                        .parse()
                        .map_err(|_| conf_err(Some(&key), format!("invalid value {tok:?} for CachingAllocator option {key}: stod")))?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(conf_err(Some(&key), "garbage_collect_threshold is invalid, set it in (0.0, 1.0)".into()));
                    }
                    out.garbage_collection_threshold = v;
                }
                "roundup_power2_divisions" => {
                    expect(i + 1, ":")?;
                    i += 2;
                    if value(i)? == "[" {
                        let mut first = true;
                        let mut last = 0usize;
                        loop {
                            i += 1;
                            match t.get(i).map(String::as_str) {
                                None => return Err(conf_err(Some(&key), "Error parsing roundup_power2_divisions value".into())),
                                Some("]") => break,
                                _ => {}
                            }
                            let interval = t[i].clone();
                            expect(i + 1, ":")?;
                            i += 2;
                            let tok =
                                t.get(i).ok_or_else(|| conf_err(Some(&key), "Error parsing roundup_power2_divisions value".into()))?;
                            let d = parse_uint(&key, tok)?;
                            if d != 0 && !d.is_power_of_two() {
                                return Err(conf_err(
                                    Some(&key),
                                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup ".into(),
                                ));
                            }
                            let div = &mut out.rules.roundup_power2_divisions;
                            if interval == ">" {
                                for x in div.iter_mut().skip(last + 1) {
                                    *x = d;
                                }
                            } else {
                                let mb = parse_uint(&key, &interval)?;
                                if !mb.is_power_of_two() {
                                    return Err(conf_err(Some(&key), "For roundups, the intervals have to be power of 2 ".into()));
                                }
                                let idx = (floor_log2(mb) as usize).min(ROUNDUP_INTERVALS - 1);
                                if first {
                                    for x in div.iter_mut().take(idx) {
                                        *x = d;
                                    }
                                    first = false;
                                }
                                div[idx] = d;
                                last = idx;
                            }
                            if t.get(i + 1).map(String::as_str) != Some("]") {
                                expect(i + 1, ",")?;
                                i += 1;
                            }
                        }
                    } else {
                        let d = parse_uint(&key, value(i)?)?;
                        if !d.is_power_of_two() {
                            return Err(conf_err(Some(&key), "For roundups, the divisions has to be power of 2 ".into()));
                        }
                        out.rules.roundup_power2_divisions = [d; ROUNDUP_INTERVALS];
                    }
                }
                "expandable_segments"
                | "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse" => {
                    expect(i + 1, ":")?;
                    i += 2;
                    let v = value(i)?;
                    if v != "True" && v != "False" {
                        return Err(conf_err(Some(&key), format!("Expected a single True/False argument for {key}")));
                    }
                    if key == "expandable_segments" {
                        out.expandable_segments = v == "True";
                    }
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    expect(i + 1, ":")?;
                    i += 2;
                    parse_uint(&key, value(i)?)?;
                }
                "backend" => {
                    expect(i + 1, ":")?;
                    i += 2;
                    let v = value(i)?;
                    match v.as_str() {
                        "native" => {}
                        "cudaMallocAsync" => {
                            return Err(conf_err(
                                Some(&key),
                                "backend:cudaMallocAsync hands every request to the driver's stream-ordered pool; whatif simulates the native caching allocator only".into(),
                            ))
                        }
                        _ => return Err(conf_err(Some(&key), format!("Unknown allocator backend, options are native and cudaMallocAsync (got {v})"))),
                    }
                }
                _ => return Err(conf_err(Some(&key), format!("Unrecognized CachingAllocator option: {key}"))),
            }
            if i + 1 < t.len() {
                expect(i + 1, ",")?;
                i += 1;
            }
            i += 1;
        }
        Ok(out)
    }

    /// The oversize checks of `get_free_block`: whether the best-fit cached block of `block`
    /// bytes may serve a request rounded to `rounded` bytes. A request under `max_split_size`
    /// never takes an oversize block; an oversize request takes one only when it wastes less
    /// than `max_non_split_rounding`.
    pub fn cached_block_serves(&self, block: u64, rounded: u64) -> bool {
        let mss = self.rules.max_split_size;
        if rounded < mss && block >= mss {
            return false;
        }
        !(rounded >= mss && block >= rounded.saturating_add(self.max_non_split_rounding))
    }

    /// True when garbage collection can ever run: a threshold is set and so is a memory fraction.
    pub fn collects_garbage(&self, fraction_set: bool) -> bool {
        fraction_set && self.garbage_collection_threshold > 0.0
    }
}

/// PyTorch's caching allocator as the map, the analysis and the outputs see it. Its OOM words
/// and fixes are the analysis' own (they weigh the process's settings, its memory fraction and
/// the driver level, which only the analysis holds).
pub struct Pytorch;

/// The one instance, listed first in the registration table (events that name no allocator).
pub static MODEL: Pytorch = Pytorch;

impl super::model::AllocatorModel for Pytorch {
    fn name(&self) -> &'static str {
        "pytorch"
    }

    fn allocator(&self) -> &'static str {
        "PyTorch's caching allocator"
    }

    fn block_size(&self, rules: &super::model::Rules, run: super::model::FreeRun, requested: u64) -> u64 {
        let r = &rules.pytorch;
        let rounded = r.round_size(requested);
        if rounded <= run.avail && !r.should_split(run.avail, rounded, run.mapped) {
            run.avail
        } else {
            rounded
        }
    }

    fn has_allowed_limit(&self) -> bool {
        true
    }

    fn fix_command(&self, kind: super::model::OomKind) -> Option<&'static str> {
        (kind == super::model::OomKind::Fragmentation).then_some("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_size_is_512_multiples_with_512_minimum() {
        let r = AllocatorRules::default();
        assert_eq!(r.round_size(0), 512);
        assert_eq!(r.round_size(1), 512);
        assert_eq!(r.round_size(512), 512);
        assert_eq!(r.round_size(513), 1024);
        assert_eq!(r.round_size(314_572_800), 314_572_800);
    }

    #[test]
    fn split_thresholds_differ_by_pool() {
        let r = AllocatorRules::default();
        // small pool: a remainder of 512 bytes or more is split off
        assert!(r.should_split(2 << 20, 1024, false));
        assert!(!r.should_split(1024 + 511, 1024, false));
        // large pool: only a remainder above 1 MiB is split off
        assert!(r.should_split(500 << 20, 300 << 20, false));
        assert!(!r.should_split((300 << 20) + (1 << 20), 300 << 20, false));
        assert!(r.should_split((300 << 20) + (1 << 20) + 512, 300 << 20, false));
    }

    #[test]
    fn expandable_segments_split_any_remainder_of_512_bytes() {
        let r = AllocatorRules { max_split_size: 200 << 20, ..Default::default() };
        assert!(r.should_split((300 << 20) + 512, 300 << 20, true));
        assert!(!r.should_split((300 << 20) + 511, 300 << 20, true));
        assert!(r.should_split((2 << 20) + 512, 2 << 20, true));
    }

    #[test]
    fn max_split_size_stops_splitting_big_blocks() {
        let r = AllocatorRules { max_split_size: 200 << 20, ..Default::default() };
        assert!(!r.should_split(500 << 20, 300 << 20, false));
        assert!(r.should_split(500 << 20, 100 << 20, false));
    }

    #[test]
    fn power2_divisions_round_to_the_next_division() {
        let r = AllocatorRules { roundup_power2_divisions: [4; ROUNDUP_INTERVALS], ..AllocatorRules::default() };
        // 1200 MiB lies in [1 GiB, 2 GiB): quarters of 256 MiB → 1280 MiB
        assert_eq!(r.round_size(1200 << 20), 1280 << 20);
        assert_eq!(r.round_size(1 << 30), 1 << 30);
        // at or below 512 × divisions the plain rounding applies
        assert_eq!(r.round_size(1500), 1536);
    }

    #[test]
    fn conf_parses_the_options_pytorch_knows() {
        let c = AllocConf::parse("max_split_size_mb:256,roundup_power2_divisions:4, garbage_collection_threshold:0.6").unwrap();
        assert_eq!(c.rules.max_split_size, 256 << 20);
        assert_eq!(c.rules.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert!(!c.expandable_segments);
        assert_eq!(AllocConf::parse("").unwrap(), AllocConf::default());
        assert!(AllocConf::parse("expandable_segments:True").unwrap().expandable_segments);
        let l = AllocConf::parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]").unwrap();
        let mut want = [0u64; ROUNDUP_INTERVALS];
        for (i, w) in want.iter_mut().enumerate() {
            *w = match i {
                0..=6 => 8,
                7 => 2,
                8 => 4,
                9 => 2,
                10 => 4,
                _ => 1,
            };
        }
        assert_eq!(l.rules.roundup_power2_divisions, want);
        assert_eq!(AllocConf::parse("max_non_split_rounding_mb:64").unwrap().max_non_split_rounding, 64 << 20);
    }

    #[test]
    fn conf_rejects_what_pytorch_rejects() {
        let e = AllocConf::parse("max_split_size_mb:256,foo:1").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("foo"));
        assert_eq!(e.message, "Unrecognized CachingAllocator option: foo");
        assert_eq!(
            AllocConf::parse("max_split_size_mb:10").unwrap_err().message,
            "CachingAllocator option max_split_size_mb too small, must be >= 20"
        );
        assert_eq!(
            AllocConf::parse("garbage_collection_threshold:1.5").unwrap_err().message,
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
        );
        assert_eq!(
            AllocConf::parse("roundup_power2_divisions:3").unwrap_err().message,
            "For roundups, the divisions has to be power of 2 "
        );
        assert_eq!(
            AllocConf::parse("expandable_segments:yes").unwrap_err().message,
            "Expected a single True/False argument for expandable_segments"
        );
        assert!(AllocConf::parse("backend:cudaMallocAsync").is_err());
        assert!(AllocConf::parse("max_split_size_mb").is_err());
    }

    #[test]
    fn oversize_blocks_serve_only_oversize_requests_within_the_rounding() {
        let c = AllocConf::parse("max_split_size_mb:256").unwrap();
        assert!(!c.cached_block_serves(500 << 20, 300 << 20));
        assert!(c.cached_block_serves(310 << 20, 300 << 20));
        assert!(!c.cached_block_serves(320 << 20, 300 << 20));
        assert!(!c.cached_block_serves(300 << 20, 100 << 20));
        assert!(c.cached_block_serves(200 << 20, 100 << 20));
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(AllocatorRules::segment_size(512), 2 << 20);
        assert_eq!(AllocatorRules::segment_size(3 << 20), 20 << 20);
        assert_eq!(AllocatorRules::segment_size((10 << 20) + 1), 12 << 20);
    }
}
