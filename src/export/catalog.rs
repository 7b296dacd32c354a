//! Every exported metric, defined once: its OpenTelemetry name, unit, instrument and help text,
//! and the function that reads its points from a [`View`]. The OTLP pipeline and the Prometheus
//! endpoint both walk [`METRICS`], so the two can never disagree on a name or a value; the
//! Prometheus names are derived from these by [`prometheus_name`], the way the OpenTelemetry →
//! Prometheus compatibility rules translate them (what a collector's Prometheus exporter shows).
//!
//! Attributes are bounded by design: `hw.id` (one per GPU), `process.pid` and
//! `process.executable.name` (one per traced process, dropped after it exits) with, where known,
//! its `container.id`, `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name` and
//! `k8s.container.name` (one value per process, so no more series), `gpufrag.verdict`
//! (four values), `gpufrag.level` (two), `hw.type` (one). Never an address, never a size.

use super::store::{DeviceView, ProcessPoint, View};
use crate::analysis::{fragmentation, largest_allocatable, Verdict};
use std::sync::Arc;

/// The instrument a metric is exported as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down, read when collected (observable gauge).
    Gauge,
    /// A sum that goes up and down (observable up-down counter; a gauge in Prometheus).
    UpDownCounter,
    /// A monotonic sum (observable counter; `_total` in Prometheus).
    Counter,
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// An integer (`process.pid`).
    Int(i64),
    /// A string.
    Str(Arc<str>),
    /// A fixed string.
    Static(&'static str),
}

impl AttrValue {
    /// The value as Prometheus shows it in a label.
    pub fn to_label(&self) -> String {
        match self {
            AttrValue::Int(i) => i.to_string(),
            AttrValue::Str(s) => s.to_string(),
            AttrValue::Static(s) => (*s).to_string(),
        }
    }
}

/// A point's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// Bytes or counts.
    U64(u64),
    /// Ratios.
    F64(f64),
}

/// One data point: attributes and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Attribute key and value, in a fixed order.
    pub attrs: Vec<(&'static str, AttrValue)>,
    /// The value.
    pub value: Value,
}

/// Whose figures a metric carries, which decides its OTLP resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The node's: per device, or global. Reported under the node's resource.
    Node,
    /// One process's (per process × device). Reported under that process's resource.
    Process,
}

/// One exported metric.
pub struct Metric {
    /// The OpenTelemetry name.
    pub name: &'static str,
    /// Whose figures: the node's or a process's.
    pub scope: Scope,
    /// UCUM unit (`By`, `1`, or an annotation such as `{allocation}`).
    pub unit: &'static str,
    /// The instrument.
    pub kind: Kind,
    /// Whether the values are ratios (`f64`) rather than byte counts (`u64`).
    pub float: bool,
    /// Help text.
    pub help: &'static str,
    /// Its points in a view.
    pub points: fn(&View) -> Vec<Point>,
}

/// The allocation-size histogram (recorded, not observed: see `otlp.rs`).
pub const ALLOC_SIZE: &str = "gpufrag.allocation.size";
/// Its help text.
pub const ALLOC_SIZE_HELP: &str = "Sizes of successful allocations: framework blocks (gpufrag.level=block) and driver segments (gpufrag.level=segment), per device, over every traced process";

/// Attributes of a device-level point.
fn device_attrs(d: &DeviceView) -> Vec<(&'static str, AttrValue)> {
    vec![("hw.id", AttrValue::Str(d.hw_id.clone()))]
}

/// Attributes of a `hw.gpu.*` point: the semantic conventions require `hw.type` and recommend
/// `hw.model`, `hw.vendor` and `hw.driver_version` (one value per GPU: no more series), given
/// where NVML named them.
fn hw_attrs(d: &DeviceView) -> Vec<(&'static str, AttrValue)> {
    let mut a = vec![("hw.id", AttrValue::Str(d.hw_id.clone())), ("hw.type", AttrValue::Static("gpu"))];
    if let Some(m) = &d.hardware.model {
        a.push(("hw.model", AttrValue::Str(m.clone())));
    }
    if let Some(v) = d.hardware.vendor {
        a.push(("hw.vendor", AttrValue::Static(v)));
    }
    if let Some(v) = &d.hardware.driver_version {
        a.push(("hw.driver_version", AttrValue::Str(v.clone())));
    }
    a
}

/// Attributes of a process × device point.
pub fn process_attrs(p: &ProcessPoint) -> Vec<(&'static str, AttrValue)> {
    let mut a = vec![
        ("process.pid", AttrValue::Int(i64::from(p.pid))),
        ("process.executable.name", AttrValue::Str(p.exe.clone())),
        ("hw.id", AttrValue::Str(p.hw_id.clone())),
        ("gpufrag.framework", AttrValue::Str(Arc::from(p.framework.map_or("none", |f| f.name())))),
    ];
    if let Some(id) = &p.identity {
        a.extend(id.attributes().into_iter().map(|(k, v)| (k, AttrValue::Str(Arc::from(v)))));
    }
    a
}

