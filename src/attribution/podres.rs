//! The kubelet's pod-resources socket: which GPUs the node gave each container of each pod.
//!
//! [`list`] is one `v1.PodResourcesLister/List` call over the kubelet's Unix socket (gRPC with
//! tonic's channel; the messages of [`super::podres_api`]), bounded: [`CALL_TIMEOUT`] for the
//! whole call (connect, HTTP/2 handshake, answer), an answer over [`ANSWER_MAX`] bytes refused by
//! the decoder. [`Watch`] runs those calls on a thread of its own, never on a hot path: at start,
//! when nudged (a container the agent has not seen, [`Watch::nudge`], which never blocks) and
//! every [`REFRESH_INTERVAL`]; each answer or failure comes back on a channel that the pipeline
//! drains at its tick. [`Assignments`] is one answer as a table: a container's GPUs by its
//! (namespace, pod, container) names, and the containers each GPU was given to.
//!
//! The GPUs are the device ids of the NVIDIA device plugin's resources (`nvidia.com/gpu`, and the
//! MIG strategies' `nvidia.com/mig-*`): GPU (or MIG) UUIDs. A time-sliced GPU's replicas
//! (`GPU-…::0`, `GPU-…::1`) are the GPU itself (the `::N` is dropped), so a shared GPU has
//! several holders and names no one of them.

use super::podres_api::{ListPodResourcesRequest, ListPodResourcesResponse};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The longest one call may take, all of it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The largest answer decoded (a node of a few hundred pods answers in tens of KiB).
pub const ANSWER_MAX: usize = 4 << 20;

/// How often the table is read again without a nudge.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// The gRPC method called.
const LIST: &str = "/v1.PodResourcesLister/List";

/// A container as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerKey {
    /// `k8s.namespace.name`.
    pub namespace: String,
    /// `k8s.pod.name`.
    pub pod: String,
    /// `k8s.container.name`.
    pub container: String,
}

impl std::fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.container)
    }
}

/// The GPU a device plugin's device id names, when the resource is a GPU one.
pub fn gpu_of(resource_name: &str, device_id: &str) -> Option<String> {
    let gpu = resource_name == "nvidia.com/gpu" || resource_name.starts_with("nvidia.com/mig-");
    let id = device_id.split_once("::").map_or(device_id, |(g, _)| g).trim();
    (gpu && !id.is_empty()).then(|| id.to_string())
}

/// One answer of the socket as a table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignments {
    /// Every container listed, with its GPUs (sorted, each once; empty: none).
    by_container: BTreeMap<ContainerKey, Vec<String>>,
    /// Each GPU's holders.
    by_gpu: HashMap<String, Vec<ContainerKey>>,
}

impl Assignments {
    /// The table of an answer.
    pub fn from_response(r: &ListPodResourcesResponse) -> Assignments {
        let mut a = Assignments::default();
        for p in &r.pod_resources {
            for c in &p.containers {
                let key = ContainerKey { namespace: p.namespace.clone(), pod: p.name.clone(), container: c.name.clone() };
                let gpus: BTreeSet<String> =
                    c.devices.iter().flat_map(|d| d.device_ids.iter().filter_map(|id| gpu_of(&d.resource_name, id))).collect();
                for g in &gpus {
                    let holders = a.by_gpu.entry(g.clone()).or_default();
                    if !holders.contains(&key) {
                        holders.push(key.clone());
                    }
                }
                a.by_container.entry(key).or_default().extend(gpus);
            }
        }
        for g in a.by_container.values_mut() {
            g.sort();
            g.dedup();
        }
        a
    }

    /// The GPUs of container `key`, `None` when the socket does not list it.
    pub fn gpus_of(&self, key: &ContainerKey) -> Option<&[String]> {
        self.by_container.get(key).map(Vec::as_slice)
    }

    /// The containers GPU `uuid` was given to.
    pub fn holders(&self, uuid: &str) -> &[ContainerKey] {
        self.by_gpu.get(uuid).map_or(&[], Vec::as_slice)
    }

    /// Containers listed.
    pub fn containers(&self) -> usize {
        self.by_container.len()
    }

