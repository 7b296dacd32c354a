//! The record file: a replayable stream of wire events that `run --record`, `attach --record` and
//! `agent --record` write and `analyze`, `report`, `whatif` and `top --replay` read back to the
//! same figures.
//!
//! Layout (version 4): a 16-byte header (`GPUFRAG\x01`, `u32` version, `u32` record size = 80)
//! followed by entries, little-endian. An entry is one 80-byte [`Event`]; when its `text_len` is
//! not 0, [`text_records`] more 80-byte records follow it, holding its text zero-padded (a
//! setting's string, a library's path: what a fixed-size event cannot carry). A writer that stops
//! cleanly ends the file with a [`EventKind::RecordEnd`] entry whose `size` is the number of
//! entries before it; a file without one was cut (its writer was killed, or its disk filled) and
//! is never read as exact: [`End`] says which. Version 3 adds the facts a process states about
//! itself as events with text (allocator settings at start and each change, memory fraction,
//! framework identity and its OOM figures: `EventKind::AllocSettings` and after), so that a
//! replay sizes blocks as the live run did; version 2 files (the same layout, without those
//! events: replayed under PyTorch's default settings) and version 1 files (earlier builds: events
//! only, no text, no end marker, so their end cannot be told) are still read. Version 4 is
//! version 3's layout with one promise more: blocks synced from periodic snapshots of the
//! allocator carry `F_SRC_SNAPSHOT` (`crate::event::sampled_block`), so a block with a known size
//! and without it was announced one event per request (PyTorch's trace tracker, the annotation
//! header) and can drive a simulation; in older files any block with a known size may have been
//! synced ([`sized_blocks_may_be_sampled`]).
//!
//! [`Reader`] streams a file entry by entry in bounded memory, whatever its size; [`read`] and
//! [`parse`] collect a whole file for the callers that want it in memory. The writer flushes in
//! whole records, so a process killed mid-run leaves a readable prefix; the reader keeps every
//! whole entry and reports a partial tail with its offset instead of failing.

use crate::event::{text_records, Event, EventKind, EVENT_SIZE};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// First 8 bytes of every record file.
pub const MAGIC: &[u8; 8] = b"GPUFRAG\x01";
/// The format version this build writes.
pub const VERSION: u32 = 4;

/// Whether, in a file of format `version`, a block event with a known size may have been synced
/// from a periodic snapshot without saying so: before version 4 the Python hook's synced blocks
/// did not carry `F_SRC_SNAPSHOT`.
pub const fn sized_blocks_may_be_sampled(version: u32) -> bool {
    version < 4
}
/// The oldest format version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 16;

/// Why a record file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Reading failed part-way.
    #[error("{path}: reading at offset {offset}: {source}")]
    IoAt {
        /// The file.
        path: PathBuf,
        /// Where the read failed.
        offset: u64,
        /// The cause.
        source: io::Error,
    },
    /// The header is not a gpufrag record header.
    #[error("{path}: not a gpufrag record file (bad header at offset 0)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// A version or record size this build does not read.
    #[error("{path}: record format version {version} with {record_size}-byte records is not supported (this build reads versions {OLDEST_VERSION} to {VERSION}, {EVENT_SIZE}-byte records)")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// Its version.
        version: u32,
        /// Its record size.
        record_size: u32,
    },
}

/// Whether `head` starts like a record file.
pub fn is_record(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// One entry of a record file: an event and the text it carries, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The event (`text_len` is the length of `text`).
    pub event: Event,
    /// Its text; `None` when `text_len` is 0.
    pub text: Option<Box<[u8]>>,
}

impl Entry {
    /// The text as UTF-8 (invalid sequences replaced), `""` when there is none.
    pub fn text_lossy(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.text.as_deref().unwrap_or(&[]))
    }
}

/// How a record file ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Its writer's end marker, after as many entries as the marker says: the file is whole.
    Whole,
    /// No end marker: the entries stop at offset `at` (the writer was killed or its disk filled).
    Cut {
        /// Where the entries stop.
        at: u64,
    },
    /// An entry cut short at offset `at` (the writer stopped mid-write); it was left out.
    PartialEntry {
        /// Where the cut entry begins.
        at: u64,
    },
    /// An end marker at offset `at` that does not square with the file: it counts another
    /// number of entries than came before it, or bytes follow it (files spliced together).
    Inconsistent {
        /// The marker's offset.
        at: u64,
        /// Entries the marker says were written before it.
        said: u64,
        /// Entries read before it.
        read: u64,
        /// Bytes follow it (they are not read).
        bytes_follow: bool,
    },
    /// A version 1 file, which has no end marker: whether it was cut cannot be told.
    Unmarked,
}

