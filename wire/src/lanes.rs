//! A traced process's event region: K independent [`Ring`]s ("lanes") in one shared mapping, so
//! that threads do not all compare-and-swap one `tail` word. Each producer thread keeps to one
//! lane (the shim hands them out round robin at a thread's first event, so up to K threads have
//! one each); threads that share a lane stay correct (each lane is a multi-producer ring) and
//! only pay, between them, the contention a single ring had.
//!
//! The consumer drains every lane and merges them by timestamp ([`Merge`]), so that events of
//! different threads keep their causal order: when thread A allocates and thread B frees that
//! pointer, A published its event before B could learn the pointer, so B's event never overtakes
//! it (the shim, for its part, records a free before making it, so the address cannot be handed
//! to another thread and recorded there first).
//!
//! Layout (little-endian, offsets in bytes; lanes start on page boundaries, and a fresh ring is
//! all zeroes beyond its header, so a lane no thread uses costs no memory):
//! ```text
//!    0  magic "GFLANES1"   8  version u32   12  lanes u32 (K, a power of two)
//!   16  events per lane u64 (a power of two)   24  bytes per lane u64   32  pid u32
//!   36  lanes handed out u32 (the producer raises it as threads get their lane; the consumer
//!       brings the next lanes into memory ahead of them, see [`Prefault`])
//! 4096  lane 0: a Ring (its own header: magic, capacity, tail, head, dropped; then its slots)
//! 4096 + stride × k: lane k
//! ```
//! The consumer derives and checks everything: K and the per-lane capacity from the header must
//! be powers of two, the stride must be the one they imply, the lanes must fit in the region's
//! size (which the consumer takes from the memfd, not from the producer), and each lane's own
//! header is checked by [`Ring::attach`] and must agree on the capacity.

use crate::event::Event;
use crate::ring::{region_bytes as ring_bytes, Ring, RingError};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// First 8 bytes of a lanes region.
pub const LANES_MAGIC: u64 = u64::from_le_bytes(*b"GFLANES1");
/// Layout version.
pub const LANES_VERSION: u32 = 1;
/// Bytes before lane 0 (one page: lanes stay page-aligned).
pub const LANES_HEADER_BYTES: usize = 4096;
/// Most lanes a region may have.
pub const MAX_LANES: u32 = 256;
/// Lanes when `GPUFRAG_RING_LANES` does not say.
pub const DEFAULT_LANES: u32 = 16;
/// Events a region holds in all (all lanes together) when `GPUFRAG_RING_CAPACITY` does not say:
/// 1 Mi events, 64 Ki per lane with the default 16 lanes (88 MiB of address space, 5.5 MiB per
/// lane; memory is used only for the lanes threads were given, and one spare the consumer keeps
/// ready, see [`Prefault`]). A lane must hold what its thread pushes while the consumer is not
/// running: on a loaded 2-core machine the drainer can be off the CPU for tens of milliseconds,
/// during which a tight allocation loop pushes about a million events a second (`gpufrag demo
/// --scenario small-pages` pushes 31,542 in one burst; 16 Ki per lane dropped up to half of them).
pub const DEFAULT_TOTAL_CAPACITY: u64 = 1 << 20;
/// Header offset of the count of lanes the producer has handed out.
const ASSIGNED_OFFSET: usize = 36;
/// Lanes the consumer keeps in memory beyond those handed out (see [`Prefault`]).
pub const SPARE_LANES: u32 = 1;

const PAGE: usize = 4096;

/// Bytes one lane of `capacity` events takes (its ring, rounded up to a page).
pub const fn lane_stride(capacity: u64) -> usize {
    ring_bytes(capacity).div_ceil(PAGE) * PAGE
}

/// Bytes a region of `lanes` lanes of `capacity` events each needs.
pub const fn region_bytes(lanes: u32, capacity: u64) -> usize {
    LANES_HEADER_BYTES + lanes as usize * lane_stride(capacity)
}

/// A view of a lanes region. It does not own the memory: the creator maps and unmaps it.
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    base: *mut u8,
    mask: u32,
    stride: usize,
    capacity: u64,
}

// SAFETY: a Lanes is a set of Rings (Send + Sync) at fixed offsets of one region.
unsafe impl Send for Lanes {}
// SAFETY: as above.
unsafe impl Sync for Lanes {}

