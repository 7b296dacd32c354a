//! Folders that are the user's own: every cache, state and runtime folder gpufrag creates goes
//! through [`PrivateDir`], so that no file another local user planted is ever loaded, and no write
//! is ever redirected through a symlink another user placed.
//!
//! A private folder is created with mode 0700; an existing one is used only when it is a real
//! directory (the last component is opened with `O_NOFOLLOW`), owned by this process's effective
//! uid, and writable by nobody else (a folder of our own that others may only read or enter is
//! tightened to 0700: nothing can have been planted in it). Every folder above it must be owned
//! by this uid or root and, unless it is sticky (like /tmp), writable by nobody else: a folder
//! another user may rename entries in could swap ours away after the check. Files inside are
//! written relative to the folder's descriptor (`openat` with `O_NOFOLLOW | O_EXCL` into a fresh
//! name, then `renameat` into place), so a path swapped after the check changes nothing.
//!
//! A refusal is one line that names the folder and says why ([`Refused`]).

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a folder is not used: one line naming it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// A folder checked to be the user's own, held open.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

fn cstr(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in a path"))
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: fstat fills one stat struct we own, for a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Checks every folder above `dir`: owned by us or root, and not writable by others unless sticky.
fn check_ancestors(dir: &Path) -> Result<(), Refused> {
    let me = euid();
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let canon =
        parent.canonicalize().map_err(|e| Refused(format!("{}: its folder {} is unusable ({e})", dir.display(), parent.display())))?;
    let mut cur = Some(canon.as_path());
    while let Some(p) = cur {
        let md = std::fs::metadata(p).map_err(|e| Refused(format!("{}: {} is unusable ({e})", dir.display(), p.display())))?;
        let (uid, mode) = (md.uid(), md.mode());
        if uid != me && uid != 0 {
            return Err(Refused(format!(
                "{}: refused, the folder {} above it belongs to uid {uid}, not to you (uid {me}) or root",
                dir.display(),
                p.display()
            )));
        }
        if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
            return Err(Refused(format!(
                "{}: refused, the folder {} above it may be changed by other users (mode {:o}, not sticky)",
                dir.display(),
                p.display(),
                mode & 0o7777
            )));
        }
        cur = p.parent();
    }
    Ok(())
}

