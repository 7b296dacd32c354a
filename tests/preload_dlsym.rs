//! The shim's `dlsym` keeps the loader's semantics for everything it does not track, checked
//! with small C programs compiled here (`cc`):
//!
//! - `RTLD_NEXT` is resolved relative to the real caller: an interposer loaded after the shim
//!   that asks for the next `getpid` gets libc's, not itself (a wrapper that called the real
//!   `dlsym` itself would make the shim the caller, and the interposer would recurse);
//! - `RTLD_DEFAULT` from a library loaded `RTLD_LOCAL` still sees that library's own
//!   dependencies (glibc searches the caller's scope);
//! - a library constructor that runs before the shim's own constructor can already call
//!   `dlsym`, with real handles and special ones (the real `dlsym` is found on first use);
//! - a fork child that never calls CUDA never connects to the consumer;
//! - a driver loaded `RTLD_LOCAL` (out of `RTLD_NEXT`'s reach) is still found for the helpers the
//!   shim calls itself.

mod preload_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use preload_common::*;

fn cc(dir: &Path, out: &str, src: &str, args: &[&str]) -> PathBuf {
    let c = dir.join(format!("{out}.c"));
    std::fs::write(&c, src).expect("write C source");
    let target = dir.join(out);
    let status = Command::new("cc")
        .arg("-o")
        .arg(&target)
        .arg(&c)
        .args(args)
        .arg(format!("-L{}", dir.display()))
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .expect("cc (the tests need a C compiler)");
    assert!(status.success(), "cc {out}");
    target
}

