//! The event ring: a bounded multi-producer, single-consumer queue of [`Event`]s laid out in one
//! shared-memory region (a memfd the traced process creates and hands to the consumer). A traced
//! process has several rings, "lanes" (see [`crate::lanes`]): each thread pushes into the lane of
//! its thread id, so threads rarely share a `tail` word; one lane is one `Ring`.
//!
//! Producers are the traced process's threads inside CUDA hooks, so a push never blocks, never
//! allocates and never makes a syscall: it claims a slot with one compare-and-swap on `tail`
//! (Dmitry Vyukov's bounded queue: each slot carries a sequence number that says whose turn it
//! is), copies the 80-byte event, and publishes it with a release store. When the ring is full
//! (the consumer is slow, stalled or gone) the event is dropped and `dropped` counted; the
//! consumer turns that count into `Dropped` events so every figure says it is inexact.
//!
//! Sequence words are stored relative to their slot: a slot at index `i` stores Vyukov's
//! sequence minus `i`, so all-zero memory is a fresh ring. Laying a ring out writes only its
//! header, and a slot's page is first touched when an event lands in it (a 16-lane region of
//! which a process uses two lanes costs the memory of two).
//!
//! The consumer trusts nothing in the region beyond what it checks: the capacity comes from the
//! region's size, and every event goes through the address map's own checks.
//!
//! Layout (little-endian, offsets in bytes):
//! ```text
//!   0  magic "GFRING01"     8  version u32   12  slot size u32   16  capacity u64   24  pid u32
//!  64  tail  (AtomicU64: slots claimed by producers, own cache line)
//! 128  head  (AtomicU64: slots consumed, written by the consumer, own cache line)
//! 192  dropped (AtomicU64: pushes that found the ring full)
//! 256  slots: capacity × { seq - index: AtomicU64, event: [u8; 80] }
//! ```

use crate::event::{Event, EVENT_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};

/// First 8 bytes of a ring region.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"GFRING01");
/// Layout version (2: sequence words relative to their slot, zero = fresh).
pub const RING_VERSION: u32 = 2;
/// Bytes before the first slot.
pub const HEADER_BYTES: usize = 256;
/// Bytes per slot: the sequence word and one event.
pub const SLOT_BYTES: usize = 8 + EVENT_SIZE;
/// A ring of 64 Ki events (5.5 MiB). The shim's region default is
/// [`crate::lanes::DEFAULT_TOTAL_CAPACITY`] over [`crate::lanes::DEFAULT_LANES`] lanes.
pub const DEFAULT_CAPACITY: u64 = 1 << 16;

const OFF_TAIL: usize = 64;
const OFF_HEAD: usize = 128;
const OFF_DROPPED: usize = 192;

/// Bytes a ring of `capacity` slots needs.
pub const fn region_bytes(capacity: u64) -> usize {
    HEADER_BYTES + capacity as usize * SLOT_BYTES
}

/// A view of a ring region. It does not own the memory: the creator maps and unmaps it.
#[derive(Clone, Copy, Debug)]
pub struct Ring {
    base: *mut u8,
    capacity: u64,
}

// SAFETY: every access to the shared region goes through atomics or through slots whose
// ownership the sequence protocol hands to exactly one thread at a time.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// Why a region is not a usable ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Too small, or the capacity is not a power of two that fits the region.
    BadSize,
    /// The header's magic, version or slot size is not ours.
    BadHeader,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::BadSize => f.write_str("event ring region has an impossible size"),
            RingError::BadHeader => f.write_str("event ring region has a foreign header"),
        }
    }
}

impl std::error::Error for RingError {}

impl Ring {
    /// Lays out a fresh ring in `len` zeroed bytes at `base` (the producer side, once). Only the
    /// header is written: zeroed slots are already a fresh ring's.
    ///
    /// # Safety
    /// `base` must point to `len` writable bytes, 64-byte aligned (a fresh mapping is), whose
    /// slots (from byte 256 on) are all zero, that stay mapped while any `Ring` view of them is
    /// used, and nobody else may use them yet.
    pub unsafe fn init(base: *mut u8, len: usize, capacity: u64, pid: u32) -> Result<Ring, RingError> {
        if !capacity.is_power_of_two() || capacity < 2 || len < region_bytes(capacity) || !(base as usize).is_multiple_of(64) {
            return Err(RingError::BadSize);
        }
        let ring = Ring { base, capacity };
        // SAFETY: the caller gives us exclusive use of `len` bytes; all offsets are inside them.
        unsafe {
            base.cast::<u64>().write(RING_MAGIC);
            base.add(8).cast::<u32>().write(RING_VERSION);
            base.add(12).cast::<u32>().write(SLOT_BYTES as u32);
            base.add(16).cast::<u64>().write(capacity);
            base.add(24).cast::<u32>().write(pid);
        }
        ring.tail().store(0, Ordering::Relaxed);
        ring.head().store(0, Ordering::Relaxed);
        ring.dropped().store(0, Ordering::Release);
        Ok(ring)
    }