impl Lanes {
    /// Lays out `lanes` fresh rings of `capacity` events each in `len` zeroed bytes at `base`
    /// (the producer side, once).
    ///
    /// # Safety
    /// `base` must point to `len` writable, zeroed bytes, page-aligned (a fresh mapping is), that
    /// stay mapped while any view of them is used, and nobody else may use them yet.
    pub unsafe fn init(base: *mut u8, len: usize, lanes: u32, capacity: u64, pid: u32) -> Result<Lanes, RingError> {
        if !lanes.is_power_of_two() || lanes > MAX_LANES || !capacity.is_power_of_two() || capacity < 2 {
            return Err(RingError::BadSize);
        }
        let stride = lane_stride(capacity);
        if len < region_bytes(lanes, capacity) || !(base as usize).is_multiple_of(PAGE) {
            return Err(RingError::BadSize);
        }
        // SAFETY: the caller gives us `len` bytes, which cover the header and every lane.
        unsafe {
            base.cast::<u64>().write(LANES_MAGIC);
            base.add(8).cast::<u32>().write(LANES_VERSION);
            base.add(12).cast::<u32>().write(lanes);
            base.add(16).cast::<u64>().write(capacity);
            base.add(24).cast::<u64>().write(stride as u64);
            base.add(32).cast::<u32>().write(pid);
            for k in 0..lanes as usize {
                Ring::init(base.add(LANES_HEADER_BYTES + k * stride), stride, capacity, pid)?;
            }
        }
        Ok(Lanes { base, mask: lanes - 1, stride, capacity })
    }

    /// Views a region another process laid out (the consumer side): the header's lane count and
    /// capacity must be powers of two that fit `len`, and every lane must be a ring of that
    /// capacity (its own header checked).
    ///
    /// # Safety
    /// `base` must point to `len` readable and writable bytes, page-aligned, that stay mapped
    /// while the view is used.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Lanes, RingError> {
        if len < LANES_HEADER_BYTES || !(base as usize).is_multiple_of(PAGE) {
            return Err(RingError::BadSize);
        }
        // SAFETY: `len` covers the header.
        let (magic, version, lanes, capacity, stride) = unsafe {
            (
                base.cast::<u64>().read_volatile(),
                base.add(8).cast::<u32>().read_volatile(),
                base.add(12).cast::<u32>().read_volatile(),
                base.add(16).cast::<u64>().read_volatile(),
                base.add(24).cast::<u64>().read_volatile(),
            )
        };
        if magic != LANES_MAGIC || version != LANES_VERSION {
            return Err(RingError::BadHeader);
        }
        if !lanes.is_power_of_two() || lanes > MAX_LANES || !capacity.is_power_of_two() || capacity < 2 {
            return Err(RingError::BadSize);
        }
        // Bound the capacity before computing sizes from it (no overflow): the lanes must fit.
        let room = (len - LANES_HEADER_BYTES) / lanes as usize;
        if capacity > (room / crate::ring::SLOT_BYTES) as u64 {
            return Err(RingError::BadSize);
        }
        let want = lane_stride(capacity);
        if stride != want as u64 || want > room {
            return Err(RingError::BadSize);
        }
        for k in 0..lanes as usize {
            // SAFETY: lane k lies inside the region (k × stride + stride ≤ len - header).
            let ring = unsafe { Ring::attach(base.add(LANES_HEADER_BYTES + k * want), want) }?;
            if ring.capacity() != capacity {
                return Err(RingError::BadSize);
            }
        }
        Ok(Lanes { base, mask: lanes - 1, stride: want, capacity })
    }

    /// Number of lanes.
    pub fn count(&self) -> usize {
        self.mask as usize + 1
    }

    /// Events each lane holds.
    pub fn lane_capacity(&self) -> u64 {
        self.capacity
    }

    /// Lane `k` (taken modulo the lane count).
    #[inline]
    pub fn lane(&self, k: usize) -> Ring {
        let k = k & self.mask as usize;
        // SAFETY: init/attach checked that every lane lies inside the region and is a ring of
        // `capacity` events with a valid header.
        unsafe { Ring::from_raw(self.base.add(LANES_HEADER_BYTES + k * self.stride), self.capacity) }
    }

    /// The bytes of lane `k` (taken modulo the lane count): its ring header and slots, page-aligned
    /// (for a producer that wants the lane's pages in memory before it pushes).
    pub fn lane_region(&self, k: usize) -> (*mut u8, usize) {
        let k = k & self.mask as usize;
        (self.base.wrapping_add(LANES_HEADER_BYTES + k * self.stride), self.stride)
    }

    /// Pushes `ev` into lane `lane` (taken modulo the lane count); `false` (dropped and counted
    /// in that lane) when the lane is full. Never blocks.
    #[inline]
    pub fn push(&self, lane: u32, ev: &Event) -> bool {
        self.lane(lane as usize).push(ev)
    }

    /// [`Lanes::push`] from the only producer of lane `lane` (see [`Ring::push_single`]), with
    /// that producer's `limit` for the lane.
    ///
    /// # Safety
    /// No other thread may push into that lane while this one does.
    #[inline]
    pub unsafe fn push_exclusive(&self, lane: u32, ev: &Event, limit: &std::cell::Cell<u64>) -> bool {
        // SAFETY: per the caller's contract.
        unsafe { self.lane(lane as usize).push_single(ev, limit) }
    }

    fn assigned_word(&self) -> &AtomicU32 {
        // SAFETY: a 4-aligned word inside the checked header (page-aligned base), only ever
        // accessed atomically after init.
        unsafe { &*self.base.add(ASSIGNED_OFFSET).cast::<AtomicU32>() }
    }

    /// The producer's side: publishes that `n` lanes have been handed out (threads given a
    /// lane so far; more than the lane count means all of them), so that the consumer brings
    /// the next ones into memory before a thread needs them.
    pub fn note_assigned(&self, n: u32) {
        self.assigned_word().fetch_max(n.min(self.count() as u32), Ordering::Release);
    }

    /// Lanes the producer says it has handed out (at most the lane count).
    pub fn assigned(&self) -> u32 {
        self.assigned_word().load(Ordering::Acquire).min(self.count() as u32)
    }

    /// The pid the producer wrote into the header.
    pub fn producer_pid(&self) -> u32 {
        // SAFETY: inside the checked header.
        unsafe { self.base.add(32).cast::<u32>().read_volatile() }
    }

    /// Pushes that found their lane full, all lanes together.
    pub fn dropped_count(&self) -> u64 {
        (0..self.count()).map(|k| self.lane(k).dropped_count()).fold(0, u64::wrapping_add)
    }

    /// Slots claimed by producers, all lanes together.
    pub fn pushed_count(&self) -> u64 {
        (0..self.count()).map(|k| self.lane(k).pushed_count()).fold(0, u64::wrapping_add)
    }
}

