//! The self-check: the trace's requests, simulated under the trace's own settings with the
//! driver's addresses taken from the trace, must reproduce what the trace recorded: every
//! segment allocation, free, map and unmap (address and size, attributed to the same request),
//! every block's address, every OOM, and the final reserved and allocated bytes. The first
//! difference is reported with the trace entry it is about; a trace that passes is `faithful`.

use super::allocator::{Addresses, Allocator, DeviceOp, Limits};
use super::stream::{Request, RequestStream};

/// The first place where the simulation and the trace differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The trace entry (or record event) it is about, when it is about one.
    pub entry: Option<usize>,
    /// What differed, in words with both values.
    pub what: String,
}

/// The self-check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// True when nothing differed.
    pub faithful: bool,
    /// The first difference.
    pub divergence: Option<Divergence>,
    /// Driver ops compared.
    pub ops_compared: usize,
    /// Block addresses compared.
    pub blocks_compared: usize,
    /// The limits the check ran under.
    pub limits: Limits,
}

fn op_text(op: &DeviceOp) -> String {
    let (a, s) = op.extent();
    format!("{} of {s} bytes at {a:#x}", op.name())
}

/// Runs the self-check of `stream` under `limits` (the trace's own: its memory fraction if the
/// caller knows it, and the device capacity the trace's first OOM implies).
pub fn self_check(stream: &RequestStream, limits: &Limits) -> Check {
    if !stream.unattributed.is_empty() {
        return sequence_check(stream, limits);
    }
    let mut a = Allocator::new(stream.conf.clone(), limits.clone(), Addresses::Replay);
    let mut ptrs: Vec<u64> = Vec::with_capacity(stream.requests.len() / 2 + 1);
    let (mut ops_compared, mut blocks_compared) = (0, 0);
    let done = |divergence: Option<Divergence>, ops_compared, blocks_compared| Check {
        faithful: divergence.is_none(),
        divergence,
        ops_compared,
        blocks_compared,
        limits: limits.clone(),
    };
    for (r, req) in stream.requests.iter().enumerate() {
        let recorded = stream.ops_of(r);
        a.set_replay_hint(recorded);
        let mut oom = None;
        match *req {
            Request::Alloc { size, stream: s, traced, .. } => match a.malloc(size, s) {
                Ok(p) => {
                    ptrs.push(p);
                    if let Some(t) = traced {
                        blocks_compared += 1;
                        let ops = a.take_ops();
                        if let Some(d) = compare_ops(stream, r, &ops, recorded) {
                            return done(Some(d), ops_compared, blocks_compared);
                        }
                        ops_compared += ops.len();
                        if t != p {
                            return done(
                                Some(Divergence {
                                    entry: Some(req.entry()),
                                    what: format!("the block of {size} bytes is at {t:#x} in the trace, at {p:#x} in the simulation"),
                                }),
                                ops_compared,
                                blocks_compared,
                            );
                        }
                        continue;
                    } else {
                        let ops = a.take_ops();
                        if let Some(d) = compare_ops(stream, r, &ops, recorded) {
                            return done(Some(d), ops_compared, blocks_compared);
                        }
                        return done(
                            Some(Divergence {
                                entry: Some(req.entry()),
                                what: format!(
                                    "the trace's allocator refused {size} bytes here (oom), the simulation served it: the limit the program ran under is not known; give it with --memory-limit (the allowed bytes of set_per_process_memory_fraction) or --device-memory"
                                ),
                            }),
                            ops_compared,
                            blocks_compared,
                        );
                    }
                }
                Err(e) => {
                    ptrs.push(0);
                    oom = Some(e);
                }
            },
            Request::FreeRequested { .. } | Request::FreeCompleted { .. } | Request::EmptyCache { .. } => {
                super::release(&mut a, &ptrs, req)
            }
        }
        let ops = a.take_ops();
        if let Some(d) = compare_ops(stream, r, &ops, recorded) {
            return done(Some(d), ops_compared, blocks_compared);
        }
        ops_compared += ops.len();
        if let (Some(e), Request::Alloc { traced: Some(_), .. }) = (oom, req) {
            return done(
                Some(Divergence {
                    entry: Some(req.entry()),
                    what: format!(
                        "the trace served {} bytes here, the simulation ran out of memory ({} limit, {} bytes reserved)",
                        e.requested,
                        match e.limit {
                            super::OomLimit::MemoryFraction => "memory-fraction",
                            super::OomLimit::Device => "device",
                        },
                        e.reserved
                    ),
                }),
                ops_compared,
                blocks_compared,
            );
        }
    }
    if let Some(f) = &stream.final_figures {
        let c = a.counters();
        if c.reserved != f.reserved || c.allocated != f.allocated {
            return done(
                Some(Divergence {
                    entry: None,
                    what: format!(
                        "at the end the trace has {} bytes reserved and {} allocated, the simulation {} and {}",
                        f.reserved, f.allocated, c.reserved, c.allocated
                    ),
                }),
                ops_compared,
                blocks_compared,
            );
        }
    }
    done(None, ops_compared, blocks_compared)
}