impl End {
    /// Whether the file is known to hold everything its writer wrote.
    pub fn is_whole(&self) -> bool {
        matches!(self, End::Whole)
    }

    /// The sentence for the user when the file is not known to be whole (`path` names it).
    pub fn note(&self, path: &Path) -> Option<String> {
        let p = path.display();
        match *self {
            End::Whole => None,
            End::Cut { at } => Some(format!("{p}: cut at offset {at} (the writer stopped before its end marker): the figures are those of the moment it stopped, and not exact")),
            End::PartialEntry { at } => Some(format!("{p}: cut at offset {at} (the writer stopped mid-entry; that entry was left out): the figures are those of the moment it stopped, and not exact")),
            End::Inconsistent { at, said, read, bytes_follow } => Some(format!(
                "{p}: the end marker at offset {at} says {said} entries came before it and {read} did{}: the file is not what one writer wrote",
                if bytes_follow { ", and bytes follow it (not read)" } else { "" }
            )),
            End::Unmarked => Some(format!("{p}: a version 1 record, which carries no end marker: whether it was cut cannot be told, so it is not called exact")),
        }
    }
}

/// Streams the entries of a record file in bounded memory: each [`Iterator::next`] reads one
/// entry; once it returns `None`, [`Reader::end`] says how the file ended. A read error is
/// returned once, naming the file and the offset, and ends the iteration.
pub struct Reader<R: Read> {
    r: BufReader<R>,
    path: PathBuf,
    version: u32,
    offset: u64,
    entries: u64,
    end: Option<End>,
}

impl Reader<File> {
    /// Opens `path` and checks its header.
    pub fn open(path: &Path) -> Result<Reader<File>, RecordError> {
        let f = File::open(path).map_err(|source| RecordError::Io { path: path.to_path_buf(), source })?;
        Reader::new(path, f)
    }
}

impl<R: Read> Reader<R> {
    /// A reader of the record bytes `r` (`path` names them in errors); reads and checks the header.
    pub fn new(path: &Path, r: R) -> Result<Reader<R>, RecordError> {
        let mut r = BufReader::with_capacity(64 * 1024, r);
        let mut head = [0u8; HEADER_LEN];
        let n = read_full(&mut r, &mut head).map_err(|source| RecordError::Io { path: path.to_path_buf(), source })?;
        if n < HEADER_LEN || !is_record(&head) {
            return Err(RecordError::BadMagic { path: path.to_path_buf() });
        }
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        let record_size = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
        if !(OLDEST_VERSION..=VERSION).contains(&version) || record_size as usize != EVENT_SIZE {
            return Err(RecordError::Unsupported { path: path.to_path_buf(), version, record_size });
        }
        Ok(Reader { r, path: path.to_path_buf(), version, offset: HEADER_LEN as u64, entries: 0, end: None })
    }

    /// The file's format version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// How the file ended; `None` until the iteration has returned `None`.
    pub fn end(&self) -> Option<End> {
        self.end
    }

