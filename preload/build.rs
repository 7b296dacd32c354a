//! Compiles `src/thread.c`: the shim's per-thread state in initial-exec thread-local storage
//! (see that file for why it is C).

fn main() {
    println!("cargo:rerun-if-changed=src/thread.c");
    cc::Build::new().file("src/thread.c").opt_level(2).warnings(true).compile("gpufrag_thread");
}
