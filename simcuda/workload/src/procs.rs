//! Scenarios about processes and threads: `basic` (one allocation), `hold` (keep an allocation
//! while another process looks, until stdin closes), `threads` (concurrent allocation), and
//! `fork-exec` (a child that allocates, then replaces itself with `basic`), and `pairs` (the cost
//! of a bare `cuMemAlloc_v2`/`cuMemFree_v2` pair, the baseline a tracer's overhead is measured
//! against).

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;

use crate::{cuda_free, cuda_malloc, error_name, ffi, hex, init_runtime, mem_info, ok, result, Outcome};

const MIB: u64 = 1 << 20;

pub fn basic(size: u64) -> Outcome {
    let addr = cuda_malloc(size).map_err(|rc| format!("cudaMalloc({size}): {}", error_name(rc)))?;
    let (free, _) = mem_info()?;
    let free_rc = match cuda_free(addr) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    result!(
        "test" = "basic",
        "pid" = std::process::id(),
        "size" = size,
        "addr" = hex(addr),
        "rc" = 0,
        "device_free" = free,
        "free_rc" = free_rc,
    );
    if free_rc == 0 {
        Ok(())
    } else {
        Err("cudaFree failed".to_string())
    }
}

pub fn hold(size: u64) -> Outcome {
    let addr = cuda_malloc(size).map_err(|rc| format!("cudaMalloc({size}): {}", error_name(rc)))?;
    println!("READY pid={} addr={} size={size}", std::process::id(), hex(addr));
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    cuda_free(addr)?;
    result!("test" = "hold", "pid" = std::process::id(), "size" = size, "freed" = 1);
    Ok(())
}

/// Sizes the threads cycle through: sub-page, page-sharing, exactly one page, and multi-page.
const THREAD_SIZES: [u64; 7] = [512, 3000, 64 << 10, MIB, 2 * MIB, 3 * MIB + 7, 10 * MIB];

pub fn threads(n: u64, calls: u64) -> Outcome {
    init_runtime()?;
    let (free_before, _) = mem_info()?;
    let workers: Vec<_> = (0..n)
        .map(|t| {
            std::thread::spawn(move || {
                let mut failed = 0u64;
                for k in 0..calls {
                    let size = THREAD_SIZES[((t + k) % THREAD_SIZES.len() as u64) as usize];
                    match cuda_malloc(size) {
                        Ok(p) => failed += u64::from(cuda_free(p).is_err()),
                        Err(_) => failed += 1,
                    }
                }
                failed
            })
        })
        .collect();
    let failed: u64 = workers.into_iter().map(|w| w.join().unwrap_or(u64::MAX)).sum();
    let (free_after, _) = mem_info()?;
    result!(
        "test" = "threads",
        "threads" = n,
        "calls" = calls,
        "ok" = n * calls - failed.min(n * calls),
        "failed" = failed,
        "device_free_before" = free_before,
        "device_free_after" = free_after,
    );
    if failed == 0 && free_after == free_before {
        Ok(())
    } else {
        Err(format!("{failed} failed calls; device free {free_before} -> {free_after}"))
    }
}

