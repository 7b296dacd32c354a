//! Build script of the driver stand-in: SONAME `libcuda.so.1`, staged as `libcuda.so.1` and
//! `libcuda.so`; linked `-Bsymbolic` so that the library's own references to its exported
//! functions (the table behind cuGetProcAddress) bind inside it, as in the real driver, and an
//! LD_PRELOAD interposer of `cuMemAlloc_v2` never sees what cuGetProcAddress hands out.

include!("../build_support.rs");

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    stage("libcuda.so", "libcuda.so.1", &["libcuda.so.1", "libcuda.so"]);
}
