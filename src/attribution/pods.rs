//! The names the node gives a container (its pod, namespace, container name), by container id,
//! and where they came from: the OCI annotations a Kubernetes runtime writes into the bundle's
//! `config.json` (CRI-O and the kubelet's `io.kubernetes.pod.*`, containerd's
//! `io.kubernetes.cri.*`), read by the exec hold as the runtime starts the container
//! ([`super::oci`]). A process whose container the node named is named so; only where the node
//! said nothing is the container's own environment read for its names (see [`super::Identity`]'s
//! `identity_source`).
//!
//! Bounded: at most [`MAX_CONTAINERS`] containers are kept; beyond, the oldest half is dropped
//! (a container dropped is named by its environment, and the summary says so by its source).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Containers kept at most.
pub const MAX_CONTAINERS: usize = 4096;

/// `identity_source` when the runtime's annotations named the process.
pub const SOURCE_OCI: &str = "oci-annotations";
/// `identity_source` when the kubelet's pod-resources socket did (the one container on the node
/// that was given the GPU the process uses: [`super::podres`]).
pub const SOURCE_PODRES: &str = "pod-resources";
/// `identity_source` when the container's environment did.
pub const SOURCE_ENV: &str = "environment";

/// What the node says a container is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNames {
    /// `k8s.pod.name`.
    pub pod_name: Option<String>,
    /// `k8s.namespace.name`.
    pub namespace: Option<String>,
    /// `k8s.container.name`.
    pub container_name: Option<String>,
    /// `k8s.pod.uid`.
    pub pod_uid: Option<String>,
    /// Which source named it ([`SOURCE_OCI`], ...).
    pub source: &'static str,
}

impl PodNames {
    /// The names in a container's OCI annotations, `None` when they name no pod.
    pub fn from_annotations(a: &BTreeMap<String, String>) -> Option<PodNames> {
        let get = |keys: &[&str]| keys.iter().find_map(|k| a.get(*k).filter(|v| !v.is_empty()).cloned());
        let n = PodNames {
            pod_name: get(&["io.kubernetes.pod.name", "io.kubernetes.cri.sandbox-name"]),
            namespace: get(&["io.kubernetes.pod.namespace", "io.kubernetes.cri.sandbox-namespace"]),
            container_name: get(&["io.kubernetes.container.name", "io.kubernetes.cri.container-name"]),
            pod_uid: get(&["io.kubernetes.pod.uid", "io.kubernetes.cri.sandbox-uid"]),
            source: SOURCE_OCI,
        };
        (n.pod_name.is_some() || n.namespace.is_some() || n.container_name.is_some()).then_some(n)
    }
}

/// Containers the node named, by container id.
#[derive(Debug, Default)]
pub struct NodePods {
    by_id: HashMap<String, Arc<PodNames>>,
    order: VecDeque<String>,
}

impl NodePods {
    /// Keeps `names` for container `id` (the runtime's id: the one its cgroup path carries).
    pub fn insert(&mut self, id: String, names: PodNames) {
        if self.by_id.len() >= MAX_CONTAINERS {
            for old in self.order.drain(..MAX_CONTAINERS / 2) {
                self.by_id.remove(&old);
            }
        }
        if self.by_id.insert(id.clone(), Arc::new(names)).is_none() {
            self.order.push_back(id);
        }
    }

    /// What the node said of container `id`.
    pub fn get(&self, id: &str) -> Option<Arc<PodNames>> {
        self.by_id.get(id).cloned()
    }

    /// What the node said of the container a process's `/proc/PID/cgroup` text places it in.
    pub fn of_cgroup(&self, cgroup: &str) -> Option<Arc<PodNames>> {
        match super::cgroup::parse_file(cgroup) {
            Ok(super::cgroup::Placement::Container(c)) => self.get(&c.id),
            _ => None,
        }
    }

    /// Containers kept.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_and_containerd_annotations_name_the_pod() {
        let a: BTreeMap<String, String> = [
            ("io.kubernetes.pod.name", "trainer-0"),
            ("io.kubernetes.pod.namespace", "ml"),
            ("io.kubernetes.container.name", "main"),
            ("io.kubernetes.pod.uid", "u-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let n = PodNames::from_annotations(&a).expect("named");
        assert_eq!(
            (n.pod_name.as_deref(), n.namespace.as_deref(), n.container_name.as_deref(), n.pod_uid.as_deref(), n.source),
            (Some("trainer-0"), Some("ml"), Some("main"), Some("u-1"), SOURCE_OCI)
        );
        let cri: BTreeMap<String, String> = [
            ("io.kubernetes.cri.sandbox-name", "p"),
            ("io.kubernetes.cri.sandbox-namespace", "ns"),
            ("io.kubernetes.cri.container-name", "c"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let n = PodNames::from_annotations(&cri).expect("named");
        assert_eq!((n.pod_name.as_deref(), n.namespace.as_deref(), n.container_name.as_deref()), (Some("p"), Some("ns"), Some("c")));
        assert_eq!(PodNames::from_annotations(&BTreeMap::from([("org.opencontainers.image.title".into(), "x".into())])), None);
    }

    #[test]
    fn a_cgroup_path_finds_its_containers_names_and_the_map_is_bounded() {
        let id = "a".repeat(64);
        let mut m = NodePods::default();
        m.insert(id.clone(), PodNames { pod_name: Some("p".into()), source: SOURCE_OCI, ..PodNames::default() });
        let cg = format!("0::/machine.slice/libpod-{id}.scope/container\n");
        assert_eq!(m.of_cgroup(&cg).and_then(|n| n.pod_name.clone()).as_deref(), Some("p"), "{cg}");
        assert!(m.of_cgroup("0::/user.slice\n").is_none());
        for i in 0..MAX_CONTAINERS + 10 {
            m.insert(format!("{i:064x}"), PodNames::default());
        }
        assert!(m.len() <= MAX_CONTAINERS, "{}", m.len());
    }
}
