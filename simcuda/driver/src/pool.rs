//! Stream-ordered memory pools (`cuMemPoolCreate`, each device's default pool): a pool reserves
//! chunks of device memory (a chunk is the request rounded up to 2 MiB), carves allocations out of
//! them best-fit at 512-byte alignment, and keeps freed memory reserved (free runs merge only
//! inside their chunk) until `cuMemPoolTrimTo`, or a synchronisation when more than the release
//! threshold is held, returns wholly free chunks to the device. Streams are not modelled: frees
//! take effect at once.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug)]
struct Chunk {
    size: u64,
    used: u64,
}

/// One pool.
#[derive(Debug)]
pub struct Pool {
    pub device: u32,
    pub is_default: bool,
    /// `cuMemPoolDestroy` was called while allocations were live: the pool goes when they do.
    pub destroyed: bool,
    pub release_threshold: u64,
    pub used: u64,
    pub used_high: u64,
    pub reserved: u64,
    pub reserved_high: u64,
    chunks: BTreeMap<u64, Chunk>,
    free_by_addr: BTreeMap<u64, u64>,
    free_by_size: BTreeSet<(u64, u64)>,
}

impl Pool {
    pub fn new(device: u32, is_default: bool) -> Pool {
        Pool {
            device,
            is_default,
            destroyed: false,
            release_threshold: 0,
            used: 0,
            used_high: 0,
            reserved: 0,
            reserved_high: 0,
            chunks: BTreeMap::new(),
            free_by_addr: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
        }
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        if len > 0 {
            self.free_by_addr.insert(start, len);
            self.free_by_size.insert((len, start));
        }
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.free_by_addr.remove(&start);
        self.free_by_size.remove(&(len, start));
    }

    fn chunk_of(&mut self, addr: u64) -> Option<(u64, &mut Chunk)> {
        self.chunks.range_mut(..=addr).next_back().map(|(&va, c)| (va, c))
    }

    /// Carves `bytes` (a multiple of 512) out of the pool's free memory; None when nothing fits.
    pub fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let &(len, start) = self.free_by_size.range((bytes, 0)..).next()?;
        self.remove_free(start, len);
        self.insert_free(start + bytes, len - bytes);
        self.chunk_of(start)?.1.used += bytes;
        self.used += bytes;
        self.used_high = self.used_high.max(self.used);
        Some(start)
    }

    /// Adds a chunk of fresh device memory `[va, va + size)`.
    pub fn add_chunk(&mut self, va: u64, size: u64) {
        self.chunks.insert(va, Chunk { size, used: 0 });
        self.insert_free(va, size);
        self.reserved += size;
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// Returns `[addr, addr + bytes)` to the pool.
    pub fn free(&mut self, mut addr: u64, mut bytes: u64) {
        let Some((chunk_va, chunk)) = self.chunk_of(addr) else {
            return;
        };
        chunk.used -= bytes;
        let chunk_end = chunk_va + chunk.size;
        self.used -= bytes;
        if let Some((&p, &plen)) = self.free_by_addr.range(chunk_va..addr).next_back() {
            if p + plen == addr {
                self.remove_free(p, plen);
                addr = p;
                bytes += plen;
            }
        }
        if addr + bytes < chunk_end {
            if let Some(&nlen) = self.free_by_addr.get(&(addr + bytes)) {
                self.remove_free(addr + bytes, nlen);
                bytes += nlen;
            }
        }
        self.insert_free(addr, bytes);
    }

    /// Releases wholly free chunks, lowest address first, while more than `keep` bytes are
    /// reserved; returns the released chunks `(va, size)`.
    pub fn trim(&mut self, keep: u64) -> Vec<(u64, u64)> {
        let idle: Vec<(u64, u64)> = self.chunks.iter().filter(|(_, c)| c.used == 0).map(|(&va, c)| (va, c.size)).collect();
        let mut released = Vec::new();
        for (va, size) in idle {
            if self.reserved <= keep {
                break;
            }
            self.chunks.remove(&va);
            self.remove_free(va, size);
            self.reserved -= size;
            released.push((va, size));
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn freed_memory_stays_reserved_until_trim() {
        let mut p = Pool::new(0, true);
        assert_eq!(p.alloc(64 * MIB), None);
        p.add_chunk(0x10_0000_0000, 64 * MIB);
        let a = p.alloc(64 * MIB).expect("fits the chunk");
        p.add_chunk(0x10_0400_0000, 64 * MIB);
        let b = p.alloc(MIB).expect("second chunk");
        p.free(a, 64 * MIB);
        assert_eq!((p.used, p.reserved), (MIB, 128 * MIB));
        assert_eq!(p.alloc(64 * MIB), Some(a), "reused");
        p.free(a, 64 * MIB);
        // The chunks touch in address space, but free runs never merge across them.
        assert_eq!(p.alloc(65 * MIB), None);
        assert_eq!(p.trim(0), vec![(a, 64 * MIB)], "only the idle chunk goes");
        p.free(b, MIB);
        assert_eq!(p.trim(64 * MIB), vec![], "already at the floor");
        assert_eq!(p.trim(0).len(), 1);
        assert_eq!((p.used, p.reserved, p.used_high, p.reserved_high), (0, 0, 65 * MIB, 128 * MIB));
    }
}
