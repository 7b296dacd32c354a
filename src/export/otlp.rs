//! OTLP metrics export: an OpenTelemetry SDK meter provider whose periodic reader runs on its own
//! thread, collects the [`METRICS`] catalogue through observable instruments (their callbacks
//! read the reader's current view of the latest snapshot) and sends it over gRPC (tonic, on a
//! one-worker Tokio runtime of our own) or http/protobuf (reqwest's blocking client).
//!
//! Nothing here runs on the capture path. The reader keeps no backlog: each interval it collects
//! the figures of that moment and makes one export (with the exporter's few retries); if the
//! collector is down, that export fails and the next interval's figures are the next try. So the
//! queue is bounded at one in-flight export, a long outage costs nothing but the points it
//! missed, and export resumes by itself when the collector is back. Each outage is reported once
//! on stderr, with the endpoint, and so is its end.

use super::catalog::{AttrValue, Kind, Value, ALLOC_SIZE, ALLOC_SIZE_HELP, METRICS};
use super::store::{HistPoint, Reader, BUCKETS};
use crate::ingest::histogram::BUCKET_BOUNDS;
use anyhow::Context;
use opentelemetry::metrics::{Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::Resource;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (port 4317 by convention).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318, path `/v1/metrics`).
    HttpProtobuf,
}

impl Protocol {
    /// The name `OTEL_EXPORTER_OTLP_PROTOCOL` uses.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Where and how to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The full endpoint URL (for HTTP including `/v1/metrics`).
    pub endpoint: String,
    /// The transport.
    pub protocol: Protocol,
    /// Collection and export interval.
    pub interval: Duration,
    /// Timeout of one export attempt; `None` leaves it to `OTEL_EXPORTER_OTLP_(METRICS_)TIMEOUT`.
    pub timeout: Option<Duration>,
}

/// Where failures and recoveries are reported (stderr in the binary; tests collect them).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Wraps the OTLP exporter: ends the reader's collection after each export and reports each
/// outage once, with the endpoint, and its end.
pub struct Watched<E> {
    inner: E,
    endpoint: String,
    reader: Arc<Reader>,
    failing: AtomicBool,
    log: Log,
    /// Exports that succeeded.
    pub ok: Arc<AtomicU64>,
}

impl<E> Watched<E> {
    /// Wraps `inner`, which sends to `endpoint`.
    pub fn new(inner: E, endpoint: &str, reader: Arc<Reader>, log: Log) -> Watched<E> {
        Watched { inner, endpoint: endpoint.to_string(), reader, failing: AtomicBool::new(false), log, ok: Arc::new(AtomicU64::new(0)) }
    }

    fn outcome(&self, r: &OTelSdkResult) {
        match r {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    (self.log)(&format!("gpufrag: OTLP export to {} works again", self.endpoint));
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    (self.log)(&format!(
                        "gpufrag: OTLP export to {} failed: {e}; capture goes on, and export resumes when the collector answers (reported once per outage)",
                        self.endpoint
                    ));
                }
            }
        }
    }
}

impl<E: PushMetricExporter> PushMetricExporter for Watched<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        self.reader.collected(r.is_ok());
        self.outcome(&r);
        r
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

fn key_values(attrs: &[(&'static str, AttrValue)]) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| match v {
            AttrValue::Int(i) => KeyValue::new(*k, *i),
            AttrValue::Str(s) => KeyValue::new(*k, s.to_string()),
            AttrValue::Static(s) => KeyValue::new(*k, *s),
        })
        .collect()
}

