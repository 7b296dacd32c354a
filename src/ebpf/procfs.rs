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
    /// The CUDA runtime, `libcudart.so*` (and `libcudart-HASH.so*` as wheels rename it): its
    /// allocation functions are probed only to name who asked the runtime (the owner of the
    /// driver allocation they make, docs/metrics.md).
    Cudart,
    /// A library carrying XLA's BFC allocator, as `crate::alloc::LIBRARIES` names them: JAX's
    /// CUDA plugin (`xla_cuda_plugin.so`, in `jax_plugins/xla_cuda13/`).
    XlaBfc,
    /// Any ELF file with gpufrag's own USDT probes (`include/gpufrag_annotate.h`): found by
    /// its notes, not its name.
    Annotated,
    /// The dynamic loader (`ld-linux*.so*`, `ld-musl-*.so*`, [`is_loader`]): probed at its
    /// breakpoint so that each dlopen is reported as it happens. [`LibKind::of`] never says it
    /// (it is no CUDA library); [`try_cuda_libs`] lists it.
    Loader,
}

/// Whether a file name is a dynamic loader's (glibc's `ld-linux-x86-64.so.2`,
/// `ld-linux-aarch64.so.1`, musl's `ld-musl-x86_64.so.1`).
pub fn is_loader(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    (name.starts_with("ld-linux") || name.starts_with("ld-musl-")) && name.contains(".so")
}

impl LibKind {
    /// A caching allocator's library (blocks live inside segments the driver gave out).
    pub fn is_allocator(self) -> bool {
        matches!(self, LibKind::C10Cuda | LibKind::XlaBfc | LibKind::Annotated)
    }
}

impl LibKind {
    /// The kind of a mapped file, by its file name.
    pub fn of(path: &str) -> Option<LibKind> {
        let name = path.rsplit('/').next().unwrap_or(path);
        if name == "libcuda.so" || name.starts_with("libcuda.so.") {
            Some(LibKind::Cuda)
        } else if name == "libc10_cuda.so" || name.starts_with("libc10_cuda.so.") {
            Some(LibKind::C10Cuda)
        } else if name.starts_with("libcudart.so") || (name.starts_with("libcudart-") && name.contains(".so")) {
            Some(LibKind::Cudart)
        } else {
            // A library the allocator table (`crate::alloc::LIBRARIES`) names, whose allocator
            // has uprobes here: XLA's BFC.
            crate::alloc::library_allocator(name).filter(|f| *f == crate::alloc::Framework::XLA).map(|_| LibKind::XlaBfc)
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
        let (Some(Ok(maj)), Some(Ok(min))) = (d.next().map(|x| u32::from_str_radix(x, 16)), d.next().map(|x| u32::from_str_radix(x, 16)))
        else {
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

/// Why a process's `/proc` entry could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// The process is gone.
    Gone,
    /// It exists but its entry cannot be read (permissions, a kernel that hides it).
    Denied(String),
}

/// `/proc/PID/maps` as text.
fn read_maps(pid: u32) -> Result<String, Unreadable> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) || !Path::new(&format!("/proc/{pid}")).exists()
        {
            Unreadable::Gone
        } else {
            Unreadable::Denied(e.to_string())
        }
    })
}

/// The CUDA libraries (and loader) process `pid` maps, each once, reachable through its root
/// (nothing when its maps cannot be read).
pub fn cuda_libs(pid: u32) -> Vec<MappedLib> {
    try_cuda_libs(pid).unwrap_or_default()
}

/// Whether process `pid` maps the file `id` now.
pub fn maps_file(pid: u32, id: FileId) -> bool {
    let Ok(text) = read_maps(pid) else { return false };
    parse_maps(&text).iter().any(|e| {
        e.ino == id.ino
            && (libc::makedev(e.dev.0, e.dev.1) == id.dev
                || std::fs::metadata(reachable(pid, &e.path)).is_ok_and(|m| m.dev() == id.dev && m.ino() == id.ino))
    })
}

/// The executable of `pid`, as this process can open it.
pub fn exe_path(pid: u32) -> Option<PathBuf> {
    let p = PathBuf::from(format!("/proc/{pid}/exe"));
    std::fs::metadata(&p).is_ok().then_some(p)
}