    /// The offset of the next entry.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn io_error(&mut self, source: io::Error) -> Option<Result<Entry, RecordError>> {
        self.end = Some(End::Cut { at: self.offset });
        Some(Err(RecordError::IoAt { path: self.path.clone(), offset: self.offset, source }))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Entry, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.end.is_some() {
            return None;
        }
        let at = self.offset;
        let mut b = [0u8; EVENT_SIZE];
        match read_full(&mut self.r, &mut b) {
            Err(e) => return self.io_error(e),
            Ok(0) => {
                self.end = Some(if self.version == 1 { End::Unmarked } else { End::Cut { at } });
                return None;
            }
            Ok(n) if n < EVENT_SIZE => {
                self.end = Some(End::PartialEntry { at });
                return None;
            }
            Ok(_) => {}
        }
        let mut event = Event::from_bytes(&b);
        if self.version == 1 {
            // Version 1 wrote padding there, always 0; nothing follows an event.
            event.text_len = 0;
        }
        let mut text = None;
        if event.text_len > 0 {
            let mut t = vec![0u8; text_records(event.text_len) * EVENT_SIZE];
            match read_full(&mut self.r, &mut t) {
                Err(e) => return self.io_error(e),
                Ok(n) if n < t.len() => {
                    self.end = Some(End::PartialEntry { at });
                    return None;
                }
                Ok(_) => {}
            }
            t.truncate(event.text_len as usize);
            text = Some(t.into_boxed_slice());
        }
        self.offset = at + ((1 + text_records(event.text_len)) * EVENT_SIZE) as u64;
        if self.version >= 2 && event.kind() == Some(EventKind::RecordEnd) {
            let mut one = [0u8; 1];
            let bytes_follow = matches!(read_full(&mut self.r, &mut one), Ok(1));
            self.end = Some(if event.size == self.entries && !bytes_follow {
                End::Whole
            } else {
                End::Inconsistent { at, said: event.size, read: self.entries, bytes_follow }
            });
            return None;
        }
        self.entries += 1;
        Some(Ok(Entry { event, text }))
    }
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The entries of a record file, and how it ended.
#[derive(Debug)]
pub struct Recording {
    /// Every whole entry's event.
    pub events: Vec<Event>,
    /// The texts, by index into `events`.
    pub texts: Vec<(usize, Box<[u8]>)>,
    /// How the file ended.
    pub end: End,
}

impl Recording {
    /// Offset of a trailing partial entry (the writer was killed mid-entry).
    pub fn partial_tail_at(&self) -> Option<u64> {
        match self.end {
            End::PartialEntry { at } => Some(at),
            _ => None,
        }
    }
}

/// Reads a whole record file into memory (streaming callers use [`Reader`]).
pub fn read(path: &Path) -> Result<Recording, RecordError> {
    collect(Reader::open(path)?)
}

/// Parses record-file bytes (`path` names them in errors).
pub fn parse(path: &Path, data: &[u8]) -> Result<Recording, RecordError> {
    collect(Reader::new(path, data)?)
}

fn collect<R: Read>(mut r: Reader<R>) -> Result<Recording, RecordError> {
    let mut events = Vec::new();
    let mut texts = Vec::new();
    for entry in r.by_ref() {
        let entry = entry?;
        if let Some(t) = entry.text {
            texts.push((events.len(), t));
        }
        events.push(entry.event);
    }
    Ok(Recording { events, texts, end: r.end().unwrap_or(End::Cut { at: r.offset() }) })
}

/// Writes entries to a record file. Errors of a file made by [`Writer::create`] name it.
/// [`Writer::finish`] writes the end marker; a writer dropped without it leaves a file that
/// reads as cut.
pub struct Writer<W: Write> {
    out: BufWriter<W>,
    written: u64,
    bytes: u64,
    path: Option<PathBuf>,
}

impl Writer<File> {
    /// Creates (truncates) `path`, readable by its owner only.
    pub fn create(path: &Path) -> io::Result<Writer<File>> {
        use std::os::unix::fs::OpenOptionsExt;
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(named)?;
        let mut w = Writer::new(f).map_err(named)?;
        w.path = Some(path.to_path_buf());
        Ok(w)
    }
}

