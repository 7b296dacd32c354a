//! What can go wrong loading a snapshot file, as one error type.
//!
//! [`SnapshotError`] always names the file; it carries a byte offset where the layer that failed
//! knows one (the pickle decoder counts bytes of the pickle stream, the gzip decoder bytes of the
//! compressed file), and a [`SnapshotErrorKind`] that says what is wrong. Its `Display` is one line,
//! meant to be printed as is.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A snapshot file could not be loaded: which file, where in it (when known), and why.
#[derive(Debug, thiserror::Error)]
pub struct SnapshotError {
    path: PathBuf,
    offset: Option<u64>,
    offset_in: OffsetIn,
    kind: SnapshotErrorKind,
}

/// Which byte stream an offset counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OffsetIn {
    /// The file as stored.
    File,
    /// The pickle after gunzip.
    Decompressed,
}

/// Why a snapshot could not be loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotErrorKind {
    /// The file does not exist.
    NotFound,
    /// The file exists but could not be read.
    Io(io::Error),
    /// The file (or the gzip member) holds no bytes at all.
    Empty,
    /// The gzip stream ends early.
    TruncatedGzip,
    /// The gzip stream is damaged (bad header, bad deflate data, checksum mismatch).
    CorruptGzip(String),
    /// The pickle stream ends before its STOP opcode.
    TruncatedPickle,
    /// The bytes are not a valid pickle (unknown opcode, stack underflow, trailing bytes, ...).
    Pickle(String),
    /// A valid pickle, but not a PyTorch memory snapshot (say, a list, or a dict without
    /// `segments` / `device_traces`).
    NotASnapshot(String),
    /// A required field is absent.
    MissingField {
        /// Where, as a path such as `device_traces[0][12].addr`.
        field: String,
    },
    /// A field holds a value of the wrong type or out of range.
    WrongType {
        /// Where, as a path such as `segments[3].blocks[1].size`.
        field: String,
        /// What the field should hold.
        expected: &'static str,
        /// What it holds, abbreviated.
        found: String,
    },
    /// The gzip stream inflates to more than the limit ([`super::inflate_limit`]).
    InflateLimit {
        /// The limit in bytes.
        limit: u64,
    },
    /// The pickle's containers, shared through its memo, expand to more segments, blocks and
    /// trace entries than its size can hold honestly (each takes at least 16 bytes of pickle).
    Expansion {
        /// The cap that was reached.
        elements: u64,
        /// Bytes of pickle.
        bytes: u64,
    },
    /// The decoder itself failed (a bug in it, caught before it reached the caller).
    Internal(String),
}

impl fmt::Display for SnapshotErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotErrorKind::NotFound => f.write_str("file not found"),
            SnapshotErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            SnapshotErrorKind::Empty => f.write_str("empty file, expected a pickled memory snapshot"),
            SnapshotErrorKind::TruncatedGzip => f.write_str("truncated gzip: the compressed stream ends early"),
            SnapshotErrorKind::CorruptGzip(m) => write!(f, "corrupt gzip: {m}"),
            SnapshotErrorKind::TruncatedPickle => {
                f.write_str("truncated pickle: the data ends before the pickle's STOP opcode")
            }
            SnapshotErrorKind::Pickle(m) => write!(f, "not a valid pickle: {m}"),
            SnapshotErrorKind::NotASnapshot(m) => write!(f, "not a PyTorch memory snapshot: {m}"),
            SnapshotErrorKind::MissingField { field } => write!(f, "field `{field}` is missing"),
            SnapshotErrorKind::WrongType { field, expected, found } => {
                write!(f, "field `{field}`: expected {expected}, found {found}")
            }
            SnapshotErrorKind::InflateLimit { limit } => write!(
                f,
                "the gzip stream inflates to more than {limit} bytes; refused (raise the limit with --max-inflated-bytes or GPUFRAG_MAX_INFLATED_BYTES)"
            ),
            SnapshotErrorKind::Expansion { elements, bytes } => write!(
                f,
                "shared (memoized) containers expand to more than {elements} segments, blocks and trace entries from {bytes} bytes of pickle; refused"
            ),
            SnapshotErrorKind::Internal(m) => write!(f, "internal decoder error: {m}"),
        }
    }
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.kind)?;
        if let Some(off) = self.offset {
            match self.offset_in {
                OffsetIn::File => write!(f, " (at byte {off})")?,
                OffsetIn::Decompressed => write!(f, " (at byte {off} of the decompressed pickle)")?,
            }
        }
        Ok(())
    }
}

impl SnapshotError {
    pub(crate) fn new(path: &Path, kind: SnapshotErrorKind) -> SnapshotError {
        SnapshotError { path: path.to_path_buf(), offset: None, offset_in: OffsetIn::File, kind }
    }

    pub(crate) fn at(path: &Path, kind: SnapshotErrorKind, offset: u64, offset_in: OffsetIn) -> SnapshotError {
        SnapshotError { path: path.to_path_buf(), offset: Some(offset), offset_in, kind }
    }

    /// The file that failed to load.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The byte offset of the failure when the decoder knows it: in the file as stored, or, for a
    /// gzip file's pickle, in the decompressed stream ([`SnapshotError::offset_is_decompressed`]).
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }

    /// True when [`SnapshotError::offset`] counts bytes of the decompressed pickle, not of the file.
    pub fn offset_is_decompressed(&self) -> bool {
        self.offset_in == OffsetIn::Decompressed
    }

    /// What went wrong.
    pub fn kind(&self) -> &SnapshotErrorKind {
        &self.kind
    }
}