/// A file's size in bytes.
pub fn file_size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// Where the node keeps its CUDA driver, for probing before any process loads it: the
/// directories of the dynamic linker's configuration (`/etc/ld.so.conf` and its includes) and
/// cache, the usual driver directories (distribution multiarch and lib64 directories, CUDA's,
/// the NVIDIA container toolkit's and GPU operator's `/run/nvidia/driver`, GKE's and WSL's),
/// each in this process's root and, with `host_root`, under it. Every `libcuda.so*` file found,
/// once per file.
pub fn node_libcuda(host_root: Option<&Path>) -> Vec<PathBuf> {
    const USUAL: [&str; 12] = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib64",
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/compat",
        "/usr/local/nvidia/lib64",
        "/home/kubernetes/bin/nvidia/lib64",
        "/usr/lib/wsl/lib",
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
        "/run/nvidia/driver/usr/lib64",
    ];
    let mut found = OncePerFile::default();
    for root in &roots(host_root) {
        let mut dirs: Vec<String> = USUAL.iter().map(|d| d.to_string()).collect();
        dirs.extend(ld_so_conf_dirs(root));
        dirs.extend(ld_cache_dirs(root));
        for d in dirs {
            let dir = root.join(d.trim_start_matches('/'));
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut names: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| LibKind::of(&e.file_name().to_string_lossy()) == Some(LibKind::Cuda))
                .map(|e| e.path())
                .collect();
            names.sort();
            for p in names.into_iter().filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file())) {
                found.add(p);
            }
        }
    }
    found.paths
}

/// This process's root and, with `host_root`, the host's: where the node's files are looked for.
fn roots(host_root: Option<&Path>) -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/")];
    if let Some(h) = host_root {
        roots.push(h.to_path_buf());
    }
    roots
}

/// Paths kept once per file (by device and inode, [`file_id`]: a file reached by two paths, or
/// through two roots that are one, is kept at the first), in the order found.
#[derive(Default)]
struct OncePerFile {
    ids: Vec<FileId>,
    paths: Vec<PathBuf>,
}

impl OncePerFile {
    /// Keeps `path` unless its file was kept already or it cannot be read.
    fn add(&mut self, path: PathBuf) {
        if let Ok(id) = file_id(&path) {
            if !self.ids.contains(&id) {
                self.ids.push(id);
                self.paths.push(path);
            }
        }
    }
}

/// The directories `root/etc/ld.so.conf` names, following `include` lines (globs in one
/// directory, as glibc's configuration uses them), at most 64 files.
fn ld_so_conf_dirs(root: &Path) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut files = vec![root.join("etc/ld.so.conf")];
    let mut read = 0;
    while let Some(f) = files.pop() {
        read += 1;
        if read > 64 {
            break;
        }
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        for line in text.lines().map(|l| l.split('#').next().unwrap_or("").trim()) {
            if let Some(pat) = line.strip_prefix("include").map(str::trim) {
                let pat = if pat.starts_with('/') { root.join(pat.trim_start_matches('/')) } else { f.parent().unwrap_or(root).join(pat) };
                let (dir, glob) = (
                    pat.parent().map(Path::to_path_buf).unwrap_or_default(),
                    pat.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                );
                let (pre, post) = glob.split_once('*').unwrap_or((&glob, ""));
                if let Ok(rd) = std::fs::read_dir(&dir) {
                    let mut found: Vec<PathBuf> = rd
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| {
                            p.file_name().is_some_and(|n| {
                                let n = n.to_string_lossy();
                                n.starts_with(pre) && n.ends_with(post) && n.len() >= pre.len() + post.len()
                            })
                        })
                        .collect();
                    found.sort();
                    files.extend(found);
                }
            } else if line.starts_with('/') {
                dirs.push(line.to_string());
            }
        }
    }
    dirs
}

/// The directories of the libcuda entries in `root`'s dynamic linker cache (`ldconfig -p` for
/// this root; `-C` reads another root's cache file without running anything there).
fn ld_cache_dirs(root: &Path) -> Vec<String> {
    let cache = root.join("etc/ld.so.cache");
    if !cache.is_file() {
        return Vec::new();
    }
    let Ok(out) = std::process::Command::new("ldconfig").arg("-C").arg(&cache).arg("-p").stderr(std::process::Stdio::null()).output()
    else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((_, path)) = line.split_once("=> ") {
            if LibKind::of(path.trim()) == Some(LibKind::Cuda) {
                if let Some(d) = Path::new(path.trim()).parent() {
                    dirs.push(d.display().to_string());
                }
            }
        }
    }
    dirs
}

