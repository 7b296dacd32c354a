//! What an OCI runtime's own invocation says of the container it starts: the runtime's
//! arguments (`runc [global options] create|run [--bundle DIR | -b DIR] ... ID`, crun's the same,
//! crun's `--config FILE` too), the bundle they name (else the runtime's working directory), and
//! the bundle's `config.json`: the rootfs (relative to the bundle unless absolute) and the
//! `annotations` a Kubernetes runtime writes there (`io.kubernetes.pod.name`, ...; see
//! [`super::pods`]).
//!
//! Paths are read through `/proc/PID/root` and `/proc/PID/cwd` of the runtime, so they mean what
//! they mean to the runtime whichever mount namespace the agent runs in.
//!
//! Bad input is an error naming the file and where it went wrong, never a panic or a stall: the
//! file is opened non-blocking and must be a regular file (a FIFO named `config.json` cannot hold
//! the reader), at most [`CONFIG_MAX`] bytes are read, a JSON error names its line and column.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The most bytes of a `config.json` read (runc's own are a few KiB; a larger one is refused).
pub const CONFIG_MAX: u64 = 4 << 20;

/// The most bytes of a runtime's `/proc/PID/cmdline` read.
const CMDLINE_MAX: u64 = 64 << 10;

/// Options of runc and crun (global and of `create`/`run`) that take a value as the next
/// argument: the value is not the subcommand or the container id.
const VALUED: &[&str] = &[
    "--root",
    "--log",
    "--log-format",
    "--criu",
    "--rootless",
    "--cgroup-manager",
    "--bundle",
    "-b",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
    "--config",
    "-f",
];

/// A runtime invocation that starts a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCall {
    /// `create` or `run`.
    pub subcommand: String,
    /// The container id (the last positional argument).
    pub container_id: String,
    /// `--bundle`/`-b`, as given (relative to the runtime's working directory unless absolute).
    pub bundle: Option<PathBuf>,
    /// crun's `--config`/`-f` (a config file other than the bundle's `config.json`).
    pub config: Option<PathBuf>,
}

/// A runtime invocation's subcommand (the first argument that is neither an option nor an
/// option's value): `create`, `start`, `init`, ...; for the counts of runtime execs seen.
pub fn subcommand(argv: &[String]) -> Option<&str> {
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].as_str();
        i += 1;
        if a == "--" {
            return argv.get(i).map(String::as_str);
        }
        if a.starts_with('-') && a.len() > 1 {
            if VALUED.contains(&a) {
                i += 1;
            }
            continue;
        }
        return Some(a);
    }
    None
}

/// Parses a runtime's arguments (argv[0] first). `None` for any other subcommand (`start`,
/// `init`, `state`, `delete`, ...) or arguments of no known form.
pub fn parse_args(argv: &[String]) -> Option<RuntimeCall> {
    let mut sub: Option<String> = None;
    let mut bundle = None;
    let mut config = None;
    let mut positional: Vec<&str> = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].as_str();
        i += 1;
        if a == "--" {
            positional.extend(argv[i..].iter().map(String::as_str));
            break;
        }
        if let Some((k, v)) = a.split_once('=').filter(|(k, _)| k.starts_with('-')) {
            match k {
                "--bundle" | "-b" => bundle = Some(PathBuf::from(v)),
                "--config" | "-f" => config = Some(PathBuf::from(v)),
                _ => {}
            }
            continue;
        }
        if a.starts_with('-') && a.len() > 1 {
            if VALUED.contains(&a) {
                let v = argv.get(i).map(PathBuf::from);
                i += 1;
                match a {
                    "--bundle" | "-b" => bundle = v,
                    "--config" | "-f" => config = v,
                    _ => {}
                }
            }
            continue;
        }
        if sub.is_none() {
            sub = Some(a.to_string());
        } else {
            positional.push(a);
        }
    }
    let sub = sub.filter(|s| s == "create" || s == "run")?;
    let container_id = positional.last()?.to_string();
    Some(RuntimeCall { subcommand: sub, container_id, bundle, config })
}

/// A process's arguments from `/proc/PID/cmdline` (NUL-separated, at most 64 KiB).
pub fn read_cmdline(proc_root: &Path, pid: u32) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(proc_root.join(pid.to_string()).join("cmdline"))?.take(CMDLINE_MAX).read_to_end(&mut out)?;
    Ok(out)
}