/// Brings the pages of `len` bytes at `base` (inside a shared mapping of a region) into memory
/// without changing a byte: one `madvise(MADV_POPULATE_WRITE)` (Linux 5.14), else an atomic
/// add of zero to a word of each page (a write fault that races with no producer's store).
/// Whether the madvise did it.
///
/// # Safety
/// `base..base + len` must be mapped, readable and writable, page-aligned.
pub unsafe fn populate(base: *mut u8, len: usize) -> bool {
    // SAFETY: per the caller's contract; populating changes no data.
    if unsafe { libc::madvise(base.cast(), len, libc::MADV_POPULATE_WRITE) } == 0 {
        return true;
    }
    for off in (0..len).step_by(PAGE) {
        // SAFETY: a page-aligned word inside the mapping; adding zero changes nothing, and an
        // atomic read-modify-write cannot lose a producer's concurrent store.
        let _ = unsafe { &*base.add(off).cast::<AtomicU64>() }.fetch_add(0, Ordering::Relaxed);
    }
    false
}

/// The consumer's prefaulting of a region's lanes: the pages of the lanes about to be handed
/// out are brought into memory through the consumer's own mapping, so that a thread's first
/// event finds its lane's pages already allocated and zeroed (the region is one shared memfd:
/// the producer's first touch, its own `MADV_POPULATE_WRITE` in the shim, then only maps them,
/// which is much cheaper than allocating and clearing them).
///
/// Lanes are handed out in order (lane n to the n-th thread, see the shim's `assign_lane`), so
/// the consumer keeps lanes `0 .. assigned + SPARE_LANES` populated: one lane ahead of the
/// producer's published count. A region whose process never makes an event costs that one
/// lane (charged to the consumer, which faulted it); lanes no thread reaches cost nothing.
#[derive(Debug, Default)]
pub struct Prefault {
    populated: u32,
}

impl Prefault {
    /// Nothing populated yet.
    pub fn new() -> Prefault {
        Prefault { populated: 0 }
    }

    /// Populates the lanes up to `spare` beyond those handed out; the lanes populated now.
    pub fn ahead(&mut self, lanes: &Lanes, spare: u32) -> u32 {
        let want = lanes.assigned().saturating_add(spare).min(lanes.count() as u32);
        let mut n = 0;
        while self.populated < want {
            let (base, len) = lanes.lane_region(self.populated as usize);
            // SAFETY: lane `populated` lies inside the view's region, which the caller keeps
            // mapped read-write while it uses the view.
            unsafe { populate(base, len) };
            self.populated += 1;
            n += 1;
        }
        n
    }

    /// Lanes populated so far.
    pub fn populated(&self) -> u32 {
        self.populated
    }

    /// Whether every lane of `lanes` is populated (nothing left to do).
    pub fn done(&self, lanes: &Lanes) -> bool {
        self.populated as usize >= lanes.count()
    }
}

