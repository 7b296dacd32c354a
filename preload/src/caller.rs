//! The caller's return address for the allocation wrappers (issue 25, item 3: which library took
//! the memory), taken for free at the exported entry.
//!
//! Each tracked allocation name is a naked two-instruction thunk: it copies the return address
//! (`[rsp]` on x86-64 at entry, `x30` on aarch64) into the next free integer argument register
//! and jumps to the real wrapper, which takes it as one more argument. The stack and the other
//! argument registers are untouched, so the wrapper returns straight to the caller. No frame
//! pointers are needed (the shim is built without them) and nothing is read from memory but the
//! stack slot the `call` just wrote. The runtime→driver nesting needs nothing more: the
//! re-entrancy guard records only the outermost wrapper, and that one's caller is the library
//! that called the runtime (a `cudaMalloc` from libcublas is cuBLAS's, not libcudart's).
//!
//! The register is given per function, from its C signature: the first integer register after
//! its arguments (a struct larger than 16 bytes, `cudaExtent`, goes on the stack on x86-64 and
//! by reference on aarch64, which is why `cudaMalloc3D` names `rsi` / `x2`).

/// Exports `$name` as the thunk of `$inner` (an `extern "C"` fn with the same arguments and a
/// last `caller: usize`), the caller going in `$x` (x86-64) or `$a` (aarch64).
macro_rules! thunk {
    ($name:ident => $inner:ident, x86_64: $x:literal, aarch64: $a:literal) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!(concat!("mov ", $x, ", qword ptr [rsp]"), "jmp {f}", f = sym $inner);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!(concat!("mov ", $a, ", x30"), "b {f}", f = sym $inner);
        }
    };
}
pub(crate) use thunk;
