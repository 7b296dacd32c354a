//! The agent deployed for real (issue 12, Must show (d)): in a real container runtime (Debian's
//! podman with runc, a Debian image made by `debootstrap --variant=minbase bookworm`, see
//! scripts/container-base-image.sh), the agent container runs as deploy/kubernetes/base/daemonset.yaml
//! specifies it: the host's PID namespace, every capability dropped but BPF, PERFMON, SYS_ADMIN
//! (uprobe perf events need it again on current kernels) and SYS_PTRACE, the runtime's default
//! seccomp profile, a read-only root with a tmpfs /tmp, /sys/kernel/btf read-only, no privilege
//! escalation, its own network namespace, NVML and libcuda mounted the way the NVIDIA container
//! toolkit mounts the host's driver (here simcuda's stand-ins and the state they share). Two
//! workload containers, each with its own CUDA_VISIBLE_DEVICES and the same driver mounts, start
//! after it. Checked:
//! - the agent traces both from their first call: each one's reserved bytes reach a real
//!   Prometheus (scraping the agent's endpoint, published on 127.0.0.1) exactly, under the
//!   workload's own container id (`container_id`) and its own GPU's UUID (`hw_id`), and named
//!   (`k8s_pod_name`, ...) after the pod a stand-in kubelet's pod-resources socket says was given
//!   that GPU: the socket served in a folder of the test that stands in for the kubelet's
//!   `/var/lib/kubelet/pod-resources`, reached through the DaemonSet's own hostPath mount and
//!   `--pod-resources-socket` flag;
//! - the agent container killed mid-run: the workloads finish unharmed (exit 0, their own
//!   figures printed).
//!
//! Needs root, podman, runc and the base image; under CI=true (where .ci/run installs them and
//! builds the image) their absence fails the test.

mod export_support;
mod pod_resources_support;
#[path = "ebpf_fixtures/support.rs"]
mod support;
mod tool_support;

use export_support::{free_port, http_get, prometheus, require, Guard};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{fixtures, gpufrag, simcuda_dir, unique};

/// What deploy/kubernetes/base/daemonset.yaml says of the agent's container, as podman flags
/// (issue 28: the test read them by hand before, so a change to the DaemonSet did not reach it).
/// A setting the translation does not know fails the test, naming it: teach it here.
struct DaemonSetRun {
    /// --pid, --privileged, --cap-drop/--cap-add, --read-only, no-new-privileges, the host-path
    /// and memory volumes, the NVIDIA_* variables.
    flags: Vec<String>,
    /// The container's args (`agent --prometheus 0.0.0.0:9464`).
    args: Vec<String>,
    /// The containerPort the agent serves on (the one named `metrics`).
    metrics_port: u64,
}