/// Opens `path` as a directory without following a symlink at its last component.
fn open_dir_nofollow(at: Option<&OwnedFd>, name: &Path) -> std::io::Result<OwnedFd> {
    let c = cstr(name)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: open/openat read the NUL-terminated path we own; the result is a new descriptor.
    let fd = unsafe {
        match at {
            Some(d) => libc::openat(d.as_raw_fd(), c.as_ptr(), flags),
            None => libc::open(c.as_ptr(), flags),
        }
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor just opened and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks an opened folder: a directory of ours that nobody else may write; tightens read/enter
/// bits of others to 0700.
fn verify(fd: &OwnedFd, shown: &Path) -> Result<(), Refused> {
    let me = euid();
    let st = fstat(fd).map_err(|e| Refused(format!("{}: {e}", shown.display())))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Refused(format!("{}: refused, not a directory", shown.display())));
    }
    if st.st_uid != me {
        return Err(Refused(format!(
            "{}: refused, the folder belongs to uid {}, not to you (uid {me}); remove it or name another place",
            shown.display(),
            st.st_uid
        )));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Refused(format!(
            "{}: refused, the folder is writable by other users (mode {mode:o}); remove it or chmod 700 it",
            shown.display()
        )));
    }
    if mode & 0o077 != 0 {
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) } != 0 {
            return Err(Refused(format!("{}: cannot make it private ({})", shown.display(), std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

fn mkdir(at: Option<&OwnedFd>, name: &Path) -> std::io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: mkdir/mkdirat read the NUL-terminated path we own.
    let r = unsafe {
        match at {
            Some(d) => libc::mkdirat(d.as_raw_fd(), c.as_ptr(), 0o700),
            None => libc::mkdir(c.as_ptr(), 0o700),
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl PrivateDir {
    /// The folder at `path`, created (with its missing parents, mode 0700) if absent, else checked.
    pub fn ensure(path: &Path) -> Result<PrivateDir, Refused> {
        if path.as_os_str().is_empty() {
            return Err(Refused("an empty folder path".into()));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.exists() {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .recursive(true)
                    .create(parent)
                    .map_err(|e| Refused(format!("{}: cannot create its folder {} ({e})", path.display(), parent.display())))?;
            }
        }
        check_ancestors(path)?;
        match mkdir(None, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Refused(format!("{}: cannot create it ({e})", path.display()))),
        }
        let fd = open_dir_nofollow(None, path).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => Refused(format!("{}: refused, a symlink or not a directory", path.display())),
            _ => Refused(format!("{}: {e}", path.display())),
        })?;
        verify(&fd, path)?;
        Ok(PrivateDir { fd, path: path.to_path_buf() })
    }

    /// An existing folder checked the same way, never created (a reader's check, e.g. `top`'s).
    pub fn existing(path: &Path) -> Result<PrivateDir, Refused> {
        if !path.exists() {
            return Err(Refused(format!("{}: does not exist", path.display())));
        }
        check_ancestors(path)?;
        let fd = open_dir_nofollow(None, path).map_err(|e| Refused(format!("{}: refused ({e})", path.display())))?;
        verify(&fd, path)?;
        Ok(PrivateDir { fd, path: path.to_path_buf() })
    }

    /// A fresh folder `PREFIX-PID-XXXXXXXX` under `base` (checked), made by this call.
    pub fn fresh(base: &Path, prefix: &str) -> Result<PrivateDir, Refused> {
        let parent = PrivateDir::base(base)?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        for i in 0..100u32 {
            let name = format!("{prefix}-{}-{:08x}", std::process::id(), nanos.wrapping_add(i.wrapping_mul(0x9e37_79b9)));
            match mkdir(Some(&parent), Path::new(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Refused(format!("{}: cannot create a folder in it ({e})", base.display()))),
            }
            let path = base.join(&name);
            let fd = open_dir_nofollow(Some(&parent), Path::new(&name)).map_err(|e| Refused(format!("{}: {e}", path.display())))?;
            verify(&fd, &path)?;
            return Ok(PrivateDir { fd, path });
        }
        Err(Refused(format!("{}: no fresh folder name", base.display())))
    }

    /// Opens a shared base folder (like /tmp) for `fresh`: it must pass the ancestor rule itself.
    fn base(base: &Path) -> Result<OwnedFd, Refused> {
        check_ancestors(&base.join("x"))?;
        open_dir_nofollow(None, base).map_err(|e| Refused(format!("{}: {e}", base.display())))
    }

    /// A private folder `name` inside this one (created or checked, never through a symlink).
    pub fn subdir(&self, name: &str) -> Result<PrivateDir, Refused> {
        let path = self.path.join(name);
        match mkdir(Some(&self.fd), Path::new(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Refused(format!("{}: cannot create it ({e})", path.display()))),
        }
        let fd = open_dir_nofollow(Some(&self.fd), Path::new(name))
            .map_err(|e| Refused(format!("{}: refused, a symlink or not a directory ({e})", path.display())))?;
        verify(&fd, &path)?;
        Ok(PrivateDir { fd, path })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `name` inside it whole or not at all: a fresh temporary name opened with
    /// `O_EXCL | O_NOFOLLOW` (mode 0600), then renamed into place (replacing a symlink there, never
    /// following it).
    pub fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        if name.contains('/') || name.is_empty() || name == "." || name == ".." {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name}: not a file name")));
        }
        let tmp = format!(".{name}.{}.tmp", std::process::id());
        let ctmp = cstr(Path::new(&tmp))?;
        let cname = cstr(Path::new(name))?;
        // SAFETY: unlinkat/openat read NUL-terminated names we own, relative to our descriptor.
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), ctmp.as_ptr(), 0) };
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                ctmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by this File alone.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let written = f.write_all(bytes).and_then(|()| f.flush());
        drop(f);
        // SAFETY: as above; renameat replaces the entry `name` itself (a symlink there is replaced).
        let r = written.and_then(|()| {
            if unsafe { libc::renameat(self.fd.as_raw_fd(), ctmp.as_ptr(), self.fd.as_raw_fd(), cname.as_ptr()) } != 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            // SAFETY: as above.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), ctmp.as_ptr(), 0) };
            return Err(e);
        }
        Ok(self.path.join(name))
    }
}

