//! One process's view of the simulated devices: its allocations (plain, pitched, managed,
//! sub-2 MiB, pool), its VMM reservations, physical handles and mappings, its pools, and the
//! physical memory it holds, charged page by page to its slots in the shared state file so that
//! every process sees the same device free memory.
//!
//! Physical memory is a page count: the driver maps pages anywhere, so it never fragments for
//! requests of 2 MiB and up (measured on the H200); only sub-2 MiB allocations, which share pages
//! (`small`), strand memory. A request for new pages succeeds while it leaves `slack` bytes free.
//! Known departures from the real driver: streams are not modelled (async frees are immediate),
//! managed memory counts as device memory from the start, and releasing a primary context does not
//! free its memory.

use std::collections::{BTreeMap, HashMap};

use simcuda_core::ffi::*;
use simcuda_core::state::SharedState;
use simcuda_core::{Config, GRANULARITY};

use crate::pool::Pool;
use crate::small::{self, SmallPages};
use crate::va::VaSpace;

/// Device `d`'s allocations live in `[DEVICE_VA_TOP - (d + 1) * DEVICE_VA_SPAN, DEVICE_VA_TOP - d * DEVICE_VA_SPAN)`.
const DEVICE_VA_TOP: u64 = 0x8000_0000_0000;
const DEVICE_VA_SPAN: u64 = 1 << 40;
/// `cuMemAddressReserve` ranges come from below the device regions.
const VMM_VA_BASE: u64 = 0x5000_0000_0000;
const VMM_VA_SPAN: u64 = 16 << 40;

/// Base address of device `d`'s allocation region (device 0: 0x7f00_0000_0000).
pub fn device_va_base(d: u32) -> u64 {
    DEVICE_VA_TOP - (u64::from(d) + 1) * DEVICE_VA_SPAN
}

type Result<T> = std::result::Result<T, CUresult>;

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// cuMemAlloc / cuMemAllocPitch of 2 MiB or more: `bytes` = size rounded up to 2 MiB.
    Pages { bytes: u64 },
    /// Under 2 MiB: `units` of 512 bytes in a shared page.
    Small { units: u32 },
    /// From a pool: `bytes` = size rounded up to 512.
    Pool { pool: usize, bytes: u64 },
}

#[derive(Debug)]
struct Alloc {
    device: u32,
    kind: Kind,
}

#[derive(Debug)]
struct Mapping {
    size: u64,
    handle: u64,
}

#[derive(Debug)]
struct Reservation {
    size: u64,
    mappings: BTreeMap<u64, Mapping>,
}

#[derive(Debug)]
struct PhysHandle {
    device: u32,
    size: u64,
    released: bool,
    maps: u32,
}

struct Device {
    va: VaSpace,
    small: SmallPages,
    slot: Option<usize>,
    default_pool: Option<usize>,
}

/// The process's state; callers hold the driver's lock around every call.
pub struct Model {
    cfg: &'static Config,
    shared: &'static SharedState,
    pid: u32,
    start_time: u64,
    devices: Vec<Device>,
    allocs: BTreeMap<u64, Alloc>,
    vmm_va: VaSpace,
    reservations: BTreeMap<u64, Reservation>,
    handles: HashMap<u64, PhysHandle>,
    next_handle: u64,
    pools: HashMap<usize, Pool>,
}

/// A pool's handle: the address of a leaked one-byte box, unique for the life of the process.
fn new_pool_key() -> usize {
    Box::into_raw(Box::new(0u8)) as usize
}

impl Model {
    pub fn new(cfg: &'static Config, shared: &'static SharedState, pid: u32, start_time: u64) -> Model {
        let devices = (0..cfg.domains())
            .map(|d| Device {
                va: VaSpace::new(device_va_base(d), DEVICE_VA_SPAN),
                small: SmallPages::default(),
                slot: None,
                default_pool: None,
            })
            .collect();
        Model {
            cfg,
            shared,
            pid,
            start_time,
            devices,
            allocs: BTreeMap::new(),
            vmm_va: VaSpace::new(VMM_VA_BASE, VMM_VA_SPAN),
            reservations: BTreeMap::new(),
            handles: HashMap::new(),
            next_handle: 1,
            pools: HashMap::new(),
        }
    }