impl DaemonSetRun {
    /// `host_dirs`: host paths of the DaemonSet's hostPath volumes that the test provides in a
    /// folder of its own (the kubelet's pod-resources directory: a stand-in kubelet's socket).
    fn read(host_dirs: &[(&str, &Path)]) -> DaemonSetRun {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/base/daemonset.yaml");
        let out = Command::new("python3")
            .args(["-c", "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))"])
            .arg(&file)
            .output()
            .expect("python3 with PyYAML (scripts/setup.sh installs python3-yaml)");
        assert!(out.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
        let docs: Value = serde_json::from_slice(&out.stdout).expect("json");
        let ds = docs.as_array().expect("documents").iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let mut flags = Vec::new();
        if pod["hostPID"] == true {
            flags.push("--pid=host".to_string());
        }
        let sc = c["securityContext"].as_object().expect("securityContext");
        for (key, v) in sc {
            match key.as_str() {
                "privileged" if v == true => flags.push("--privileged".into()),
                "privileged" | "runAsNonRoot" => {}
                "runAsUser" => flags.push(format!("--user={}", v.as_u64().expect("runAsUser"))),
                "allowPrivilegeEscalation" if v == false => flags.extend(["--security-opt".into(), "no-new-privileges".into()]),
                "allowPrivilegeEscalation" => {}
                "readOnlyRootFilesystem" if v == true => flags.push("--read-only".into()),
                "readOnlyRootFilesystem" => {}
                "capabilities" => {
                    let list = |k: &str| -> Vec<String> {
                        v[k].as_array().map(|a| a.iter().map(|x| x.as_str().expect("capability").to_string()).collect()).unwrap_or_default()
                    };
                    let drop = list("drop");
                    assert!(drop.is_empty() || drop == ["ALL"], "capabilities.drop {drop:?}: teach DaemonSetRun");
                    if !drop.is_empty() {
                        flags.push("--cap-drop=all".into());
                    }
                    let add = list("add");
                    if !add.is_empty() {
                        flags.push(format!("--cap-add={}", add.join(",")));
                    }
                }
                // podman's default profile is the runtime's default.
                "seccompProfile" => assert_eq!(v["type"], "RuntimeDefault", "seccompProfile {v}: teach DaemonSetRun"),
                other => panic!("securityContext.{other} = {v} in {}: teach DaemonSetRun", file.display()),
            }
        }
        let volumes = pod["volumes"].as_array().expect("volumes");
        for m in c["volumeMounts"].as_array().expect("volumeMounts") {
            let v = volumes.iter().find(|v| v["name"] == m["name"]).unwrap_or_else(|| panic!("no volume {}", m["name"]));
            let at = m["mountPath"].as_str().expect("mountPath");
            if let Some(path) = v["hostPath"]["path"].as_str() {
                let host = host_dirs.iter().find(|(h, _)| *h == path).map_or_else(|| PathBuf::from(path), |(_, d)| d.to_path_buf());
                // What the kubelet checks before it starts the pod.
                match v["hostPath"]["type"].as_str() {
                    Some("Directory") => {
                        assert!(host.is_dir(), "hostPath {path} (type Directory): {} is no directory here", host.display())
                    }
                    None | Some("") => {}
                    Some(other) => panic!("hostPath {path} of type {other}: teach DaemonSetRun"),
                }
                let ro = if m["readOnly"] == true { ":ro" } else { "" };
                flags.extend(["-v".into(), format!("{}:{at}{ro}", host.display())]);
            } else if v["emptyDir"]["medium"] == "Memory" {
                flags.extend(["--tmpfs".into(), at.to_string()]);
            } else {
                panic!("volume {v}: teach DaemonSetRun");
            }
        }
        // The GPU runtime's variables (the OTLP ones name the cluster's collector: not here).
        for e in c["env"].as_array().expect("env") {
            let name = e["name"].as_str().expect("name");
            if let (true, Some(value)) = (name.starts_with("NVIDIA_"), e["value"].as_str()) {
                flags.extend(["-e".into(), format!("{name}={value}")]);
            }
        }
        let args = c["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("arg").to_string()).collect();
        let metrics_port = c["ports"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "metrics"))
            .and_then(|p| p["containerPort"].as_u64())
            .expect("a container port named metrics");
        DaemonSetRun { flags, args, metrics_port }
    }
}

const BASE_IMAGE: &str = "localhost/gpufrag-base:bookworm";
const MIB: u64 = 1 << 20;

fn podman(args: &[&str]) -> Output {
    let mut c = Command::new("podman");
    c.arg("--runtime").arg("runc").args(args);
    c.output().unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(out.status.success(), "podman {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// What this machine lacks to run the test, and how to get it.
fn missing() -> Option<(String, String)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some(("root".into(), "run the test as root (rootful podman, eBPF)".into()));
    }
    for tool in ["podman", "runc"] {
        if Command::new(tool).arg("--version").output().map_or(true, |o| !o.status.success()) {
            return Some((tool.into(), "install it with `apt-get install podman runc`".into()));
        }
    }
    if !podman(&["image", "exists", BASE_IMAGE]).status.success() {
        return Some((format!("the image {BASE_IMAGE}"), "build it with `bash scripts/container-base-image.sh`".into()));
    }
    if let Some(why) = support::ebpf_refused() {
        return Some(("eBPF".into(), format!("{why}: run as root on a kernel with BPF and BTF")));
    }
    None
}

/// Removes the containers (and the agent image) when dropped, whatever happened.
struct Cleanup {
    containers: Vec<String>,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = podman(&["rm", "-f", "-t", "0", c]);
        }
        if !self.image.is_empty() {
            let _ = podman(&["rmi", "-f", &self.image]);
        }
    }
}

/// The agent image: the base image plus what deploy/Dockerfile's last stage adds (the binary
/// and libelf1), copied in, since no registry and no package mirror are reachable from a build.
fn build_agent_image(tag: &str) {
    let ctx = unique("agent-image");
    std::fs::create_dir_all(&ctx).expect("context");
    std::fs::copy(gpufrag(), ctx.join("gpufrag")).expect("copy gpufrag");
    let libelf = std::fs::canonicalize("/lib/x86_64-linux-gnu/libelf.so.1").expect("the host's libelf1");
    std::fs::copy(libelf, ctx.join("libelf.so.1")).expect("copy libelf");
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {BASE_IMAGE}\nCOPY libelf.so.1 /usr/lib/x86_64-linux-gnu/libelf.so.1\nCOPY gpufrag /usr/local/bin/gpufrag\nENTRYPOINT [\"/usr/local/bin/gpufrag\"]\n"),
    )
    .expect("Containerfile");
    podman_ok(&[
        "build",
        "--pull=never",
        "-q",
        "-t",
        tag,
        "-f",
        &ctx.join("Containerfile").display().to_string(),
        &ctx.display().to_string(),
    ]);
}

/// The driver as the NVIDIA container toolkit mounts it into a container (the host's libcuda
/// and NVML, read-only, into the image's library directory), and the state the simulated GPUs
/// share (what the device nodes are on a real machine).
fn driver_mounts(state: &Path) -> Vec<String> {
    let lib = |name: &str| std::fs::canonicalize(simcuda_dir().join(name)).expect("simcuda built").display().to_string();
    vec![
        "-v".into(),
        format!("{}:/usr/lib/x86_64-linux-gnu/libcuda.so.1:ro", lib("libcuda.so.1")),
        "-v".into(),
        format!("{}:/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1:ro", lib("libnvidia-ml.so.1")),
        "-v".into(),
        format!("{}:/run/simcuda", state.display()),
        "-e".into(),
        "SIMCUDA_STATE_DIR=/run/simcuda".into(),
        "-e".into(),
        "SIMCUDA_DEVICES=4".into(),
    ]
}

const LIMITS: [&str; 4] = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"];

