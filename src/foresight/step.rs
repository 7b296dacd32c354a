//! The step finder: the repeating pattern of a process's requests to its caching allocator (a
//! training iteration, a decode step, a batch), found on the requests' structure rather than
//! their sizes, so that a step whose sizes grow (a rising sequence length, a KV cache) or vary
//! (batches of varying shape) is still one step.
//!
//! Each request becomes a key: an allocation its stream, a free how many allocations ago its
//! block was allocated (the lag), an `empty_cache()` a constant. A training step frees what it
//! allocated the same number of allocations later each time, whatever the sizes. The step is the
//! shortest period P (in requests) whose last three windows of P keys are equal (compared by
//! polynomial hashes over prefix sums, O(1) a candidate, then confirmed key by key), so finding it
//! costs O(N + candidates) for N requests.
//!
//! Its sizes then say how it changes: all equal from step to step (periodic), differing by the
//! same amount at each position over the last three steps (growing, extrapolated linearly), or
//! otherwise (varying: the next step is taken at each position's largest size seen).

use crate::sim::Request;

/// How a step's sizes change from one step to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// The same sizes each step.
    Periodic,
    /// Sizes change by the same amount each step at each position (linear growth).
    Growing,
    /// Sizes vary with no linear pattern (batches of varying shape): the envelope is used.
    Varying,
}

impl Growth {
    /// The name in JSON and on screen.
    pub fn name(self) -> &'static str {
        match self {
            Growth::Periodic => "periodic",
            Growth::Growing => "growing",
            Growth::Varying => "varying",
        }
    }
}

/// A step found in a request stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Requests in one step.
    pub period: usize,
    /// Allocations in one step.
    pub allocs: usize,
    /// Whole steps seen back to back at the end of the stream (at least 3, at most
    /// [`ENVELOPE_STEPS`]).
    pub repeats: usize,
    /// The first request of the last whole step (an index into the requests searched).
    pub last_start: usize,
    /// Allocations before the last whole step, counted from the stream's start (its first
    /// allocation's index in the stream).
    pub allocs_before_last: u32,
    /// How the sizes change.
    pub growth: Growth,
    /// Sizes of the last step's allocations, in order.
    pub last_sizes: Vec<u64>,
    /// Per allocation of the step: the size change from one step to the next (growing), or the
    /// largest size seen less the last one (varying), or 0.
    pub delta: Vec<i64>,
}

/// The smallest number of whole steps the finder needs.
pub const MIN_REPEATS: usize = 3;

/// The most whole steps counted back from the end (the envelope of a varying step is taken over
/// them): a search of the last `(ENVELOPE_STEPS + 1)` steps finds what a search of the whole does.
pub const ENVELOPE_STEPS: usize = 16;

fn key(r: &Request, allocs_before: u32) -> u64 {
    match *r {
        Request::Alloc { stream, .. } => 1 ^ (stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) << 2),
        Request::FreeRequested { alloc, .. } => 2 | (u64::from(allocs_before.saturating_sub(alloc)) << 2),
        Request::FreeCompleted { alloc, .. } => 3 | (u64::from(allocs_before.saturating_sub(alloc)) << 2),
        Request::EmptyCache { .. } => 4 << 2,
    }
}

/// The keys of `requests` (see the module header).
pub fn keys(requests: &[Request]) -> Vec<u64> {
    keys_from(requests, 0)
}

/// The keys of `requests`, a window of a stream that made `allocs_before` allocations before it.
pub fn keys_from(requests: &[Request], allocs_before: u32) -> Vec<u64> {
    let mut n = allocs_before;
    requests
        .iter()
        .map(|r| {
            let k = key(r, n);
            if matches!(r, Request::Alloc { .. }) {
                n += 1;
            }
            k
        })
        .collect()
}

const MOD: u64 = (1 << 61) - 1;
const BASE: u64 = 1_000_003;

fn mulmod(a: u64, b: u64) -> u64 {
    ((a as u128 * b as u128) % MOD as u128) as u64
}

/// Prefix hashes: h[i] = hash of keys[..i], and BASE^i.
fn prefix(keys: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let mut h = Vec::with_capacity(keys.len() + 1);
    let mut p = Vec::with_capacity(keys.len() + 1);
    h.push(0);
    p.push(1);
    for (i, &k) in keys.iter().enumerate() {
        h.push((mulmod(h[i], BASE) + (k % MOD) + 1) % MOD);
        p.push(mulmod(p[i], BASE));
    }
    (h, p)
}

fn window(h: &[u64], p: &[u64], a: usize, b: usize) -> u64 {
    (h[b] + MOD - mulmod(h[a], p[b - a])) % MOD
}

/// Finds the step of `requests`, or says why there is none (a one-line note).
pub fn find_step(requests: &[Request]) -> Result<Step, String> {
    find_step_in(requests, 0)
}

