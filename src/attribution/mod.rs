//! Who a traced process is and which GPU it uses, as the node sees it: its executable name, its
//! container and Kubernetes pod ([`cgroup`], the process's environment, the pod's service
//! account files), and the physical GPU behind each of its CUDA ordinals ([`gpu`]).
//!
//! [`Attribution`] reads `/proc/PID/{exe,comm,cgroup,environ}` once per process image, when the
//! process is first seen (its start or exec: a short-lived process is gone by the next tick),
//! and keeps the answer while the process lives. Each event's device is turned from the
//! process's CUDA ordinal into the node's GPU index ([`Attribution::node_device`]) before it is
//! applied, so that per-device figures, NVML's free memory and `hw.id` are the GPU's, whatever
//! `CUDA_VISIBLE_DEVICES` or the container toolkit made the process see.
//!
//! What cannot be known is said: an unreadable `/proc` entry, a cgroup path of an unknown form,
//! a container whose root is gone, NVML absent, a MIG UUID NVML lists no instance for. Each is
//! counted by kind, the
//! first few are kept with their pid, and the summary lists them as gaps; nothing is guessed
//! (a device that cannot be placed keeps its ordinal, and says so).

pub mod cgroup;
pub mod gpu;
pub mod mig;
pub mod mps;
pub mod oci;
pub mod podres;
pub mod podres_api;
pub mod pods;

use gpu::{NodeGpus, VisibleEnv};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Read;
#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

/// How many gaps are kept verbatim (all are counted).
pub const KEPT_GAPS: usize = 20;

/// The most bytes of `/proc/PID/environ` read (a process's environment is usually a few KiB).
const ENVIRON_LIMIT: u64 = 1 << 20;

/// A process's identity as exported: `process.executable.name`, `container.id`, `k8s.*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Base name of `/proc/PID/exe`, else its `comm`, else `unknown`.
    pub exe: String,
    /// The container id, when the process is in a container.
    pub container_id: Option<String>,
    /// The runtime its cgroup path belongs to (`podman`, `docker`, `containerd`, `cri-o`,
    /// `kubernetes`).
    pub container_runtime: Option<&'static str>,
    /// `k8s.pod.uid`.
    pub pod_uid: Option<String>,
    /// `k8s.pod.name`.
    pub pod_name: Option<String>,
    /// `k8s.namespace.name`.
    pub namespace: Option<String>,
    /// `k8s.container.name`.
    pub container_name: Option<String>,
    /// Which source named its pod and container ([`pods::SOURCE_PODRES`]: the kubelet's
    /// pod-resources socket; [`pods::SOURCE_OCI`]: the runtime's OCI annotations;
    /// [`pods::SOURCE_ENV`]: the container's own environment), `None` when none did.
    pub identity_source: Option<&'static str>,
    /// The GPUs (UUIDs) the kubelet's pod-resources socket lists for its container, `None` when
    /// the socket is not read or does not list the container ([`podres`]).
    pub assigned_gpus: Option<Vec<String>>,
}

impl Identity {
    /// The OpenTelemetry attributes this identity adds to a process's series, in a fixed order,
    /// only those known.
    pub fn attributes(&self) -> Vec<(&'static str, &str)> {
        let mut out = Vec::new();
        for (k, v) in [
            ("container.id", &self.container_id),
            ("k8s.pod.uid", &self.pod_uid),
            ("k8s.pod.name", &self.pod_name),
            ("k8s.namespace.name", &self.namespace),
            ("k8s.container.name", &self.container_name),
        ] {
            if let Some(v) = v {
                out.push((k, v.as_str()));
            }
        }
        out
    }

    /// A short label for views: `pod NS/NAME` or `container ID12`, else empty.
    pub fn place(&self) -> String {
        match (&self.namespace, &self.pod_name, &self.container_id) {
            (Some(ns), Some(p), _) => format!("{ns}/{p}"),
            (None, Some(p), _) => p.clone(),
            (_, None, Some(c)) => c.chars().take(12).collect(),
            _ => String::new(),
        }
    }
}

/// What could not be known, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GapKind {
    /// `/proc/PID/cgroup` could not be read.
    CgroupUnreadable,
    /// `/proc/PID/cgroup` has a form the parser does not know (or is malformed).
    CgroupUnknown,
    /// `/proc/PID/environ` could not be read: the GPU behind each ordinal is not known.
    EnvironUnreadable,
    /// The process's root (`/proc/PID/root`) is gone: its pod's namespace is not known.
    RootVanished,
    /// A CUDA ordinal could not be placed on a node GPU.
    GpuUnresolved,
    /// NVML is absent: GPUs are known by index only.
    NvmlAbsent,
    /// A sharing layer's limit variable did not parse (`crate::limits`): no limit is assumed.
    LimitUnreadable,
    /// A container process the pod-resources socket could not name: the GPUs it uses were given
    /// to more than one container (or its pod's name is another container's).
    PodAmbiguous,
    /// A container named by its annotations that the pod-resources socket does not list.
    PodUnlisted,
    /// A process uses a GPU the pod-resources socket did not give its container.
    GpuNotAssigned,
    /// A MIG UUID names no instance NVML lists (or NVML could not list them): the device's
    /// memory and limit are unknown.
    MigUnmatched,
    /// NVML's MIG instances could not all be read ([`mig`]).
    MigUnreadable,
}

