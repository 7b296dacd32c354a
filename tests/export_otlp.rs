//! OTLP export against a real collector (rotel-agent, `pip install rotel`), over both transports:
//! the frag_oom workload goes through the export observer in real time, and the test asserts the
//! exact values that arrived, with their attributes; then a collector outage.

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

use export_support::*;
use gpufrag::export::otlp::Protocol;
use gpufrag::export::{self, ExportArgs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn args(endpoint: String, protocol: Protocol, interval: Duration) -> ExportArgs {
    ExportArgs {
        otlp: Some(endpoint),
        otlp_protocol: Some(protocol),
        otlp_interval: Some(interval),
        prometheus: None,
        nvml_lib: Some("none".into()),
        ..Default::default()
    }
}

fn log_sink() -> (export::otlp::Log, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = lines.clone();
    (Arc::new(move |s: &str| l2.lock().unwrap().push(s.to_string())), lines)
}

fn value_of(got: &[Received], metric: &str, with: &[(&str, &str)]) -> String {
    let p = points(got, metric, with);
    assert!(
        !p.is_empty(),
        "no {metric} {with:?} arrived; got metrics {:?}",
        got.iter().map(|r| &r.metric).collect::<std::collections::BTreeSet<_>>()
    );
    let last = p.last().unwrap();
    last.value.clone()
}

/// Runs frag_oom through an exporter pointed at a fresh rotel-agent, then checks every figure.
fn exact_values_arrive(protocol: Protocol) {
    let Some(bin) = require("rotel-agent", rotel_agent(), "pip install rotel") else { return };
    let dir = temp_dir(&format!("otlp-{}", protocol.name().replace('/', "-")));
    let (grpc, http) = (free_port(), free_port());
    let rotel = Rotel::start(&bin, &dir, grpc, http);
    let url = match protocol {
        Protocol::Grpc => format!("http://127.0.0.1:{grpc}"),
        Protocol::HttpProtobuf => format!("http://127.0.0.1:{http}"),
    };
    let sleeper = stand_in_process();
    let pid = sleeper.child.id();
    let (log, lines) = log_sink();
    let mut exporter = export::exporter_from_args(&args(url, protocol, Duration::from_millis(500)), log).unwrap();
    let started = Instant::now();
    export::replay(&frag_oom_events(pid), &mut exporter, Duration::from_millis(1200));
    assert!(exporter.otlp_delivered() >= 2, "periodic exports and the final one: {}", exporter.otlp_delivered());
    let pid_s = pid.to_string();
    let proc_attrs = [("process.pid", pid_s.as_str()), ("process.executable.name", "sleep"), ("hw.id", "gpu-0")];
    let got = rotel.wait_for(Duration::from_secs(10), |g| {
        !points(g, "gpufrag.allocation.size", &[]).is_empty() && !points(g, "gpufrag.process.memory.reserved", &proc_attrs).is_empty()
    });
    eprintln!("{} points arrived within {:?}", got.len(), started.elapsed());
    // Per process × device, with its attributes.
    assert_eq!(value_of(&got, "gpufrag.process.memory.reserved", &proc_attrs), RESERVED.to_string());
    assert_eq!(value_of(&got, "gpufrag.process.memory.allocated", &proc_attrs), ALLOCATED.to_string());
    assert_eq!(value_of(&got, "gpufrag.process.memory.stranded", &proc_attrs), STRANDED.to_string());
    assert_eq!(value_of(&got, "gpufrag.process.memory.largest_free_block", &proc_attrs), LARGEST_FREE_BLOCK.to_string());
    assert_eq!(value_of(&got, "gpufrag.process.memory.releasable", &proc_attrs), "0");
    assert_eq!(value_of(&got, "gpufrag.process.memory.largest_allocatable", &proc_attrs), LARGEST_ALLOCATABLE.to_string());
    let frag: f64 = value_of(&got, "gpufrag.process.memory.fragmentation", &proc_attrs).parse().unwrap();
    assert!((frag - 0.4674461323147797).abs() < 1e-12, "{frag}");
    assert_eq!(value_of(&got, "gpufrag.allocations", &proc_attrs), "50");
    assert_eq!(value_of(&got, "gpufrag.frees", &proc_attrs), "10");
    let mut verdict = proc_attrs.to_vec();
    verdict.push(("gpufrag.verdict", "fragmentation"));
    assert_eq!(value_of(&got, "gpufrag.ooms", &verdict), "1");
    verdict.pop();
    verdict.push(("gpufrag.verdict", "true_oom"));
    assert_eq!(value_of(&got, "gpufrag.ooms", &verdict), "0");
    // Per device.
    let dev = [("hw.id", "gpu-0")];
    assert_eq!(value_of(&got, "gpufrag.memory.reserved", &dev), RESERVED.to_string());
    assert_eq!(value_of(&got, "gpufrag.memory.allocated", &dev), ALLOCATED.to_string());
    assert_eq!(value_of(&got, "gpufrag.memory.stranded", &dev), STRANDED.to_string());
    assert_eq!(value_of(&got, "gpufrag.memory.largest_free_block", &dev), LARGEST_FREE_BLOCK.to_string());
    assert_eq!(value_of(&got, "gpufrag.memory.device_free", &dev), DEVICE_FREE.to_string());
    assert_eq!(value_of(&got, "gpufrag.memory.unattributed", &dev), "0");
    assert_eq!(value_of(&got, "hw.gpu.memory.limit", &[("hw.id", "gpu-0"), ("hw.type", "gpu")]), DEVICE_TOTAL.to_string());
    assert_eq!(value_of(&got, "hw.gpu.memory.usage", &dev), (DEVICE_TOTAL - DEVICE_FREE).to_string());
    // Each process point names its caching allocator from a bounded set (the trace's blocks are PyTorch's).
    for r in got.iter().filter(|r| r.metric.starts_with("gpufrag.process.")) {
        assert_eq!(r.attrs.get("gpufrag.framework").map(String::as_str), Some("pytorch"), "{}: {:?}", r.metric, r.attrs);
    }
    // Device-level points carry no process attributes; no point carries more than the bounded set.
    for r in &got {
        for k in r.attrs.keys() {
            assert!(
                [
                    "process.pid",
                    "process.executable.name",
                    "hw.id",
                    "hw.type",
                    "gpufrag.verdict",
                    "gpufrag.level",
                    "gpufrag.framework",
                    "gpufrag.oom.holders"
                ]
                .contains(&k.as_str()),
                "unexpected attribute {k} on {}",
                r.metric
            );
        }
    }
    assert!(points(&got, "gpufrag.memory.reserved", &[]).iter().all(|r| !r.attrs.contains_key("process.pid")));
    // Units.
    assert_eq!(points(&got, "gpufrag.memory.reserved", &dev)[0].unit, "By");
    assert_eq!(points(&got, "gpufrag.memory.fragmentation", &dev)[0].unit, "1");
    // The allocation-size histogram: 30 blocks (20 × 500 MiB, 10 × 300 MiB) and 20 segments of
    // 500 MiB, all in the (256 MiB, 512 MiB] bucket.
    let blocks = points(&got, "gpufrag.allocation.size", &[("hw.id", "gpu-0"), ("gpufrag.level", "block")]);
    let h = blocks.last().expect("a block histogram point");
    assert_eq!(h.count.as_deref(), Some("30"));
    assert_eq!(h.value, "13631488000");
    let nonzero: Vec<(usize, &String)> = h.buckets.iter().enumerate().filter(|(_, c)| c.as_str() != "0").collect();
    assert_eq!(nonzero, vec![(20, &"30".to_string())], "buckets {:?}", h.buckets);
    // The resource.
    assert_eq!(h.resource.get("service.name").map(String::as_str), Some("gpufrag"));
    assert!(h.resource.contains_key("host.name"));
    assert!(lines.lock().unwrap().is_empty(), "no failure was expected: {:?}", lines.lock().unwrap());
    drop(rotel);
    cleanup(&dir);
}

#[test]
fn grpc_delivers_exact_figures_to_a_real_collector() {
    exact_values_arrive(Protocol::Grpc);
}

#[test]
fn http_protobuf_delivers_exact_figures_to_a_real_collector() {
    exact_values_arrive(Protocol::HttpProtobuf);
}

/// Start with the collector down, start it later: metrics arrive without a restart, and the
/// outage is reported once, with the endpoint.
#[test]
fn export_resumes_by_itself_when_the_collector_comes_up() {
    let Some(bin) = require("rotel-agent", rotel_agent(), "pip install rotel") else { return };
    let dir = temp_dir("otlp-outage");
    let (grpc, http) = (free_port(), free_port());
    let sleeper = stand_in_process();
    let pid = sleeper.child.id();
    let (log, lines) = log_sink();
    let url = format!("http://127.0.0.1:{grpc}");
    let mut exporter = export::exporter_from_args(&args(url.clone(), Protocol::Grpc, Duration::from_millis(500)), log).unwrap();
    let events = frag_oom_events(pid);
    let feeder = std::thread::spawn(move || {
        export::replay(&events, &mut exporter, Duration::from_secs(6));
        exporter.otlp_delivered()
    });
    std::thread::sleep(Duration::from_secs(2));
    let failed_before = lines.lock().unwrap().clone();
    let rotel = Rotel::start(&bin, &dir, grpc, http);
    let came_up = Instant::now();
    let pid_s = pid.to_string();
    let got =
        rotel.wait_for(Duration::from_secs(10), |g| !points(g, "gpufrag.process.memory.reserved", &[("process.pid", &pid_s)]).is_empty());
    let latency = came_up.elapsed();
    assert_eq!(value_of(&got, "gpufrag.process.memory.reserved", &[("process.pid", &pid_s)]), RESERVED.to_string());
    assert!(latency < Duration::from_secs(4), "the first export after the collector came up took {latency:?}");
    let delivered = feeder.join().unwrap();
    assert!(delivered >= 3, "exports kept going while capture went on: {delivered}");
    assert_eq!(failed_before.len(), 1, "one report for the outage: {failed_before:?}");
    assert!(failed_before[0].contains(&url), "{}", failed_before[0]);
    let all = lines.lock().unwrap().clone();
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all[1].contains("works again") && all[1].contains(&url), "{}", all[1]);
    eprintln!("metrics arrived {latency:?} after the collector came up");
    drop(rotel);
    cleanup(&dir);
}

