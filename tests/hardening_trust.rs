//! Issue 23, items 1–3: no code or file of another local user is ever trusted. Each test plays a
//! hostile second local user for real: `gpufrag-other`, made by the test with `useradd` when it is
//! missing (the tests run as root, as in CI; as another user they fail and say so, they never
//! pass by skipping). The files that user "plants" are owned by its uid; its feed server runs
//! under its uid, so SO_PEERCRED reports it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The second local user's (uid, gid), made if missing.
fn other_user() -> (u32, u32) {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests make a second local user and run as root (as CI does)");
    let id = |flag: &str| Command::new("id").args([flag, "gpufrag-other"]).output().expect("id");
    if !id("-u").status.success() {
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "gpufrag-other"])
            .output()
            .expect("useradd");
        // Another test may have made it at the same moment.
        assert!(out.status.success() || id("-u").status.success(), "useradd gpufrag-other: {}", String::from_utf8_lossy(&out.stderr));
    }
    let num = |o: Output| String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().expect("a number from id");
    (num(id("-u")), num(id("-g")))
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("gpufrag-trust-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("scratch mode");
        Scratch(d)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A folder made "by" the other user (owned by its uid, with `mode`).
fn plant_dir(p: &Path, mode: u32) {
    let (uid, gid) = other_user();
    std::fs::create_dir_all(p).expect("plant dir");
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A shared library whose constructor writes `marker` (the planted code).
fn planted_library(dir: &Path, marker: &Path) -> PathBuf {
    let c = dir.join("planted.c");
    std::fs::write(
        &c,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }} }}\nint gpufrag_torch_tracker_attach(void) {{ return 0; }}\n",
            marker.display()
        ),
    )
    .expect("planted.c");
    let so = dir.join("planted.so");
    let out = Command::new("cc").args(["-shared", "-fPIC"]).arg(&c).arg("-o").arg(&so).output().expect("cc");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    so
}