impl GapKind {
    /// The name used in notes.
    pub fn name(self) -> &'static str {
        match self {
            GapKind::CgroupUnreadable => "cgroup unreadable",
            GapKind::CgroupUnknown => "cgroup form unknown",
            GapKind::EnvironUnreadable => "environ unreadable",
            GapKind::RootVanished => "container root vanished",
            GapKind::GpuUnresolved => "GPU unresolved",
            GapKind::NvmlAbsent => "NVML absent",
            GapKind::LimitUnreadable => "sharing limit unreadable",
            GapKind::PodAmbiguous => "pod-resources ambiguous",
            GapKind::PodUnlisted => "pod-resources unlisted",
            GapKind::GpuNotAssigned => "GPU not assigned",
            GapKind::MigUnmatched => "MIG instance unmatched",
            GapKind::MigUnreadable => "MIG instances unreadable",
        }
    }
}

/// How many early reads are kept at most (they are consumed when the process's first event is
/// applied; a flood of processes that never send one cannot grow this).
const PREFETCH_LIMIT: usize = 4096;

/// What `/proc/PID` said, read in one go (see [`Attribution::prefetch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRead {
    /// Base name of `exe`, else `comm`, else `unknown`.
    pub exe: String,
    /// `cgroup`'s text, or why it could not be read.
    pub cgroup: Result<String, String>,
    /// `environ` (at most 1 MiB of it), parsed once, or why it could not be read.
    pub environ: Result<crate::hello::Environ, String>,
    /// The pod namespace file of the process's root (the service account's), `None` when it
    /// has none, or why the root could not be reached.
    pub namespace: Result<Option<String>, String>,
    /// What the node said of the process's container ([`pods::NodePods`]), filled by the source
    /// that knows it (the eBPF session, from the exec hold's reading of the runtime's config).
    pub node: Option<Arc<pods::PodNames>>,
}

impl ProcRead {
    /// Reads `root/PID/{exe,comm,cgroup,environ,root}` now.
    pub fn read(root: &std::path::Path, pid: u32) -> ProcRead {
        let dir = root.join(pid.to_string());
        let take = |what: &str| -> Result<Vec<u8>, String> {
            let mut out = Vec::new();
            std::fs::File::open(dir.join(what)).and_then(|f| f.take(ENVIRON_LIMIT).read_to_end(&mut out)).map_err(|e| e.to_string())?;
            Ok(out)
        };
        let mut exe = "unknown".to_string();
        if let Some(n) = std::fs::read_link(dir.join("exe")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())) {
            // A deleted executable reads as "name (deleted)".
            exe = n.trim_end_matches(" (deleted)").to_string();
        } else if let Ok(c) = std::fs::read_to_string(dir.join("comm")) {
            if !c.trim().is_empty() {
                exe = c.trim().to_string();
            }
        }
        let proc_root = dir.join("root");
        let namespace = match std::fs::read_link(&proc_root) {
            Err(e) => Err(e.to_string()),
            Ok(_) => Ok(std::fs::read_to_string(proc_root.join("var/run/secrets/kubernetes.io/serviceaccount/namespace"))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())),
        };
        // A process that has exited (a zombie) reads as an empty environment: not its own.
        let environ = take("environ").and_then(|b| {
            if b.is_empty() {
                Err("empty (the process has exited)".to_string())
            } else {
                Ok(crate::hello::Environ::parse(&b))
            }
        });
        let mut cgroup = take("cgroup").map(|b| String::from_utf8_lossy(&b).into_owned());
        // An exited process (a zombie, state Z or X in `stat`) has left its v1 cgroups for the
        // root while its v2 line stays: its file no longer says its container (a nested
        // container's process would read as the outer one's). Unknown, not wrong.
        if cgroup.is_ok() && exited(&dir) {
            cgroup = Err("the process has exited: its cgroup file no longer names its container".to_string());
        }
        ProcRead { exe, cgroup, environ, namespace, node: None }
    }
}

/// Whether the process of `/proc/PID` directory `dir` has exited (`stat`'s state after the
/// command's closing parenthesis is `Z` or `X`); false when `stat` cannot be read.
fn exited(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("stat"))
        .ok()
        .and_then(|s| s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next().map(|st| matches!(st, "Z" | "X"))))
        .unwrap_or(false)
}