fn compare_ops(stream: &RequestStream, r: usize, sim: &[DeviceOp], recorded: &[DeviceOp]) -> Option<Divergence> {
    let base = stream.op_start[r] as usize;
    let n = sim.len().max(recorded.len());
    for k in 0..n {
        match (sim.get(k), recorded.get(k)) {
            (Some(s), Some(t)) if s == t => continue,
            (s, t) => {
                let entry = if t.is_some() { Some(stream.recorded_entry[base + k]) } else { Some(stream.requests[r].entry()) };
                let what = match (s, t) {
                    (Some(s), Some(t)) => format!("the trace records {}, the simulation {}", op_text(t), op_text(s)),
                    (None, Some(t)) => format!("the trace records {}, the simulation does nothing there", op_text(t)),
                    (Some(s), None) => format!("the simulation does {} where the trace records nothing", op_text(s)),
                    (None, None) => unreachable!(),
                };
                let limited = matches!(t, Some(DeviceOp::SegmentFree { .. } | DeviceOp::Unmap { .. }))
                    && !matches!(s, Some(DeviceOp::SegmentFree { .. } | DeviceOp::Unmap { .. }));
                let what = if limited {
                    format!("{what}; the trace's allocator returned cached memory first, so a limit refused its first try: the program ran under a memory fraction or with less device memory than the simulation was given (pass --memory-limit or --device-memory)")
                } else {
                    what
                };
                return Some(Divergence { entry, what });
            }
        }
    }
    None
}

/// The self-check of a record whose driver calls are not attributed to requests: the whole
/// sequence of driver calls (kind and size, in order) must match.
fn sequence_check(stream: &RequestStream, limits: &Limits) -> Check {
    let mut a = Allocator::new(stream.conf.clone(), limits.clone(), Addresses::Model);
    let mut ptrs: Vec<u64> = Vec::new();
    let mut sim_ops: Vec<(DeviceOp, usize)> = Vec::new();
    for req in &stream.requests {
        match *req {
            Request::Alloc { size, stream: s, .. } => ptrs.push(a.malloc(size, s).unwrap_or(0)),
            Request::FreeRequested { .. } | Request::FreeCompleted { .. } | Request::EmptyCache { .. } => {
                super::release(&mut a, &ptrs, req)
            }
        }
        sim_ops.extend(a.take_ops().into_iter().map(|o| (o, req.entry())));
    }
    let kind_size = |o: &DeviceOp| (o.name(), o.extent().1);
    let n = sim_ops.len().max(stream.unattributed.len());
    for k in 0..n {
        let (s, t) = (sim_ops.get(k), stream.unattributed.get(k));
        if s.map(|x| kind_size(&x.0)) == t.map(kind_size) {
            continue;
        }
        let what = match (s, t) {
            (Some((s, _)), Some(t)) => format!(
                "driver call {k}: the record has {} of {} bytes, the simulation {} of {} bytes",
                t.name(),
                t.extent().1,
                s.name(),
                s.extent().1
            ),
            (None, Some(t)) => {
                format!("driver call {k}: the record has {} of {} bytes, the simulation no more calls", t.name(), t.extent().1)
            }
            (Some((s, _)), None) => {
                format!("driver call {k}: the simulation makes {} of {} bytes, the record no more calls", s.name(), s.extent().1)
            }
            (None, None) => unreachable!(),
        };
        return Check {
            faithful: false,
            divergence: Some(Divergence { entry: s.map(|x| x.1), what }),
            ops_compared: k,
            blocks_compared: 0,
            limits: limits.clone(),
        };
    }
    Check { faithful: true, divergence: None, ops_compared: n, blocks_compared: 0, limits: limits.clone() }
}