fn logs(name: &str) -> String {
    let out = podman(&["logs", name]);
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn wait_log(name: &str, needle: &str, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if logs(name).contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn start_prometheus(bin: &Path, dir: &Path, target: u16) -> (Guard, u16) {
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpufrag-agent\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")).expect("config");
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let child = Command::new(bin)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("prometheus");
    let guard = Guard { child, name: "prometheus" };
    let end = Instant::now() + Duration::from_secs(30);
    while http_get(port, "/-/ready").is_none() {
        assert!(
            Instant::now() < end,
            "prometheus did not get ready: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (guard, port)
}

fn query(port: u16, q: &str) -> Vec<Value> {
    let enc: String = q
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let body = http_get(port, &format!("/api/v1/query?query={enc}")).unwrap_or_default();
    serde_json::from_str::<Value>(&body).unwrap_or(Value::Null)["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The UUIDs of the 4 simulated GPUs, as simcuda's NVML prints them.
fn uuids() -> Vec<String> {
    let out = Command::new(gpufrag().parent().expect("dir").join("simcuda-workload"))
        .arg("nvml")
        .env("LD_LIBRARY_PATH", simcuda_dir())
        .env("SIMCUDA_DEVICES", "4")
        .env("SIMCUDA_STATE_DIR", unique("uuid-state"))
        .output()
        .expect("simcuda-workload nvml");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("RESULT test=nvml"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("uuid=")).map(str::to_string))
        .collect()
}

#[test]
fn the_agent_container_attributes_two_workload_containers_and_killing_it_harms_neither() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    let Some(prom_bin) = require("prometheus", prometheus(), "apt-get install prometheus") else { return };
    let Some(py) = pod_resources_support::python() else {
        tool_support::missing("grpcio and protobuf for Python", pod_resources_support::INSTALL);
        return;
    };
    let started = Instant::now();
    let run = format!("gpufrag-test-{}", std::process::id());
    let image = format!("localhost/gpufrag-agent-test:{}", std::process::id());
    let agent = format!("{run}-agent");
    let jobs = [format!("{run}-job2"), format!("{run}-job3")];
    let _cleanup = Cleanup { containers: vec![agent.clone(), jobs[0].clone(), jobs[1].clone()], image: image.clone() };
    build_agent_image(&image);
    let state: PathBuf = unique("container-state");
    std::fs::create_dir_all(&state).expect("state");
    let gate: PathBuf = unique("container-gate");
    std::fs::create_dir_all(&gate).expect("gate");
    let port = free_port();
    let uuids = uuids();
    assert_eq!(uuids.len(), 4, "{uuids:?}");

    // The kubelet's pod-resources directory, as the DaemonSet mounts it: a folder of the test
    // (short: a socket's path is at most 107 bytes) where a stand-in kubelet serves the socket,
    // listing a pod for each workload's GPU (the workloads carry no annotations: they are named
    // by the GPU they were given).
    let kubelet = std::env::temp_dir().join(format!("gf-kubelet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&kubelet);
    std::fs::create_dir_all(&kubelet).expect("the stand-in kubelet's directory");
    let pod = |name: &str, ns: &str, ctr: &str, gpu: &str| {
        format!(
            r#"{{"name": "{name}", "namespace": "{ns}", "containers": [{{"name": "{ctr}", "devices": [{{"resource_name": "nvidia.com/gpu", "device_ids": ["{gpu}"]}}]}}]}}"#
        )
    };
    let pods = format!("[{}, {}]", pod("trainer-2", "ml-team", "main", &uuids[2]), pod("eval-3", "research", "worker", &uuids[3]));
    let (_kubelet_server, _) = pod_resources_support::serve(&py, &kubelet, &pods, &[]);

    // The agent, as the DaemonSet runs it: its flags read from the DaemonSet itself.
    let ds = DaemonSetRun::read(&[("/var/lib/kubelet/pod-resources", &kubelet)]);
    let mut args: Vec<String> = ["run", "-d", "--name", &agent].iter().map(|s| s.to_string()).collect();
    args.extend(ds.flags.iter().cloned());
    args.extend(LIMITS.iter().map(|s| s.to_string()));
    args.extend(["-p".to_string(), format!("127.0.0.1:{port}:{}", ds.metrics_port)]);
    args.extend(driver_mounts(&state));
    args.push(image.clone());
    args.extend(ds.args.iter().cloned());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    podman_ok(&argv);
    assert!(wait_log(&agent, "agent: tracing", Duration::from_secs(60)), "the agent container did not start tracing:\n{}", logs(&agent));
    let prom_dir = unique("container-prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus dir");
    let (_prom, prom_port) = start_prometheus(&prom_bin, &prom_dir, port);

    // Two workload containers, each seeing one GPU as its device 0.
    let prog = fixtures().prog.display().to_string();
    let mut ids = Vec::new();
    for (name, visible) in jobs.iter().zip(["2", "3"]) {
        let mut a: Vec<String> = ["run", "-d", "--name", name, "-e"].iter().map(|s| s.to_string()).collect();
        a.push(format!("CUDA_VISIBLE_DEVICES={visible}"));
        a.extend(LIMITS.iter().map(|s| s.to_string()));
        a.extend(driver_mounts(&state));
        a.extend(["-v".into(), format!("{prog}:/usr/local/bin/cuda_prog:ro"), "-v".into(), format!("{}:/gate", gate.display())]);
        a.extend([BASE_IMAGE.to_string(), "/usr/local/bin/cuda_prog".into(), "wait".into(), "/gate/go".into()]);
        let argv: Vec<&str> = a.iter().map(String::as_str).collect();
        ids.push(podman_ok(&argv));
    }
    for name in &jobs {
        assert!(wait_log(name, "READY", Duration::from_secs(60)), "{name}: {}", logs(name));
    }
    for id in &ids {
        assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()), "podman's container id: {id:?}");
    }

    // Both reach Prometheus from their first call (3 x 8 MiB), under their own container id
    // and GPU, and named after the pod the socket says was given that GPU (the selector names
    // the pod: a series first exported before the socket's answer was matched would be another).
    for ((id, gpu), (ns, pod, ctr)) in ids.iter().zip([2usize, 3]).zip([("ml-team", "trainer-2", "main"), ("research", "eval-3", "worker")])
    {
        let q = format!("gpufrag_process_memory_reserved_bytes{{container_id=\"{id}\",k8s_pod_name=\"{pod}\"}}");
        let end = Instant::now() + Duration::from_secs(30);
        let series = loop {
            let r = query(prom_port, &q);
            if r.first().and_then(|s| s["value"][1].as_str()) == Some(&(24 * MIB).to_string()) || Instant::now() > end {
                break r;
            }
            std::thread::sleep(Duration::from_millis(300));
        };
        assert_eq!(
            series.len(),
            1,
            "{q}: {series:#?}\nagent log:\n{}\nall: {:#?}",
            logs(&agent),
            query(prom_port, "gpufrag_process_memory_reserved_bytes")
        );
        let s = &series[0];
        assert_eq!(s["value"][1].as_str(), Some(&(24 * MIB).to_string()[..]), "traced from its first call: {s:#}");
        assert_eq!(s["metric"]["hw_id"].as_str(), Some(uuids[gpu].as_str()), "CUDA_VISIBLE_DEVICES={gpu}'s device 0 is GPU {gpu}: {s:#}");
        assert_eq!(s["metric"]["process_executable_name"].as_str(), Some("cuda_prog"), "{s:#}");
        assert_eq!(
            (s["metric"]["k8s_namespace_name"].as_str(), s["metric"]["k8s_container_name"].as_str()),
            (Some(ns), Some(ctr)),
            "named from the stand-in kubelet's socket through the DaemonSet's mount: {s:#}"
        );
    }

    // The agent container dies mid-run; the workloads go on and finish.
    // SIGKILL to the container's process (what an OOM kill or a node problem does; `podman
    // kill` itself may time out waiting for conmon on a loaded machine).
    let pid: i32 = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &agent]).parse().expect("agent pid");
    assert!(pid > 1, "agent pid {pid}");
    // SAFETY: kill(2) on the agent container's process, which this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let end = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = podman_ok(&["inspect", "--format", "{{.State.Status}}", &agent]);
    assert!(!Path::new(&format!("/proc/{pid}/exe")).exists() || status != "running", "the agent still runs: {status}");
    std::fs::write(gate.join("go"), b"go").expect("gate");
    for name in &jobs {
        let code = podman_ok(&["wait", name]);
        let log = logs(name);
        assert_eq!(code, "0", "{name} after the agent was killed: {log}");
        assert!(log.contains("FIGURES device=0 reserved=29360128"), "{name}: {log}");
    }
    let _ = std::fs::remove_dir_all(&kubelet);
    eprintln!("container test took {:?}", started.elapsed());
}

/// What issue 12 measured for `frag-oom` (and `gpufrag run` gives for it: tests/ebpf_node_agent.rs).
const FRAG_STRANDED: u64 = 2_097_152_000;
const FRAG_LARGEST_FREE_BLOCK: u64 = 209_715_200;
const FRAG_REQUESTED: u64 = 2_684_354_560;

/// The agent as an operator starts it: a clean environment, only the driver named, its summary
/// written to `summary` when it stops.
fn start_driver_only_agent(summary: &Path, extra: &[&str]) -> (std::process::Child, support::Lines) {
    start_agent_with_env(summary, extra, &[])
}

/// [`start_driver_only_agent`] with `env` set too.
fn start_agent_with_env(summary: &Path, extra: &[&str], env: &[(&str, &str)]) -> (std::process::Child, support::Lines) {
    let lib = std::fs::canonicalize(simcuda_dir().join("libcuda.so.1")).expect("simcuda built").display().to_string();
    let mut cmd = support::clean_agent_command(summary, &["--keep-exited", "--lib", &lib]);
    cmd.args(extra).envs(env.iter().copied());
    support::start_tracing(cmd)
}

/// `podman run -d --name NAME` of simcuda-workload (simcuda's driver and runtime and the
/// workload bind-mounted from the host, as the NVIDIA toolkit mounts a driver), `extra` before
/// the image.
fn workload_container(name: &str, state: &Path, extra: &[&str], args: &[&str]) -> Vec<String> {
    let canon = |n: &str| std::fs::canonicalize(simcuda_dir().join(n)).expect("simcuda built").display().to_string();
    let workload = std::fs::canonicalize(gpufrag().parent().expect("dir").join("simcuda-workload")).expect("simcuda-workload built");
    let mut a: Vec<String> = ["run", "-d", "--name", name, "-e", "LD_LIBRARY_PATH=/usr/local/lib/simcuda", "-e", "SIMCUDA_DEVICES=1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for lib in ["libcuda.so.1", "libcudart.so.13", "libnvidia-ml.so.1"] {
        a.extend(["-v".into(), format!("{}:/usr/local/lib/simcuda/{lib}:ro", canon(lib))]);
    }
    a.extend(["-v".into(), format!("{}:/run/simcuda", state.display()), "-e".into(), "SIMCUDA_STATE_DIR=/run/simcuda".into()]);
    a.extend(["-v".into(), format!("{}:/usr/local/bin/simcuda-workload:ro", workload.display())]);
    a.extend(LIMITS.iter().map(|s| s.to_string()));
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend([BASE_IMAGE.to_string(), "/usr/local/bin/simcuda-workload".into()]);
    a.extend(args.iter().map(|s| s.to_string()));
    a
}

/// Stops the agent (SIGINT) and reads its summary.
fn stop_agent(mut agent: std::process::Child, mut err: support::Lines, summary: &Path) -> (Value, String) {
    std::thread::sleep(Duration::from_millis(700));
    support::stop_agent(&mut agent, &mut err, summary)
}

/// Runs frag-oom in a new container (`extra` podman options) under a driver-only agent and
/// checks the verdict, exact from the first call; the container's one process's summary and
/// the agent's summary.
fn frag_oom_in_container(tag: &str, extra: &[&str]) -> (Value, Value) {
    let name = format!("gpufrag-{tag}-{}", std::process::id());
    let _cleanup = Cleanup { containers: vec![name.clone()], image: String::new() };
    let summary = unique(&format!("container-{tag}.json"));
    let (agent, err) = start_driver_only_agent(&summary, &[]);
    let state = unique("container-state");
    std::fs::create_dir_all(&state).expect("state");
    let a = workload_container(&name, &state, extra, &["frag-oom"]);
    let argv: Vec<&str> = a.iter().map(String::as_str).collect();
    let t = Instant::now();
    let id = podman_ok(&argv);
    let code = podman_ok(&["wait", &name]);
    let took = t.elapsed();
    let log = logs(&name);
    assert_eq!(code, "0", "frag-oom in the container: {log}");
    let (s, alog) = stop_agent(agent, err, &summary);
    let procs: Vec<&Value> =
        s["processes"].as_array().expect("processes").iter().filter(|p| p["container_id"].as_str() == Some(id.as_str())).collect();
    assert_eq!(procs.len(), 1, "one process of container {id}: {:#}\n{alog}", s["processes"]);
    let pid = procs[0]["pid"].as_u64().expect("pid");
    let ooms: Vec<&Value> = s["ooms"].as_array().expect("ooms").iter().filter(|o| o["pid"].as_u64() == Some(pid)).collect();
    assert_eq!(ooms.len(), 1, "{:#}", s["ooms"]);
    let o = ooms[0];
    let field = |k: &str| o[k].as_u64().unwrap_or_else(|| panic!("no {k} in {o:#}"));
    assert_eq!(
        (o["verdict"].as_str(), field("requested"), field("stranded"), field("largest_free_block")),
        (Some("fragmentation"), FRAG_REQUESTED, FRAG_STRANDED, FRAG_LARGEST_FREE_BLOCK),
        "{o:#}\n{log}"
    );
    let cov: Vec<&Value> = s["coverage"].as_array().expect("coverage").iter().filter(|c| c["pid"].as_u64() == Some(pid)).collect();
    assert!(!cov.is_empty() && cov.iter().all(|c| c["exact"] == Value::Bool(true)), "not exact: {cov:#?}\n{:#}", s["notes"]);
    let hold = s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).find(|n| n.starts_with("exec hold")).unwrap_or("");
    assert!(!hold.contains("held until probed 0 "), "the container's exec was not held: {hold}");
    eprintln!("container start to exit {took:?}; {hold}");
    (procs[0].clone(), s)
}

/// Must show (issue 26): the agent with only the driver named (no workload executable), then
/// `frag-oom` started in a new podman/runc container: the workload's first exec in the
/// container is held until its annotation probes are in, so the verdict is `fragmentation` with
/// run's figures, under the container's id, traced from its first call.
#[test]
fn frag_oom_in_a_new_container_is_judged_from_its_first_call_by_an_agent_given_only_the_driver() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    frag_oom_in_container("firstcall", &[]);
}

