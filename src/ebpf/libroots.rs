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
//!
//! A tree that vanishes while it is walked (a container removed while its first exec is held:
//! its overlay unmounted, its directories deleted) ends nothing badly: each directory that is gone
//! by the time it is reached (or whose listing fails midway) is counted in [`RootScan::gone`] with
//! the first error, the walk goes on to the next (each costs one failed `stat`, within the same
//! bounds), and the hold is answered as after any scan.

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
    /// Directories queued that could not be read when reached (gone, or their listing failed
    /// midway), and the first of them with its error.
    pub gone: u64,
    /// The first of [`RootScan::gone`], with its error.
    pub first_gone: Option<String>,
}

impl RootScan {
    /// What the walk did, for a note: `D directories, E entries in M ms`, and where it was cut.
    pub fn figures(&self) -> String {
        format!(
            "{} directories, {} entries in {:.1} ms{}{}",
            self.dirs,
            self.entries,
            self.elapsed.as_secs_f64() * 1e3,
            self.cut.as_ref().map(|c| format!(", cut at {c}")).unwrap_or_default(),
            self.first_gone
                .as_ref()
                .map(|f| format!(", {} directories gone or unreadable when reached (the first: {f})", self.gone))
                .unwrap_or_default()
        )
    }

    fn lost(&mut self, dir: &Path, e: &std::io::Error) {
        self.gone += 1;
        if self.first_gone.is_none() {
            self.first_gone = Some(format!("{}: {e}", dir.display()));
        }
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
    walk(roots, budget, max_entries, &mut |_| {})
}

/// [`scan_within`], calling `before_dir` with each directory before it is read (the tests: a
/// tree removed midway).
fn walk(roots: &[PathBuf], budget: Duration, max_entries: u64, before_dir: &mut dyn FnMut(&Path)) -> RootScan {
    let start = Instant::now();
    let mut out = RootScan::default();
    let mut queue: VecDeque<(PathBuf, usize)> = roots.iter().map(|r| (r.clone(), 0)).collect();
    let mut seen_dirs: HashSet<FileId> = HashSet::new();
    let mut seen_files: HashSet<FileId> = HashSet::new();
    'walk: while let Some((dir, depth)) = queue.pop_front() {
        before_dir(&dir);
        // A root listed twice (or one inside another) is walked once.
        match file_id(&dir) {
            Ok(id) if seen_dirs.insert(id) => {}
            Ok(_) => continue,
            Err(e) => {
                out.lost(&dir, &e);
                continue;
            }
        }
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                out.lost(&dir, &e);
                continue;
            }
        };
        out.dirs += 1;
        for entry in rd {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    // The listing failed midway (the directory removed under it).
                    out.lost(&dir, &e);
                    break;
                }
            };
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

    /// Issue 26 (bad input): the tree removed while it is walked (a container's rootfs deleted
    /// while its first exec is held). Ten directories below the root, each holding one allocator
    /// library, the whole tree deleted just before the walk reaches the third of them: breadth
    /// first, the root and two directories were read (two libraries found), and the eight
    /// directories still queued are each counted gone, the walk ending at once, within its bounds.
    #[test]
    fn a_tree_removed_midway_is_counted_gone_and_the_walk_ends_within_its_bounds() {
        const DIRS: u64 = 10;
        const DELETE_BEFORE: u64 = 4;
        let root = std::env::temp_dir().join(format!("gpufrag-libroots-gone-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for i in 0..DIRS {
            let d = root.join(format!("d{i}"));
            std::fs::create_dir_all(&d).expect("dirs");
            std::fs::write(d.join("libc10_cuda.so"), b"x").expect("file");
        }
        let mut calls = 0u64;
        let t = Instant::now();
        let s = walk(std::slice::from_ref(&root), HELD_TIME_BUDGET, MAX_ENTRIES, &mut |_| {
            calls += 1;
            if calls == DELETE_BEFORE {
                std::fs::remove_dir_all(&root).expect("remove the tree midway");
            }
        });
        let took = t.elapsed();
        // The model: directories read before the deletion = the calls before it; each read one
        // (the root excepted) found its library; every directory queued after is gone.
        let read = DELETE_BEFORE - 1;
        assert_eq!(
            (s.dirs, s.found.len() as u64, s.gone, s.entries),
            (read, read - 1, DIRS - (read - 1), DIRS + (read - 1)),
            "(directories read, libraries found, gone, entries) of {DIRS} directories deleted before the walk's read #{DELETE_BEFORE}: {s:?}"
        );
        assert!(s.cut.is_none() && took < HELD_TIME_BUDGET, "ended at once, not by a bound: {took:?} {s:?}");
        let f = s.figures();
        assert!(
            f.contains(&format!("{} directories gone or unreadable when reached (the first: {}", DIRS - (read - 1), root.display())),
            "{f}"
        );
        assert!(!root.exists());
    }
}