/// Slots one sweep looks at in one lane, at most.
const SWEEP_BATCH: u64 = 4096;
/// Events read ahead of the consumer's position in one lane, at most.
const MAX_HELD: u64 = 1 << 14;
/// Slots past an in-flight one that a sweep checks for published events.
const IN_FLIGHT_SCAN: u64 = 64;
/// How long a lane holds the others back while published events wait behind a slot another
/// producer claimed but has not published (that producer preempted, or killed, mid-push).
const IN_FLIGHT_PATIENCE: Duration = Duration::from_millis(20);

/// What a lane may still hide beyond the events read from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behind {
    /// Nothing: the last sweep found the lane's next slot free, or claimed by a producer with
    /// nothing published behind it.
    Nothing,
    /// Published events the last sweep left for later (batch or read-ahead limit).
    More,
    /// Published events behind a slot claimed but not yet published (since `Instant`, at ring
    /// position `u64`): a lane shared by several threads, one of them stopped mid-push.
    InFlight(u64, Instant),
}

/// The consumer's view of one lane.
#[derive(Clone, Copy, Debug)]
struct LaneState {
    /// The consumer's position (events emitted from this lane).
    head: u64,
    /// Published slots read up to here (`head..seen` are read and not yet emitted).
    seen: u64,
    /// Slots read before the latest sweep: `head..safe` may be emitted.
    safe: u64,
    behind: Behind,
}

/// The consumer's merge of one region's lanes into one stream in timestamp order that never
/// breaks causal order between threads.
///
/// Each pass sweeps every lane, noting which slots are published (their sequence words only),
/// then emits the read events smallest `ts_ns` first, straight from the rings (nothing is
/// copied aside: the consumer touches no more memory than the rings), under two rules:
///
/// - an event is emitted only after a later sweep: every lane has then been looked at after the
///   event was read, so whatever happened before it (published before its timestamp was taken)
///   has been read too, or sits beyond a batch limit or behind a claimed-but-unpublished slot;
/// - emission stops when a lane that may hide more (a batch limit, or published events behind a
///   slot in flight) has nothing read left: the hidden events were claimed after the read ones
///   but may still be older than other lanes' events. A slot in flight longer than
///   `IN_FLIGHT_PATIENCE` (a producer preempted mid-push for that long, or killed) stops holding
///   the others back.
///
/// A slot in flight with nothing published behind it holds nothing back: a push has no effect
/// another thread can see (no address handed out, none released) before it is published, so
/// nothing visible depends on it. A lane with one producer (the shim's round robin gives up to
/// K threads one each) therefore never holds the others back.
///
/// Why that keeps causal order: say thread B's event y depends on thread A's event x (A pushed x,
/// then B learned of it, e.g. got the pointer, and only then took y's timestamp). Then `ts_x <
/// ts_y` (the region's clock, `CLOCK_MONOTONIC` or the invariant TSC read after `lfence`, is one
/// clock for all CPUs, read only once every earlier load has completed; a region's timestamps
/// are all of one clock, see [`crate::clock`]), x was published before y was, so any
/// look at A's lane after y was read finds x or a slot claimed before x; and every event claimed
/// ahead of x in A's lane took its timestamp before it was claimed, so before `ts_y`. The merge
/// therefore reaches x, and everything ahead of it, before y. Events with no such link may come
/// out of timestamp order by the width of a push (both orders were possible).
///
/// Within a lane, events keep the ring's order.
#[derive(Debug)]
pub struct Merge {
    st: Vec<LaneState>,
    /// The timestamp of each lane's next read event, `u64::MAX` when none is read (one
    /// contiguous array to scan per run of events).
    front: Vec<u64>,
}

impl Merge {
    /// A merge for a region of `lanes` lanes.
    pub fn new(lanes: usize) -> Merge {
        let st = LaneState { head: 0, seen: 0, safe: 0, behind: Behind::Nothing };
        Merge { st: vec![st; lanes], front: vec![u64::MAX; lanes] }
    }

    /// Events read from the lanes and not yet emitted.
    pub fn held(&self) -> usize {
        self.st.iter().map(|l| (l.seen - l.head) as usize).sum()
    }

    /// Notes what each lane has published (at most `SWEEP_BATCH` slots per lane, `MAX_HELD`
    /// ahead of its head); the events newly read.
    fn sweep(&mut self, lanes: &Lanes) -> usize {
        self.sweep_with(lanes, SWEEP_BATCH, MAX_HELD, |_| {})
    }

