//! The two fragmentation scenarios: `frag-oom`, the H200 run of the PyTorch program `frag_oom.py` that recorded `tests/fixtures/frag_oom.pickle`
//! (memory stranded inside the caching allocator's segments makes a 2.5 GiB request fail while
//! more than that is free in total), and `small-pages` (sub-2 MiB allocations share 2 MiB pages,
//! so freeing every other 1 MiB allocation frees no page, and 2 MiB fails).

use simcuda_workload::{oom_message, AllocatorEvent, CachingAllocator, Device};

use crate::annotate;
use crate::{cuda_free, cuda_malloc, error_name, ffi, hex, init_runtime, mem_info, ok, result, Outcome};

const MIB: u64 = 1 << 20;

/// Segments come from cudaMalloc and go back through cudaFree.
struct Runtime;

impl Device for Runtime {
    fn malloc(&mut self, size: u64) -> Result<u64, i32> {
        cuda_malloc(size)
    }
    fn free(&mut self, addr: u64) -> Result<(), i32> {
        cuda_free(addr).map_err(|_| 1)
    }
}

/// Prints the allocator's events and tells a tracer through gpufrag's annotation API (a no-op
/// without the gpufrag shim).
fn announce(alloc: &mut CachingAllocator) {
    for e in alloc.events.drain(..) {
        match e {
            AllocatorEvent::SegmentAlloc { addr, size } => {
                annotate::segment(addr);
                println!("EVENT kind=segment_alloc addr={} size={size}", hex(addr))
            }
            AllocatorEvent::SegmentFree { addr, size } => println!("EVENT kind=segment_free addr={} size={size}", hex(addr)),
            AllocatorEvent::BlockAlloc { addr, size, requested } => {
                annotate::block_alloc(addr, size, requested);
                println!("EVENT kind=block_alloc addr={} size={size} requested={requested}", hex(addr))
            }
            AllocatorEvent::BlockFree { addr, size } => {
                annotate::block_free(addr);
                println!("EVENT kind=block_free addr={} size={size}", hex(addr))
            }
            AllocatorEvent::Oom { requested, segment_size, rc } => {
                println!("EVENT kind=oom requested={requested} segment_size={segment_size} rc={rc}")
            }
        }
    }
}

/// Initialises the runtime and takes all but `keep` bytes of the device's free memory with one
/// direct driver allocation (as frag_oom.py does), so the story plays out in `keep` bytes;
/// returns the device's total.
fn balloon_to(test: &str, keep: u64) -> Result<u64, String> {
    init_runtime()?;
    let (free, total) = mem_info()?;
    let balloon = free.saturating_sub(keep);
    if balloon > 0 {
        let mut p = 0;
        // SAFETY: valid out-pointer; a direct call into libcuda.so.1.
        let rc = unsafe { ffi::cuMemAlloc_v2(&mut p, balloon as usize) };
        result!("test" = test, "step" = "balloon", "size" = balloon, "addr" = hex(p), "rc" = rc);
        ok("cuMemAlloc_v2 (balloon)", rc)?;
    }
    Ok(total)
}

pub fn frag_oom(keep: u64) -> Outcome {
    let total = balloon_to("frag-oom", keep)?;
    let mut alloc = CachingAllocator::new();
    let mut dev = Runtime;
    let mut big = Vec::new();
    for _ in 0..20 {
        big.push(alloc.malloc(&mut dev, 500 * MIB).map_err(|e| format!("500 MiB block: {e:?}"))?);
        announce(&mut alloc);
    }
    for b in big.iter().step_by(2) {
        alloc.free(*b);
    }
    announce(&mut alloc);
    for _ in 0..10 {
        alloc.malloc(&mut dev, 300 * MIB).map_err(|e| format!("300 MiB block: {e:?}"))?;
        announce(&mut alloc);
    }
    let (free_now, _) = mem_info()?;
    let s = alloc.stats();
    result!(
        "test" = "frag-oom",
        "step" = "before_request",
        "device_free" = free_now,
        "reserved" = s.reserved,
        "allocated" = s.allocated,
        "stranded" = s.stranded,
        "releasable" = s.releasable,
        "largest_free_block" = s.largest_free_block,
        "segments" = s.segments,
    );
    let request = 5 * (1 << 29); // 2.5 GiB
    match alloc.malloc(&mut dev, request) {
        Ok(addr) => {
            announce(&mut alloc);
            Err(format!("the 2.5 GiB request succeeded at {}: no fragmentation OOM", hex(addr)))
        }
        Err(oom) => {
            announce(&mut alloc);
            let (free_at_oom, _) = mem_info()?;
            annotate::oom(oom.requested, free_at_oom);
            let s = alloc.stats();
            result!(
                "test" = "frag-oom",
                "step" = "oom",
                "requested" = oom.requested,
                "segment_size" = oom.segment_size,
                "rc" = oom.rc,
                "error" = error_name(oom.rc),
                "device_free" = free_at_oom,
                "total" = total,
                "reserved" = s.reserved,
                "allocated" = s.allocated,
                "stranded" = s.stranded,
                "releasable" = s.releasable,
                "largest_free_block" = s.largest_free_block,
                "num_alloc_retries" = s.num_alloc_retries,
                "num_ooms" = s.num_ooms,
            );
            println!("OOM_MESSAGE {}", oom_message(oom.requested, 0, total, free_at_oom, &s));
            Ok(())
        }
    }
}

