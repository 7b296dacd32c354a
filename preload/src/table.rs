//! The names the shim tracks, one per ABI (`cuMemAlloc_v2`, `cuMemAllocAsync_ptsz`, ...), each
//! with the slot that holds the real function and the wrapper handed out in its place.
//!
//! A slot is filled from whichever route first yields the real function: a lookup route
//! (`dlsym`/`dlvsym` on a library handle, `cuGetProcAddress`, `cudaGetDriverEntryPoint`) stores
//! what the real lookup returned; a wrapper reached by direct linking finds it lazily with the
//! real `dlsym(RTLD_NEXT, name)` and, failing that, in the dynamic symbol table of any loaded
//! object but the shim (a library loaded `RTLD_LOCAL` is not in the global scope).
//!
//! Legacy ABIs (v1 `cuMemAlloc` with 32-bit pointers, v1 `cuMemGetInfo`, ...) have no entry: the
//! shim does not export them and never swaps them, so they always pass through untouched.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{dl, driver, elf, route, runtime};

macro_rules! syms {
    ($($variant:ident = $name:literal => $wrapper:path),* $(,)?) => {
        /// One tracked ABI.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Sym { $($variant),* }

        /// Number of tracked ABIs.
        pub const COUNT: usize = [$(Sym::$variant),*].len();

        /// Every tracked ABI, in table order.
        pub const ALL: [Sym; COUNT] = [$(Sym::$variant),*];

        const NAMES: [&CStr; COUNT] = [$($name),*];

        /// The shim's wrapper for `s`, as an address.
        pub fn wrapper(s: Sym) -> usize {
            match s { $(Sym::$variant => $wrapper as *const () as usize),* }
        }
    };
}

syms! {
    // driver: plain allocations
    CuMemAllocV2 = c"cuMemAlloc_v2" => driver::cuMemAlloc_v2,
    CuMemAllocPitchV2 = c"cuMemAllocPitch_v2" => driver::cuMemAllocPitch_v2,
    CuMemAllocManaged = c"cuMemAllocManaged" => driver::cuMemAllocManaged,
    CuMemFreeV2 = c"cuMemFree_v2" => driver::cuMemFree_v2,
    CuMemGetInfoV2 = c"cuMemGetInfo_v2" => driver::cuMemGetInfo_v2,
    CuIpcGetMemHandle = c"cuIpcGetMemHandle" => driver::cuIpcGetMemHandle,
    // driver: virtual memory management
    CuMemAddressReserve = c"cuMemAddressReserve" => driver::cuMemAddressReserve,
    CuMemAddressFree = c"cuMemAddressFree" => driver::cuMemAddressFree,
    CuMemCreate = c"cuMemCreate" => driver::cuMemCreate,
    CuMemRelease = c"cuMemRelease" => driver::cuMemRelease,
    CuMemMap = c"cuMemMap" => driver::cuMemMap,
    CuMemUnmap = c"cuMemUnmap" => driver::cuMemUnmap,
    // driver: stream-ordered pools
    CuMemAllocAsync = c"cuMemAllocAsync" => driver::cuMemAllocAsync,
    CuMemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" => driver::cuMemAllocAsync_ptsz,
    CuMemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" => driver::cuMemAllocFromPoolAsync,
    CuMemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz" => driver::cuMemAllocFromPoolAsync_ptsz,
    CuMemFreeAsync = c"cuMemFreeAsync" => driver::cuMemFreeAsync,
    CuMemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" => driver::cuMemFreeAsync_ptsz,
    CuMemPoolTrimTo = c"cuMemPoolTrimTo" => driver::cuMemPoolTrimTo,
    CuMemPoolGetAttribute = c"cuMemPoolGetAttribute" => driver::cuMemPoolGetAttribute,
    // driver: routes
    CuGetProcAddress = c"cuGetProcAddress" => route::cuGetProcAddress,
    CuGetProcAddressV2 = c"cuGetProcAddress_v2" => route::cuGetProcAddress_v2,
    // runtime
    CudaMalloc = c"cudaMalloc" => runtime::cudaMalloc,
    CudaMallocPitch = c"cudaMallocPitch" => runtime::cudaMallocPitch,
    CudaMalloc3D = c"cudaMalloc3D" => runtime::cudaMalloc3D,
    CudaMallocManaged = c"cudaMallocManaged" => runtime::cudaMallocManaged,
    CudaMallocAsync = c"cudaMallocAsync" => runtime::cudaMallocAsync,
    CudaMallocAsyncPtsz = c"cudaMallocAsync_ptsz" => runtime::cudaMallocAsync_ptsz,
    CudaMallocFromPoolAsync = c"cudaMallocFromPoolAsync" => runtime::cudaMallocFromPoolAsync,
    CudaMallocFromPoolAsyncPtsz = c"cudaMallocFromPoolAsync_ptsz" => runtime::cudaMallocFromPoolAsync_ptsz,
    CudaFree = c"cudaFree" => runtime::cudaFree,
    CudaFreeAsync = c"cudaFreeAsync" => runtime::cudaFreeAsync,
    CudaFreeAsyncPtsz = c"cudaFreeAsync_ptsz" => runtime::cudaFreeAsync_ptsz,
    CudaMemPoolTrimTo = c"cudaMemPoolTrimTo" => runtime::cudaMemPoolTrimTo,
    CudaMemGetInfo = c"cudaMemGetInfo" => runtime::cudaMemGetInfo,
    CudaIpcGetMemHandle = c"cudaIpcGetMemHandle" => runtime::cudaIpcGetMemHandle,
    CudaGetDriverEntryPoint = c"cudaGetDriverEntryPoint" => route::cudaGetDriverEntryPoint,
    CudaGetDriverEntryPointByVersion = c"cudaGetDriverEntryPointByVersion" => route::cudaGetDriverEntryPointByVersion,
    // the loader itself: a program that fetches dlsym through dlsym gets ours
    Dlsym = c"dlsym" => dl::dlsym,
    Dlvsym = c"dlvsym" => dl::dlvsym,
}

