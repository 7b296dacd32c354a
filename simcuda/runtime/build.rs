//! Build script of the runtime stand-in: SONAME `libcudart.so.13`, staged as `libcudart.so.13`,
//! `libcudart.so.12` and `libcudart.so`.

include!("../build_support.rs");

fn main() {
    stage("libcudart.so", "libcudart.so.13", &["libcudart.so.13", "libcudart.so.12", "libcudart.so"]);
}