pub fn fork_exec() -> Outcome {
    let parent_block = cuda_malloc(64 * MIB).map_err(|rc| format!("parent cudaMalloc: {}", error_name(rc)))?;
    let (free_parent, _) = mem_info()?;
    result!(
        "test" = "fork-exec",
        "role" = "parent",
        "step" = "alloc",
        "pid" = std::process::id(),
        "addr" = hex(parent_block),
        "device_free" = free_parent,
    );
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let exe = CString::new(exe.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let _ = std::io::stdout().flush();
    // SAFETY: fork in a process whose other threads (none here) hold no lock the child needs;
    // the child only allocates, prints and execs.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        let child = cuda_malloc(32 * MIB);
        let free_child = mem_info().map(|(f, _)| f).unwrap_or(0);
        result!(
            "test" = "fork-exec",
            "role" = "child",
            "step" = "alloc",
            "pid" = std::process::id(),
            "rc" = child.err().unwrap_or(0),
            "addr" = hex(child.unwrap_or(0)),
            "device_free" = free_child,
        );
        let _ = std::io::stdout().flush();
        let argv = [exe.as_ptr(), c"basic".as_ptr(), c"16MiB".as_ptr(), std::ptr::null()];
        // SAFETY: a NUL-terminated path and a null-terminated argv of NUL-terminated strings.
        unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
        eprintln!("execv: {}", std::io::Error::last_os_error());
        // SAFETY: leaving the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(127) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    let (free_after, _) = mem_info()?;
    result!("test" = "fork-exec", "role" = "parent", "step" = "wait", "child_pid" = pid, "child_exit" = code, "device_free" = free_after,);
    cuda_free(parent_block)?;
    if code == 0 && free_after == free_parent {
        Ok(())
    } else {
        Err(format!("child exit {code}; device free {free_parent} before, {free_after} after the child"))
    }
}

pub fn pairs(n: u64, size: u64) -> Outcome {
    init_runtime()?;
    let start = std::time::Instant::now();
    for _ in 0..n {
        let mut p = 0;
        // SAFETY: a valid out-pointer, then freeing what was returned; direct calls into libcuda.so.1.
        unsafe {
            ok("cuMemAlloc_v2", ffi::cuMemAlloc_v2(&mut p, size as usize))?;
            ok("cuMemFree_v2", ffi::cuMemFree_v2(p))?;
        }
    }
    let ns = start.elapsed().as_nanos() as u64;
    result!("test" = "pairs", "calls" = n, "size" = size, "ns_total" = ns, "ns_per_pair" = ns / n.max(1));
    Ok(())
}

/// `ipc-export`: a caching allocator's segment exported over legacy CUDA IPC (as a program that
/// shares a tensor's memory with `cudaIpcGetMemHandle` does), then the export of a VMM mapping,
/// which the driver refuses.
pub fn ipc_export(size: u64) -> Outcome {
    let mut alloc = simcuda_workload::CachingAllocator::new();
    struct Rt;
    impl simcuda_workload::Device for Rt {
        fn malloc(&mut self, size: u64) -> Result<u64, i32> {
            cuda_malloc(size)
        }
        fn free(&mut self, addr: u64) -> Result<(), i32> {
            cuda_free(addr).map_err(|_| 1)
        }
    }
    init_runtime()?;
    let block = alloc.malloc(&mut Rt, size).map_err(|e| format!("block: {e:?}"))?;
    announce_requested(&mut alloc);
    let mut h = [0u8; 64];
    // SAFETY: a 64-byte out-pointer and a device address; a direct call into libcuda.so.1.
    let rc = unsafe { crate::ffi::cuIpcGetMemHandle(&mut h, block) };
    result!("test" = "ipc-export", "addr" = hex(block), "rc" = rc);
    crate::ok("cuIpcGetMemHandle", rc)?;
    // SAFETY: as above, of an address no allocation holds.
    let bad = unsafe { crate::ffi::cuIpcGetMemHandle(&mut h, 0x10) };
    result!("test" = "ipc-export", "addr" = hex(0x10), "rc" = bad);
    alloc.free(block);
    announce_requested(&mut alloc);
    Ok(())
}

/// Announces the allocator's segments and blocks as PyTorch's probes do (a block's requested size
/// only, not its extent), so that whatif can replay the record.
fn announce_requested(alloc: &mut simcuda_workload::CachingAllocator) {
    use simcuda_workload::AllocatorEvent;
    for e in alloc.events.drain(..) {
        match e {
            AllocatorEvent::SegmentAlloc { addr, .. } => crate::annotate::segment(addr),
            AllocatorEvent::BlockAlloc { addr, requested, .. } => crate::annotate::block_alloc(addr, 0, requested),
            AllocatorEvent::BlockFree { addr, .. } => crate::annotate::block_free(addr),
            AllocatorEvent::SegmentFree { .. } | AllocatorEvent::Oom { .. } => {}
        }
    }
}
