//! The Prometheus endpoint: `GET /metrics` in the text exposition format (0.0.4), rendered from
//! the same [`METRICS`] catalogue and views as the OTLP export, with the names and labels a
//! collector's Prometheus exporter would give them, plus `target_info` carrying the resource.
//!
//! Served by hyper's HTTP/1 server connection on a one-worker Tokio runtime of its own:
//! keep-alive, per-connection timeouts ([`HEADER_READ_TIMEOUT`], which also ends an idle
//! kept-alive connection, and [`CONNECTION_LIFETIME`]), and a listener that no crowd can starve:
//! past [`MAX_CONNECTIONS`] held, each new connection is accepted by closing the one quiet for
//! longest (no request begun since it opened or since its last one), as soon as it has been quiet
//! for [`QUIET_BEFORE_CLOSING`], as nginx drains its idle keep-alive connections when it runs out
//! (`ngx_drain_connections`). A limit that only waits for a connection to end (a semaphore before
//! `accept`, tower's `ConcurrencyLimit`) lets that many half-sent connections that reconnect when
//! closed keep a scrape in the kernel's queue until their header timeouts (issue 23: 400 of them,
//! 10 to 17 s). No limit
//! per client address: the endpoint binds 127.0.0.1 by default, where the scraper and any other
//! local user share one. A scrape renders a view (microseconds for a node's worth of processes).
//! It binds 127.0.0.1 unless given another address. The same listener serves the agent's probes,
//! `/healthz` (the process answers: no lock, no store) and `/readyz` (the capture in place and
//! the live loop turning, [`Health`]), so a crowd that cannot starve a scrape cannot starve a
//! probe either. Why not
//! `opentelemetry-prometheus`: it is discontinued (its last release, 0.31, says so), and it would
//! pull the `prometheus` crate and a second registry for what is a page of text here.

use super::catalog::{prometheus_label, prometheus_name, AttrValue, Kind, Point, Value, ALLOC_SIZE, ALLOC_SIZE_HELP, METRICS};
use super::health::Health;
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
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// The liveness probe's path: 200 whenever the endpoint answers.
pub const HEALTHZ: &str = "/healthz";
/// The readiness probe's path: 200 once the capture is in place and while the live loop turns,
/// 503 (with the reason) otherwise.
pub const READYZ: &str = "/readyz";

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

/// Connections held at once. When the table is full, the connection that has been quiet longest
/// (no request begun since it opened or since its last request) is closed to make room for the
/// next one, once it has been quiet for [`QUIET_BEFORE_CLOSING`] ([`Connections::make_room`]):
/// a crowd of slow, idle or half-open clients then delays a new scrape by about that long,
/// however many there are and however fast they reconnect.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection is left to send a request (after it opened, or after its last request)
/// before it may be closed to make room. A scraper sends its request with the connection's first
/// packet, so it is read at once; a crowd of more clients than [`MAX_CONNECTIONS`] that all send
/// their requests is served in turns of this length, none of them closed.
pub const QUIET_BEFORE_CLOSING: Duration = Duration::from_millis(100);
/// The kernel's queue of connections not yet accepted (`listen`'s backlog; the kernel caps it at
/// `net.core.somaxconn`, 4096 by default): what waits while the table is full.
pub const ACCEPT_BACKLOG: u32 = 4096;
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
    connections: Arc<Connections>,
    health: Arc<Health>,
}

/// The connections held, each with the time it last showed life (opened, or began a request), and
/// the handle that closes it. Only the endpoint's one worker thread touches it, so the lock is
/// never contended; it is held for a lookup or a scan of at most [`MAX_CONNECTIONS`] entries.
#[derive(Default)]
struct Connections {
    table: Mutex<Table>,
    /// Signalled when a connection ends: the accept loop may be waiting for room.
    freed: Notify,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    held: HashMap<u64, Held>,
}

struct Held {
    active_at: Instant,
    /// Its task has run at least once, so hyper has read what the client sent before it was
    /// accepted (a scraper's whole request, usually): until then it is never closed to make room.
    polled: bool,
    close: Option<AbortHandle>,
}

