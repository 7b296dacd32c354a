//! The resource every metric is reported with: `service.name` (`gpufrag` unless
//! `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` says otherwise), `service.version`,
//! `service.instance.id` (the pod's name in Kubernetes, else the host name: a collector's
//! Prometheus exporter turns it into the `instance` label, which keeps the series of two nodes
//! apart), `host.name`, and, in Kubernetes, the node, pod and namespace from the downward-API variables
//! `K8S_NODE_NAME`, `K8S_POD_NAME`, `K8S_NAMESPACE_NAME` (and `K8S_POD_UID`). Attributes in
//! `OTEL_RESOURCE_ATTRIBUTES` override these defaults; `OTEL_SERVICE_NAME` overrides both.
//! That is the node's resource; over OTLP each traced process's series go under a resource of
//! their own ([`process_resource`]), as other eBPF agents report theirs.

use opentelemetry::KeyValue;
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::Resource;

/// The Kubernetes downward-API variables and the attributes they fill.
pub const K8S_VARS: [(&str, &str); 4] = [
    ("K8S_NODE_NAME", "k8s.node.name"),
    ("K8S_POD_NAME", "k8s.pod.name"),
    ("K8S_NAMESPACE_NAME", "k8s.namespace.name"),
    ("K8S_POD_UID", "k8s.pod.uid"),
];

/// This machine's host name.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        return String::from_utf8_lossy(&buf[..end]).into_owned();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The resource, from the defaults and the environment.
pub fn resource() -> Resource {
    let host = host_name();
    let instance = std::env::var("K8S_POD_NAME").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| host.clone());
    let mut defaults = vec![
        KeyValue::new("service.name", "gpufrag"),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", instance),
        KeyValue::new("host.name", host),
    ];
    for (var, key) in K8S_VARS {
        if let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
            defaults.push(KeyValue::new(key, v));
        }
    }
    let mut b = Resource::builder_empty()
        .with_attributes(defaults)
        .with_attributes(TelemetryResourceDetector.detect().iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())))
        .with_attributes(EnvResourceDetector::new().detect().iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()) {
        b = b.with_service_name(name);
    }
    b.build()
}

/// Keys of the node's resource that name the agent's own pod and container: a process's
/// resource drops them (its own, where known, take their place), so the collector's
/// k8sattributes processor never files a process under the agent's pod.
pub const AGENT_POD_KEYS: [&str; 5] = ["k8s.pod.name", "k8s.pod.uid", "k8s.namespace.name", "k8s.container.name", "container.id"];

/// The resource of one traced process's series: the node's (service, host, `k8s.node.name`,
/// `OTEL_RESOURCE_ATTRIBUTES`), less the agent's pod, plus `process.pid`,
/// `process.executable.name` and the process's container and pod where known (`container.id`,
/// `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name`, `k8s.container.name`): what the
/// collector's k8sattributes processor matches on (`container.id`, `k8s.pod.uid`) and enriches.
pub fn process_resource(node: &Resource, p: &super::store::ProcessPoint) -> Resource {
    let mut attrs: Vec<KeyValue> =
        node.iter().filter(|(k, _)| !AGENT_POD_KEYS.contains(&k.as_str())).map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect();
    attrs.push(KeyValue::new("process.pid", i64::from(p.pid)));
    attrs.push(KeyValue::new("process.executable.name", p.exe.to_string()));
    if let Some(id) = &p.identity {
        attrs.extend(id.attributes().into_iter().map(|(k, v)| KeyValue::new(k, v.to_string())));
    }
    Resource::builder_empty().with_attributes(attrs).build()
}

/// The resource's attributes as strings, sorted by key (for Prometheus's `target_info`).
pub fn attributes(r: &Resource) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = r.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    v.sort();
    v
}