impl<W: Write> Writer<W> {
    /// Starts a record stream on `w` (writes the header).
    pub fn new(w: W) -> io::Result<Writer<W>> {
        let mut out = BufWriter::with_capacity(EVENT_SIZE * 1024, w);
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&(EVENT_SIZE as u32).to_le_bytes())?;
        Ok(Writer { out, written: 0, bytes: HEADER_LEN as u64, path: None })
    }

    fn named(&self, e: io::Error) -> io::Error {
        match &self.path {
            Some(p) => io::Error::new(e.kind(), format!("{}: {e}", p.display())),
            None => e,
        }
    }

    /// Appends one event that carries no text (a `text_len` it has is cleared).
    pub fn write(&mut self, e: &Event) -> io::Result<()> {
        self.write_text(e, &[])
    }

    /// Appends one event and its text (at most `u16::MAX` bytes; longer text is cut there).
    pub fn write_text(&mut self, e: &Event, text: &[u8]) -> io::Result<()> {
        let text = &text[..text.len().min(u16::MAX as usize)];
        let e = Event { text_len: text.len() as u16, ..*e };
        self.out.write_all(&e.to_bytes()).map_err(|err| self.named(err))?;
        if !text.is_empty() {
            let pad = text_records(e.text_len) * EVENT_SIZE - text.len();
            self.out.write_all(text).map_err(|err| self.named(err))?;
            self.out.write_all(&[0u8; EVENT_SIZE][..pad]).map_err(|err| self.named(err))?;
        }
        self.written += 1;
        self.bytes += entry_bytes(text.len());
        Ok(())
    }

    /// Entries written so far (some may still sit in the buffer: see [`Writer::flush`]).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes the file holds once flushed (header and entries).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Pushes buffered records to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush().map_err(|e| self.named(e))
    }

    /// Writes the end marker (stamped `ts_ns`), flushes and returns the inner writer.
    pub fn finish_at(mut self, ts_ns: u64) -> io::Result<W> {
        let end = Event { ts_ns, size: self.written, ..Event::new(EventKind::RecordEnd, 0, -1) };
        self.out.write_all(&end.to_bytes()).map_err(|e| self.named(e))?;
        let path = self.path.clone();
        self.out.into_inner().map_err(|e| {
            let e = e.into_error();
            match path {
                Some(p) => io::Error::new(e.kind(), format!("{}: {e}", p.display())),
                None => e,
            }
        })
    }

    /// [`Writer::finish_at`] stamped 0 (tests, and files with no clock of their own).
    pub fn finish(self) -> io::Result<W> {
        self.finish_at(0)
    }
}

/// The bytes an entry with `text_len` bytes of text takes in a file.
pub fn entry_bytes(text_len: usize) -> u64 {
    ((1 + (text_len.min(u16::MAX as usize)).div_ceil(EVENT_SIZE)) * EVENT_SIZE) as u64
}

/// A record file with an optional size cap (`agent --record-max-bytes`): when the next entry
/// would take the file past the cap, the file gets its end marker and is renamed to `PATH.1`
/// (replacing the part kept before), and a fresh `PATH` starts, so at most twice the cap is on
/// disk. Each part is a whole record file. The live pipeline rotates through [`Rotating::rotate`]
/// with the state at that moment as events ([`crate::ingest::State::seed_events`]), which begin
/// the new part, so that every part replays exactly on its own; a part rotated by
/// [`Rotating::write_text`] alone (no state at hand) starts mid-stream, and a replay of it meets
/// frees of allocations it never saw (counted as anomalies, the figures then marked inexact).
pub struct Rotating {
    path: PathBuf,
    max_bytes: Option<u64>,
    w: Option<Writer<File>>,
    /// Rotations so far.
    pub rotations: u64,
    /// Entries the current part began with (its seed): a part holding only them is not rotated
    /// again, whatever the cap.
    seeded: u64,
    /// The seed's entries (events), as a reader counts them.
    seed_len: usize,
}

impl Rotating {
    /// Creates `path`; with `max_bytes`, rotates as above (a cap below one header, one entry and
    /// the end marker is raised to that).
    pub fn create(path: &Path, max_bytes: Option<u64>) -> io::Result<Rotating> {
        let max_bytes = max_bytes.map(|m| m.max((HEADER_LEN + 2 * EVENT_SIZE) as u64));
        Ok(Rotating { path: path.to_path_buf(), max_bytes, w: Some(Writer::create(path)?), rotations: 0, seeded: 0, seed_len: 0 })
    }