/// `true-oom`: the caching allocator holds a few blocks and one cached segment, and asks for more
/// than the device has free plus its whole cache: releasing the cache and retrying fails too,
/// a true OOM (the verdict's other case, next to `frag-oom`).
pub fn true_oom(keep: u64) -> Outcome {
    let total = balloon_to("true-oom", keep)?;
    let mut alloc = CachingAllocator::new();
    let mut dev = Runtime;
    let mut blocks = Vec::new();
    for _ in 0..4 {
        blocks.push(alloc.malloc(&mut dev, 200 * MIB).map_err(|e| format!("200 MiB block: {e:?}"))?);
        announce(&mut alloc);
    }
    // One 200 MiB segment becomes cache (releasable), one block is split (stranded).
    alloc.free(blocks[0]);
    announce(&mut alloc);
    alloc.malloc(&mut dev, 3 * MIB).map_err(|e| format!("3 MiB block: {e:?}"))?;
    announce(&mut alloc);
    let request = 4u64 << 30;
    match alloc.malloc(&mut dev, request) {
        Ok(addr) => {
            announce(&mut alloc);
            Err(format!("the 4 GiB request succeeded at {}: no OOM", hex(addr)))
        }
        Err(oom) => {
            announce(&mut alloc);
            let (free_at_oom, _) = mem_info()?;
            annotate::oom(oom.requested, free_at_oom);
            let s = alloc.stats();
            result!(
                "test" = "true-oom",
                "step" = "oom",
                "requested" = oom.requested,
                "rc" = oom.rc,
                "device_free" = free_at_oom,
                "total" = total,
                "reserved" = s.reserved,
                "allocated" = s.allocated,
                "stranded" = s.stranded,
                "releasable" = s.releasable,
                "largest_free_block" = s.largest_free_block,
                "num_alloc_retries" = s.num_alloc_retries,
            );
            Ok(())
        }
    }
}

/// `small-pages fit`: as many 1 MiB allocations as fill the device's free memory to the last
/// whole 2 MiB page that the driver still grants (it keeps `SIMCUDA_SLACK` free), so the fill
/// itself never fails: the run's only OOM is the 2 MiB request of the story (the demo's).
pub fn small_pages_fit() -> Outcome {
    init_runtime()?;
    let slack = simcuda_core::config::Config::from_env()?.slack;
    let (free0, _) = mem_info()?;
    let pages = free0.saturating_sub(slack) / (2 * MIB);
    small_pages(Some(2 * pages))
}

/// `small-pages [N]`: N (default: until the device is full) 1 MiB allocations, two to a 2 MiB
/// page; every other one freed; a 2 MiB request then fails with half of every page free.
pub fn small_pages(n: Option<u64>) -> Outcome {
    init_runtime()?;
    let (free0, _) = mem_info()?;
    let mut ptrs = Vec::new();
    let mut fill_rc = 0;
    while n.is_none_or(|n| (ptrs.len() as u64) < n) {
        match cuda_malloc(MIB) {
            Ok(p) => ptrs.push(p),
            Err(rc) if n.is_none() => {
                fill_rc = rc;
                break;
            }
            Err(rc) => return Err(format!("1 MiB allocation #{} failed: {}", ptrs.len(), error_name(rc))),
        }
    }
    let (free_full, _) = mem_info()?;
    result!("test" = "small-pages", "step" = "fill", "allocated" = ptrs.len(), "stop_rc" = fill_rc, "device_free" = free_full);
    let mut freed = 0u64;
    for p in ptrs.iter().step_by(2) {
        cuda_free(*p)?;
        freed += 1;
    }
    let (free_half, _) = mem_info()?;
    result!("test" = "small-pages", "step" = "free_every_other", "freed" = freed, "freed_bytes" = freed * MIB, "device_free" = free_half,);
    let two = cuda_malloc(2 * MIB);
    result!("test" = "small-pages", "step" = "request", "size" = 2 * MIB, "rc" = two.err().unwrap_or(0));
    let one = cuda_malloc(MIB);
    result!("test" = "small-pages", "step" = "request", "size" = MIB, "rc" = one.err().unwrap_or(0));
    for p in [two.ok(), one.ok()].into_iter().flatten().chain(ptrs.iter().skip(1).step_by(2).copied()) {
        cuda_free(p)?;
    }
    let (free_end, _) = mem_info()?;
    result!("test" = "small-pages", "step" = "cleanup", "device_free" = free_end, "device_free_at_start" = free0);
    match two {
        Err(_) => Ok(()),
        Ok(p) => Err(format!("2 MiB succeeded at {} with every page half used", hex(p))),
    }
}
