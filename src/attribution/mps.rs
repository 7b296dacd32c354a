//! The MPS control daemon's default pinned memory limit (issue 25, Build item 2): a client whose
//! environment sets no `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` gets the daemon's default
//! (`set_default_device_pinned_mem_limit`), which only the daemon knows. Where the process's
//! environment names no limit and an MPS daemon serves its pipe folder
//! (`CUDA_MPS_PIPE_DIRECTORY`, default [`DEFAULT_PIPE_DIR`], with the daemon's `control` pipe in
//! it), the default is asked of the daemon through its documented client,
//! `nvidia-cuda-mps-control`, one `get_default_device_pinned_mem_limit <dev>` line per device on
//! its standard input.
//!
//! Trust: the pipe folder must be root's or this user's and writable by nobody else, and the
//! client a root-owned file, writable by nobody else, in a root-owned system folder
//! ([`SYSTEM_DIRS`]; `GPUFRAG_MPS_CONTROL_DIRS`, a `:`-separated list read from gpufrag's own
//! environment, adds folders under the same rules: simcuda's stand-in client is found so in the
//! tests), all checked by `crate::private::trusted`. The client runs with an empty environment
//! but `CUDA_MPS_PIPE_DIRECTORY` and `PATH=/usr/bin:/bin`, in a process group of its own that
//! is killed after [`TIMEOUT`]; at most [`MAX_OUTPUT`] bytes of its output are read. A client
//! that hangs, fails or prints what is no size is a counted note and no limit; an answer of 0
//! (or none) is no default set. Answers are kept per pipe folder for [`CACHE_FOR`] (a hanging
//! daemon costs one timeout per folder in that time), at most [`CACHE_MAX`] folders.

use crate::limits::{mps_size, Limit};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The pipe folder of a client that names none.
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The documented control client.
pub const CLIENT: &str = "nvidia-cuda-mps-control";
/// Where the client is looked for (root-owned system folders only).
pub const SYSTEM_DIRS: [&str; 7] = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin", "/usr/local/cuda/bin"];
/// The longest the client may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// The most bytes of its output read.
pub const MAX_OUTPUT: usize = 4096;
/// How long an answer (or a failure) is kept per pipe folder.
pub const CACHE_FOR: Duration = Duration::from_secs(30);
/// The most pipe folders kept.
pub const CACHE_MAX: usize = 64;
/// The most devices asked about.
pub const MAX_DEVICES: usize = 16;
/// What a limit read from the daemon names as its source.
pub const SOURCE: &str = "the MPS control daemon's default (get_default_device_pinned_mem_limit)";

/// What the daemon said for one pipe folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// No daemon serves the folder, or it sets no default: nothing to say.
    None,
    /// The default, per device ordinal.
    Limits(Vec<(i16, u64)>),
    /// Why nothing could be read (a note: no limit assumed).
    Unreadable(String),
}

/// The daemon answers, cached per pipe folder.
#[derive(Default)]
pub struct Daemons {
    cache: HashMap<PathBuf, (Instant, Answer)>,
}

impl Daemons {
    /// The daemon's default limits for a process with environment `env` on `devices` devices,
    /// when its environment sets none itself.
    pub fn default_for(&mut self, env: &HashMap<String, String>, devices: usize) -> Answer {
        if env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").is_some_and(|v| !v.trim().is_empty()) {
            return Answer::None;
        }
        let dir = PathBuf::from(env.get("CUDA_MPS_PIPE_DIRECTORY").filter(|v| !v.is_empty()).map_or(DEFAULT_PIPE_DIR, |v| v.as_str()));
        if std::fs::symlink_metadata(dir.join("control")).is_err() {
            return Answer::None;
        }
        if let Some((at, a)) = self.cache.get(&dir) {
            if at.elapsed() < CACHE_FOR {
                return a.clone();
            }
        }
        let a = ask(&dir, devices.clamp(1, MAX_DEVICES));
        if self.cache.len() >= CACHE_MAX {
            self.cache.clear();
        }
        self.cache.insert(dir, (Instant::now(), a.clone()));
        a
    }
}

/// The limit a daemon's default is, for [`crate::limits::ProcessLimits`].
pub fn limit(bytes: u64) -> Limit {
    Limit { layer: "mps".into(), variable: SOURCE.into(), library: None, bytes, parent: None }
}