/// The real functions, by [`Sym`]; 0 = not found yet.
static SLOTS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

impl Sym {
    /// The exported name of this ABI.
    pub fn name(self) -> &'static CStr {
        NAMES[self as usize]
    }

    /// The tracked ABI called exactly `name`.
    pub fn by_name(name: &[u8]) -> Option<Sym> {
        // Quick reject: every tracked name starts with "cu" or "dl".
        if name.len() < 5 || !(name.starts_with(b"cu") || name.starts_with(b"dl")) {
            return None;
        }
        ALL.into_iter().find(|s| s.name().to_bytes() == name)
    }

    /// The tracked ABI whose wrapper is at `addr`.
    pub fn by_wrapper(addr: usize) -> Option<Sym> {
        ALL.into_iter().find(|&s| wrapper(s) == addr)
    }
}

/// Records `real` as the real function behind `s`, unless it is our own wrapper (a lookup that
/// found the shim's export must never become the target of that export: it would recurse).
pub fn store(s: Sym, real: usize) -> bool {
    if real == 0 || Sym::by_wrapper(real).is_some() {
        return false;
    }
    SLOTS[s as usize].store(real, Ordering::Relaxed);
    true
}

/// The real function behind `s`, resolved on first use; 0 when no loaded object defines it.
#[inline]
pub fn real(s: Sym) -> usize {
    let p = SLOTS[s as usize].load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    resolve(s)
}

#[cold]
#[inline(never)]
fn resolve(s: Sym) -> usize {
    let found = find_real(s.name());
    if store(s, found) {
        found
    } else {
        0
    }
}

/// Finds the definition of `name` that the shim's export of it hides: the next one in the global
/// scope, else the first in any loaded object but the shim. Used for tracked names and for the
/// helpers the shim calls itself (`cuCtxGetDevice`, `cuDeviceGetMemPool`).
pub fn find_real(name: &CStr) -> usize {
    // SAFETY: RTLD_NEXT from the shim's own code: the definition after the shim in the global
    // scope, which is what a direct-linked caller would have reached without the shim.
    let next = unsafe { dl::real_dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if next != 0 && Sym::by_wrapper(next).is_none() {
        return next;
    }
    elf::find_in_loaded_objects(name.to_bytes(), elf::Skip::Shim).unwrap_or(0)
}

/// Typed view of a slot: `f` must be the C type of `s`'s function.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type matching the C signature of `s`.
pub unsafe fn real_fn<F: Copy>(s: Sym) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
    let p = real(s);
    // SAFETY: p is a non-null address of the real function of `s`, whose type F is per the
    // caller's contract; fn pointers and usize have the same size (checked above).
    (p != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

/// What a pointer returned by a lookup route is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// One of the shim's own wrappers (already swapped by an inner route): leave it.
    Ours,
    /// The real function of a tracked ABI: store it, hand out the wrapper.
    Tracked(Sym),
    /// Anything else (untracked names, legacy ABIs): pass through.
    Other,
}

/// The suffixes that name an ABI version or a per-thread stream variant, stripped to compare
/// a function's exported name with the base name a caller asked `cuGetProcAddress` for.
const SUFFIXES: [&[u8]; 5] = [b"_ptsz", b"_ptds", b"_v2", b"_v3", b"_v4"];

/// `cuMemAlloc_v2` → `cuMemAlloc`, `cuMemsetD8_v2_ptds` → `cuMemsetD8`.
pub fn base_name(mut name: &[u8]) -> &[u8] {
    'strip: loop {
        for s in SUFFIXES {
            if let Some(b) = name.strip_suffix(s) {
                name = b;
                continue 'strip;
            }
        }
        return name;
    }
}