fn notes(s: &Value) -> Vec<String> {
    s["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).map(String::from).collect()
}

/// Must show (issue 26, item 4): a container started with the OCI annotations of a pod (what the
/// kubelet's runtime writes into the bundle's config.json) is named from them, over what its own
/// environment claims, and the summary says so; the verdict is still exact from the first call.
#[test]
fn a_container_with_a_pods_oci_annotations_is_named_from_them_not_from_its_environment() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    let (p, s) = frag_oom_in_container(
        "annotated",
        &[
            "--annotation",
            "io.kubernetes.pod.name=trainer-7",
            "--annotation",
            "io.kubernetes.pod.namespace=ml-team",
            "--annotation",
            "io.kubernetes.container.name=main",
            // What a misconfigured pod says of itself: the node's word wins.
            "-e",
            "K8S_POD_NAME=wrong-name",
            "-e",
            "POD_NAMESPACE=wrong-namespace",
        ],
    );
    assert_eq!(
        (p["k8s_pod_name"].as_str(), p["k8s_namespace_name"].as_str(), p["k8s_container_name"].as_str(), p["identity_source"].as_str()),
        (Some("trainer-7"), Some("ml-team"), Some("main"), Some("oci-annotations")),
        "{p:#}\n{:#?}",
        notes(&s)
    );
    // the agent is node-wide: a container another test of this file starts meanwhile is counted
    // too, but only this one names a pod
    let n = notes(&s);
    assert!(n.iter().any(|l| l.contains("config.json read for ") && l.contains(", 1 naming a pod")), "{n:#?}");
}