/// Runs python3 with the hook's package on its path: `code` gets `tracker` imported.
fn tracker_py(code: &str, env: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(format!("from _gpufrag import tracker\n{code}")).env("PYTHONPATH", root().join("python"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("python3");
    assert!(out.status.success(), "python3: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 23: a library another user placed in a cache folder of theirs ran as root in the traced
/// process. Now the folder is refused (owner), a library in our own folder whose hash was not
/// recorded at its build, or differs from it, is not loaded, and one with the right hash is.
#[test]
fn regression_planted_tracker_library_is_not_loaded() {
    let sc = Scratch::new("planted");
    let marker = sc.path().join("constructor-ran");
    let so = planted_library(sc.path(), &marker);
    let name = "torch-tracker-2.11.0-0123456789abcdef.so";

    // 1. The other user's folder under a shared cache base.
    let theirs = sc.path().join("shared-cache/gpufrag");
    plant_dir(&theirs, 0o755);
    std::fs::copy(&so, theirs.join(name)).expect("plant");
    let (uid, gid) = other_user();
    std::os::unix::fs::chown(theirs.join(name), Some(uid), Some(gid)).expect("chown");
    let out = tracker_py(&format!("print(tracker.attach_library({:?}))", theirs.join(name).display().to_string()), &[]);
    assert!(out.contains("the cache folder is refused") && out.contains(&format!("belongs to uid {uid}")), "{out}");
    assert!(!marker.exists(), "the planted constructor ran");
    let out = tracker_py(
        "import types\nt = types.SimpleNamespace(__version__='2.11.0', version=types.SimpleNamespace(cuda='12.8'), _C=types.SimpleNamespace())\nprint(tracker.cached_library(t))",
        &[("XDG_CACHE_HOME", &sc.path().join("shared-cache"))],
    );
    assert!(out.starts_with("the cache folder is refused"), "{out}");

    // 2. Our own folder: no recorded hash, then a wrong one, then the right one.
    let ours = sc.path().join("cache/gpufrag");
    std::fs::create_dir_all(&ours).expect("ours");
    std::fs::copy(&so, ours.join(name)).expect("copy");
    let lib = ours.join(name).display().to_string();
    let out = tracker_py(&format!("print(tracker.attach_library({lib:?}))"), &[]);
    assert!(out.contains("no hash recorded at its build"), "{out}");
    std::fs::write(ours.join(format!("{name}.sha256")), format!("{}\n", "0".repeat(64))).expect("hash");
    let out = tracker_py(&format!("print(tracker.attach_library({lib:?}))"), &[]);
    assert!(out.contains("is not the one recorded at its build"), "{out}");
    assert!(!marker.exists(), "a library of the wrong hash ran");
    assert_eq!(std::fs::metadata(&ours).expect("ours").mode() & 0o777, 0o700, "our cache folder is made private");
    let out = tracker_py(
        &format!(
            "fd = __import__('os').open({lib:?}, 0)\nopen({lib:?} + '.sha256', 'w').write(tracker.file_hash(fd) + '\\n')\nlib, err = tracker.attach_library({lib:?})\nprint(err)"
        ),
        &[],
    );
    assert_eq!(out.trim(), "None", "the library with its build's hash attaches");
    assert_eq!(std::fs::read_to_string(&marker).expect("the verified library ran"), "ran");
}

/// Issue 23: a symlink at the build log made root's background build overwrite a root-only file.
/// The build now runs in a fresh private folder and its log is renamed into place.
#[test]
fn regression_planted_symlink_at_the_build_log_is_not_followed() {
    let sc = Scratch::new("buildlog");
    let victim = sc.path().join("root-only");
    std::fs::write(&victim, "root's secret").expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let marker = sc.path().join("constructor-ran");
    let so = planted_library(sc.path(), &marker);
    let cache = sc.path().join("cache/gpufrag");
    std::fs::create_dir_all(&cache).expect("cache");
    let out = cache.join("torch-tracker-x-0123456789abcdef.so");
    let log = PathBuf::from(format!("{}.log", out.display()));
    std::os::unix::fs::symlink(&victim, &log).expect("symlink");
    // The "compiler" copies a prebuilt library to the output path the build appends.
    let py = format!(
        "import time\nok = tracker.build_detached({out:?}, ['cp', {so:?}], {src:?}, {{'torch_tracker.cpp': b'', 'torch_trace.h': b''}})\nprint(ok)",
        out = out.display().to_string(),
        so = so.display().to_string(),
        src = cache.join("src-0123456789abcdef").display().to_string()
    );
    assert_eq!(tracker_py(&py, &[]).trim(), "True");
    let t0 = std::time::Instant::now();
    while !(out.exists() && std::fs::symlink_metadata(&log).is_ok_and(|m| m.is_file())) {
        assert!(t0.elapsed().as_secs() < 30, "the detached build did not finish");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "root's secret", "the build log was written through the symlink");
    assert!(std::fs::read_to_string(&log).expect("log").contains("built in"));
    let lib = out.display().to_string();
    let r = tracker_py(&format!("lib, err = tracker.attach_library({lib:?})\nprint(err)"), &[]);
    assert_eq!(r.trim(), "None", "the built library carries its hash and loads");
    let left: Vec<String> =
        std::fs::read_dir(&cache).expect("cache").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(!left.iter().any(|n| n.starts_with(".build-") || n.ends_with(".building")), "build leftovers: {left:?}");
}

fn demo(env: &[(&str, &Path)], remove: &[&str], cwd: &Path) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpufrag"));
    cmd.args(["demo"]).current_dir(cwd).env_remove("XDG_RUNTIME_DIR");
    for k in remove {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("gpufrag demo")
}

/// Issue 23: with HOME and XDG_STATE_HOME unset the report went to /tmp/gpufrag (TMPDIR), a
/// folder another user could own, through their symlink. Now there is no report and a note says
/// why; a state folder owned by another user is refused.
#[test]
fn regression_report_never_falls_back_into_a_shared_folder_of_another_user() {
    let sc = Scratch::new("report");
    let tmp = sc.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).expect("sticky");
    plant_dir(&tmp.join("gpufrag"), 0o777);
    let out = demo(&[("TMPDIR", &tmp)], &["HOME", "XDG_STATE_HOME"], sc.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("fragmentation OOM"), "the demo's OOM: {stderr}");
    assert!(stderr.contains("no OOM report written: there is no state folder ($XDG_STATE_HOME and $HOME are unset)"), "{stderr}");
    assert_eq!(std::fs::read_dir(tmp.join("gpufrag")).expect("theirs").count(), 0, "something was written into the other user's folder");

    let state = sc.path().join("state");
    plant_dir(&state.join("gpufrag"), 0o755);
    let out = demo(&[("TMPDIR", &tmp), ("XDG_STATE_HOME", &state)], &[], sc.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (uid, _) = other_user();
    assert!(
        stderr.contains(&format!("no OOM report written: {}: refused, the folder belongs to uid {uid}", state.join("gpufrag").display())),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(state.join("gpufrag")).expect("theirs").count(), 0);
}

/// Issue 23: `--summary-json /tmp/x.json` put the report at the fixed /tmp/report.html and
/// `--summary-json /dev/stdout` at /dev/report.html; a derived path never lands in a shared or
/// device folder now (the default state folder is used instead).
#[test]
fn regression_report_beside_summary_json_never_lands_in_tmp_or_dev() {
    use gpufrag::views::postmortem::report_path;
    assert_eq!(report_path(None, Some(Path::new("/tmp/x.json"))), None);
    assert_eq!(report_path(None, Some(Path::new("/dev/stdout"))), None);
    let sc = Scratch::new("beside");
    assert_eq!(report_path(None, Some(&sc.path().join("s.json"))), Some(sc.path().join("report.html")));
    let shared = sc.path().join("shared");
    plant_dir(&shared, 0o755);
    assert_eq!(report_path(None, Some(&shared.join("s.json"))), None, "another user's folder");
    assert_eq!(report_path(Some(Path::new("/tmp/mine.html")), Some(Path::new("/tmp/x.json"))), Some(PathBuf::from("/tmp/mine.html")));
}

/// Issue 23: two outputs on one path exited 0 and left a file that was neither.
#[test]
fn regression_run_two_outputs_on_one_path_refused_before_the_workload() {
    let sc = Scratch::new("collide");
    let x = sc.path().join("x");
    let marker = sc.path().join("ran");
    for other in ["--summary-json", "--report", "--memviz"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
            .args(["run", "-q", "--no-feed", "--record"])
            .arg(&x)
            .arg(other)
            .arg(&x)
            .args(["--", "touch"])
            .arg(&marker)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{other}: {stderr}");
        assert!(stderr.contains("two outputs on one file"), "{other}: {stderr}");
        assert!(!marker.exists() && !x.exists(), "{other}: the workload started or a file was written");
    }
    let input = sc.path().join("in.rec");
    std::fs::write(&input, "x").expect("input");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(["report"]).arg(&input).arg("-o").arg(&input).output().expect("report");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("an output never overwrites an input"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&input).expect("kept"), "x");
}

/// Issue 23: `top` listed /tmp/gpufrag-UID (used without XDG_RUNTIME_DIR) with no owner check.
#[test]
fn regression_top_refuses_a_feed_folder_of_another_user() {
    let sc = Scratch::new("topdir");
    plant_dir(&sc.path().join("gpufrag"), 0o777);
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("top").env("XDG_RUNTIME_DIR", sc.path()).output().expect("top");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (uid, _) = other_user();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("{}: refused, the folder belongs to uid {uid}", sc.path().join("gpufrag").display())), "{stderr}");
    // `run` refuses to serve its feed there too (and says so; the run itself goes on).
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["run", "--no-report", "--", "true"])
        .env("XDG_RUNTIME_DIR", sc.path())
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("no live feed for `gpufrag top`") && stderr.contains("refused, the folder belongs to uid"), "{stderr}");
}

