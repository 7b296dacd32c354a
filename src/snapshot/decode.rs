//! Bytes to [`Snapshot`]: gzip detection by magic bytes, pickle decoding ([`super::pickle`]), and
//! the walk over the decoded value that checks every field it keeps.
//!
//! The walk is strict about types (a string where a size belongs is an error naming the field,
//! the entry index, and the byte offset of the dict that holds it) and lenient about presence
//! where PyTorch versions differ: fields added over time (`time_us`, `is_expandable`,
//! `segment_pool_id`, `requested_size`, block `address`, `allocator_settings`) default sensibly,
//! unknown actions are kept as [`Action::Unknown`] and counted in [`Snapshot::warnings`], unknown
//! keys are ignored. It descends only the fixed shape of a snapshot, so it never recurses on the
//! input's nesting.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::path::Path;

use super::error::{OffsetIn, SnapshotError, SnapshotErrorKind};
use super::model::{Action, AllocatorSettings, BlockState, DeviceTrace, Pool, SnapBlock, SnapSegment, Snapshot, TraceEntry};
use super::pickle::{self, Container, Kind, PV};

/// The two bytes every gzip member starts with.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Decodes a whole file's bytes (gzip or not) into a snapshot; `path` names it in errors.
pub(crate) fn decode(bytes: &[u8], path: &Path) -> Result<Snapshot, SnapshotError> {
    decode_behind(bytes, path, &mut |_| {})
}

/// [`decode`], telling `behind` how far into `bytes` a plain pickle's decoder has read (the
/// bytes before are not read again).
pub(crate) fn decode_behind(bytes: &[u8], path: &Path, behind: &mut dyn FnMut(usize)) -> Result<Snapshot, SnapshotError> {
    if bytes.is_empty() {
        return Err(SnapshotError::new(path, SnapshotErrorKind::Empty));
    }
    if bytes.starts_with(&GZIP_MAGIC) {
        let pickle = gunzip(bytes, path)?;
        if pickle.is_empty() {
            return Err(SnapshotError::new(path, SnapshotErrorKind::Empty));
        }
        decode_pickle(&pickle, path, OffsetIn::Decompressed)
    } else {
        decode_pickle_streamed(bytes, path, OffsetIn::File, behind)
    }
}

/// Inflates every gzip member in `bytes`, at most [`super::inflate_limit`] bytes of them.
fn gunzip(bytes: &[u8], path: &Path) -> Result<Vec<u8>, SnapshotError> {
    let limit = super::inflate_limit();
    let mut decoder = flate2::bufread::MultiGzDecoder::new(bytes);
    let mut out = Vec::new();
    let read = (&mut decoder).take(limit).read_to_end(&mut out).and_then(|_| {
        // At the limit: one more byte says whether the stream goes on.
        let mut probe = [0u8; 1];
        decoder.read(&mut probe)
    });
    match read {
        Ok(0) => Ok(out),
        Ok(_) => Err(SnapshotError::at(path, SnapshotErrorKind::InflateLimit { limit }, limit, OffsetIn::Decompressed)),
        Err(e) => {
            // The decoder reads its input slice forward, so what is left says how far it got.
            let consumed = bytes.len().saturating_sub(decoder.get_ref().len()) as u64;
            let kind = if e.kind() == io::ErrorKind::UnexpectedEof {
                SnapshotErrorKind::TruncatedGzip
            } else {
                SnapshotErrorKind::CorruptGzip(e.to_string())
            };
            Err(SnapshotError::at(path, kind, consumed, OffsetIn::File))
        }
    }
}

fn decode_pickle(bytes: &[u8], path: &Path, offset_in: OffsetIn) -> Result<Snapshot, SnapshotError> {
    decode_pickle_streamed(bytes, path, offset_in, &mut |_| {})
}

