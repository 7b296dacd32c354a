//! `gpufrag run --otlp ...` and `gpufrag run --prometheus ...` end to end, the way a user runs
//! them: the simcuda stand-in workload under the LD_PRELOAD shim, a real collector (rotel-agent)
//! or a real Prometheus, and the exact figures that arrived compared with the summary the same
//! run wrote and with what the workload itself reports.
//!
//! Needs the workspace built (`cargo build --workspace --release`: `simcuda-workload`, the shim
//! and the stand-in libraries next to the `gpufrag` binary).

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

use export_support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The built pieces: gpufrag, the workload, the shim, the stand-in libraries.
struct Built {
    gpufrag: PathBuf,
    workload: PathBuf,
    preload: PathBuf,
    libs: PathBuf,
}

fn built() -> Option<Built> {
    let gpufrag = PathBuf::from(env!("CARGO_BIN_EXE_gpufrag"));
    // The other workspace members land next to the gpufrag binary; GPUFRAG_TEST_TARGET_DIR points
    // elsewhere when they were built apart.
    let dir = std::env::var_os("GPUFRAG_TEST_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| gpufrag.parent().unwrap().to_path_buf());
    let b =
        Built { gpufrag, workload: dir.join("simcuda-workload"), preload: dir.join("libgpufrag_preload.so"), libs: dir.join("simcuda") };
    let found =
        b.workload.is_file() && b.preload.is_file() && b.libs.join("libcuda.so.1").exists() && b.libs.join("libnvidia-ml.so.1").exists();
    require("the simcuda stand-ins and the shim", found.then(|| b.workload.clone()), "cargo build --workspace --release")?;
    Some(b)
}

impl Built {
    /// `gpufrag run [flags] -- simcuda-workload ARGS` on a private simulated 16 GiB machine.
    fn run(&self, state_dir: &Path, flags: &[String], workload_args: &[&str]) -> Command {
        let mut c = Command::new(&self.gpufrag);
        c.env("SIMCUDA_MEM", "16GiB").env("SIMCUDA_STATE_DIR", state_dir).env("LD_LIBRARY_PATH", &self.libs).env_remove("LD_PRELOAD");
        for v in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_METRIC_EXPORT_INTERVAL", "CUDA_VISIBLE_DEVICES"] {
            c.env_remove(v);
        }
        c.arg("run").arg("--quiet").arg("--preload").arg(&self.preload).args(flags).arg("--").arg(&self.workload).args(workload_args);
        c
    }

    /// The stand-in GPU 0 as its NVML reports it to a monitor (the workload's `nvml` test).
    fn nvml(&self, state_dir: &Path) -> Gpu {
        let out = Command::new(&self.workload)
            .arg("nvml")
            .env("SIMCUDA_MEM", "16GiB")
            .env("SIMCUDA_STATE_DIR", state_dir)
            .env("LD_LIBRARY_PATH", &self.libs)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let kv = result_line(&text, "test=nvml").unwrap_or_else(|| panic!("no NVML result: {text}"));
        // The name may hold spaces: it ends its line.
        let after = |prefix: &str| {
            text.lines().find_map(|l| l.strip_prefix(prefix).map(str::to_string)).unwrap_or_else(|| panic!("no {prefix}: {text}"))
        };
        Gpu { uuid: kv["uuid"].clone(), model: after("INFO device=0 name="), driver_version: after("INFO driver_version=") }
    }
}

/// A GPU as NVML names it.
struct Gpu {
    uuid: String,
    model: String,
    driver_version: String,
}