    /// As `sweep` with limits `batch` and `ahead`, calling `between(k)` after lane `k` is
    /// visited (tests interleave pushes there).
    fn sweep_with(&mut self, lanes: &Lanes, batch: u64, ahead: u64, mut between: impl FnMut(usize)) -> usize {
        let mut read = 0;
        for (k, st) in self.st.iter_mut().enumerate() {
            let ring = lanes.lane(k);
            st.head = ring.consumed_count();
            let start = st.seen.max(st.head);
            let limit = start.saturating_add(batch).min(st.head.saturating_add(ahead));
            let mut p = start;
            while p < limit && ring.is_published(p) {
                p += 1;
            }
            read += (p - start) as usize;
            st.safe = start;
            st.seen = p;
            st.behind = if p >= limit {
                Behind::More
            } else {
                let tail = ring.claimed_count();
                let hidden = tail > p + 1 && (tail - p > IN_FLIGHT_SCAN || (p + 1..tail).any(|q| ring.is_published(q)));
                match st.behind {
                    _ if !hidden => Behind::Nothing,
                    Behind::InFlight(at, since) if at == p => Behind::InFlight(at, since),
                    _ => Behind::InFlight(p, Instant::now()),
                }
            };
            self.front[k] = if st.head < st.seen { ring.ts_at(st.head) } else { u64::MAX };
            between(k);
        }
        read
    }

    /// Whether lane `k`, all its read events emitted, may still hide events that must come
    /// first.
    fn blocks(&self, k: usize) -> bool {
        match self.st[k].behind {
            Behind::Nothing => false,
            Behind::More => true,
            Behind::InFlight(_, since) => since.elapsed() < IN_FLIGHT_PATIENCE,
        }
    }

    /// Emits read events in timestamp order while the rules allow, at most `limit`; the count
    /// and whether `out` wants more. `all`: no rule holds anything back.
    ///
    /// Runs: the lane with the smallest front emits while its front stays below every other
    /// lane's (one scan of the fronts per run, not per event: with one busy lane, one scan).
    fn emit(&mut self, lanes: &Lanes, limit: usize, all: bool, out: &mut impl FnMut(Event) -> bool) -> (usize, bool) {
        let mut n = 0;
        if !all && (0..self.st.len()).any(|k| self.st[k].head == self.st[k].seen && self.blocks(k)) {
            return (0, true);
        }
        while n < limit {
            // The smallest front (ts, lane), and the smallest of the other lanes' fronts; ties go
            // to the lower lane.
            let (mut best, mut next) = ((u64::MAX, usize::MAX), (u64::MAX, usize::MAX));
            for (k, &ts) in self.front.iter().enumerate() {
                if ts < best.0 {
                    next = best;
                    best = (ts, k);
                } else if ts < next.0 {
                    next = (ts, k);
                }
            }
            if best.0 == u64::MAX {
                // No lane has read events, or their fronts are stamped u64::MAX: lane order.
                match self.st.iter().position(|l| l.head < l.seen) {
                    Some(k) => best = (u64::MAX, k),
                    None => break,
                }
                next = (u64::MAX, usize::MAX);
            }
            let k = best.1;
            let ring = lanes.lane(k);
            let st = &mut self.st[k];
            while n < limit && st.head < st.seen && (self.front[k], k) < next {
                if !all && st.head >= st.safe {
                    return (n, true); // read in the latest sweep: wait for the next one
                }
                // Published (the sweep saw it) and not yet handed back: pop cannot miss.
                let Some(e) = ring.pop() else { break };
                st.head += 1;
                self.front[k] = if st.head < st.seen { ring.ts_at(st.head) } else { u64::MAX };
                n += 1;
                if !out(e) {
                    return (n, false);
                }
            }
            if !all && self.st[k].head == self.st[k].seen && self.blocks(k) {
                break;
            }
        }
        (n, true)
    }

    /// Drains the lanes into `out` in merged order, at most about `limit` events. `out` returns
    /// `false` to stop (the receiver is gone). Returns the events emitted and whether `out`
    /// wants more.
    ///
    /// Sweeps while lanes have a backlog, then once more to release what the last sweep read;
    /// events read by that one wait for the next call (chasing producers that keep pushing would
    /// only move the ring's cache lines back and forth between their cores and ours). `flush`:
    /// sweep until a sweep finds nothing, so that everything published before the call is emitted
    /// (unless published events wait behind a slot in flight): for a message that must not
    /// overtake those events.
    pub fn drain(&mut self, lanes: &Lanes, limit: usize, flush: bool, mut out: impl FnMut(Event) -> bool) -> (usize, bool) {
        debug_assert_eq!(lanes.count(), self.st.len());
        let mut emitted = 0;
        let mut caught_up = false;
        loop {
            let read = self.sweep(lanes);
            let (n, more) = self.emit(lanes, limit.saturating_sub(emitted), false, &mut out);
            emitted += n;
            if !more {
                return (emitted, false);
            }
            if read == 0 || emitted >= limit || caught_up {
                return (emitted, true);
            }
            caught_up = !flush && self.st.iter().all(|l| l.behind != Behind::More);
        }
    }

