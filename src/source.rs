//! What every live source (the consumer socket of the LD_PRELOAD shim and the Python hook, the
//! eBPF session of `attach` and `agent`) hands to the live pipeline ([`crate::live::Live`]): one
//! message type, applied in order by `Live::handle`, and the clock the sources stamp events with.
//! A source never holds the pipeline: it returns (or sends) messages, and whoever runs the loop
//! feeds them on.

use crate::event::Event;
use crate::hello::Hello;

/// What a source hands to the live pipeline.
#[derive(Debug)]
pub enum Msg {
    /// One event from a ring (or made by the consumer: `Dropped`, `ProcessExit`).
    Event(Event),
    /// A fact a process states about itself, as an event with its text (its allocator settings,
    /// memory fraction, framework: `EventKind::AllocSettings` and after), applied and recorded
    /// like any event.
    Fact {
        /// The event (`text_len` is set from `text` when it is applied).
        event: Event,
        /// Its text.
        text: String,
    },
    /// A process connected.
    Connected {
        /// Its hello.
        hello: Hello,
        /// Its `/proc` entries, read as its connection was accepted (a short-lived process is
        /// gone by the time the live loop handles this message), with the shim's own
        /// environment block in place of `environ` when it sent one.
        proc: Option<Box<crate::attribution::ProcRead>>,
    },
    /// What `/proc` said of a process, read as soon as its first probe event arrived (the eBPF
    /// session: events wait out a reorder window, and a short-lived process is gone by then).
    Proc {
        /// The process.
        pid: u32,
        /// What was read.
        read: Box<crate::attribution::ProcRead>,
    },
    /// A PyTorch allocator snapshot from a Python hook: the process's blocks now.
    Blocks {
        /// The process.
        pid: u32,
        /// The snapshot (segments with blocks).
        snapshot: Box<crate::snapshot::Snapshot>,
    },
    /// How a Python hook brings the process's PyTorch blocks: PyTorch's allocator trace tracker
    /// (event level, its events arrive through the shim's ring) or snapshots.
    BlocksSource {
        /// The process.
        pid: u32,
        /// The trace tracker is attached.
        tracker: bool,
        /// The hook's sentence for the summary (why snapshots, when it is snapshots).
        note: String,
    },
    /// A Python hook found PyTorch's native caching allocator in charge of the process's memory.
    Armed {
        /// The process.
        pid: u32,
        /// Its current device.
        device: i16,
    },
    /// PyTorch's out-of-memory observer fired.
    PyOom {
        /// The process.
        pid: u32,
        /// Device.
        device: i16,
        /// Bytes requested.
        requested: u64,
        /// Device free bytes PyTorch measured.
        device_free: u64,
        /// The allocator's allowed bytes (`set_per_process_memory_fraction`), when a fraction caps it.
        allowed: Option<u64>,
    },
    /// PyTorch's OOM observer gave the allowed bytes of an OOM the trace tracker reported.
    PyOomAllowed {
        /// The process.
        pid: u32,
        /// Device.
        device: i16,
        /// PyTorch's allocation size.
        requested: u64,
        /// The allowed bytes of `set_per_process_memory_fraction`.
        allowed: u64,
    },
    /// A framework's own statistics from a Python hook (JAX's `memory_stats()`, CuPy's pool).
    FrameworkStats(crate::alloc::FrameworkReport),
    /// A framework's out-of-memory error reached the Python hook (XLA's RESOURCE_EXHAUSTED, CuPy's
    /// OutOfMemoryError) when the framework made it, caught by the program or not.
    FrameworkOom {
        /// The process.
        pid: u32,
        /// The allocator that failed.
        framework: crate::alloc::Framework,
        /// Device.
        device: i16,
        /// Bytes requested, as the error message gives them.
        requested: u64,
        /// Device free bytes, when the hook measured them.
        device_free: Option<u64>,
        /// The size as the message writes it, when it is rounded there (XLA writes `11.85GiB`:
        /// two decimals of the largest unit), so `requested` is only as exact as that text.
        requested_text: Option<String>,
        /// The pool's total bytes as the framework's error gives them (CuPy's `total` argument).
        pool_total: Option<u64>,
    },
    /// A Python hook's message could not be used, or a source has something to say.
    Warning(String),
    /// A process is known by this name (the eBPF session learns names from `/proc`, not from a
    /// hello); the first name given for a pid is kept.
    Named {
        /// The process.
        pid: u32,
        /// Its executable's name.
        name: String,
    },
    /// Drop everything the state holds for this process (the agent, once a process exited).
    Forget(u32),
}

/// CLOCK_MONOTONIC in nanoseconds, the shim's clock.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