/// Issue 26, item 5: per-process series arrive at a real collector under one OTLP resource per
/// process, carrying that process's `process.pid`, `container.id` and `k8s.*` (what a
/// collector's k8sattributes processor matches on), while the device series stay under the
/// node's resource, with none of them.
#[test]
fn each_process_arrives_under_a_resource_of_its_own_with_its_container_and_pod() {
    use gpufrag::attribution::Identity;
    use gpufrag::observe::Observer;
    let Some(bin) = require("rotel-agent", rotel_agent(), "pip install rotel") else { return };
    let dir = temp_dir("otlp-resources");
    let (grpc, http) = (free_port(), free_port());
    let rotel = Rotel::start(&bin, &dir, grpc, http);
    let (one, two) = (stand_in_process(), stand_in_process());
    let who = [
        (one.child.id(), "a".repeat(64), "0b8e3c1a-1111-4a5b-8c7d-000000000001", "trainer-0", "ml", "main"),
        (two.child.id(), "b".repeat(64), "0b8e3c1a-2222-4a5b-8c7d-000000000002", "eval-3", "research", "worker"),
    ];
    let (log, lines) = log_sink();
    let mut exporter =
        export::exporter_from_args(&args(format!("http://127.0.0.1:{grpc}"), Protocol::Grpc, Duration::from_millis(500)), log).unwrap();
    let mut state = gpufrag::ingest::State::default();
    for (pid, ctr, uid, pod, ns, c) in &who {
        state.identities.insert(
            *pid,
            Arc::new(Identity {
                exe: "sleep".into(),
                container_id: Some(ctr.clone()),
                container_runtime: Some("containerd"),
                pod_uid: Some(uid.to_string()),
                pod_name: Some(pod.to_string()),
                namespace: Some(ns.to_string()),
                container_name: Some(c.to_string()),
                identity_source: Some("pod-resources"),
                assigned_gpus: None,
            }),
        );
        for e in frag_oom_events(*pid) {
            state.apply(&e);
            exporter.event(&state, &e);
        }
    }
    exporter.tick(&state);
    std::thread::sleep(Duration::from_millis(1200));
    exporter.tick(&state);
    state.settle_all();
    exporter.finish(&state);
    let pids: Vec<String> = who.iter().map(|w| w.0.to_string()).collect();
    let got = rotel.wait_for(Duration::from_secs(10), |g| {
        pids.iter().all(|p| !points(g, "gpufrag.process.memory.reserved", &[("process.pid", p)]).is_empty())
            && !points(g, "gpufrag.memory.reserved", &[]).is_empty()
    });
    let mut resources = std::collections::BTreeSet::new();
    for (pid, ctr, uid, pod, ns, c) in &who {
        let pid_s = pid.to_string();
        let mine: Vec<&Received> = got.iter().filter(|r| r.attrs.get("process.pid") == Some(&pid_s)).collect();
        assert!(mine.iter().any(|r| r.metric == "gpufrag.process.memory.reserved") && mine.iter().any(|r| r.metric == "gpufrag.ooms"));
        for r in &mine {
            let res = |k: &str| r.resource.get(k).map(String::as_str);
            assert_eq!(
                (
                    res("process.pid"),
                    res("container.id"),
                    res("k8s.pod.uid"),
                    res("k8s.pod.name"),
                    res("k8s.namespace.name"),
                    res("k8s.container.name")
                ),
                (Some(pid_s.as_str()), Some(ctr.as_str()), Some(*uid), Some(*pod), Some(*ns), Some(*c)),
                "{}: resource {:?}",
                r.metric,
                r.resource
            );
            assert_eq!(res("service.name"), Some("gpufrag"), "the node's attributes too: {:?}", r.resource);
            resources.insert(format!("{:?}", r.resource));
        }
    }
    assert_eq!(resources.len(), 2, "one resource per process: {resources:#?}");
    for r in points(&got, "gpufrag.memory.reserved", &[]) {
        for k in ["process.pid", "container.id", "k8s.pod.name", "k8s.namespace.name", "k8s.container.name", "k8s.pod.uid"] {
            assert!(!r.resource.contains_key(k), "a device series under a process's resource: {:?}", r.resource);
        }
    }
    assert!(lines.lock().unwrap().is_empty(), "no failure was expected: {:?}", lines.lock().unwrap());
    drop(rotel);
    cleanup(&dir);
}
