//! simcuda's stand-in CUDA driver, built as `libcuda.so` with SONAME `libcuda.so.1`: the driver
//! memory API under its real exported names and C signatures (`api`), `cuGetProcAddress` resolving
//! base names to those same functions the way the real driver does (`procaddr`), over a simulated
//! device (`model`) whose physical memory is shared with other processes through the state file
//! of `simcuda_core::state`.
//!
//! This module owns the process-wide state: the configuration, the state file mapping, the model
//! behind one mutex (the stand-in may lock; the shim it serves must not), the primary contexts
//! and each thread's current context. After `fork` the child gets a fresh model: it holds none of
//! its parent's memory but can allocate at once (the real driver refuses CUDA in a forked child;
//! the stand-in is lenient so that fork can be traced). At `exec` or exit the process's slots in
//! the state file are freed (at exit by a `.fini_array` hook, after `exec` by the next `cuInit`,
//! and in every case by whoever reaps dead processes).

#![allow(clippy::missing_safety_doc)]

mod api;
mod model;
mod pool;
mod procaddr;
mod small;
mod va;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use simcuda_core::ffi::*;
use simcuda_core::state::{self, SharedState};
use simcuda_core::{Config, MAX_DOMAINS};

use model::Model;

static CONFIG: OnceLock<std::result::Result<Config, String>> = OnceLock::new();
static SHARED: OnceLock<SharedState> = OnceLock::new();
static MODEL: AtomicPtr<Mutex<Model>> = AtomicPtr::new(std::ptr::null_mut());
static INIT_LOCK: Mutex<()> = Mutex::new(());
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// `SIMCUDA_TRACE=1`: every call is printed on stderr with its result.
static TRACE: AtomicBool = AtomicBool::new(false);
static PRIMARY_REFS: [AtomicU32; MAX_DOMAINS as usize] = [const { AtomicU32::new(0) }; MAX_DOMAINS as usize];

/// The primary contexts: a CUcontext is the address of one of these bytes.
static CONTEXTS: [u8; MAX_DOMAINS as usize] = [0; MAX_DOMAINS as usize];

thread_local! {
    /// The calling thread's current context: 0 = none, else device + 1.
    static CURRENT: Cell<u32> = const { Cell::new(0) };
}

type Result<T> = std::result::Result<T, CUresult>;

fn config() -> Result<&'static Config> {
    match CONFIG.get() {
        Some(Ok(c)) => Ok(c),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// cuInit: reads the configuration, maps the state file, builds the model (once per process).
fn init() -> Result<()> {
    let cfg = match CONFIG.get_or_init(Config::from_env) {
        Ok(c) => c,
        Err(e) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!("simcuda: {e}");
            }
            return Err(CUDA_ERROR_NO_DEVICE);
        }
    };
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if MODEL.load(Ordering::Acquire).is_null() {
        TRACE.store(std::env::var_os("SIMCUDA_TRACE").is_some_and(|v| v != "0"), Ordering::Relaxed);
        let shared = SHARED.get_or_init(|| {
            SharedState::open(&cfg.state_dir).unwrap_or_else(|e| {
                eprintln!("simcuda: cannot use {}: {e}; device memory is not shared with other processes", cfg.state_dir.display());
                SharedState::anonymous()
            })
        });
        let (pid, start_time) = (std::process::id(), state::own_start_time());
        // Whatever an earlier image of this process (before exec) held is gone, as on a real GPU.
        shared.release_process(pid, start_time);
        let model = Box::leak(Box::new(Mutex::new(Model::new(cfg, shared, pid, start_time))));
        MODEL.store(model, Ordering::Release);
        // SAFETY: registering a plain function with no preconditions as the fork child handler.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// CUDA_ERROR_NOT_INITIALIZED until cuInit has succeeded.
fn initialized() -> Result<()> {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_INITIALIZED)
    }
}

fn model() -> Result<MutexGuard<'static, Model>> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let p = MODEL.load(Ordering::Acquire);
    // SAFETY: MODEL, once set, points to a leaked Mutex that is never freed.
    let m = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
    Ok(m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The fork child starts with a fresh model: no memory, no slots, same contexts.
extern "C" fn after_fork_in_child() {
    let (Ok(cfg), Some(shared)) = (config(), SHARED.get()) else {
        return;
    };
    let fresh = Model::new(cfg, shared, std::process::id(), state::own_start_time());
    // The old model (whose lock another thread of the parent may have held) is leaked.
    MODEL.store(Box::leak(Box::new(Mutex::new(fresh))), Ordering::Release);
}

/// At exit (and dlclose): free this process's slots in the state file.
extern "C" fn on_unload() {
    let p = MODEL.load(Ordering::Acquire);
    // SAFETY: MODEL, once set, points to a leaked Mutex that is never freed.
    if let Some(m) = unsafe { p.as_ref() } {
        if let Ok(mut m) = m.try_lock() {
            m.release_slots();
        }
    }
}

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

/// The physical device behind CUDA ordinal `dev` (`CUDA_VISIBLE_DEVICES` remaps ordinals: with
/// `CUDA_VISIBLE_DEVICES=2` ordinal 0 is physical device 2): a memory domain, a GPU or a MIG
/// instance (`simcuda_core::mig`). Everything below the API works on domains; what the API hands
/// back (`cuCtxGetDevice`) is the ordinal again.
fn check_device(dev: CUdevice) -> Result<u32> {
    let cfg = config()?;
    usize::try_from(dev).ok().and_then(|d| cfg.visible.get(d).copied()).ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// The ordinal under which physical device `physical` is visible.
fn ordinal_of(physical: u32) -> Result<CUdevice> {
    let cfg = config()?;
    cfg.visible.iter().position(|&p| p == physical).map(|o| o as CUdevice).ok_or(CUDA_ERROR_INVALID_DEVICE)
}

fn context_of(dev: u32) -> CUcontext {
    std::ptr::addr_of!(CONTEXTS[dev as usize]) as CUcontext
}

fn device_of_context(ctx: CUcontext) -> Option<u32> {
    let base = CONTEXTS.as_ptr() as usize;
    let off = (ctx as usize).checked_sub(base)?;
    (off < CONTEXTS.len()).then_some(off as u32)
}

/// The device of the calling thread's current context.
fn current_device() -> Result<u32> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    match CURRENT.with(Cell::get) {
        0 => Err(CUDA_ERROR_INVALID_CONTEXT),
        d => Ok(d - 1),
    }
}

/// Runs an exported function's body: no panic crosses the C boundary, and with `SIMCUDA_TRACE`
/// the call is printed. `name` also keeps every export's machine code distinct, so that no two
/// exported symbols are ever merged into one address.
#[inline(always)]
fn entry(name: &'static str, body: impl FnOnce() -> Result<()>) -> CUresult {
    let rc = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("simcuda: internal error (panic) in {name}");
            CUDA_ERROR_UNKNOWN
        }
    };
    if TRACE.load(Ordering::Relaxed) {
        eprintln!("simcuda: {name} -> {rc}");
    }
    rc
}

/// Writes an out-parameter; a null pointer is CUDA_ERROR_INVALID_VALUE.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid per the caller's contract (the C API's).
    unsafe { p.write(v) };
    Ok(())
}