struct Known {
    identity: Arc<Identity>,
    /// `None`: the environment could not be read.
    env: Option<VisibleEnv>,
    /// Ordinal → node index, as placed (the ordinal itself when it could not be).
    placed: BTreeMap<i16, i16>,
    /// The sharing layers' limits its environment sets (`crate::limits`).
    limits: crate::limits::ProcessLimits,
    /// Its GPUs were placed anew since the pod-resources table was last matched against it.
    dirty: bool,
    /// The ordinals placed on the word of its environment or its driver (not taken at their
    /// face for want of either): only these name a container by its GPU.
    sure: BTreeSet<i16>,
    /// The pod-resources table's generation when it was identified.
    seen_gen: u64,
    /// What the pod-resources matching already counted of it (ambiguous, unlisted, a GPU not
    /// assigned): each once.
    pods_noted: BTreeSet<String>,
}

/// How many distinct errors of the pod-resources socket are kept verbatim (all are counted).
const KEPT_SOCKET_ERRORS: usize = 3;

/// The most container ids kept to tell a new container (a nudge of the socket's watch) from one
/// seen before; past it the set starts again (a few extra calls).
const CONTAINERS_SEEN_MAX: usize = 4096;

/// The kubelet's pod-resources socket as read for this node ([`podres::Watch`]).
struct PodsLink {
    watch: podres::Watch,
    /// The latest answer.
    table: Option<Arc<podres::Assignments>>,
    /// Answers received (the table's generation).
    generation: u64,
    failures: u64,
    timeouts: u64,
    errors: Vec<String>,
    containers_seen: HashSet<String>,
}

/// Reads and keeps who each live process is.
pub struct Attribution {
    proc_root: PathBuf,
    gpus: NodeGpus,
    known: HashMap<u32, Known>,
    prefetched: HashMap<u32, ProcRead>,
    gaps: BTreeMap<GapKind, u64>,
    kept: Vec<String>,
    /// The pod-resources socket, when read; else why not (a note), when it was asked for.
    pods: Option<Result<PodsLink, String>>,
    /// The MPS control daemons' default limits, asked once per pipe folder a while.
    mps: mps::Daemons,
}

impl Attribution {
    /// Over `/proc` (or a copy of its layout, for tests) with the node's GPUs `gpus`.
    pub fn new(proc_root: impl Into<PathBuf>, gpus: NodeGpus) -> Attribution {
        let mut a = Attribution {
            proc_root: proc_root.into(),
            gpus,
            known: HashMap::new(),
            prefetched: HashMap::new(),
            gaps: BTreeMap::new(),
            kept: Vec::new(),
            pods: None,
            mps: mps::Daemons::default(),
        };
        if a.gpus.uuids.is_none() {
            a.gap(GapKind::NvmlAbsent, 0, "NVML absent: GPUs are known by index only (hw.id gpu-N), and a CUDA_VISIBLE_DEVICES entry given as a UUID cannot be placed".into());
        }
        for p in a.gpus.mig_problems.clone() {
            a.gap(GapKind::MigUnreadable, 0, format!("{p} (a process on such an instance is not placed and its limit is unknown)"));
        }
        a
    }

    /// Over `/proc`, with the node's GPUs read from NVML (`lib`: its path; `none` for none).
    pub fn for_node(lib: Option<&str>) -> Attribution {
        Attribution::new("/proc", node_gpus(lib))
    }

    fn gap(&mut self, kind: GapKind, pid: u32, what: String) {
        *self.gaps.entry(kind).or_insert(0) += 1;
        if self.kept.len() < KEPT_GAPS {
            self.kept.push(if pid == 0 { what } else { format!("pid {pid}: {what}") });
        }
    }

    /// Keeps what was read of `pid` early (when its connection or first probe event arrived,
    /// while it surely ran) for [`Attribution::identify`] to use instead of reading `/proc` late.
    pub fn prefetch(&mut self, pid: u32, read: ProcRead) {
        if self.prefetched.len() >= PREFETCH_LIMIT {
            self.prefetched.clear();
        }
        self.prefetched.insert(pid, read);
    }

    /// Reads `pid`'s `/proc` entries now, unless known or already read.
    pub fn prefetch_now(&mut self, pid: u32) {
        if pid != 0 && !self.known.contains_key(&pid) && !self.prefetched.contains_key(&pid) {
            let r = ProcRead::read(&self.proc_root, pid);
            self.prefetch(pid, r);
        }
    }

