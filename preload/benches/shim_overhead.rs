//! What the shim adds to each intercepted call: `cuMemAlloc_v2` + `cuMemFree_v2` called through
//! function pointers from `dlopen("libcuda.so.1")` + `dlsym` (so, under the shim, through its
//! `dlsym` swap and its wrappers), timed call by call, with and without `LD_PRELOAD`, on 1 and 8
//! threads. The difference of the medians (and of the 99th percentiles) is the cost the shim
//! adds per call: target ≤ 50 ns median, ≤ 200 ns p99.
//!
//! Two drivers: the simcuda stand-in (realistic, but its model sits behind one mutex, so with 8
//! threads the lock dominates), and a lock-free fake libcuda compiled here with `cc` (the
//! allocation is a per-thread bump), which isolates the shim's own cost and its scaling.
//!
//! `cargo bench -p gpufrag-preload --bench shim_overhead [-- CALLS]` builds the shim and the
//! stand-ins (`cargo build --release -p gpufrag-preload -p simcuda-workload`), then runs this
//! binary again as a child for each configuration, alternating bare and shim runs. With the shim,
//! a consumer thread here drains the lanes (merged by timestamp, as `gpufrag run` does) every
//! millisecond (a consumer does other work between drains; draining each event the moment it
//! lands would move every ring cache line between cores twice), each of the 16 lanes holds 2^18
//! events so that nothing is dropped (a dropped event costs the producer less than a recorded one
//! and would flatter the figures), and periodic device sampling stays at its 200 ms default.
//!
//! A thread's first call (issue 15): each round also runs the shim once with a consumer that
//! prefaults no lane (each thread brings its own lane into memory at its first event, as before
//! the consumer's `Prefault`), and the harness prints the first call's median over threads and
//! its worst, bare, without and with prefaulting. `GPUFRAG_BENCH_START_MS` makes the child wait
//! that long before its workers start (a program's start-up: `import torch` takes seconds).
//!
//! Measurement: each round is a bare run then a shimmed one, and the figure is the median over
//! rounds of each round's difference (with its range), so that the machine drifting between
//! rounds moves both sides of a difference alike. Calls are timed with `lfence; rdtsc` where the
//! TSC is invariant (a clock read through the hypervisor's clock page costs 26–32 ns on the H200
//! host and adds its own jitter to both sides). The workers are pinned one per physical core,
//! the consumer to a core of its own, the same CPUs in bare and shimmed runs.
//!
//! Knobs: `GPUFRAG_BENCH_RING` (events per lane), `GPUFRAG_BENCH_LANES` (lanes, 16; 1 = every
//! thread on one ring, as before lanes), `GPUFRAG_BENCH_POLL_US` (0: drain as fast as events
//! land), `GPUFRAG_BENCH_REPEATS` (rounds, 5), `GPUFRAG_BENCH_TIMER=clock` (time calls with
//! `CLOCK_MONOTONIC`), `GPUFRAG_BENCH_PIN=0` (no pinning),
//! `GPUFRAG_BENCH_THREADS=1,2,8` (thread counts, default 1,8) and
//! `GPUFRAG_BENCH_DRIVERS=simcuda,fake,ring`. `ring` (not in the default set) measures the event
//! lanes alone, in this process: nanoseconds per push with 1, 2 and 8 threads on one shared ring
//! and on one lane each, and the consumer's cost per event, popped from one ring or merged.
//!
//! Not criterion: the measured code must run in a separate process (LD_PRELOAD applies at exec),
//! and the figure wanted is a per-call distribution, not a mean per batch.

#[path = "../../tests/preload_common/mod.rs"]
mod preload_common;

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufrag_wire::event::{Event, EventKind};
use gpufrag_wire::lanes::{HeapLanes, Merge, SPARE_LANES};
use preload_common::{Consumer, Mode, TempDir};

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuFree = unsafe extern "C" fn(u64) -> c_int;

const SIZE: usize = 2 << 20;
/// Rounds of a bare and a shimmed run.
const REPEATS: usize = 5;
/// Events per lane (22 MiB each).
const RING: u64 = 1 << 18;
/// Lanes (the shim's default).
const LANES: u64 = 16;