/// What the accept loop may do next.
enum Room {
    /// Accept: the table has room (perhaps just made).
    Free,
    /// Every connection held is busy or was heard from too recently: wait this long at most (a
    /// connection that ends wakes the loop sooner).
    Wait(Duration),
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding it leaves a table that is still consistent (single-field updates).
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Room for one more connection: free already, made by closing the connection quiet for
    /// longest among those whose task has run if it has been quiet for [`QUIET_BEFORE_CLOSING`],
    /// or how long to wait until one will have been.
    fn make_room(&self) -> Room {
        let mut t = self.lock();
        if t.held.len() < MAX_CONNECTIONS {
            return Room::Free;
        }
        let now = Instant::now();
        let quietest = t.held.iter().filter(|(_, h)| h.polled).min_by_key(|(id, h)| (h.active_at, **id)).map(|(&id, h)| (id, h.active_at));
        match quietest {
            Some((id, at)) if now.duration_since(at) >= QUIET_BEFORE_CLOSING => {
                let close = t.held.remove(&id).and_then(|h| h.close);
                drop(t);
                // Outside the lock: the closed connection's task takes it when it ends.
                if let Some(close) = close {
                    close.abort();
                }
                Room::Free
            }
            Some((_, at)) => Room::Wait(QUIET_BEFORE_CLOSING.saturating_sub(now.duration_since(at))),
            // None has been polled yet: their tasks run before the loop's next turn.
            None => Room::Wait(Duration::from_millis(1)),
        }
    }

    /// Registers a new connection; its id.
    fn admit(&self) -> u64 {
        let mut t = self.lock();
        let id = t.next_id;
        t.next_id += 1;
        t.held.insert(id, Held { active_at: Instant::now(), polled: false, close: None });
        id
    }

    /// Hands the closing handle of connection `id` (if it is still held: it may have ended).
    fn closed_by(&self, id: u64, close: AbortHandle) {
        if let Some(h) = self.lock().held.get_mut(&id) {
            h.close = Some(close);
        }
    }

    /// Connection `id`'s task runs: hyper is about to read what it sent.
    fn polled(&self, id: u64) {
        if let Some(h) = self.lock().held.get_mut(&id) {
            h.polled = true;
        }
    }

    /// Connection `id` began a request.
    fn touch(&self, id: u64) {
        if let Some(h) = self.lock().held.get_mut(&id) {
            h.active_at = Instant::now();
        }
    }

    /// Connection `id` ended (or was closed to make room).
    fn release(&self, id: u64) {
        self.lock().held.remove(&id);
        self.freed.notify_one();
    }

    /// Closes the quietest connection at once (accept failed for want of a file descriptor);
    /// whether there was one.
    fn evict_one(&self) -> bool {
        let mut t = self.lock();
        let Some((&id, _)) = t.held.iter().min_by_key(|(id, h)| (!h.polled, h.active_at, **id)) else { return false };
        let close = t.held.remove(&id).and_then(|h| h.close);
        drop(t);
        if let Some(close) = close {
            close.abort();
        }
        true
    }
}

/// Removes a connection's entry when its task ends, however it ends (finished, failed, aborted).
struct Release {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.connections.release(self.id);
    }
}

