//! Which container and which pod a process runs in, from the text of its `/proc/PID/cgroup`.
//!
//! The file has one line per hierarchy, `ID:CONTROLLERS:PATH`: cgroup v1 lists one line per
//! controller (`4:memory:/...`, `9:name=systemd:/...`), cgroup v2 one line `0::/...`, and hybrid
//! machines both. Container runtimes name a container's cgroup after its id, in forms that
//! differ by runtime and by cgroup driver:
//!
//! | runtime | cgroupfs driver | systemd driver |
//! |---|---|---|
//! | docker | `/docker/ID` | `/system.slice/docker-ID.scope` |
//! | podman | `/libpod_parent/libpod-ID` | `/machine.slice/libpod-ID.scope` (`.../container` with split cgroups) |
//! | containerd (Kubernetes) | `/kubepods/burstable/podUID/ID` | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podUID.slice/cri-containerd-ID.scope` |
//! | CRI-O (Kubernetes) | `/kubepods/besteffort/podUID/ID` | `.../kubepods-besteffort-podUID.slice/crio-ID.scope` |
//!
//! An id is 64 hex digits. A pod UID is a UUID, written with `_` for `-` in systemd slice names
//! (a static pod's UID is 32 hex digits). Guaranteed pods sit directly under `kubepods`. The
//! innermost container wins (docker in podman, kind nodes); `.mount` units and conmon scopes
//! (`crio-conmon-ID.scope`, `libpod-conmon-ID.scope`) are not containers. A path with no id in
//! it is a host process (systemd slices and sessions, a batch system's own groups): no
//! container, and nothing missing. A path with a 64-hex id in a form not listed above, or a
//! pod's group without a container id, is [`Placement::Unknown`]: the caller counts it and
//! declares the container unknown rather than guessing.

/// Where a process's cgroup path places it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Not in a container (or in a cgroup namespace that hides it: `0::/`).
    Host,
    /// In a container.
    Container(Container),
    /// A form this parser does not know: the container is not named.
    Unknown {
        /// The path that was not understood.
        path: String,
        /// The pod UID, when the path names a pod.
        pod_uid: Option<String>,
    },
}

/// A container, as the cgroup path names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// The container id (64 hex digits).
    pub id: String,
    /// The runtime the path form belongs to: `docker`, `podman`, `containerd`, `cri-o`, or
    /// `kubernetes` (a kubepods cgroupfs path, which does not say which runtime).
    pub runtime: &'static str,
    /// The Kubernetes pod UID, with dashes, when the container belongs to a pod.
    pub pod_uid: Option<String>,
}

/// Why a cgroup file could not be read as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// 1-based line.
    pub line: usize,
    /// What was wrong.
    pub what: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

/// The placement a `/proc/PID/cgroup` text gives. The v2 line, the `name=systemd` line and the
/// `memory`, `pids`, `cpu` lines are read in that order; of the lines that name a container the
/// one with the deepest path wins (the first of those), else the first that names an unknown form,
/// else the process is on the host. Deepest, because a runtime nested in a container (podman in
/// podman, a kind node's containerd) may set up only some hierarchies: on a hybrid host the
/// nested runc leaves the v2 line at the outer container's group while every v1 controller places
/// the process in its own container below it (tests/fixtures/cgroup/podman-in-podman-hybrid.txt).
pub fn parse_file(text: &str) -> Result<Placement, Malformed> {
    let mut paths: Vec<(u8, &str)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Malformed { line: i + 1, what: format!("expected ID:CONTROLLERS:PATH, found {:?}", truncate(line)) });
        };
        if id.parse::<u32>().is_err() {
            return Err(Malformed { line: i + 1, what: format!("hierarchy id {:?} is not a number", truncate(id)) });
        }
        let rank = match controllers {
            "" => 0,
            "name=systemd" => 1,
            c if c.split(',').any(|x| x == "memory") => 2,
            c if c.split(',').any(|x| x == "pids") => 3,
            c if c.split(',').any(|x| x == "cpu") => 4,
            _ => 5,
        };
        paths.push((rank, path));
    }
    if paths.is_empty() {
        return Err(Malformed { line: 0, what: "no cgroup lines".into() });
    }
    paths.sort_by_key(|p| p.0);
    let mut unknown = None;
    let mut deepest: Option<(usize, Container)> = None;
    for (_, p) in &paths {
        match parse_path(p) {
            Placement::Container(c) => {
                let depth = p.split('/').filter(|c| !c.is_empty()).count();
                if deepest.as_ref().is_none_or(|(d, _)| depth > *d) {
                    deepest = Some((depth, c));
                }
            }
            u @ Placement::Unknown { .. } => {
                unknown.get_or_insert(u);
            }
            Placement::Host => {}
        }
    }
    if let Some((_, c)) = deepest {
        return Ok(Placement::Container(c));
    }
    Ok(unknown.unwrap_or(Placement::Host))
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && is_hex(s)
}