    /// Reads who `pid` is now (its start or exec) and keeps it until [`Attribution::forget`].
    /// A process already known whose entries can no longer be read keeps what was read before.
    pub fn identify(&mut self, pid: u32) -> Arc<Identity> {
        let read = match self.prefetched.remove(&pid) {
            Some(r) => r,
            None => ProcRead::read(&self.proc_root, pid),
        };
        if read.cgroup.is_err() && read.environ.is_err() {
            if let Some(k) = self.known.get(&pid) {
                return k.identity.clone();
            }
        }
        let mut id = Identity { exe: read.exe, ..Identity::default() };
        match read.cgroup {
            Err(e) => self.gap(GapKind::CgroupUnreadable, pid, format!("/proc/{pid}/cgroup: {e}: container unknown")),
            Ok(text) => match cgroup::parse_file(&text) {
                Ok(cgroup::Placement::Host) => {}
                Ok(cgroup::Placement::Container(c)) => {
                    id.container_id = Some(c.id);
                    id.container_runtime = Some(c.runtime);
                    id.pod_uid = c.pod_uid;
                }
                Ok(cgroup::Placement::Unknown { path, pod_uid }) => {
                    id.pod_uid = pod_uid;
                    self.gap(
                        GapKind::CgroupUnknown,
                        pid,
                        format!("/proc/{pid}/cgroup: path {path:?} is of no form gpufrag knows: container unknown"),
                    );
                }
                Err(e) => self.gap(GapKind::CgroupUnknown, pid, format!("/proc/{pid}/cgroup: {e}: container unknown")),
            },
        }
        let env = match read.environ {
            Ok(env) => Some(env),
            Err(e) => {
                self.gap(
                    GapKind::EnvironUnreadable,
                    pid,
                    format!("/proc/{pid}/environ: {e}: its CUDA ordinals are taken as node GPU indices, and its pod's names are unknown"),
                );
                None
            }
        };
        let mut visible = None;
        let mut limits = env.as_ref().map(|e| crate::limits::ProcessLimits::from_env(&e.0)).unwrap_or_default();
        for bad in &limits.bad {
            self.gap(GapKind::LimitUnreadable, pid, format!("{bad}: no limit assumed"));
        }
        if let Some(env) = &env {
            let devices = self.gpus.uuids.as_ref().map_or(1, Vec::len);
            match self.mps.default_for(&env.0, devices) {
                mps::Answer::None => {}
                mps::Answer::Limits(l) => {
                    for (ordinal, bytes) in l {
                        limits.by_ordinal.entry(Some(ordinal)).or_default().push(mps::limit(bytes));
                    }
                }
                mps::Answer::Unreadable(why) => self.gap(GapKind::LimitUnreadable, pid, format!("{why}: no limit assumed")),
            }
        }
        if let Some(env) = &env {
            let get = |keys: &[&str]| keys.iter().find_map(|k| env.get(k).filter(|v| !v.is_empty()).map(str::to_string));
            id.pod_name = get(&["K8S_POD_NAME", "POD_NAME", "MY_POD_NAME", "KUBERNETES_POD_NAME"]);
            id.namespace = get(&["K8S_NAMESPACE_NAME", "K8S_POD_NAMESPACE", "POD_NAMESPACE", "MY_POD_NAMESPACE", "KUBERNETES_NAMESPACE"]);
            id.container_name = get(&["K8S_CONTAINER_NAME", "CONTAINER_NAME", "KUBERNETES_CONTAINER_NAME"]);
            if id.pod_uid.is_none() {
                id.pod_uid = get(&["K8S_POD_UID", "POD_UID", "MY_POD_UID"]);
            }
            let in_pod = id.pod_uid.is_some() || env.get("KUBERNETES_SERVICE_HOST").is_some();
            if in_pod && id.pod_name.is_none() {
                // The kubelet sets HOSTNAME to the pod's name (unless the pod sets spec.hostname).
                id.pod_name = get(&["HOSTNAME"]);
            }
            if id.pod_name.is_some() || id.namespace.is_some() || id.container_name.is_some() {
                id.identity_source = Some(pods::SOURCE_ENV);
            }
            visible = Some(VisibleEnv {
                nvidia: env.get("NVIDIA_VISIBLE_DEVICES").map(str::to_string),
                cuda: env.get("CUDA_VISIBLE_DEVICES").map(str::to_string),
            });
        }
        if let Some(n) = &read.node {
            // The node's word over the container's own: a container cannot misname itself.
            id.pod_name = n.pod_name.clone();
            id.namespace = n.namespace.clone();
            id.container_name = n.container_name.clone();
            id.pod_uid = n.pod_uid.clone().or(id.pod_uid);
            id.identity_source = Some(n.source);
        }
        if id.pod_uid.is_some() && id.namespace.is_none() {
            // Every pod with a service account has its namespace in a file of its own root.
            match read.namespace {
                Err(e) => self.gap(GapKind::RootVanished, pid, format!("/proc/{pid}/root: {e}: the pod's namespace is unknown")),
                Ok(ns) => id.namespace = ns,
            }
        }
        let mut seen_gen = 0;
        if let (Some(Ok(link)), Some(c)) = (&mut self.pods, &id.container_id) {
            seen_gen = link.generation;
            if !link.containers_seen.contains(c) {
                // A container not seen before: the kubelet may list it now.
                if link.containers_seen.len() >= CONTAINERS_SEEN_MAX {
                    link.containers_seen.clear();
                }
                link.containers_seen.insert(c.clone());
                link.watch.nudge();
            }
        }
        let identity = Arc::new(id);
        let known = Known {
            identity: identity.clone(),
            env: visible,
            placed: BTreeMap::new(),
            limits,
            dirty: false,
            sure: BTreeSet::new(),
            seen_gen,
            pods_noted: BTreeSet::new(),
        };
        self.known.insert(pid, known);
        self.match_pods(pid).unwrap_or(identity)
    }

