//! deploy/ checked: every YAML and JSON file parses; the DaemonSet keeps the privileges it
//! documents and no more; the alert rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), the example Prometheus configuration `promtool check config`; every
//! PromQL expression of the dashboard is valid PromQL; every metric name the alerts, the
//! dashboard and docs/operations.md use is one gpufrag exports, and the docs list them all; every
//! kustomization under deploy/ builds with a real kustomize and what it builds validates.

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

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
        if (rest.starts_with("gpufrag_") || rest.starts_with("hw_gpu_"))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b'.'))
        {
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
    let docs = yaml_docs(&py, &root().join("deploy/kubernetes/base/daemonset.yaml"));
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
    assert_eq!(add, ["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"]);
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
    for (var, field) in
        [("K8S_NODE_NAME", "spec.nodeName"), ("K8S_POD_NAME", "metadata.name"), ("K8S_NAMESPACE_NAME", "metadata.namespace")]
    {
        let e = env.iter().find(|e| e["name"] == var).unwrap_or_else(|| panic!("{var} missing"));
        assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
    for (var, _) in gpufrag::export::resource::K8S_VARS {
        assert!(env.iter().any(|e| e["name"] == var), "{var} is read by the resource but not set");
    }
    assert!(env.iter().any(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT"));
    assert!(c["resources"]["limits"]["memory"].is_string() && c["resources"]["limits"]["cpu"].is_string());
    // The collector the agents send to exists, and its config is mounted.
    let coll = yaml_docs(&py, &root().join("deploy/kubernetes/base/collector.yaml"));
    assert!(coll.iter().any(|d| d["kind"] == "Service" && d["metadata"]["name"] == "gpufrag-collector"));
    let cfg = &yaml_docs(&py, &root().join("deploy/kubernetes/base/otel-collector-config.yaml"))[0];
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
    for a in d["annotations"]["list"].as_array().unwrap() {
        if let Some(e) = a["expr"].as_str() {
            exprs.push(e.to_string());
        }
    }
    // As recording rules, with Grafana's variables filled in, promtool parses every expression.
    let dir = temp_dir("dashboard-promql");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$__range", "1h")
            .replace("$instance", ".*")
            .replace("$gpu", ".*")
            .replace("$node", ".*")
            .replace("$namespace", ".*")
            .replace("$pod", ".*");
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
        assert!(
            docs.contains(&format!("`{}`", prometheus_name(m.name, m.unit, m.kind, false))),
            "docs/operations.md lacks the Prometheus name of {}",
            m.name
        );
    }
    assert!(docs.contains(&format!("`{ALLOC_SIZE}`")));
}

/// `kubernetes-validate` (PyPI): `$KUBERNETES_VALIDATE`, on PATH, or in the virtual environment
/// .ci/run installs it into.
fn kubernetes_validate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUBERNETES_VALIDATE").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(p) =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join("kubernetes-validate")).find(|f| f.is_file()))
    {
        return Some(p);
    }
    Some(PathBuf::from("/opt/gpufrag-ci/kubernetes-validate/bin/kubernetes-validate")).filter(|p| p.is_file())
}

/// The Kubernetes releases the manifests are validated against: the ones supported upstream
/// when this was written, and the newest kubernetes-validate knows.
const KUBERNETES_VERSIONS: [&str; 5] = ["1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"];

#[test]
fn manifests_validate_against_current_kubernetes_versions() {
    let Some(kv) = require(
        "kubernetes-validate",
        kubernetes_validate(),
        "python3 -m venv /opt/gpufrag-ci/kubernetes-validate && /opt/gpufrag-ci/kubernetes-validate/bin/pip install kubernetes-validate",
    ) else {
        return;
    };
    let dir = root().join("deploy/kubernetes/base");
    // The built-in kinds (the Prometheus Operator's custom resources have no schema there:
    // checked by the test below).
    let manifests: Vec<PathBuf> = ["namespace.yaml", "daemonset.yaml", "collector.yaml"].iter().map(|f| dir.join(f)).collect();
    for v in KUBERNETES_VERSIONS {
        let out = Command::new(&kv).args(["--strict", "-k", v]).args(&manifests).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && !text.contains("ERROR"), "kubernetes-validate --strict -k {v}:\n{text}");
        for kind in [
            "namespace/gpufrag",
            "resourcequota/gpufrag-node-critical",
            "serviceaccount/gpufrag-agent",
            "daemonset/gpufrag-agent",
            "deployment/gpufrag-collector",
            "service/gpufrag-collector",
        ] {
            assert!(text.contains(&format!("passed for resource {kind} against version")), "{kind} not validated against {v}:\n{text}");
        }
    }
}