/// Must show (issue 26, item 4): the agent given a stand-in kubelet pod-resources socket (a
/// grpcio server, tests/pod_resources_support): a container annotated as a pod's gets the GPUs the
/// socket lists for it, and a container with no annotations (its environment claiming another
/// pod) is named after the one container on the node that was given the GPU it uses (its
/// CUDA_VISIBLE_DEVICES places its device 0 on GPU 1); the summary says which source named each.
#[test]
fn the_pod_resources_socket_names_a_container_by_its_gpu_and_gives_each_its_gpus() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    let Some(py) = pod_resources_support::python() else {
        tool_support::missing("grpcio and protobuf for Python", pod_resources_support::INSTALL);
        return;
    };
    let uuids = uuids();
    assert_eq!(uuids.len(), 4, "{uuids:?}");
    let dir = std::env::temp_dir().join(format!("gf-podres-agent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let pods = format!(
        r#"[{{"name": "trainer-7", "namespace": "ml-team", "containers": [{{"name": "main", "devices": [{{"resource_name": "nvidia.com/gpu", "device_ids": ["{}"]}}]}}]}},
            {{"name": "eval-3", "namespace": "research", "containers": [{{"name": "worker", "devices": [{{"resource_name": "nvidia.com/gpu", "device_ids": ["{}"]}}]}}]}}]"#,
        uuids[0], uuids[1]
    );
    let (_server, sock) = pod_resources_support::serve(&py, &dir, &pods, &[]);
    let names = [format!("gpufrag-podres-a-{}", std::process::id()), format!("gpufrag-podres-b-{}", std::process::id())];
    let _cleanup = Cleanup { containers: names.to_vec(), image: String::new() };
    let state = unique("container-state");
    std::fs::create_dir_all(&state).expect("state");
    let summary = unique("container-podres.json");
    let nvml = std::fs::canonicalize(simcuda_dir().join("libnvidia-ml.so.1")).expect("simcuda built").display().to_string();
    let sock_s = sock.display().to_string();
    let state_s = state.display().to_string();
    let (agent, err) = start_agent_with_env(
        &summary,
        &["--pod-resources-socket", &sock_s, "--nvml-lib", &nvml],
        &[("SIMCUDA_DEVICES", "4"), ("SIMCUDA_STATE_DIR", &state_s)],
    );
    let annotated = [
        "--annotation",
        "io.kubernetes.pod.name=trainer-7",
        "--annotation",
        "io.kubernetes.pod.namespace=ml-team",
        "--annotation",
        "io.kubernetes.container.name=main",
        "-e",
        "SIMCUDA_DEVICES=4",
        "-e",
        "CUDA_VISIBLE_DEVICES=0",
    ];
    let plain = ["-e", "SIMCUDA_DEVICES=4", "-e", "CUDA_VISIBLE_DEVICES=1", "-e", "K8S_POD_NAME=claims-this"];
    // `hold`: one allocation, then it waits on its stdin (kept open by -i) while the agent reads
    // who it is; the agent stops first, the containers are removed after.
    let mut ids = Vec::new();
    for (name, extra) in names.iter().zip([&annotated[..], &plain[..]]) {
        let mut extra = extra.to_vec();
        extra.push("-i");
        let a = workload_container(name, &state, &extra, &["hold"]);
        let argv: Vec<&str> = a.iter().map(String::as_str).collect();
        ids.push(podman_ok(&argv));
        assert!(wait_log(name, "READY", Duration::from_secs(60)), "{name}: {}", logs(name));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let (s, alog) = stop_agent(agent, err, &summary);
    let n = notes(&s);
    let of = |id: &str| -> Value {
        let p: Vec<&Value> =
            s["processes"].as_array().expect("processes").iter().filter(|p| p["container_id"].as_str() == Some(id)).collect();
        assert_eq!(p.len(), 1, "one process of container {id}: {:#}\n{n:#?}\n{alog}", s["processes"]);
        p[0].clone()
    };
    let who = |p: &Value| {
        (
            p["k8s_namespace_name"].as_str().map(String::from),
            p["k8s_pod_name"].as_str().map(String::from),
            p["k8s_container_name"].as_str().map(String::from),
            p["identity_source"].as_str().map(String::from),
            p["assigned_gpus"].clone(),
            p["hw_id"].as_str().map(String::from),
        )
    };
    let s_ = |v: &str| Some(v.to_string());
    assert_eq!(
        who(&of(&ids[0])),
        (s_("ml-team"), s_("trainer-7"), s_("main"), s_("oci-annotations"), serde_json::json!([uuids[0]]), s_(&uuids[0])),
        "{n:#?}"
    );
    assert_eq!(
        who(&of(&ids[1])),
        (s_("research"), s_("eval-3"), s_("worker"), s_("pod-resources"), serde_json::json!([uuids[1]]), s_(&uuids[1])),
        "{n:#?}"
    );
    let line = n.iter().find(|l| l.starts_with(&format!("pod-resources socket {sock_s}: "))).unwrap_or_else(|| panic!("{n:#?}"));
    assert!(line.contains("(the last: 2 container(s), 2 with GPUs), 0 call(s) failed"), "{line}");
    assert!(!n.iter().any(|l| l.contains("GPU not assigned") || l.contains("pod-resources ambiguous")), "{n:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Must show (issue 26, item 4, bad input): a pod-resources socket that accepts and never
/// answers: each call is given up at its bound (1 s) and counted, the container starts and runs
/// as it does without the socket, and its names come from its annotations.
#[test]
fn a_pod_resources_socket_that_never_answers_never_stalls_a_container_start() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    let dir = std::env::temp_dir().join(format!("gf-podres-hang-agent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let sock = dir.join("kubelet.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    // Accepts every connection and holds it open, never a byte back.
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((c, _)) = listener.accept() {
                conns.push(c);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        conns.len()
    });
    let name = format!("gpufrag-podres-hang-{}", std::process::id());
    let _cleanup = Cleanup { containers: vec![name.clone()], image: String::new() };
    let state = unique("container-state");
    std::fs::create_dir_all(&state).expect("state");
    let summary = unique("container-podres-hang.json");
    let sock_s = sock.display().to_string();
    let (agent, err) = start_driver_only_agent(&summary, &["--pod-resources-socket", &sock_s]);
    let extra = [
        "--annotation",
        "io.kubernetes.pod.name=trainer-9",
        "--annotation",
        "io.kubernetes.pod.namespace=ml-team",
        "--annotation",
        "io.kubernetes.container.name=main",
    ];
    let a = workload_container(&name, &state, &extra, &["frag-oom"]);
    let argv: Vec<&str> = a.iter().map(String::as_str).collect();
    let t = Instant::now();
    let id = podman_ok(&argv);
    let code = podman_ok(&["wait", &name]);
    let took = t.elapsed();
    assert_eq!(code, "0", "{}", logs(&name));
    // Past the start's nudge and its 1 s bound: that call is over and counted.
    std::thread::sleep(Duration::from_millis(1500));
    let (s, alog) = stop_agent(agent, err, &summary);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let accepted = held.join().expect("listener");
    let n = notes(&s);
    let p: Vec<&Value> =
        s["processes"].as_array().expect("processes").iter().filter(|p| p["container_id"].as_str() == Some(id.as_str())).collect();
    assert_eq!(p.len(), 1, "{:#}\n{alog}", s["processes"]);
    assert_eq!(
        (p[0]["k8s_pod_name"].as_str(), p[0]["identity_source"].as_str(), p[0].get("assigned_gpus")),
        (Some("trainer-9"), Some("oci-annotations"), None),
        "{n:#?}"
    );
    let line =
        n.iter().find(|l| l.starts_with(&format!("pod-resources socket {sock_s}: 0 answer(s), "))).unwrap_or_else(|| panic!("{n:#?}"));
    let failed: u64 = line.split(" call(s) failed (").next().and_then(|h| h.rsplit(' ').next()).and_then(|v| v.parse().ok()).expect(line);
    assert!(
        failed >= 2 && line.contains(&format!("({failed} with no answer within 1000 ms")),
        "the start's call and the new container's: {line}"
    );
    assert!(accepted as u64 >= failed, "{accepted} connections for {failed} calls");
    eprintln!("container start to exit {took:?} with the socket hanging; {line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Must show (issue 26): the agent killed while it holds a new container's first exec (a hold
/// the agent is told never to answer, with a 2-minute timeout): the container's process runs
/// anyway, at once, since the kernel answers FAN_ALLOW for every pending permission event when
/// the fanotify descriptor closes: its output is stamped (by conmon) within 2 s of the SIGKILL,
/// 28 and 37 ms when measured, while the agent itself takes about 6 s to be reaped.
#[test]
fn a_container_held_when_the_agent_is_killed_starts_anyway() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    let name = format!("gpufrag-killedhold-{}", std::process::id());
    let _cleanup = Cleanup { containers: vec![name.clone()], image: String::new() };
    let summary = unique("container-killed.json");
    let (mut agent, _err) = start_driver_only_agent(&summary, &["--exec-hold-ms", "120000", "--exec-hold-stall", "simcuda-workload"]);
    let state = unique("container-state");
    std::fs::create_dir_all(&state).expect("state");
    let a = workload_container(&name, &state, &[], &["basic", "1MiB"]);
    // In a thread: whether `podman run -d` returns while the container's process is held at
    // its exec of the workload is podman's business.
    std::thread::spawn(move || {
        let argv: Vec<&str> = a.iter().map(String::as_str).collect();
        let _ = podman(&argv);
    });
    std::thread::sleep(Duration::from_secs(4));
    let before = logs(&name);
    let status = podman(&["inspect", "--format", "{{.State.Status}}", &name]);
    let status = String::from_utf8_lossy(&status.stdout).trim().to_string();
    assert!(
        !before.contains("RESULT"),
        "the container's process was not held (it printed before the agent was killed, status {status}): {before}"
    );
    let killed = Instant::now();
    let killed_at = std::time::SystemTime::now();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGKILL) }, 0);
    // The workload's own output, polled before the agent is reaped: a killed agent takes seconds
    // to be torn down (its uprobes and perf events are detached one by one), while the kernel
    // answers its pending permission events as soon as its fanotify descriptor is released.
    let printed = wait_log(&name, "RESULT", Duration::from_secs(30));
    let seen = killed.elapsed();
    let _ = agent.wait();
    let dead = killed.elapsed();
    let code = podman_ok(&["wait", &name]);
    let log = logs(&name);
    assert!(printed, "the held container printed nothing within 30 s of the agent's death: {log}");
    assert_eq!(code, "0", "the held container after the agent was killed: {log}");
    // When the workload wrote its line, by conmon's timestamp (podman's polling adds its own).
    let stamped = String::from_utf8_lossy(&podman(&["logs", "-t", &name]).stdout).to_string();
    let ts =
        stamped.lines().find(|l| l.contains("RESULT")).and_then(|l| l.split_whitespace().next()).expect("a timestamped line").to_string();
    let at = Command::new("date").args(["-d", &ts, "+%s.%N"]).output().expect("date");
    let at: f64 = String::from_utf8_lossy(&at.stdout).trim().parse().unwrap_or_else(|e| panic!("date -d {ts}: {e}"));
    let kill_s = killed_at.duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let released = at - kill_s;
    eprintln!(
        "held container (status {status} while held): its workload wrote its result {:.0} ms after the agent's SIGKILL (conmon's timestamp); podman logs showed it after {seen:?}; the agent was reaped after {dead:?}",
        released * 1e3
    );
    assert!(
        (0.0..2.0).contains(&released),
        "the container went on {released:.3} s after the agent was killed (the kernel releases a dead agent's holds at once)"
    );
}

