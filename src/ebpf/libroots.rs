//! The scan of the node's library and Python roots at the agent's start, for the caching
//! allocators' libraries that processes load after their start (`import torch` maps
//! `libc10_cuda.so`, `import jax` XLA's `xla_cuda_plugin.so`): a uprobe belongs to the file's
//! inode, so a file probed before any process maps it is traced from its first call in every
//! process that later loads it. What the scan does not find is probed when the dynamic loader's
//! breakpoint reports the load (see `session`), a few milliseconds late.
//!
//! A filesystem mounted after the start (a new container's rootfs) is walked the same way, under
//! its mount point, when the exec hold holds the first exec from it ([`roots_under`],
//! [`HELD_TIME_BUDGET`]).
//!
//! Bounded: a breadth-first walk of [`default_roots`] (and `--lib-root` directories), at most
//! [`MAX_DEPTH`] directories below a root, [`MAX_ENTRIES`] directory entries and [`TIME_BUDGET`]
//! in all, [`MAX_FOUND`] files; symbolic links to directories are not followed, hidden
//! directories are skipped except the usual Python environment ones. The summary says what was
//! walked, found and cut.

use super::procfs::{file_id, FileId, LibKind};
use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Directories below a root, at most (`site-packages/torch/lib` of a virtual environment under
/// `/home/USER/ENV/lib/python3.X/` is 7 below `/home`).
pub const MAX_DEPTH: usize = 8;
/// Directory entries read in all, at most.
pub const MAX_ENTRIES: u64 = 400_000;
/// Wall time of the whole walk, at most.
pub const TIME_BUDGET: Duration = Duration::from_secs(2);
/// Library files kept, at most.
pub const MAX_FOUND: usize = 64;
/// Wall time of the walk of a new filesystem whose first exec is held (a container's rootfs:
/// its start waits on it, within the hold's timeout).
pub const HELD_TIME_BUDGET: Duration = Duration::from_millis(500);

/// Where Python environments and framework installs usually live.
const ROOTS: [&str; 11] =
    ["/usr/local/lib", "/usr/lib", "/usr/lib64", "/usr/local/lib64", "/opt", "/root", "/home", "/workspace", "/app", "/venv", "/srv"];

/// Directory names never entered (large, and never holding a Python package's libraries).
const SKIPPED: [&str; 10] = ["__pycache__", "firmware", "modules", "node_modules", "include", "locale", "man", "doc", "proc", "sys"];

/// Hidden directories that are entered (Python environments and user installs).
const HIDDEN_ENTERED: [&str; 5] = [".local", ".venv", ".conda", ".pyenv", ".virtualenvs"];

/// What one walk did.
#[derive(Clone, Debug, Default)]
pub struct RootScan {
    /// The allocator libraries found, with their kind, once per file.
    pub found: Vec<(LibKind, PathBuf)>,
    /// Directories read.
    pub dirs: u64,
    /// Directory entries looked at.
    pub entries: u64,
    /// How long it took.
    pub elapsed: Duration,
    /// Why it stopped before the end, if it did.
    pub cut: Option<String>,
}

impl RootScan {
    /// What the walk did, for a note: `D directories, E entries in M ms`, and where it was cut.
    pub fn figures(&self) -> String {
        format!(
            "{} directories, {} entries in {:.1} ms{}",
            self.dirs,
            self.entries,
            self.elapsed.as_secs_f64() * 1e3,
            self.cut.as_ref().map(|c| format!(", cut at {c}")).unwrap_or_default()
        )
    }
}

/// [`ROOTS`] in this root and under `host_root`, those that exist.
pub fn default_roots(host_root: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ROOTS.iter().map(PathBuf::from).collect();
    if let Some(h) = host_root {
        out.extend(ROOTS.iter().map(|r| h.join(r.trim_start_matches('/'))));
    }
    out.retain(|p| p.is_dir());
    out
}

/// [`ROOTS`] under `root` (a new filesystem's mount point), those that exist.
pub fn roots_under(root: &Path) -> Vec<PathBuf> {
    ROOTS.iter().map(|r| root.join(r.trim_start_matches('/'))).filter(|p| p.is_dir()).collect()
}

fn enter(name: &str) -> bool {
    if name.starts_with('.') {
        return HIDDEN_ENTERED.contains(&name);
    }
    !SKIPPED.contains(&name)
}

/// Walks `roots` breadth first for allocator libraries ([`LibKind::C10Cuda`],
/// [`LibKind::XlaBfc`]) and CUDA runtimes ([`LibKind::Cudart`]: a wheel's `libcudart.so.12`,
/// whose allocation functions name the owners of driver memory), by file name, within the bounds.
pub fn scan(roots: &[PathBuf]) -> RootScan {
    scan_within(roots, TIME_BUDGET, MAX_ENTRIES)
}

/// [`scan`] with other bounds (the tests').
pub fn scan_within(roots: &[PathBuf], budget: Duration, max_entries: u64) -> RootScan {
    let start = Instant::now();
    let mut out = RootScan::default();
    let mut queue: VecDeque<(PathBuf, usize)> = roots.iter().map(|r| (r.clone(), 0)).collect();
    let mut seen_dirs: HashSet<FileId> = HashSet::new();
    let mut seen_files: HashSet<FileId> = HashSet::new();
    'walk: while let Some((dir, depth)) = queue.pop_front() {
        // A root listed twice (or one inside another) is walked once.
        if !file_id(&dir).is_ok_and(|id| seen_dirs.insert(id)) {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        out.dirs += 1;
        for entry in rd.flatten() {
            out.entries += 1;
            if out.entries > max_entries {
                out.cut = Some(format!("{max_entries} directory entries read"));
                break 'walk;
            }
            if out.entries % 256 == 0 && start.elapsed() > budget {
                out.cut = Some(format!("the {} ms time budget", budget.as_millis()));
                break 'walk;
            }
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if ft.is_dir() {
                if depth < MAX_DEPTH && enter(&name) {
                    queue.push_back((entry.path(), depth + 1));
                }
                continue;
            }
            let Some(kind) = LibKind::of(&name).filter(|k| matches!(k, LibKind::C10Cuda | LibKind::XlaBfc | LibKind::Cudart)) else {
                continue;
            };
            let path = entry.path();
            // A regular file, or a link to one; each file once.
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) || !file_id(&path).is_ok_and(|id| seen_files.insert(id)) {
                continue;
            }
            out.found.push((kind, path));
            if out.found.len() >= MAX_FOUND {
                out.cut = Some(format!("{MAX_FOUND} libraries found"));
                break 'walk;
            }
        }
    }
    out.elapsed = start.elapsed();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_allocator_libraries_of_a_python_tree_within_its_bounds() {
        let root = std::env::temp_dir().join(format!("gpufrag-libroots-{}", std::process::id()));
        let torch = root.join("venv/lib/python3.12/site-packages/torch/lib");
        let jax = root.join("venv/lib/python3.12/site-packages/jax_plugins/xla_cuda13");
        let hidden = root.join(".cargo/registry");
        let deep = root.join("a/b/c/d/e/f/g/h/i");
        for d in [&torch, &jax, &hidden, &deep] {
            std::fs::create_dir_all(d).expect("dirs");
        }
        for f in [
            torch.join("libc10_cuda.so"),
            torch.join("libc10.so"),
            jax.join("xla_cuda_plugin.so"),
            hidden.join("libc10_cuda.so"),
            deep.join("libc10_cuda.so"),
        ] {
            std::fs::write(&f, b"x").expect("file");
        }
        // The same file by a second name is one file.
        std::os::unix::fs::symlink(torch.join("libc10_cuda.so"), torch.join("libc10_cuda.so.2")).expect("link");
        let s = scan(std::slice::from_ref(&root));
        // Files by identity: either name of the linked file may come first in the directory.
        let id = |p: &Path| file_id(p).expect("stat");
        let mut got: Vec<(LibKind, FileId)> = s.found.iter().map(|(k, p)| (*k, id(p))).collect();
        got.sort();
        assert_eq!(
            got,
            vec![(LibKind::C10Cuda, id(&torch.join("libc10_cuda.so"))), (LibKind::XlaBfc, id(&jax.join("xla_cuda_plugin.so")))],
            "hidden .cargo and a directory deeper than {MAX_DEPTH} are not entered: {s:?}"
        );
        assert!(s.cut.is_none(), "{s:?}");
        let cut = scan_within(std::slice::from_ref(&root), TIME_BUDGET, 3);
        assert_eq!(cut.cut.as_deref(), Some("3 directory entries read"), "{cut:?}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