/// The dynamic loaders of the node: `PT_INTERP` of this agent and the usual loader paths, in
/// this root and under `host_root`, once per file.
pub fn node_loaders(host_root: Option<&Path>) -> Vec<PathBuf> {
    const USUAL: [&str; 6] = [
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/ld-linux-aarch64.so.1",
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
        "/lib/ld-musl-x86_64.so.1",
        "/lib/ld-musl-aarch64.so.1",
    ];
    let mut found = OncePerFile::default();
    for root in &roots(host_root) {
        for p in USUAL {
            found.add(root.join(p.trim_start_matches('/')));
        }
    }
    found.paths
}

/// The CUDA libraries (and the dynamic loader, [`LibKind::Loader`]) process `pid` maps, each
/// once, reachable through its root.
pub fn try_cuda_libs(pid: u32) -> Result<Vec<MappedLib>, Unreadable> {
    let text = read_maps(pid)?;
    let mut seen = BTreeMap::new();
    for e in parse_maps(&text) {
        let Some(kind) = LibKind::of(&e.path).or_else(|| is_loader(&e.path).then_some(LibKind::Loader)) else { continue };
        let path = reachable(pid, &e.path);
        // The identity libbpf's uprobe will resolve is the stat of the path it opens.
        let id = match std::fs::metadata(&path) {
            Ok(m) => FileId { dev: m.dev(), ino: m.ino() },
            Err(_) => continue,
        };
        seen.entry(id).or_insert(MappedLib { kind, id, path });
    }
    Ok(seen.into_values().collect())
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
    let mut dirs = ld_library_path(pid);
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
    for d in
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64", "/usr/lib/wsl/lib"]
    {
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

/// The directories of `pid`'s `LD_LIBRARY_PATH` (as the process names them).
fn ld_library_path(pid: u32) -> Vec<String> {
    let mut dirs = Vec::new();
    if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
        for var in env.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(b"LD_LIBRARY_PATH=") {
                dirs.extend(String::from_utf8_lossy(v).split(':').filter(|d| !d.is_empty()).map(str::to_string));
            }
        }
    }
    dirs
}

/// The CUDA runtime files ([`LibKind::Cudart`]) in the directories of `pid`'s `LD_LIBRARY_PATH`,
/// seen through `/proc/PID/root`, once per file, at most [`MAX_CUDART_CANDIDATES`]: probed up
/// front so that a process that loads one from there names its runtime allocations' owners from
/// its first call (the node's Python and library roots are the agent's `libroots` scan).
pub fn cudart_candidates(pid: u32) -> Vec<PathBuf> {
    let root = reachable(pid, "/");
    let mut found = OncePerFile::default();
    for d in ld_library_path(pid) {
        let Ok(entries) = std::fs::read_dir(root.join(d.trim_start_matches('/'))) else { continue };
        let mut names: Vec<PathBuf> = entries
            .flatten()
            .take(4096)
            .filter(|e| LibKind::of(&e.file_name().to_string_lossy()) == Some(LibKind::Cudart))
            .map(|e| e.path())
            .collect();
        names.sort();
        for p in names.into_iter().filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file())) {
            found.add(p);
        }
        if found.paths.len() >= MAX_CUDART_CANDIDATES {
            break;
        }
    }
    found.paths.truncate(MAX_CUDART_CANDIDATES);
    found.paths
}

/// The most runtime files [`cudart_candidates`] gives.
pub const MAX_CUDART_CANDIDATES: usize = 16;

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
        assert_eq!(LibKind::of("/usr/lib/libcudart.so.13"), Some(LibKind::Cudart));
        assert_eq!(LibKind::of("/venv/torch/lib/libcudart-d0da41ae.so.11.0"), Some(LibKind::Cudart));
        assert_eq!(LibKind::of("/usr/lib/libcudart_static.a"), None);
        assert_eq!(LibKind::of("/venv/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so"), Some(LibKind::XlaBfc));
        assert_eq!(LibKind::of("/usr/lib/libcuda_stub.so"), None);
        assert!(is_loader("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2") && is_loader("/lib/ld-musl-x86_64.so.1"));
        assert!(!is_loader("/usr/lib/ld.so.conf") && !is_loader("/usr/lib/libld-linux-helper.a"));
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
