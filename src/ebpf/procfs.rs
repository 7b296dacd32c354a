//! What `/proc` says about processes: which CUDA libraries a process maps (by device and inode,
//! reached through `/proc/PID/root` so that a container's own copy is the file probed), when a
//! process started (field 22 of `/proc/PID/stat`, the key that tells two holders of one pid
//! apart), its name, its parent, and its children.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Which library a mapping is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LibKind {
    /// The CUDA driver, `libcuda.so*`.
    Cuda,
    /// PyTorch's CUDA library, `libc10_cuda.so*`.
    C10Cuda,
    /// A library carrying XLA's BFC allocator: JAX's CUDA plugin (`xla_cuda_plugin.so`, in
    /// `jax_plugins/xla_cuda13/`) or TensorFlow's `libtensorflow_framework.so*`.
    XlaBfc,
}

impl LibKind {
    /// The kind of a mapped file, by its file name.
    pub fn of(path: &str) -> Option<LibKind> {
        let name = path.rsplit('/').next().unwrap_or(path);
        if name == "libcuda.so" || name.starts_with("libcuda.so.") {
            Some(LibKind::Cuda)
        } else if name == "libc10_cuda.so" || name.starts_with("libc10_cuda.so.") {
            Some(LibKind::C10Cuda)
        } else if name == "xla_cuda_plugin.so" || name == "libtensorflow_framework.so" || name.starts_with("libtensorflow_framework.so.") {
            Some(LibKind::XlaBfc)
        } else {
            None
        }
    }
}

/// A file's identity: a uprobe belongs to an inode, so one attachment serves every process
/// (and every path, in every container) that maps the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

/// A CUDA library mapped by a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLib {
    /// Which library.
    pub kind: LibKind,
    /// Its identity.
    pub id: FileId,
    /// A path this process can reach it by: `/proc/PID/root` + the path in the process's view.
    pub path: PathBuf,
}

/// One entry of `/proc/PID/maps`: the identity and path of a file-backed mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    /// `major:minor` as the kernel prints it, decoded.
    pub dev: (u32, u32),
    /// Inode.
    pub ino: u64,
    /// Path as the process sees it.
    pub path: String,
}

/// Parses `/proc/PID/maps` text; anonymous mappings are skipped.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(6, ' ');
        let (_range, _perms, _off, dev, ino) = (f.next(), f.next(), f.next(), f.next(), f.next());
        let path = f.next().map(str::trim_start).unwrap_or("");
        let (Some(dev), Some(ino)) = (dev, ino) else { continue };
        let Ok(ino) = ino.parse::<u64>() else { continue };
        if ino == 0 || !path.starts_with('/') {
            continue;
        }
        let mut d = dev.split(':');
        let (Some(Ok(maj)), Some(Ok(min))) = (d.next().map(|x| u32::from_str_radix(x, 16)), d.next().map(|x| u32::from_str_radix(x, 16))) else {
            continue;
        };
        out.push(MapsEntry { dev: (maj, min), ino, path: path.trim_end_matches(" (deleted)").to_string() });
    }
    out
}

/// `path` (as process `pid` sees it) as this process can open it: through `/proc/PID/root`
/// when the process lives in another mount namespace or root, else the plain path (which stays
/// valid after the process exits).
pub fn reachable(pid: u32, path: &str) -> PathBuf {
    let same_root = match (std::fs::metadata(format!("/proc/{pid}/root/")), std::fs::metadata("/proc/self/root/")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    let same_ns = match (std::fs::read_link(format!("/proc/{pid}/ns/mnt")), std::fs::read_link("/proc/self/ns/mnt")) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same_root && same_ns {
        PathBuf::from(path)
    } else {
        PathBuf::from(format!("/proc/{pid}/root{path}"))
    }
}

/// The CUDA libraries process `pid` maps, each once, reachable through its root.
pub fn cuda_libs(pid: u32) -> Vec<MappedLib> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return Vec::new() };
    let mut seen = BTreeMap::new();
    for e in parse_maps(&text) {
        let Some(kind) = LibKind::of(&e.path) else { continue };
        let path = reachable(pid, &e.path);
        // The identity libbpf's uprobe will resolve is the stat of the path it opens.
        let id = match std::fs::metadata(&path) {
            Ok(m) => FileId { dev: m.dev(), ino: m.ino() },
            Err(_) => continue,
        };
        seen.entry(id).or_insert(MappedLib { kind, id, path });
    }
    seen.into_values().collect()
}