#[test]
fn the_manifests_run_on_gpu_nodes_as_docs_say() {
    let Some(py) = require("python3 with PyYAML", python_yaml(), "apt-get install python3-yaml") else { return };
    let k = root().join("deploy/kubernetes/base");
    let ds_docs = yaml_docs(&py, &k.join("daemonset.yaml"));
    let ds = ds_docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let env = pod["containers"][0]["env"].as_array().unwrap();
    let var = |n: &str| env.iter().find(|e| e["name"] == n).map(|e| e["value"].clone()).unwrap_or(Value::Null);
    assert_eq!(var("NVIDIA_VISIBLE_DEVICES"), "all");
    let caps_var = var("NVIDIA_DRIVER_CAPABILITIES");
    let caps: BTreeSet<&str> = caps_var.as_str().unwrap().split(',').collect();
    assert_eq!(caps, BTreeSet::from(["compute", "utility"]), "NVML and libcuda, no more");
    assert!(pod["containers"][0]["resources"]["limits"].get("nvidia.com/gpu").is_none(), "the agent requests no GPU");
    // system-node-critical outside kube-system comes with its quota.
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let ns = yaml_docs(&py, &k.join("namespace.yaml"));
    let quota = ns.iter().find(|d| d["kind"] == "ResourceQuota").expect("a ResourceQuota for system-node-critical");
    assert_eq!(quota["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let scope = &quota["spec"]["scopeSelector"]["matchExpressions"][0];
    assert_eq!((scope["scopeName"].as_str(), scope["values"][0].as_str()), (Some("PriorityClass"), Some("system-node-critical")));
    // The image is named once and overridden in the kustomization.
    let image = pod["containers"][0]["image"].as_str().unwrap();
    let kust = &yaml_docs(&py, &k.join("kustomization.yaml"))[0];
    assert!(
        kust["images"].as_array().unwrap().iter().any(|i| i["name"] == image && i["newName"].is_string() && i["newTag"].is_string()),
        "{kust}"
    );
    // The PrometheusRule carries exactly the rule file's groups, each alert with its runbook_url.
    let rules = &yaml_docs(&py, &root().join("deploy/prometheus/gpufrag-alerts.yaml"))[0];
    let po = root().join("deploy/kubernetes/prometheus-operator");
    let pr = yaml_docs(&py, &po.join("prometheusrule.yaml"));
    assert_eq!(pr[0]["kind"], "PrometheusRule");
    assert_eq!(pr[0]["spec"]["groups"], rules["groups"], "prometheusrule.yaml drifted from gpufrag-alerts.yaml");
    for g in rules["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let url = r["annotations"]["runbook_url"].as_str().unwrap_or_else(|| panic!("{} has no runbook_url", r["alert"]));
            assert!(url.starts_with("https://") && url.contains("docs/operations.md#"), "{url}");
            // a predicted OOM (foresight) has its own runbook: checkpoint now
            if r["alert"] == "GpuMemoryPredictedOOM" {
                assert!(url.ends_with("#runbook-predicted-oom-checkpoint-now"), "{}: {url}", r["alert"]);
                let ops = std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
                assert!(ops.contains("## Runbook: predicted OOM, checkpoint now"), "the runbook's heading is gone");
            } else if r["labels"]["severity"] != "info" {
                assert!(url.ends_with("#runbook-alert-drain-the-node-resume-from-a-checkpoint"), "{}: {url}", r["alert"]);
            }
        }
    }
    let sm = &yaml_docs(&py, &po.join("servicemonitor.yaml"))[0];
    assert_eq!(sm["kind"], "ServiceMonitor");
    let coll = yaml_docs(&py, &k.join("collector.yaml"));
    let svc = coll.iter().find(|d| d["kind"] == "Service").unwrap();
    for (key, val) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&svc["metadata"]["labels"][key], val, "the ServiceMonitor selects the collector's Service");
    }
    let port = sm["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert!(svc["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == port), "port {port}");
    // The Dockerfile's context leaves the build outputs out.
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).expect(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
}

/// kustomize: `$KUSTOMIZE`, the one scripts/setup.sh installs (pykustomize's library behind
/// scripts/kustomize.py), or on PATH. Called as `kustomize build DIR`.
fn kustomize() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUSTOMIZE").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    Some(PathBuf::from("/opt/gpufrag-ci/kustomize/bin/kustomize")).filter(|p| p.is_file()).or_else(|| on_path("kustomize"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
}

