//! The one opener of an input file (`analyze`, `report`, `whatif`, `top --replay`): the file is
//! opened once, its first bytes are read once to tell what it holds, and it is decoded once; all
//! that the command computes from it afterwards (the replayed state, the computed fix's request
//! stream, the report's timeline) is taken from the [`Opened`] input, never from the path again.
//!
//! What an input holds ([`Body`]):
//! - a gpufrag record: the open file itself ([`Bytes`]), read from its start with `pread` at each
//!   pass, entry by entry in bounded memory whatever its size (the replay is one pass; the
//!   simulator's request stream, `crate::sim::stream_of`, makes its own passes over the same open
//!   file; none opens it or sniffs it again);
//! - a PyTorch snapshot: decoded once (a plain pickle from a map of the open file, its pages given
//!   back as the decoder passes them, `crate::snapshot::from_file`), and the decoded [`Snapshot`]
//!   kept for the replay and for the simulator;
//! - a summary JSON (`report` reads one back), only where the caller accepts one.
//!
//! Pipes. A regular file is used in place. A FIFO or a pipe (`/dev/stdin` under `cat f |`) can be
//! read only once, so it is read whole into memory first, under the memory budget
//! ([`crate::budget`]: the buffer is charged each time it grows; past the budget, a one-line error
//! naming the file and the flag), and it never blocks for ever: the open does not wait for a
//! writer (`O_NONBLOCK`), and each wait for more bytes is bounded by [`PIPE_SILENCE`]: a FIFO that
//! no writer opens, or a writer that sends nothing for that long, is an error naming the file.
//! Sockets, devices and directories are refused at once.

use super::UnusableInput;
use crate::record;
use crate::snapshot::{self, Snapshot};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest a pipe given as input may stay silent (no writer yet, or no bytes) before the
/// command gives up on it with an error naming it.
pub const PIPE_SILENCE: Duration = Duration::from_secs(10);

/// What a command accepts besides traces (snapshots and records).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    /// Traces only (`analyze`, `whatif`, `top --replay`).
    Traces,
    /// Traces, or a summary JSON that `analyze --json` wrote (`report`).
    TracesOrSummary,
}

/// An input file, opened once and told apart by its first bytes.
pub struct Opened {
    /// The file as it was named (errors name it).
    pub path: PathBuf,
    /// What it holds.
    pub body: Body,
}

/// What an [`Opened`] input holds.
pub enum Body {
    /// A gpufrag record file: its bytes, read entry by entry ([`Bytes::records`]).
    Record(Bytes),
    /// A PyTorch memory snapshot, decoded.
    Snapshot(Box<Snapshot>),
    /// A summary JSON's text (only with [`Accept::TracesOrSummary`]).
    Summary(String),
}

/// The bytes of an input that is read more than once: the open regular file, or what a pipe
/// sent, held in memory.
pub enum Bytes {
    /// A regular file, read at an offset (`pread`: its own offset never moves).
    File(File),
    /// What a pipe sent.
    Held(Vec<u8>),
}

/// A reader of [`Bytes`] from their start.
pub enum BytesReader<'a> {
    /// At an offset of the open file.
    File(&'a File, u64),
    /// What is left of the held bytes.
    Held(&'a [u8]),
}

impl Read for BytesReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            BytesReader::File(f, at) => {
                let n = f.read_at(buf, *at)?;
                *at += n as u64;
                Ok(n)
            }
            BytesReader::Held(rest) => rest.read(buf),
        }
    }
}

impl Bytes {
    /// A reader from the first byte.
    pub fn reader(&self) -> BytesReader<'_> {
        match self {
            Bytes::File(f) => BytesReader::File(f, 0),
            Bytes::Held(v) => BytesReader::Held(v),
        }
    }

    /// The record's entries from its start, streamed (`path` names the file in errors).
    pub fn records(&self, path: &Path) -> Result<record::Reader<BytesReader<'_>>, record::RecordError> {
        record::Reader::new(path, self.reader())
    }
}

impl Opened {
    /// The kind of trace it is; `None` for a summary JSON.
    pub fn kind(&self) -> Option<super::InputKind> {
        match self.body {
            Body::Record(_) => Some(super::InputKind::Record),
            Body::Snapshot(_) => Some(super::InputKind::Snapshot),
            Body::Summary(_) => None,
        }
    }
}