    /// Takes a slot in the state file for `dev` (NVML then lists this process on it).
    pub fn ensure_slot(&mut self, dev: u32) -> Result<usize> {
        let d = &mut self.devices[dev as usize];
        if let Some(s) = d.slot {
            return Ok(s);
        }
        let s = self.shared.claim(self.pid, self.start_time, dev).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        d.slot = Some(s);
        Ok(s)
    }

    /// Gives back every slot (process exit).
    pub fn release_slots(&mut self) {
        for d in &mut self.devices {
            if let Some(s) = d.slot.take() {
                self.shared.release(s);
            }
        }
    }

    fn charge(&mut self, dev: u32, bytes: u64) -> Result<()> {
        let slot = self.ensure_slot(dev)?;
        // A sharing layer's limit on this process (MPS, a quota preload): its own bytes only.
        if let Some(own) = self.cfg.own_limit.get(dev as usize).copied().flatten() {
            if self.shared.slot_used(slot).saturating_add(bytes) > own {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        let limit = self.cfg.domain_allocation_limit(dev);
        if self.shared.try_charge(slot, dev, bytes, limit)
            || (self.shared.reap_dead() > 0 && self.shared.try_charge(slot, dev, bytes, limit))
        {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }

    fn uncharge(&mut self, dev: u32, bytes: u64) {
        if let Some(slot) = self.devices[dev as usize].slot {
            self.shared.uncharge(slot, bytes);
        }
    }

    /// Fresh pages `bytes` long in `dev`'s address region, charged to the device.
    fn take_pages(&mut self, dev: u32, bytes: u64) -> Result<u64> {
        self.charge(dev, bytes)?;
        match self.devices[dev as usize].va.alloc(bytes, GRANULARITY) {
            Some(va) => Ok(va),
            None => {
                self.uncharge(dev, bytes);
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    fn give_pages(&mut self, dev: u32, va: u64, bytes: u64) {
        self.devices[dev as usize].va.free(va, bytes);
        self.uncharge(dev, bytes);
    }

    /// `(free, total)` as cuMemGetInfo reports them for `dev`, after reaping dead processes.
    pub fn mem_info(&self, dev: u32) -> (u64, u64) {
        self.shared.reap_dead();
        let usable = self.cfg.domain_usable(dev);
        let free = usable.saturating_sub(self.shared.device_used(dev));
        match (self.cfg.quota_preloaded, self.cfg.own_limit.get(dev as usize).copied().flatten(), self.devices[dev as usize].slot) {
            // HAMi-core's cuMemGetInfo: the quota is the total, what is left of it the free.
            (true, Some(q), slot) => {
                let mine = slot.map_or(0, |s| self.shared.slot_used(s));
                (free.min(q.saturating_sub(mine)), q)
            }
            _ => (free, usable),
        }
    }

    /// cuMemAlloc (and the pitched and managed forms, with `whole_pages`).
    pub fn alloc(&mut self, dev: u32, size: u64, whole_pages: bool) -> Result<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if size < GRANULARITY && !whole_pages {
            let units = small::units_for(size);
            let addr = match self.devices[dev as usize].small.alloc(units) {
                Some(a) => a,
                None => {
                    let page = self.take_pages(dev, GRANULARITY)?;
                    let sp = &mut self.devices[dev as usize].small;
                    sp.add_page(page);
                    sp.alloc(units).ok_or(CUDA_ERROR_UNKNOWN)?
                }
            };
            self.allocs.insert(addr, Alloc { device: dev, kind: Kind::Small { units } });
            return Ok(addr);
        }
        let bytes = size.checked_next_multiple_of(GRANULARITY).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let addr = self.take_pages(dev, bytes)?;
        self.allocs.insert(addr, Alloc { device: dev, kind: Kind::Pages { bytes } });
        Ok(addr)
    }

    /// cuMemFree: any allocation made by address (pool allocations go back to their pool).
    pub fn free(&mut self, addr: u64) -> Result<()> {
        let alloc = self.allocs.remove(&addr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match alloc.kind {
            Kind::Pages { bytes } => self.give_pages(alloc.device, addr, bytes),
            Kind::Small { units } => {
                if let Some(page) = self.devices[alloc.device as usize].small.free(addr, units) {
                    self.give_pages(alloc.device, page, GRANULARITY);
                }
            }
            Kind::Pool { pool, bytes } => self.pool_give_back(pool, addr, bytes),
        }
        Ok(())
    }

    /// cuIpcGetMemHandle: the start of the live `cuMemAlloc` allocation holding `addr` (the handle
    /// names the whole allocation); mapped VMM memory and pool memory cannot be exported this way.
    pub fn ipc_base(&self, addr: u64) -> Result<u64> {
        if let Some((&base, a)) = self.allocs.range(..=addr).next_back() {
            let extent = match a.kind {
                Kind::Pages { bytes } => bytes,
                Kind::Small { units } => u64::from(units) * small::UNIT,
                Kind::Pool { .. } => return Err(CUDA_ERROR_INVALID_VALUE),
            };
            if addr < base + extent {
                return Ok(base);
            }
        }
        Err(CUDA_ERROR_INVALID_VALUE)
    }

    /// Whether `[addr, addr + n)` lies inside one live allocation or mapped VMM memory.
    pub fn is_device_memory(&self, addr: u64, n: u64) -> bool {
        let Some(end) = addr.checked_add(n) else {
            return false;
        };
        if let Some((&base, a)) = self.allocs.range(..=addr).next_back() {
            let extent = match a.kind {
                Kind::Pages { bytes } | Kind::Pool { bytes, .. } => bytes,
                Kind::Small { units } => u64::from(units) * small::UNIT,
            };
            if end <= base + extent {
                return true;
            }
        }
        self.mapped_cover(addr, end).is_some()
    }

    // ---- VMM ----

    /// cuMemAddressReserve.
    pub fn address_reserve(&mut self, size: u64, align: u64, hint: u64) -> Result<u64> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) || (align != 0 && !align.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(GRANULARITY);
        let at = if hint != 0 && hint.is_multiple_of(align) && self.vmm_va.alloc_at(hint, size) {
            hint
        } else {
            self.vmm_va.alloc(size, align).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?
        };
        self.reservations.insert(at, Reservation { size, mappings: BTreeMap::new() });
        Ok(at)
    }

    /// cuMemAddressFree: exactly a reserved range, with nothing mapped in it.
    pub fn address_free(&mut self, ptr: u64, size: u64) -> Result<()> {
        match self.reservations.get(&ptr) {
            Some(r) if r.size == size && r.mappings.is_empty() => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        self.reservations.remove(&ptr);
        self.vmm_va.free(ptr, size);
        Ok(())
    }

    /// cuMemCreate: `size` bytes of physical memory on `dev`.
    pub fn mem_create(&mut self, dev: u32, size: u64) -> Result<u64> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.charge(dev, size)?;
        let h = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(h, PhysHandle { device: dev, size, released: false, maps: 0 });
        Ok(h)
    }

    /// cuMemRelease: the memory goes when its last mapping does.
    pub fn mem_release(&mut self, h: u64) -> Result<()> {
        let ph = self.handles.get_mut(&h).filter(|p| !p.released).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        ph.released = true;
        if ph.maps == 0 {
            self.drop_handle(h);
        }
        Ok(())
    }

    fn drop_handle(&mut self, h: u64) {
        if let Some(ph) = self.handles.remove(&h) {
            self.uncharge(ph.device, ph.size);
        }
    }

    fn reservation_of(&self, ptr: u64, end: u64) -> Option<u64> {
        let (&base, r) = self.reservations.range(..=ptr).next_back()?;
        (end <= base + r.size).then_some(base)
    }

    /// cuMemMap: `handle[offset, offset + size)` at `ptr`, inside one reservation, over nothing
    /// already mapped.
    pub fn map(&mut self, ptr: u64, size: u64, offset: u64, h: u64) -> Result<()> {
        let g = GRANULARITY;
        if size == 0 || !size.is_multiple_of(g) || !offset.is_multiple_of(g) || !ptr.is_multiple_of(g) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match self.handles.get(&h) {
            Some(ph) if !ph.released && offset.checked_add(size).is_some_and(|e| e <= ph.size) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        let base = self.reservation_of(ptr, end).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let r = self.reservations.get_mut(&base).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let overlaps = r.mappings.range(..end).next_back().is_some_and(|(&m, mm)| m + mm.size > ptr);
        if overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        r.mappings.insert(ptr, Mapping { size, handle: h });
        if let Some(ph) = self.handles.get_mut(&h) {
            ph.maps += 1;
        }
        Ok(())
    }

    /// Whether `[ptr, end)` is covered by mappings of one reservation without a gap:
    /// `Some(Ok(starts))` when it is made of whole mappings (their start addresses),
    /// `Some(Err(()))` when covered but cutting a mapping, None when not covered.
    fn mapped_cover(&self, ptr: u64, end: u64) -> Option<std::result::Result<Vec<u64>, ()>> {
        let base = self.reservation_of(ptr, end)?;
        let r = self.reservations.get(&base)?;
        let first = r.mappings.range(..=ptr).next_back().filter(|(&m, mm)| m + mm.size > ptr);
        let mut whole = first.is_some_and(|(&m, _)| m == ptr);
        let mut starts = Vec::new();
        let mut at = ptr;
        for (&m, mm) in first.into_iter().chain(r.mappings.range(ptr + 1..end)) {
            if m > at {
                return None;
            }
            starts.push(m);
            at = m + mm.size;
        }
        if at < end {
            return None;
        }
        whole &= at == end;
        Some(if whole { Ok(starts) } else { Err(()) })
    }

    /// cuMemUnmap: whole mappings covering `[ptr, ptr + size)` exactly.
    pub fn unmap(&mut self, ptr: u64, size: u64) -> Result<()> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) || !ptr.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let starts = match self.mapped_cover(ptr, end) {
            Some(Ok(starts)) => starts,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let base = self.reservation_of(ptr, end).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        for m in starts {
            let Some(mapping) = self.reservations.get_mut(&base).and_then(|r| r.mappings.remove(&m)) else {
                continue;
            };
            let last = match self.handles.get_mut(&mapping.handle) {
                Some(ph) => {
                    ph.maps -= 1;
                    ph.released && ph.maps == 0
                }
                None => false,
            };
            if last {
                self.drop_handle(mapping.handle);
            }
        }
        Ok(())
    }

    /// cuMemSetAccess: the range must be mapped throughout.
    pub fn set_access(&self, ptr: u64, size: u64) -> Result<()> {
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match self.mapped_cover(ptr, end) {
            Some(_) if size > 0 => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    // ---- pools ----

    /// The device's default pool (made on first use).
    pub fn default_pool(&mut self, dev: u32) -> usize {
        if let Some(p) = self.devices[dev as usize].default_pool {
            return p;
        }
        let key = new_pool_key();
        self.pools.insert(key, Pool::new(dev, true));
        self.devices[dev as usize].default_pool = Some(key);
        key
    }

    pub fn pool_create(&mut self, dev: u32) -> usize {
        let key = new_pool_key();
        self.pools.insert(key, Pool::new(dev, false));
        key
    }

    fn live_pool(&mut self, key: usize) -> Result<&mut Pool> {
        self.pools.get_mut(&key).filter(|p| !p.destroyed).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// cuMemPoolDestroy: at once when nothing is allocated from the pool, else when the last
    /// allocation is freed.
    pub fn pool_destroy(&mut self, key: usize) -> Result<()> {
        let pool = self.live_pool(key)?;
        if pool.is_default {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        pool.destroyed = true;
        let busy = pool.used > 0;
        self.pool_release(key, 0);
        if !busy {
            self.pools.remove(&key);
        }
        Ok(())
    }

    /// Returns the pool's idle chunks to the device while it holds more than `keep` bytes.
    fn pool_release(&mut self, key: usize, keep: u64) {
        let Some(pool) = self.pools.get_mut(&key) else {
            return;
        };
        let dev = pool.device;
        for (va, size) in pool.trim(keep) {
            self.give_pages(dev, va, size);
        }
    }

    /// cuMemAllocAsync / cuMemAllocFromPoolAsync.
    pub fn pool_alloc(&mut self, key: usize, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = size.checked_next_multiple_of(small::UNIT).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let pool = self.live_pool(key)?;
        let dev = pool.device;
        let addr = match pool.alloc(bytes) {
            Some(a) => a,
            None => {
                let chunk = bytes.checked_next_multiple_of(GRANULARITY).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
                let va = match self.take_pages(dev, chunk) {
                    Ok(va) => va,
                    Err(_) => {
                        // Out of device memory: give the pool's idle chunks back first, as the
                        // driver does, then try once more.
                        self.pool_release(key, 0);
                        self.take_pages(dev, chunk)?
                    }
                };
                let pool = self.live_pool(key)?;
                pool.add_chunk(va, chunk);
                pool.alloc(bytes).ok_or(CUDA_ERROR_UNKNOWN)?
            }
        };
        self.allocs.insert(addr, Alloc { device: dev, kind: Kind::Pool { pool: key, bytes } });
        Ok(addr)
    }

    /// cuMemFreeAsync: pool allocations only.
    pub fn pool_free(&mut self, addr: u64) -> Result<()> {
        match self.allocs.get(&addr) {
            Some(Alloc { kind: Kind::Pool { .. }, .. }) => self.free(addr),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn pool_give_back(&mut self, key: usize, addr: u64, bytes: u64) {
        let Some(pool) = self.pools.get_mut(&key) else {
            return;
        };
        pool.free(addr, bytes);
        if pool.destroyed && pool.used == 0 {
            self.pool_release(key, 0);
            self.pools.remove(&key);
        }
    }

    /// cuMemPoolTrimTo.
    pub fn pool_trim(&mut self, key: usize, keep: u64) -> Result<()> {
        self.live_pool(key)?;
        self.pool_release(key, keep);
        Ok(())
    }

    /// cuMemPoolGetAttribute for the 64-bit attributes; `Ok(None)` for the int ones (REUSE_*).
    pub fn pool_attr(&mut self, key: usize, attr: i32) -> Result<Option<u64>> {
        let p = self.live_pool(key)?;
        Ok(Some(match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => return Ok(None),
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => p.used,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => p.used_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }))
    }

    /// cuMemPoolSetAttribute: the release threshold, the high-water marks (reset with 0), REUSE_*.
    pub fn pool_set_attr(&mut self, key: usize, attr: i32, value: u64) -> Result<()> {
        let p = self.live_pool(key)?;
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {}
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = value,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if value == 0 => p.reserved_high = p.reserved,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// A stream or context synchronisation on `dev`: pools holding more than their release
    /// threshold give idle memory back down to it.
    pub fn synchronize(&mut self, dev: u32) {
        let keys: Vec<(usize, u64)> = self
            .pools
            .iter()
            .filter(|(_, p)| p.device == dev && p.reserved > p.release_threshold)
            .map(|(&k, p)| (k, p.release_threshold))
            .collect();
        for (k, threshold) in keys {
            self.pool_release(k, threshold);
        }
    }
}