    /// Views a ring another process laid out (the consumer side). The capacity is derived from
    /// `len`, never taken on trust from the header.
    ///
    /// # Safety
    /// `base` must point to `len` readable and writable bytes, 64-byte aligned, that stay mapped
    /// while the view is used.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Ring, RingError> {
        if len < HEADER_BYTES + SLOT_BYTES || !(base as usize).is_multiple_of(64) {
            return Err(RingError::BadSize);
        }
        // SAFETY: `len` covers the header.
        let (magic, version, slot, cap) = unsafe {
            (
                base.cast::<u64>().read_volatile(),
                base.add(8).cast::<u32>().read_volatile(),
                base.add(12).cast::<u32>().read_volatile(),
                base.add(16).cast::<u64>().read_volatile(),
            )
        };
        if magic != RING_MAGIC || version != RING_VERSION || slot as usize != SLOT_BYTES {
            return Err(RingError::BadHeader);
        }
        let fits = ((len - HEADER_BYTES) / SLOT_BYTES) as u64;
        if !cap.is_power_of_two() || cap < 2 || cap > fits {
            return Err(RingError::BadSize);
        }
        Ok(Ring { base, capacity: cap })
    }

    fn atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the header's 8-byte aligned words or a slot's sequence word,
        // inside the region the constructor checked; AtomicU64 has u64's layout.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }
    fn tail(&self) -> &AtomicU64 {
        self.atomic(OFF_TAIL)
    }
    fn head(&self) -> &AtomicU64 {
        self.atomic(OFF_HEAD)
    }
    fn dropped(&self) -> &AtomicU64 {
        self.atomic(OFF_DROPPED)
    }
    fn slot_off(&self, pos: u64) -> usize {
        HEADER_BYTES + (pos & (self.capacity - 1)) as usize * SLOT_BYTES
    }
    /// The sequence word of `pos`'s slot, which stores Vyukov's sequence minus the slot index.
    fn seq(&self, pos: u64) -> &AtomicU64 {
        self.atomic(self.slot_off(pos))
    }
    /// `pos` less its slot index: what a slot's word holds when it is free for the producer of
    /// `pos` (Vyukov's `seq == pos`); `+ 1` once that producer published (`seq == pos + 1`).
    #[inline]
    fn lap(&self, pos: u64) -> u64 {
        pos & !(self.capacity - 1)
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The pid the producer wrote into the header.
    pub fn producer_pid(&self) -> u32 {
        // SAFETY: inside the checked header.
        unsafe { self.base.add(24).cast::<u32>().read_volatile() }
    }

    /// Pushes one event; `false` (and `dropped` counted) when the ring is full. Never blocks.
    #[inline]
    pub fn push(&self, ev: &Event) -> bool {
        let tail = self.tail();
        let mut pos = tail.load(Ordering::Relaxed);
        loop {
            let seq = self.seq(pos).load(Ordering::Acquire);
            let dif = seq.wrapping_sub(self.lap(pos)) as i64;
            if dif == 0 {
                match tail.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                self.dropped().fetch_add(1, Ordering::Relaxed);
                return false;
            } else {
                pos = tail.load(Ordering::Relaxed);
            }
        }
        let off = self.slot_off(pos) + 8;
        // SAFETY: the successful CAS made this slot ours until the release store below; the
        // event bytes lie inside the slot.
        unsafe { write_event(self.base.add(off), ev) };
        self.seq(pos).store(self.lap(pos).wrapping_add(1), Ordering::Release);
        true
    }

    /// Pushes one event from the ring's only producer; `false` (and `dropped` counted) when the
    /// ring is full. Never blocks. `limit` is the producer's own memory of how far it may go
    /// (start it at 0; keep one per ring).
    ///
    /// The same slots as [`Ring::push`], claimed without its two costs on x86: the
    /// compare-and-swap on `tail` (a locked instruction waits until every earlier store has
    /// reached the cache, and the previous event's slot lines usually miss: each is written once
    /// per lap) and the load of the slot's sequence word (the consumer wrote that line last, when
    /// it freed the slot, so the load is a miss to another core on the critical path). A plain
    /// store claims the slot, and whether it is free comes from the consumer's `head`, read only
    /// when `limit` is reached: once per lap or so.
    ///
    /// # Safety
    /// No other thread may push into this ring, by either method, for as long as this one does.
    #[inline]
    pub unsafe fn push_single(&self, ev: &Event, limit: &std::cell::Cell<u64>) -> bool {
        let tail = self.tail();
        let pos = tail.load(Ordering::Relaxed);
        if pos >= limit.get() {
            // Acquire: pairs with the Release of `pop`'s head store, so the consumer's read of the
            // slot (and its freeing) happened before this producer writes it again.
            let free_until = self.head().load(Ordering::Acquire).wrapping_add(self.capacity);
            limit.set(free_until);
            if pos >= free_until {
                self.dropped().fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        tail.store(pos.wrapping_add(1), Ordering::Relaxed);
        let off = self.slot_off(pos) + 8;
        // SAFETY: slot `pos` was freed by the consumer (head passed pos − capacity) and this is its
        // only producer; the event bytes lie inside the slot.
        unsafe { write_event(self.base.add(off), ev) };
        self.seq(pos).store(self.lap(pos).wrapping_add(1), Ordering::Release);
        self.prefetch_slot(pos.wrapping_add(1));
        true
    }

    /// Asks for `pos`'s slot lines to be brought into this core's cache for writing, so that the
    /// next push stores into lines it owns instead of queueing misses (a slot is written once per
    /// lap: it is cold by the time its producer comes back). A hint only: no fault, no ordering.
    #[inline(always)]
    fn prefetch_slot(&self, pos: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let first = self.base.wrapping_add(self.slot_off(pos));
            prefetch_for_write(first, first.wrapping_add(SLOT_BYTES - 1));
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = pos;
    }

    /// The head position if its slot is published (single consumer only).
    #[inline]
    fn published_head(&self) -> Option<u64> {
        let pos = self.head().load(Ordering::Relaxed);
        let seq = self.seq(pos).load(Ordering::Acquire);
        (seq == self.lap(pos).wrapping_add(1)).then_some(pos)
    }

    /// The event in slot `pos`. No text travels on a ring: a `text_len` the producer wrote is
    /// cleared, so that no reader waits for text that is not there.
    fn read_slot(&self, pos: u64) -> Event {
        let off = self.slot_off(pos) + 8;
        // SAFETY: the caller's acquire load saw the producer's release: the slot holds a whole
        // event and stays ours until the consumer hands it back.
        let e = unsafe { read_event(self.base.add(off)) };
        Event { text_len: 0, ..e }
    }

    /// Pops the next event if one is published (single consumer only).
    pub fn pop(&self) -> Option<Event> {
        let pos = self.published_head()?;
        let ev = self.read_slot(pos);
        self.seq(pos).store(self.lap(pos).wrapping_add(self.capacity), Ordering::Release);
        // Release: a single producer learns from `head` alone that the slot is free again.
        self.head().store(pos.wrapping_add(1), Ordering::Release);
        Some(ev)
    }

    /// The next event if one is published, left in the ring (single consumer only).
    pub fn peek(&self) -> Option<Event> {
        self.published_head().map(|pos| self.read_slot(pos))
    }

    /// Whether producers have claimed slots the consumer has not popped (single consumer only).
    /// Right after `pop` found nothing, `true` means an event is in flight: claimed, not yet
    /// published (or published since), and whatever was pushed behind it waits for it.
    pub fn has_claimed_unread(&self) -> bool {
        self.tail().load(Ordering::Acquire) != self.head().load(Ordering::Relaxed)
    }

    /// A view of a ring already laid out at `base`.
    ///
    /// # Safety
    /// `base` must be a ring that `init` or `attach` accepted with this `capacity`, mapped while
    /// the view is used.
    #[inline]
    pub(crate) unsafe fn from_raw(base: *mut u8, capacity: u64) -> Ring {
        Ring { base, capacity }
    }

    /// Claims the tail slot without publishing it, as a producer stopped mid-push would.
    #[cfg(test)]
    pub(crate) fn claim_for_test(&self) {
        self.tail().fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the slot of `pos` holds a published event of that position (single consumer,
    /// for `pos` between its position and the tail). Acquire: the event is then readable.
    #[inline]
    pub(crate) fn is_published(&self, pos: u64) -> bool {
        self.seq(pos).load(Ordering::Acquire) == self.lap(pos).wrapping_add(1)
    }

    /// The timestamp of the event at `pos`, which `is_published` said is published and the
    /// consumer has not handed back.
    #[inline]
    pub(crate) fn ts_at(&self, pos: u64) -> u64 {
        // SAFETY: inside the slot; the acquire in `is_published` made the producer's write
        // visible, and the slot stays the consumer's until `pop` hands it back.
        u64::from_le(unsafe { self.base.add(self.slot_off(pos) + 8).cast::<u64>().read_unaligned() })
    }

    /// Slots claimed by producers (the tail), acquire.
    #[inline]
    pub(crate) fn claimed_count(&self) -> u64 {
        self.tail().load(Ordering::Acquire)
    }

    /// The consumer's position (events consumed since the ring was laid out).
    pub fn consumed_count(&self) -> u64 {
        self.head().load(Ordering::Relaxed)
    }

    /// Pushes that found the ring full, since it was laid out.
    pub fn dropped_count(&self) -> u64 {
        self.dropped().load(Ordering::Relaxed)
    }

    /// Slots claimed by producers since the ring was laid out.
    pub fn pushed_count(&self) -> u64 {
        self.tail().load(Ordering::Relaxed)
    }
}

/// Writes `ev`'s 80 wire bytes at `p`. On a little-endian machine the `#[repr(C)]` record, which
/// has no padding the compiler chose, is its wire bytes: one copy, no encoding.
///
/// # Safety
/// `p` must be valid for writing 80 bytes.
#[inline(always)]
unsafe fn write_event(p: *mut u8, ev: &Event) {
    #[cfg(target_endian = "little")]
    // SAFETY: per the caller; Event is plain integers (any alignment with write_unaligned).
    unsafe {
        p.cast::<Event>().write_unaligned(*ev)
    };
    #[cfg(not(target_endian = "little"))]
    // SAFETY: per the caller.
    unsafe {
        p.cast::<[u8; EVENT_SIZE]>().write_unaligned(ev.to_bytes())
    };
}

/// Write prefetches of the lines of `a` and `b` (`prefetchw` where the CPU has it, else read
/// prefetches into every level; the CPU is asked once per process). Prefetches never fault, so
/// neither address need be mapped.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_for_write(a: *const u8, b: *const u8) {
    /// 0: not yet asked, 1: no `prefetchw`, 2: `prefetchw` (CPUID 0x8000_0001 ECX bit 8, PRFCHW).
    static PRFCHW: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let mut has = PRFCHW.load(Ordering::Relaxed);
    if has == 0 {
        // SAFETY: leaf 0x8000_0001 exists on every x86_64 CPU (it carries the long-mode bit).
        // (`__cpuid` is a safe function in newer Rust, unsafe in older.)
        #[allow(unused_unsafe)]
        let ecx = unsafe { std::arch::x86_64::__cpuid(0x8000_0001) }.ecx;
        has = if ecx & (1 << 8) != 0 { 2 } else { 1 };
        PRFCHW.store(has, Ordering::Relaxed);
    }
    if has == 2 {
        // SAFETY: a prefetch is a hint: it reads nothing architecturally and cannot fault.
        unsafe {
            std::arch::asm!("prefetchw byte ptr [{}]", "prefetchw byte ptr [{}]", in(reg) a, in(reg) b, options(nostack, readonly, preserves_flags))
        };
    } else {
        // SAFETY: as above; SSE is part of x86_64.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(a.cast());
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(b.cast());
        }
    }
}

/// Reads the event whose 80 wire bytes are at `p` (see `write_event`).
///
/// # Safety
/// `p` must be valid for reading 80 bytes.
#[inline(always)]
unsafe fn read_event(p: *const u8) -> Event {
    #[cfg(target_endian = "little")]
    // SAFETY: per the caller; every bit pattern is a valid Event (plain integers).
    return unsafe { p.cast::<Event>().read_unaligned() };
    #[cfg(not(target_endian = "little"))]
    // SAFETY: per the caller.
    return Event::from_bytes(unsafe { &p.cast::<[u8; EVENT_SIZE]>().read_unaligned() });
}

// The wire layout `write_event` relies on: fields at their `to_bytes` offsets, nothing between.
const _: () = {
    assert!(std::mem::offset_of!(Event, device_free) == 48);
    assert!(std::mem::offset_of!(Event, pid) == 56);
    assert!(std::mem::offset_of!(Event, kind) == 64);
    assert!(std::mem::offset_of!(Event, rc) == 68);
    assert!(std::mem::offset_of!(Event, op) == 76);
    assert!(std::mem::offset_of!(Event, text_len) == 78);
};

/// A ring in process-private heap memory: for tests and benchmarks of the protocol.
pub struct HeapRing {
    mem: Vec<AtomicU64>,
    ring: Ring,
}

impl HeapRing {
    /// A ring of `capacity` (a power of two) slots.
    pub fn new(capacity: u64) -> HeapRing {
        let words = region_bytes(capacity).div_ceil(8) + 8;
        let mut mem: Vec<AtomicU64> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let raw = mem.as_mut_ptr().cast::<u8>();
        let aligned = raw.wrapping_add(raw.align_offset(64));
        // SAFETY: `mem` holds region_bytes + 64 bytes, we align inside it, and it lives (never
        // reallocated) as long as the HeapRing.
        let ring = unsafe { Ring::init(aligned, region_bytes(capacity), capacity, std::process::id()) };
        match ring {
            Ok(ring) => HeapRing { mem, ring },
            Err(e) => panic!("HeapRing::new({capacity}): {e}"),
        }
    }

    /// The ring view.
    pub fn ring(&self) -> &Ring {
        let _ = &self.mem;
        &self.ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;
    use std::sync::Arc;

    fn ev(i: u64) -> Event {
        Event { addr: i, ..Event::new(EventKind::MemAlloc, 1, 0) }
    }

    #[test]
    fn fifo_then_full_then_drains() {
        let h = HeapRing::new(4);
        let r = h.ring();
        for i in 0..4 {
            assert!(r.push(&ev(i)));
        }
        assert!(!r.push(&ev(99)));
        assert_eq!(r.dropped_count(), 1);
        for i in 0..4 {
            assert_eq!(r.pop().map(|e| e.addr), Some(i));
        }
        assert_eq!(r.pop(), None);
        assert!(r.push(&ev(5)));
        assert_eq!(r.pop().map(|e| e.addr), Some(5));
    }

    /// The single-producer push keeps the slot protocol: FIFO, full drops and counts, laps wrap,
    /// and a consumer on another thread sees every event of a producer thread in order.
    #[test]
    fn single_producer_push_keeps_the_protocol() {
        let h = HeapRing::new(4);
        let r = h.ring();
        let limit = std::cell::Cell::new(0);
        for lap in 0..3u64 {
            for i in 0..4 {
                // SAFETY: this thread is the ring's only producer.
                assert!(unsafe { r.push_single(&ev(lap * 10 + i), &limit) });
            }
            // SAFETY: as above.
            assert!(!unsafe { r.push_single(&ev(99), &limit) });
            for i in 0..4 {
                assert_eq!(r.pop().map(|e| e.addr), Some(lap * 10 + i));
            }
        }
        assert_eq!((r.dropped_count(), r.pushed_count()), (3, 12));

        let h = Arc::new(HeapRing::new(64));
        let p = Arc::clone(&h);
        const N: u64 = 200_000;
        let producer = std::thread::spawn(move || {
            let mut dropped = 0;
            let limit = std::cell::Cell::new(0);
            for i in 0..N {
                // SAFETY: the only producer.
                while !unsafe { p.ring().push_single(&ev(i), &limit) } {
                    dropped += 1;
                    std::hint::spin_loop();
                }
            }
            dropped
        });
        let mut next = 0;
        while next < N {
            if let Some(e) = h.ring().pop() {
                assert_eq!(e.addr, next);
                next += 1;
            }
        }
        let dropped = producer.join().unwrap();
        assert_eq!(h.ring().dropped_count(), dropped);
    }

    #[test]
    fn peek_leaves_the_event_and_laps_wrap() {
        let h = HeapRing::new(2);
        let r = h.ring();
        assert_eq!(r.peek(), None);
        assert!(!r.has_claimed_unread());
        // Many laps round a two-slot ring: the slot-relative sequence words stay consistent.
        for i in 0..1000 {
            assert!(r.push(&ev(2 * i)));
            assert!(r.push(&ev(2 * i + 1)));
            assert!(!r.push(&ev(0)));
            assert!(r.has_claimed_unread());
            assert_eq!(r.peek().map(|e| e.addr), Some(2 * i));
            assert_eq!(r.peek().map(|e| e.addr), Some(2 * i));
            assert_eq!(r.pop().map(|e| e.addr), Some(2 * i));
            assert_eq!(r.pop().map(|e| e.addr), Some(2 * i + 1));
            assert_eq!(r.peek(), None);
        }
        assert_eq!((r.pushed_count(), r.consumed_count(), r.dropped_count()), (2000, 2000, 1000));
        // A claimed, unpublished slot: nothing to pop, but something is in flight.
        r.claim_for_test();
        assert_eq!(r.pop(), None);
        assert!(r.has_claimed_unread());
    }

    #[test]
    fn a_slot_holds_the_wire_bytes() {
        let h = HeapRing::new(4);
        let r = h.ring();
        let e = Event {
            ts_ns: 0x0102_0304_0506_0708,
            addr: 0x1112_1314_1516_1718,
            size: 3,
            requested: 4,
            handle: 5,
            stream: 6,
            device_free: 7,
            pid: 8,
            tid: 9,
            kind: 10,
            device: -2,
            rc: -3,
            flags: 0x8000_0001,
            op: 12,
            text_len: 0,
        };
        assert!(r.push(&e));
        // SAFETY: slot 0's event bytes, inside the HeapRing's region.
        let raw = unsafe { r.base.add(HEADER_BYTES + 8).cast::<[u8; EVENT_SIZE]>().read_unaligned() };
        assert_eq!(raw, e.to_bytes());
        assert_eq!(r.pop(), Some(e));
    }

    #[test]
    fn attach_checks_the_header_and_derives_capacity_from_the_size() {
        let h = HeapRing::new(8);
        let base = h.ring().base;
        // SAFETY: the HeapRing's region is mapped and 64-byte aligned.
        let r = unsafe { Ring::attach(base, region_bytes(8)) }.expect("attach");
        assert_eq!(r.capacity(), 8);
        // SAFETY: as above, with a length that is too short for the claimed capacity.
        assert_eq!(unsafe { Ring::attach(base, region_bytes(4)) }.expect_err("refused"), RingError::BadSize);
    }

    #[test]
    fn many_producers_lose_nothing_they_did_not_count() {
        let h = Arc::new(HeapRing::new(1024));
        let threads = 8;
        let per = 20_000u64;
        let producers: Vec<_> = (0..threads)
            .map(|t| {
                let h = Arc::clone(&h);
                std::thread::spawn(move || {
                    let mut ok = 0u64;
                    for i in 0..per {
                        if h.ring().push(&Event { addr: (t << 32) | i, ..ev(0) }) {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut got = 0u64;
        let mut last = vec![None::<u64>; threads as usize];
        let mut done = 0;
        let mut pushed = 0;
        let mut handles = producers.into_iter().map(Some).collect::<Vec<_>>();
        while done < threads {
            while let Some(e) = h.ring().pop() {
                let (t, i) = ((e.addr >> 32) as usize, e.addr & 0xffff_ffff);
                // per-producer order is preserved
                assert!(last[t].is_none_or(|l| l < i), "producer {t}: {i} after {:?}", last[t]);
                last[t] = Some(i);
                got += 1;
            }
            for slot in handles.iter_mut() {
                if slot.as_ref().is_some_and(|j| j.is_finished()) {
                    if let Some(j) = slot.take() {
                        pushed += j.join().expect("producer");
                        done += 1;
                    }
                }
            }
        }
        while h.ring().pop().is_some() {
            got += 1;
        }
        assert_eq!(got, pushed);
        assert_eq!(got + h.ring().dropped_count(), threads * per);
    }
}