/// Decodes a pickle, turning each trace entry into its [`TraceEntry`] as soon as its dict is
/// complete (the dict and its frames are dropped there), so that a long trace ring is never
/// held as pickle values; `behind` hears how far the decoder has read.
pub(crate) fn decode_pickle_streamed(
    bytes: &[u8],
    path: &Path,
    offset_in: OffsetIn,
    behind: &mut dyn FnMut(usize),
) -> Result<Snapshot, SnapshotError> {
    let mut streamed: std::collections::HashMap<u32, Streamed> = std::collections::HashMap::new();
    let pk = {
        let mut consume = |arena: &[Container], list: u32, index: usize, v: &PV| -> bool {
            let Some(d) = container(arena, v).filter(|c| c.kind == Kind::Dict) else { return false };
            if !matches!(pick(d, ["action"]), [Some(PV::Str(_))]) {
                return false;
            }
            let w = Walker { path, arena, input_len: bytes.len(), offset_in, budget: std::cell::Cell::new(u64::MAX), cap: u64::MAX };
            let at = Loc::Root("device_traces");
            let s = streamed.entry(list).or_default();
            if s.entries.len() != index {
                return false;
            }
            match w.entry(d, Loc::Index(&at, index)) {
                Ok((entry, unknown)) => {
                    if let Some(name) = unknown {
                        *s.unknown.entry(name.to_string()).or_insert(0) += 1;
                    }
                    s.entries.push(entry);
                    true
                }
                Err(_) => false,
            }
        };
        pickle::decode_streamed(bytes, &mut consume, behind)
    }
    .map_err(|e| {
        let kind = if e.truncated { SnapshotErrorKind::TruncatedPickle } else { SnapshotErrorKind::Pickle(e.message) };
        SnapshotError::at(path, kind, e.offset, offset_in)
    })?;
    // Each segment, block and trace entry of an honest snapshot is a dict of its own, 16 bytes
    // of pickle at the very least; only memo sharing can make more of them.
    let budget = bytes.len() as u64 / 16 + 4096;
    let mut snap =
        Walker { path, arena: &pk.containers, input_len: pk.input_len, offset_in, budget: std::cell::Cell::new(budget), cap: budget }
            .snapshot(&pk.root, std::cell::RefCell::new(streamed))?;
    if pk.trailing > 0 {
        snap.warnings.push(format!("{} bytes after the pickle's STOP opcode ignored", pk.trailing));
    }
    Ok(snap)
}

/// The trace entries taken out of one list while decoding, and the unknown actions among them.
#[derive(Default)]
struct Streamed {
    entries: Vec<TraceEntry>,
    unknown: BTreeMap<String, usize>,
}

/// The container `v` refers to, if it is one.
fn container<'a>(arena: &'a [Container], v: &PV) -> Option<&'a Container> {
    match v {
        PV::Container(i) => arena.get(*i as usize),
        _ => None,
    }
}

/// Where a value sits in the snapshot, built without allocating and rendered only for errors:
/// `device_traces[0][12].size`.
#[derive(Clone, Copy)]
enum Loc<'a> {
    Root(&'static str),
    Index(&'a Loc<'a>, usize),
    Key(&'a Loc<'a>, &'static str),
}

impl fmt::Display for Loc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Root(k) => f.write_str(k),
            Loc::Index(p, i) => write!(f, "{p}[{i}]"),
            Loc::Key(p, k) => write!(f, "{p}.{k}"),
        }
    }
}

/// A short description of a value for error messages: its Python type and, for scalars, the value.
fn describe(arena: &[Container], v: &PV) -> String {
    match v {
        PV::None => "None".into(),
        PV::Bool(b) => format!("bool {}", if *b { "True" } else { "False" }),
        PV::Int(i) => format!("int {i}"),
        PV::UInt(u) => format!("int {u}"),
        PV::HugeInt { bytes } => format!("an int of about {bytes} bytes"),
        PV::Float(x) => format!("float {x}"),
        PV::Bytes(n) => format!("bytes of length {n}"),
        PV::Str(s) => {
            let short: String = s.chars().take(40).collect();
            if short.len() < s.len() {
                format!("str {short:?}...")
            } else {
                format!("str {short:?}")
            }
        }
        PV::Global(g) => format!("global {g}"),
        PV::Container(_) => match container(arena, v) {
            Some(c) => match c.kind {
                Kind::List => format!("a list of {} items", c.len()),
                Kind::Tuple => format!("a tuple of {} items", c.len()),
                Kind::Dict => format!("a dict of {} keys", c.len() / 2),
                Kind::Set => format!("a set of {} items", c.len()),
                Kind::FrozenSet => format!("a frozenset of {} items", c.len()),
            },
            None => "a dangling reference".into(),
        },
    }
}