/// Opens `path` once, tells what it holds by its first bytes, and decodes a snapshot; a record is
/// left to be streamed from the open file. Errors are [`UnusableInput`]s naming the file.
pub fn open(path: &Path, accept: Accept) -> Result<Opened, UnusableInput> {
    let (file, pipe) = open_input(path)?;
    let body = if pipe {
        let bytes = read_pipe(&file, path)?;
        drop(file);
        body_of_held(bytes, path, accept)?
    } else {
        body_of_file(file, path, accept)?
    };
    Ok(Opened { path: path.to_path_buf(), body })
}

/// Whether bytes starting with `head` are a summary JSON (the first non-blank byte is `{`).
fn looks_like_summary(head: &[u8]) -> bool {
    head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

fn body_of_file(file: File, path: &Path, accept: Accept) -> Result<Body, UnusableInput> {
    let io = |e: std::io::Error| UnusableInput(format!("{}: {e}", path.display()));
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if record::is_record(&head[..n]) {
        return Ok(Body::Record(Bytes::File(file)));
    }
    if accept == Accept::TracesOrSummary && looks_like_summary(&head[..n]) {
        let mut text = String::new();
        BytesReader::File(&file, 0).read_to_string(&mut text).map_err(io)?;
        return Ok(Body::Summary(text));
    }
    let snap = snapshot::from_file(&file, path).map_err(|e| UnusableInput(e.to_string()))?;
    Ok(Body::Snapshot(Box::new(snap)))
}

fn body_of_held(bytes: Vec<u8>, path: &Path, accept: Accept) -> Result<Body, UnusableInput> {
    if record::is_record(&bytes) {
        return Ok(Body::Record(Bytes::Held(bytes)));
    }
    if accept == Accept::TracesOrSummary && looks_like_summary(&bytes[..bytes.len().min(64)]) {
        let text = String::from_utf8(bytes).map_err(|e| UnusableInput(format!("{}: not UTF-8 text: {e}", path.display())))?;
        return Ok(Body::Summary(text));
    }
    let snap = snapshot::from_bytes(&bytes, path).map_err(|e| UnusableInput(e.to_string()))?;
    Ok(Body::Snapshot(Box::new(snap)))
}

/// Opens an input file without ever blocking (`O_NONBLOCK`, which a FIFO without a writer would
/// otherwise wait on for ever: issue 23): a regular file (the flag cleared) or a pipe (`true`,
/// the flag kept: [`read_pipe`] waits on it with a bound). Sockets, devices and directories are
/// refused.
fn open_input(path: &Path) -> Result<(File, bool), UnusableInput> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| UnusableInput(format!("{}: {e}", path.display())))?;
    let ft = f.metadata().map_err(|e| UnusableInput(format!("{}: {e}", path.display())))?.file_type();
    if ft.is_fifo() {
        return Ok((f, true));
    }
    if !ft.is_file() {
        let what = if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(UnusableInput(format!(
            "{}: {what}; gpufrag reads regular files and pipes only (copy it to a file first)",
            path.display()
        )));
    }
    // SAFETY: fcntl on a descriptor we own, clearing one status flag.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    Ok((f, false))
}

/// Reads a pipe (opened non-blocking) to its end into memory, charging the buffer to the memory
/// budget as it grows; each wait for bytes is bounded by [`PIPE_SILENCE`].
fn read_pipe(file: &File, path: &Path) -> Result<Vec<u8>, UnusableInput> {
    let mut bytes: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let mut pfd = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let wait_ms = i32::try_from(PIPE_SILENCE.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: poll on one pollfd we own, for at most `wait_ms`.
        let ready = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(UnusableInput(format!("{}: {e}", path.display())));
        }
        if ready == 0 {
            return Err(UnusableInput(format!(
                "{}: a pipe that sent nothing for {} s ({}); gpufrag reads a pipe to its end, then uses it",
                path.display(),
                PIPE_SILENCE.as_secs(),
                if bytes.is_empty() {
                    "no writer opened it, or its writer sent nothing".to_string()
                } else {
                    format!("after {} bytes", bytes.len())
                }
            )));
        }
        let n = match (&*file).read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => continue,
            Err(e) => return Err(UnusableInput(format!("{}: reading at offset {}: {e}", path.display(), bytes.len()))),
        };
        if bytes.len() + n > bytes.capacity() {
            let grown = (bytes.capacity() * 2).max(bytes.len() + n).max(1 << 20);
            let held = (bytes.capacity() + grown) as u64;
            crate::budget::charge(path, || format!("the {} bytes read from the pipe", crate::units::thousands(bytes.len() as u64)), held)
                .map_err(|e| UnusableInput(e.to_string()))?;
            bytes.reserve_exact(grown - bytes.len());
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
}
