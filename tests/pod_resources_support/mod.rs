//! The stand-in kubelet pod-resources server (server.py beside this file: Python grpcio and
//! protobuf) started for a test: found, started on a socket in the test's directory, killed when
//! dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A Python with grpcio and protobuf: `$PODRES_PYTHON`, /opt/gpufrag-ci/podres (scripts/setup.sh),
/// else `python3` if it has both.
pub fn python() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = std::env::var_os("PODRES_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/gpufrag-ci/podres/bin/python"), PathBuf::from("python3")])
        .collect();
    candidates.into_iter().find(|p| Command::new(p).args(["-c", "import grpc, google.protobuf"]).output().is_ok_and(|o| o.status.success()))
}

/// How to get [`python`].
pub const INSTALL: &str = "bash scripts/setup.sh (or pip install grpcio protobuf)";

/// The server, killed when dropped.
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stand-in kubelet serving `pods` (JSON, see server.py) on `dir/kubelet.sock` (keep `dir`
/// short: a Unix socket's path is at most 107 bytes); `extra`: server.py's options.
pub fn serve(py: &Path, dir: &Path, pods: &str, extra: &[&str]) -> (Server, PathBuf) {
    let file = dir.join("pods.json");
    std::fs::write(&file, pods).expect("pods");
    let sock = dir.join("kubelet.sock");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pod_resources_support/server.py");
    let mut child = Command::new(py)
        .arg(script)
        .arg(&sock)
        .arg(&file)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the stand-in server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("READY");
    assert_eq!(line.trim(), "READY", "the stand-in did not start");
    (Server(child), sock)
}