/// Identifies the driver function `ptr` that a lookup for `requested` (a base name) returned:
/// by the exported symbol at exactly that address (dladdr), cross-checked against the base name,
/// else by the driver's own mapping rules of (name, CUDA version, flags).
///
/// # Safety
/// `requested` must be a NUL-terminated string.
pub unsafe fn identify(ptr: *mut c_void, requested: *const c_char, cuda_version: i32, flags: u64) -> Identity {
    let ptr = ptr as usize;
    if ptr == 0 || requested.is_null() {
        return Identity::Other;
    }
    if Sym::by_wrapper(ptr).is_some() {
        return Identity::Ours;
    }
    // SAFETY: per the caller's contract.
    let requested = unsafe { CStr::from_ptr(requested) }.to_bytes();
    let want = base_name(requested);
    if let Some(exported) = elf::exported_name_at(ptr) {
        if base_name(exported) == want {
            return Sym::by_name(exported).map_or(Identity::Other, Identity::Tracked);
        }
    }
    by_rules(want, cuda_version, flags).map_or(Identity::Other, Identity::Tracked)
}

/// The driver's mapping of (base name, CUDA version, flags) to an ABI, for the tracked families,
/// when the returned pointer carries no usable symbol. `None` for legacy ABIs and other names.
pub fn by_rules(base: &[u8], cuda_version: i32, flags: u64) -> Option<Sym> {
    let ptsz = flags & crate::cuda::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let v2 = cuda_version >= 3020;
    Some(match base {
        b"cuMemAlloc" if v2 => Sym::CuMemAllocV2,
        b"cuMemAllocPitch" if v2 => Sym::CuMemAllocPitchV2,
        b"cuMemFree" if v2 => Sym::CuMemFreeV2,
        b"cuMemGetInfo" if v2 => Sym::CuMemGetInfoV2,
        b"cuMemAllocManaged" => Sym::CuMemAllocManaged,
        b"cuIpcGetMemHandle" => Sym::CuIpcGetMemHandle,
        b"cuMemAddressReserve" => Sym::CuMemAddressReserve,
        b"cuMemAddressFree" => Sym::CuMemAddressFree,
        b"cuMemCreate" => Sym::CuMemCreate,
        b"cuMemRelease" => Sym::CuMemRelease,
        b"cuMemMap" => Sym::CuMemMap,
        b"cuMemUnmap" => Sym::CuMemUnmap,
        b"cuMemPoolTrimTo" => Sym::CuMemPoolTrimTo,
        b"cuMemPoolGetAttribute" => Sym::CuMemPoolGetAttribute,
        b"cuMemAllocAsync" if ptsz => Sym::CuMemAllocAsyncPtsz,
        b"cuMemAllocAsync" => Sym::CuMemAllocAsync,
        b"cuMemAllocFromPoolAsync" if ptsz => Sym::CuMemAllocFromPoolAsyncPtsz,
        b"cuMemAllocFromPoolAsync" => Sym::CuMemAllocFromPoolAsync,
        b"cuMemFreeAsync" if ptsz => Sym::CuMemFreeAsyncPtsz,
        b"cuMemFreeAsync" => Sym::CuMemFreeAsync,
        b"cuGetProcAddress" if cuda_version >= 12000 => Sym::CuGetProcAddressV2,
        b"cuGetProcAddress" => Sym::CuGetProcAddress,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for s in ALL {
            assert_eq!(Sym::by_name(s.name().to_bytes()), Some(s));
        }
        assert_eq!(Sym::by_name(b"cuMemAlloc"), None, "v1 is never tracked");
        assert_eq!(Sym::by_name(b"cuMemGetInfo"), None);
    }

    #[test]
    fn base_names_strip_abi_suffixes() {
        assert_eq!(base_name(b"cuMemAlloc_v2"), b"cuMemAlloc");
        assert_eq!(base_name(b"cuMemsetD8_v2_ptds"), b"cuMemsetD8");
        assert_eq!(base_name(b"cuMemAllocAsync_ptsz"), b"cuMemAllocAsync");
        assert_eq!(base_name(b"cuMemMap"), b"cuMemMap");
    }

    #[test]
    fn rules_follow_the_driver() {
        assert_eq!(by_rules(b"cuMemAlloc", 12000, 0), Some(Sym::CuMemAllocV2));
        assert_eq!(by_rules(b"cuMemAlloc", 3010, 0), None, "legacy ABI passes through");
        assert_eq!(by_rules(b"cuMemAllocAsync", 12000, 2), Some(Sym::CuMemAllocAsyncPtsz));
        assert_eq!(by_rules(b"cuMemAllocAsync", 12000, 1), Some(Sym::CuMemAllocAsync));
        assert_eq!(by_rules(b"cuGetProcAddress", 11030, 0), Some(Sym::CuGetProcAddress));
        assert_eq!(by_rules(b"cuLaunchKernel", 12000, 0), None);
    }
}