/// A lock-free libcuda with just what the child and the shim call.
const FAKE_CUDA: &str = r#"
#include <stddef.h>
#include <stdint.h>
static __thread uint64_t next;
int cuInit(unsigned f) { (void) f; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void) d; *c = (void *) 1; return 0; }
int cuCtxSetCurrent(void *c) { (void) c; return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t) 1 << 33; *t = (size_t) 1 << 34; return 0; }
int cuDeviceGetMemPool(void **p, int d) { (void) d; *p = (void *) 1; return 0; }
int cuMemAlloc_v2(uint64_t *p, size_t s) { next += s; *p = 0x7f0000000000ull + next; return 0; }
int cuMemFree_v2(uint64_t p) { (void) p; return 0; }
"#;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if std::env::var_os("GPUFRAG_BENCH_CHILD").is_some() {
        let threads = args.first().and_then(|s| s.parse().ok()).unwrap_or(1);
        let calls = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
        child(threads, calls);
        return;
    }
    let calls: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    parent(calls);
}

fn sym<T>(h: *mut c_void, name: &CStr) -> T {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "dlsym({name:?})");
    // SAFETY: the caller names the C type of that driver function.
    unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
}

/// Per-call nanoseconds of `threads` threads × `calls` alloc/free pairs, then the same pairs
/// without per-call timers; prints one line.
fn child(threads: usize, calls: usize) {
    // SAFETY: dlopen of a NUL-terminated name.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen libcuda.so.1");
    let init: CuInit = sym(h, c"cuInit");
    let retain: CuRetain = sym(h, c"cuDevicePrimaryCtxRetain");
    let set: CuSetCurrent = sym(h, c"cuCtxSetCurrent");
    let alloc: CuAlloc = sym(h, c"cuMemAlloc_v2");
    let free: CuFree = sym(h, c"cuMemFree_v2");
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the driver's own initialisation with valid out-pointers.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&mut ctx, 0), 0);
    }
    let ctx = ctx as usize;
    // A program's start-up before its first CUDA memory call (`import torch` takes seconds):
    // `GPUFRAG_BENCH_START_MS`, default 0 (the workers start at once).
    let start_ms = std::env::var("GPUFRAG_BENCH_START_MS").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(start_ms));
    let cpus = worker_cpus();
    let timer = Timer::from_env();
    let start = (Instant::now(), timer.now());
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
            std::thread::spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to(&[cpu]);
                }
                // SAFETY: the primary context retained above.
                assert_eq!(unsafe { set(ctx as *mut c_void) }, 0);
                let mut a = Vec::with_capacity(calls);
                let mut f = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let mut p = 0u64;
                    let t0 = timer.now();
                    // SAFETY: a valid out-pointer; the context is current on this thread.
                    let rc = unsafe { alloc(&mut p, SIZE) };
                    let t1 = timer.now();
                    // SAFETY: freeing what was just allocated.
                    let rc2 = unsafe { free(p) };
                    let t2 = timer.now();
                    assert_eq!((rc, rc2), (0, 0));
                    a.push((t1 - t0) as u32);
                    f.push((t2 - t1) as u32);
                }
                (a, f)
            })
        })
        .collect();
    let (mut a, mut f) = (Vec::new(), Vec::new());
    // Each thread's first call (under the shim it brings the thread's lane into memory).
    let mut firsts = Vec::new();
    for w in workers {
        let (x, y) = w.join().expect("worker");
        firsts.push(x.first().copied().unwrap_or(0));
        a.extend(x);
        f.extend(y);
    }
    firsts.sort_unstable();
    let (first_median, first) = (firsts[(firsts.len() - 1) / 2], firsts[firsts.len() - 1]);
    // The same pairs without per-call timers: CPU time per pair (threads × wall / pairs would
    // count time-slicing when threads outnumber free cores).
    let loops: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                // SAFETY: the primary context retained above.
                assert_eq!(unsafe { set(ctx as *mut c_void) }, 0);
                // One pair first: a thread's first event brings its lane into memory, a one-time
                // cost the timed run above reports (`first`), not a per-call one.
                let mut p = 0u64;
                // SAFETY: as below.
                assert_eq!(unsafe { alloc(&mut p, SIZE) + free(p) }, 0);
                let c0 = thread_cpu_ns();
                for _ in 0..calls {
                    let mut p = 0u64;
                    // SAFETY: as above.
                    let rc = unsafe { alloc(&mut p, SIZE) + free(p) };
                    assert_eq!(rc, 0);
                }
                thread_cpu_ns() - c0
            })
        })
        .collect();
    let cpu: u64 = loops.into_iter().map(|l| l.join().expect("loop")).sum();
    let pair_ns = cpu as f64 / (threads * calls) as f64;
    // Timer units per ns over the whole run (1 for the clock; the TSC's rate, measured).
    let per_ns = (timer.now() - start.1) as f64 / start.0.elapsed().as_nanos() as f64;
    let q = |v: &mut Vec<u32>, p: f64| {
        v.sort_unstable();
        f64::from(v[((v.len() as f64 - 1.0) * p) as usize]) / per_ns
    };
    println!(
        "alloc_p50={:.1} alloc_p99={:.1} free_p50={:.1} free_p99={:.1} pair_cpu={pair_ns:.1} first={:.0} first_median={:.0} timer={}",
        q(&mut a, 0.5),
        q(&mut a, 0.99),
        q(&mut f, 0.5),
        q(&mut f, 0.99),
        f64::from(first) / per_ns,
        f64::from(first_median) / per_ns,
        timer.name()
    );
}