    /// Reads the kubelet's pod-resources socket from now on (`Ok`: its watch), or says why it is
    /// not read (`Err`: a note for the summary).
    pub fn set_pod_resources(&mut self, watch: Result<podres::Watch, String>) {
        self.pods = Some(watch.map(|watch| PodsLink {
            watch,
            table: None,
            generation: 0,
            failures: 0,
            timeouts: 0,
            errors: Vec::new(),
            containers_seen: HashSet::new(),
        }));
    }

    /// Takes what the pod-resources socket's watch said since the last call and matches its
    /// latest table against the processes it may name or give GPUs to (all of them on a new
    /// table, else those whose GPUs were placed since): the identities that changed, for the
    /// pipeline to put in place of the old. Cheap: no I/O, the table's lookups only.
    pub fn refresh_pods(&mut self) -> Vec<(u32, Arc<Identity>)> {
        let Some(Ok(link)) = &mut self.pods else { return Vec::new() };
        let mut fresh = false;
        for u in link.watch.drain() {
            match u {
                podres::Update::Answer(table, _) => {
                    link.table = Some(table);
                    link.generation += 1;
                    fresh = true;
                }
                podres::Update::Failed { error, timed_out } => {
                    link.failures += 1;
                    link.timeouts += u64::from(timed_out);
                    if link.errors.len() < KEPT_SOCKET_ERRORS && !link.errors.contains(&error) {
                        link.errors.push(error);
                    }
                }
            }
        }
        let pids: Vec<u32> = self.known.iter().filter(|(_, k)| fresh || k.dirty).map(|(&p, _)| p).collect();
        pids.into_iter().filter_map(|pid| self.match_pods(pid).map(|id| (pid, id))).collect()
    }

    /// Matches `pid` against the latest pod-resources table: a container its annotations named
    /// gets its GPUs; a container process nothing on the node named is named after the one
    /// container the GPUs it uses were given to (none when more than one: counted); a GPU it
    /// uses that its container was not given is counted. The new identity when it changed.
    fn match_pods(&mut self, pid: u32) -> Option<Arc<Identity>> {
        let Some(Ok(link)) = &self.pods else { return None };
        let table = link.table.clone()?;
        let generation = link.generation;
        let uuids = self.gpus.uuids.clone();
        let k = self.known.get_mut(&pid)?;
        k.dirty = false;
        let used: BTreeSet<String> = k
            .placed
            .iter()
            .filter(|(o, _)| k.sure.contains(o))
            .filter_map(|(_, &d)| uuids.as_ref()?.get(usize::try_from(d).ok()?).cloned())
            .filter(|u| u.starts_with("GPU-") || u.starts_with("MIG-"))
            .collect();
        let id = &k.identity;
        let mut new = (**id).clone();
        let mut notes: Vec<(GapKind, String, String)> = Vec::new();
        let key = match (&id.namespace, &id.pod_name, &id.container_name) {
            (Some(ns), Some(p), Some(c)) => Some(podres::ContainerKey { namespace: ns.clone(), pod: p.clone(), container: c.clone() }),
            _ => None,
        };
        let by_node = matches!(id.identity_source, Some(pods::SOURCE_OCI) | Some(pods::SOURCE_PODRES));
        match key.filter(|_| by_node) {
            Some(key) => match table.gpus_of(&key) {
                Some(g) => new.assigned_gpus = Some(g.to_vec()),
                // Only a table read after the process was first seen can say it is not listed.
                None if generation > k.seen_gen => notes.push((
                    GapKind::PodUnlisted,
                    "unlisted".into(),
                    format!(
                        "container {key} (named by its {}) is not listed by the pod-resources socket: its GPUs assigned are unknown",
                        id.identity_source.unwrap_or("")
                    ),
                )),
                None => {}
            },
            None if id.container_id.is_some() && !used.is_empty() => {
                let mut holders: Vec<&podres::ContainerKey> = used.iter().flat_map(|u| table.holders(u)).collect();
                holders.sort();
                holders.dedup();
                match holders.as_slice() {
                    [] => {}
                    [one] => {
                        new.namespace = Some(one.namespace.clone());
                        new.pod_name = Some(one.pod.clone());
                        new.container_name = Some(one.container.clone());
                        new.identity_source = Some(pods::SOURCE_PODRES);
                        new.assigned_gpus = table.gpus_of(one).map(<[String]>::to_vec);
                    }
                    many => notes.push((
                        GapKind::PodAmbiguous,
                        "ambiguous".into(),
                        format!(
                            "the GPU(s) it uses ({}) were given to {} containers ({}): not named by the pod-resources socket",
                            used.iter().cloned().collect::<Vec<_>>().join(", "),
                            many.len(),
                            many.iter().take(4).map(|k| k.to_string()).collect::<Vec<_>>().join(", ")
                        ),
                    )),
                }
            }
            None => {}
        }
        if let Some(assigned) = &new.assigned_gpus {
            for u in used.iter().filter(|u| !assigned.contains(u)) {
                notes.push((
                    GapKind::GpuNotAssigned,
                    format!("gpu {u}"),
                    format!(
                        "uses GPU {u}, which the pod-resources socket did not give its container (given: {})",
                        if assigned.is_empty() { "none".to_string() } else { assigned.join(", ") }
                    ),
                ));
            }
        }
        let notes: Vec<(GapKind, String)> =
            notes.into_iter().filter(|(_, tag, _)| k.pods_noted.insert(tag.clone())).map(|(g, _, t)| (g, t)).collect();
        let changed = new != **id;
        if changed {
            k.identity = Arc::new(new);
        }
        let out = changed.then(|| k.identity.clone());
        for (g, t) in notes {
            self.gap(g, pid, t);
        }
        out
    }

