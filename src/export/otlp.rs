//! OTLP metrics export: one OpenTelemetry SDK meter provider per resource, the node's and one
//! per traced process, each with a manual reader, all collected in one round per interval by a
//! thread of our own and sent through one exporter over gRPC (tonic, on a one-worker Tokio
//! runtime of our own) or http/protobuf (reqwest's blocking client). The observable instruments
//! of the [`METRICS`] catalogue read that round's view of the latest snapshot: the node's
//! provider the device and global metrics and the allocation-size histogram, a process's provider
//! that process's series. So a process's series arrive under its own resource (its pid, its
//! container and pod: [`super::resource::process_resource`]), which the collector's
//! k8sattributes processor can enrich, as other eBPF agents report theirs; the SDK gives one
//! provider one resource, and an SDK `ResourceMetrics` cannot be built outside it.
//!
//! Nothing here runs on the capture path. The round keeps no backlog: each interval it collects
//! the figures of that moment and makes one export per resource (with the exporter's few
//! retries); if the collector is down, the first export fails, the round stops there, and the
//! next interval's figures are the next try. So at most one export is in flight, a long outage
//! costs nothing but the points it missed, and export resumes by itself when the collector is
//! back. Each outage is reported once on stderr, with the endpoint, and so is its end. A
//! process's provider is made when the process first appears in a view and dropped when it has
//! left the views (the exit rule of [`super::store`]): their number is that of the processes
//! exported.

use super::catalog::{AttrValue, Kind, Scope, Value, ALLOC_SIZE, ALLOC_SIZE_HELP, METRICS};
use super::store::{HistPoint, Reader, View, BUCKETS};
use crate::ingest::histogram::BUCKET_BOUNDS;
use anyhow::Context;
use opentelemetry::metrics::{AsyncInstrument, Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::Resource;
use std::collections::{BTreeMap, HashMap};
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
    /// The CA and client certificate files for an https:// endpoint.
    pub tls: super::tls::TlsFiles,
}

/// Where failures and recoveries are reported (stderr in the binary; tests collect them).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Wraps the OTLP exporter: counts the exports that succeeded and reports each outage once, with
/// the endpoint, and its end.
pub struct Watched<E> {
    inner: E,
    endpoint: String,
    failing: AtomicBool,
    log: Log,
    /// The transport's own error text, where the exporter drops it (HTTP).
    detail: Option<super::tls::Detail>,
    /// Exports that succeeded.
    pub ok: Arc<AtomicU64>,
}

