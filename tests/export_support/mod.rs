//! Shared by the export tests: finding and running a real collector (`rotel-agent`) and a real
//! Prometheus as child processes bound to 127.0.0.1, always killed at the end (a guard's Drop),
//! parsing what the collector printed, and the deterministic workload.
//!
//! A missing tool fails the test under CI (`CI=true`, where `.ci/run` installs it) and skips it
//! with the reason printed elsewhere.

#![allow(dead_code, clippy::unwrap_used)]

use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The frag_oom fixture's figures (docs/metrics.md, "Worked example").
pub const RESERVED: u64 = 10_485_760_000;
pub const ALLOCATED: u64 = 8_388_608_000;
pub const STRANDED: u64 = 2_097_152_000;
pub const LARGEST_FREE_BLOCK: u64 = 209_715_200;
pub const DEVICE_FREE: u64 = 2_398_224_384;
pub const LARGEST_ALLOCATABLE: u64 = 2_394_030_080;
/// An H200's total as cuMemGetInfo reports it (a DeviceInfo event the test adds).
pub const DEVICE_TOTAL: u64 = 150_109_880_320;

/// Kills and reaps a child process when dropped.
pub struct Guard {
    pub child: Child,
    pub name: &'static str,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `None` after saying why the test is skipped (a failure under CI: [`crate::tool_support`]).
pub fn require(tool: &str, found: Option<PathBuf>, install: &str) -> Option<PathBuf> {
    if found.is_none() {
        crate::tool_support::missing(tool, &format!("install it with `{install}`"));
    }
    found
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
}

/// `rotel-agent`: `$ROTEL_AGENT`, on PATH, or inside the `rotel` Python package.
pub fn rotel_agent() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROTEL_AGENT").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(p) = on_path("rotel-agent") {
        return Some(p);
    }
    let out = Command::new("python3").args(["-c", "import os, rotel; print(os.path.dirname(rotel.__file__))"]).output().ok()?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let p = Path::new(&dir).join("rotel-agent");
    p.is_file().then_some(p)
}

/// `prometheus` on PATH (Debian's package).
pub fn prometheus() -> Option<PathBuf> {
    on_path("prometheus")
}

/// `promtool` on PATH (Debian's prometheus package).
pub fn promtool() -> Option<PathBuf> {
    on_path("promtool")
}