/// The identity of a file by path.
pub fn file_id(path: &Path) -> std::io::Result<FileId> {
    let m = std::fs::metadata(path)?;
    Ok(FileId { dev: m.dev(), ino: m.ino() })
}

/// The fields of `/proc/PID/stat` that gpufrag uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The command name (`comm`).
    pub comm: String,
    /// State letter.
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Start time in clock ticks after boot (field 22).
    pub start_time: u64,
}

/// Parses `/proc/PID/stat` text (the name may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let state = rest.first()?.chars().next()?;
    let ppid = rest.get(1)?.parse().ok()?;
    let start_time = rest.get(19)?.parse().ok()?;
    Some(Stat { comm, state, ppid, start_time })
}

/// `/proc/PID/stat`, or `None` when the process is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` is alive (present and not a zombie).
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Every pid in `/proc`.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut v: Vec<u32> = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    v.sort_unstable();
    v
}

/// The descendants of `root` now (children, grandchildren, ...), from every process's parent.
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = pids().into_iter().filter_map(|p| Some((p, stat(p)?.ppid))).collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parents {
            if pp == p && c != root && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// The executable's name, from `/proc/PID/exe` (else `comm`).
pub fn exe_name(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| stat(pid).map(|s| s.comm))
        .unwrap_or_default()
}

/// Where a process would find `libcuda.so.1` if it loaded it now, for attaching before it does:
/// the directories of its `LD_LIBRARY_PATH`, the dynamic linker's cache and the usual
/// directories, all seen through `/proc/PID/root`. Only files that exist are returned.
pub fn libcuda_candidates(pid: u32) -> Vec<PathBuf> {
    let root = reachable(pid, "/");
    let mut dirs: Vec<String> = Vec::new();
    if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
        for var in env.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(b"LD_LIBRARY_PATH=") {
                dirs.extend(String::from_utf8_lossy(v).split(':').filter(|d| !d.is_empty()).map(str::to_string));
            }
        }
    }
    if let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((_, path)) = line.split_once("=> ") {
                if LibKind::of(path.trim()) == Some(LibKind::Cuda) {
                    if let Some(d) = Path::new(path.trim()).parent() {
                        dirs.push(d.display().to_string());
                    }
                }
            }
        }
    }
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64", "/usr/lib/wsl/lib"] {
        dirs.push(d.to_string());
    }
    let mut out: Vec<PathBuf> = Vec::new();
    let mut ids = Vec::new();
    for d in dirs {
        let rel = d.trim_start_matches('/');
        let p = root.join(rel).join("libcuda.so.1");
        if let Ok(id) = file_id(&p) {
            if !ids.contains(&id) {
                ids.push(id);
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_with_spaces_deleted_and_anonymous() {
        let text = "7f00-7f10 r-xp 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54\n\
                    7f10-7f20 rw-p 00000000 00:00 0 \n\
                    7f20-7f30 r-xp 00001000 08:02 99 /opt/my dir/libc10_cuda.so (deleted)\n\
                    7f30-7f40 rw-p 00000000 00:00 0 [heap]\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0], MapsEntry { dev: (0xfd, 1), ino: 1234, path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54".into() });
        assert_eq!(m[1].path, "/opt/my dir/libc10_cuda.so");
        assert_eq!(LibKind::of(&m[0].path), Some(LibKind::Cuda));
        assert_eq!(LibKind::of(&m[1].path), Some(LibKind::C10Cuda));
        assert_eq!(LibKind::of("/usr/lib/libcudart.so.13"), None);
        assert_eq!(LibKind::of("/venv/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so"), Some(LibKind::XlaBfc));
        assert_eq!(LibKind::of("/venv/site-packages/tensorflow/libtensorflow_framework.so.2"), Some(LibKind::XlaBfc));
        assert_eq!(LibKind::of("/usr/lib/libcuda_stub.so"), None);
    }

    #[test]
    fn stat_with_a_name_holding_parentheses() {
        let text = "4242 (py (worker) 1) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 100";
        let s = parse_stat(text).expect("parses");
        assert_eq!(s, Stat { comm: "py (worker) 1".into(), state: 'S', ppid: 17, start_time: 987654 });
    }

    #[test]
    fn this_process_is_alive_with_a_start_time() {
        let me = std::process::id();
        assert!(alive(me));
        assert!(stat(me).expect("own stat").start_time > 0);
    }
}
