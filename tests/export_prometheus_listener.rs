//! The Prometheus endpoint against hostile local clients (issue 14): an idle connection, a
//! request head sent in part and then stalled, a request whose answer is never read, and many
//! scrapes at once. Before, the endpoint served one connection at a time with a 5 s read timeout,
//! so one idle connection delayed every scrape from 0.4 ms to 4.9 s.
//!
//! Each scrape is a fresh TCP connection (`Connection: close`), as a plain client makes it; the
//! figures (median and worst, in ms) are printed past libtest's capture with `--nocapture`.

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

use export_support::*;
use gpufrag::export::prometheus::{Endpoint, HEADER_READ_TIMEOUT, MAX_CONNECTIONS};
use gpufrag::export::{self, ExportArgs};
use gpufrag::ingest::State;
use gpufrag::observe::Observer;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// On this loaded 2-core machine a scrape takes about a millisecond; a held connection may not
/// add more than this to any scrape.
const SCRAPE_BOUND: Duration = Duration::from_millis(200);

/// An endpoint on a free loopback port serving the frag_oom workload's figures, with the
/// exporter that owns it and the process that lends the workload its pid.
struct Served {
    exporter: export::Exporter,
    _sleeper: Guard,
}

impl Served {
    fn start() -> Served {
        let sleeper = stand_in_process();
        let args = ExportArgs { prometheus: Some("127.0.0.1:0".into()), nvml_lib: Some("none".into()), ..ExportArgs::default() };
        let mut exporter = export::exporter_from_args(&args, Arc::new(|s: &str| eprintln!("{s}"))).unwrap();
        let mut state = State::default();
        state.apply_all(&frag_oom_events(sleeper.child.id()));
        exporter.tick(&state);
        Served { exporter, _sleeper: sleeper }
    }

    fn addr(&self) -> SocketAddr {
        self.exporter.prometheus_addr().unwrap()
    }
}

/// One scrape on a connection of its own: the time it took and the body, or what went wrong.
fn scrape(addr: SocketAddr) -> Result<(Duration, String), String> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read after {:?}: {e}", t.elapsed()))?;
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else { return Err(format!("no head in {text:?}")) };
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("status: {head}"));
    }
    if !body.contains("gpufrag_memory_reserved_bytes{hw_id=\"gpu-0\"} 10485760000\n") {
        return Err(format!("body without the reserved figure: {body}"));
    }
    Ok((took, body.to_string()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median and worst of `n` scrapes one after the other.
fn scrapes(addr: SocketAddr, n: usize) -> (Duration, Duration) {
    let mut t: Vec<Duration> = (0..n).map(|i| scrape(addr).unwrap_or_else(|e| panic!("scrape {i}: {e}")).0).collect();
    t.sort();
    (t[n / 2], t[n - 1])
}

/// Whether the server closed `s` (EOF or reset) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // an error response before the close
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn scrapes_stay_fast_while_an_idle_connection_and_a_stalled_half_request_are_held_open() {
    let served = Served::start();
    let addr = served.addr();
    let (base_med, base_max) = scrapes(addr, 20);

    // Held open during the scrapes: a connection that sends nothing, one that sent half a request
    // head and stalled, one that sent a whole request and never reads its answer, and a
    // kept-alive connection left idle after its first answer.
    let mut idle = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Stalled: ").unwrap();
    let mut unread = TcpStream::connect(addr).unwrap();
    unread.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut kept = TcpStream::connect(addr).unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut first = [0u8; 512];
    let n = kept.read(&mut first).unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));

    let held_at = Instant::now();
    let (med, max) = scrapes(addr, 50);
    let during = held_at.elapsed();
    eprintln!(
        "scrape latency: alone median {:.2} ms, worst {:.2} ms; with idle, half-request, unread and kept-alive connections held open: median {:.2} ms, worst {:.2} ms (50 scrapes in {:.0} ms)",
        ms(base_med),
        ms(base_max),
        ms(med),
        ms(max),
        ms(during)
    );
    assert!(during < HEADER_READ_TIMEOUT, "the scrapes took {during:?}: the held connections may have been closed before they ended");
    assert!(
        max < SCRAPE_BOUND,
        "a scrape took {:.1} ms with connections held open (bound {:?}, median {:.2} ms)",
        ms(max),
        SCRAPE_BOUND,
        ms(med)
    );
    // The held connections were still open while the scrapes ran (none was closed to make room).
    for (name, s) in [("idle", &mut idle), ("half request", &mut half)] {
        assert!(!closed_within(s, Duration::from_millis(10)), "the {name} connection was closed during the scrapes");
    }
    drop(unread);
}

#[test]
fn an_idle_connection_and_a_stalled_half_request_are_closed_after_the_header_read_timeout() {
    let served = Served::start();
    let addr = served.addr();
    let t = Instant::now();
    let mut idle = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let limit = HEADER_READ_TIMEOUT + Duration::from_secs(3);
    assert!(closed_within(&mut idle, limit), "an idle connection was still open after {:?}", t.elapsed());
    let idle_at = t.elapsed();
    assert!(closed_within(&mut half, limit), "a stalled half request was still open after {:?}", t.elapsed());
    let half_at = t.elapsed();
    eprintln!(
        "closed by the server: idle connection after {:.2} s, stalled half request after {:.2} s (header read timeout {:?})",
        idle_at.as_secs_f64(),
        half_at.as_secs_f64(),
        HEADER_READ_TIMEOUT
    );
    assert!(idle_at >= HEADER_READ_TIMEOUT - Duration::from_millis(100), "closed after only {idle_at:?}");
    // The endpoint still answers.
    scrape(addr).unwrap();
}