/// Issue 23: another user's socket could feed `top` forged frames. A server of another uid
/// (SO_PEERCRED) is refused, both named with --connect and found in the feed folder.
#[test]
fn regression_forged_feed_socket_of_another_user_is_refused() {
    let sc = Scratch::new("forged");
    let (uid, gid) = other_user();
    let theirs = sc.path().join("theirs");
    plant_dir(&theirs, 0o755);
    let sock = theirs.join("run-1.sock");
    let server = "import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\nimport os\nos.chmod(sys.argv[1],0o777)\ns.listen(8)\nprint('up',flush=True)\nwhile True:\n    c,_=s.accept()\n    c.sendall(b'{\"feed\":1}\\n')\n    c.close()\n";
    let mut child = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(server)
        .arg(&sock)
        .uid(uid)
        .gid(gid)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the other user's server");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut line).expect("server up");
    assert_eq!(line.trim(), "up");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(["top", "--connect"]).arg(&sock).output().expect("top");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // In our own private feed folder too: a socket served by another uid is not a live feed.
    let feeds = sc.path().join("run/gpufrag");
    std::fs::create_dir_all(&feeds).expect("feeds");
    std::fs::set_permissions(&feeds, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let sock2 = feeds.join("run-2.sock");
    let listed = {
        // Their server is reachable from our folder through a second name (a hard link).
        std::fs::hard_link(&sock, &sock2).expect("link");
        Command::new(env!("CARGO_BIN_EXE_gpufrag")).arg("top").env("XDG_RUNTIME_DIR", sc.path().join("run")).output().expect("top")
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("refused, the feed is served by uid {uid}, not by you or root")), "{stderr}");
    let stderr2 = String::from_utf8_lossy(&listed.stderr);
    assert!(stderr2.contains("no live gpufrag feed in"), "{stderr2}");
}
