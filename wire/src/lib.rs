//! The formats that cross a process boundary, with no dependency beyond `core`/`std`, so that
//! the preload shim can link them without pulling the analyser in.
//!
//! - [`event`]: the one fixed-size event record (mirrored by `include/gpufrag_event.h`).
//! - [`ring`]: the lock-free shared-memory ring a traced process writes events into and the
//!   consumer drains, dropping and counting when full.
//! - [`lanes`]: a traced process's region of several rings, one per group of threads, and the
//!   consumer's timestamp merge of them.
//! - [`hello`]: the first message a traced process sends the consumer over its Unix socket.
//! - [`clock`]: the events' clock (`CLOCK_MONOTONIC` or TSC ticks) and the one conversion of
//!   ticks to `CLOCK_MONOTONIC` ns.
#![warn(missing_docs)]

pub mod clock;
pub mod event;
pub mod hello;
pub mod lanes;
pub mod owner;
pub mod ring;