/// Waits until something accepts connections on 127.0.0.1:`port`.
pub fn wait_listening(port: u16, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A running rotel-agent that prints every metric it receives.
pub struct Rotel {
    pub guard: Guard,
    pub grpc: u16,
    pub http: u16,
    pub out: PathBuf,
    pub dir: PathBuf,
}

impl Rotel {
    /// Starts rotel-agent on the given ports of 127.0.0.1, printing metrics to a file in `dir`.
    pub fn start(bin: &Path, dir: &Path, grpc: u16, http: u16) -> Rotel {
        std::fs::create_dir_all(dir).unwrap();
        let out = dir.join(format!("rotel-{grpc}.out"));
        let f = std::fs::File::create(&out).unwrap();
        let child = Command::new(bin)
            .arg("start")
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--exporter", "blackhole", "--debug-log", "metrics", "--debug-log-verbosity", "detailed"])
            .args(["--pid-file", &dir.join(format!("rotel-{grpc}.pid")).to_string_lossy()])
            .args(["--log-file", &dir.join(format!("rotel-{grpc}.log")).to_string_lossy()])
            .args(["--batch-timeout", "100ms"])
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let guard = Guard { child, name: "rotel-agent" };
        assert!(
            wait_listening(grpc, Duration::from_secs(15)) && wait_listening(http, Duration::from_secs(15)),
            "rotel-agent did not start listening on {grpc}/{http}"
        );
        Rotel { guard, grpc, http, out, dir: dir.to_path_buf() }
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits until `pred` holds for the parsed output.
    pub fn wait_for(&self, within: Duration, pred: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let end = Instant::now() + within;
        loop {
            let got = parse_rotel(&self.output());
            if pred(&got) || Instant::now() > end {
                return got;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// One data point as the collector printed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    pub metric: String,
    pub unit: String,
    pub data_type: String,
    pub attrs: BTreeMap<String, String>,
    /// `Value:` of a number point; `Sum:` of a histogram point.
    pub value: String,
    /// Histogram points: `Count:`.
    pub count: Option<String>,
    /// Histogram points: the bucket counts in order.
    pub buckets: Vec<String>,
    /// The resource attributes of the batch.
    pub resource: BTreeMap<String, String>,
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn attr(line: &str) -> Option<(String, String)> {
    let rest = line.trim().strip_prefix("-> ")?;
    let (k, v) = rest.split_once(": ")?;
    // Str(x), Int(x), Double(x), Bool(x)
    let v = v.find('(').and_then(|i| v.strip_suffix(')').map(|s| s[i + 1..].to_string())).unwrap_or_else(|| v.to_string());
    Some((k.to_string(), v))
}

/// Parses rotel's `--debug-log metrics --debug-log-verbosity detailed` output.
pub fn parse_rotel(text: &str) -> Vec<Received> {
    let mut out = Vec::new();
    let mut resource = BTreeMap::new();
    let (mut metric, mut unit, mut dtype) = (String::new(), String::new(), String::new());
    let mut cur: Option<Received> = None;
    #[derive(PartialEq)]
    enum Sect {
        None,
        Resource,
        Descriptor,
        PointAttrs,
    }
    let mut sect = Sect::None;
    for raw in text.lines() {
        let line = strip_ansi(raw);
        let t = line.trim();
        if t.starts_with("ResourceMetrics #") {
            out.extend(cur.take());
            resource = BTreeMap::new();
            sect = Sect::None;
        } else if t == "Resource attributes:" {
            sect = Sect::Resource;
        } else if t.starts_with("Metric #") {
            out.extend(cur.take());
            sect = Sect::None;
        } else if t == "Descriptor:" {
            sect = Sect::Descriptor;
        } else if t.starts_with("NumberDataPoints #") || t.starts_with("HistogramDataPoints #") {
            out.extend(cur.take());
            cur = Some(Received {
                metric: metric.clone(),
                unit: unit.clone(),
                data_type: dtype.clone(),
                attrs: BTreeMap::new(),
                value: String::new(),
                count: None,
                buckets: Vec::new(),
                resource: resource.clone(),
            });
            sect = Sect::None;
        } else if t == "Data point attributes:" {
            sect = Sect::PointAttrs;
        } else if let Some((k, v)) = attr(t) {
            match sect {
                Sect::Resource => {
                    resource.insert(k, v);
                }
                Sect::Descriptor => match k.as_str() {
                    "Name" => metric = v,
                    "Unit" => unit = v,
                    "DataType" => dtype = v,
                    _ => {}
                },
                Sect::PointAttrs => {
                    if let Some(c) = cur.as_mut() {
                        c.attrs.insert(k, v);
                    }
                }
                Sect::None => {}
            }
        } else if let Some(c) = cur.as_mut() {
            sect = Sect::None;
            if let Some(v) = t.strip_prefix("Value: ") {
                c.value = v.to_string();
            } else if let Some(v) = t.strip_prefix("Sum: ") {
                c.value = v.to_string();
            } else if let Some(v) = t.strip_prefix("Count: ") {
                c.count = Some(v.to_string());
            } else if t.starts_with("Buckets #") {
                if let Some((_, v)) = t.rsplit_once("Count: ") {
                    c.buckets.push(v.to_string());
                }
            }
        }
    }
    out.extend(cur.take());
    out
}

/// The points of `metric` whose attributes include every pair of `with`.
pub fn points<'a>(got: &'a [Received], metric: &str, with: &[(&str, &str)]) -> Vec<&'a Received> {
    got.iter().filter(|r| r.metric == metric && with.iter().all(|(k, v)| r.attrs.get(*k).map(String::as_str) == Some(*v))).collect()
}

/// The frag_oom fixture's events for process `pid`, after a DeviceInfo with the H200's total.
pub fn frag_oom_events(pid: u32) -> Vec<Event> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frag_oom.pickle");
    let snap = gpufrag::snapshot::load(&fixture).unwrap();
    let mut info = Event { size: DEVICE_TOTAL, ..Event::new(EventKind::DeviceInfo, pid, 0) };
    info.flags &= !F_DEVICE_FREE_KNOWN;
    let mut events = vec![Event { ts_ns: 1, ..Event::new(EventKind::ProcessExec, pid, -1) }, info];
    events.extend(snap.events().into_iter().map(|mut e| {
        e.pid = pid;
        e
    }));
    events
}

/// A process to lend its pid and name (`sleep`) to the replayed workload.
pub fn stand_in_process() -> Guard {
    let child = Command::new("sleep").arg("120").stdin(Stdio::null()).spawn().unwrap();
    Guard { child, name: "sleep" }
}

/// `GET http://127.0.0.1:port/path`, the body.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return None;
    }
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Some(dechunk(body));
    }
    Some(body.to_string())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A fresh temporary directory under the target dir.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufrag-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes a test's directory unless `GPUFRAG_TEST_KEEP` is set (to read what a collector got).
pub fn cleanup(dir: &Path) {
    if std::env::var_os("GPUFRAG_TEST_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    } else {
        eprintln!("kept {}", dir.display());
    }
}

/// What the exporters said of the record's events (replayed through a real exporter, as `run`
/// feeds it): (Prometheus text from its endpoint, OTLP points a real collector received; `None`
/// without rotel-agent, where the tool skip mechanism says so).
pub fn exported(record: &Path, dir: &Path) -> (String, Option<Vec<Received>>) {
    let events = gpufrag::record::read(record).expect("record").events;
    let prom = free_port();
    let rotel = rotel_agent().map(|bin| {
        let (grpc, http) = (free_port(), free_port());
        (Rotel::start(&bin, dir, grpc, http), http)
    });
    let args = gpufrag::export::ExportArgs {
        otlp: rotel.as_ref().map(|(_, http)| format!("http://127.0.0.1:{http}")),
        otlp_protocol: Some(gpufrag::export::otlp::Protocol::HttpProtobuf),
        otlp_interval: Some(std::time::Duration::from_millis(300)),
        prometheus: Some(format!("127.0.0.1:{prom}")),
        nvml_lib: Some("none".into()),
        ..Default::default()
    };
    let mut exporter = gpufrag::export::exporter_from_args(&args, std::sync::Arc::new(|_: &str| {})).expect("exporter");
    gpufrag::export::replay(&events, &mut exporter, std::time::Duration::from_millis(700));
    let text = http_get(prom, "/metrics").expect("a Prometheus scrape");
    let otlp = match rotel {
        Some((r, _)) => Some(r.wait_for(std::time::Duration::from_secs(10), |g| !points(g, "gpufrag.alloc_retries", &[]).is_empty())),
        None => {
            require("rotel-agent", None, "pip install rotel");
            None
        }
    };
    (text, otlp)
}

/// The sum of a Prometheus counter's series.
pub fn prom_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("{l}")) as u64)
        .sum()
}

/// The sum of the last value of each series of an OTLP metric.
pub fn otlp_sum(got: &[Received], metric: &str) -> u64 {
    let mut last = std::collections::BTreeMap::new();
    for r in points(got, metric, &[]) {
        last.insert(format!("{:?}", r.attrs), r.value.parse::<u64>().unwrap_or_else(|_| panic!("{metric} {}", r.value)));
    }
    last.values().sum()
}