fn run(exe: &Path, preload: &str) -> std::process::Output {
    let out = Command::new(exe).env("LD_PRELOAD", preload).env_remove("GPUFRAG_SOCK").output().expect("run");
    assert!(
        out.status.success(),
        "{} under LD_PRELOAD={preload}: {:?}\n{}{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

const INTERPOSER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
static int depth;
pid_t getpid(void) {
    pid_t (*next)(void) = (pid_t (*)(void)) dlsym(RTLD_NEXT, "getpid");
    if (!next || ++depth > 100) _exit(99); /* not found, or it found ourselves */
    pid_t r = next();
    depth--;
    return r;
}
"#;

const GETPID_MAIN: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(void) {
    if (getpid() != (pid_t) syscall(SYS_getpid)) return 1;
    puts("ok");
    return 0;
}
"#;

#[test]
fn rtld_next_is_resolved_relative_to_the_caller() {
    let dir = TempDir::new("rtld-next");
    let lib = cc(dir.path(), "libinterpose.so", INTERPOSER, &["-shared", "-fPIC", "-ldl"]);
    let exe = cc(dir.path(), "getpid", GETPID_MAIN, &[]);
    let shim = artifacts().shim.display().to_string();
    for preload in [lib.display().to_string(), format!("{shim}:{}", lib.display())] {
        assert_eq!(run(&exe, &preload).stdout, b"ok\n");
    }
}

const DEP: &str = "int dep_value(void) { return 42; }\n";

const USER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
int dep_value(void);
int user_lookup(void) {
    int (*f)(void) = (int (*)(void)) dlsym(RTLD_DEFAULT, "dep_value");
    return f ? f() : -1;
}
int user_keep(void) { return dep_value(); }
"#;

const DLOPEN_MAIN: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    int (*lookup)(void) = (int (*)(void)) dlsym(h, "user_lookup");
    if (!lookup) return 3;
    /* Not in the global scope: only the library's own scope has it. */
    if (dlsym(RTLD_DEFAULT, "dep_value") != NULL) return 4;
    printf("%d\n", lookup());
    return 0;
}
"#;

#[test]
fn rtld_default_from_a_local_library_sees_its_dependencies() {
    let dir = TempDir::new("rtld-default");
    cc(dir.path(), "libdep.so", DEP, &["-shared", "-fPIC"]);
    let user = cc(dir.path(), "libuser.so", USER, &["-shared", "-fPIC", "-ldep", "-ldl"]);
    let exe = cc(dir.path(), "dlopen_local", DLOPEN_MAIN, &["-ldl"]);
    let shim = artifacts().shim.display().to_string();
    for preload in ["", shim.as_str()] {
        let out = Command::new(&exe).arg(&user).env("LD_PRELOAD", preload).output().expect("run");
        assert!(out.status.success(), "LD_PRELOAD={preload}: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, b"42\n", "LD_PRELOAD={preload}");
    }
}

const EARLY: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int early_ok;
__attribute__((constructor)) static void early(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    early_ok = libc && dlsym(libc, "getpid") && dlsym(RTLD_DEFAULT, "getpid")
        && dlsym(RTLD_NEXT, "getpid") && dlvsym(libc, "getpid", "GLIBC_2.2.5")
        && dlsym(libc, "no_such_function_anywhere") == NULL;
}
"#;

const EARLY_MAIN: &str = r#"
#include <stdio.h>
extern int early_ok;
int main(void) { printf("%d\n", early_ok); return early_ok ? 0 : 1; }
"#;

#[test]
fn dlsym_works_in_constructors_that_run_before_the_shims() {
    let dir = TempDir::new("early");
    cc(dir.path(), "libearly.so", EARLY, &["-shared", "-fPIC", "-ldl"]);
    let exe = cc(dir.path(), "early", EARLY_MAIN, &["-learly"]);
    assert_eq!(run(&exe, &artifacts().shim.display().to_string()).stdout, b"1\n");
}

const FORK_MAIN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
int main(void) {
    pid_t pid = fork();
    if (pid == 0) { puts("child"); exit(0); }
    int status;
    waitpid(pid, &status, 0);
    puts("parent");
    return WEXITSTATUS(status);
}
"#;

#[test]
fn a_fork_child_that_never_calls_cuda_never_connects() {
    let dir = TempDir::new("fork");
    let exe = cc(dir.path(), "fork", FORK_MAIN, &[]);
    let consumer = Consumer::start(Mode::Drain);
    let out = Command::new(&exe).env("LD_PRELOAD", &artifacts().shim).env("GPUFRAG_SOCK", consumer.sock()).output().expect("run");
    assert!(out.status.success());
    let traced = consumer.finish();
    assert_eq!(traced.len(), 1, "only the parent: {:?}", traced.iter().map(|t| t.hello).collect::<Vec<_>>());
    let kinds: Vec<_> = traced[0].events.iter().filter_map(|e| e.kind()).collect();
    assert_eq!(kinds, [gpufrag_wire::event::EventKind::ProcessExit]);
}

const LOCAL_DRIVER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
typedef int (*init_t)(unsigned);
typedef int (*retain_t)(void **, int);
typedef int (*set_t)(void *);
typedef int (*alloc_t)(uint64_t *, size_t);
typedef int (*free_t)(uint64_t);
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 2;
    if (dlsym(RTLD_DEFAULT, "cuCtxGetDevice")) return 3; /* the driver is not in the global scope */
    init_t init = (init_t) dlsym(h, "cuInit");
    retain_t retain = (retain_t) dlsym(h, "cuDevicePrimaryCtxRetain");
    set_t set = (set_t) dlsym(h, "cuCtxSetCurrent");
    alloc_t alloc = (alloc_t) dlsym(h, "cuMemAlloc_v2");
    free_t release = (free_t) dlsym(h, "cuMemFree_v2");
    void *ctx;
    uint64_t p;
    if (init(0) || retain(&ctx, 0) || set(ctx) || alloc(&p, 5 << 20) || release(p)) return 4;
    printf("%llx\n", (unsigned long long) p);
    return 0;
}
"#;

/// A driver loaded `RTLD_LOCAL` is out of `RTLD_NEXT`'s reach: the shim still finds the helpers it
/// calls itself (`cuCtxGetDevice` for the device, `cuMemGetInfo_v2` for the first sample) in the
/// loaded objects' symbol tables.
#[test]
fn a_driver_loaded_rtld_local_is_still_found() {
    let dir = TempDir::new("local-driver");
    let exe = cc(dir.path(), "local_driver", LOCAL_DRIVER, &["-ldl"]);
    let consumer = Consumer::start(Mode::Drain);
    let out = Command::new(&exe)
        .env("LD_PRELOAD", &artifacts().shim)
        .env("LD_LIBRARY_PATH", &artifacts().libs)
        .env("SIMCUDA_STATE_DIR", dir.path())
        .env("GPUFRAG_SOCK", consumer.sock())
        .env("GPUFRAG_SAMPLE_MS", "0")
        .output()
        .expect("run");
    assert!(out.status.success(), "{:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let p = addr(String::from_utf8_lossy(&out.stdout).trim());
    let traced = consumer.finish();
    assert_eq!(traced.len(), 1);
    use gpufrag_wire::event::EventKind::*;
    let got: Vec<_> = traced[0].events.iter().map(|e| (e.kind().expect("kind"), e.addr, e.device)).collect();
    assert_eq!(got, [(MemAlloc, p, 0), (DeviceInfo, 0, 0), (MemFree, p, -1), (ProcessExit, 0, -1)]);
}
