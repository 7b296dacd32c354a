//! The record file: a replayable stream of wire events that `run --record` and `attach --record`
//! write and `analyze` reads back to the same figures.
//!
//! Layout: a 16-byte header (`GPUFRAG\x01`, `u32` version, `u32` record size = 80) followed by
//! 80-byte [`Event`] records, little-endian. The writer flushes in whole records, so a process
//! killed mid-run leaves a readable prefix; the reader keeps every whole record and reports a
//! partial tail with its offset instead of failing.

use crate::event::{Event, EVENT_SIZE};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// First 8 bytes of every record file.
pub const MAGIC: &[u8; 8] = b"GPUFRAG\x01";
/// Format version.
pub const VERSION: u32 = 1;
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
    /// The header is not a gpufrag record header.
    #[error("{path}: not a gpufrag record file (bad header at offset 0)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// A version or record size this build does not read.
    #[error("{path}: record format version {version} with {record_size}-byte records is not supported (this build reads version {VERSION}, {EVENT_SIZE}-byte records)")]
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

/// The events of a record file, and where a partial tail began if there was one.
#[derive(Debug)]
pub struct Recording {
    /// Every whole record.
    pub events: Vec<Event>,
    /// Offset of a trailing partial record (the writer was killed mid-record).
    pub partial_tail_at: Option<u64>,
}

/// Reads a whole record file.
pub fn read(path: &Path) -> Result<Recording, RecordError> {
    let io = |source| RecordError::Io { path: path.to_path_buf(), source };
    let mut data = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut data)).map_err(io)?;
    parse(path, &data)
}

/// Parses record-file bytes (`path` names them in errors).
pub fn parse(path: &Path, data: &[u8]) -> Result<Recording, RecordError> {
    if data.len() < HEADER_LEN || !is_record(data) {
        return Err(RecordError::BadMagic { path: path.to_path_buf() });
    }
    let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    let record_size = u32::from_le_bytes([data[12], data[13], data[14], data[15]]);
    if version != VERSION || record_size as usize != EVENT_SIZE {
        return Err(RecordError::Unsupported { path: path.to_path_buf(), version, record_size });
    }
    let body = &data[HEADER_LEN..];
    let chunks = body.chunks_exact(EVENT_SIZE);
    let partial_tail_at = (!chunks.remainder().is_empty()).then(|| (HEADER_LEN + body.len() / EVENT_SIZE * EVENT_SIZE) as u64);
    let events = chunks
        .map(|c| {
            let mut b = [0u8; EVENT_SIZE];
            b.copy_from_slice(c);
            Event::from_bytes(&b)
        })
        .collect();
    Ok(Recording { events, partial_tail_at })
}

/// Writes events to a record file. Errors of a file made by [`Writer::create`] name it.
pub struct Writer<W: Write> {
    out: BufWriter<W>,
    written: u64,
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
        Ok(Writer { out, written: 0, path: None })
    }

    fn named(&self, e: io::Error) -> io::Error {
        match &self.path {
            Some(p) => io::Error::new(e.kind(), format!("{}: {e}", p.display())),
            None => e,
        }
    }

    /// Appends one event.
    pub fn write(&mut self, e: &Event) -> io::Result<()> {
        self.out.write_all(&e.to_bytes()).map_err(|e| self.named(e))?;
        self.written += 1;
        Ok(())
    }

    /// Events written so far (some may still sit in the buffer: see [`Writer::flush`]).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Pushes buffered records to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush().map_err(|e| self.named(e))
    }

    /// Flushes and returns the inner writer.
    pub fn finish(self) -> io::Result<W> {
        let path = self.path.clone();
        self.out.into_inner().map_err(|e| {
            let e = e.into_error();
            match path {
                Some(p) => io::Error::new(e.kind(), format!("{}: {e}", p.display())),
                None => e,
            }
        })
    }
}

/// A record file with an optional size cap (`agent --record-max-bytes`): when the next event
/// would take the file past the cap, it is renamed to `PATH.1` (replacing the part kept before)
/// and a fresh `PATH` starts, so at most twice the cap is on disk. Each part is a whole record
/// file; a part after the first starts mid-stream, so a replay of it alone meets frees of
/// allocations it never saw (counted as anomalies, the figures then marked inexact).
pub struct Rotating {
    path: PathBuf,
    max_bytes: Option<u64>,
    w: Writer<File>,
    /// Rotations so far.
    pub rotations: u64,
}

impl Rotating {
    /// Creates `path`; with `max_bytes`, rotates as above (a cap below one header and one record
    /// is raised to that).
    pub fn create(path: &Path, max_bytes: Option<u64>) -> io::Result<Rotating> {
        let max_bytes = max_bytes.map(|m| m.max((HEADER_LEN + EVENT_SIZE) as u64));
        Ok(Rotating { path: path.to_path_buf(), max_bytes, w: Writer::create(path)?, rotations: 0 })
    }

    /// The part kept before the current one.
    pub fn previous_part(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".1");
        PathBuf::from(p)
    }

    /// Appends one event, rotating first when it would not fit.
    pub fn write(&mut self, e: &Event) -> io::Result<()> {
        if let Some(max) = self.max_bytes {
            if HEADER_LEN as u64 + (self.w.written() + 1) * EVENT_SIZE as u64 > max {
                self.w.flush()?;
                let previous = Self::previous_part(&self.path);
                std::fs::rename(&self.path, &previous)
                    .map_err(|e| io::Error::new(e.kind(), format!("rotating {} to {}: {e}", self.path.display(), previous.display())))?;
                self.w = Writer::create(&self.path)?;
                self.rotations += 1;
            }
        }
        self.w.write(e)
    }

    /// Pushes buffered records to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
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
        let cap = (HEADER_LEN + 10 * EVENT_SIZE) as u64;
        let mut w = Rotating::create(&path, Some(cap)).unwrap();
        for i in 0..25u64 {
            w.write(&Event { addr: i, ..Event::new(EventKind::MemFree, 1, 0) }).unwrap();
        }
        w.flush().unwrap();
        assert_eq!(w.rotations, 2);
        let now = read(&path).unwrap();
        let before = read(&Rotating::previous_part(&path)).unwrap();
        assert_eq!(now.events.iter().map(|e| e.addr).collect::<Vec<_>>(), (20..25).collect::<Vec<_>>());
        assert_eq!(before.events.iter().map(|e| e.addr).collect::<Vec<_>>(), (10..20).collect::<Vec<_>>());
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
        let mut bytes = w.finish().unwrap();
        let r = parse(Path::new("x"), &bytes).unwrap();
        assert_eq!(r.events.len(), 2);
        assert_eq!(r.events[0], e);
        assert_eq!(r.partial_tail_at, None);
        bytes.extend_from_slice(&[1, 2, 3]);
        let r = parse(Path::new("x"), &bytes).unwrap();
        assert_eq!(r.events.len(), 2);
        assert_eq!(r.partial_tail_at, Some((HEADER_LEN + 2 * EVENT_SIZE) as u64));
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
        h.extend_from_slice(&2u32.to_le_bytes());
        h.extend_from_slice(&80u32.to_le_bytes());
        assert!(parse(Path::new("f"), &h).unwrap_err().to_string().contains("version 2"));
    }
}