#[test]
fn many_concurrent_scrapes_are_all_answered() {
    let served = Served::start();
    let addr = served.addr();
    // Four times as many clients as connections served at once, all started together, beside an
    // idle connection.
    let _idle = TcpStream::connect(addr).unwrap();
    let clients = 4 * MAX_CONNECTIONS;
    let gate = Arc::new(std::sync::Barrier::new(clients));
    let t = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.wait();
                scrape(addr)
            })
        })
        .collect();
    let results: Vec<Result<(Duration, String), String>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    let all = t.elapsed();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let mut took: Vec<Duration> = results.iter().filter_map(|r| r.as_ref().ok().map(|(d, _)| *d)).collect();
    took.sort();
    let bodies: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok().map(|(_, b)| b)).collect();
    eprintln!(
        "{clients} concurrent scrapes: {} answered in {:.0} ms, each median {:.1} ms, worst {:.1} ms",
        took.len(),
        ms(all),
        ms(took[took.len() / 2]),
        ms(took[took.len() - 1])
    );
    assert!(failed.is_empty(), "{} of {clients} scrapes failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
    // One view per collection: every answer carries the same figures.
    assert!(bodies
        .iter()
        .all(|b| b.lines().filter(|l| l.starts_with("gpufrag_memory")).eq(bodies[0].lines().filter(|l| l.starts_with("gpufrag_memory")))));
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection_and_head_has_no_body() {
    let served = Served::start();
    let addr = served.addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for _ in 0..3 {
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let (head, body) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
        assert!(body.contains("target_info{"), "{body}");
    }
    s.write_all(b"HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n").unwrap();
    s.write_all(b"GET /nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    // HEAD's answer has a head only: the next bytes are the POST's answer.
    let after_head = rest.split_once("\r\n\r\n").unwrap().1;
    assert!(rest.starts_with("HTTP/1.1 200"), "{rest}");
    assert!(after_head.starts_with("HTTP/1.1 405"), "{rest}");
    assert!(rest.contains("HTTP/1.1 404"), "{rest}");
}

#[test]
fn an_oversized_request_head_is_refused_and_the_endpoint_keeps_serving() {
    let served = Served::start();
    let addr = served.addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
    for i in 0..2000 {
        req.extend_from_slice(format!("X-Padding-{i}: {}\r\n", "a".repeat(64)).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    // The server may close before taking it all.
    let _ = s.write_all(&req);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 431"), "{got}");
    scrape(addr).unwrap();
}

#[test]
fn the_endpoint_stops_and_frees_its_port_when_dropped() {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let store = Arc::new(gpufrag::export::store::Store::default());
    let ep = Endpoint::start(addr, gpufrag::export::store::Reader::new(store), vec![], Default::default()).unwrap();
    let addr = ep.addr();
    let mut idle = TcpStream::connect(addr).unwrap();
    let t = Instant::now();
    drop(ep);
    let stopped = t.elapsed();
    assert!(stopped < Duration::from_secs(2), "stopping took {stopped:?}");
    assert!(closed_within(&mut idle, Duration::from_secs(2)), "a connection outlived its endpoint");
    assert!(TcpStream::connect(addr).is_err(), "the port still accepts after the endpoint was dropped");
}

/// One response of a kept-alive connection, by its Content-Length.
fn read_response(s: &mut TcpStream) -> (String, String) {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "connection closed inside a head");
        buf.push(b[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("a content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

/// Issue 27: the agent's probes share the endpoint's listener, so a full table of silent
/// connections (more than [`MAX_CONNECTIONS`] held open, none sending a byte) delays `/healthz`
/// and `/readyz` as little as it delays a scrape: each probe on a fresh connection is answered
/// within 1 s (the kubelet's timeout here is 2 s), `/readyz` with 503 since nothing attached.
#[test]
fn health_probes_are_answered_while_silent_connections_fill_the_table() {
    use gpufrag::export::prometheus::{HEALTHZ, READYZ};
    let served = Served::start();
    let addr = served.addr();
    let held: Vec<TcpStream> = (0..MAX_CONNECTIONS + 44).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut worst = Duration::ZERO;
    for (path, want) in [(HEALTHZ, "HTTP/1.1 200"), (READYZ, "HTTP/1.1 503"), (HEALTHZ, "HTTP/1.1 200"), (READYZ, "HTTP/1.1 503")] {
        let t = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        let took = t.elapsed();
        worst = worst.max(took);
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with(want), "{path} with {} silent connections held: {text}", held.len());
        assert!(took < Duration::from_secs(1), "{path} took {:.1} ms with {} silent connections held", ms(took), held.len());
    }
    eprintln!("probes beside {} silent connections: worst {:.1} ms", held.len(), ms(worst));
}
