//! The Prometheus endpoint against a real Prometheus (Debian's `prometheus` package): the
//! frag_oom workload goes through the export observer, Prometheus scrapes it every second with
//! gpufrag's alert rules loaded, and the test reads the exact values back through the HTTP query
//! API, sees the fragmentation alerts go pending and firing, and sees an exited process exported
//! once more and then dropped.

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

use export_support::*;
use gpufrag::event::{Event, EventKind};
use gpufrag::export::{self, ExportArgs};
use gpufrag::ingest::State;
use gpufrag::observe::Observer;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

struct Prom {
    _guard: Guard,
    port: u16,
}

impl Prom {
    fn query(&self, q: &str) -> Vec<Value> {
        let body = http_get(self.port, &format!("/api/v1/query?query={}", encode(q))).unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The single value of `q`, waiting up to `within` for it to be `want`.
    fn wait_value(&self, q: &str, want: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let r = self.query(q);
            let got = r.first().and_then(|s| s["value"][1].as_str()).unwrap_or("").to_string();
            if got == want || Instant::now() > end {
                return got;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn alerts(&self) -> Vec<Value> {
        let body = http_get(self.port, "/api/v1/alerts").unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["data"]["alerts"].as_array().cloned().unwrap_or_default()
    }
}

fn start_prometheus(bin: &Path, dir: &Path, target: u16) -> Prom {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/gpufrag-alerts.yaml");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: gpufrag\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(bin)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let guard = Guard { child, name: "prometheus" };
    let end = Instant::now() + Duration::from_secs(30);
    while http_get(port, "/-/ready").is_none() {
        assert!(
            Instant::now() < end,
            "prometheus did not get ready; log: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Prom { _guard: guard, port }
}

#[test]
fn prometheus_scrapes_exact_figures_and_the_alerts_fire() {
    let Some(bin) = require("prometheus", prometheus(), "apt-get install prometheus") else { return };
    let dir = temp_dir("prometheus");
    let sleeper = stand_in_process();
    let pid = sleeper.child.id();
    let target = free_port();
    let args = ExportArgs { prometheus: Some(format!("127.0.0.1:{target}")), nvml_lib: Some("none".into()), ..ExportArgs::default() };
    let mut exporter = export::exporter_from_args(&args, Arc::new(|s: &str| eprintln!("{s}"))).unwrap();
    assert_eq!(exporter.prometheus_addr().unwrap().to_string(), format!("127.0.0.1:{target}"));
    let mut state = State::default();
    state.apply_all(&frag_oom_events(pid));
    exporter.tick(&state);

    // The endpoint itself: names, types and labels as a collector's Prometheus exporter has them.
    let text = http_get(target, "/metrics").unwrap();
    assert!(text.contains("# TYPE gpufrag_memory_reserved_bytes gauge\n"), "{text}");
    assert!(text.contains(&format!("gpufrag_memory_reserved_bytes{{hw_id=\"gpu-0\"}} {RESERVED}\n")), "{text}");
    assert!(text.contains("# TYPE gpufrag_ooms_total counter\n"));
    assert!(text.contains("# TYPE gpufrag_allocation_size_bytes histogram\n"));
    assert!(text.contains("# TYPE hw_gpu_memory_utilization_ratio gauge\n"));
    assert!(text.contains("target_info{"));

    let started = Instant::now();
    let prom = start_prometheus(&bin, &dir, target);
    let ready = started.elapsed();
    let p = format!("process_pid=\"{pid}\",process_executable_name=\"sleep\",hw_id=\"gpu-0\"");
    let w = Duration::from_secs(20);
    assert_eq!(prom.wait_value(&format!("gpufrag_process_memory_reserved_bytes{{{p}}}"), &RESERVED.to_string(), w), RESERVED.to_string());
    let scraped = started.elapsed();
    let exact = |q: &str, want: String| assert_eq!(prom.wait_value(q, &want, Duration::from_secs(2)), want, "{q}");
    exact(&format!("gpufrag_process_memory_allocated_bytes{{{p}}}"), ALLOCATED.to_string());
    exact(&format!("gpufrag_process_memory_stranded_bytes{{{p}}}"), STRANDED.to_string());
    exact(&format!("gpufrag_process_memory_largest_free_block_bytes{{{p}}}"), LARGEST_FREE_BLOCK.to_string());
    exact(&format!("gpufrag_process_memory_largest_allocatable_bytes{{{p}}}"), LARGEST_ALLOCATABLE.to_string());
    exact(&format!("gpufrag_ooms_total{{{p},gpufrag_verdict=\"fragmentation\"}}"), "1".into());
    exact(&format!("gpufrag_allocations_total{{{p}}}"), "50".into());
    exact("gpufrag_memory_reserved_bytes{hw_id=\"gpu-0\"}", RESERVED.to_string());
    exact("gpufrag_memory_allocated_bytes{hw_id=\"gpu-0\"}", ALLOCATED.to_string());
    exact("gpufrag_memory_stranded_bytes{hw_id=\"gpu-0\"}", STRANDED.to_string());
    exact("gpufrag_memory_largest_free_block_bytes{hw_id=\"gpu-0\"}", LARGEST_FREE_BLOCK.to_string());
    exact("gpufrag_memory_device_free_bytes{hw_id=\"gpu-0\"}", DEVICE_FREE.to_string());
    exact("gpufrag_memory_fragmentation_ratio{hw_id=\"gpu-0\"}", "0.4674461323147797".into());
    exact("hw_gpu_memory_limit_bytes{hw_id=\"gpu-0\",hw_type=\"gpu\"}", DEVICE_TOTAL.to_string());
    exact("gpufrag_allocation_size_bytes_bucket{hw_id=\"gpu-0\",gpufrag_level=\"block\",le=\"536870912\"}", "30".into());
    exact("gpufrag_allocation_size_bytes_bucket{hw_id=\"gpu-0\",gpufrag_level=\"block\",le=\"268435456\"}", "0".into());
    exact("gpufrag_allocation_size_bytes_count{hw_id=\"gpu-0\",gpufrag_level=\"block\"}", "30".into());
    exact("gpufrag_allocation_size_bytes_sum{hw_id=\"gpu-0\",gpufrag_level=\"block\"}", "13631488000".into());
    exact("count(target_info{service_name=\"gpufrag\"})", "1".into());

    // The alert rules of deploy/ judge the same series: fragmented (pending: its `for` is 15m),
    // and a fragmentation OOM (firing).
    let end = Instant::now() + Duration::from_secs(10);
    let state_of = |alerts: &[Value], name: &str| {
        alerts.iter().find(|a| a["labels"]["alertname"] == name).and_then(|a| a["state"].as_str().map(String::from))
    };
    let mut alerts = prom.alerts();
    while (state_of(&alerts, "GPUMemoryFragmented").is_none() || state_of(&alerts, "GPUFragmentationOOM").as_deref() != Some("firing"))
        && Instant::now() < end
    {
        std::thread::sleep(Duration::from_millis(300));
        alerts = prom.alerts();
    }
    assert_eq!(state_of(&alerts, "GPUMemoryFragmented").as_deref(), Some("pending"), "{alerts:?}");
    assert_eq!(state_of(&alerts, "GPUFragmentationOOM").as_deref(), Some("firing"), "{alerts:?}");
    let frag = alerts.iter().find(|a| a["labels"]["alertname"] == "GPUMemoryFragmented").unwrap();
    assert_eq!(frag["labels"]["hw_id"], "gpu-0");

    // The process exits: exported once more (Prometheus stored its last figures), then dropped
    // (the series goes stale), and the device's sums follow.
    state.apply(&Event::new(EventKind::ProcessExit, pid, -1));
    exporter.tick(&state);
    assert_eq!(prom.wait_value("gpufrag_memory_reserved_bytes{hw_id=\"gpu-0\"}", "0", Duration::from_secs(10)), "0");
    let gone = prom.query(&format!("gpufrag_process_memory_reserved_bytes{{{p}}}"));
    assert!(gone.is_empty(), "the exited process is dropped: {gone:?}");
    exact(&format!("last_over_time(gpufrag_process_memory_reserved_bytes{{{p}}}[5m])"), RESERVED.to_string());
    exporter.finish(&state);
    drop(exporter);
    eprintln!("prometheus ready after {ready:?}, first exact scrape after {scraped:?}, test took {:?}", started.elapsed());
    drop(prom);
    cleanup(&dir);
}