/// Finds the step of `requests`, the last requests of a stream that made `allocs_before`
/// allocations before them (the live pipeline searches a bounded window, not the whole history).
pub fn find_step_in(requests: &[Request], allocs_before: u32) -> Result<Step, String> {
    let n = requests.len();
    if n < MIN_REPEATS * 2 {
        return Err(format!("{n} requests are too few to find a step (at least {} whole steps are needed)", MIN_REPEATS));
    }
    let k = keys_from(requests, allocs_before);
    let (h, p) = prefix(&k);
    let mut found = None;
    for period in 1..=n / MIN_REPEATS {
        let w = |i: usize| window(&h, &p, n - (i + 1) * period, n - i * period);
        if w(0) == w(1) && w(1) == w(2) && k[n - 3 * period..n - period] == k[n - 2 * period..n] {
            // a step allocates and frees (a run of allocations alone, model loading or a cache
            // filling, is not a step)
            let tail = &requests[n - period..];
            if tail.iter().any(|r| matches!(r, Request::Alloc { .. })) && tail.iter().any(|r| matches!(r, Request::FreeRequested { .. })) {
                found = Some(period);
                break;
            }
        }
    }
    let Some(period) = found else {
        return Err(format!("no repeating step in the last {n} requests (the last three windows of any length differ)"));
    };
    let mut repeats = 3;
    while repeats < ENVELOPE_STEPS && (repeats + 1) * period <= n && k[n - (repeats + 1) * period..n - repeats * period] == k[n - period..n]
    {
        repeats += 1;
    }
    let sizes = |start: usize| -> Vec<u64> {
        requests[start..start + period]
            .iter()
            .filter_map(|r| match *r {
                Request::Alloc { size, .. } => Some(size),
                _ => None,
            })
            .collect()
    };
    let last_start = n - period;
    let s0 = sizes(n - 3 * period);
    let s1 = sizes(n - 2 * period);
    let s2 = sizes(last_start);
    let d1: Vec<i64> = s1.iter().zip(&s0).map(|(&b, &a)| b as i64 - a as i64).collect();
    let d2: Vec<i64> = s2.iter().zip(&s1).map(|(&b, &a)| b as i64 - a as i64).collect();
    let (growth, delta) = if d2.iter().all(|&d| d == 0) && d1.iter().all(|&d| d == 0) {
        (Growth::Periodic, vec![0; s2.len()])
    } else if d1 == d2 {
        (Growth::Growing, d2)
    } else {
        // the envelope over every whole step seen
        let mut max = s2.clone();
        for r in 1..repeats {
            for (m, s) in max.iter_mut().zip(sizes(n - (r + 1) * period)) {
                *m = (*m).max(s);
            }
        }
        (Growth::Varying, max.iter().zip(&s2).map(|(&m, &s)| m as i64 - s as i64).collect())
    };
    let allocs_before_last = allocs_before + requests[..last_start].iter().filter(|r| matches!(r, Request::Alloc { .. })).count() as u32;
    Ok(Step { period, allocs: s2.len(), repeats, last_start, allocs_before_last, growth, last_sizes: s2, delta })
}

/// The requests of the `ahead`-th step after the stream's end (1 = the next one), for a stream
/// with `allocs_so_far` allocations before that step: the last step's requests with each size
/// extrapolated (growing: `ahead` × the change; varying: the envelope), each free pointing at
/// the allocation the same lag back. `requests` are those the step was found in.
pub fn extrapolate(requests: &[Request], step: &Step, ahead: usize, allocs_so_far: u32) -> Vec<Request> {
    let mut out = Vec::with_capacity(step.period);
    let mut n = allocs_so_far;
    let mut j = 0usize;
    let last = &requests[step.last_start..step.last_start + step.period];
    let k = keys_from(last, step.allocs_before_last);
    for (i, r) in last.iter().enumerate() {
        let lag = k[i] >> 2;
        match *r {
            Request::Alloc { size, stream, .. } => {
                let d = step.delta.get(j).copied().unwrap_or(0);
                let grown = match step.growth {
                    Growth::Growing => size as i64 + d * ahead as i64,
                    Growth::Varying => size as i64 + d,
                    Growth::Periodic => size as i64,
                };
                out.push(Request::Alloc { size: grown.max(1) as u64, stream, entry: usize::MAX, traced: Some(0) });
                n += 1;
                j += 1;
            }
            Request::FreeRequested { .. } => out.push(Request::FreeRequested { alloc: n.saturating_sub(lag as u32), entry: usize::MAX }),
            Request::FreeCompleted { .. } => out.push(Request::FreeCompleted { alloc: n.saturating_sub(lag as u32), entry: usize::MAX }),
            Request::EmptyCache { .. } => out.push(Request::EmptyCache { entry: usize::MAX }),
        }
    }
    out
}