/// Looks up several string keys in one pass over a dict's flat items, without allocating; a
/// later duplicate key wins, as in Python.
fn pick<'v, const N: usize>(d: &'v Container, keys: [&str; N]) -> [Option<&'v PV>; N] {
    let mut out = [None; N];
    for kv in d.items.chunks_exact(2) {
        if let PV::Str(s) = &kv[0] {
            if let Some(i) = keys.iter().position(|key| *key == s.as_str()) {
                out[i] = Some(&kv[1]);
            }
        }
    }
    out
}

/// A non-negative integer that fits in 64 bits.
fn as_u64(v: &PV) -> Option<u64> {
    match v {
        PV::Int(i) => u64::try_from(*i).ok(),
        PV::UInt(u) => Some(*u),
        _ => None,
    }
}

/// An opaque 64-bit id (a stream or pool handle): any integer that fits in 64 bits, negative
/// values taken as their two's-complement bit pattern (PyTorch writes pointers as `int64_t`).
fn as_bits(v: &PV) -> Option<u64> {
    match v {
        PV::Int(i) => Some(*i as u64),
        PV::UInt(u) => Some(*u),
        _ => None,
    }
}

fn as_i64(v: &PV) -> Option<i64> {
    match v {
        PV::Int(i) => Some(*i),
        _ => None,
    }
}

const NON_NEGATIVE: &str = "a non-negative integer below 2^64";
const INTEGER: &str = "an integer that fits in 64 bits";

struct Walker<'p> {
    path: &'p Path,
    arena: &'p [Container],
    input_len: usize,
    offset_in: OffsetIn,
    /// Segments, blocks and trace entries still allowed (see `decode_pickle`).
    budget: std::cell::Cell<u64>,
    cap: u64,
}