    /// Containers listed with at least one GPU.
    pub fn with_gpus(&self) -> usize {
        self.by_container.values().filter(|g| !g.is_empty()).count()
    }
}

/// One `List` call on `socket`, all of it within `timeout`, an answer over `max_bytes` refused.
/// The error says what went wrong (`timed out after 1 s`, the connection's error, the gRPC
/// status).
pub fn list(socket: &Path, timeout: Duration, max_bytes: usize) -> Result<ListPodResourcesResponse, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("a runtime for the call: {e}"))?;
    rt.block_on(async {
        match tokio::time::timeout(timeout, call(socket.to_path_buf(), max_bytes)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        }
    })
}

async fn call(socket: PathBuf, max_bytes: usize) -> Result<ListPodResourcesResponse, String> {
    // The URI is tonic's formality: the connector below reaches the socket whatever it says.
    // The bound is the caller's one timeout around all of it (connect, handshake, answer).
    let endpoint = tonic::transport::Endpoint::from_static("http://kubelet.sock");
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move { tokio::net::UnixStream::connect(socket).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
        .map_err(|e| format!("connecting: {}", source_chain(&e)))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(max_bytes);
    grpc.ready().await.map_err(|e| format!("connecting: {}", source_chain(&e)))?;
    let answer = grpc
        .unary(
            tonic::Request::new(ListPodResourcesRequest {}),
            http::uri::PathAndQuery::from_static(LIST),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map_err(|s| format!("List: {:?}: {}", s.code(), s.message()))?;
    Ok(answer.into_inner())
}

/// An error with its causes, `a: b: c`.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// What one call of the watch's thread gave.
#[derive(Clone, Debug)]
pub enum Update {
    /// An answer, as a table, and how long it took.
    Answer(Arc<Assignments>, Duration),
    /// A failure.
    Failed {
        /// What went wrong.
        error: String,
        /// Whether it was the call's timeout.
        timed_out: bool,
    },
}

/// The socket read on a thread of its own.
pub struct Watch {
    /// The socket.
    pub socket: PathBuf,
    /// Each call's bound.
    pub timeout: Duration,
    nudge: crossbeam_channel::Sender<()>,
    updates: crossbeam_channel::Receiver<Update>,
}

impl Watch {
    /// Starts the thread: a call now, then one on each nudge (nudges that come while a call is
    /// under way are one) and every `interval`, each bounded by `timeout` and `max_bytes`. The
    /// thread ends when the watch is dropped (after the call under way, at most `timeout`).
    pub fn start(socket: PathBuf, timeout: Duration, max_bytes: usize, interval: Duration) -> std::io::Result<Watch> {
        let (nudge, nudged) = crossbeam_channel::bounded::<()>(1);
        let (tx, updates) = crossbeam_channel::bounded::<Update>(64);
        let path = socket.clone();
        std::thread::Builder::new().name("gpufrag-podres".into()).spawn(move || loop {
            let update = match list(&path, timeout, max_bytes) {
                Ok(r) => {
                    let t = Instant::now();
                    let a = Assignments::from_response(&r);
                    Update::Answer(Arc::new(a), t.elapsed())
                }
                Err(error) => Update::Failed { timed_out: error.starts_with("no answer within"), error },
            };
            // A pipeline that stopped draining loses updates, never blocks this thread.
            let _ = tx.try_send(update);
            match nudged.recv_timeout(interval) {
                Ok(()) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
        })?;
        Ok(Watch { socket, timeout, nudge, updates })
    }

    /// Asks for a fresh call (a new container was seen); never blocks.
    pub fn nudge(&self) {
        let _ = self.nudge.try_send(());
    }

    /// The updates that came since the last drain, oldest first.
    pub fn drain(&self) -> Vec<Update> {
        self.updates.try_iter().collect()
    }
}

/// The agent's watch of `socket` (`--pod-resources-socket`), or the note saying why it is off:
/// `none` turns it off; a socket absent at start is watched all the same where its directory is
/// there (the DaemonSet's mount of the kubelet's directory, the kubelet restarting: each call
/// fails at once, counted, until the kubelet serves it again), and is off where its directory
/// is absent too (a node without a kubelet).
pub fn open(socket: &Path, timeout: Duration) -> Result<Watch, String> {
    if socket.as_os_str() == "none" {
        return Err("pod-resources socket: off (--pod-resources-socket none): pods are named from the runtime's annotations, else the container's environment".into());
    }
    let dir_there = socket.parent().is_some_and(|d| !d.as_os_str().is_empty() && d.is_dir());
    if std::fs::symlink_metadata(socket).is_err() && !dir_there {
        return Err(format!(
            "pod-resources socket {}: absent at start, and its directory too, not read: pods are named from the runtime's annotations, else the container's environment, and no GPUs assigned are known",
            socket.display()
        ));
    }
    Watch::start(socket.to_path_buf(), timeout, ANSWER_MAX, REFRESH_INTERVAL)
        .map_err(|e| format!("pod-resources socket {}: its thread could not start: {e}", socket.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::podres_api::{ContainerDevices, ContainerResources, PodResources};
    use super::*;

    fn pod(ns: &str, name: &str, containers: &[(&str, &[(&str, &str)])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .map(|(c, devs)| ContainerResources {
                    name: c.to_string(),
                    devices: devs
                        .iter()
                        .map(|(r, id)| ContainerDevices { resource_name: r.to_string(), device_ids: vec![id.to_string()] })
                        .collect(),
                })
                .collect(),
        }
    }

    fn key(ns: &str, p: &str, c: &str) -> ContainerKey {
        ContainerKey { namespace: ns.into(), pod: p.into(), container: c.into() }
    }

    #[test]
    fn gpus_are_the_nvidia_resources_device_ids_and_replicas_are_their_gpu() {
        let r = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ml", "a", &[("main", &[("nvidia.com/gpu", "GPU-1"), ("nvidia.com/gpu", "GPU-2"), ("example.com/nic", "eth1")])]),
                pod("ml", "b", &[("main", &[("nvidia.com/gpu", "GPU-3::0")]), ("side", &[])]),
                pod("dev", "c", &[("x", &[("nvidia.com/gpu", "GPU-3::1"), ("nvidia.com/mig-1g.10gb", "MIG-9")])]),
            ],
        };
        let a = Assignments::from_response(&r);
        assert_eq!(a.gpus_of(&key("ml", "a", "main")), Some(&["GPU-1".to_string(), "GPU-2".to_string()][..]));
        assert_eq!(a.gpus_of(&key("ml", "b", "side")), Some(&[][..]), "listed, no GPU");
        assert_eq!(a.gpus_of(&key("ml", "b", "other")), None);
        assert_eq!(a.gpus_of(&key("dev", "c", "x")), Some(&["GPU-3".to_string(), "MIG-9".to_string()][..]));
        assert_eq!(a.holders("GPU-1"), &[key("ml", "a", "main")]);
        assert_eq!(a.holders("GPU-3"), &[key("ml", "b", "main"), key("dev", "c", "x")], "a time-sliced GPU has two holders");
        assert!(a.holders("eth1").is_empty() && a.holders("GPU-4").is_empty());
        assert_eq!((a.containers(), a.with_gpus()), (4, 3));
    }

    #[test]
    fn an_absent_socket_is_an_error_at_once() {
        let t = Instant::now();
        let e = list(Path::new("/nonexistent/gpufrag/kubelet.sock"), CALL_TIMEOUT, ANSWER_MAX).unwrap_err();
        assert!(e.contains("connecting") && e.contains("No such file"), "{e}");
        assert!(t.elapsed() < CALL_TIMEOUT, "{:?}", t.elapsed());
    }

    #[test]
    fn a_socket_that_accepts_and_never_answers_is_given_up_at_the_timeout() {
        let dir = std::env::temp_dir().join(format!("gpufrag-podres-hang-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubelet.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let held = std::thread::spawn(move || {
            listener.accept().map(|(s, _)| {
                std::thread::sleep(Duration::from_secs(3));
                drop(s)
            })
        });
        let t = Instant::now();
        let e = list(&path, Duration::from_millis(300), ANSWER_MAX).unwrap_err();
        let took = t.elapsed();
        assert!(e.starts_with("no answer within 300 ms"), "{e}");
        assert!(took >= Duration::from_millis(290) && took < Duration::from_millis(1500), "{took:?}");
        let _ = held.join();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
