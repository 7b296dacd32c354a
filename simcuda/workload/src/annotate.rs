//! Tells a tracer what the workload's caching allocator does, through gpufrag's framework
//! annotation API (`include/gpufrag_annotate.h`): functions the gpufrag LD_PRELOAD shim exports,
//! found with `dlsym(RTLD_DEFAULT, ...)` once, so the workload runs unchanged without the shim.

use std::ffi::CStr;
use std::sync::OnceLock;

type SegmentFn = unsafe extern "C" fn(u64, i32);
type BlockAllocFn = unsafe extern "C" fn(u64, u64, u64, i32);
type BlockFreeFn = unsafe extern "C" fn(u64, i32);
type OomFn = unsafe extern "C" fn(u64, u64, i32);

struct Api {
    segment: Option<SegmentFn>,
    block_alloc: Option<BlockAllocFn>,
    block_free: Option<BlockFreeFn>,
    oom: Option<OomFn>,
}

fn lookup(name: &CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name; a null result means absent.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let p = |n: &CStr| {
            let f = lookup(n);
            (!f.is_null()).then_some(f)
        };
        // SAFETY: each symbol, when the shim exports it, has the C signature of gpufrag_annotate.h.
        unsafe {
            Api {
                segment: p(c"gpufrag_annotate_segment").map(|f| std::mem::transmute::<*mut libc::c_void, SegmentFn>(f)),
                block_alloc: p(c"gpufrag_annotate_block_alloc").map(|f| std::mem::transmute::<*mut libc::c_void, BlockAllocFn>(f)),
                block_free: p(c"gpufrag_annotate_block_free").map(|f| std::mem::transmute::<*mut libc::c_void, BlockFreeFn>(f)),
                oom: p(c"gpufrag_annotate_oom").map(|f| std::mem::transmute::<*mut libc::c_void, OomFn>(f)),
            }
        }
    })
}

/// The allocator owns the segment at `addr`.
pub fn segment(addr: u64) {
    if let Some(f) = api().segment {
        // SAFETY: the shim's exported function, called with its C signature.
        unsafe { f(addr, 0) }
    }
}

/// A block was handed out.
pub fn block_alloc(addr: u64, size: u64, requested: u64) {
    if let Some(f) = api().block_alloc {
        // SAFETY: as above.
        unsafe { f(addr, size, requested, 0) }
    }
}

/// A block went back to the cache.
pub fn block_free(addr: u64) {
    if let Some(f) = api().block_free {
        // SAFETY: as above.
        unsafe { f(addr, 0) }
    }
}

/// A request failed for good.
pub fn oom(requested: u64, device_free: u64) {
    if let Some(f) = api().oom {
        // SAFETY: as above.
        unsafe { f(requested, device_free, 0) }
    }
}