/// `cmdline`'s bytes as arguments.
pub fn split_cmdline(bytes: &[u8]) -> Vec<String> {
    bytes.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// What a bundle's `config.json` says that the agent uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OciConfig {
    /// The file read (for notes).
    pub file: PathBuf,
    /// The rootfs as a path valid in the agent (through the runtime's `/proc/PID/root` or
    /// `/proc/PID/cwd` when read from a runtime).
    pub rootfs: PathBuf,
    /// `annotations`.
    pub annotations: BTreeMap<String, String>,
}

/// Reads the config of the container `call` starts, for the runtime `pid` (under `proc_root`).
pub fn read_for_runtime(proc_root: &Path, pid: u32, call: &RuntimeCall) -> Result<OciConfig, String> {
    let dir = proc_root.join(pid.to_string());
    // A path as the runtime means it: absolute ones under its root, others under its cwd.
    let resolve =
        |p: &Path| if p.is_absolute() { dir.join("root").join(p.strip_prefix("/").unwrap_or(p)) } else { dir.join("cwd").join(p) };
    let bundle = call.bundle.as_deref().map_or_else(|| dir.join("cwd"), resolve);
    let file = call.config.as_deref().map_or_else(|| bundle.join("config.json"), resolve);
    read_config(&file, &bundle, &|p: &Path| if p.is_absolute() { resolve(p) } else { bundle.join(p) })
}

/// Reads `file` (a bundle's `config.json`), with `rootfs_of` turning its `root.path` into a path
/// valid here.
pub fn read_config(file: &Path, bundle: &Path, rootfs_of: &dyn Fn(&Path) -> PathBuf) -> Result<OciConfig, String> {
    let name = file.display();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file)
        .map_err(|e| format!("{name}: {e} (bundle {})", bundle.display()))?;
    let meta = f.metadata().map_err(|e| format!("{name}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{name}: not a regular file"));
    }
    if meta.len() > CONFIG_MAX {
        return Err(format!("{name}: {} bytes, over the {} MiB read at most", meta.len(), CONFIG_MAX >> 20));
    }
    let mut bytes = Vec::new();
    f.take(CONFIG_MAX + 1).read_to_end(&mut bytes).map_err(|e| format!("{name}: {e}"))?;
    if bytes.len() as u64 > CONFIG_MAX {
        return Err(format!("{name}: grew over the {} MiB read at most while it was read", CONFIG_MAX >> 20));
    }
    parse_config(&bytes, file, rootfs_of)
}

/// Parses a `config.json`'s bytes.
pub fn parse_config(bytes: &[u8], file: &Path, rootfs_of: &dyn Fn(&Path) -> PathBuf) -> Result<OciConfig, String> {
    #[derive(serde::Deserialize)]
    struct Root {
        path: String,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        root: Option<Root>,
        #[serde(default)]
        annotations: Option<BTreeMap<String, String>>,
    }
    let name = file.display();
    let c: Config = serde_json::from_slice(bytes).map_err(|e| {
        let offset = offset_of(bytes, e.line(), e.column());
        format!("{name}: not an OCI config at line {} column {} (byte {offset}): {e}", e.line(), e.column())
    })?;
    let root = c.root.ok_or_else(|| format!("{name}: no root.path (the rootfs)"))?;
    if root.path.is_empty() {
        return Err(format!("{name}: root.path is empty"));
    }
    Ok(OciConfig { file: file.to_path_buf(), rootfs: rootfs_of(Path::new(&root.path)), annotations: c.annotations.unwrap_or_default() })
}

