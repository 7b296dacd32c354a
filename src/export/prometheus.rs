//! The Prometheus endpoint: `GET /metrics` in the text exposition format (0.0.4), rendered from
//! the same [`METRICS`] catalogue and views as the OTLP export, with the names and labels a
//! collector's Prometheus exporter would give them, plus `target_info` carrying the resource.
//!
//! Served by hyper's HTTP/1 server connection on a one-worker Tokio runtime of its own: many
//! connections at once (at most [`MAX_CONNECTIONS`]), keep-alive, and per-connection timeouts
//! ([`HEADER_READ_TIMEOUT`], which also ends an idle kept-alive connection, and
//! [`CONNECTION_LIFETIME`]), so an idle or stalled local client delays no scrape. A scrape renders a
//! view (microseconds for a node's worth of processes). It binds 127.0.0.1 unless given another
//! address. Why not
//! `opentelemetry-prometheus`: it is discontinued (its last release, 0.31, says so), and it would
//! pull the `prometheus` crate and a second registry for what is a page of text here.

use super::catalog::{prometheus_label, prometheus_name, AttrValue, Kind, Point, Value, ALLOC_SIZE, ALLOC_SIZE_HELP, METRICS};
use super::store::{Reader, View, BUCKETS};
use crate::ingest::histogram::BUCKET_BOUNDS;
use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

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
    let mut parts: Vec<String> =
        attrs.iter().map(|(k, v)| format!("{}=\"{}\"", prometheus_label(k), escape_label(&v.to_label()))).collect();
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

/// Connections served at once; further ones wait in the kernel's accept queue until one ends.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send a request's head, counted from when it starts waiting
/// for one: hyper starts this timer on a new connection and again after each response, so it is
/// also the idle timeout of a kept-alive connection. A stalled half request or an idle connection
/// is closed after it.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is kept, whatever it does (a client that sends requests but never
/// reads the answers holds its slot at most this long); then it is shut down gracefully (the
/// request in flight is answered) within [`SHUTDOWN_GRACE`].
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// The time a connection past [`CONNECTION_LIFETIME`] is given to finish its request.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// A request's head larger than this is refused (hyper answers 431 and closes).
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The running endpoint; stops when dropped (its connections are closed).
pub struct Endpoint {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

/// What a scrape renders from.
struct Page {
    reader: Reader,
    resource: Vec<(String, String)>,
}

impl Endpoint {
    /// Binds `addr` and serves `/metrics` from `reader` on a thread of its own
    /// (`gpufrag-prometheus`, a one-worker Tokio runtime): up to [`MAX_CONNECTIONS`] connections
    /// at once, HTTP/1.1 with keep-alive, each under [`HEADER_READ_TIMEOUT`] and
    /// [`CONNECTION_LIFETIME`], so a stalled or idle client delays no other scrape.
    pub fn start(addr: SocketAddr, reader: Reader, resource: Vec<(String, String)>) -> anyhow::Result<Endpoint> {
        let listener = TcpListener::bind(addr).with_context(|| format!("binding the Prometheus endpoint to {addr}"))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true).context("the Prometheus endpoint's socket")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .thread_name("gpufrag-prometheus")
            .enable_io()
            .enable_time()
            .build()
            .context("starting the Prometheus endpoint's thread")?;
        let listener = {
            let _in = runtime.enter();
            tokio::net::TcpListener::from_std(listener).context("the Prometheus endpoint's socket")?
        };
        runtime.spawn(accept(listener, Arc::new(Page { reader, resource })));
        Ok(Endpoint { addr, runtime: Some(runtime) })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Drops the accept loop and every connection's task: the sockets close.
            rt.shutdown_timeout(Duration::from_millis(500));
        }
    }
}

async fn accept(listener: tokio::net::TcpListener, page: Arc<Page>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors, or a connection reset before it was accepted: the
                // next accept may succeed; do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let page = page.clone();
        tokio::spawn(async move {
            connection(stream, page).await;
            drop(slot);
        });
    }
}

async fn connection(stream: tokio::net::TcpStream, page: Arc<Page>) {
    let _ = stream.set_nodelay(true);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_HEAD_BYTES);
    let service = service_fn(move |req: Request<Incoming>| {
        let page = page.clone();
        async move { Ok::<_, Infallible>(respond(&page, req.method(), req.uri().path())) }
    });
    let conn = http.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    if tokio::time::timeout(CONNECTION_LIFETIME, conn.as_mut()).await.is_err() {
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
    }
}

fn respond(page: &Page, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (method, path) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let view = page.reader.view();
            let body = render(&view, &page.resource);
            page.reader.collected(true);
            (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", body)
        }
        (&Method::GET | &Method::HEAD, "/") => (StatusCode::OK, "text/plain; charset=utf-8", "gpufrag: metrics at /metrics\n".to_string()),
        (&Method::GET | &Method::HEAD, _) => {
            (StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "not found: metrics are at /metrics\n".to_string())
        }
        _ => (StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "only GET\n".to_string()),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    r
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
