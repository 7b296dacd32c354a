//! Build script of the NVML stand-in: SONAME `libnvidia-ml.so.1`, staged as `libnvidia-ml.so.1`
//! and `libnvidia-ml.so` (the name nvml-wrapper opens).

include!("../build_support.rs");

fn main() {
    stage("libnvml.so", "libnvidia-ml.so.1", &["libnvidia-ml.so.1", "libnvidia-ml.so"]);
}
