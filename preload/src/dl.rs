//! The shim's `dlsym` and `dlvsym`, and the real ones behind them.
//!
//! A program that `dlopen`s libcuda (libcudart, PyTorch, NCCL, JAX all do) fetches entry points
//! with `dlsym(handle, "cuGetProcAddress_v2")`: the shim's `dlsym` calls the real lookup first
//! and swaps in its wrapper only when the name is a tracked ABI (`table::Sym`), storing the real
//! function in that ABI's slot. Every other name passes through untouched.
//!
//! `RTLD_NEXT` and `RTLD_DEFAULT` are resolved by glibc relative to the object that *called*
//! `dlsym` (its return address): `RTLD_NEXT` searches the objects after the caller, and
//! `RTLD_DEFAULT` searches the caller's scope, which for a library loaded `RTLD_LOCAL` includes
//! its own dependencies. A Rust wrapper that calls the real `dlsym` would make the shim the
//! caller and change both answers (an interposer that asks for `RTLD_NEXT` would get itself
//! back and recurse). So on x86_64 the exported entries are naked functions that tail-jump to
//! the real `dlsym`/`dlvsym` for those two handles, leaving the caller's return address where
//! glibc looks for it, and tail-jump into the Rust implementation for real handles. Neither
//! special handle needs a swap: `RTLD_DEFAULT` already finds the shim's exports first (the
//! preload is at the head of the global scope), and `RTLD_NEXT` asks for what lies behind an
//! interposer, which the shim must not change.
//!
//! On aarch64 the same entries are written with that architecture's branch instructions (the
//! caller's return address stays in `x30`). On any other architecture the entries are plain
//! Rust functions: `RTLD_NEXT` then searches after the shim (which, the shim being first,
//! is nearly everything) and `RTLD_DEFAULT` loses the caller's local scope; a documented
//! limitation.
//!
//! The real functions are found without `dlsym` (`elf::find_in_libc`), lazily: another
//! library's constructor may call `dlsym` before the shim's own constructor has run.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cuda::{DlsymFn, DlvsymFn};
use crate::table::{self, Sym};
use crate::{elf, state};

/// The C library's `dlsym`; 0 until found. Read by the naked entry below.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
/// The C library's `dlvsym`; 0 until found.
static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

/// Finds the real `dlsym` and `dlvsym` in the C library's symbol table (idempotent, lock-free:
/// concurrent callers compute and store the same values).
pub extern "C" fn resolve_loader() {
    if REAL_DLSYM.load(Ordering::Acquire) == 0 {
        if let Some(p) = elf::find_in_libc(b"dlsym") {
            REAL_DLSYM.store(p, Ordering::Release);
        }
    }
    if REAL_DLVSYM.load(Ordering::Acquire) == 0 {
        if let Some(p) = elf::find_in_libc(b"dlvsym") {
            REAL_DLVSYM.store(p, Ordering::Release);
        }
    }
}

/// Whether the real `dlsym` was found (the shim cannot work without it).
pub fn loader_found() -> bool {
    resolve_loader();
    REAL_DLSYM.load(Ordering::Acquire) != 0 && REAL_DLVSYM.load(Ordering::Acquire) != 0
}

/// Calls the C library's `dlsym` from the shim (so `RTLD_NEXT` means "after the shim").
///
/// # Safety
/// As `dlsym(3)`: `symbol` is a NUL-terminated string, `handle` a handle or pseudo-handle.
pub unsafe fn real_dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        resolve_loader();
        p = REAL_DLSYM.load(Ordering::Acquire);
    }
    if p == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: p is libc's dlsym, whose C type DlsymFn is.
    let f = unsafe { std::mem::transmute::<usize, DlsymFn>(p) };
    // SAFETY: per this function's contract.
    unsafe { f(handle, symbol) }
}

/// Calls the C library's `dlvsym`.
///
/// # Safety
/// As `dlvsym(3)`.
unsafe fn real_dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    let mut p = REAL_DLVSYM.load(Ordering::Acquire);
    if p == 0 {
        resolve_loader();
        p = REAL_DLVSYM.load(Ordering::Acquire);
    }
    if p == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: p is libc's dlvsym, whose C type DlvsymFn is.
    let f = unsafe { std::mem::transmute::<usize, DlvsymFn>(p) };
    // SAFETY: per this function's contract.
    unsafe { f(handle, symbol, version) }
}