/// The byte offset of serde_json's 1-based line and column.
fn offset_of(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut off = 0;
    for (n, l) in bytes.split(|b| *b == b'\n').enumerate() {
        if n + 1 == line {
            return off + column.saturating_sub(1).min(l.len());
        }
        off += l.len() + 1;
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn runc_and_crun_arguments_name_the_bundle_and_the_container() {
        let conmon = "/usr/bin/runc --root /run/runc --systemd-cgroup create --bundle /var/lib/c/ID/userdata --pid-file /run/p --console-socket /tmp/s ID";
        assert_eq!(
            parse_args(&args(conmon)),
            Some(RuntimeCall {
                subcommand: "create".into(),
                container_id: "ID".into(),
                bundle: Some("/var/lib/c/ID/userdata".into()),
                config: None
            })
        );
        let crun = "crun --cgroup-manager=systemd run -b=rel/b -f /etc/other.json -d c1";
        let c = parse_args(&args(crun)).expect("run");
        assert_eq!((c.bundle, c.config, c.container_id.as_str()), (Some("rel/b".into()), Some("/etc/other.json".into()), "c1"));
        let cwd = parse_args(&args("runc run --detach web")).expect("run");
        assert_eq!((cwd.subcommand.as_str(), cwd.bundle, cwd.container_id.as_str()), ("run", None, "web"));
        for other in ["runc start ID", "runc init", "runc --root /run/runc state ID", "runc create", "runc"] {
            assert_eq!(parse_args(&args(other)), None, "{other}");
        }
        let lines: Vec<Vec<String>> =
            ["runc --root /run/runc state ID", "runc init", "runc --log /l --log-format json delete --force ID", "runc -v"]
                .map(args)
                .to_vec();
        let subs: Vec<Option<&str>> = lines.iter().map(|a| subcommand(a)).collect();
        assert_eq!(subs, [Some("state"), Some("init"), Some("delete"), None]);
        assert_eq!(subcommand(&args(conmon)), Some("create"));
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpufrag-oci-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn here(b: &Path) -> impl Fn(&Path) -> PathBuf + '_ {
        move |p: &Path| b.join(p)
    }

    #[test]
    fn a_config_gives_its_rootfs_and_annotations() {
        let b = tmp("good");
        std::fs::write(
            b.join("config.json"),
            br#"{"ociVersion":"1.2.0","root":{"path":"rootfs","readonly":true},"annotations":{"io.kubernetes.pod.name":"trainer-0"}}"#,
        )
        .expect("write");
        let c = read_config(&b.join("config.json"), &b, &here(&b)).expect("read");
        assert_eq!(c.rootfs, b.join("rootfs"));
        assert_eq!(c.annotations.get("io.kubernetes.pod.name").map(String::as_str), Some("trainer-0"));
        let _ = std::fs::remove_dir_all(&b);
    }

    #[test]
    fn a_missing_huge_malformed_or_fifo_config_is_an_error_naming_the_file() {
        let b = tmp("bad");
        let file = b.join("config.json");
        let e = read_config(&file, &b, &here(&b)).expect_err("missing");
        assert!(e.starts_with(&format!("{}: ", file.display())) && e.contains("No such file"), "{e}");
        let bad = b"{\"root\":{\"path\":\"rootfs\"},\n  \"annotations\": {\"a\": 3}}";
        std::fs::write(&file, bad).expect("write");
        let e = read_config(&file, &b, &here(&b)).expect_err("malformed");
        // An annotation's value must be a string: the error is at the 3.
        let at = bad.iter().position(|c| *c == b'3').expect("3");
        let line_start = bad.iter().position(|c| *c == b'\n').expect("newline") + 1;
        assert!(e.contains(&format!("line 2 column {} (byte {at})", at - line_start + 1)), "{e}");
        std::fs::write(&file, b"{\"annotations\":{}}").expect("write");
        assert!(read_config(&file, &b, &here(&b)).expect_err("no root").contains("no root.path"));
        let huge = vec![b' '; (CONFIG_MAX + 1) as usize];
        std::fs::write(&file, &huge).expect("write");
        let e = read_config(&file, &b, &here(&b)).expect_err("huge");
        assert!(e.contains(&format!("{} bytes, over the 4 MiB", CONFIG_MAX + 1)), "{e}");
        std::fs::remove_file(&file).expect("rm");
        let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        let e = read_config(&file, &b, &here(&b)).expect_err("fifo");
        assert!(e.contains("not a regular file") && t.elapsed() < std::time::Duration::from_secs(1), "{e} after {:?}", t.elapsed());
        let _ = std::fs::remove_dir_all(&b);
    }

    #[test]
    fn the_runtime_paths_resolve_through_its_proc_entries() {
        // A /proc layout of one runtime whose cwd and root are directories of the test.
        let p = tmp("proc");
        let dir = p.join("77");
        let root = p.join("host");
        std::fs::create_dir_all(dir.clone()).expect("dir");
        std::fs::create_dir_all(root.join("var/b")).expect("bundle");
        std::os::unix::fs::symlink(&root, dir.join("root")).expect("root");
        std::os::unix::fs::symlink(root.join("var"), dir.join("cwd")).expect("cwd");
        std::fs::write(root.join("var/b/config.json"), br#"{"root":{"path":"/abs/rootfs"}}"#).expect("write");
        let call = RuntimeCall { subcommand: "create".into(), container_id: "x".into(), bundle: Some("b".into()), config: None };
        let c = read_for_runtime(&p, 77, &call).expect("relative bundle");
        assert_eq!(c.rootfs, dir.join("root/abs/rootfs"));
        let call = RuntimeCall { bundle: Some("/var/b".into()), ..call };
        assert_eq!(read_for_runtime(&p, 77, &call).expect("absolute bundle").file, dir.join("root/var/b/config.json"));
        let _ = std::fs::remove_dir_all(&p);
    }
}
