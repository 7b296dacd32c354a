//! Who a live process is, for `top`'s command and user columns: its command line
//! (`/proc/PID/cmdline`, at most [`COMMAND_MAX`] bytes read) and the name of its effective user
//! (`/proc/PID/status`, then the passwd database). Read once per pid while the process runs;
//! a pid whose `/proc` entry names another executable than the feed does (the pid was reused, or
//! `top` sees another pid namespace) is not read, so no row shows someone else's command.
//! Replays never read `/proc`: their pids are from another time.

use std::io::Read;
use std::path::Path;

/// The most bytes of a command line read.
pub const COMMAND_MAX: u64 = 4096;

/// A process's command line and user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// The command line: the program's base name and its arguments, joined by spaces (empty
    /// for a kernel thread).
    pub command: String,
    /// The effective user's name, or the uid when the passwd database has none.
    pub user: String,
}

/// Reads `pid` under `/proc`; `exe` is the executable name the feed gave, when it gave one.
pub fn read(pid: u32, exe: Option<&str>) -> Option<Owner> {
    read_at(Path::new("/proc"), pid, exe)
}

/// [`read`] under another `/proc` (tests).
pub fn read_at(proc: &Path, pid: u32, exe: Option<&str>) -> Option<Owner> {
    let dir = proc.join(pid.to_string());
    let mut raw = Vec::new();
    std::fs::File::open(dir.join("cmdline")).ok()?.take(COMMAND_MAX).read_to_end(&mut raw).ok()?;
    let args: Vec<String> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if let Some(exe) = exe.filter(|e| !e.is_empty() && *e != "unknown") {
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let image = std::fs::read_link(dir.join("exe")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let arg0 = args.first().and_then(|a| Path::new(a).file_name()).map(|n| n.to_string_lossy().into_owned());
        // comm is cut at 15 bytes.
        let same =
            image.as_deref() == Some(exe) || arg0.as_deref() == Some(exe) || (!comm.trim().is_empty() && exe.starts_with(comm.trim()));
        if !same {
            return None;
        }
    }
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let uid: u32 =
        status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().nth(1)).and_then(|v| v.parse().ok())?;
    let mut words = args;
    if let Some(first) = words.first_mut() {
        if let Some(base) = Path::new(first.as_str()).file_name().map(|n| n.to_string_lossy().into_owned()) {
            *first = base;
        }
    }
    Some(Owner { command: words.join(" "), user: user_name(uid) })
}

/// The login name of `uid` from the passwd database, else the number.
pub fn user_name(uid: u32) -> String {
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: an all-zero passwd is a valid value for getpwuid_r to fill.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: pw, buf (of the length passed) and found are ours and outlive the call.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
    if r == 0 && !found.is_null() && !pw.pw_name.is_null() {
        // SAFETY: on success pw_name points at a NUL-terminated string inside buf.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
        return name.to_string_lossy().into_owned();
    }
    uid.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_refuses_a_pid_that_names_another_executable() {
        let me = std::process::id();
        let o = read(me, None).expect("this process");
        assert!(!o.command.is_empty(), "{o:?}");
        // SAFETY: geteuid cannot fail.
        assert_eq!(o.user, user_name(unsafe { libc::geteuid() }));
        let exe = std::env::current_exe().expect("exe");
        let name = exe.file_name().expect("name").to_string_lossy().into_owned();
        assert_eq!(read(me, Some(&name)), Some(o.clone()), "the feed's name matches");
        assert_eq!(read(me, Some("not-this-one")), None, "a reused pid is not read");
        assert_eq!(read(u32::MAX, None), None, "no such process");
        assert_eq!(user_name(0), "root");
    }
}
