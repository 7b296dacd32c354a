//! The Prometheus endpoint: `GET /metrics` in the text exposition format (0.0.4), rendered from
//! the same [`METRICS`] catalogue and views as the OTLP export, with the names and labels a
//! collector's Prometheus exporter would give them, plus `target_info` carrying the resource.
//!
//! A small server on one std thread: a scrape renders a view (microseconds for a node's worth of
//! processes) and closes the connection. It binds 127.0.0.1 unless given another address. Why not
//! `opentelemetry-prometheus`: it is discontinued (its last release, 0.31, says so), and it would
//! pull the `prometheus` crate and a second registry for what is a page of text here.

use super::catalog::{prometheus_label, prometheus_name, AttrValue, Kind, Point, Value, ALLOC_SIZE, ALLOC_SIZE_HELP, METRICS};
use super::snapshot::{Reader, View, BUCKETS};
use crate::ingest::histogram::BUCKET_BOUNDS;
use anyhow::Context;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The default address of `--prometheus`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// `PORT`, `:PORT` → `127.0.0.1:PORT`; `HOST:PORT` as given.
pub fn resolve_addr(spec: &str) -> anyhow::Result<SocketAddr> {
    let s = spec.trim();
    let full = if let Some(port) = s.strip_prefix(':') {
        format!("127.0.0.1:{port}")
    } else if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
        format!("127.0.0.1:{s}")
    } else {
        s.to_string()
    };
    full.to_socket_addrs()
        .with_context(|| format!("--prometheus {spec}: not an address (give PORT or HOST:PORT)"))?
        .next()
        .with_context(|| format!("--prometheus {spec}: the name resolves to no address"))
}

fn escape_label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

fn labels(attrs: &[(&str, AttrValue)], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = attrs.iter().map(|(k, v)| format!("{}=\"{}\"", prometheus_label(k), escape_label(&v.to_label()))).collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{}\"", escape_label(v)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn value(v: Value) -> String {
    match v {
        Value::U64(u) => u.to_string(),
        Value::F64(f) if f.is_nan() => "NaN".into(),
        Value::F64(f) => format!("{f}"),
    }
}

/// The exposition of a view.
pub fn render(view: &View, resource: &[(String, String)]) -> String {
    let mut out = String::with_capacity(8192);
    let _ = writeln!(out, "# HELP target_info Target metadata\n# TYPE target_info gauge");
    let tl: Vec<String> = resource.iter().map(|(k, v)| format!("{}=\"{}\"", prometheus_label(k), escape_label(v))).collect();
    let _ = writeln!(out, "target_info{{{}}} 1", tl.join(","));
    for m in METRICS {
        let points: Vec<Point> = (m.points)(view);
        if points.is_empty() {
            continue;
        }
        let name = prometheus_name(m.name, m.unit, m.kind, false);
        let ty = if m.kind == Kind::Counter { "counter" } else { "gauge" };
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {ty}", m.help);
        for p in points {
            let _ = writeln!(out, "{name}{} {}", labels(&p.attrs, None), value(p.value));
        }
    }
    if !view.alloc_sizes.is_empty() {
        let name = prometheus_name(ALLOC_SIZE, "By", Kind::Counter, true);
        let _ = writeln!(out, "# HELP {name} {ALLOC_SIZE_HELP}\n# TYPE {name} histogram");
        for h in &view.alloc_sizes {
            let attrs = [("hw.id", AttrValue::Str(h.hw_id.clone())), ("gpufrag.level", AttrValue::Static(h.level))];
            let mut cum = 0u64;
            for i in 0..BUCKETS {
                cum += h.buckets[i];
                let le = BUCKET_BOUNDS.get(i).map_or_else(|| "+Inf".to_string(), u64::to_string);
                let _ = writeln!(out, "{name}_bucket{} {cum}", labels(&attrs, Some(("le", &le))));
            }
            let _ = writeln!(out, "{name}_sum{} {}", labels(&attrs, None), h.sum);
            let _ = writeln!(out, "{name}_count{} {}", labels(&attrs, None), h.count);
        }
    }
    out
}

/// The running endpoint; stops when dropped.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Binds `addr` and serves `/metrics` from `reader` on a thread of its own.
    pub fn start(addr: SocketAddr, reader: Reader, resource: Vec<(String, String)>) -> anyhow::Result<Endpoint> {
        let listener = TcpListener::bind(addr).with_context(|| format!("binding the Prometheus endpoint to {addr}"))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpufrag-prometheus".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Ok(s) = conn {
                        serve(s, &reader, &resource);
                    }
                }
            })
            .context("starting the Prometheus endpoint's thread")?;
        Ok(Endpoint { addr, stop, thread: Some(thread) })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut s: TcpStream, reader: &Reader, resource: &[(String, String)]) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let mut it = line.split_whitespace();
    let (method, target) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let view = reader.view();
            let body = render(&view, resource);
            reader.collected(true);
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        ("GET" | "HEAD", "/") => ("200 OK", "text/plain; charset=utf-8", "gpufrag: metrics at /metrics\n".to_string()),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain; charset=utf-8", "not found: metrics are at /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET\n".to_string()),
    };
    let _ = write!(s, "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let body = if method == "HEAD" { String::new() } else { body };
    let _ = s.write_all(body.as_bytes());
    let _ = s.flush();
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_loopback() {
        assert_eq!(resolve_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(resolve_addr(":9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(resolve_addr("0.0.0.0:9").unwrap().to_string(), "0.0.0.0:9");
        assert!(resolve_addr("nonsense").is_err());
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