/// Mirrors the snapshot's exact, cumulative allocation-size histograms into an SDK histogram.
///
/// The SDK takes single measurements only, so each collection records, per device and level,
/// the values that account for what was added since the last one: for every new count in a
/// bucket one value inside that bucket, chosen so that the values also add up to the new sum.
/// Bucket counts, count and sum are then exactly the snapshot's; only the SDK's min and max are
/// those of the stand-in values (within the right buckets).
struct HistMirror {
    hist: Histogram<u64>,
    /// What was recorded so far per (device, level): bucket counts and sum.
    sent: Mutex<HashMap<(i16, &'static str), Sent>>,
}

type Sent = ([u64; BUCKETS], u64);

/// Values that fill `counts` (per bucket) and add up to `sum`, each inside its bucket
/// (`(bound[i-1], bound[i]]`), spread as evenly as the buckets allow: values of one size in one
/// bucket come out as that size.
pub fn stand_in_values(counts: &[u64; BUCKETS], sum: u64) -> Vec<u64> {
    let lo = |i: usize| if i == 0 { 0 } else { BUCKET_BOUNDS[i - 1] + 1 };
    let hi = |i: usize| BUCKET_BOUNDS.get(i).copied().unwrap_or(u64::MAX);
    // (floor, room above it), smallest room first: water-filling gives each the same share until
    // its bucket is full.
    let mut slots: Vec<(u64, u64)> = Vec::with_capacity(counts.iter().sum::<u64>() as usize);
    for (i, &n) in counts.iter().enumerate() {
        for _ in 0..n {
            slots.push((lo(i), hi(i) - lo(i)));
        }
    }
    let floor: u64 = slots.iter().map(|s| s.0).fold(0, u64::saturating_add);
    let mut rest = sum.saturating_sub(floor);
    slots.sort_by_key(|s| s.1);
    let mut out: Vec<u64> = Vec::with_capacity(slots.len());
    let n = slots.len();
    for (k, &(base, room)) in slots.iter().enumerate() {
        let share = rest / (n - k) as u64;
        let add = share.min(room);
        rest -= add;
        out.push(base + add);
    }
    // What integer division left over goes, one byte at a time, where there is room.
    for (v, &(base, room)) in out.iter_mut().zip(slots.iter()).rev() {
        if rest == 0 {
            break;
        }
        let add = rest.min(base + room - *v);
        *v += add;
        rest -= add;
    }
    out
}

impl HistMirror {
    fn record(&self, points: &[HistPoint]) {
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        for h in points {
            let prev = sent.entry((h.device, h.level)).or_insert(([0; BUCKETS], 0));
            let mut delta = [0u64; BUCKETS];
            let mut shrank = false;
            for ((d, now), before) in delta.iter_mut().zip(h.buckets.iter()).zip(prev.0.iter()) {
                shrank |= now < before;
                *d = now.saturating_sub(*before);
            }
            if shrank || h.sum < prev.1 {
                // The state was reset (cannot happen within one run): follow it without a jump.
                *prev = (h.buckets, h.sum);
                continue;
            }
            let attrs = key_values(&[("hw.id", AttrValue::Str(h.hw_id.clone())), ("gpufrag.level", AttrValue::Static(h.level))]);
            for v in stand_in_values(&delta, h.sum - prev.1) {
                self.hist.record(v, &attrs);
            }
            *prev = (h.buckets, h.sum);
        }
    }
}

fn register(meter: &Meter, reader: &Arc<Reader>) {
    for m in METRICS {
        let r = reader.clone();
        let points = m.points;
        match (m.kind, m.float) {
            (Kind::Gauge, false) => {
                meter
                    .u64_observable_gauge(m.name)
                    .with_unit(m.unit)
                    .with_description(m.help)
                    .with_callback(move |o| {
                        for p in points(&r.view()) {
                            if let Value::U64(v) = p.value {
                                o.observe(v, &key_values(&p.attrs));
                            }
                        }
                    })
                    .build();
            }
            (Kind::Gauge, true) => {
                meter
                    .f64_observable_gauge(m.name)
                    .with_unit(m.unit)
                    .with_description(m.help)
                    .with_callback(move |o| {
                        for p in points(&r.view()) {
                            if let Value::F64(v) = p.value {
                                o.observe(v, &key_values(&p.attrs));
                            }
                        }
                    })
                    .build();
            }
            (Kind::UpDownCounter, _) => {
                meter
                    .i64_observable_up_down_counter(m.name)
                    .with_unit(m.unit)
                    .with_description(m.help)
                    .with_callback(move |o| {
                        for p in points(&r.view()) {
                            if let Value::U64(v) = p.value {
                                o.observe(i64::try_from(v).unwrap_or(i64::MAX), &key_values(&p.attrs));
                            }
                        }
                    })
                    .build();
            }
            (Kind::Counter, _) => {
                meter
                    .u64_observable_counter(m.name)
                    .with_unit(m.unit)
                    .with_description(m.help)
                    .with_callback(move |o| {
                        for p in points(&r.view()) {
                            if let Value::U64(v) = p.value {
                                o.observe(v, &key_values(&p.attrs));
                            }
                        }
                    })
                    .build();
            }
        }
    }
    let mirror = Arc::new(HistMirror {
        hist: meter
            .u64_histogram(ALLOC_SIZE)
            .with_unit("By")
            .with_description(ALLOC_SIZE_HELP)
            .with_boundaries(BUCKET_BOUNDS.iter().map(|&b| b as f64).collect())
            .build(),
        sent: Mutex::new(HashMap::new()),
    });
    // The SDK runs every observable callback of a collection before it reads any aggregate
    // (opentelemetry_sdk's `Pipeline::produce`), so what this callback records lands in the same
    // collection. It observes nothing itself.
    let r = reader.clone();
    meter.u64_observable_gauge("gpufrag.internal.histogram_mirror").with_callback(move |_| mirror.record(&r.view().alloc_sizes)).build();
}

/// A running OTLP pipeline.
pub struct Pipeline {
    provider: SdkMeterProvider,
    /// Keeps tonic's channel alive (gRPC only); dropped after the provider is shut down.
    runtime: Option<tokio::runtime::Runtime>,
    /// Exports that succeeded.
    pub ok: Arc<AtomicU64>,
}

impl Pipeline {
    /// Starts exporting what `reader` sees.
    pub fn start(cfg: &Config, reader: Arc<Reader>, resource: Resource, log: Log) -> anyhow::Result<Pipeline> {
        let (exporter, runtime) = match cfg.protocol {
            Protocol::Grpc => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("gpufrag-otlp")
                    .enable_all()
                    .build()
                    .context("starting the OTLP/gRPC runtime")?;
                let _guard = rt.enter();
                let mut b = MetricExporter::builder().with_tonic().with_endpoint(cfg.endpoint.clone());
                if let Some(t) = cfg.timeout {
                    b = b.with_timeout(t);
                }
                (b.build().with_context(|| format!("setting up OTLP/gRPC export to {}", cfg.endpoint))?, Some(rt))
            }
            Protocol::HttpProtobuf => {
                let mut b = MetricExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(cfg.endpoint.clone());
                if let Some(t) = cfg.timeout {
                    b = b.with_timeout(t);
                }
                (b.build().with_context(|| format!("setting up OTLP/HTTP export to {}", cfg.endpoint))?, None)
            }
        };
        let watched = Watched::new(exporter, &cfg.endpoint, reader.clone(), log);
        let ok = watched.ok.clone();
        let periodic = PeriodicReader::builder(watched).with_interval(cfg.interval).build();
        let provider = SdkMeterProvider::builder().with_reader(periodic).with_resource(resource).build();
        let meter = provider.meter("gpufrag");
        register(&meter, &reader);
        Ok(Pipeline { provider, runtime, ok })
    }