/// The state folder `$XDG_STATE_HOME/gpufrag` (default `~/.local/state/gpufrag`); `None` when
/// neither variable is set (then nothing is written by default, and the caller says so).
pub fn state_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".local/state")))
        .map(|b| b.join("gpufrag"))
}

/// Checks a path gpufrag would act on but does not own (a daemon's pipe folder, a program to
/// run): the path itself is no symlink, belongs to root or (with `ours_too`) to this uid, and
/// is writable by nobody else; every folder above it passes the same rules as a private
/// folder's (root's or ours, not writable by others unless sticky). A refusal names the path.
pub fn trusted(path: &Path, ours_too: bool) -> Result<(), Refused> {
    let me = euid();
    let md = std::fs::symlink_metadata(path).map_err(|e| Refused(format!("{}: {e}", path.display())))?;
    if md.file_type().is_symlink() {
        return Err(Refused(format!("{}: refused, a symbolic link", path.display())));
    }
    let uid = md.uid();
    if uid != 0 && !(ours_too && uid == me) {
        return Err(Refused(format!(
            "{}: refused, it belongs to uid {uid}, not to root{}",
            path.display(),
            if ours_too { format!(" or you (uid {me})") } else { String::new() }
        )));
    }
    if md.mode() & 0o022 != 0 {
        return Err(Refused(format!("{}: refused, writable by other users (mode {:o})", path.display(), md.mode() & 0o7777)));
    }
    check_ancestors(path)
}

/// Whether `dir` is a folder shared with other users or a device folder: world-writable
/// (sticky or not), under /dev, /proc or /sys, or owned by another uid than ours and root's.
/// Default paths derived from another output are never placed there.
pub fn is_shared_folder(dir: &Path) -> bool {
    let canon = match dir.canonicalize() {
        Ok(c) => c,
        Err(_) => return true,
    };
    if ["/dev", "/proc", "/sys"].iter().any(|d| canon.starts_with(d)) {
        return true;
    }
    match std::fs::metadata(&canon) {
        Ok(md) => md.mode() & 0o002 != 0 || (md.uid() != euid() && md.uid() != 0) || !md.is_dir(),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpufrag-private-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("test setup");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).expect("test setup");
        d
    }

    #[test]
    fn a_new_folder_is_0700_and_a_symlink_at_its_place_is_refused() {
        let d = scratch("new");
        let p = PrivateDir::ensure(&d.join("a/b/gpufrag")).expect("created");
        assert_eq!(std::fs::metadata(p.path()).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(d.join("a")).unwrap().mode() & 0o777, 0o700);
        std::os::unix::fs::symlink(d.join("a"), d.join("link")).unwrap();
        let e = PrivateDir::ensure(&d.join("link")).expect_err("a symlink");
        assert!(e.to_string().contains("symlink"), "{e}");
        std::fs::create_dir(d.join("open")).unwrap();
        std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = PrivateDir::ensure(&d.join("open")).expect_err("world-writable");
        assert!(e.to_string().contains("writable by other users (mode 777)"), "{e}");
        std::fs::create_dir(d.join("readable")).unwrap();
        std::fs::set_permissions(d.join("readable"), std::fs::Permissions::from_mode(0o755)).unwrap();
        PrivateDir::ensure(&d.join("readable")).expect("tightened");
        assert_eq!(std::fs::metadata(d.join("readable")).unwrap().mode() & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_write_replaces_a_planted_symlink_and_never_follows_it() {
        let d = scratch("write");
        let p = PrivateDir::ensure(&d.join("gpufrag")).expect("created");
        let victim = d.join("victim");
        std::fs::write(&victim, "root only").unwrap();
        std::os::unix::fs::symlink(&victim, p.join("report.html")).unwrap();
        p.write("report.html", b"<html>").expect("written");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only");
        assert_eq!(std::fs::read_to_string(p.join("report.html")).unwrap(), "<html>");
        assert!(std::fs::symlink_metadata(p.join("report.html")).unwrap().is_file());
        assert!(p.write("../x", b"").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn shared_and_device_folders_are_named_shared() {
        assert!(is_shared_folder(Path::new("/tmp")));
        assert!(is_shared_folder(Path::new("/dev")));
        let d = scratch("own");
        assert!(!is_shared_folder(&d));
        let _ = std::fs::remove_dir_all(&d);
    }
}