    /// The part kept before the current one.
    pub fn previous_part(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".1");
        PathBuf::from(p)
    }

    fn writer(&mut self) -> io::Result<&mut Writer<File>> {
        let path = &self.path;
        self.w.as_mut().ok_or_else(|| io::Error::other(format!("{}: the record file is already closed", path.display())))
    }

    /// Appends one event, rotating first when it would not fit.
    pub fn write(&mut self, e: &Event) -> io::Result<()> {
        self.write_text(e, &[])
    }

    /// Entries (events, each with its text) the current part began with (its seed, the state at
    /// its start).
    pub fn seed_entries(&self) -> usize {
        self.seed_len
    }

    /// Whether an entry with `text_len` bytes of text would rotate the file first: it and, after
    /// it, the end marker would not fit under the cap in a part holding more than its seed.
    pub fn rotates_before(&self, text_len: usize) -> bool {
        match (self.max_bytes, self.w.as_ref()) {
            (Some(max), Some(w)) => w.written() > self.seeded && w.bytes() + entry_bytes(text_len) + EVENT_SIZE as u64 > max,
            _ => false,
        }
    }

    /// Ends the current part (its end marker stamped `ts_ns`), keeps it as `PATH.1`, and starts a
    /// fresh `PATH` with `seed` (the state at this moment as events) as its first entries.
    pub fn rotate(&mut self, ts_ns: u64, seed: &[(Event, Vec<u8>)]) -> io::Result<()> {
        let full = self.w.take().ok_or_else(|| io::Error::other("the record file is already closed"))?;
        full.finish_at(ts_ns)?;
        let previous = Self::previous_part(&self.path);
        std::fs::rename(&self.path, &previous)
            .map_err(|e| io::Error::new(e.kind(), format!("rotating {} to {}: {e}", self.path.display(), previous.display())))?;
        let mut w = Writer::create(&self.path)?;
        for (e, text) in seed {
            w.write_text(e, text)?;
        }
        self.seeded = w.written();
        self.seed_len = seed.len();
        self.w = Some(w);
        self.rotations += 1;
        Ok(())
    }

    /// Appends one event and its text, rotating first (without a seed) when they would not fit.
    pub fn write_text(&mut self, e: &Event, text: &[u8]) -> io::Result<()> {
        if self.rotates_before(text.len()) {
            self.rotate(e.ts_ns, &[])?;
        }
        self.writer()?.write_text(e, text)
    }

    /// Pushes buffered records to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        match self.w.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }

    /// Ends the current part with its end marker (stamped `ts_ns`); later writes fail.
    pub fn finish_at(&mut self, ts_ns: u64) -> io::Result<()> {
        match self.w.take() {
            Some(w) => w.finish_at(ts_ns).map(drop),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    #[test]
    fn a_capped_record_rotates_into_two_whole_parts() {
        let dir = std::env::temp_dir().join(format!("gpufrag-rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.rec");
        // Ten records a part: nine entries and the end marker.
        let cap = (HEADER_LEN + 10 * EVENT_SIZE) as u64;
        let mut w = Rotating::create(&path, Some(cap)).unwrap();
        for i in 0..25u64 {
            w.write(&Event { addr: i, ..Event::new(EventKind::MemFree, 1, 0) }).unwrap();
        }
        w.finish_at(1).unwrap();
        assert_eq!(w.rotations, 2);
        let now = read(&path).unwrap();
        let before = read(&Rotating::previous_part(&path)).unwrap();
        assert_eq!(now.events.iter().map(|e| e.addr).collect::<Vec<_>>(), (18..25).collect::<Vec<_>>());
        assert_eq!(before.events.iter().map(|e| e.addr).collect::<Vec<_>>(), (9..18).collect::<Vec<_>>());
        assert_eq!((now.end, before.end), (End::Whole, End::Whole), "each part ends with its marker");
        assert!(w.write(&Event::new(EventKind::MemFree, 1, 0)).is_err(), "a finished record takes no more");
        for p in [&path, &Rotating::previous_part(&path)] {
            assert!(std::fs::metadata(p).unwrap().len() <= cap);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn round_trip_and_partial_tail() {
        let mut w = Writer::new(Vec::new()).unwrap();
        let mut e = Event::new(EventKind::MemAlloc, 7, 0);
        e.addr = 0x7f00_0000_0000;
        e.size = 1 << 21;
        w.write(&e).unwrap();
        w.write(&Event::new(EventKind::MemFree, 7, 0)).unwrap();
        let whole = w.finish().unwrap();
        let r = parse(Path::new("x"), &whole).unwrap();
        assert_eq!(r.events.len(), 2);
        assert_eq!(r.events[0], e);
        assert_eq!(r.end, End::Whole);
        // Killed before the marker, on an entry boundary: cut, never whole.
        let mut bytes = whole[..whole.len() - EVENT_SIZE].to_vec();
        let r = parse(Path::new("x"), &bytes).unwrap();
        assert_eq!((r.events.len(), r.end), (2, End::Cut { at: (HEADER_LEN + 2 * EVENT_SIZE) as u64 }));
        bytes.extend_from_slice(&[1, 2, 3]);
        let r = parse(Path::new("x"), &bytes).unwrap();
        assert_eq!(r.events.len(), 2);
        assert_eq!(r.partial_tail_at(), Some((HEADER_LEN + 2 * EVENT_SIZE) as u64));
        assert!(
            r.end.note(Path::new("x.rec")).is_some_and(|n| n.starts_with("x.rec: cut at offset 176")),
            "{:?}",
            r.end.note(Path::new("x.rec"))
        );
    }

    #[test]
    fn text_travels_after_its_event_and_is_padded_to_whole_records() {
        let mut w = Writer::new(Vec::new()).unwrap();
        let conf = b"roundup_power2_divisions:2,max_split_size_mb:128 and more than eighty bytes of text in one setting";
        w.write_text(&Event::new(EventKind::ProcessExec, 3, -1), conf).unwrap();
        w.write(&Event { text_len: 9, ..Event::new(EventKind::MemFree, 3, 0) }).unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len(), HEADER_LEN + (1 + 2 + 1 + 1) * EVENT_SIZE, "event, two text records, event, marker");
        let entries: Vec<Entry> = Reader::new(Path::new("t"), &bytes[..]).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].text.as_deref(), Some(&conf[..]));
        assert_eq!(entries[0].event.text_len as usize, conf.len());
        assert_eq!((entries[1].event.text_len, entries[1].text.as_deref()), (0, None), "write() carries no text");
        // Cut inside the text: the entry is left out, and the cut names its offset.
        let r = parse(Path::new("t"), &bytes[..HEADER_LEN + 2 * EVENT_SIZE]).unwrap();
        assert_eq!((r.events.len(), r.end), (0, End::PartialEntry { at: HEADER_LEN as u64 }));
    }

    #[test]
    fn version_1_files_still_read_with_their_end_unknown() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&80u32.to_le_bytes());
        // Version 1 had padding where text_len is: whatever is there, no text follows.
        bytes.extend_from_slice(&Event { text_len: 5, ..Event::new(EventKind::MemAlloc, 1, 0) }.to_bytes());
        bytes.extend_from_slice(&Event::new(EventKind::MemFree, 1, 0).to_bytes());
        let r = parse(Path::new("v1"), &bytes).unwrap();
        assert_eq!(r.events.len(), 2);
        assert_eq!(r.events[0].text_len, 0);
        assert_eq!(r.end, End::Unmarked);
        assert!(!r.end.is_whole());
    }

    #[test]
    fn an_end_marker_that_does_not_square_with_the_file_is_said() {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.write(&Event::new(EventKind::MemFree, 1, 0)).unwrap();
        let mut bytes = w.finish().unwrap();
        let marker_at = bytes.len() - EVENT_SIZE;
        bytes.extend_from_slice(&Event::new(EventKind::MemFree, 1, 0).to_bytes());
        let r = parse(Path::new("s"), &bytes).unwrap();
        assert_eq!(r.end, End::Inconsistent { at: marker_at as u64, said: 1, read: 1, bytes_follow: true });
        assert_eq!(r.events.len(), 1, "nothing after the marker is read");
    }

    /// Issue 14: on a full disk the record stopped mid-way and the error named no path.
    #[test]
    fn regression_a_full_disk_is_an_error_naming_the_record_file() {
        use std::os::unix::fs::FileTypeExt;
        let full = Path::new("/dev/full");
        assert!(std::fs::metadata(full).is_ok_and(|m| m.file_type().is_char_device()), "/dev/full is the kernel's full device");
        let mut w = Writer::create(full).expect("/dev/full opens");
        let mut failed = None;
        for _ in 0..2000 {
            if let Err(e) = w.write(&Event::new(EventKind::MemAlloc, 1, 0)) {
                failed = Some(e);
                break;
            }
        }
        let e = failed.or_else(|| w.flush().err()).expect("no space left");
        assert!(e.to_string().starts_with("/dev/full: "), "{e}");
    }

    #[test]
    fn bad_headers_name_the_file() {
        let e = parse(Path::new("/tmp/f.rec"), b"not a record file").unwrap_err();
        assert_eq!(e.to_string(), "/tmp/f.rec: not a gpufrag record file (bad header at offset 0)");
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&(VERSION + 1).to_le_bytes());
        h.extend_from_slice(&80u32.to_le_bytes());
        assert!(parse(Path::new("f"), &h).unwrap_err().to_string().contains(&format!("version {}", VERSION + 1)));
        // Version 2 (text and end marker, before the facts' kinds) still reads.
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&2u32.to_le_bytes());
        h.extend_from_slice(&80u32.to_le_bytes());
        assert_eq!(parse(Path::new("f"), &h).expect("version 2").end, End::Cut { at: HEADER_LEN as u64 });
    }
}