    /// Exports the figures of this moment a last time and stops (at most about 5 s, the SDK's
    /// shutdown limit, when the collector does not answer).
    pub fn shutdown(mut self) -> OTelSdkResult {
        let r = self.provider.shutdown();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        r
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_values_keep_counts_and_sum_exact() {
        let mut counts = [0u64; BUCKETS];
        counts[0] = 2; // (0, 512]
        counts[1] = 1; // (512, 1024]
        counts[21] = 3; // (512 MiB, 1 GiB]
        counts[BUCKETS - 1] = 1; // > 64 GiB
        let sum = 100 + 512 + 1000 + 3 * (1 << 30) - 7 + (1 << 40);
        let v = stand_in_values(&counts, sum);
        assert_eq!(v.len(), 7);
        assert_eq!(v.iter().sum::<u64>(), sum);
        let mut got = [0u64; BUCKETS];
        for x in &v {
            got[BUCKET_BOUNDS.iter().position(|&b| *x <= b).unwrap_or(BUCKETS - 1)] += 1;
        }
        assert_eq!(got, counts);
        // One size in one bucket comes back as that size.
        let mut one = [0u64; BUCKETS];
        one[20] = 20;
        assert_eq!(stand_in_values(&one, 20 * 524_288_000), vec![524_288_000; 20]);
    }

    struct Flaky {
        fail: Arc<AtomicBool>,
    }

    impl PushMetricExporter for Flaky {
        async fn export(&self, _m: &ResourceMetrics) -> OTelSdkResult {
            if self.fail.load(Ordering::Relaxed) {
                Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure("connection refused".into()))
            } else {
                Ok(())
            }
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _t: Duration) -> OTelSdkResult {
            Ok(())
        }
        fn temporality(&self) -> Temporality {
            Temporality::Cumulative
        }
    }

    #[test]
    fn an_outage_is_reported_once_and_its_end_too() {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let l2 = lines.clone();
        let fail = Arc::new(AtomicBool::new(true));
        let reader = Arc::new(Reader::new(Arc::new(super::super::store::Store::default())));
        let w = Watched::new(
            Flaky { fail: fail.clone() },
            "http://127.0.0.1:1",
            reader,
            Arc::new(move |s: &str| l2.lock().unwrap().push(s.to_string())),
        );
        let rm = ResourceMetrics::default();
        let run = |w: &Watched<Flaky>| futures_lite_block_on(w.export(&rm));
        for _ in 0..5 {
            assert!(run(&w).is_err());
        }
        fail.store(false, Ordering::Relaxed);
        assert!(run(&w).is_ok());
        assert!(run(&w).is_ok());
        fail.store(true, Ordering::Relaxed);
        assert!(run(&w).is_err());
        let l = lines.lock().unwrap();
        assert_eq!(l.len(), 3, "{l:?}");
        assert!(l[0].contains("to http://127.0.0.1:1 failed: ") && l[0].contains("connection refused"), "{}", l[0]);
        assert!(l[1].contains("works again"), "{}", l[1]);
        assert_eq!(w.ok.load(Ordering::Relaxed), 2);
    }

    /// Polls a future that never waits (the fake exporter's) to completion.
    fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(f)
    }
}