/// The per-call timer: `lfence; rdtsc` (a few ns, no kernel clock code in the measured interval)
/// where the TSC is invariant, else `CLOCK_MONOTONIC`; `GPUFRAG_BENCH_TIMER=clock` forces the
/// latter. The same timer times the bare and the shimmed runs, so what it costs cancels in the
/// difference; a cheaper one spreads the distribution less (the H200 host's kvm-clock read is
/// 26–32 ns, with its own jitter).
#[derive(Clone, Copy)]
enum Timer {
    Tsc,
    Clock(Instant),
}

impl Timer {
    fn from_env() -> Timer {
        let clock = std::env::var("GPUFRAG_BENCH_TIMER").is_ok_and(|v| v == "clock");
        if !clock && gpufrag_wire::clock::invariant_tsc() {
            Timer::Tsc
        } else {
            Timer::Clock(Instant::now())
        }
    }

    /// Timer units: TSC ticks or ns.
    #[inline(always)]
    fn now(&self) -> u64 {
        match self {
            Timer::Tsc => gpufrag_wire::clock::ticks(),
            Timer::Clock(origin) => origin.elapsed().as_nanos() as u64,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Timer::Tsc => "tsc",
            Timer::Clock(_) => "clock",
        }
    }
}

/// The CPUs the parent chose for the worker threads (`GPUFRAG_BENCH_CPUS`), in order.
fn worker_cpus() -> Vec<usize> {
    std::env::var("GPUFRAG_BENCH_CPUS").ok().map(|v| v.split(',').filter_map(|c| c.parse().ok()).collect()).unwrap_or_default()
}

/// Binds the calling thread to `cpus`.
fn pin_to(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it; sched_setaffinity
    // reads it (pid 0: the calling thread).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Where the runs go: one logical CPU per physical core (never two workers, or a worker and the
/// consumer, on SMT siblings), the consumer on the last core, the workers on the others from
/// core 1 on (core 0 takes most device interrupts), wrapping around when there are more
/// workers than cores. None when the machine has fewer than 3 cores or the topology cannot be
/// read.
fn cpu_plan() -> Option<(usize, Vec<usize>)> {
    // SAFETY: a zeroed cpu_set_t, filled by sched_getaffinity for this thread.
    let allowed: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    };
    let mut cores: Vec<((String, String), usize)> = Vec::new();
    for &c in &allowed {
        let read =
            |f: &str| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{c}/topology/{f}")).ok().map(|s| s.trim().to_string());
        let key = (read("physical_package_id")?, read("core_id")?);
        if !cores.iter().any(|(k, _)| *k == key) {
            cores.push((key, c));
        }
    }
    let firsts: Vec<usize> = cores.into_iter().map(|(_, c)| c).collect();
    if firsts.len() < 3 {
        return None;
    }
    let consumer = *firsts.last()?;
    Some((consumer, firsts[1..firsts.len() - 1].to_vec()))
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Clone, Copy, Default, Debug)]
struct Figures {
    alloc_p50: f64,
    alloc_p99: f64,
    free_p50: f64,
    free_p99: f64,
    /// CPU time per alloc + free pair, without per-call timers.
    pair_cpu: f64,
    /// The slowest first call of a thread.
    first: f64,
    /// The median over threads of their first call.
    first_median: f64,
}

