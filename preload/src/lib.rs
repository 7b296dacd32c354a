//! gpufrag's LD_PRELOAD shim (`libgpufrag_preload.so`): records every device-memory call of the
//! process it is loaded into as `gpufrag_wire::event::Event`s in a shared-memory ring that the
//! consumer (`gpufrag run`) drains, whichever way the program reaches the CUDA driver.
//!
//! Interposing exported names is not enough (measured with PyTorch: zero calls seen), because
//! libcudart, PyTorch, NCCL and JAX `dlopen` libcuda and fetch entry points through `dlsym` and
//! `cuGetProcAddress`. So the shim covers four routes:
//!
//! 1. direct linking: the exported wrappers (`driver`, `runtime`) come first in the global scope;
//! 2. `dlsym`/`dlvsym` on a library handle (`dl`): the real lookup, then our wrapper for tracked
//!    names only;
//! 3. `cuGetProcAddress`/`_v2` and 4. `cudaGetDriverEntryPoint`/`ByVersion` (`route`): the real
//!    lookup, then the pointer identified and swapped for the wrapper of the same ABI.
//!
//! A caching allocator the shim cannot see into can describe its blocks through the framework
//! annotation API (`annotate`, `include/gpufrag_annotate.h`).
//!
//! `table` holds the tracked ABIs and their real functions, `elf` finds symbols without `dlsym`,
//! `hook` is what every wrapper does around the real call, `clock` stamps its events (TSC ticks
//! or `CLOCK_MONOTONIC`), `state` arms and disarms tracing (environment, ring, connection, fork,
//! exec). The shim never aborts the process: any failure
//! leaves it a pure pass-through.
#![warn(missing_docs)]
#![allow(clippy::missing_safety_doc)]

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
compile_error!("gpufrag-preload supports 64-bit Linux only");

mod annotate;
mod caller;
mod clock;
mod cuda;
mod dl;
mod driver;
mod elf;
mod hook;
mod route;
mod runtime;
mod state;
mod table;

/// The constructor: finds the real `dlsym`, reads the environment, arms tracing if a consumer
/// is configured. Runs before `main` (and before the constructors of objects loaded after us).
extern "C" fn on_load() {
    dl::resolve_loader();
    state::init();
}

/// At normal exit: a `ProcessExit` event (a push, never blocking).
extern "C" fn on_unload() {
    let _ = std::panic::catch_unwind(hook::process_exit);
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
