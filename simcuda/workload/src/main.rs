//! `simcuda-workload`: a CUDA program for the simcuda stand-ins (it runs on a real GPU too), built
//! to be traced. It links `libcudart.so.13` and `libcuda.so.1` like any CUDA program. Each
//! subcommand prints machine-readable lines (`RESULT key=value ...`, and `EVENT`, `OP`, `CHECK`,
//! `PROCESS` where said) and exits 0 when the outcome is the expected one, 1 when it is not, 2 on
//! a usage error. `main` only dispatches; the scenarios live in one module per theme.

mod annotate;
mod ffi;
mod frag;
mod nvml;
mod pools;
mod procs;
mod routes;
mod vmm;

use std::ffi::{c_void, CStr};
use std::process::ExitCode;

const USAGE: &str = "usage: simcuda-workload COMMAND [ARGS]
  frag-oom [KEEP]        balloon all but KEEP (default 12GiB), strand memory in a caching allocator, OOM at 2.5 GiB
  true-oom [KEEP]        balloon all but KEEP (default 1GiB), cache and strand a little, then 4 GiB fails for good
  small-pages [N|fit]    N x 1 MiB (default: until full; fit: as many as fit without a failure),
                         free every other, then 2 MiB fails
  threads N CALLS        N threads x CALLS cudaMalloc/cudaFree pairs of varied sizes
  vmm                    grow and shrink a reserved range (expandable segments), bad arguments
  async                  stream-ordered pools: alloc, free, reuse, trim, release threshold, driver forms
  fork-exec              allocate, fork, child allocates then execs `basic 16MiB`
  basic [SIZE]           one cudaMalloc (default 1MiB) and cudaFree
  hold SIZE              cudaMalloc SIZE, print READY, keep it until stdin closes
  routes [ROUTE...]      each driver entry-point route (default all): direct dlsym getproc getproc-v1
                         entrypoint entrypoint-noversion ptsz getproc-ptsz runtime
  pairs N [SIZE]         time N cuMemAlloc_v2/cuMemFree_v2 pairs of SIZE (default 2MiB), direct calls
  procaddr               cuGetProcAddress(_v2) and cudaGetDriverEntryPointByVersion against dlsym
  nvml                   NVML devices, memory and compute processes (dlopen libnvidia-ml.so.1)";

/// A scenario's outcome: Ok when it went as expected; Err(message) otherwise.
pub type Outcome = Result<(), String>;

/// Prints a `RESULT` line from `key=value` pairs.
#[macro_export]
macro_rules! result {
    ($($k:literal = $v:expr),* $(,)?) => {{
        let mut line = String::from("RESULT");
        $( line.push_str(&format!(" {}={}", $k, $v)); )*
        println!("{line}");
    }};
}

/// A device address as the workload prints it.
pub fn hex(addr: u64) -> String {
    format!("{addr:#x}")
}

/// The name of a runtime error code.
pub fn error_name(rc: ffi::cudaError_t) -> String {
    // SAFETY: cudaGetErrorName returns a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(ffi::cudaGetErrorName(rc)) }.to_string_lossy().into_owned()
}

/// Turns a CUDA result into an error naming the call.
pub fn ok(call: &str, rc: i32) -> Outcome {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed: {rc} ({})", error_name(rc)))
    }
}

/// `cudaMemGetInfo`: (free, total).
pub fn mem_info() -> Result<(u64, u64), String> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    ok("cudaMemGetInfo", unsafe { ffi::cudaMemGetInfo(&mut free, &mut total) })?;
    Ok((free as u64, total as u64))
}

/// `cudaMalloc`: the pointer, or the error code.
pub fn cuda_malloc(size: u64) -> Result<u64, i32> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    match unsafe { ffi::cudaMalloc(&mut p, size as usize) } {
        0 => Ok(p as u64),
        rc => Err(rc),
    }
}

/// `cudaFree`.
pub fn cuda_free(addr: u64) -> Outcome {
    // SAFETY: freeing a pointer the runtime handed out (the stand-in checks it anyway).
    ok("cudaFree", unsafe { ffi::cudaFree(addr as *mut c_void) })
}

/// Initialises the runtime and makes the primary context current (`cudaFree(0)`).
pub fn init_runtime() -> Outcome {
    // SAFETY: freeing null is the documented way to initialise the runtime.
    ok("cudaFree(NULL)", unsafe { ffi::cudaFree(std::ptr::null_mut()) })
}

fn size_arg(arg: Option<&String>, default: u64) -> Result<u64, String> {
    arg.map_or(Ok(default), |s| simcuda_core::parse_size(s).map_err(|e| format!("bad size {s:?}: {e}")))
}

fn count_arg(arg: Option<&String>, what: &str) -> Result<u64, String> {
    let s = arg.ok_or_else(|| format!("missing {what}"))?;
    s.parse().map_err(|_| format!("bad {what} {s:?}"))
}

fn run(args: &[String]) -> Result<Outcome, String> {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    let rest = &args[args.len().min(1)..];
    Ok(match cmd {
        "frag-oom" => frag::frag_oom(size_arg(rest.first(), 12 << 30)?),
        "true-oom" => frag::true_oom(size_arg(rest.first(), 1 << 30)?),
        "small-pages" if rest.first().is_some_and(|a| a == "fit") => frag::small_pages_fit(),
        "small-pages" => frag::small_pages(rest.first().map(|_| count_arg(rest.first(), "N")).transpose()?),
        "threads" => procs::threads(count_arg(rest.first(), "N")?, count_arg(rest.get(1), "CALLS")?),
        "vmm" => vmm::vmm(),
        "async" => pools::pools(),
        "fork-exec" => procs::fork_exec(),
        "basic" => procs::basic(size_arg(rest.first(), 1 << 20)?),
        "hold" => procs::hold(size_arg(rest.first(), 1 << 20)?),
        "ipc-export" => procs::ipc_export(size_arg(rest.first(), 64 << 20)?),
        "routes" => routes::routes(rest),
        "procaddr" => routes::procaddr(),
        "pairs" => procs::pairs(count_arg(rest.first(), "N")?, size_arg(rest.get(1), 2 << 20)?),
        "nvml" => nvml::nvml(),
        _ => return Err(format!("unknown command {cmd:?}")),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(unexpected)) => {
            eprintln!("simcuda-workload: {unexpected}");
            ExitCode::from(1)
        }
        Err(usage) => {
            eprintln!("simcuda-workload: {usage}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