fn per_device(v: &View, f: impl Fn(&DeviceView) -> Option<Value>) -> Vec<Point> {
    v.devices.iter().filter_map(|d| f(d).map(|value| Point { attrs: device_attrs(d), value })).collect()
}

fn per_hw(v: &View, f: impl Fn(&DeviceView) -> Option<Value>) -> Vec<Point> {
    v.devices.iter().filter_map(|d| f(d).map(|value| Point { attrs: hw_attrs(d), value })).collect()
}

fn per_process(v: &View, f: impl Fn(&ProcessPoint, &View) -> Value) -> Vec<Point> {
    v.processes.iter().map(|p| Point { attrs: process_attrs(p), value: f(p, v) }).collect()
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// Device free as the figures use it: 0 when never measured (docs/metrics.md).
fn free_of(v: &View, device: i16) -> u64 {
    v.devices.iter().find(|d| d.device == device).and_then(|d| d.free).unwrap_or(0)
}

use Value::{F64, U64};

/// Every observed metric, in export order.
pub static METRICS: &[Metric] = &[
    // Per device: summed over the processes of the view (max for the largest free block).
    Metric { name: "gpufrag.memory.reserved", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Bytes the traced processes hold from the driver on the device (segments, mapped VMM memory, pool caches)", points: |v| per_device(v, |d| Some(U64(d.figures.reserved))) },
    Metric { name: "gpufrag.memory.allocated", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Bytes in live framework blocks, plus segments no framework owns", points: |v| per_device(v, |d| Some(U64(d.figures.allocated))) },
    Metric { name: "gpufrag.memory.stranded", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Free bytes inside framework segments that still hold a live block (PyTorch's inactive_split)", points: |v| per_device(v, |d| Some(U64(d.figures.stranded))) },
    Metric { name: "gpufrag.memory.releasable", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Bytes in cached segments with no live block: what empty_cache() would return", points: |v| per_device(v, |d| Some(U64(d.figures.releasable))) },
    Metric { name: "gpufrag.memory.page_stranded", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Free bytes in 2 MiB driver pages that hold a live sub-2 MiB driver allocation: usable by small requests only, never by one of 2 MiB or more", points: |v| per_device(v, |d| Some(U64(d.figures.page_stranded))) },
    Metric { name: "gpufrag.memory.largest_free_block", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "The largest free run inside one segment of any traced process", points: |v| per_device(v, |d| Some(U64(d.figures.largest_free_block))) },
    Metric { name: "gpufrag.memory.largest_allocatable", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "What one request can get now: max(largest free block, device free - 4 MiB + releasable)", points: |v| per_device(v, |d| Some(U64(largest_allocatable(d.figures.largest_free_block, d.free.unwrap_or(0), d.figures.releasable)))) },
    Metric { name: "gpufrag.memory.device_free", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Free bytes on the device as last measured (what nvidia-smi shows as free)", points: |v| per_device(v, |d| d.free.map(U64)) },
    Metric { name: "gpufrag.memory.unattributed", scope: Scope::Node, unit: "By", kind: Kind::Gauge, float: false, help: "Device memory in use that no traced process accounts for (0 under `run`, which traces every process it starts)", points: |v| per_device(v, |d| Some(U64(d.unattributed))) },
    Metric { name: "gpufrag.memory.fragmentation", scope: Scope::Node, unit: "1", kind: Kind::Gauge, float: true, help: "Share of free memory (device free + stranded + releasable) that no single request can use", points: |v| per_device(v, |d| Some(F64(fragmentation(d.figures.largest_free_block, d.free.unwrap_or(0), d.figures.stranded, d.figures.releasable)))) },
    Metric { name: "gpufrag.memory.stranded_ratio", scope: Scope::Node, unit: "1", kind: Kind::Gauge, float: true, help: "Stranded bytes over reserved bytes", points: |v| per_device(v, |d| Some(F64(ratio(d.figures.stranded, d.figures.reserved)))) },
    // OpenTelemetry semantic conventions for GPUs (hardware/gpu).
    Metric { name: "hw.gpu.memory.limit", scope: Scope::Node, unit: "By", kind: Kind::UpDownCounter, float: false, help: "Size of the GPU memory", points: |v| per_hw(v, |d| d.total.map(U64)) },
    Metric { name: "hw.gpu.memory.usage", scope: Scope::Node, unit: "By", kind: Kind::UpDownCounter, float: false, help: "GPU memory used (total minus free)", points: |v| per_hw(v, |d| Some(U64(d.total?.saturating_sub(d.free?)))) },
    Metric { name: "hw.gpu.memory.utilization", scope: Scope::Node, unit: "1", kind: Kind::Gauge, float: true, help: "Fraction of GPU memory used", points: |v| per_hw(v, |d| Some(F64(ratio(d.total?.saturating_sub(d.free?), d.total?)))) },
    // Per process and device.
    Metric { name: "gpufrag.process.memory.reserved", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "Bytes the process holds from the driver on the device", points: |v| per_process(v, |p, _| U64(p.figures.reserved)) },
    Metric { name: "gpufrag.process.memory.allocated", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "Bytes in the process's live framework blocks, plus segments no framework owns", points: |v| per_process(v, |p, _| U64(p.figures.allocated)) },
    Metric { name: "gpufrag.process.memory.stranded", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "Free bytes inside the process's framework segments that still hold a live block", points: |v| per_process(v, |p, _| U64(p.figures.stranded)) },
    Metric { name: "gpufrag.process.memory.releasable", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "Bytes in the process's cached segments with no live block", points: |v| per_process(v, |p, _| U64(p.figures.releasable)) },
    Metric { name: "gpufrag.process.memory.page_stranded", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "Free bytes in 2 MiB driver pages that hold a live sub-2 MiB driver allocation of the process", points: |v| per_process(v, |p, _| U64(p.figures.page_stranded)) },
    Metric { name: "gpufrag.process.memory.largest_free_block", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "The largest free run inside one of the process's segments", points: |v| per_process(v, |p, _| U64(p.figures.largest_free_block)) },
    Metric { name: "gpufrag.process.memory.largest_allocatable", scope: Scope::Process, unit: "By", kind: Kind::Gauge, float: false, help: "What one request of the process can get now", points: |v| per_process(v, |p, v| U64(largest_allocatable(p.figures.largest_free_block, free_of(v, p.device), p.figures.releasable))) },
    Metric { name: "gpufrag.process.memory.fragmentation", scope: Scope::Process, unit: "1", kind: Kind::Gauge, float: true, help: "Share of the memory free to the process that no single request can use", points: |v| per_process(v, |p, v| F64(fragmentation(p.figures.largest_free_block, free_of(v, p.device), p.figures.stranded, p.figures.releasable))) },
    Metric { name: "gpufrag.process.memory.stranded_ratio", scope: Scope::Process, unit: "1", kind: Kind::Gauge, float: true, help: "The process's stranded bytes over its reserved bytes", points: |v| per_process(v, |p, _| F64(ratio(p.figures.stranded, p.figures.reserved))) },
    Metric { name: "gpufrag.allocations", scope: Scope::Process, unit: "{allocation}", kind: Kind::Counter, float: false, help: "Successful allocations (framework blocks and driver segments)", points: |v| per_process(v, |p, _| U64(p.allocs)) },
    Metric { name: "gpufrag.frees", scope: Scope::Process, unit: "{free}", kind: Kind::Counter, float: false, help: "Frees (framework blocks and driver segments)", points: |v| per_process(v, |p, _| U64(p.frees)) },
    Metric {
        name: "gpufrag.ooms",
        scope: Scope::Process,
        unit: "{oom}",
        kind: Kind::Counter,
        float: false,
        help: "Out-of-memory failures by verdict: true_oom, fragmentation (enough was free, not in one piece), inconclusive, allowed_limit (the allocator's own cap refused it)",
        points: |v| {
            let mut out = Vec::new();
            for p in &v.processes {
                for (i, verdict) in Verdict::ALL.iter().enumerate() {
                    let mut attrs = process_attrs(p);
                    attrs.push(("gpufrag.verdict", AttrValue::Static(verdict.name())));
                    out.push(Point { attrs, value: U64(p.ooms[i]) });
                }
            }
            out
        },
    },
    Metric {
        name: "gpufrag.process.memory.predicted_peak",
        scope: Scope::Process,
        unit: "By",
        kind: Kind::Gauge,
        float: false,
        help: "Foresight: the peak reserved bytes the process's next steps will need, simulated on its allocator's current state (for a predicted OOM: reserved then + the failing request's segment); only processes with a forecast",
        points: |v| {
            v.processes
                .iter()
                .filter_map(|p| p.predicted_peak.map(|b| Point { attrs: process_attrs(p), value: U64(b) }))
                .collect()
        },
    },
    Metric {
        name: "gpufrag.process.memory.by_owner",
        scope: Scope::Process,
        unit: "By",
        kind: Kind::Gauge,
        float: false,
        help: "The process's live driver bytes by the library whose code allocated them, gpufrag.owner: cublas, cudnn, nccl, cuda_runtime, framework, other (run's shim only; the non-framework memory is every owner but framework)",
        points: |v| {
            let mut out = Vec::new();
            for p in &v.processes {
                let Some(b) = p.owners else { continue };
                for (o, bytes) in crate::owner::Owner::ALL.iter().zip(b) {
                    let mut attrs = process_attrs(p);
                    attrs.push(("gpufrag.owner", AttrValue::Static(o.name())));
                    out.push(Point { attrs, value: U64(bytes) });
                }
            }
            out
        },
    },
    Metric { name: "gpufrag.foresight.warnings", scope: Scope::Process, unit: "{warning}", kind: Kind::Counter, float: false, help: "Foresight: forecasts whose simulated next steps do not fit in what the process may hold (a predicted OOM: checkpoint now)", points: |v| per_process(v, |p, _| U64(p.warnings)) },
    Metric { name: "gpufrag.alloc_retries", scope: Scope::Process, unit: "{retry}", kind: Kind::Counter, float: false, help: "Failed allocations that recovered: the same thread's next allocation of that size succeeded after memory was released (PyTorch's num_alloc_retries); never counted in gpufrag.ooms", points: |v| per_process(v, |p, _| U64(p.retries)) },
    Metric {
        name: "gpufrag.ooms.held",
        scope: Scope::Process,
        unit: "{oom}",
        kind: Kind::Counter,
        float: false,
        help: "Out-of-memory failures at which other processes held memory on the GPU, by gpufrag.oom.holders: traced (other traced processes), untraced (only NVML listed them), both",
        points: |v| {
            let mut out = Vec::new();
            for p in &v.processes {
                for (i, kind) in crate::ingest::holders::HELD_KINDS.iter().enumerate() {
                    let mut attrs = process_attrs(p);
                    attrs.push(("gpufrag.oom.holders", AttrValue::Static(kind)));
                    out.push(Point { attrs, value: U64(p.ooms_held[i]) });
                }
            }
            out
        },
    },
    // Global.
    Metric { name: "gpufrag.events.dropped", scope: Scope::Node, unit: "{event}", kind: Kind::Counter, float: false, help: "Events the capture dropped rather than block the traced program (figures are lower bounds when this grows)", points: |v| vec![Point { attrs: Vec::new(), value: U64(v.dropped) }] },
];

/// The Prometheus name of a metric, as the OpenTelemetry → Prometheus compatibility rules give
/// it (and a collector's `prometheus` exporter, with its default suffixes, shows it): characters
/// outside `[a-zA-Z0-9_:]` become `_`, `By` adds `_bytes`, a gauge of unit `1` adds `_ratio`,
/// annotations in braces add nothing, and a monotonic counter ends in `_total`.
pub fn prometheus_name(name: &str, unit: &str, kind: Kind, histogram: bool) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        out.push(if c.is_ascii_alphanumeric() || c == '_' || c == ':' { c } else { '_' });
    }
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    let suffix = match unit {
        "By" => Some("bytes"),
        "s" => Some("seconds"),
        "1" if kind == Kind::Gauge && !histogram => Some("ratio"),
        _ => None,
    };
    if let Some(s) = suffix {
        if !out.ends_with(&format!("_{s}")) {
            out.push('_');
            out.push_str(s);
        }
    }
    if kind == Kind::Counter && !histogram && !out.ends_with("_total") {
        out.push_str("_total");
    }
    out
}

/// A label name as Prometheus shows an attribute key.
pub fn prometheus_label(key: &str) -> String {
    let mut out: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "key_");
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_translate_like_the_collector_does() {
        let got: Vec<String> = METRICS.iter().map(|m| prometheus_name(m.name, m.unit, m.kind, false)).collect();
        assert!(got.contains(&"gpufrag_memory_reserved_bytes".to_string()));
        assert!(got.contains(&"gpufrag_memory_fragmentation_ratio".to_string()));
        assert!(got.contains(&"hw_gpu_memory_limit_bytes".to_string()));
        assert!(got.contains(&"hw_gpu_memory_utilization_ratio".to_string()));
        assert!(got.contains(&"gpufrag_ooms_total".to_string()));
        assert!(got.contains(&"gpufrag_events_dropped_total".to_string()));
        assert!(got.contains(&"gpufrag_process_memory_largest_free_block_bytes".to_string()));
        assert!(got.contains(&"gpufrag_memory_page_stranded_bytes".to_string()));
        assert!(got.contains(&"gpufrag_process_memory_page_stranded_bytes".to_string()));
        assert_eq!(prometheus_name(ALLOC_SIZE, "By", Kind::Counter, true), "gpufrag_allocation_size_bytes");
        assert_eq!(prometheus_label("process.executable.name"), "process_executable_name");
    }

    #[test]
    fn names_are_unique_and_never_carry_an_address_or_size_attribute() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        names.push(ALLOC_SIZE);
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
