//! deploy/ checked: every YAML and JSON file parses; the DaemonSet keeps the privileges it
//! documents and no more; the alert rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), the example Prometheus configuration `promtool check config`; every
//! PromQL expression of the dashboard is valid PromQL; every metric name the alerts, the
//! dashboard and docs/operations.md use is one gpufrag exports, and the docs list them all.

#![allow(clippy::unwrap_used)]

mod tool_support;
mod export_support;

use export_support::*;
use gpufrag::export::catalog::{prometheus_name, Kind, ALLOC_SIZE, METRICS};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p, ext));
        } else if ext.iter().any(|x| p.extension().is_some_and(|e| e == *x)) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Python 3 with PyYAML (Debian: python3-yaml), the YAML parser these checks use.
fn python_yaml() -> Option<PathBuf> {
    let ok = Command::new("python3").args(["-c", "import yaml"]).status().map(|s| s.success()).unwrap_or(false);
    ok.then(|| PathBuf::from("python3"))
}

/// Every document of a YAML file, as JSON.
fn yaml_docs(py: &Path, file: &Path) -> Vec<Value> {
    let out = Command::new(py)
        .args(["-c", "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))"])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{} is not valid YAML: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

/// Every name gpufrag exports, as Prometheus shows it (histogram series included).
fn exported_names() -> BTreeSet<String> {
    let mut n: BTreeSet<String> = METRICS.iter().map(|m| prometheus_name(m.name, m.unit, m.kind, false)).collect();
    let h = prometheus_name(ALLOC_SIZE, "By", Kind::Counter, true);
    for s in ["_bucket", "_sum", "_count"] {
        n.insert(format!("{h}{s}"));
    }
    n.insert(h);
    n.insert("target_info".into());
    // Label names that share the prefix.
    n.insert("gpufrag_level".into());
    n.insert("gpufrag_verdict".into());
    n
}

/// Metric-like names in a text: gpufrag_* and hw_gpu_*.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !text.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &text[i..];
        if (rest.starts_with("gpufrag_") || rest.starts_with("hw_gpu_")) && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b'.')) {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            out.insert(rest[..end].to_string());
            i += end;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn yaml_and_json_files_parse() {
    let Some(py) = require("python3 with PyYAML", python_yaml(), "apt-get install python3-yaml") else { return };
    let yamls = files(&root().join("deploy"), &["yaml", "yml"]);
    assert!(yamls.len() >= 6, "{yamls:?}");
    for f in &yamls {
        assert!(!yaml_docs(&py, f).is_empty(), "{} is empty", f.display());
    }
    for f in files(&root().join("deploy"), &["json"]) {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(v.is_object());
    }
}

#[test]
fn the_daemonset_has_the_privileges_it_documents_and_no_more() {
    let Some(py) = require("python3 with PyYAML", python_yaml(), "apt-get install python3-yaml") else { return };
    let docs = yaml_docs(&py, &root().join("deploy/kubernetes/daemonset.yaml"));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_ne!(pod["hostNetwork"], true, "no host network");
    assert_ne!(pod["hostIPC"], true, "no host IPC");
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0], "agent");
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let mut add: Vec<&str> = sc["capabilities"]["add"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    add.sort_unstable();
    assert_eq!(add, ["BPF", "PERFMON", "SYS_PTRACE"]);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    // Every host path is mounted read-only.
    let vols = pod["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = vols.iter().find(|v| v["name"] == m["name"]).unwrap();
        if v.get("hostPath").is_some() {
            assert_eq!(m["readOnly"], true, "{m}");
        }
    }
    assert!(vols.iter().any(|v| v["hostPath"]["path"] == "/sys/kernel/btf"));
    // The downward-API variables the resource reads.
    let env = c["env"].as_array().unwrap();
    for (var, field) in [("K8S_NODE_NAME", "spec.nodeName"), ("K8S_POD_NAME", "metadata.name"), ("K8S_NAMESPACE_NAME", "metadata.namespace")] {
        let e = env.iter().find(|e| e["name"] == var).unwrap_or_else(|| panic!("{var} missing"));
        assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
    for (var, _) in gpufrag::export::resource::K8S_VARS {
        assert!(env.iter().any(|e| e["name"] == var), "{var} is read by the resource but not set");
    }
    assert!(env.iter().any(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT"));
    assert!(c["resources"]["limits"]["memory"].is_string() && c["resources"]["limits"]["cpu"].is_string());
    // The collector the agents send to exists, and its config is mounted.
    let coll = yaml_docs(&py, &root().join("deploy/kubernetes/collector.yaml"));
    assert!(coll.iter().any(|d| d["kind"] == "Service" && d["metadata"]["name"] == "gpufrag-collector"));
    let cfg = &yaml_docs(&py, &root().join("deploy/kubernetes/otel-collector-config.yaml"))[0];
    assert_eq!(cfg["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"], true);
    assert_eq!(cfg["service"]["pipelines"]["metrics"]["receivers"], serde_json::json!(["otlp"]));
}

fn promtool_ok(args: &[&str], dir: &Path) {
    let Some(tool) = require("promtool", promtool(), "apt-get install prometheus") else { return };
    let out = Command::new(tool).args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "promtool {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = root().join("deploy/prometheus");
    promtool_ok(&["check", "rules", "gpufrag-alerts.yaml"], &dir);
    promtool_ok(&["test", "rules", "gpufrag-alerts.test.yaml"], &dir);
    promtool_ok(&["check", "config", "prometheus.yaml"], &dir);
}

#[test]
fn dashboard_queries_are_valid_promql() {
    let Some(_) = require("promtool", promtool(), "apt-get install prometheus") else { return };
    let d: Value = serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/gpufrag-dashboard.json")).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10);
    // As recording rules, with Grafana's variables filled in, promtool parses every expression.
    let dir = temp_dir("dashboard-promql");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$instance", ".*").replace("$gpu", ".*");
        rules.push_str(&format!("      - record: dashboard:expr{i}\n        expr: {}\n", serde_json::to_string(&e).unwrap()));
    }
    std::fs::write(dir.join("dashboard.rules.yaml"), rules).unwrap();
    promtool_ok(&["check", "rules", "dashboard.rules.yaml"], &dir);
    cleanup(&dir);
}

#[test]
fn every_metric_name_used_is_exported_and_documented() {
    let known = exported_names();
    for f in ["deploy/prometheus/gpufrag-alerts.yaml", "deploy/grafana/gpufrag-dashboard.json", "docs/operations.md"] {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        let used = names_in(&text);
        assert!(!used.is_empty(), "{f} uses no metric");
        let unknown: Vec<_> = used.difference(&known).collect();
        assert!(unknown.is_empty(), "{f} uses names gpufrag does not export: {unknown:?}");
    }
    // docs/operations.md lists every metric under both names.
    let docs = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    for m in METRICS {
        assert!(docs.contains(&format!("`{}`", m.name)), "docs/operations.md does not list {}", m.name);
        assert!(docs.contains(&format!("`{}`", prometheus_name(m.name, m.unit, m.kind, false))), "docs/operations.md lacks the Prometheus name of {}", m.name);
    }
    assert!(docs.contains(&format!("`{ALLOC_SIZE}`")));
}
