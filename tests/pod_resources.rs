//! Issue 26, item 4: pod names and GPUs from the kubelet's pod-resources socket, against a
//! stand-in kubelet (tests/pod_resources_support/server.py: Python grpcio and protobuf, a separate
//! implementation of the gRPC API, listening on a Unix socket in the test's directory), through
//! the pipeline's [`Attribution`] as the agent uses it: its watch polls the socket on its own
//! thread and the processes are matched at the pipeline's tick.
//!
//! Checked: names and GPUs from the socket (an annotated container gets its GPUs; a container
//! process nothing named is named after the one container its GPU was given to; a shared GPU
//! names no one, counted; a GPU used but not given is a note); a socket that accepts and never
//! answers: each call given up at its bound, counted, and the pipeline's calls never wait; an
//! absent socket: names from the annotations, then the environment; an oversized answer refused.
//!
//! Needs grpcio and protobuf for Python (`scripts/setup.sh` installs them under
//! /opt/gpufrag-ci/podres; `$PODRES_PYTHON` names another interpreter); under CI=true their
//! absence fails the test.

mod pod_resources_support;
mod tool_support;

use gpufrag::attribution::gpu::NodeGpus;
use gpufrag::attribution::pods::{PodNames, SOURCE_OCI};
use gpufrag::attribution::{podres, Attribution, GapKind, ProcRead};
use pod_resources_support::{python, serve, INSTALL};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GPU: [&str; 4] = [
    "GPU-6a5e2b1c-0000-4000-8000-00000000000a",
    "GPU-6a5e2b1c-0000-4000-8000-00000000000b",
    "GPU-6a5e2b1c-0000-4000-8000-00000000000c",
    "GPU-6a5e2b1c-0000-4000-8000-00000000000d",
];

