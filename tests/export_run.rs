//! `gpufrag run --otlp ...` and `gpufrag run --prometheus ...` end to end, the way a user runs
//! them: the simcuda stand-in workload under the LD_PRELOAD shim, a real collector (rotel-agent)
//! or a real Prometheus, and the exact figures that arrived compared with the summary the same
//! run wrote and with what the workload itself reports.
//!
//! Needs the workspace built (`cargo build --workspace --release`: `simcuda-workload`, the shim
//! and the stand-in libraries next to the `gpufrag` binary).

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

use export_support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The built pieces: gpufrag, the workload, the shim, the stand-in libraries.
struct Built {
    gpufrag: PathBuf,
    workload: PathBuf,
    preload: PathBuf,
    libs: PathBuf,
}

fn built() -> Option<Built> {
    let gpufrag = PathBuf::from(env!("CARGO_BIN_EXE_gpufrag"));
    // The other workspace members land next to the gpufrag binary; GPUFRAG_TEST_TARGET_DIR points
    // elsewhere when they were built apart.
    let dir = std::env::var_os("GPUFRAG_TEST_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| gpufrag.parent().unwrap().to_path_buf());
    let b =
        Built { gpufrag, workload: dir.join("simcuda-workload"), preload: dir.join("libgpufrag_preload.so"), libs: dir.join("simcuda") };
    let found =
        b.workload.is_file() && b.preload.is_file() && b.libs.join("libcuda.so.1").exists() && b.libs.join("libnvidia-ml.so.1").exists();
    require("the simcuda stand-ins and the shim", found.then(|| b.workload.clone()), "cargo build --workspace --release")?;
    Some(b)
}

impl Built {
    /// `gpufrag run [flags] -- simcuda-workload ARGS` on a private simulated 16 GiB machine.
    fn run(&self, state_dir: &Path, flags: &[String], workload_args: &[&str]) -> Command {
        let mut c = Command::new(&self.gpufrag);
        c.env("SIMCUDA_MEM", "16GiB").env("SIMCUDA_STATE_DIR", state_dir).env("LD_LIBRARY_PATH", &self.libs).env_remove("LD_PRELOAD");
        for v in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_METRIC_EXPORT_INTERVAL", "CUDA_VISIBLE_DEVICES"] {
            c.env_remove(v);
        }
        c.arg("run").arg("--quiet").arg("--preload").arg(&self.preload).args(flags).arg("--").arg(&self.workload).args(workload_args);
        c
    }

    /// The stand-in GPU 0's UUID, as its NVML reports it.
    fn uuid(&self, state_dir: &Path) -> String {
        let out = Command::new(&self.workload)
            .arg("nvml")
            .env("SIMCUDA_MEM", "16GiB")
            .env("SIMCUDA_STATE_DIR", state_dir)
            .env("LD_LIBRARY_PATH", &self.libs)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let kv = result_line(&text, "test=nvml").unwrap_or_else(|| panic!("no NVML result: {text}"));
        kv["uuid"].clone()
    }
}