impl<E> Watched<E> {
    /// Wraps `inner`, which sends to `endpoint`.
    pub fn new(inner: E, endpoint: &str, log: Log) -> Watched<E> {
        Watched {
            inner,
            endpoint: endpoint.to_string(),
            failing: AtomicBool::new(false),
            log,
            detail: None,
            ok: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Reads the transport's error text from `detail` when an export fails.
    pub fn with_detail(mut self, detail: Option<super::tls::Detail>) -> Watched<E> {
        self.detail = detail;
        self
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
                    // One line: the error's text may carry the transport's newlines.
                    let mut text = e.to_string();
                    if let Some(d) = self.detail.as_ref().and_then(|d| d.lock().unwrap_or_else(|p| p.into_inner()).take()) {
                        text = format!("{text} ({d})");
                    }
                    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
                    let fix = super::tls::advice(&text).map(|a| format!(" ({a})")).unwrap_or_default();
                    (self.log)(&format!(
                        "gpufrag: OTLP export to {} failed: {text}{fix}; capture goes on, and export resumes when the collector answers (reported once per outage)",
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

/// Where a provider's callbacks read the view of the round in progress.
type Slot = Arc<Mutex<Arc<View>>>;

fn view_of(slot: &Slot) -> Arc<View> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// One observable callback's work: the metric's points in the view of the round in progress,
/// each observed with its attributes when its value is of the instrument's type (`pick`).
fn observe<T>(slot: &Slot, points: fn(&View) -> Vec<super::catalog::Point>, pick: fn(Value) -> Option<T>, o: &dyn AsyncInstrument<T>) {
    for p in points(&view_of(slot)) {
        if let Some(v) = pick(p.value) {
            o.observe(v, &key_values(&p.attrs));
        }
    }
}

/// A count or byte figure.
fn as_u64(v: Value) -> Option<u64> {
    if let Value::U64(v) = v {
        Some(v)
    } else {
        None
    }
}

/// A ratio.
fn as_f64(v: Value) -> Option<f64> {
    if let Value::F64(v) = v {
        Some(v)
    } else {
        None
    }
}

/// Registers the metrics of `scope` on `meter`, reading `slot`; the node's also gets the
/// allocation-size histogram.
fn register(meter: &Meter, slot: &Slot, scope: Scope) {
    for m in METRICS.iter().filter(|m| m.scope == scope) {
        let r = slot.clone();
        let points = m.points;
        match (m.kind, m.float) {
            (Kind::Gauge, false) => {
                let b = meter.u64_observable_gauge(m.name).with_unit(m.unit).with_description(m.help);
                b.with_callback(move |o| observe(&r, points, as_u64, o)).build();
            }
            (Kind::Gauge, true) => {
                let b = meter.f64_observable_gauge(m.name).with_unit(m.unit).with_description(m.help);
                b.with_callback(move |o| observe(&r, points, as_f64, o)).build();
            }
            (Kind::UpDownCounter, _) => {
                let b = meter.i64_observable_up_down_counter(m.name).with_unit(m.unit).with_description(m.help);
                b.with_callback(move |o| observe(&r, points, |v| as_u64(v).map(|v| i64::try_from(v).unwrap_or(i64::MAX)), o)).build();
            }
            (Kind::Counter, _) => {
                let b = meter.u64_observable_counter(m.name).with_unit(m.unit).with_description(m.help);
                b.with_callback(move |o| observe(&r, points, as_u64, o)).build();
            }
        }
    }
    if scope != Scope::Node {
        return;
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
    let r = slot.clone();
    meter.u64_observable_gauge("gpufrag.internal.histogram_mirror").with_callback(move |_| mirror.record(&view_of(&r).alloc_sizes)).build();
}

/// A manual reader that the round keeps a handle to after the provider took it.
#[derive(Debug, Clone)]
struct Shared(Arc<ManualReader>);

impl MetricReader for Shared {
    fn register_pipeline(&self, pipeline: std::sync::Weak<opentelemetry_sdk::metrics::Pipeline>) {
        self.0.register_pipeline(pipeline);
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// One resource's meter provider, its reader and the slot its callbacks read.
struct Scoped {
    provider: SdkMeterProvider,
    reader: Shared,
    slot: Slot,
}

impl Scoped {
    fn new(resource: Resource, scope: Scope, temporality: Temporality) -> Scoped {
        let reader = Shared(Arc::new(ManualReader::builder().with_temporality(temporality).build()));
        let provider = SdkMeterProvider::builder().with_reader(reader.clone()).with_resource(resource).build();
        let slot: Slot = Arc::new(Mutex::new(Arc::new(View::default())));
        register(&provider.meter("gpufrag"), &slot, scope);
        Scoped { provider, reader, slot }
    }

    /// Collects this resource's figures of `view`.
    fn collect(&self, view: View) -> Result<ResourceMetrics, String> {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(view);
        let mut rm = ResourceMetrics::default();
        self.reader.collect(&mut rm).map_err(|e| e.to_string())?;
        Ok(rm)
    }
}

/// Polls a future on this thread until it is ready (the HTTP exporter's future does its work
/// in reqwest's blocking client and needs no runtime).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// What the round thread owns.
struct Rounds {
    exporter: Watched<MetricExporter>,
    runtime: Option<tokio::runtime::Runtime>,
    reader: Arc<Reader>,
    resource: Resource,
    node: Scoped,
    processes: BTreeMap<u32, Scoped>,
}

impl Rounds {
    fn send(&self, rm: &ResourceMetrics) -> OTelSdkResult {
        match &self.runtime {
            Some(rt) => rt.block_on(self.exporter.export(rm)),
            None => block_on(self.exporter.export(rm)),
        }
    }

    /// One collection: the node's resource, then each process's; stops at the first failed
    /// export (the collector is down or refuses: the rest would fail alike).
    fn round(&mut self) -> OTelSdkResult {
        let view = self.reader.view();
        let pids = view.pids();
        // Providers of processes no longer exported go; new ones come.
        self.processes.retain(|pid, s| {
            let keep = pids.contains(pid);
            if !keep {
                let _ = s.provider.shutdown();
            }
            keep
        });
        let temporality = self.exporter.temporality();
        for pid in &pids {
            if !self.processes.contains_key(pid) {
                if let Some(p) = view.processes.iter().find(|p| p.pid == *pid) {
                    let res = super::resource::process_resource(&self.resource, p);
                    self.processes.insert(*pid, Scoped::new(res, Scope::Process, temporality));
                }
            }
        }
        let mut result = Ok(());
        let mut batches = Vec::with_capacity(1 + pids.len());
        match self.node.collect(view.scoped(None)) {
            Ok(rm) => batches.push(rm),
            Err(e) => result = Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(e)),
        }
        for (pid, s) in &self.processes {
            match s.collect(view.scoped(Some(*pid))) {
                Ok(rm) => batches.push(rm),
                Err(e) => result = Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(e)),
            }
        }
        for rm in &batches {
            if let Err(e) = self.send(rm) {
                result = Err(e);
                break;
            }
        }
        self.reader.collected(result.is_ok());
        result
    }

    fn run(mut self, interval: Duration, stop: std::sync::mpsc::Receiver<()>) -> OTelSdkResult {
        // Until shutdown (or the pipeline dropped): a round per interval; then the last one.
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(interval) {
            let _ = self.round();
        }
        let last = self.round();
        for s in self.processes.values() {
            let _ = s.provider.shutdown();
        }
        let _ = self.node.provider.shutdown();
        let closed = self.exporter.shutdown_with_timeout(Duration::from_secs(1));
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        last.and(closed)
    }
}

/// A running OTLP pipeline.
pub struct Pipeline {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<OTelSdkResult>>,
    /// Exports that succeeded (one per resource per round).
    pub ok: Arc<AtomicU64>,
}

impl Pipeline {
    /// Starts exporting what `reader` sees; `resource` is the node's.
    pub fn start(cfg: &Config, reader: Arc<Reader>, resource: Resource, log: Log) -> anyhow::Result<Pipeline> {
        let tls = super::tls::load(&cfg.tls)?;
        let mut detail = None;
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
                if cfg.endpoint.starts_with("https://") {
                    b = b.with_tls_config(super::tls::grpc_config(&tls));
                }
                if let Some(t) = cfg.timeout {
                    b = b.with_timeout(t);
                }
                (b.build().with_context(|| format!("setting up OTLP/gRPC export to {}", cfg.endpoint))?, Some(rt))
            }
            Protocol::HttpProtobuf => {
                // Our own client (the builder's default cannot take a CA or a client certificate),
                // with the timeout the builder would give its own.
                let client =
                    super::tls::KeepingErrors::new(super::tls::http_client(&tls, cfg.timeout.unwrap_or_else(super::tls::env_timeout))?);
                detail = Some(client.detail.clone());
                let mut b = MetricExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(cfg.endpoint.clone());
                if let Some(t) = cfg.timeout {
                    b = b.with_timeout(t);
                }
                (b.build().with_context(|| format!("setting up OTLP/HTTP export to {}", cfg.endpoint))?, None)
            }
        };
        let exporter = Watched::new(exporter, &cfg.endpoint, log).with_detail(detail);
        let ok = exporter.ok.clone();
        let node = Scoped::new(resource.clone(), Scope::Node, exporter.temporality());
        let rounds = Rounds { exporter, runtime, reader, resource, node, processes: BTreeMap::new() };
        let (tx, rx) = std::sync::mpsc::channel();
        let interval = cfg.interval;
        let thread = std::thread::Builder::new()
            .name("gpufrag-otlp-rounds".into())
            .spawn(move || rounds.run(interval, rx))
            .context("starting the OTLP export thread")?;
        Ok(Pipeline { stop: Some(tx), thread: Some(thread), ok })
    }

    /// Exports the figures of this moment a last time and stops (one export's timeout and
    /// retries at most when the collector does not answer: the last round stops at its first
    /// failure).
    pub fn shutdown(mut self) -> OTelSdkResult {
        drop(self.stop.take());
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure("the OTLP export thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // Dropped without shutdown (an error path): stop the thread without waiting for it.
        drop(self.stop.take());
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
        let w = Watched::new(
            Flaky { fail: fail.clone() },
            "http://127.0.0.1:1",
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