fn parse(line: &str) -> Figures {
    let get = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
    };
    Figures {
        alloc_p50: get("alloc_p50"),
        alloc_p99: get("alloc_p99"),
        free_p50: get("free_p50"),
        free_p99: get("free_p99"),
        pair_cpu: get("pair_cpu"),
        first: get("first"),
        first_median: get("first_median"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Compiles the fake driver into `dir/libcuda.so.1`; None without a C compiler.
fn build_fake(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("fake_cuda.c");
    std::fs::write(&src, FAKE_CUDA).ok()?;
    let status = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .status()
        .ok()?;
    status.success().then(|| dir.to_path_buf())
}

fn parent(calls: usize) {
    let exe = std::env::current_exe().expect("current_exe");
    // Builds (a no-op when fresh) and finds the shim and the stand-ins next to this binary.
    let artifacts = preload_common::artifacts();
    let (shim, simcuda) = (artifacts.shim.clone(), artifacts.libs.clone());
    // Knobs for exploring: the ring size and the consumer's polling period (0 = drain as fast
    // as events arrive).
    let knob = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok()).filter(|v| v.is_power_of_two()).unwrap_or(d);
    let ring = knob("GPUFRAG_BENCH_RING", RING);
    let lanes = knob("GPUFRAG_BENCH_LANES", LANES);
    let only = std::env::var("GPUFRAG_BENCH_DRIVERS").unwrap_or_default();
    if only.split(',').any(|d| d == "ring") {
        ring_alone();
        if only.split(',').all(|d| d == "ring") {
            return;
        }
    }
    let poll_us: u64 = std::env::var("GPUFRAG_BENCH_POLL_US").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let poll = (poll_us > 0).then(|| Duration::from_micros(poll_us));
    let state = TempDir::new("bench-state");
    let fake_dir = TempDir::new("bench-fake");
    let mut drivers = vec![("simcuda", simcuda)];
    match build_fake(fake_dir.path()) {
        Some(d) => drivers.push(("fake", d)),
        None => println!("(no C compiler: the lock-free fake driver is skipped)"),
    }
    let repeats = std::env::var("GPUFRAG_BENCH_REPEATS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&r| r > 0).unwrap_or(REPEATS);
    // Pinning: the parent (so the consumer threads it starts) on one core, the child's workers
    // each on a core of their own, the same CPUs for bare and shimmed runs.
    let plan = if std::env::var("GPUFRAG_BENCH_PIN").is_ok_and(|v| v == "0") { None } else { cpu_plan() };
    let pinning = match &plan {
        Some((consumer, workers)) => {
            pin_to(&[*consumer]);
            format!("workers pinned to CPUs {workers:?}, consumer to CPU {consumer}")
        }
        None => "not pinned".to_string(),
    };
    println!(
        "shim overhead per call: {SIZE}-byte cuMemAlloc_v2 + cuMemFree_v2 via dlsym, {calls} calls per thread (half with more threads); {repeats} rounds of a bare run then a shimmed one, added = median over rounds of (shim - bare) [least..most]; {lanes} lanes of {ring} events, drained every {poll_us} us; {pinning}"
    );
    println!(
        "{:>8} {:>7}  {:>5}  {:>9} {:>9} {:>20}  {:>9} {:>9} {:>20}",
        "driver", "threads", "call", "bare p50", "shim p50", "added", "bare p99", "shim p99", "added"
    );
    let thread_counts: Vec<usize> = std::env::var("GPUFRAG_BENCH_THREADS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).filter(|&t| t > 0).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 8]);
    let wanted = |d: &str| if only.is_empty() { d != "ring" } else { only.split(',').any(|o| o == d) };
    for (driver, libs) in drivers.iter().filter(|(d, _)| wanted(d)) {
        for &threads in &thread_counts {
            let per_thread = if threads == 1 { calls } else { calls / 2 };
            let mut bare = Vec::new();
            let mut shimmed = Vec::new();
            // Shimmed runs whose consumer prefaults no lane (each thread populates its own at
            // its first event, as before issue 15): only their first calls are reported.
            let mut unprefaulted = Vec::new();
            let (mut received, mut dropped) = (0u64, 0u64);
            for _ in 0..repeats {
                for (with_shim, prefault) in [(false, true), (true, false), (true, true)] {
                    let mut cmd = Command::new(&exe);
                    if let Some((_, workers)) = &plan {
                        cmd.env("GPUFRAG_BENCH_CPUS", workers.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
                    }
                    cmd.args([threads.to_string(), per_thread.to_string()])
                        .env("GPUFRAG_BENCH_CHILD", "1")
                        .env("LD_LIBRARY_PATH", libs)
                        .env("SIMCUDA_STATE_DIR", state.path())
                        .env_remove("LD_PRELOAD")
                        .env_remove("GPUFRAG_SOCK");
                    let consumer = with_shim.then(|| {
                        let n = Arc::new(AtomicU64::new(0));
                        let c = Arc::clone(&n);
                        let sink: preload_common::Sink = Box::new(move |_| {
                            c.fetch_add(1, Ordering::Relaxed);
                        });
                        preload_common::set_prefault_spare(if prefault { SPARE_LANES } else { 0 });
                        (Consumer::start_polling(Mode::Drain, Some(sink), poll), n)
                    });
                    if let Some((c, _)) = &consumer {
                        cmd.env("LD_PRELOAD", &shim)
                            .env("GPUFRAG_SOCK", c.sock())
                            .env("GPUFRAG_RING_CAPACITY", (ring * lanes).to_string())
                            .env("GPUFRAG_RING_LANES", lanes.to_string());
                    }
                    let out = cmd.output().expect("run the bench child");
                    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
                    let f = parse(String::from_utf8_lossy(&out.stdout).trim());
                    if let Some((c, n)) = consumer {
                        let traced = c.finish();
                        assert_eq!(traced.len(), 1, "the child connected");
                        received += n.load(Ordering::Relaxed);
                        dropped += traced[0].dropped;
                        if prefault {
                            shimmed.push(f);
                        } else {
                            unprefaulted.push(f);
                        }
                    } else {
                        bare.push(f);
                    }
                }
            }
            let m = |v: &[Figures], g: fn(&Figures) -> f64| median(v.iter().map(g).collect());
            type Get = fn(&Figures) -> f64;
            let rows: [(&str, Get, Get); 2] = [("alloc", |f| f.alloc_p50, |f| f.alloc_p99), ("free", |f| f.free_p50, |f| f.free_p99)];
            // Each round's difference, then their median and range: a drift of the machine
            // between rounds moves both runs of a round alike.
            let added = |g: Get| -> String {
                let d: Vec<f64> = bare.iter().zip(&shimmed).map(|(b, s)| g(s) - g(b)).collect();
                let (lo, hi) = d.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                format!("{:+.0} ns [{lo:+.0}..{hi:+.0}]", median(d))
            };
            for (call, p50, p99) in rows {
                let (b50, s50, b99, s99) = (m(&bare, p50), m(&shimmed, p50), m(&bare, p99), m(&shimmed, p99));
                println!(
                    "{driver:>8} {threads:>7}  {call:>5}  {b50:>6.0} ns {s50:>6.0} ns {:>20}  {b99:>6.0} ns {s99:>6.0} ns {:>20}",
                    added(p50),
                    added(p99)
                );
            }
            let (bp, sp) = (m(&bare, |f| f.pair_cpu), m(&shimmed, |f| f.pair_cpu));
            println!(
                "{driver:>8} {threads:>7}  {:>5}  {bp:>6.0} ns {sp:>6.0} ns {:>+5.0} ns  CPU per alloc+free pair without per-call timers ({:+.0} ns per call)",
                "pair",
                sp - bp,
                (sp - bp) / 2.0
            );
            println!("{:>18} events received {received}, dropped {dropped}", "");
            println!(
                "{:>18} a thread's first call, median over threads / worst (medians over rounds): bare {:.0} / {:.0} us; shim, lane populated by the thread {:.0} / {:.0} us; shim, lanes prefaulted by the consumer {:.0} / {:.0} us",
                "",
                m(&bare, |f| f.first_median) / 1000.0,
                m(&bare, |f| f.first) / 1000.0,
                m(&unprefaulted, |f| f.first_median) / 1000.0,
                m(&unprefaulted, |f| f.first) / 1000.0,
                m(&shimmed, |f| f.first_median) / 1000.0,
                m(&shimmed, |f| f.first) / 1000.0
            );
        }
    }
}

/// The lanes alone: push cost by threads sharing one ring or each on its own lane, and the
/// consumer's cost per event, from one ring (`pop`) or merged from the lanes (`Merge`).
fn ring_alone() {
    const PER: u64 = 100_000;
    // What a stamp costs here: the shim's `lfence; rdtsc` and the vDSO clock it replaced.
    let per_read = |f: &dyn Fn() -> u64| {
        const N: u64 = 5_000_000;
        let c0 = thread_cpu_ns();
        let mut x = 0u64;
        for _ in 0..N {
            x = x.wrapping_add(f());
        }
        std::hint::black_box(x);
        (thread_cpu_ns() - c0) as f64 / N as f64
    };
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__rdtscp, _rdtsc};
        // SAFETY: RDTSC and RDTSCP exist on every x86_64 CPU this runs on (the shim checks the
        // invariant-TSC bit before it relies on them; reading them is harmless either way).
        #[allow(unused_unsafe)]
        let (bare, p) = (per_read(&|| unsafe { _rdtsc() }), per_read(&|| unsafe { __rdtscp(&mut 0) }));
        println!(
            "one timestamp: lfence; rdtsc {:.1} ns (rdtsc alone {bare:.1}, rdtscp {p:.1}), clock_gettime(CLOCK_MONOTONIC) {:.1} ns",
            per_read(&gpufrag_wire::clock::ticks),
            per_read(&gpufrag_wire::clock::monotonic_ns)
        );
    }
    println!("event lanes alone (in process, no consumer running): ns per push, {PER} pushes per thread; ns per event drained");
    println!("{:>8} {:>12} {:>12} {:>14} {:>14} {:>14}", "threads", "one ring", "lane each", "lane, no CAS", "drain: pop", "drain: merge");
    for threads in [1u64, 2, 8] {
        let mut row = Vec::new();
        let mut drain = Vec::new();
        // One ring shared (compare-and-swap), a lane each (compare-and-swap, as a shared lane
        // pushes), a lane each pushed by its only producer (`push_exclusive`, what the shim's
        // first K/2 threads do).
        for (lanes, single) in [(1u32, false), (16, false), (16, true)] {
            let cap = (if lanes == 1 { PER * threads } else { PER }).next_power_of_two();
            let h = Arc::new(HeapLanes::new(lanes, cap));
            // A first lap touches every page, so that page faults are not measured.
            for t in 0..threads as u32 {
                for _ in 0..PER {
                    h.lanes().push(t, &Event::new(EventKind::MemAlloc, 1, 0));
                }
            }
            let _ = Merge::new(lanes as usize).finish(h.lanes(), |_| true);
            let barrier = Arc::new(std::sync::Barrier::new(threads as usize));
            let workers: Vec<_> = (0..threads as u32)
                .map(|t| {
                    let (h, barrier) = (Arc::clone(&h), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        barrier.wait();
                        let c0 = thread_cpu_ns();
                        let limit = std::cell::Cell::new(0);
                        for i in 0..PER {
                            let ev = Event { ts_ns: i, tid: t, ..Event::new(EventKind::MemAlloc, 1, 0) };
                            // SAFETY: with `single`, thread t is lane t's only producer.
                            let pushed = if single { unsafe { h.lanes().push_exclusive(t, &ev, &limit) } } else { h.lanes().push(t, &ev) };
                            assert!(pushed);
                        }
                        thread_cpu_ns() - c0
                    })
                })
                .collect();
            let cpu: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
            row.push(cpu as f64 / (threads * PER) as f64);
            let t0 = Instant::now();
            let n = if lanes == 1 {
                let mut n = 0u64;
                while h.lanes().lane(0).pop().is_some() {
                    n += 1;
                }
                n
            } else {
                let mut m = Merge::new(lanes as usize);
                let mut n = 0u64;
                loop {
                    match m.drain(h.lanes(), usize::MAX, false, |_| true) {
                        (0, _) => break,
                        (k, _) => n += k as u64,
                    }
                }
                n
            };
            assert_eq!(n, threads * PER);
            drain.push(t0.elapsed().as_nanos() as f64 / n as f64);
        }
        println!("{threads:>8} {:>9.1} ns {:>9.1} ns {:>11.1} ns {:>11.1} ns {:>11.1} ns", row[0], row[1], row[2], drain[0], drain[1]);
    }
}