fn dir(name: &str) -> PathBuf {
    // Short: a Unix socket's path is at most 107 bytes.
    let d = std::env::temp_dir().join(format!("gf-podres-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

fn four() -> NodeGpus {
    NodeGpus { uuids: Some(GPU.iter().map(|s| s.to_string()).collect()), ..Default::default() }
}

/// A process in container `ctr` (containerd's cgroup form), with `env`, and what the runtime's
/// annotations said of its container.
fn read(ctr: Option<char>, env: &[(&str, &str)], node: Option<(&str, &str, &str)>) -> ProcRead {
    let cgroup = match ctr {
        Some(c) => format!("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{}.scope\n", c.to_string().repeat(64)),
        None => "0::/user.slice/user-0.slice/session-1.scope\n".to_string(),
    };
    let mut environ = Vec::new();
    for (k, v) in env {
        environ.extend_from_slice(format!("{k}={v}").as_bytes());
        environ.push(0);
    }
    environ.extend_from_slice(b"PATH=/bin\0");
    ProcRead {
        exe: "python3".into(),
        cgroup: Ok(cgroup),
        environ: Ok(gpufrag::hello::Environ::parse(&environ)),
        namespace: Ok(None),
        node: node.map(|(ns, p, c)| {
            Arc::new(PodNames {
                pod_name: Some(p.into()),
                namespace: Some(ns.into()),
                container_name: Some(c.into()),
                pod_uid: None,
                source: SOURCE_OCI,
            })
        }),
    }
}

/// Ticks the pipeline's matching until `done` says so, at most `within`; each tick must return
/// at once.
fn tick_until(a: &mut Attribution, within: Duration, done: impl Fn(&Attribution) -> bool) {
    let end = Instant::now() + within;
    while !done(a) {
        assert!(Instant::now() < end, "not within {within:?}: {:#?}", a.notes());
        let t = Instant::now();
        a.refresh_pods();
        assert!(t.elapsed() < Duration::from_millis(50), "a tick waited {:?}", t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn answered(a: &Attribution) -> bool {
    a.notes().iter().any(|n| n.starts_with("pod-resources socket") && !n.contains(": 0 answer(s)"))
}

const PODS: &str = r#"[
  {"name": "trainer-0", "namespace": "ml", "containers": [
    {"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-6a5e2b1c-0000-4000-8000-00000000000a", "GPU-6a5e2b1c-0000-4000-8000-00000000000b"]},
                                 {"resource_name": "example.com/nic", "device_ids": ["eth1"]}]},
    {"name": "sidecar", "devices": []}]},
  {"name": "eval-3", "namespace": "research", "containers": [
    {"name": "worker", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-6a5e2b1c-0000-4000-8000-00000000000c"]}]}]},
  {"name": "notebook-a", "namespace": "dev", "containers": [
    {"name": "nb", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-6a5e2b1c-0000-4000-8000-00000000000d::0"]}]}]},
  {"name": "notebook-b", "namespace": "dev", "containers": [
    {"name": "nb", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-6a5e2b1c-0000-4000-8000-00000000000d::1"]}]}]}
]"#;

/// Must show (issue 26, item 4): a stand-in pod-resources socket: names and GPUs from it.
#[test]
fn names_and_gpus_come_from_a_stand_in_pod_resources_socket() {
    let Some(py) = python() else {
        tool_support::missing("grpcio and protobuf for Python", INSTALL);
        return;
    };
    let d = dir("names");
    let (_server, sock) = serve(&py, &d, PODS, &[]);
    let mut a = Attribution::new(&d, four());
    a.set_pod_resources(Ok(
        podres::Watch::start(sock.clone(), podres::CALL_TIMEOUT, podres::ANSWER_MAX, podres::REFRESH_INTERVAL).expect("watch")
    ));
    tick_until(&mut a, Duration::from_secs(10), answered);
    let place = |a: &mut Attribution, pid: u32, r: ProcRead, gpu: &str| {
        a.prefetch(pid, r);
        a.identify(pid);
        assert_eq!(a.node_device(pid, 0), gpu.parse::<i16>().expect("index"));
    };
    // 101: annotated as ml/trainer-0/main, its environment misnaming it, on GPU a.
    place(
        &mut a,
        101,
        read(Some('1'), &[("CUDA_VISIBLE_DEVICES", "0"), ("K8S_POD_NAME", "wrong")], Some(("ml", "trainer-0", "main"))),
        "0",
    );
    // 102: a container nothing named, its environment claiming a pod, on GPU c: eval-3's.
    place(&mut a, 102, read(Some('2'), &[("CUDA_VISIBLE_DEVICES", "2"), ("K8S_POD_NAME", "claims-this")], None), "2");
    // 103: a container on GPU d, which two notebooks time-share: not named by the socket.
    place(&mut a, 103, read(Some('3'), &[("CUDA_VISIBLE_DEVICES", "3")], None), "3");
    // 104: annotated as ml/trainer-0/main but on GPU c, which was not given to it.
    place(&mut a, 104, read(Some('4'), &[("CUDA_VISIBLE_DEVICES", "2")], Some(("ml", "trainer-0", "main"))), "2");
    // 105: a host process on GPU c: not a container, never named after one.
    place(&mut a, 105, read(None, &[("CUDA_VISIBLE_DEVICES", "2")], None), "2");
    // 106: annotated as a container the kubelet does not list.
    place(&mut a, 106, read(Some('6'), &[], Some(("ml", "gone-1", "main"))), "0");
    // 108: a container whose environment could not be read: its ordinal 0 is taken as GPU a at
    // its face (GPU a is ml/trainer-0/main's alone), which names no container.
    let mut unread = read(Some('8'), &[], None);
    unread.environ = Err("No such process (os error 3)".into());
    place(&mut a, 108, unread, "0");
    let changed = a.refresh_pods();
    let mut pids: Vec<u32> = changed.iter().map(|(p, _)| *p).collect();
    pids.sort();
    // 101, 104 got their GPUs at identify (the table was in); 102 is named once its GPU is placed.
    assert_eq!(pids, vec![102], "identities changed at the tick");
    let who = |a: &mut Attribution, pid: u32| {
        let id = a.identity(pid);
        (id.namespace.clone(), id.pod_name.clone(), id.container_name.clone(), id.identity_source, id.assigned_gpus.clone())
    };
    let s = |v: &str| Some(v.to_string());
    let gpus = |g: &[&str]| Some(g.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(who(&mut a, 101), (s("ml"), s("trainer-0"), s("main"), Some("oci-annotations"), gpus(&[GPU[0], GPU[1]])));
    assert_eq!(who(&mut a, 102), (s("research"), s("eval-3"), s("worker"), Some("pod-resources"), gpus(&[GPU[2]])));
    assert_eq!(who(&mut a, 103), (None, None, None, None, None), "a shared GPU names no container");
    assert_eq!(who(&mut a, 104), (s("ml"), s("trainer-0"), s("main"), Some("oci-annotations"), gpus(&[GPU[0], GPU[1]])));
    assert_eq!(who(&mut a, 105), (None, None, None, None, None), "a host process");
    assert_eq!(who(&mut a, 106).4, None, "unlisted: no GPUs assigned");
    assert_eq!(who(&mut a, 108), (None, None, None, None, None), "a GPU taken at its face names no container");
    let c = a.gap_counts();
    assert_eq!(
        (c.get(&GapKind::PodAmbiguous), c.get(&GapKind::GpuNotAssigned), c.get(&GapKind::PodUnlisted)),
        (Some(&1), Some(&1), None),
        "106 was seen after the table came: only a later answer says it is unlisted; {:#?}",
        a.notes()
    );
    let notes = a.notes();
    let has = |pid: u32, what: &str| notes.iter().any(|n| n.contains(&format!("pid {pid}: ")) && n.contains(what));
    assert!(has(103, "were given to 2 containers (dev/notebook-a/nb, dev/notebook-b/nb)"), "{notes:#?}");
    assert!(
        has(
            104,
            &format!("uses GPU {}, which the pod-resources socket did not give its container (given: {}, {})", GPU[2], GPU[0], GPU[1])
        ),
        "{notes:#?}"
    );
    assert!(
        notes[0].starts_with(&format!("pod-resources socket {}: ", sock.display()))
            && notes[0].contains("(the last: 5 container(s), 4 with GPUs), 0 call(s) failed"),
        "{notes:#?}"
    );
    // A new container nudges the watch: a second answer comes without waiting for the interval,
    // and now says that 106's container is not listed.
    place(&mut a, 107, read(Some('7'), &[], None), "0");
    tick_until(&mut a, Duration::from_secs(10), |a| a.gap_counts().get(&GapKind::PodUnlisted) == Some(&1));
    assert!(
        a.notes().iter().any(|n| n.contains("pid 106: container ml/gone-1/main (named by its oci-annotations) is not listed")),
        "{:#?}",
        a.notes()
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Must show (issue 26, item 4, bad input): a pod-resources socket that hangs: a bounded wait, a
/// counted note, the pipeline never waits, and names still come from the annotations, then the
/// environment.
#[test]
fn a_socket_that_accepts_and_never_answers_is_bounded_counted_and_never_waited_on() {
    let d = dir("hang");
    let sock = d.join("kubelet.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    // Accepts every connection and holds it, never a byte back.
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        listener.set_nonblocking(true).expect("nonblocking");
        let end = Instant::now() + Duration::from_secs(8);
        while Instant::now() < end {
            if let Ok((s, _)) = listener.accept() {
                conns.push(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        conns.len()
    });
    let mut a = Attribution::new(&d, four());
    let bound = Duration::from_millis(700);
    let started = Instant::now();
    a.set_pod_resources(Ok(podres::Watch::start(sock.clone(), bound, podres::ANSWER_MAX, Duration::from_millis(200)).expect("watch")));
    // The pipeline goes on while the call hangs: identifying, placing and ticking never wait.
    let t = Instant::now();
    a.prefetch(201, read(Some('1'), &[("CUDA_VISIBLE_DEVICES", "0")], Some(("ml", "trainer-0", "main"))));
    a.identify(201);
    a.node_device(201, 0);
    a.prefetch(202, read(Some('2'), &[("CUDA_VISIBLE_DEVICES", "1"), ("K8S_POD_NAME", "env-named"), ("POD_NAMESPACE", "team")], None));
    a.identify(202);
    a.node_device(202, 0);
    a.refresh_pods();
    assert!(t.elapsed() < Duration::from_millis(50), "the pipeline waited {:?}", t.elapsed());
    let failed = |a: &Attribution| a.notes().iter().any(|n| n.contains(" 2 call(s) failed (2 with no answer within 700 ms"));
    tick_until(&mut a, Duration::from_secs(5), failed);
    let took = started.elapsed();
    // Two calls, each given up at its bound, the second after the interval.
    assert!(took >= 2 * bound && took < 2 * bound + Duration::from_millis(1500), "two bounded calls took {took:?}");
    let n = a.notes().into_iter().find(|n| n.starts_with("pod-resources socket")).expect("the socket's note");
    assert!(n.contains(": 0 answer(s), ") && n.contains("first errors: no answer within 700 ms"), "{n}");
    let one = a.identity(201);
    assert_eq!(
        (one.pod_name.as_deref(), one.identity_source, one.assigned_gpus.clone()),
        (Some("trainer-0"), Some("oci-annotations"), None)
    );
    let two = a.identity(202);
    assert_eq!(
        (two.pod_name.as_deref(), two.namespace.as_deref(), two.identity_source),
        (Some("env-named"), Some("team"), Some("environment"))
    );
    drop(a);
    assert!(held.join().expect("listener") >= 2, "the calls connected");
    let _ = std::fs::remove_dir_all(&d);
}

/// An absent socket: every call fails at once (counted, the error kept), and names come from
/// the annotations, then the environment.
#[test]
fn an_absent_socket_falls_back_to_annotations_then_environment() {
    let d = dir("absent");
    let sock = d.join("kubelet.sock");
    let mut a = Attribution::new(&d, four());
    a.set_pod_resources(Ok(podres::Watch::start(sock, podres::CALL_TIMEOUT, podres::ANSWER_MAX, podres::REFRESH_INTERVAL).expect("watch")));
    tick_until(&mut a, Duration::from_secs(5), |a| a.notes().iter().any(|n| n.contains(" 1 call(s) failed (0 with no answer")));
    assert!(a.notes()[0].contains("first errors: connecting: ") && a.notes()[0].contains("No such file"), "{:#?}", a.notes());
    a.prefetch(301, read(Some('1'), &[("K8S_POD_NAME", "wrong")], Some(("ml", "trainer-0", "main"))));
    a.prefetch(302, read(Some('2'), &[("K8S_POD_NAME", "env-named")], None));
    a.prefetch(303, read(Some('3'), &[], None));
    let one = a.identify(301);
    let two = a.identify(302);
    let three = a.identify(303);
    assert_eq!((one.pod_name.as_deref(), one.identity_source), (Some("trainer-0"), Some("oci-annotations")));
    assert_eq!((two.pod_name.as_deref(), two.identity_source), (Some("env-named"), Some("environment")));
    assert_eq!((three.pod_name.as_deref(), three.identity_source), (None, None));
    let _ = std::fs::remove_dir_all(&d);
}

/// The agent's choice (`podres::open`, issue 26): a socket absent at start whose directory is
/// there (the DaemonSet's mount of the kubelet's directory while the kubelet restarts) is watched
/// all the same: its first call fails at once, counted, and once the kubelet serves it a nudge
/// brings the answer; with its directory absent too (no kubelet on the node) it is off, with
/// the note saying so; `none` is off.
#[test]
fn a_socket_absent_at_start_in_its_directory_is_read_once_served_and_off_without_the_directory() {
    let Some(py) = python() else {
        tool_support::missing("grpcio and protobuf for Python", INSTALL);
        return;
    };
    let d = dir("late");
    let sock = d.join("kubelet.sock");
    let w = podres::open(&sock, podres::CALL_TIMEOUT).expect("watched: its directory is there");
    let until = |w: &podres::Watch, within: Duration| -> Vec<podres::Update> {
        let end = Instant::now() + within;
        loop {
            let u = w.drain();
            if !u.is_empty() || Instant::now() > end {
                return u;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let first = until(&w, Duration::from_secs(5));
    assert!(
        matches!(first.as_slice(), [podres::Update::Failed { error, timed_out: false }] if error.contains("No such file")),
        "the call at start, before the socket is served: {first:?}"
    );
    let (_server, served) = serve(&py, &d, PODS, &[]);
    assert_eq!(served, sock);
    w.nudge();
    let next = until(&w, Duration::from_secs(5));
    match next.as_slice() {
        [podres::Update::Answer(a, _)] => assert_eq!((a.containers(), a.with_gpus()), (5, 4), "{a:?}"),
        other => panic!("after the socket was served and a nudge: {other:?}"),
    }
    let gone = d.join("no-kubelet/kubelet.sock");
    let e = podres::open(&gone, podres::CALL_TIMEOUT).err().expect("off");
    assert!(e.starts_with(&format!("pod-resources socket {}: absent at start, and its directory too", gone.display())), "{e}");
    assert!(podres::open(std::path::Path::new("none"), podres::CALL_TIMEOUT)
        .err()
        .is_some_and(|e| e.contains("off (--pod-resources-socket none)")));
    let _ = std::fs::remove_dir_all(&d);
}

/// An answer over the size bound is refused by the decoder, counted, never taken in part.
#[test]
fn an_oversized_answer_is_refused() {
    let Some(py) = python() else {
        tool_support::missing("grpcio and protobuf for Python", INSTALL);
        return;
    };
    let d = dir("huge");
    let (_server, sock) = serve(&py, &d, PODS, &["--pad", "300000"]);
    let e = podres::list(&sock, Duration::from_secs(5), 256 << 10).expect_err("over 256 KiB");
    assert!(e.starts_with("List: OutOfRange: ") && e.contains("message length too large"), "{e}");
    let ok = podres::list(&sock, Duration::from_secs(5), podres::ANSWER_MAX).expect("under the default bound");
    assert_eq!(ok.pod_resources.len() - 4, 300000_usize.div_ceil(1030), "the padding pods");
    let _ = std::fs::remove_dir_all(&d);
}
