//! Metrics export from the live state: OTLP (gRPC or http/protobuf) to an OpenTelemetry
//! collector, and a Prometheus text endpoint, both fed from one observer.
//!
//! The observer's `tick` (on the live loop) turns the state into a small snapshot and swaps it
//! into a store; the OTLP reader thread and the Prometheus server thread read it from there
//! ([`store`]), so export never runs on the capture path and a slow or absent collector never
//! slows capture. [`catalog`] defines every metric once (names, units, attributes; docs in
//! docs/operations.md); [`otlp`] and [`prometheus`] are its two outlets; [`resource`] says who
//! reports; [`gpu`] names devices (`hw.id`). `finish` exports the final figures and shuts down.
//!
//! Configuration follows the OpenTelemetry environment variables, each with a flag that wins
//! over it: `--otlp` / `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`),
//! `--otlp-protocol` / `OTEL_EXPORTER_OTLP_PROTOCOL`, `--otlp-interval` /
//! `OTEL_METRIC_EXPORT_INTERVAL`; `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` are read as the specification says. An
//! https:// collector is reached over TLS ([`tls`]: the system's CA certificates, `--otlp-ca` /
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`, and a client certificate for mTLS).

pub mod catalog;
pub mod gpu;
pub mod health;
pub mod otlp;
pub mod prometheus;
pub mod resource;
pub mod store;
pub mod tls;

use crate::event::Event;
use crate::ingest::State;
use crate::observe::Observer;
use anyhow::{bail, Context};
use otlp::{Config, Log, Pipeline, Protocol};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{Builder, Reader, Store};

/// Export interval when neither `--otlp-interval` nor `OTEL_METRIC_EXPORT_INTERVAL` is given.
/// Shorter than the SDK's 60 s: memory runs out within seconds, and a scrape or export of one
/// node's figures costs next to nothing.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Timeout of one export attempt unless `OTEL_EXPORTER_OTLP_(METRICS_)TIMEOUT` sets one: short,
/// so that the final export of a short run cannot hold the exit up for long.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// Export flags shared by `run`, `attach` and `agent`.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ExportArgs {
    /// Send metrics over OTLP to this collector. A base URL: http://HOST:4317 for gRPC,
    /// http://HOST:4318 for http/protobuf (which appends /v1/metrics).
    #[arg(long = "otlp", value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp: Option<String>,
    /// OTLP transport: grpc or http/protobuf (default: grpc when the URL's port is 4317, else
    /// http/protobuf).
    #[arg(long, value_name = "PROTOCOL", env = "OTEL_EXPORTER_OTLP_PROTOCOL", value_parser = parse_protocol)]
    pub otlp_protocol: Option<Protocol>,
    /// Time between OTLP exports: 500ms, 10s, 1m, or a number of milliseconds [default: 10s].
    #[arg(long, value_name = "DURATION", env = "OTEL_METRIC_EXPORT_INTERVAL", value_parser = parse_interval)]
    pub otlp_interval: Option<Duration>,
    /// Trust this CA (PEM) for an https:// collector, beside the system's CA certificates.
    #[arg(long, value_name = "FILE", env = "OTEL_EXPORTER_OTLP_CERTIFICATE")]
    pub otlp_ca: Option<std::path::PathBuf>,
    /// Present this client certificate (PEM) to an https:// collector that requires one (mTLS);
    /// with --otlp-client-key.
    #[arg(long, value_name = "FILE", env = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")]
    pub otlp_client_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM); with --otlp-client-cert.
    #[arg(long, value_name = "FILE", env = "OTEL_EXPORTER_OTLP_CLIENT_KEY")]
    pub otlp_client_key: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics. ADDR is PORT or HOST:PORT; a bare port
    /// or no value binds 127.0.0.1 (default 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = prometheus::DEFAULT_ADDR)]
    pub prometheus: Option<String>,
    /// NVML library to name GPUs with (`none`: do not use NVML; GPUs are then gpu-<index>).
    #[arg(long, value_name = "PATH", env = "GPUFRAG_NVML_LIB", hide = true)]
    pub nvml_lib: Option<String>,
}

/// Parses `grpc`, `http/protobuf` (and `http/json`, sent as http/protobuf with a warning).
pub fn parse_protocol(s: &str) -> Result<Protocol, String> {
    match s.trim() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" | "http" => Ok(Protocol::HttpProtobuf),
        "http/json" => {
            eprintln!("gpufrag: OTLP http/json is not supported; sending http/protobuf");
            Ok(Protocol::HttpProtobuf)
        }
        other => Err(format!("unknown OTLP protocol {other:?} (grpc or http/protobuf)")),
    }
}

/// Parses `500ms`, `10s`, `1.5s`, `2m`, or a number of milliseconds (the unit of
/// `OTEL_METRIC_EXPORT_INTERVAL`).
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 0.001)
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("not a duration: {s:?} (e.g. 500ms, 10s, 1m, or milliseconds)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("the interval must be positive, not {s:?}"));
    }
    // Checked: `99999999999999999999s` is finite but no Duration (issue 14: it panicked).
    match Duration::try_from_secs_f64(v * scale) {
        Ok(d) if d <= Duration::from_secs(365 * 24 * 3600) => Ok(d.max(Duration::from_millis(1))),
        _ => Err(format!("the interval {s:?} is longer than a year")),
    }
}

fn env_nonempty(var: &str) -> Option<String> {
    std::env::var(var).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn port_of(url: &str) -> Option<u16> {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or("");
    authority.rsplit(':').next().and_then(|p| p.parse().ok())
}

/// The OTLP configuration the flags and environment ask for, if any.
pub fn otlp_config(args: &ExportArgs) -> anyhow::Result<Option<Config>> {
    let (url, is_base) = match args.otlp.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(u) => (u.to_string(), true),
        None => match env_nonempty("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
            Some(u) => (u, false),
            None => return Ok(None),
        },
    };
    let url = if url.contains("://") { url } else { format!("http://{url}") };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("--otlp {url}: the collector URL must be http:// or https://");
    }
    let protocol = match args.otlp_protocol {
        Some(p) => p,
        None => match env_nonempty("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") {
            Some(p) => parse_protocol(&p).map_err(anyhow::Error::msg)?,
            None if port_of(&url) == Some(4317) => Protocol::Grpc,
            None => Protocol::HttpProtobuf,
        },
    };
    let endpoint = match protocol {
        Protocol::HttpProtobuf if is_base && !url.trim_end_matches('/').ends_with("/v1/metrics") => {
            format!("{}/v1/metrics", url.trim_end_matches('/'))
        }
        _ => url,
    };
    let timeout = if env_nonempty("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT").is_some() || env_nonempty("OTEL_EXPORTER_OTLP_TIMEOUT").is_some() {
        None
    } else {
        Some(DEFAULT_TIMEOUT)
    };
    let tls =
        tls::TlsFiles { ca: args.otlp_ca.clone(), client_cert: args.otlp_client_cert.clone(), client_key: args.otlp_client_key.clone() };
    if tls.any() && !endpoint.starts_with("https://") {
        bail!("--otlp {endpoint}: --otlp-ca and the client certificate are for a TLS collector; its URL must be https://");
    }
    Ok(Some(Config { endpoint, protocol, interval: args.otlp_interval.unwrap_or(DEFAULT_INTERVAL), timeout, tls }))
}

/// The observers the flags ask for.
pub fn observers(args: &ExportArgs) -> anyhow::Result<Vec<Box<dyn Observer>>> {
    let otlp = otlp_config(args)?;
    let prom = args.prometheus.as_deref().map(prometheus::resolve_addr).transpose()?;
    if otlp.is_none() && prom.is_none() {
        return Ok(Vec::new());
    }
    let log: Log = Arc::new(|s: &str| eprintln!("{s}"));
    let e = Exporter::start(otlp.as_ref(), prom, args.nvml_lib.as_deref(), log.clone())?;
    if let Some(c) = &otlp {
        log(&format!("gpufrag: sending metrics over OTLP ({}) to {} every {:?}", c.protocol.name(), c.endpoint, c.interval));
    }
    if let Some(a) = e.prometheus_addr() {
        log(&format!("gpufrag: Prometheus metrics at http://{a}/metrics"));
    }
    Ok(vec![Box::new(e)])
}

/// The export observer: builds snapshots on `tick`, feeds the OTLP pipeline and the Prometheus
/// endpoint, and flushes and shuts down on `finish`.
pub struct Exporter {
    builder: Builder,
    store: Arc<Store>,
    otlp: Option<Pipeline>,
    otlp_ok: Option<Arc<std::sync::atomic::AtomicU64>>,
    prometheus: Option<prometheus::Endpoint>,
    health: Arc<health::Health>,
    log: Log,
}

impl Exporter {
    /// Starts the outlets asked for. NVML is loaded from `nvml_lib` (default
    /// `libnvidia-ml.so.1`, `none` for none); `log` receives export failures and recoveries.
    pub fn start(otlp: Option<&Config>, prometheus: Option<SocketAddr>, nvml_lib: Option<&str>, log: Log) -> anyhow::Result<Exporter> {
        let store = Arc::new(Store::default());
        let res = resource::resource();
        let health = Arc::new(health::Health::default());
        let prometheus = match prometheus {
            Some(addr) => Some(prometheus::Endpoint::start(addr, Reader::new(store.clone()), resource::attributes(&res), health.clone())?),
            None => None,
        };
        let otlp = match otlp {
            Some(c) => Some(Pipeline::start(c, Arc::new(Reader::new(store.clone())), res, log.clone())?),
            None => None,
        };
        let otlp_ok = otlp.as_ref().map(|p| p.ok.clone());
        Ok(Exporter { builder: Builder::new(gpu::GpuIds::new(nvml_lib)), store, otlp, otlp_ok, prometheus, health, log })
    }

    /// Where the Prometheus endpoint listens.
    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.prometheus.as_ref().map(prometheus::Endpoint::addr)
    }

    /// OTLP exports that reached the collector so far.
    pub fn otlp_delivered(&self) -> u64 {
        self.otlp_ok.as_ref().map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Observer for Exporter {
    fn tick(&mut self, state: &State) {
        self.store.put(self.builder.build(state));
        self.health.beat();
    }

    fn capture_started(&mut self) {
        self.health.capture_started();
    }

    fn event(&mut self, _state: &State, ev: &Event) {
        // A process's name is read when it starts, while it surely runs: a short one is gone by
        // the next tick. One compare per event otherwise.
        if ev.kind == crate::event::EventKind::ProcessExec as u16 {
            self.builder.note_process(ev.pid);
        }
    }

    fn finish(&mut self, state: &State) {
        self.tick(state);
        if let Some(p) = self.otlp.take() {
            if let Err(e) = p.shutdown() {
                (self.log)(&format!("gpufrag: the final OTLP export did not complete: {e}"));
            }
        }
    }
}

/// Feeds `events` through the export observers in real time, as `run` would: applies them,
/// then ticks every 500 ms for `hold`, then finishes (final export). For tests and demos of the
/// export path without a GPU.
pub fn replay(events: &[Event], exporter: &mut Exporter, hold: Duration) {
    let mut state = State::default();
    for e in events {
        state.apply(e);
        exporter.event(&state, e);
    }
    exporter.tick(&state);
    let end = Instant::now() + hold;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500).min(end.saturating_duration_since(Instant::now())));
        exporter.tick(&state);
    }
    // The end of the run, as `Live::finish` has it: what nothing recovered is an OOM.
    state.settle_all();
    exporter.finish(&state);
}

/// Builds an [`Exporter`] from flags, for [`replay`].
pub fn exporter_from_args(args: &ExportArgs, log: Log) -> anyhow::Result<Exporter> {
    let otlp = otlp_config(args)?;
    let prom = args.prometheus.as_deref().map(prometheus::resolve_addr).transpose()?;
    Exporter::start(otlp.as_ref(), prom, args.nvml_lib.as_deref(), log).context("starting the exporters")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Issue 14: `--otlp-interval 99999999999999999999s` panicked in `Duration::from_secs_f64`.
    #[test]
    fn regression_a_huge_otlp_interval_is_an_error_not_a_panic() {
        assert!(parse_interval("99999999999999999999s").expect_err("too long").contains("longer than a year"));
        assert!(parse_interval("1e300m").is_err());
        assert!(parse_interval("nan").is_err() && parse_interval("inf").is_err());
    }

    #[test]
    fn intervals_parse_like_the_environment_variable() {
        assert_eq!(parse_interval("1500"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn endpoints_follow_the_otlp_rules() {
        let a = |u: &str, p: Option<Protocol>| ExportArgs { otlp: Some(u.into()), otlp_protocol: p, ..ExportArgs::default() };
        let c = otlp_config(&a("http://c:4318", None)).unwrap().unwrap();
        assert_eq!((c.endpoint.as_str(), c.protocol), ("http://c:4318/v1/metrics", Protocol::HttpProtobuf));
        let c = otlp_config(&a("c:4317", None)).unwrap().unwrap();
        assert_eq!((c.endpoint.as_str(), c.protocol), ("http://c:4317", Protocol::Grpc));
        let c = otlp_config(&a("http://c:9000/", Some(Protocol::HttpProtobuf))).unwrap().unwrap();
        assert_eq!(c.endpoint, "http://c:9000/v1/metrics");
        let c = otlp_config(&a("http://c:9000/v1/metrics", Some(Protocol::HttpProtobuf))).unwrap().unwrap();
        assert_eq!(c.endpoint, "http://c:9000/v1/metrics");
        assert!(otlp_config(&a("ftp://c", None)).is_err());
        assert_eq!(c.interval, DEFAULT_INTERVAL);
    }
}
