//! The caching allocators gpufrag models, one file each: PyTorch's `CUDACachingAllocator`
//! ([`pytorch`]), XLA's BFC allocator ([`bfc`], JAX and TensorFlow) and CuPy's memory pool
//! ([`cupy`]); [`framework`] says which of them a block or adopt event belongs to. Each file owns
//! its allocator's rules (how a request becomes a block, what is split, what is stranded), and
//! the address map, the analysis and the simulator all apply them from here: the foundation floor,
//! importing nothing but units.

pub mod bfc;
pub mod cupy;
mod framework;
pub mod pytorch;

pub use framework::{Framework, FrameworkReport};