/// A pod UID from `pod<UID>` (cgroupfs) or `...-pod<UID>.slice` (systemd), with dashes.
fn pod_uid(component: &str) -> Option<String> {
    let c = component.strip_suffix(".slice").unwrap_or(component);
    let at = c.rfind("pod")?;
    if at > 0 && !c[..at].ends_with('-') {
        return None;
    }
    if at > 0 && !c.starts_with("kubepods") {
        return None;
    }
    let uid = c[at + 3..].replace('_', "-");
    let uuid_form =
        uid.len() == 36 && uid.char_indices().all(|(i, ch)| if [8, 13, 18, 23].contains(&i) { ch == '-' } else { ch.is_ascii_hexdigit() });
    let static_form = uid.len() == 32 && is_hex(&uid);
    (uuid_form || static_form).then(|| uid.to_ascii_lowercase())
}

/// The container id a component names, with the runtime its form belongs to (`None` for a bare
/// id, whose runtime the parent says).
fn container_component(c: &str) -> Option<(String, Option<&'static str>)> {
    if c.ends_with(".mount") || c.contains("-conmon-") {
        return None;
    }
    let base = c.strip_suffix(".scope").unwrap_or(c);
    for (prefix, runtime) in [("docker-", "docker"), ("libpod-", "podman"), ("cri-containerd-", "containerd"), ("crio-", "cri-o")] {
        if let Some(id) = base.strip_prefix(prefix) {
            return is_container_id(id).then(|| (id.to_string(), Some(runtime)));
        }
    }
    is_container_id(base).then(|| (base.to_string(), None))
}