    /// Who `pid` is, read now if it was not yet.
    pub fn identity(&mut self, pid: u32) -> Arc<Identity> {
        match self.known.get(&pid) {
            Some(k) => k.identity.clone(),
            None => self.identify(pid),
        }
    }

    /// Whether `pid` was identified (and not forgotten since).
    pub fn knows(&self, pid: u32) -> bool {
        self.known.contains_key(&pid)
    }

    /// The node GPU index of `pid`'s CUDA ordinal `ordinal` (the ordinal itself where it
    /// cannot be placed; that is counted as a gap once per process and ordinal). Pid 0 and
    /// negative devices are returned as they are (node-wide readings; "device unknown").
    pub fn node_device(&mut self, pid: u32, ordinal: i16) -> i16 {
        if pid == 0 || ordinal < 0 {
            return ordinal;
        }
        if !self.known.contains_key(&pid) {
            self.identify(pid);
        }
        let Some(k) = self.known.get(&pid) else { return ordinal };
        if let Some(&d) = k.placed.get(&ordinal) {
            return d;
        }
        let placed = match &k.env {
            None => Err(None),
            Some(env) => self.gpus.resolve(env, ordinal).map_err(Some),
        };
        let sure = placed.is_ok();
        let d = match placed {
            Ok(g) => i16::try_from(g.index).unwrap_or(ordinal),
            Err(why) => {
                if let Some(why) = why {
                    let kind = if matches!(why, gpu::Unresolved::Mig(..)) { GapKind::MigUnmatched } else { GapKind::GpuUnresolved };
                    self.gap(kind, pid, format!("CUDA ordinal {ordinal}: {why}; its figures are filed under device {ordinal}, and its device free is not that GPU's"));
                }
                ordinal
            }
        };
        if let Some(k) = self.known.get_mut(&pid) {
            k.placed.insert(ordinal, d);
            if sure {
                k.sure.insert(ordinal);
            }
            k.dirty = true;
        }
        d
    }

    /// What `pid`'s driver said CUDA ordinal `ordinal` is (a `DeviceUuid` event: the shim's
    /// `cuDeviceGetUuid`, or the eBPF path's reading of NVML's process list): the ordinal is
    /// placed on that GPU from now on, over what the environment said. A UUID NVML does not list
    /// leaves the placement as it was and is counted as a gap.
    pub fn driver_uuid(&mut self, pid: u32, ordinal: i16, uuid: &[u8; 16]) {
        if pid == 0 || ordinal < 0 {
            return;
        }
        if !self.known.contains_key(&pid) {
            self.identify(pid);
        }
        match self.gpus.by_driver_uuid(uuid) {
            Some(g) => {
                let d = i16::try_from(g.index).unwrap_or(ordinal);
                if let Some(k) = self.known.get_mut(&pid) {
                    k.dirty |= k.placed.insert(ordinal, d) != Some(d) || k.sure.insert(ordinal);
                }
            }
            None => {
                let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
                let d = self.node_device(pid, ordinal);
                self.gap(GapKind::GpuUnresolved, pid, format!("CUDA ordinal {ordinal}: the driver names UUID {hex}, which NVML lists as no GPU; filed under device {d} as its environment says"));
            }
        }
    }

