//! gpufrag: why GPU jobs die of "out of memory" while nvidia-smi shows free memory.
//!
//! The library owns the parts every front end shares: the one wire [`event`], the per-process
//! address [`map`] with the caching allocators' rules ([`alloc`]), the [`analysis`] that turns a map into
//! figures and OOM verdicts, the PyTorch [`snapshot`] importer, and the [`ingest`] state that feeds
//! events into maps. The `gpufrag` binary (src/main.rs) is a thin dispatcher over it.
#![warn(missing_docs)]

pub mod alloc;
pub mod analysis;
pub mod attribution;
pub mod budget;
pub mod cli;
pub mod consumer;
pub mod ebpf;
pub mod export;
pub mod foresight;
pub mod guard;
pub use gpufrag_wire::{event, hello, owner, ring};
pub mod ingest;
pub mod input;
pub mod limits;
pub mod live;
pub mod map;
pub mod observe;
pub mod private;
pub mod record;
pub mod sim;
pub mod snapshot;
pub mod source;
pub mod terminal;
pub mod units;
pub mod views;
