//! The event ring: a bounded multi-producer, single-consumer queue of [`Event`]s laid out in one
//! shared-memory region (a memfd the traced process creates and hands to the consumer).
//!
//! Producers are the traced process's threads inside CUDA hooks, so a push never blocks, never
//! allocates and never makes a syscall: it claims a slot with one compare-and-swap on `tail`
//! (Dmitry Vyukov's bounded queue: each slot carries a sequence number that says whose turn it
//! is), copies the 80-byte event, and publishes it with a release store. When the ring is full
//! (the consumer is slow, stalled or gone) the event is dropped and `dropped` counted; the
//! consumer turns that count into `Dropped` events so every figure says it is inexact.
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
//! 256  slots: capacity × { seq: AtomicU64, event: [u8; 80] }
//! ```

use crate::event::{Event, EVENT_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};

/// First 8 bytes of a ring region.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"GFRING01");
/// Layout version.
pub const RING_VERSION: u32 = 1;
/// Bytes before the first slot.
pub const HEADER_BYTES: usize = 256;
/// Bytes per slot: the sequence word and one event.
pub const SLOT_BYTES: usize = 8 + EVENT_SIZE;
/// The default capacity: 64 Ki events (5.5 MiB).
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
    /// Lays out a fresh ring in `len` zeroed bytes at `base` (the producer side, once).
    ///
    /// # Safety
    /// `base` must point to `len` writable bytes, 64-byte aligned (a fresh mapping is), that
    /// stay mapped while any `Ring` view of them is used, and nobody else may use them yet.
    pub unsafe fn init(base: *mut u8, len: usize, capacity: u64, pid: u32) -> Result<Ring, RingError> {
        if !capacity.is_power_of_two() || len < region_bytes(capacity) || (base as usize) % 64 != 0 {
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
        for i in 0..capacity {
            ring.seq(i).store(i, Ordering::Relaxed);
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
        if len < HEADER_BYTES + SLOT_BYTES || (base as usize) % 64 != 0 {
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
        if !cap.is_power_of_two() || cap > fits {
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
    fn seq(&self, pos: u64) -> &AtomicU64 {
        self.atomic(self.slot_off(pos))
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
    pub fn push(&self, ev: &Event) -> bool {
        let tail = self.tail();
        let mut pos = tail.load(Ordering::Relaxed);
        loop {
            let seq = self.seq(pos).load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos) as i64;
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
        unsafe { self.base.add(off).cast::<[u8; EVENT_SIZE]>().write_unaligned(ev.to_bytes()) };
        self.seq(pos).store(pos.wrapping_add(1), Ordering::Release);
        true
    }

    /// Pops the next event if one is published (single consumer only).
    pub fn pop(&self) -> Option<Event> {
        let head = self.head();
        let pos = head.load(Ordering::Relaxed);
        let seq = self.seq(pos).load(Ordering::Acquire);
        if seq != pos.wrapping_add(1) {
            return None;
        }
        let off = self.slot_off(pos) + 8;
        // SAFETY: the acquire load saw the producer's release: the slot holds a whole event and
        // is ours until we hand it back below.
        let bytes = unsafe { self.base.add(off).cast::<[u8; EVENT_SIZE]>().read_unaligned() };
        self.seq(pos).store(pos.wrapping_add(self.capacity), Ordering::Release);
        head.store(pos.wrapping_add(1), Ordering::Relaxed);
        Some(Event::from_bytes(&bytes))
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

    #[test]
    fn attach_checks_the_header_and_derives_capacity_from_the_size() {
        let h = HeapRing::new(8);
        let base = h.ring().base;
        // SAFETY: the HeapRing's region is mapped and 64-byte aligned.
        let r = unsafe { Ring::attach(base, region_bytes(8)) }.unwrap();
        assert_eq!(r.capacity(), 8);
        // SAFETY: as above, with a length that is too short for the claimed capacity.
        assert_eq!(unsafe { Ring::attach(base, region_bytes(4)) }.unwrap_err(), RingError::BadSize);
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
                        pushed += j.join().unwrap();
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