/// The `key=value` pairs of the first line holding `marker`.
fn result_line(text: &str, marker: &str) -> Option<BTreeMap<String, String>> {
    let line = text.lines().find(|l| l.contains(marker))?;
    Some(line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("gpufrag run did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn u(v: &Value) -> String {
    v.as_u64().map(|x| x.to_string()).unwrap_or_else(|| v.to_string())
}

fn otlp_run_delivers_the_summary_figures(protocol: &str) {
    let Some(rotel_bin) = require("rotel-agent", rotel_agent(), "pip install rotel") else { return };
    let Some(b) = built() else { return };
    let dir = temp_dir(&format!("run-otlp-{}", protocol.replace('/', "-")));
    let gpu = b.nvml(&dir.join("sim-nvml"));
    let uuid = gpu.uuid.clone();
    let (grpc, http) = (free_port(), free_port());
    let rotel = Rotel::start(&rotel_bin, &dir, grpc, http);
    let port = if protocol == "grpc" { grpc } else { http };
    let summary = dir.join("summary.json");
    let flags = vec![
        "--otlp".to_string(),
        format!("http://127.0.0.1:{port}"),
        "--otlp-protocol".into(),
        protocol.into(),
        "--otlp-interval".into(),
        "300ms".into(),
        "--summary-json".into(),
        summary.display().to_string(),
    ];
    let started = Instant::now();
    let mut child = b.run(&dir.join("sim"), &flags, &["frag-oom"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let took = started.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.code().is_some(), "gpufrag run ended by a signal; stderr: {stderr}");
    assert!(!stderr.contains("failed"), "no export failure expected: {stderr}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let proc_summary = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["reserved"].as_u64().unwrap_or(0) > 0)
        .unwrap_or_else(|| panic!("no process held memory: {s}"));
    let pid = proc_summary["pid"].as_u64().unwrap().to_string();
    // The name is read from /proc when the process connects. frag-oom can be over by the time
    // its connection is handled: then only the zombie's `comm` is left, which the kernel cuts to
    // 15 characters, or nothing once `run` reaped it (docs/operations.md, "Known limits"; the
    // shim's hello carries the name, but observers do not see it yet).
    let name = rotel
        .wait_for(Duration::from_secs(10), |g| !points(g, "gpufrag.process.memory.reserved", &[("process.pid", &pid)]).is_empty())
        .iter()
        .find(|r| r.metric == "gpufrag.process.memory.reserved" && r.attrs.get("process.pid") == Some(&pid))
        .and_then(|r| r.attrs.get("process.executable.name").cloned())
        .unwrap_or_default();
    assert!(["simcuda-workload", "simcuda-workloa", "unknown"].contains(&name.as_str()), "process.executable.name {name:?}");
    let attrs = [("process.pid", pid.as_str()), ("process.executable.name", name.as_str()), ("hw.id", uuid.as_str())];
    let got = rotel.wait_for(Duration::from_secs(10), |g| {
        !points(g, "gpufrag.process.memory.largest_free_block", &attrs).is_empty()
            && !points(g, "gpufrag.memory.reserved", &[("hw.id", &uuid)]).is_empty()
    });
    let last = |metric: &str, with: &[(&str, &str)]| -> String {
        let p = points(&got, metric, with);
        assert!(
            !p.is_empty(),
            "{metric} {with:?} did not arrive; rotel got {:?}",
            got.iter().map(|r| (&r.metric, &r.attrs)).collect::<Vec<_>>()
        );
        p.last().unwrap().value.clone()
    };
    // The values that arrived are the summary's, to the byte.
    for (metric, field) in [
        ("gpufrag.process.memory.reserved", "reserved"),
        ("gpufrag.process.memory.allocated", "allocated"),
        ("gpufrag.process.memory.stranded", "stranded"),
        ("gpufrag.process.memory.releasable", "releasable"),
        ("gpufrag.process.memory.largest_free_block", "largest_free_block"),
        ("gpufrag.process.memory.largest_allocatable", "largest_allocatable"),
    ] {
        assert_eq!(last(metric, &attrs), u(&proc_summary[field]), "{metric}");
    }
    let dev = &s["devices"][0];
    for (metric, field) in [
        ("gpufrag.memory.reserved", "reserved"),
        ("gpufrag.memory.allocated", "allocated"),
        ("gpufrag.memory.stranded", "stranded"),
        ("gpufrag.memory.largest_free_block", "largest_free_block"),
    ] {
        assert_eq!(last(metric, &[("hw.id", &uuid)]), u(&dev[field]), "{metric}");
    }
    assert_eq!(last("gpufrag.allocations", &attrs), u(&proc_summary["allocs"]));
    // The GPU series carry what NVML says of the GPU (the semantic conventions' hw.* attributes).
    let hw = [
        ("hw.id", uuid.as_str()),
        ("hw.type", "gpu"),
        ("hw.model", gpu.model.as_str()),
        ("hw.vendor", "NVIDIA"),
        ("hw.driver_version", gpu.driver_version.as_str()),
    ];
    assert_eq!(last("hw.gpu.memory.limit", &hw), u(&dev["device_total"]), "hw.gpu.memory.limit {hw:?}");
    // The OOM the workload ran into was counted under its verdict.
    let verdict = s["ooms"].as_array().unwrap().last().expect("frag-oom ends in an OOM")["verdict"].as_str().unwrap().to_string();
    let mut oom_attrs = attrs.to_vec();
    oom_attrs.push(("gpufrag.verdict", &verdict));
    assert_ne!(last("gpufrag.ooms", &oom_attrs), "0");
    // And they are the workload's own figures where the two levels meet: its caching
    // allocator's stranded bytes and largest free block (block level, when its blocks are seen).
    if proc_summary["level"] == "block" {
        let before = result_line(&stdout, "step=before_request").unwrap_or_else(|| panic!("workload output: {stdout}"));
        assert_eq!(last("gpufrag.process.memory.stranded", &attrs), before["stranded"]);
        assert_eq!(last("gpufrag.process.memory.largest_free_block", &attrs), before["largest_free_block"]);
    } else {
        eprintln!("note: the shim reported segments only for this workload; block-level figures not compared");
    }
    eprintln!("gpufrag run --otlp ({protocol}) took {took:?}; level {}", proc_summary["level"]);
    drop(rotel);
    cleanup(&dir);
}

#[test]
fn run_with_otlp_grpc_delivers_the_summary_figures() {
    otlp_run_delivers_the_summary_figures("grpc");
}

#[test]
fn run_with_otlp_http_delivers_the_summary_figures() {
    otlp_run_delivers_the_summary_figures("http/protobuf");
}

/// `gpufrag run --prometheus` while the workload holds 1 GiB: Prometheus scrapes it and its query
/// API returns the exact figures.
#[test]
fn run_with_prometheus_is_scraped_while_the_workload_runs() {
    let Some(prom_bin) = require("prometheus", prometheus(), "apt-get install prometheus") else { return };
    let Some(b) = built() else { return };
    let dir = temp_dir("run-prometheus");
    let gpu = b.nvml(&dir.join("sim-nvml"));
    let uuid = gpu.uuid.clone();
    let target = free_port();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpufrag\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")).unwrap();
    let prom_port = free_port();
    let prom = Guard {
        child: Command::new(&prom_bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        name: "prometheus",
    };
    let summary = dir.join("summary.json");
    let flags = vec!["--prometheus".to_string(), format!("127.0.0.1:{target}"), "--summary-json".into(), summary.display().to_string()];
    let mut run = b
        .run(&dir.join("sim"), &flags, &["hold", "1GiB"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let ready = lines.find_map(|l| l.ok().filter(|l| l.starts_with("READY"))).expect("the workload holds its memory");
    let kv = result_line(&ready, "READY").unwrap();
    let (pid, size) = (kv["pid"].clone(), kv["size"].clone());
    let started = Instant::now();
    let query = |q: &str| -> Option<String> {
        let enc: String =
            q.bytes().map(|c| if c.is_ascii_alphanumeric() { (c as char).to_string() } else { format!("%{c:02X}") }).collect();
        let body = http_get(prom_port, &format!("/api/v1/query?query={enc}"))?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str().map(String::from)
    };
    let sel = format!("process_pid=\"{pid}\",process_executable_name=\"simcuda-workload\",hw_id=\"{uuid}\"");
    let want_reserved = format!("gpufrag_process_memory_reserved_bytes{{{sel}}}");
    let mut got = None;
    while started.elapsed() < Duration::from_secs(30) {
        got = query(&want_reserved);
        if got.as_deref() == Some(size.as_str()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let scraped_after = started.elapsed();
    assert_eq!(got.as_deref(), Some(size.as_str()), "Prometheus has the held 1 GiB for pid {pid}");
    assert_eq!(query(&format!("gpufrag_process_memory_allocated_bytes{{{sel}}}")).as_deref(), Some(size.as_str()));
    assert_eq!(query(&format!("gpufrag_memory_reserved_bytes{{hw_id=\"{uuid}\"}}")).as_deref(), Some(size.as_str()));
    assert_eq!(query(&format!("gpufrag_allocations_total{{{sel}}}")).as_deref(), Some("1"));
    let hw = format!(
        "hw_id=\"{uuid}\",hw_type=\"gpu\",hw_model=\"{}\",hw_vendor=\"NVIDIA\",hw_driver_version=\"{}\"",
        gpu.model, gpu.driver_version
    );
    let total = query(&format!("hw_gpu_memory_limit_bytes{{{hw}}}"));
    drop(run.stdin.take());
    let status = wait_exit(&mut run, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let p = s["processes"].as_array().unwrap().iter().find(|p| p["pid"].as_u64().map(|x| x.to_string()) == Some(pid.clone())).unwrap();
    assert_eq!(u(&p["allocs"]), "1");
    // The GPU series carry what NVML says of the GPU, with the total the summary measured.
    assert_eq!(total, Some(u(&s["devices"][0]["device_total"])), "hw_gpu_memory_limit_bytes{{{hw}}}");
    eprintln!("Prometheus had the figures {scraped_after:?} after the workload was ready");
    drop(prom);
    cleanup(&dir);
}

/// Issue 23, item 7 (see docs/robustness.md, "Listeners"): `gpufrag run --prometheus` with 400
/// clients that each open a connection, send half a request head, and reconnect as soon as the
/// server closes it, more than the endpoint holds at once. Before, the endpoint stopped accepting
/// at 64 connections and the crowd kept every scrape in the kernel's queue for 10 to 17 s. Timed
/// scrapes on fresh connections must each be answered within 1 s, and the real Prometheus
/// scraping the same endpoint every second with a 1 s timeout must never see it down.
#[test]
fn prometheus_scrapes_answer_within_a_second_under_400_half_sent_reconnecting_connections() {
    scrapes_beside_a_crowd(400);
}

/// The same with 1,000 such clients, four times what the endpoint holds: the wait grows with the
/// crowd by [`gpufrag::export::prometheus::QUIET_BEFORE_CLOSING`] per [`MAX_CONNECTIONS`] ahead
/// of the scrape in the kernel's queue, and stays under 1 s.
///
/// [`MAX_CONNECTIONS`]: gpufrag::export::prometheus::MAX_CONNECTIONS
#[test]
fn prometheus_scrapes_answer_within_a_second_under_1000_half_sent_reconnecting_connections() {
    scrapes_beside_a_crowd(1000);
}

/// The crowd's own source address. Its clients open about 2,700 connections a second, which
/// cycles through the kernel's 28,232 ephemeral ports (32768..60999) about every ten seconds while
/// the endpoint's side of each closed one lingers (33,000 in TIME_WAIT): dialled from 127.0.0.1
/// too, Prometheus's own connections share that port space with the crowd's, and some of its dials
/// were refused by the kernel (`dial tcp ...: connect: connection refused`, a scrape counted down)
/// whatever the endpoint did: once in CI, and 1 of about 180 scrapes here over 14 runs, against 0
/// of 180 with the crowd on 127.0.0.2 in the same runs, alternated (docs/robustness.md,
/// "Listeners"). Any 127/8 address reaches a 127.0.0.1 listener: from 127.0.0.2 the crowd is a
/// client of its own, as another process or container would be, and what is measured is the
/// endpoint's policy.
const CROWD_SOURCE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// A TCP connection to 127.0.0.1:`port` from `source` (std's `TcpStream` cannot bind before it
/// connects).
fn connect_from(source: std::net::Ipv4Addr, port: u16) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns (closed by `OwnedFd` on error).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let from = sockaddr(source, 0);
        if libc::bind(raw, (&from as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let to = sockaddr(std::net::Ipv4Addr::LOCALHOST, port);
        if libc::connect(raw, (&to as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(std::net::TcpStream::from(fd))
    }
}

fn scrapes_beside_a_crowd(crowd_size: usize) {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    const BOUND: Duration = Duration::from_secs(1);
    let Some(prom_bin) = require("prometheus", prometheus(), "apt-get install prometheus") else { return };
    let Some(b) = built() else { return };
    assert!(crowd_size > gpufrag::export::prometheus::MAX_CONNECTIONS, "the crowd must outnumber the connections held");
    let dir = temp_dir("prometheus-crowd");
    let target = free_port();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpufrag\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")).unwrap();
    let prom_port = free_port();
    let _prom = Guard {
        child: Command::new(&prom_bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        name: "prometheus",
    };
    let flags = vec!["--prometheus".to_string(), format!("127.0.0.1:{target}")];
    let mut run = b
        .run(&dir.join("sim"), &flags, &["hold", "1GiB"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let ready = lines.find_map(|l| l.ok().filter(|l| l.starts_with("READY"))).expect("the workload holds its memory");
    let size = result_line(&ready, "READY").unwrap()["size"].clone();
    let prom_query = |q: &str| -> Option<String> {
        let enc: String =
            q.bytes().map(|c| if c.is_ascii_alphanumeric() { (c as char).to_string() } else { format!("%{c:02X}") }).collect();
        let body = http_get(prom_port, &format!("/api/v1/query?query={enc}"))?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str().map(String::from)
    };
    let waited = Instant::now();
    while prom_query("gpufrag_memory_reserved_bytes").as_deref() != Some(size.as_str()) {
        assert!(waited.elapsed() < Duration::from_secs(30), "Prometheus never scraped the held {size} bytes");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A fresh connection, a whole request, the whole answer: its time, or what went wrong.
    let scrape = || -> Result<Duration, String> {
        let t = Instant::now();
        let mut s = TcpStream::connect(("127.0.0.1", target)).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).map_err(|e| format!("read after {:?}: {e}", t.elapsed()))?;
        let took = t.elapsed();
        let text = String::from_utf8_lossy(&buf);
        if !text.starts_with("HTTP/1.1 200") || !text.contains("gpufrag_memory_reserved_bytes{") {
            return Err(format!("after {took:?}, not the metrics: {:?}", &text[..text.len().min(200)]));
        }
        Ok(took)
    };
    let mut alone: Vec<Duration> = (0..10).map(|i| scrape().unwrap_or_else(|e| panic!("scrape {i} alone: {e}"))).collect();
    alone.sort();

    // The crowd: each client holds one half-sent connection and opens the next when it is closed.
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let crowd: Vec<_> = (0..crowd_size)
        .map(|_| {
            let (stop, opened, closed) = (stop.clone(), opened.clone(), closed.clone());
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut b = [0u8; 512];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut s) = connect_from(CROWD_SOURCE, target) else {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        };
                        opened.fetch_add(1, Ordering::Relaxed);
                        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Stalled: ");
                        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                        loop {
                            match s.read(&mut b) {
                                Ok(0) => break,
                                Ok(_) => continue,
                                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                                    if stop.load(Ordering::Relaxed) {
                                        return;
                                    }
                                }
                                Err(_) => break,
                            }
                        }
                        closed.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .unwrap()
        })
        .collect();
    // Until the crowd outnumbers what the endpoint holds and it is closing connections.
    let waited = Instant::now();
    while opened.load(Ordering::Relaxed) < crowd_size as u64 || closed.load(Ordering::Relaxed) < crowd_size as u64 {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the crowd opened {} connections, {} closed",
            opened.load(Ordering::Relaxed),
            closed.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let attack_from = Instant::now();
    let mut during = Vec::new();
    while attack_from.elapsed() < Duration::from_secs(12) {
        during.push(scrape());
        std::thread::sleep(Duration::from_millis(200));
    }
    let window = attack_from.elapsed();
    let (opened_n, closed_n) = (opened.load(Ordering::Relaxed), closed.load(Ordering::Relaxed));
    // Prometheus's own view of the same seconds, read before the crowd leaves.
    let secs = window.as_secs().saturating_sub(1).max(1);
    let worst_prom = prom_query(&format!("max_over_time(scrape_duration_seconds{{job=\"gpufrag\"}}[{secs}s])"));
    let min_up = prom_query(&format!("min_over_time(up{{job=\"gpufrag\"}}[{secs}s])"));
    let scrapes_prom = prom_query(&format!("count_over_time(up{{job=\"gpufrag\"}}[{secs}s])"));
    let ups_prom = prom_query(&format!("sum_over_time(up{{job=\"gpufrag\"}}[{secs}s])"));
    // Prometheus's own count of its failed dials to the target, by reason: a refused dial is the
    // kernel's answer before any endpoint code runs; a timeout would be the endpoint stalling.
    let dial_failed = |reason: &str| {
        let needle = format!("net_conntrack_dialer_conn_failed_total{{dialer_name=\"gpufrag\",reason=\"{reason}\"}} ");
        http_get(prom_port, "/metrics")
            .and_then(|b| b.lines().find_map(|l| l.strip_prefix(needle.as_str()).and_then(|v| v.trim().parse::<f64>().ok())))
    };
    let (refused, timeouts) = (dial_failed("refused"), dial_failed("timeout"));
    let prom_error = http_get(prom_port, "/api/v1/targets")
        .and_then(|b| serde_json::from_str::<Value>(&b).ok())
        .and_then(|v| v["data"]["activeTargets"][0]["lastError"].as_str().map(String::from));
    stop.store(true, Ordering::Relaxed);
    for t in crowd {
        t.join().unwrap();
    }
    drop(run.stdin.take());
    let status = wait_exit(&mut run, Duration::from_secs(20));

    let failed: Vec<&String> = during.iter().filter_map(|r| r.as_ref().err()).collect();
    let mut took: Vec<Duration> = during.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "scrapes alone: median {:.1} ms, worst {:.1} ms; beside {crowd_size} half-sent reconnecting connections ({opened_n} opened, {closed_n} closed by the endpoint in {:.1} s): {} scrapes, median {:.1} ms, worst {:.1} ms, {} failed; Prometheus over {secs} s: worst scrape {:?} s, min up {:?}, {:?} scrapes, last error {:?}",
        ms(alone[alone.len() / 2]),
        ms(alone[alone.len() - 1]),
        window.as_secs_f64(),
        took.len(),
        took.get(took.len() / 2).map_or(f64::NAN, |d| ms(*d)),
        took.last().map_or(f64::NAN, |d| ms(*d)),
        failed.len(),
        worst_prom,
        min_up,
        scrapes_prom,
        prom_error
    );
    assert!(
        failed.is_empty(),
        "{} of {} scrapes failed beside the crowd: {:?}",
        failed.len(),
        during.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(took.len() >= 20, "only {} scrapes in {window:?}", took.len());
    let worst = *took.last().unwrap();
    assert!(
        worst < BOUND,
        "a scrape took {:.1} ms beside the crowd (bound {BOUND:?}; median {:.1} ms)",
        ms(worst),
        ms(took[took.len() / 2])
    );
    // Every Prometheus scrape up, but for at most one whose dial the kernel refused while the
    // endpoint answered every scrape of ours (above) and Prometheus's dials never timed out: seen
    // in CI at 1 of 11 scrapes with the crowd on its own source address (docs/robustness.md,
    // "Listeners"), a refusal no endpoint code sees. Any other down scrape fails.
    let count: f64 = scrapes_prom.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let ups: f64 = ups_prom.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let downs = count - ups;
    eprintln!("Prometheus: {downs} of {count} scrapes down; its dials refused {refused:?}, timed out {timeouts:?}");
    let refused_once = downs <= 1.0 && refused.unwrap_or(0.0) >= 1.0 && timeouts == Some(0.0);
    assert!(
        min_up.as_deref() == Some("1") || refused_once,
        "Prometheus saw the endpoint down during the crowd: {downs} of {count} scrapes (dials refused {refused:?}, timed out {timeouts:?}; worst scrape {worst_prom:?} s)"
    );
    let worst_prom: f64 = worst_prom.expect("Prometheus's scrape durations").parse().unwrap();
    assert!(worst_prom < BOUND.as_secs_f64(), "Prometheus's slowest scrape took {worst_prom} s");
    let n: f64 = scrapes_prom.expect("Prometheus's scrape count").parse().unwrap();
    assert!(n >= secs as f64 - 2.0, "Prometheus scraped {n} times in {secs} s at a 1 s interval");
    assert_eq!(status.code(), Some(0));
    cleanup(&dir);
}