/// Hands out the wrapper for a tracked name that the real lookup resolved to `found`, storing
/// `found` as that ABI's real function; anything else is returned as found.
///
/// # Safety
/// `symbol` must be null or a NUL-terminated string.
unsafe fn swap_by_name(symbol: *const c_char, found: *mut c_void) -> *mut c_void {
    if found.is_null() || symbol.is_null() || !state::swapping() {
        return found;
    }
    let swapped = std::panic::catch_unwind(|| {
        // SAFETY: non-null NUL-terminated string per the caller's contract.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        let s = Sym::by_name(name)?;
        if table::store(s, found as usize) || Sym::by_wrapper(found as usize) == Some(s) {
            Some(table::wrapper(s) as *mut c_void)
        } else {
            None
        }
    });
    match swapped {
        Ok(Some(w)) => w,
        Ok(None) => found,
        Err(_) => {
            state::disable_after_panic();
            found
        }
    }
}

/// `dlsym` on a real handle: the real lookup, then the swap.
unsafe extern "C" fn dlsym_impl(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments, unchanged (dlsym's contract is the caller's).
    let found = unsafe { real_dlsym(handle, symbol) };
    // SAFETY: as above.
    unsafe { swap_by_name(symbol, found) }
}

/// `dlvsym` on a real handle: the real lookup, then the swap (by name: an ELF symbol version is
/// not a CUDA ABI version).
unsafe extern "C" fn dlvsym_impl(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments, unchanged.
    let found = unsafe { real_dlvsym(handle, symbol, version) };
    // SAFETY: as above.
    unsafe { swap_by_name(symbol, found) }
}

/// The body of the exported `dlsym` and `dlvsym` on x86_64 (they differ only in where they go):
/// special handles (`RTLD_NEXT` = -1, `RTLD_DEFAULT` = 0) jump to the real function with the
/// caller's return address intact (see the module comment); real handles jump to `$imp`.
#[cfg(target_arch = "x86_64")]
macro_rules! loader_entry {
    ($imp:path, $real:path) => {
        core::arch::naked_asm!(
            "cmp rdi, -1",
            "je 2f",
            "test rdi, rdi",
            "je 2f",
            "jmp {imp}",
            "2:",
            "mov rax, qword ptr [rip + {real}]",
            "test rax, rax",
            "jz 3f",
            "jmp rax",
            // Not found yet (a constructor that ran before ours): find it, keeping the arguments.
            // Three pushes on top of the return address leave the stack 16-byte aligned for the call.
            "3:",
            "push rdi",
            "push rsi",
            "push rdx",
            "call {resolve}",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "mov rax, qword ptr [rip + {real}]",
            "test rax, rax",
            "jz 4f",
            "jmp rax",
            "4:",
            "xor eax, eax",
            "ret",
            imp = sym $imp,
            real = sym $real,
            resolve = sym resolve_loader,
        )
    };
}

/// The same on aarch64; the return address is `x30`, which the slow path saves and restores
/// around the call that finds the real function.
#[cfg(target_arch = "aarch64")]
macro_rules! loader_entry {
    ($imp:path, $real:path) => {
        core::arch::naked_asm!(
            "cmn x0, #1",
            "b.eq 2f",
            "cbz x0, 2f",
            "b {imp}",
            "2:",
            "adrp x16, {real}",
            "ldr x16, [x16, :lo12:{real}]",
            "cbz x16, 3f",
            "br x16",
            "3:",
            "stp x29, x30, [sp, #-48]!",
            "stp x0, x1, [sp, #16]",
            "str x2, [sp, #32]",
            "bl {resolve}",
            "ldp x0, x1, [sp, #16]",
            "ldr x2, [sp, #32]",
            "ldp x29, x30, [sp], #48",
            "adrp x16, {real}",
            "ldr x16, [x16, :lo12:{real}]",
            "cbz x16, 4f",
            "br x16",
            "4:",
            "mov x0, #0",
            "ret",
            imp = sym $imp,
            real = sym $real,
            resolve = sym resolve_loader,
        )
    };
}

/// The exported `dlsym`: special handles go straight to the real one with the caller's return
/// address intact (see the module comment); real handles go to [`dlsym_impl`].
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    loader_entry!(dlsym_impl, REAL_DLSYM)
}

/// The exported `dlvsym`, shaped like [`dlsym`].
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    loader_entry!(dlvsym_impl, REAL_DLVSYM)
}

/// The exported `dlsym` elsewhere: plain Rust (special handles resolve relative to the shim).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if handle.is_null() || handle == libc::RTLD_NEXT {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real_dlsym(handle, symbol) };
    }
    // SAFETY: as above.
    unsafe { dlsym_impl(handle, symbol) }
}

/// The exported `dlvsym` elsewhere: plain Rust.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    if handle.is_null() || handle == libc::RTLD_NEXT {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real_dlvsym(handle, symbol, version) };
    }
    // SAFETY: as above.
    unsafe { dlvsym_impl(handle, symbol, version) }
}