/// The `key=value` pairs of the first line holding `marker`.
fn result_line(text: &str, marker: &str) -> Option<BTreeMap<String, String>> {
    let line = text.lines().find(|l| l.contains(marker))?;
    Some(line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("gpufrag run did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn u(v: &Value) -> String {
    v.as_u64().map(|x| x.to_string()).unwrap_or_else(|| v.to_string())
}

fn otlp_run_delivers_the_summary_figures(protocol: &str) {
    let Some(rotel_bin) = require("rotel-agent", rotel_agent(), "pip install rotel") else { return };
    let Some(b) = built() else { return };
    let dir = temp_dir(&format!("run-otlp-{}", protocol.replace('/', "-")));
    let uuid = b.uuid(&dir.join("sim-nvml"));
    let (grpc, http) = (free_port(), free_port());
    let rotel = Rotel::start(&rotel_bin, &dir, grpc, http);
    let port = if protocol == "grpc" { grpc } else { http };
    let summary = dir.join("summary.json");
    let flags = vec![
        "--otlp".to_string(),
        format!("http://127.0.0.1:{port}"),
        "--otlp-protocol".into(),
        protocol.into(),
        "--otlp-interval".into(),
        "300ms".into(),
        "--summary-json".into(),
        summary.display().to_string(),
    ];
    let started = Instant::now();
    let mut child = b.run(&dir.join("sim"), &flags, &["frag-oom"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let took = started.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.code().is_some(), "gpufrag run ended by a signal; stderr: {stderr}");
    assert!(!stderr.contains("failed"), "no export failure expected: {stderr}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let proc_summary = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["reserved"].as_u64().unwrap_or(0) > 0)
        .unwrap_or_else(|| panic!("no process held memory: {s}"));
    let pid = proc_summary["pid"].as_u64().unwrap().to_string();
    // The name is read from /proc when the process connects. frag-oom can be over by the time
    // its connection is handled: then only the zombie's `comm` is left, which the kernel cuts to
    // 15 characters, or nothing once `run` reaped it (docs/operations.md, "Known limits"; the
    // shim's hello carries the name, but observers do not see it yet).
    let name = rotel
        .wait_for(Duration::from_secs(10), |g| !points(g, "gpufrag.process.memory.reserved", &[("process.pid", &pid)]).is_empty())
        .iter()
        .find(|r| r.metric == "gpufrag.process.memory.reserved" && r.attrs.get("process.pid") == Some(&pid))
        .and_then(|r| r.attrs.get("process.executable.name").cloned())
        .unwrap_or_default();
    assert!(["simcuda-workload", "simcuda-workloa", "unknown"].contains(&name.as_str()), "process.executable.name {name:?}");
    let attrs = [("process.pid", pid.as_str()), ("process.executable.name", name.as_str()), ("hw.id", uuid.as_str())];
    let got = rotel.wait_for(Duration::from_secs(10), |g| {
        !points(g, "gpufrag.process.memory.largest_free_block", &attrs).is_empty()
            && !points(g, "gpufrag.memory.reserved", &[("hw.id", &uuid)]).is_empty()
    });
    let last = |metric: &str, with: &[(&str, &str)]| -> String {
        let p = points(&got, metric, with);
        assert!(
            !p.is_empty(),
            "{metric} {with:?} did not arrive; rotel got {:?}",
            got.iter().map(|r| (&r.metric, &r.attrs)).collect::<Vec<_>>()
        );
        p.last().unwrap().value.clone()
    };
    // The values that arrived are the summary's, to the byte.
    for (metric, field) in [
        ("gpufrag.process.memory.reserved", "reserved"),
        ("gpufrag.process.memory.allocated", "allocated"),
        ("gpufrag.process.memory.stranded", "stranded"),
        ("gpufrag.process.memory.releasable", "releasable"),
        ("gpufrag.process.memory.largest_free_block", "largest_free_block"),
        ("gpufrag.process.memory.largest_allocatable", "largest_allocatable"),
    ] {
        assert_eq!(last(metric, &attrs), u(&proc_summary[field]), "{metric}");
    }
    let dev = &s["devices"][0];
    for (metric, field) in [
        ("gpufrag.memory.reserved", "reserved"),
        ("gpufrag.memory.allocated", "allocated"),
        ("gpufrag.memory.stranded", "stranded"),
        ("gpufrag.memory.largest_free_block", "largest_free_block"),
    ] {
        assert_eq!(last(metric, &[("hw.id", &uuid)]), u(&dev[field]), "{metric}");
    }
    assert_eq!(last("gpufrag.allocations", &attrs), u(&proc_summary["allocs"]));
    // The OOM the workload ran into was counted under its verdict.
    let verdict = s["ooms"].as_array().unwrap().last().expect("frag-oom ends in an OOM")["verdict"].as_str().unwrap().to_string();
    let mut oom_attrs = attrs.to_vec();
    oom_attrs.push(("gpufrag.verdict", &verdict));
    assert_ne!(last("gpufrag.ooms", &oom_attrs), "0");
    // And they are the workload's own figures where the two levels meet: its caching
    // allocator's stranded bytes and largest free block (block level, when its blocks are seen).
    if proc_summary["level"] == "block" {
        let before = result_line(&stdout, "step=before_request").unwrap_or_else(|| panic!("workload output: {stdout}"));
        assert_eq!(last("gpufrag.process.memory.stranded", &attrs), before["stranded"]);
        assert_eq!(last("gpufrag.process.memory.largest_free_block", &attrs), before["largest_free_block"]);
    } else {
        eprintln!("note: the shim reported segments only for this workload; block-level figures not compared");
    }
    eprintln!("gpufrag run --otlp ({protocol}) took {took:?}; level {}", proc_summary["level"]);
    drop(rotel);
    cleanup(&dir);
}

#[test]
fn run_with_otlp_grpc_delivers_the_summary_figures() {
    otlp_run_delivers_the_summary_figures("grpc");
}

#[test]
fn run_with_otlp_http_delivers_the_summary_figures() {
    otlp_run_delivers_the_summary_figures("http/protobuf");
}

/// `gpufrag run --prometheus` while the workload holds 1 GiB: Prometheus scrapes it and its query
/// API returns the exact figures.
#[test]
fn run_with_prometheus_is_scraped_while_the_workload_runs() {
    let Some(prom_bin) = require("prometheus", prometheus(), "apt-get install prometheus") else { return };
    let Some(b) = built() else { return };
    let dir = temp_dir("run-prometheus");
    let uuid = b.uuid(&dir.join("sim-nvml"));
    let target = free_port();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpufrag\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")).unwrap();
    let prom_port = free_port();
    let prom = Guard {
        child: Command::new(&prom_bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        name: "prometheus",
    };
    let summary = dir.join("summary.json");
    let flags = vec!["--prometheus".to_string(), format!("127.0.0.1:{target}"), "--summary-json".into(), summary.display().to_string()];
    let mut run = b
        .run(&dir.join("sim"), &flags, &["hold", "1GiB"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let ready = lines.find_map(|l| l.ok().filter(|l| l.starts_with("READY"))).expect("the workload holds its memory");
    let kv = result_line(&ready, "READY").unwrap();
    let (pid, size) = (kv["pid"].clone(), kv["size"].clone());
    let started = Instant::now();
    let query = |q: &str| -> Option<String> {
        let enc: String =
            q.bytes().map(|c| if c.is_ascii_alphanumeric() { (c as char).to_string() } else { format!("%{c:02X}") }).collect();
        let body = http_get(prom_port, &format!("/api/v1/query?query={enc}"))?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str().map(String::from)
    };
    let sel = format!("process_pid=\"{pid}\",process_executable_name=\"simcuda-workload\",hw_id=\"{uuid}\"");
    let want_reserved = format!("gpufrag_process_memory_reserved_bytes{{{sel}}}");
    let mut got = None;
    while started.elapsed() < Duration::from_secs(30) {
        got = query(&want_reserved);
        if got.as_deref() == Some(size.as_str()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let scraped_after = started.elapsed();
    assert_eq!(got.as_deref(), Some(size.as_str()), "Prometheus has the held 1 GiB for pid {pid}");
    assert_eq!(query(&format!("gpufrag_process_memory_allocated_bytes{{{sel}}}")).as_deref(), Some(size.as_str()));
    assert_eq!(query(&format!("gpufrag_memory_reserved_bytes{{hw_id=\"{uuid}\"}}")).as_deref(), Some(size.as_str()));
    assert_eq!(query(&format!("gpufrag_allocations_total{{{sel}}}")).as_deref(), Some("1"));
    drop(run.stdin.take());
    let status = wait_exit(&mut run, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let p = s["processes"].as_array().unwrap().iter().find(|p| p["pid"].as_u64().map(|x| x.to_string()) == Some(pid.clone())).unwrap();
    assert_eq!(u(&p["allocs"]), "1");
    eprintln!("Prometheus had the figures {scraped_after:?} after the workload was ready");
    drop(prom);
    cleanup(&dir);
}