impl Endpoint {
    /// Binds `addr` and serves `/metrics` from `reader` on a thread of its own
    /// (`gpufrag-prometheus`, a one-worker Tokio runtime): HTTP/1.1 with keep-alive, up to
    /// [`MAX_CONNECTIONS`] held at once (past that the quietest is closed for each new one once
    /// it has been quiet for [`QUIET_BEFORE_CLOSING`]), each
    /// under [`HEADER_READ_TIMEOUT`] and [`CONNECTION_LIFETIME`], so no number of stalled or idle
    /// clients delays a scrape. `/healthz` and `/readyz` answer from `health`.
    pub fn start(addr: SocketAddr, reader: Reader, resource: Vec<(String, String)>, health: Arc<Health>) -> anyhow::Result<Endpoint> {
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
            let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }
                .context("the Prometheus endpoint's socket")?;
            socket.set_reuseaddr(true).context("the Prometheus endpoint's socket")?;
            socket.bind(addr).with_context(|| format!("binding the Prometheus endpoint to {addr}"))?;
            socket.listen(ACCEPT_BACKLOG).with_context(|| format!("listening on {addr} for the Prometheus endpoint"))?
        };
        let addr = listener.local_addr()?;
        let connections = Arc::new(Connections::default());
        runtime.spawn(accept(listener, Arc::new(Page { reader, resource, connections, health })));
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
    let connections = page.connections.clone();
    loop {
        while let Room::Wait(d) = connections.make_room() {
            let _ = tokio::time::timeout(d, connections.freed.notified()).await;
        }
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors: close the quietest connection and try again. Anything
                // else (a connection reset before it was accepted) concerns that one connection;
                // the pause keeps a persistent failure from spinning.
                let fds = matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
                if !(fds && connections.evict_one()) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                continue;
            }
        };
        let id = connections.admit();
        let release = Release { connections: connections.clone(), id };
        let page = page.clone();
        let task = tokio::spawn(async move {
            let _release = release;
            connection(stream, page, id).await;
        });
        connections.closed_by(id, task.abort_handle());
    }
}

async fn connection(stream: tokio::net::TcpStream, page: Arc<Page>, id: u64) {
    page.connections.polled(id);
    let _ = stream.set_nodelay(true);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_HEAD_BYTES);
    let service = service_fn(move |req: Request<Incoming>| {
        // Called as soon as hyper has parsed the head, in the same poll that read it.
        page.connections.touch(id);
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
        // Liveness: this thread answered; nothing else is looked at.
        (&Method::GET | &Method::HEAD, HEALTHZ) => (StatusCode::OK, "text/plain; charset=utf-8", "ok\n".to_string()),
        (&Method::GET | &Method::HEAD, READYZ) => {
            let (ready, why) = page.health.answer();
            (if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, "text/plain; charset=utf-8", why)
        }
        (&Method::GET | &Method::HEAD, "/") => {
            (StatusCode::OK, "text/plain; charset=utf-8", "gpufrag: metrics at /metrics, probes at /healthz and /readyz\n".to_string())
        }
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

    /// One request on a connection of its own: the status line and the body.
    fn get(addr: SocketAddr, path: &str) -> (String, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).unwrap();
        let (head, body) = buf.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    }

    #[test]
    fn probes_answer_liveness_always_and_readiness_from_the_health() {
        let store = Arc::new(super::super::store::Store::default());
        let health = Arc::new(Health::with_stall_after(Duration::from_millis(300)));
        let ep = Endpoint::start("127.0.0.1:0".parse().unwrap(), Reader::new(store), vec![], health.clone()).unwrap();
        let a = ep.addr();
        assert_eq!(get(a, HEALTHZ), ("HTTP/1.1 200 OK".into(), "ok\n".into()));
        let (st, body) = get(a, READYZ);
        assert_eq!(st, "HTTP/1.1 503 Service Unavailable", "{body}");
        assert!(body.contains("not in place"), "{body}");
        health.capture_started();
        let (st, body) = get(a, READYZ);
        assert_eq!(st, "HTTP/1.1 503 Service Unavailable", "attached, never ticked: {body}");
        health.beat();
        let (st, body) = get(a, READYZ);
        assert_eq!(st, "HTTP/1.1 200 OK", "{body}");
        // The loop stops ticking: not ready once the bound has passed; alive all along.
        std::thread::sleep(Duration::from_millis(450));
        let (st, body) = get(a, READYZ);
        assert_eq!(st, "HTTP/1.1 503 Service Unavailable", "{body}");
        assert!(body.contains("stalled"), "{body}");
        assert_eq!(get(a, HEALTHZ).0, "HTTP/1.1 200 OK");
        health.beat();
        assert_eq!(get(a, READYZ).0, "HTTP/1.1 200 OK");
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