/// Every directory under `dir` that holds a kustomization.yaml.
fn kustomizations(dir: &Path) -> Vec<PathBuf> {
    let d = files(dir, &["yaml", "yml"])
        .into_iter()
        .filter(|f| f.file_stem().is_some_and(|s| s == "kustomization"))
        .map(|f| f.parent().unwrap().to_path_buf());
    let mut d: Vec<PathBuf> = d.collect();
    d.sort();
    d
}

fn build(tool: &Path, pre: &[&str], dir: &Path) -> String {
    let out = Command::new(tool).args(pre).arg(dir).output().unwrap();
    assert!(out.status.success(), "{} {pre:?} {}:\n{}", tool.display(), dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The resources (`kind/name`) of a kustomize output, sorted.
fn resources_of(py: &Path, file: &Path) -> Vec<String> {
    let mut r: Vec<String> = yaml_docs(py, file)
        .iter()
        .map(|d| format!("{}/{}", d["kind"].as_str().unwrap().to_lowercase(), d["metadata"]["name"].as_str().unwrap()))
        .collect();
    r.sort();
    r
}

/// Issue 27: `kubectl kustomize deploy/kubernetes/prometheus-operator` failed ("cycle detected:
/// candidate root … contains visited root", the overlay loaded `..`, its own parent). Every
/// kustomization under deploy/ builds; the resources each builds are the base's, plus the
/// operator's two; each output passes kubernetes-validate --strict on every version tested, with
/// no schema missing but the operator's custom resources'; where kubectl is installed its own
/// kustomize builds the same YAML.
#[test]
fn every_kustomize_overlay_builds_and_validates() {
    let Some(kz) = require("kustomize", kustomize(), "scripts/setup.sh (pykustomize in /opt/gpufrag-ci/kustomize)") else { return };
    let Some(py) = require("python3 with PyYAML", python_yaml(), "apt-get install python3-yaml") else { return };
    let Some(kv) = require("kubernetes-validate", kubernetes_validate(), "scripts/setup.sh") else { return };
    let dirs = kustomizations(&root().join("deploy"));
    let rel = |d: &Path| d.strip_prefix(root()).unwrap().display().to_string();
    let names: Vec<String> = dirs.iter().map(|d| rel(d)).collect();
    assert_eq!(names, ["deploy/kubernetes", "deploy/kubernetes/base", "deploy/kubernetes/prometheus-operator"], "the kustomizations found");
    let base = [
        "configmap/gpufrag-collector-config",
        "daemonset/gpufrag-agent",
        "deployment/gpufrag-collector",
        "namespace/gpufrag",
        "resourcequota/gpufrag-node-critical",
        "service/gpufrag-collector",
        "serviceaccount/gpufrag-agent",
    ];
    let operator = ["prometheusrule/gpufrag", "servicemonitor/gpufrag-collector"];
    let kubectl = on_path("kubectl");
    let tmp = temp_dir("kustomize-builds");
    let mut built = Vec::new();
    for d in &dirs {
        let yaml = build(&kz, &["build"], d);
        if let Some(k) = &kubectl {
            assert_eq!(build(k, &["kustomize"], d), yaml, "kubectl's kustomize builds {} differently", rel(d));
        }
        let f = tmp.join(format!("{}.yaml", rel(d).replace('/', "_")));
        std::fs::write(&f, &yaml).unwrap();
        // The ConfigMap's name carries kustomize's content hash: compare the stem.
        let got: Vec<String> = resources_of(&py, &f)
            .into_iter()
            .map(|r| if r.starts_with("configmap/gpufrag-collector-config-") { "configmap/gpufrag-collector-config".into() } else { r })
            .collect();
        let mut want: Vec<&str> = base.to_vec();
        if rel(d).ends_with("prometheus-operator") {
            want.extend(operator);
        }
        want.sort_unstable();
        assert_eq!(got, want, "{} builds", rel(d));
        // The image override and the generated ConfigMap's reference are applied.
        let docs = yaml_docs(&py, &f);
        let ds = docs.iter().find(|x| x["kind"] == "DaemonSet").unwrap();
        assert_eq!(ds["spec"]["template"]["spec"]["containers"][0]["image"], "registry.example.com/gpufrag:0.1.0");
        let cm = docs.iter().find(|x| x["kind"] == "ConfigMap").unwrap()["metadata"]["name"].clone();
        let coll = docs.iter().find(|x| x["kind"] == "Deployment").unwrap();
        assert_eq!(coll["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"], cm);
        built.push(f);
    }
    for v in KUBERNETES_VERSIONS {
        let out = Command::new(&kv).args(["--strict", "-k", v]).args(&built).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && !text.contains("ERROR"), "kubernetes-validate --strict -k {v}:\n{text}");
        let passed = text.lines().filter(|l| l.contains(" passed for resource ")).count();
        assert_eq!(passed, base.len() * built.len(), "every built-in resource of every build validated against {v}:\n{text}");
        let missing: Vec<&str> = text.lines().filter(|l| l.contains("Couldn't find schema")).collect();
        assert_eq!(missing.len(), operator.len(), "only the operator's custom resources lack a schema:\n{text}");
        assert!(missing.iter().all(|l| l.contains("PrometheusRule") || l.contains("ServiceMonitor")), "{missing:?}");
    }
    cleanup(&tmp);
}

/// Issue 27: the DaemonSet probes the health endpoint the agent serves: liveness on
/// [`HEALTHZ`], readiness on [`READYZ`], both on the port of the container that the agent's own
/// `--prometheus` argument binds, on an address the kubelet reaches (not loopback).
#[test]
fn the_daemonsets_probes_are_what_the_agent_serves() {
    use gpufrag::export::prometheus::{resolve_addr, HEALTHZ, READYZ};
    let Some(py) = require("python3 with PyYAML", python_yaml(), "apt-get install python3-yaml") else { return };
    let docs = yaml_docs(&py, &root().join("deploy/kubernetes/base/daemonset.yaml"));
    let c = &docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let at = args.iter().position(|a| *a == "--prometheus").unwrap_or_else(|| panic!("the agent serves no endpoint: {args:?}"));
    let served = resolve_addr(args[at + 1]).unwrap();
    assert!(!served.ip().is_loopback(), "{served}: the kubelet probes the pod's address");
    for (probe, path) in [("livenessProbe", HEALTHZ), ("readinessProbe", READYZ)] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}: {}", c[probe]);
        // The port, by name or by number, is the one the agent binds.
        let port = match &get["port"] {
            Value::String(name) => c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == *name)
                .unwrap_or_else(|| panic!("{probe}: no port named {name}"))["containerPort"]
                .clone(),
            n => n.clone(),
        };
        assert_eq!(port.as_u64(), Some(u64::from(served.port())), "{probe} probes port {port}, the agent serves {served}");
        let period = c[probe]["periodSeconds"].as_u64().unwrap();
        let threshold = c[probe]["failureThreshold"].as_u64().unwrap();
        // A pipeline stalled past the agent's bound is seen within the probe's failures.
        assert!(period * threshold >= gpufrag::export::health::STALL_AFTER.as_secs(), "{probe}: {period} s x {threshold}");
    }
}