impl<'p> Walker<'p> {
    /// Takes `n` elements from the budget; `owner` locates the error.
    fn spend(&self, n: usize, owner: &Container) -> Result<(), SnapshotError> {
        match self.budget.get().checked_sub(n as u64) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(SnapshotError::at(
                self.path,
                SnapshotErrorKind::Expansion { elements: self.cap, bytes: self.pk_len() },
                owner.offset,
                self.offset_in,
            )),
        }
    }

    fn pk_len(&self) -> u64 {
        self.input_len as u64
    }

    /// An error about the value at `at`, located at the container that holds it.
    fn wrong(&self, at: Loc<'_>, expected: &'static str, found: &PV, owner: &Container) -> SnapshotError {
        SnapshotError::at(
            self.path,
            SnapshotErrorKind::WrongType { field: at.to_string(), expected, found: describe(self.arena, found) },
            owner.offset,
            self.offset_in,
        )
    }

    fn missing(&self, at: Loc<'_>, owner: &Container) -> SnapshotError {
        SnapshotError::at(self.path, SnapshotErrorKind::MissingField { field: at.to_string() }, owner.offset, self.offset_in)
    }

    fn not_snapshot(&self, why: String) -> SnapshotError {
        SnapshotError::new(self.path, SnapshotErrorKind::NotASnapshot(why))
    }

    fn dict(&self, v: &PV, at: Loc<'_>, owner: &Container) -> Result<&'p Container, SnapshotError> {
        match container(self.arena, v) {
            Some(c) if c.kind == Kind::Dict => Ok(c),
            _ => Err(self.wrong(at, "a dict", v, owner)),
        }
    }

    fn list(&self, v: &PV, at: Loc<'_>, owner: &Container) -> Result<&'p Container, SnapshotError> {
        match container(self.arena, v) {
            Some(c) if matches!(c.kind, Kind::List | Kind::Tuple) => Ok(c),
            _ => Err(self.wrong(at, "a list", v, owner)),
        }
    }

    fn u64_req(&self, v: Option<&PV>, at: Loc<'_>, owner: &Container) -> Result<u64, SnapshotError> {
        let v = v.ok_or_else(|| self.missing(at, owner))?;
        as_u64(v).ok_or_else(|| self.wrong(at, NON_NEGATIVE, v, owner))
    }

    fn u64_opt(&self, v: Option<&PV>, at: Loc<'_>, owner: &Container) -> Result<Option<u64>, SnapshotError> {
        match v {
            None | Some(PV::None) => Ok(None),
            Some(v) => as_u64(v).map(Some).ok_or_else(|| self.wrong(at, NON_NEGATIVE, v, owner)),
        }
    }

    fn bits_opt(&self, v: Option<&PV>, at: Loc<'_>, owner: &Container) -> Result<u64, SnapshotError> {
        match v {
            None | Some(PV::None) => Ok(0),
            Some(v) => as_bits(v).ok_or_else(|| self.wrong(at, INTEGER, v, owner)),
        }
    }

    fn bool_opt(&self, v: Option<&PV>, at: Loc<'_>, owner: &Container) -> Result<bool, SnapshotError> {
        match v {
            None | Some(PV::None) => Ok(false),
            Some(PV::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong(at, "a bool", other, owner)),
        }
    }

    fn str_req<'v>(&self, v: Option<&'v PV>, at: Loc<'_>, owner: &Container) -> Result<&'v str, SnapshotError> {
        match v {
            None => Err(self.missing(at, owner)),
            Some(PV::Str(s)) => Ok(s),
            Some(other) => Err(self.wrong(at, "a str", other, owner)),
        }
    }

    fn snapshot(
        &self,
        root: &PV,
        streamed: std::cell::RefCell<std::collections::HashMap<u32, Streamed>>,
    ) -> Result<Snapshot, SnapshotError> {
        const SHAPE: &str = "a dict with `segments` and `device_traces`";
        let d = match container(self.arena, root) {
            Some(c) if c.kind == Kind::Dict => c,
            Some(c) if c.kind == Kind::List => {
                return Err(self.not_snapshot(format!(
                    "the pickle holds {} where {SHAPE} belongs (torch.cuda.memory_snapshot() returns \
                     segments only; save torch.cuda.memory._snapshot() instead)",
                    describe(self.arena, root)
                )))
            }
            _ => return Err(self.not_snapshot(format!("the pickle holds {} where {SHAPE} belongs", describe(self.arena, root)))),
        };
        let [segments, traces, settings] = pick(d, ["segments", "device_traces", "allocator_settings"]);
        let (Some(segments), Some(traces)) = (segments, traces) else {
            let keys: Vec<String> = d
                .items
                .chunks_exact(2)
                .take(8)
                .map(|kv| match &kv[0] {
                    PV::Str(s) => format!("{s:?}"),
                    other => describe(self.arena, other),
                })
                .collect();
            let absent = match (segments.is_none(), traces.is_none()) {
                (true, true) => "`segments` and `device_traces`",
                (true, false) => "`segments`",
                _ => "`device_traces`",
            };
            return Err(self.not_snapshot(format!(
                "the top-level dict has no {absent} (its keys: {}{})",
                if keys.is_empty() { "none".to_string() } else { keys.join(", ") },
                if d.items.len() / 2 > keys.len() { ", ..." } else { "" }
            )));
        };

        let mut warnings = Vec::new();
        let settings = match settings {
            Some(PV::None) | None => {
                warnings.push("no `allocator_settings` (a snapshot from PyTorch before 2.1?): assuming defaults".to_string());
                AllocatorSettings::default()
            }
            Some(v) => self.settings(v, d)?,
        };

        let seg_loc = Loc::Root("segments");
        let seg_list = self.list(segments, seg_loc, d)?;
        self.spend(seg_list.len(), seg_list)?;
        let mut out_segments = Vec::with_capacity(seg_list.items.len());
        for (i, s) in seg_list.items.iter().enumerate() {
            out_segments.push(self.segment(s, Loc::Index(&seg_loc, i), seg_list, &mut warnings)?);
        }

        let tr_loc = Loc::Root("device_traces");
        let tr_list = self.list(traces, tr_loc, d)?;
        let mut out_traces = Vec::with_capacity(tr_list.items.len());
        for (dev, t) in tr_list.items.iter().enumerate() {
            let Ok(device) = i16::try_from(dev) else {
                return Err(self.not_snapshot(format!("{} device traces, more than a device ordinal can number", tr_list.items.len())));
            };
            let taken = match t {
                PV::Container(i) => streamed.borrow_mut().remove(i).unwrap_or_default(),
                _ => Streamed::default(),
            };
            out_traces.push(self.trace(t, device, Loc::Index(&tr_loc, dev), tr_list, taken, &mut warnings)?);
        }

        Ok(Snapshot { settings, segments: out_segments, traces: out_traces, warnings })
    }

    fn settings(&self, v: &PV, owner: &Container) -> Result<AllocatorSettings, SnapshotError> {
        let at = Loc::Root("allocator_settings");
        let d = self.dict(v, at, owner)?;
        let [max_split, gc, expandable, roundup] =
            pick(d, ["max_split_size", "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions"]);
        // the settings string, under the first of the variables' names that is there
        let conf = crate::hello::first_set(&crate::hello::ALLOC_CONF_KEYS, |k| pick(d, [k])[0].map(|v| (k, v)));
        let conf = match conf {
            None | Some((_, PV::None)) => String::new(),
            Some((_, PV::Str(s))) => s.to_string(),
            Some((k, other)) => return Err(self.wrong(Loc::Key(&at, k), "a str", other, d)),
        };
        let max_split_size = match max_split {
            None | Some(PV::None) => None,
            // PyTorch writes SIZE_MAX (no limit) as int64 -1.
            Some(PV::Int(n)) if *n < 0 => None,
            Some(PV::UInt(u64::MAX) | PV::HugeInt { .. }) => None,
            Some(v) => Some(as_u64(v).ok_or_else(|| self.wrong(Loc::Key(&at, "max_split_size"), INTEGER, v, d))?),
        };
        let garbage_collection_threshold = match gc {
            None | Some(PV::None) => 0.0,
            Some(PV::Float(x)) => *x,
            Some(PV::Int(i)) => *i as f64,
            Some(PV::UInt(u)) => *u as f64,
            Some(other) => return Err(self.wrong(Loc::Key(&at, "garbage_collection_threshold"), "a float", other, d)),
        };
        let expandable_segments = self.bool_opt(expandable, Loc::Key(&at, "expandable_segments"), d)?;
        let roundup_power2_divisions = match roundup {
            None | Some(PV::None) => Vec::new(),
            Some(v) => self.roundup(v, Loc::Key(&at, "roundup_power2_divisions"), d)?,
        };
        Ok(AllocatorSettings { expandable_segments, max_split_size, roundup_power2_divisions, garbage_collection_threshold, conf })
    }

    /// `{"1": d, "2": d, ..., "32768": d}` (keys are MiB interval starts), or a plain list of the
    /// 16 division counts.
    fn roundup(&self, v: &PV, at: Loc<'_>, owner: &Container) -> Result<Vec<(u64, u64)>, SnapshotError> {
        let mut out = Vec::new();
        match container(self.arena, v) {
            Some(c) if c.kind == Kind::Dict => {
                for kv in c.items.chunks_exact(2) {
                    let mib = match &kv[0] {
                        PV::Str(s) => s.trim().parse::<u64>().ok(),
                        other => as_u64(other),
                    }
                    .ok_or_else(|| self.wrong(at, "keys that are MiB counts such as \"1\" or \"32768\"", &kv[0], c))?;
                    let div = as_u64(&kv[1]).ok_or_else(|| self.wrong(at, "non-negative division counts", &kv[1], c))?;
                    out.push((AllocatorSettings::interval_start(mib), div));
                }
            }
            Some(c) if matches!(c.kind, Kind::List | Kind::Tuple) => {
                for (i, div) in c.items.iter().enumerate() {
                    let div = as_u64(div).ok_or_else(|| self.wrong(Loc::Index(&at, i), NON_NEGATIVE, div, c))?;
                    let mib = u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i)).unwrap_or(u64::MAX);
                    out.push((AllocatorSettings::interval_start(mib), div));
                }
            }
            _ => return Err(self.wrong(at, "a dict of MiB interval to divisions", v, owner)),
        }
        out.sort_unstable();
        Ok(out)
    }

    fn segment(&self, v: &PV, at: Loc<'_>, owner: &Container, warnings: &mut Vec<String>) -> Result<SnapSegment, SnapshotError> {
        let d = self.dict(v, at, owner)?;
        let [device, address, total_size, allocated, active, requested, stream, seg_type, pool_id, expandable, blocks, driver_only] = pick(
            d,
            [
                "device",
                "address",
                "total_size",
                "allocated_size",
                "active_size",
                "requested_size",
                "stream",
                "segment_type",
                "segment_pool_id",
                "is_expandable",
                "blocks",
                "gpufrag_driver_only",
            ],
        );
        let dev_at = Loc::Key(&at, "device");
        let device = match device {
            None => return Err(self.missing(dev_at, d)),
            Some(v) => as_i64(v).and_then(|n| i16::try_from(n).ok()).ok_or_else(|| self.wrong(dev_at, "a device ordinal", v, d))?,
        };
        let address = self.u64_req(address, Loc::Key(&at, "address"), d)?;
        let total_size = self.u64_req(total_size, Loc::Key(&at, "total_size"), d)?;
        let stream = self.bits_opt(stream, Loc::Key(&at, "stream"), d)?;
        let type_at = Loc::Key(&at, "segment_type");
        let pool = match self.str_req(seg_type, type_at, d)? {
            "large" => Pool::Large,
            "small" => Pool::Small,
            _ => return Err(self.wrong(type_at, "\"large\" or \"small\"", seg_type.unwrap_or(&PV::None), d)),
        };
        let pool_at = Loc::Key(&at, "segment_pool_id");
        let pool_id = match pool_id {
            None | Some(PV::None) => (0, 0),
            Some(v) => match container(self.arena, v) {
                Some(c) if matches!(c.kind, Kind::Tuple | Kind::List) && c.items.len() == 2 => {
                    match (as_bits(&c.items[0]), as_bits(&c.items[1])) {
                        (Some(a), Some(b)) => (a, b),
                        _ => return Err(self.wrong(pool_at, "a pair of integers", v, d)),
                    }
                }
                _ => return Err(self.wrong(pool_at, "a pair of integers", v, d)),
            },
        };
        let is_expandable = self.bool_opt(expandable, Loc::Key(&at, "is_expandable"), d)?;
        let driver_only = self.bool_opt(driver_only, Loc::Key(&at, "gpufrag_driver_only"), d)?;

        let blocks_at = Loc::Key(&at, "blocks");
        let list = self.list(blocks.ok_or_else(|| self.missing(blocks_at, d))?, blocks_at, d)?;
        self.spend(list.len(), list)?;
        let mut out_blocks = Vec::with_capacity(list.items.len());
        let mut cursor = address;
        for (j, b) in list.items.iter().enumerate() {
            let block = self.block(b, Loc::Index(&blocks_at, j), list, cursor)?;
            cursor = block.address.saturating_add(block.size);
            out_blocks.push(block);
        }

        let sum = |keep: fn(&SnapBlock) -> bool, size: fn(&SnapBlock) -> u64| -> u64 {
            out_blocks.iter().filter(|b| keep(b)).map(size).fold(0u64, u64::saturating_add)
        };
        let allocated_size = self
            .u64_opt(allocated, Loc::Key(&at, "allocated_size"), d)?
            .unwrap_or_else(|| sum(|b| b.state == BlockState::ActiveAllocated, |b| b.size));
        let active_size =
            self.u64_opt(active, Loc::Key(&at, "active_size"), d)?.unwrap_or_else(|| sum(|b| b.state.is_active(), |b| b.size));
        let requested_size = self
            .u64_opt(requested, Loc::Key(&at, "requested_size"), d)?
            .unwrap_or_else(|| sum(|b| b.state.is_active(), |b| b.requested_size));
        let block_total = sum(|_| true, |b| b.size);
        if block_total != total_size && warnings.len() < 64 {
            warnings.push(format!("{at}: its blocks sum to {block_total} bytes, its total_size says {total_size}"));
        }

        Ok(SnapSegment {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            pool,
            pool_id,
            is_expandable,
            driver_only,
            blocks: out_blocks,
        })
    }

    fn block(&self, v: &PV, at: Loc<'_>, owner: &Container, cursor: u64) -> Result<SnapBlock, SnapshotError> {
        let d = self.dict(v, at, owner)?;
        let [address, size, requested, state] = pick(d, ["address", "size", "requested_size", "state"]);
        let size = self.u64_req(size, Loc::Key(&at, "size"), d)?;
        // Blocks tile their segment; snapshots before PyTorch 2.1 leave the address implicit.
        let address = self.u64_opt(address, Loc::Key(&at, "address"), d)?.unwrap_or(cursor);
        let requested_size = self.u64_opt(requested, Loc::Key(&at, "requested_size"), d)?.unwrap_or(size);
        let state_at = Loc::Key(&at, "state");
        let state = match self.str_req(state, state_at, d)? {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" => BlockState::ActivePending,
            "inactive" => BlockState::Inactive,
            _ => {
                return Err(self.wrong(
                    state_at,
                    "\"active_allocated\", \"active_pending_free\" or \"inactive\"",
                    state.unwrap_or(&PV::None),
                    d,
                ))
            }
        };
        Ok(SnapBlock { address, size, requested_size, state })
    }

    fn trace(
        &self,
        v: &PV,
        device: i16,
        at: Loc<'_>,
        owner: &Container,
        taken: Streamed,
        warnings: &mut Vec<String>,
    ) -> Result<DeviceTrace, SnapshotError> {
        let list = self.list(v, at, owner)?;
        self.spend(list.len(), list)?;
        // the entries taken while decoding come first (they are a prefix of the list)
        let Streamed { mut entries, unknown: taken_unknown } = taken;
        let first = entries.len();
        entries.reserve_exact(list.items.len());
        let mut unknown: BTreeMap<String, usize> = taken_unknown;
        for (k, e) in list.items.iter().enumerate() {
            let e_at = Loc::Index(&at, first + k);
            let d = self.dict(e, e_at, list)?;
            let (entry, name) = self.entry(d, e_at)?;
            if let Some(name) = name {
                *unknown.entry(name.to_string()).or_insert(0) += 1;
            }
            entries.push(entry);
        }
        for (name, n) in unknown {
            warnings.push(format!("{at}: {n} entr{} with unknown action {name:?} (kept, no event)", if n == 1 { "y" } else { "ies" }));
        }
        Ok(DeviceTrace { device, entries })
    }

    /// One trace entry, and its action's name when gpufrag does not know it.
    fn entry<'d>(&self, d: &'d Container, e_at: Loc<'_>) -> Result<(TraceEntry, Option<&'d str>), SnapshotError> {
        let [action, addr, size, stream, time_us, device_free, frames, driver_only] =
            pick(d, ["action", "addr", "size", "stream", "time_us", "device_free", "frames", "gpufrag_driver_only"]);
        let name = self.str_req(action, Loc::Key(&e_at, "action"), d)?;
        let known = Action::from_name(name);
        let action = known.unwrap_or(Action::Unknown);
        let addr = if action.touches_memory() {
            self.u64_req(addr, Loc::Key(&e_at, "addr"), d)?
        } else {
            self.u64_opt(addr, Loc::Key(&e_at, "addr"), d)?.unwrap_or(0)
        };
        let size = if action.touches_memory() || action == Action::Oom {
            self.u64_req(size, Loc::Key(&e_at, "size"), d)?
        } else {
            self.u64_opt(size, Loc::Key(&e_at, "size"), d)?.unwrap_or(0)
        };
        let frames = match frames {
            None | Some(PV::None) => 0,
            Some(f) => match container(self.arena, f) {
                Some(c) if matches!(c.kind, Kind::List | Kind::Tuple) => u32::try_from(c.len()).unwrap_or(u32::MAX),
                _ => return Err(self.wrong(Loc::Key(&e_at, "frames"), "a list of frames", f, d)),
            },
        };
        let entry = TraceEntry {
            action,
            addr,
            size,
            stream: self.bits_opt(stream, Loc::Key(&e_at, "stream"), d)?,
            time_us: self.u64_opt(time_us, Loc::Key(&e_at, "time_us"), d)?.unwrap_or(0),
            device_free: self.u64_opt(device_free, Loc::Key(&e_at, "device_free"), d)?,
            frames,
            driver_only: self.bool_opt(driver_only, Loc::Key(&e_at, "gpufrag_driver_only"), d)?,
        };
        Ok((entry, known.is_none().then_some(name)))
    }
}