    /// Drains everything left (the producer is gone or the consumer is stopping): reads the
    /// lanes until they are empty (or, should a producer still be pushing, twice their capacity)
    /// and emits every event in timestamp order, waiting for nothing. The events emitted.
    pub fn finish(&mut self, lanes: &Lanes, mut out: impl FnMut(Event) -> bool) -> usize {
        let bound = (lanes.count() as u64).saturating_mul(lanes.lane_capacity()).saturating_mul(2);
        let mut read = 0u64;
        loop {
            let n = self.sweep_with(lanes, u64::MAX, u64::MAX, |_| {}) as u64;
            read = read.saturating_add(n);
            if n == 0 || read >= bound {
                break;
            }
        }
        self.emit(lanes, usize::MAX, true, &mut out).0
    }
}

/// A lanes region in process-private heap memory: for tests and benchmarks.
pub struct HeapLanes {
    mem: Vec<u64>,
    lanes: Lanes,
}

impl HeapLanes {
    /// `lanes` lanes of `capacity` events each (powers of two).
    pub fn new(lanes: u32, capacity: u64) -> HeapLanes {
        let len = region_bytes(lanes, capacity);
        let mut mem = vec![0u64; (len + PAGE) / 8];
        let raw = mem.as_mut_ptr().cast::<u8>();
        let aligned = raw.wrapping_add(raw.align_offset(PAGE));
        // SAFETY: `mem` holds len + a page of zeroed bytes, we align inside it, and it lives
        // (never reallocated) as long as the HeapLanes.
        match unsafe { Lanes::init(aligned, len, lanes, capacity, std::process::id()) } {
            Ok(lanes) => HeapLanes { mem, lanes },
            Err(e) => panic!("HeapLanes::new({lanes}, {capacity}): {e}"),
        }
    }

    /// The lanes view.
    pub fn lanes(&self) -> &Lanes {
        let _ = &self.mem;
        &self.lanes
    }