/// Issue 26: the agent's container reads the kubelet's pod-resources socket: the DaemonSet passes
/// `--pod-resources-socket` (the agent's own CLI parses it to that path) with a path inside a
/// read-only hostPath mount of the kubelet's directory, mounted at the same path, of type
/// `Directory` (the directory, not the socket: a restarted kubelet's new socket is seen).
#[test]
fn the_daemonset_mounts_the_pod_resources_directory_of_the_socket_it_passes_the_agent() {
    use clap::Parser;
    let Some(py) = require("python3 with PyYAML", python_yaml(), "apt-get install python3-yaml") else { return };
    let docs = yaml_docs(&py, &root().join("deploy/kubernetes/base/daemonset.yaml"));
    let pod = &docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let parsed = gpufrag::cli::Cli::try_parse_from(std::iter::once("gpufrag").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("the DaemonSet's args {args:?} are not the agent's: {e}"));
    let gpufrag::cli::Command::Agent(agent) = parsed.command else { panic!("{args:?}: not `agent`") };
    let sock = agent.pod_resources_socket;
    assert!(args.contains(&"--pod-resources-socket"), "{args:?}: the socket is passed, not left to the default");
    assert_eq!(sock, Path::new(gpufrag::attribution::podres::DEFAULT_SOCKET), "the kubelet's own path");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str().is_some_and(|p| sock.parent() == Some(Path::new(p))))
        .unwrap_or_else(|| panic!("no volume mounted at {}: {:#}", sock.parent().unwrap().display(), c["volumeMounts"]));
    assert_eq!(mount["readOnly"], true, "{mount}");
    let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
    assert_eq!(
        (vol["hostPath"]["path"].as_str(), vol["hostPath"]["type"].as_str()),
        (mount["mountPath"].as_str(), Some("Directory")),
        "the kubelet's directory at the same path: {vol}"
    );
}