    /// The tightest sharing-layer limit (`crate::limits`) `pid` runs under on node device
    /// `device`: that of the CUDA ordinal placed there, or, on a MIG instance, the instance's
    /// memory (`crate::limits::Limit::mig`) when it is tighter.
    pub fn limit_on(&self, pid: u32, device: i16) -> Option<crate::limits::Limit> {
        let k = self.known.get(&pid)?;
        let own = k.placed.iter().filter(|(_, &d)| d == device).find_map(|(&o, _)| k.limits.on(o)).cloned();
        let mig = self.mig_limit(device);
        match (own, mig) {
            (Some(a), Some(b)) => Some(if b.bytes < a.bytes { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// The limit a MIG instance's memory sets on node device `device`, when it is an instance
    /// whose memory NVML gave.
    pub fn mig_limit(&self, device: i16) -> Option<crate::limits::Limit> {
        let m = self.gpus.mig(u32::try_from(device).ok()?)?;
        let parent = self.gpus.uuid(m.parent).unwrap_or("its GPU").to_string();
        Some(crate::limits::Limit::mig(&m.uuid, &parent, m.total?))
    }

    /// The UUID of node device `index` (a GPU's or a MIG instance's), when NVML gave one.
    pub fn gpu_uuid(&self, index: i16) -> Option<&str> {
        self.gpus.uuid(u32::try_from(index).ok()?)
    }

    /// The UUID of the GPU that node device `index` is a MIG instance of, when it is one.
    pub fn mig_parent(&self, index: i16) -> Option<&str> {
        let m = self.gpus.mig(u32::try_from(index).ok()?)?;
        self.gpus.uuid(m.parent)
    }

    /// Forgets `pid` (its process exited): the next process with that pid is read afresh.
    pub fn forget(&mut self, pid: u32) {
        self.known.remove(&pid);
        self.prefetched.remove(&pid);
    }

    /// Processes kept.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Gaps counted, by kind.
    pub fn gap_counts(&self) -> &BTreeMap<GapKind, u64> {
        &self.gaps
    }

    /// The notes for the summary: one line of counts, then the first gaps.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        match &self.pods {
            None => {}
            Some(Err(why)) => out.push(why.clone()),
            Some(Ok(link)) => {
                let last = link
                    .table
                    .as_ref()
                    .map_or_else(String::new, |t| format!(" (the last: {} container(s), {} with GPUs)", t.containers(), t.with_gpus()));
                let mut line = format!(
                    "pod-resources socket {}: {} answer(s){last}, {} call(s) failed ({} with no answer within {} ms; each call bounded, off the pipeline's path)",
                    link.watch.socket.display(),
                    link.generation,
                    link.failures,
                    link.timeouts,
                    link.watch.timeout.as_millis()
                );
                if !link.errors.is_empty() {
                    line.push_str(&format!("; first errors: {}", link.errors.join("; ")));
                }
                out.push(line);
            }
        }
        if self.gaps.is_empty() {
            return out;
        }
        let counts: Vec<String> = self.gaps.iter().map(|(k, n)| format!("{} {n}", k.name())).collect();
        out.push(format!("attribution gaps (what could not be known of processes and GPUs): {}", counts.join(", ")));
        out.extend(self.kept.iter().map(|k| format!("attribution: {k}")));
        out
    }
}

/// The node's GPUs from NVML (`lib`: a path, `none` for no NVML, default `libnvidia-ml.so.1`).
pub fn node_gpus(lib: Option<&str>) -> NodeGpus {
    let nvml = match lib {
        Some("none") => return NodeGpus::default(),
        Some(path) => nvml_wrapper::Nvml::builder().lib_path(std::ffi::OsStr::new(path)).init(),
        None => nvml_wrapper::Nvml::init(),
    };
    let Ok(nvml) = nvml else { return NodeGpus::default() };
    let n = nvml.device_count().unwrap_or(0);
    let mut uuids = Vec::new();
    for i in 0..n {
        match nvml.device_by_index(i).and_then(|d| d.uuid()) {
            Ok(u) => uuids.push(u),
            Err(_) => uuids.push(format!("gpu-{i}")),
        }
    }
    let (migs, mig_problems) = mig::read(&nvml, n);
    NodeGpus { uuids: Some(uuids), migs, mig_problems }
}

/// A `/proc`-like directory for tests: `pid/{cgroup,environ,comm}` written from the arguments.
#[cfg(test)]
fn fake_proc(dir: &Path, pid: u32, cgroup: Option<&str>, environ: Option<&[(&str, &str)]>) -> std::io::Result<()> {
    let d = dir.join(pid.to_string());
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("comm"), "worker\n")?;
    if let Some(c) = cgroup {
        std::fs::write(d.join("cgroup"), c)?;
    }
    if let Some(env) = environ {
        let mut b = Vec::new();
        for (k, v) in env {
            b.extend_from_slice(format!("{k}={v}").as_bytes());
            b.push(0);
        }
        std::fs::write(d.join("environ"), b)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const ID: &str = "2327a2aec169e25cf05f2a901486b7463fdb513ae097fc0ae6a3ca94381ddc40";

    /// A zombie's `/proc/PID/cgroup` no longer says its container: on this hybrid host a nested
    /// container's process that had exited read as its outer container's (the fresh Debian
    /// container's deploy_containers run). Read of a real zombie (a child that exited, not yet
    /// waited for): its cgroup is unknown, not wrong; a live process's is read.
    #[test]
    fn a_zombies_cgroup_is_unknown_not_its_roots() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let dir = Path::new("/proc").join(pid.to_string());
        let t = std::time::Instant::now();
        while !exited(&dir) && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(exited(&dir), "the child never became a zombie");
        let r = ProcRead::read(Path::new("/proc"), pid);
        assert!(r.cgroup.as_ref().is_err_and(|e| e.contains("has exited")), "{:?}", r.cgroup);
        child.wait().unwrap();
        let me = ProcRead::read(Path::new("/proc"), std::process::id());
        assert!(me.cgroup.is_ok() && !exited(&Path::new("/proc").join(std::process::id().to_string())), "{:?}", me.cgroup);
    }

    fn four() -> NodeGpus {
        NodeGpus { uuids: Some((0..4).map(|i| format!("GPU-{i:08x}-0000-4000-8000-000000000000")).collect()), ..NodeGpus::default() }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpufrag-attr-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_pod_process_is_named_from_its_cgroup_and_environment() {
        let d = tmp("pod");
        let cg = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb3922967_14e1_4867_9388_461bac94b37e.slice/cri-containerd-{ID}.scope\n");
        fake_proc(
            &d,
            42,
            Some(&cg),
            Some(&[
                ("HOSTNAME", "trainer-0"),
                ("POD_NAMESPACE", "ml"),
                ("CUDA_VISIBLE_DEVICES", "2"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ]),
        )
        .unwrap();
        let mut a = Attribution::new(&d, four());
        let id = a.identify(42);
        assert_eq!(id.container_id.as_deref(), Some(ID));
        assert_eq!(id.pod_uid.as_deref(), Some("b3922967-14e1-4867-9388-461bac94b37e"));
        assert_eq!((id.pod_name.as_deref(), id.namespace.as_deref()), (Some("trainer-0"), Some("ml")));
        assert_eq!(id.exe, "worker", "no exe link: the comm");
        assert_eq!(a.node_device(42, 0), 2);
        assert_eq!(a.gpu_uuid(2), Some("GPU-00000002-0000-4000-8000-000000000000"));
        assert!(a.notes().is_empty(), "{:?}", a.notes());
    }

    #[test]
    fn unreadable_entries_are_counted_gaps_not_crashes() {
        let d = tmp("gaps");
        // No cgroup file, no environ: both unreadable.
        fake_proc(&d, 7, None, None).unwrap();
        // An unknown form, and a pod whose root is gone (no root link in the fake /proc).
        fake_proc(&d, 8, Some(&format!("0::/weird/{ID}\n")), Some(&[("PATH", "/bin")])).unwrap();
        fake_proc(
            &d,
            9,
            Some(&format!("0::/kubepods/besteffort/pod0e8e9f3a-2b4c-4d6e-8f0a-1b3c5d7e9f02/{ID}\n")),
            Some(&[("CUDA_VISIBLE_DEVICES", "MIG-0e8e9f3a-2b4c-4d6e-8f0a-1b3c5d7e9f02")]),
        )
        .unwrap();
        let mut a = Attribution::new(&d, four());
        let seven = a.identify(7);
        assert_eq!((seven.exe.as_str(), seven.container_id.as_deref()), ("worker", None));
        assert_eq!(a.node_device(7, 1), 1, "no environment: the ordinal is kept");
        assert_eq!(a.identify(8).container_id, None);
        assert_eq!(a.identify(9).container_id.as_deref(), Some(ID));
        assert_eq!(a.node_device(9, 0), 0);
        assert_eq!(a.identify(1234).exe, "unknown", "a process that is gone");
        let c = a.gap_counts();
        assert_eq!(c.get(&GapKind::CgroupUnreadable), Some(&2), "{c:?}");
        assert_eq!(c.get(&GapKind::EnvironUnreadable), Some(&2), "{c:?}");
        assert_eq!(c.get(&GapKind::CgroupUnknown), Some(&1), "{c:?}");
        assert_eq!(c.get(&GapKind::RootVanished), Some(&1), "{c:?}");
        assert_eq!(c.get(&GapKind::MigUnmatched), Some(&1), "a MIG UUID NVML lists no instance for: {c:?}");
        assert!(a.limit_on(9, 0).is_none(), "and no limit invented");
        assert!(a.notes()[0].starts_with("attribution gaps"), "{:?}", a.notes());
    }

    #[test]
    fn without_nvml_indices_still_place_and_the_gap_is_said() {
        let d = tmp("nonvml");
        fake_proc(&d, 5, Some("0::/\n"), Some(&[("CUDA_VISIBLE_DEVICES", "3")])).unwrap();
        let mut a = Attribution::new(&d, NodeGpus::default());
        assert_eq!(a.node_device(5, 0), 3);
        assert_eq!(a.gap_counts().get(&GapKind::NvmlAbsent), Some(&1));
    }

    #[test]
    fn the_cache_is_bounded_by_live_processes() {
        let d = tmp("bounded");
        let mut a = Attribution::new(&d, four());
        for pid in 1..=1000 {
            a.identify(pid);
            a.node_device(pid, 0);
            a.forget(pid);
        }
        assert!(a.is_empty());
        assert!(a.kept.len() <= KEPT_GAPS);
    }
}