/// The hold's delay per container start (issue 26, item 1): N=10 `podman run --rm` of a
/// container with a fresh rootfs, without the agent and under a driver-only agent (each start's
/// first exec from its new rootfs is held while the rootfs is scanned and its config read).
/// Figures in docs/benchmarks.md; run alone for figures without other tests' agents.
#[test]
fn the_hold_delay_per_container_start_is_measured() {
    if let Some((what, how)) = missing() {
        tool_support::missing(&what, &how);
        return;
    }
    const N: usize = 10;
    let starts = |tag: &str, n: usize| -> Vec<Duration> {
        (0..n)
            .map(|i| {
                let name = format!("gpufrag-bench-{tag}-{i}-{}", std::process::id());
                let _c = Cleanup { containers: vec![name.clone()], image: String::new() };
                let t = Instant::now();
                let mut a = vec!["run", "--rm", "--name", &name, "--annotation", "io.kubernetes.pod.name=bench"];
                a.extend(LIMITS);
                a.extend([BASE_IMAGE, "/bin/true"]);
                podman_ok(&a);
                t.elapsed()
            })
            .collect()
    };
    let stats = |v: &[Duration]| {
        let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        (ms.iter().sum::<f64>() / ms.len() as f64, ms[ms.len() / 2], ms[ms.len() - 1])
    };
    // One start first, so that neither side pays podman's first-run costs.
    let _ = starts("warm", 1);
    let bare = stats(&starts("bare", N));
    let summary = unique("container-bench.json");
    let (agent, err) = start_driver_only_agent(&summary, &[]);
    let held = stats(&starts("held", N));
    let (s, alog) = stop_agent(agent, err, &summary);
    let n = notes(&s);
    let rootfs = n.iter().find(|l| l.contains("held while its library roots were scanned")).cloned().unwrap_or_default();
    let configs = n.iter().find(|l| l.contains("container start(s) by an OCI runtime")).cloned().unwrap_or_default();
    let unread = n.iter().find(|l| l.contains("whose arguments were not read")).cloned().unwrap_or_default();
    let seen = n.iter().find(|l| l.contains("OCI runtime exec(s) seen")).cloned().unwrap_or_default();
    // Every start is held (the delay measured is the hold's); a runtime exec whose arguments
    // were missed (issue 26: 0-2 of 10 on this VM, see docs/benchmarks.md) is counted and
    // printed, never a failed config.
    assert!(configs.contains("; 0 not read"), "no config failed to read: {configs}\n{n:#?}\n{alog}");
    // At least the N started here: the agent is node-wide, and a container another test of this
    // file starts meanwhile is held and scanned too.
    let scanned: usize = rootfs.split("scanned ").nth(1).and_then(|t| t.split(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(scanned >= N, "every start's rootfs held and scanned ({scanned} of at least {N}): {rootfs}\n{n:#?}");
    eprintln!(
        "podman run --rm /bin/true, N={N}: without the agent mean {:.1} ms (median {:.1}, max {:.1}); under the agent mean {:.1} ms (median {:.1}, max {:.1}); {rootfs}; {configs}; {seen}; {unread}",
        bare.0, bare.1, bare.2, held.0, held.1, held.2
    );
}