/// Issue 27: deploy/Dockerfile (not built in CI: its bases cannot be pulled there) has its bases
/// pinned (a digest, or a full X.Y.Z / X.Y version tag), builds with `--locked`, strips debug
/// info from what it ships, and builds the dependencies in a layer of their own: every
/// workspace member's manifest and Cargo.lock are copied, and a cargo build run, before the
/// sources are.
#[test]
fn the_dockerfile_pins_its_bases_builds_locked_and_stripped_with_a_dependency_layer() {
    let text = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    // Instructions, with continuation lines joined.
    let joined = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n").replace("\\\n", " ");
    let steps: Vec<&str> = joined.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let froms: Vec<&str> = steps.iter().filter_map(|s| s.strip_prefix("FROM ")).map(|s| s.split_whitespace().next().unwrap()).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    for image in &froms {
        let pinned = image.contains("@sha256:") || {
            let tag = image.rsplit_once(':').map_or("", |(_, t)| t);
            let version = tag.split('-').next().unwrap_or("");
            version.split('.').count() >= 2 && version.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        };
        assert!(pinned, "base {image} floats: pin a digest or a full version tag");
    }
    let builds: Vec<usize> = steps.iter().enumerate().filter(|(_, s)| s.contains("cargo build")).map(|(i, _)| i).collect();
    assert!(builds.len() >= 2, "a dependency build and the real one: {steps:#?}");
    for &i in &builds {
        assert!(steps[i].contains("--locked"), "{}", steps[i]);
    }
    let sources = steps.iter().position(|s| *s == "COPY . .").expect("COPY . .");
    assert!(builds[0] < sources && *builds.last().unwrap() > sources, "dependencies built before the sources are copied: {steps:#?}");
    let copied_before: String = steps[..builds[0]].iter().filter(|s| s.starts_with("COPY ")).cloned().collect::<Vec<_>>().join("\n");
    assert!(copied_before.contains("Cargo.lock"), "{copied_before}");
    let ws = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = ws.lines().find(|l| l.starts_with("members")).unwrap();
    for m in members.split('"').skip(1).step_by(2) {
        let manifest = if m == "." { "Cargo.toml".to_string() } else { format!("{m}/Cargo.toml") };
        assert!(copied_before.contains(&manifest), "the dependency layer lacks {manifest}: {copied_before}");
    }
    assert!(
        joined.contains("CARGO_PROFILE_RELEASE_STRIP=debuginfo")
            || joined.contains("CARGO_PROFILE_RELEASE_STRIP=symbols")
            || joined.contains("strip "),
        "the shipped binaries are not stripped"
    );
}

/// Issue 27: the dashboard has node, namespace and pod variables and every query honours them
/// (node on every selector, namespace and pod on the per-process metrics', which carry the
/// workload's pod); an OOM annotation from the OOM counter; every metric a query names is one
/// the exporter's catalogue has (the variable-free names check is
/// every_metric_name_used_is_exported_and_documented).
#[test]
fn the_dashboard_filters_by_node_namespace_and_pod_and_marks_ooms() {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/gpufrag-dashboard.json")).unwrap()).unwrap();
    let vars: Vec<&str> = d["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    for v in ["node", "namespace", "pod"] {
        assert!(vars.contains(&v), "no ${v} variable: {vars:?}");
    }
    let known = exported_names();
    let ooms = prometheus_name("gpufrag.ooms", "{oom}", Kind::Counter, false);
    let mut queries: Vec<String> = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            queries.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    let annotations: Vec<&Value> = d["annotations"]["list"].as_array().unwrap().iter().filter(|a| a["expr"].is_string()).collect();
    assert!(
        annotations.iter().any(|a| a["expr"].as_str().unwrap().contains(&ooms) && a["enable"] == true),
        "no OOM annotation from {ooms}"
    );
    queries.extend(annotations.iter().map(|a| a["expr"].as_str().unwrap().to_string()));
    for q in &queries {
        // Each selector: metric{labels}.
        for (i, _) in q.match_indices('{') {
            let head = &q[..i];
            let metric = &head[head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |j| j + 1)..];
            if metric.is_empty() {
                continue; // a `by (...)` group or a legend template
            }
            assert!(known.contains(metric), "{metric} (in {q}) is not exported");
            let sel = &q[i..i + q[i..].find('}').unwrap()];
            assert!(sel.contains("k8s_node_name=~\"$node\""), "{metric} ignores $node: {q}");
            if metric.starts_with("gpufrag_process_") || metric == ooms {
                assert!(
                    sel.contains("k8s_namespace_name=~\"$namespace\"") && sel.contains("k8s_pod_name=~\"$pod\""),
                    "{metric} ignores $namespace/$pod: {q}"
                );
            }
        }
    }
}