/// The client, found in [`SYSTEM_DIRS`] and `GPUFRAG_MPS_CONTROL_DIRS`, trusted.
fn client() -> Result<PathBuf, String> {
    let extra = std::env::var("GPUFRAG_MPS_CONTROL_DIRS").unwrap_or_default();
    let dirs = SYSTEM_DIRS.iter().map(|d| d.to_string()).chain(extra.split(':').filter(|d| !d.is_empty()).map(str::to_string));
    let mut refused = Vec::new();
    for d in dirs {
        let p = Path::new(&d).join(CLIENT);
        if std::fs::symlink_metadata(&p).is_err() {
            continue;
        }
        match crate::private::trusted(Path::new(&d), false).and_then(|()| crate::private::trusted(&p, false)) {
            Ok(()) => return Ok(p),
            Err(e) => refused.push(e.to_string()),
        }
    }
    Err(if refused.is_empty() { format!("no {CLIENT} in the system folders") } else { refused.join("; ") })
}

/// Asks the daemon of `dir` for the default of devices `0..devices`.
fn ask(dir: &Path, devices: usize) -> Answer {
    let what = format!("the MPS control daemon's default limit (pipe folder {})", dir.display());
    if let Err(e) = crate::private::trusted(dir, true) {
        return Answer::Unreadable(format!("{what}: {e}"));
    }
    let client = match client() {
        Ok(c) => c,
        Err(e) => return Answer::Unreadable(format!("{what}: {e}")),
    };
    let input: String = (0..devices).map(|d| format!("get_default_device_pinned_mem_limit {d}\n")).collect();
    match run(&client, dir, &input) {
        Ok(out) => parse(&out, devices).map_or_else(
            |e| Answer::Unreadable(format!("{what}: {} answered {e}", client.display())),
            |l| {
                if l.is_empty() {
                    Answer::None
                } else {
                    Answer::Limits(l)
                }
            },
        ),
        Err(e) => Answer::Unreadable(format!("{what}: {}: {e}", client.display())),
    }
}

/// Runs the client with `input` on its standard input, bounded by [`TIMEOUT`] and [`MAX_OUTPUT`].
fn run(client: &Path, dir: &Path, input: &str) -> Result<String, String> {
    let mut child = Command::new(client)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("CUDA_MPS_PIPE_DIRECTORY", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not run it ({e})"))?;
    let pgid = child.id() as i32;
    // The input is a few lines (less than a pipe's buffer): written at once, then closed.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let mut stdout = child.stdout.take().ok_or("no output pipe")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut stdout).take(MAX_OUTPUT as u64).read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if start.elapsed() >= TIMEOUT => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    };
    if status.is_none() {
        // SAFETY: kill(2) of the process group of our own child (its own group, made at spawn).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = child.wait();
    }
    match status {
        None => Err(format!("no answer within {} ms (killed)", TIMEOUT.as_millis())),
        Some(st) if !st.success() => Err(format!("it failed ({st})")),
        // A process it left behind may hold the pipe open: the output is waited for a while.
        Some(_) => match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(out) => Ok(String::from_utf8_lossy(&out).into_owned()),
            Err(_) => Err("its output did not end".to_string()),
        },
    }
}

/// One answer line per device asked: a size as MPS writes them (`4G`, `512M`, bytes); `0` or
/// an empty line is no default. The devices with a default, or the line that is no size.
pub fn parse(out: &str, devices: usize) -> Result<Vec<(i16, u64)>, String> {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    if lines.len() < devices {
        return Err(format!("{} line(s) for {devices} device(s): {:?}", lines.len(), out.chars().take(80).collect::<String>()));
    }
    let mut got = Vec::new();
    for (d, l) in lines.iter().take(devices).enumerate() {
        if l.is_empty() || *l == "0" {
            continue;
        }
        match mps_size(l) {
            Some(b) if b > 0 => got.push((d as i16, b)),
            _ => return Err(format!("{:?} for device {d}, which is no size", l.chars().take(80).collect::<String>())),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_sizes_per_device_and_garbage_is_refused() {
        assert_eq!(parse("4G\n0\n512M\n", 3), Ok(vec![(0, 4 << 30), (2, 512 << 20)]));
        assert_eq!(parse("\n", 1), Ok(vec![]));
        assert!(parse("4G\n", 2).is_err_and(|e| e.contains("1 line(s) for 2")));
        assert!(parse("Invalid device\n", 1).is_err_and(|e| e.contains("no size")));
    }

    #[test]
    fn no_control_pipe_is_no_daemon_and_an_own_limit_is_not_overridden() {
        let mut d = Daemons::default();
        let dir = std::env::temp_dir().join(format!("gpufrag-mps-none-{}", std::process::id()));
        let env: HashMap<String, String> = [("CUDA_MPS_PIPE_DIRECTORY".to_string(), dir.display().to_string())].into();
        assert_eq!(d.default_for(&env, 1), Answer::None);
        let mut own = env.clone();
        own.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=1G".into());
        assert_eq!(d.default_for(&own, 1), Answer::None);
    }
}
