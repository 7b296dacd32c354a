//! Output paths checked before any work starts: `run` (and any command that writes files the
//! user names) calls [`check_output`] for every path it will write, so that a missing directory or
//! an unwritable file is an error before the workload runs, not after it ran for an hour, and no
//! existing file is touched (let alone truncated) until every argument is known to be valid.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn writable(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else { return false };
    // SAFETY: access reads the NUL-terminated path we own and touches nothing else.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Checks that `path` (given as `flag`) can be written: it is not a directory, its directory
/// exists and is writable, and an existing file is writable. Touches nothing.
pub fn check_output(flag: &str, path: &Path) -> anyhow::Result<()> {
    let bad = |why: String| -> anyhow::Result<()> { Err(crate::input::UnusableInput(format!("{flag} {}: {why}", path.display())).into()) };
    if path.as_os_str().is_empty() {
        return bad("an empty path".into());
    }
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => return bad("is a directory".into()),
        Ok(_) if !writable(path) => return bad("exists and is not writable".into()),
        Ok(_) => return Ok(()),
        Err(_) => {}
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(md) if md.is_dir() && writable(dir) => Ok(()),
        Ok(md) if md.is_dir() => bad(format!("the directory {} is not writable", dir.display())),
        Ok(_) => bad(format!("{} is not a directory", dir.display())),
        Err(e) => bad(format!("the directory {} does not exist ({e})", dir.display())),
    }
}

/// What a path names, for comparing two of them: an existing file by (device, inode), a file yet to
/// be made by its folder's (device, inode) and its name. `None` when the folder is missing (then
/// [`check_output`] refuses the path anyway).
fn identity(p: &Path) -> Option<(u64, u64, Option<std::ffi::OsString>)> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(md) = std::fs::metadata(p) {
        return Some((md.dev(), md.ino(), None));
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let md = std::fs::metadata(dir).ok()?;
    Some((md.dev(), md.ino(), Some(p.file_name()?.to_os_string())))
}

/// Refuses two outputs on one file, and an output on an input, before anything is started or
/// written (`run --record X --summary-json X` left a file that was neither, the record lost).
/// `outputs` and `inputs` are (flag, path) pairs; paths are compared by what they name (hard
/// links, `./x` and `x`, symlinks included).
pub fn check_distinct(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    let ids: Vec<_> = outputs.iter().map(|(f, p)| (*f, *p, identity(p))).collect();
    for (i, (fa, pa, ia)) in ids.iter().enumerate() {
        let Some(ia) = ia else { continue };
        for (fb, pb, ib) in &ids[i + 1..] {
            if ib.as_ref() == Some(ia) {
                return Err(crate::input::UnusableInput(format!(
                    "{fa} {} and {fb} {}: two outputs on one file; give each its own path",
                    pa.display(),
                    pb.display()
                ))
                .into());
            }
        }
        for (fi, pi) in inputs {
            if identity(pi).as_ref() == Some(ia) {
                let name = if fi.is_empty() { "the input".to_string() } else { format!("the input {fi}") };
                return Err(crate::input::UnusableInput(format!(
                    "{fa} {}: is {name} {}; an output never overwrites an input",
                    pa.display(),
                    pi.display()
                ))
                .into());
            }
        }
    }
    Ok(())
}

/// Checks that `cmd` names a program that can be started: a path to an executable file, or a
/// name found in `$PATH`.
pub fn check_command(cmd: &std::ffi::OsStr) -> anyhow::Result<()> {
    let is_exe = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let p = Path::new(cmd);
    let found = if cmd.as_bytes().contains(&b'/') {
        is_exe(p)
    } else {
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| is_exe(&d.join(p))))
    };
    if found {
        Ok(())
    } else {
        Err(crate::input::UnusableInput(format!("{}: command not found or not executable", p.display())).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_directories_and_directories_are_refused_before_anything_is_written() {
        let dir = std::env::temp_dir().join(format!("gpufrag-outputs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test setup");
        assert!(check_output("--record", &dir.join("new.rec")).is_ok());
        let e = check_output("--summary-json", &dir.join("missing/s.json")).expect_err("missing directory");
        assert!(e.to_string().starts_with(&format!("--summary-json {}", dir.join("missing/s.json").display())), "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(check_output("--report", &dir).expect_err("a directory").to_string().contains("is a directory"));
        let f = dir.join("keep.rec");
        std::fs::write(&f, "kept").expect("test setup");
        assert!(check_output("--record", &f).is_ok());
        assert_eq!(std::fs::read_to_string(&f).expect("untouched"), "kept");
        assert!(check_command(std::ffi::OsStr::new("sh")).is_ok());
        assert!(check_command(std::ffi::OsStr::new("/nonexistent/gpufrag-no-such-command")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 23: `run --record X --summary-json X` exited 0 and left a file that was neither.
    #[test]
    fn regression_two_outputs_on_one_file_or_an_output_on_an_input_are_refused() {
        let dir = std::env::temp_dir().join(format!("gpufrag-outputs-distinct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test setup");
        let (a, b) = (dir.join("a.rec"), dir.join("b.json"));
        check_distinct(&[("--record", &a), ("--summary-json", &b)], &[]).expect("distinct");
        let same = dir.join("./a.rec");
        let e = check_distinct(&[("--record", &a), ("--summary-json", &same)], &[]).expect_err("same new file");
        assert!(e.to_string().contains("two outputs on one file"), "{e}");
        std::fs::write(&b, "{}").expect("test setup");
        std::os::unix::fs::symlink(&b, dir.join("link.json")).expect("test setup");
        let e = check_distinct(&[("--summary-json", &b), ("--report", &dir.join("link.json"))], &[]).expect_err("a symlink to it");
        assert!(e.to_string().starts_with(&format!("--summary-json {}", b.display())), "{e}");
        let e = check_distinct(&[("-o", &b)], &[("", &b)]).expect_err("output on input");
        assert!(e.to_string().contains("is the input"), "{e}");
        assert_eq!(std::fs::read_to_string(&b).expect("untouched"), "{}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