/// The placement one cgroup path gives.
pub fn parse_path(path: &str) -> Placement {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != "." && *c != "..").collect();
    let mut found: Option<Container> = None;
    let mut pod: Option<String> = None;
    let mut in_kubepods = false;
    let mut parent = "";
    for c in &comps {
        if *c == "kubepods" || c.starts_with("kubepods.slice") || c.starts_with("kubepods-") {
            in_kubepods = true;
        }
        if let Some(uid) = pod_uid(c) {
            pod = Some(uid);
        } else if let Some((id, runtime)) = container_component(c) {
            let runtime = runtime.unwrap_or(match parent {
                "docker" => "docker",
                "libpod_parent" => "podman",
                _ if in_kubepods => "kubernetes",
                _ => "",
            });
            if runtime.is_empty() {
                return Placement::Unknown { path: path.to_string(), pod_uid: pod };
            }
            // The innermost container wins; a pod seen above it is its pod.
            found = Some(Container { id, runtime, pod_uid: pod.clone().filter(|_| in_kubepods) });
        }
        parent = c;
    }
    if let Some(c) = found {
        return Placement::Container(c);
    }
    let stray_id = comps.iter().any(|c| {
        !c.ends_with(".mount")
            && !c.contains("-conmon-")
            && c.as_bytes().windows(64).any(|w| w.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)))
    });
    if stray_id || pod.is_some() {
        return Placement::Unknown { path: path.to_string(), pod_uid: pod };
    }
    Placement::Host
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const ID: &str = "2327a2aec169e25cf05f2a901486b7463fdb513ae097fc0ae6a3ca94381ddc40";

    fn container(text: &str) -> Container {
        match parse_file(text).unwrap() {
            Placement::Container(c) => c,
            other => panic!("expected a container in {text:?}, got {other:?}"),
        }
    }

    /// One test per runtime layout kept in tests/fixtures/cgroup. The files (and tests) named
    /// `synthetic` reproduce the path forms the runtimes document; the others were read from
    /// real processes on the CI machine (its README says how each was captured, the command).
    macro_rules! layout {
        ($name:ident, $file:literal, $id:expr, $runtime:expr, $pod:expr) => {
            #[test]
            fn $name() {
                let c = container(include_str!(concat!("../../tests/fixtures/cgroup/", $file)));
                assert_eq!((c.id.as_str(), c.runtime, c.pod_uid.as_deref()), ($id, $runtime, $pod));
            }
        };
    }

    layout!(
        podman_cgroupfs_on_hybrid_v1,
        "podman-cgroupfs-hybrid.txt",
        "6e5409a5a5c3d7a34c2116f355b471ef9406633e12150fbd063a6de8d6d50dcb",
        "podman",
        None
    );
    layout!(
        synthetic_podman_systemd_v2,
        "synthetic-podman-systemd-v2.txt",
        "9d4c0e5c7fe6a9bd3ddbf5e8a32f7c0f1c8ed1c7c4d70a0f0a1f5f8b2c0e6a11",
        "podman",
        None
    );
    layout!(
        synthetic_podman_rootless_split_v2,
        "synthetic-podman-rootless-split-v2.txt",
        "1b2f0b6cbe0a4c1ad0c4b0a4b42c9f4ef3b7bc2b6ccf1b3f64b5bbf7b44a7c61",
        "podman",
        None
    );
    layout!(
        synthetic_docker_cgroupfs_v1,
        "synthetic-docker-cgroupfs-v1.txt",
        "3f1d2c6e1a49c2f2e3c4c89e3a8b0c7d4a9f8e1d2c3b4a5f6e7d8c9b0a1f2e3d",
        "docker",
        None
    );
    layout!(
        synthetic_docker_systemd_v2,
        "synthetic-docker-systemd-v2.txt",
        "c0ffee00d15ea5e5c0ffee00d15ea5e5c0ffee00d15ea5e5c0ffee00d15ea5e5",
        "docker",
        None
    );
    layout!(
        synthetic_containerd_systemd_v2,
        "synthetic-containerd-systemd-v2.txt",
        ID,
        "containerd",
        Some("c704ef4c297ab11032b83ce52cbfc87b")
    );
    layout!(
        synthetic_containerd_cgroupfs_v1,
        "synthetic-containerd-cgroupfs-v1.txt",
        "8e7f3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f",
        "kubernetes",
        Some("5d7a5a2e-8c3b-4c5e-9a6b-2f7e3b1c0d4a")
    );
    layout!(synthetic_crio_systemd_v2, "synthetic-crio-systemd-v2.txt", ID, "cri-o", Some("b3922967-14e1-4867-9388-461bac94b37e"));
    layout!(
        synthetic_crio_systemd_v1,
        "synthetic-crio-systemd-v1.txt",
        "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
        "cri-o",
        Some("0e8e9f3a-2b4c-4d6e-8f0a-1b3c5d7e9f02")
    );
    layout!(
        synthetic_guaranteed_pod_cgroupfs_v2,
        "synthetic-containerd-guaranteed-cgroupfs-v2.txt",
        ID,
        "kubernetes",
        Some("0e8e9f3a-2b4c-4d6e-8f0a-1b3c5d7e9f02")
    );
    layout!(
        synthetic_docker_in_podman_innermost_wins,
        "synthetic-dind-podman-docker-v1.txt",
        "1575e8b4a92a9c340a657f3df4ddc0f6a6305c200879f3898b26368ad019b503",
        "docker",
        Some("a2acd1bccd50fd7790183537181f658e")
    );

    // real: podman in a privileged podman container on this hybrid host: the nested runc sets up
    // the v1 controllers (each names the outer container, then its own) but leaves the v2 line at
    // the outer container's group; the process is in the inner container
    layout!(
        podman_in_podman_on_hybrid_the_inner_container_wins_over_the_v2_line,
        "podman-in-podman-hybrid.txt",
        "a12b9e126fee4b4c896616e92df5b16c671b6dbcc46405fb19761d6f067355e3",
        "podman",
        None
    );

    /// The id podman gave the container of capture.sh's run (`podman inspect -f {{.Id}}`).
    const CAPTURED: &str = "0e0f781ff0d4852901ac7db8d1e6fb56137a75d8efcb79eb9f0f05bb670e5ffe";

    // real: a podman container placed under a Kubernetes-like cgroupfs pod parent, read from the
    // host: the container is podman's (`libpod-ID`), its pod the parent's
    layout!(
        podman_under_a_kubepods_parent_cgroupfs_hybrid,
        "podman-kubepods-parent-cgroupfs-hybrid.txt",
        CAPTURED,
        "podman",
        Some("7c1d3e5f-2a4b-4c6d-8e0f-1a2b3c4d5e6f")
    );

    // real: the same process read from inside a container with its own cgroup namespace
    layout!(
        a_private_cgroup_namespace_reads_relative_paths,
        "podman-seen-from-private-cgroupns-hybrid.txt",
        CAPTURED,
        "podman",
        Some("7c1d3e5f-2a4b-4c6d-8e0f-1a2b3c4d5e6f")
    );

    #[test]
    fn host_processes_are_on_the_host() {
        for f in [
            include_str!("../../tests/fixtures/cgroup/host-hybrid-plain.txt"),
            // real: this machine's own shell, its memory controller in a 32-hex sandbox group
            include_str!("../../tests/fixtures/cgroup/host-this-machine-hybrid.txt"),
            // real: a container's own view from inside its private namespace names nothing
            include_str!("../../tests/fixtures/cgroup/podman-own-view-private-cgroupns-hybrid.txt"),
            include_str!("../../tests/fixtures/cgroup/synthetic-host-systemd-v2.txt"),
            "0::/\n",
        ] {
            assert_eq!(parse_file(f).unwrap(), Placement::Host, "{f}");
        }
    }

    #[test]
    fn unknown_forms_are_said_unknown() {
        let t = include_str!("../../tests/fixtures/cgroup/synthetic-unknown-form-v2.txt");
        assert!(matches!(parse_file(t).unwrap(), Placement::Unknown { pod_uid: None, .. }), "{:?}", parse_file(t));
        // A pod's group without a container id in it.
        let p = parse_path("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb3922967_14e1_4867_9388_461bac94b37e.slice");
        assert_eq!(
            p,
            Placement::Unknown {
                path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb3922967_14e1_4867_9388_461bac94b37e.slice".into(),
                pod_uid: Some("b3922967-14e1-4867-9388-461bac94b37e".into())
            }
        );
    }

    #[test]
    fn mount_units_and_conmon_are_not_containers() {
        assert_eq!(
            parse_path(&format!("/system.slice/run-containerd-io.containerd.runtime.v2.task-k8s.io-{ID}-rootfs.mount")),
            Placement::Host
        );
        assert_eq!(parse_path(&format!("/machine.slice/libpod-conmon-{ID}.scope")), Placement::Host);
        assert_eq!(parse_path(&format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb3922967_14e1_4867_9388_461bac94b37e.slice/crio-conmon-{ID}.scope")), Placement::Unknown { path: format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb3922967_14e1_4867_9388_461bac94b37e.slice/crio-conmon-{ID}.scope"), pod_uid: Some("b3922967-14e1-4867-9388-461bac94b37e".into()) });
    }

    #[test]
    fn synthetic_a_private_cgroup_namespace_reads_relative_systemd_paths() {
        // Read from inside another cgroup namespace, the path climbs out with `..`.
        let c = container(&format!("0::/../../machine.slice/libpod-{ID}.scope\n"));
        assert_eq!((c.id.as_str(), c.runtime), (ID, "podman"));
    }

    #[test]
    fn malformed_files_are_errors_with_their_line() {
        assert_eq!(parse_file("").unwrap_err().line, 0);
        assert_eq!(parse_file("0::/\nnonsense\n").unwrap_err().line, 2);
        assert_eq!(parse_file("x:memory:/\n").unwrap_err().line, 1);
    }

    proptest::proptest! {
        /// Whatever the bytes, the parser answers (an error or a placement), never panics, and a
        /// container it names has a 64-hex id.
        #[test]
        fn any_text_is_answered(s in "(\\PC|[0-9a-f:/\\-_.\\n]){0,300}") {
            if let Ok(Placement::Container(c)) = parse_file(&s) {
                proptest::prop_assert!(is_container_id(&c.id));
            }
        }

        /// Every runtime form with any id and pod UID reads back to that id and UID.
        #[test]
        fn generated_kubernetes_paths_round_trip(id in "[0-9a-f]{64}", uid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", qos in proptest::sample::select(vec!["burstable", "besteffort"]), form in 0usize..3) {
            let u = uid.replace('-', "_");
            let path = match form {
                0 => format!("/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/cri-containerd-{id}.scope"),
                1 => format!("/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/crio-{id}.scope"),
                _ => format!("/kubepods/{qos}/pod{uid}/{id}"),
            };
            let Placement::Container(c) = parse_path(&path) else { panic!("{path}") };
            proptest::prop_assert_eq!(c.id, id);
            proptest::prop_assert_eq!(c.pod_uid, Some(uid));
        }
    }
}