    /// The region's start and length (for attach tests).
    pub fn region(&self) -> (*mut u8, usize) {
        (self.lanes.base, region_bytes(self.lanes.count() as u32, self.lanes.capacity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    fn ev(ts: u64, tid: u32, addr: u64) -> Event {
        Event { ts_ns: ts, tid, addr, ..Event::new(EventKind::MemAlloc, 1, 0) }
    }

    fn collect(m: &mut Merge, l: &Lanes) -> Vec<Event> {
        let mut v = Vec::new();
        m.drain(l, usize::MAX, true, |e| {
            v.push(e);
            true
        });
        v
    }

    /// Pages of `len` bytes at `base` that are in memory (mincore).
    fn resident(base: *mut u8, len: usize) -> usize {
        let mut v = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: a page-aligned range of our own mapping; mincore fills one byte per page.
        assert_eq!(unsafe { libc::mincore(base.cast(), len, v.as_mut_ptr()) }, 0);
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn prefault_keeps_one_spare_lane_ahead_of_those_handed_out_and_changes_no_data() {
        let h = HeapLanes::new(4, 1 << 12);
        let l = h.lanes();
        let pages = l.lane_region(0).1 / PAGE;
        // A fresh lane is untouched beyond its header page.
        assert_eq!(resident(l.lane_region(1).0, l.lane_region(1).1), 1, "lane 1 before");
        let mut p = Prefault::new();
        assert_eq!(p.ahead(l, SPARE_LANES), 1, "nothing handed out yet: lane 0 made ready");
        assert_eq!(resident(l.lane_region(0).0, l.lane_region(0).1), pages, "lane 0 populated");
        assert_eq!(resident(l.lane_region(1).0, l.lane_region(1).1), 1, "lane 1 left alone");
        assert!(l.push(0, &ev(7, 1, 0x1000)));
        l.note_assigned(1);
        assert_eq!(p.ahead(l, SPARE_LANES), 1);
        assert_eq!(p.ahead(l, SPARE_LANES), 0, "nothing new handed out");
        assert_eq!(resident(l.lane_region(1).0, l.lane_region(1).1), pages, "lane 1 populated");
        assert_eq!(resident(l.lane_region(2).0, l.lane_region(2).1), 1, "lane 2 left alone");
        l.note_assigned(0); // never lowers the count
        l.note_assigned(100); // capped at the lane count
        assert_eq!(l.assigned(), 4);
        assert_eq!(p.ahead(l, SPARE_LANES), 2);
        assert!(p.done(l));
        assert_eq!(l.lane(0).pop().map(|e| (e.ts_ns, e.addr)), Some((7, 0x1000)), "populating changed no data");
    }

    #[test]
    fn lanes_by_thread_and_sums() {
        let h = HeapLanes::new(4, 2);
        let l = h.lanes();
        assert_eq!(l.count(), 4);
        for tid in 0..8 {
            assert!(l.push(tid, &ev(1, tid, 0)));
        }
        // Each lane of two slots got two events (tids k and k + 4): one more is dropped.
        assert!(!l.push(5, &ev(1, 5, 0)));
        assert_eq!(l.pushed_count(), 8);
        assert_eq!(l.dropped_count(), 1);
        assert_eq!(l.lane(1).pop().map(|e| e.tid), Some(1));
        assert_eq!(l.lane(1).pop().map(|e| e.tid), Some(5));
    }

    #[test]
    fn attach_derives_and_checks_everything() {
        let h = HeapLanes::new(8, 16);
        let (base, len) = h.region();
        // SAFETY: the HeapLanes region is mapped, page-aligned and `len` long.
        let l = unsafe { Lanes::attach(base, len) }.expect("attach");
        assert_eq!((l.count(), l.lane_capacity()), (8, 16));
        // SAFETY: as above, shorter lengths.
        assert_eq!(unsafe { Lanes::attach(base, len - 1) }.expect_err("refused"), RingError::BadSize);
        // SAFETY: as above.
        assert_eq!(unsafe { Lanes::attach(base, 100) }.expect_err("refused"), RingError::BadSize);
        // A header that lies about the lane count, the capacity or the stride.
        for (off, bad) in [(12usize, 3u64), (12, 16), (16, 32), (16, 1 << 40), (24, 8192)] {
            // SAFETY: writing inside the header of our own region, then restoring it.
            unsafe {
                let p = base.add(off);
                if off == 12 {
                    let old = p.cast::<u32>().read();
                    p.cast::<u32>().write(bad as u32);
                    assert!(Lanes::attach(base, len).is_err(), "lanes {bad}");
                    p.cast::<u32>().write(old);
                } else {
                    let old = p.cast::<u64>().read();
                    p.cast::<u64>().write(bad);
                    assert!(Lanes::attach(base, len).is_err(), "offset {off} = {bad}");
                    p.cast::<u64>().write(old);
                }
            }
        }
        // A lane whose own header is foreign.
        // SAFETY: inside lane 3's header, restored after.
        unsafe {
            let p = base.add(LANES_HEADER_BYTES + 3 * lane_stride(16));
            let old = p.cast::<u64>().read();
            p.cast::<u64>().write(0);
            assert_eq!(Lanes::attach(base, len).expect_err("refused"), RingError::BadHeader);
            p.cast::<u64>().write(old);
        }
        // SAFETY: as above.
        assert!(unsafe { Lanes::attach(base, len) }.is_ok());
    }

    #[test]
    fn merge_orders_by_timestamp_across_lanes_and_waits_one_sweep() {
        let h = HeapLanes::new(4, 64);
        let l = h.lanes();
        let mut m = Merge::new(4);
        for (ts, tid) in [(10, 0), (30, 0), (20, 1), (25, 2), (5, 3), (40, 3)] {
            l.push(tid, &ev(ts, tid, ts));
        }
        let got: Vec<u64> = collect(&mut m, l).iter().map(|e| e.ts_ns).collect();
        assert_eq!(got, [5, 10, 20, 25, 30, 40]);
        assert_eq!(m.held(), 0);
    }

    /// Thread A's event lands in lane 0 just after the sweep looked there; thread B, having seen
    /// A's effect, pushes a later event into lane 1, which the same sweep reads. B's event must
    /// wait for a sweep that has looked at lane 0 again.
    #[test]
    fn an_event_read_late_in_a_sweep_waits_for_the_next() {
        let h = HeapLanes::new(2, 8);
        let l = h.lanes();
        let mut m = Merge::new(2);
        let read = m.sweep_with(l, SWEEP_BATCH, MAX_HELD, |k| {
            if k == 0 {
                l.push(0, &ev(10, 0, 1)); // A: the allocation
                l.push(1, &ev(20, 1, 1)); // B: the free of A's pointer
            }
        });
        assert_eq!(read, 1);
        let mut v = Vec::new();
        let mut out = |e: Event| {
            v.push(e.ts_ns);
            true
        };
        assert_eq!(m.emit(l, usize::MAX, false, &mut out), (0, true), "B's event was read in the latest sweep");
        assert_eq!(m.sweep(l), 1);
        m.emit(l, usize::MAX, false, &mut out);
        m.sweep(l);
        m.emit(l, usize::MAX, false, &mut out);
        assert_eq!(v, [10, 20]);
    }

    #[test]
    fn a_slot_in_flight_alone_holds_nothing_back() {
        let h = HeapLanes::new(2, 8);
        let l = h.lanes();
        let mut m = Merge::new(2);
        l.push(1, &ev(50, 1, 0));
        // Lane 0's one producer claimed a slot and has not published it yet: nothing can
        // depend on an event no one can see yet.
        l.lane(0).claim_for_test();
        assert_eq!(collect(&mut m, l).len(), 1);
    }

    #[test]
    fn published_events_behind_a_slot_in_flight_hold_the_others_back() {
        let h = HeapLanes::new(2, 8);
        let l = h.lanes();
        let mut m = Merge::new(2);
        l.push(1, &ev(50, 1, 0));
        // Lane 0 is shared: one producer stopped mid-push, another published behind it.
        l.lane(0).claim_for_test();
        l.push(0, &ev(40, 0, 0));
        assert!(collect(&mut m, l).is_empty(), "lane 1's event waits for what lane 0 hides");
        assert_eq!(m.held(), 1);
        std::thread::sleep(IN_FLIGHT_PATIENCE + Duration::from_millis(5));
        assert_eq!(collect(&mut m, l).len(), 1, "a slot in flight too long stops holding back");
        // finish() waits for nothing either (the event behind the stuck slot stays there).
        l.push(1, &ev(60, 1, 0));
        let mut v = Vec::new();
        m.finish(l, |e| {
            v.push(e);
            true
        });
        assert_eq!(v.len(), 1);
    }

    /// Threads hand "pointers" to each other: thread t allocates (pushes), passes the pointer to
    /// thread t + 1 through a shared slot, which frees it (pushes). Whatever the interleaving, the
    /// merged stream never shows a free before its allocation.
    #[test]
    fn merged_stream_keeps_causal_order_between_threads() {
        const THREADS: usize = 4;
        const PER: u64 = 5_000;
        let h = Arc::new(HeapLanes::new(8, 256));
        let clock = Arc::new(AtomicU64::new(1));
        let mailbox: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (h, clock, mailbox) = (Arc::clone(&h), Arc::clone(&clock), Arc::clone(&mailbox));
                std::thread::spawn(move || {
                    let mut sent = 0;
                    let mut received = 0;
                    let next = &mailbox[(t + 1) % THREADS];
                    let mine = &mailbox[t];
                    while sent < PER || received < PER {
                        let mut idle = true;
                        if sent < PER && next.load(Ordering::Acquire) == 0 {
                            idle = false;
                            let p = ((t as u64) << 32) | (sent + 1);
                            let ts = clock.fetch_add(1, Ordering::SeqCst);
                            while !h.lanes().push(t as u32, &ev(ts, t as u32, p)) {
                                std::hint::spin_loop();
                            }
                            next.store(p, Ordering::Release);
                            sent += 1;
                        }
                        let p = mine.load(Ordering::Acquire);
                        if p != 0 {
                            let ts = clock.fetch_add(1, Ordering::SeqCst);
                            let free = Event { kind: EventKind::MemFree as u16, ..ev(ts, t as u32, p) };
                            while !h.lanes().push(t as u32, &free) {
                                std::hint::spin_loop();
                            }
                            mine.store(0, Ordering::Release);
                            received += 1;
                            idle = false;
                        }
                        if idle {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let consumer = {
            let (h, done) = (Arc::clone(&h), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut m = Merge::new(8);
                let mut live = std::collections::HashSet::new();
                let (mut allocs, mut frees) = (0u64, 0u64);
                let mut check = |e: Event| {
                    if e.kind() == Some(EventKind::MemFree) {
                        assert!(live.remove(&e.addr), "free of {:#x} before its allocation", e.addr);
                        frees += 1;
                    } else {
                        assert!(live.insert(e.addr));
                        allocs += 1;
                    }
                    true
                };
                while !done.load(Ordering::Acquire) {
                    if m.drain(h.lanes(), 4096, false, &mut check).0 == 0 {
                        std::thread::yield_now();
                    }
                }
                m.finish(h.lanes(), &mut check);
                (allocs, frees)
            })
        };
        for w in workers {
            w.join().expect("worker");
        }
        done.store(true, Ordering::Release);
        let (allocs, frees) = consumer.join().expect("consumer");
        assert_eq!((allocs, frees), (THREADS as u64 * PER, THREADS as u64 * PER));
    }
}
