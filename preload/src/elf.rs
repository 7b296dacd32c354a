//! Symbol lookup in the dynamic symbol tables of the objects already loaded, without `dlsym`.
//!
//! The shim exports `dlsym` and `dlvsym`, so a call to `dlsym` from inside the shim binds to the
//! shim's own export. The real ones are found here instead: `dl_iterate_phdr` gives every loaded
//! object's program headers; `PT_DYNAMIC` gives `DT_SYMTAB`, `DT_STRTAB`, `DT_GNU_HASH` (or
//! `DT_HASH`) and `DT_VERSYM`; a hash-table lookup gives the symbol, preferring its default
//! version (`dlsym@@GLIBC_2.34` over the compatibility `dlsym@GLIBC_2.2.5`). The same lookup
//! finds a CUDA function in a library that was loaded `RTLD_LOCAL`, out of `RTLD_NEXT`'s reach.
//!
//! Nothing here allocates, takes a lock of ours or calls `dlsym`; `dl_iterate_phdr` and `dladdr`
//! take the loader's own lock, which is never held while a hook runs. ELF64 only (the crate
//! builds for 64-bit Linux only).

use std::ffi::{c_char, c_int, c_void, CStr};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_NOTYPE: u8 = 0;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const VERSYM_HIDDEN: u16 = 0x8000;

/// `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `Elf64_Sym`.
#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// Which loaded objects a lookup may return a definition from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Every object but the shim itself.
    Shim,
    /// Only the C library (`libc.so.6`, or `libdl.so.2` where glibc is older than 2.34).
    AllButLibc,
}

/// The dynamic tables of one loaded object.
struct Tables {
    base: usize,
    symtab: *const Sym,
    strtab: *const u8,
    gnu_hash: *const u32,
    hash: *const u32,
    versym: *const u16,
}

impl Tables {
    /// Reads the dynamic section of the object `info` describes.
    ///
    /// # Safety
    /// `info` must come from `dl_iterate_phdr` (its headers describe a mapped object).
    unsafe fn of(info: &libc::dl_phdr_info) -> Option<Tables> {
        let base = info.dlpi_addr as usize;
        if info.dlpi_phdr.is_null() {
            return None;
        }
        // SAFETY: dl_iterate_phdr hands out dlpi_phnum program headers at dlpi_phdr.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
        let mut d = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
        // The loader relocates these addresses in place where the dynamic section is writable
        // (most architectures); elsewhere (the vDSO, RISC-V, MIPS) they are still offsets.
        let addr = |v: u64| {
            let v = v as usize;
            if v < base {
                base.wrapping_add(v)
            } else {
                v
            }
        };
        let mut t = Tables {
            base,
            symtab: std::ptr::null(),
            strtab: std::ptr::null(),
            gnu_hash: std::ptr::null(),
            hash: std::ptr::null(),
            versym: std::ptr::null(),
        };
        loop {
            // SAFETY: the dynamic section is an array of Elf64_Dyn ended by DT_NULL, mapped.
            let e = unsafe { &*d };
            match e.tag {
                DT_NULL => break,
                DT_SYMTAB => t.symtab = addr(e.val) as *const Sym,
                DT_STRTAB => t.strtab = addr(e.val) as *const u8,
                DT_GNU_HASH => t.gnu_hash = addr(e.val) as *const u32,
                DT_HASH => t.hash = addr(e.val) as *const u32,
                DT_VERSYM => t.versym = addr(e.val) as *const u16,
                _ => {}
            }
            // SAFETY: not past DT_NULL yet, so the next entry exists.
            d = unsafe { d.add(1) };
        }
        let usable = !t.symtab.is_null() && !t.strtab.is_null() && (!t.gnu_hash.is_null() || !t.hash.is_null());
        usable.then_some(t)
    }

    /// The address of the defined symbol `name`, its default version preferred.
    ///
    /// # Safety
    /// The tables must describe a mapped object (as [`Tables::of`] returns them).
    unsafe fn lookup(&self, name: &[u8]) -> Option<usize> {
        let mut fallback = None;
        let mut consider = |i: u32| -> Option<usize> {
            // SAFETY: i is a symbol index taken from this object's own hash table.
            let s = unsafe { &*self.symtab.add(i as usize) };
            let (kind, bind) = (s.info & 0xf, s.info >> 4);
            if s.shndx == 0 || s.value == 0 || !matches!(kind, STT_FUNC | STT_OBJECT | STT_NOTYPE) || !matches!(bind, STB_GLOBAL | STB_WEAK)
            {
                return None;
            }
            // SAFETY: st_name is an offset into this object's NUL-terminated string table.
            let sname = unsafe { CStr::from_ptr(self.strtab.add(s.name as usize).cast::<c_char>()) };
            if sname.to_bytes() != name {
                return None;
            }
            let addr = self.base.wrapping_add(s.value as usize);
            let ver = if self.versym.is_null() {
                1
            } else {
                // SAFETY: DT_VERSYM has one entry per symbol-table entry.
                unsafe { *self.versym.add(i as usize) }
            };
            if ver & 0x7fff == 0 {
                return None; // VER_NDX_LOCAL: not visible
            }
            if ver & VERSYM_HIDDEN == 0 {
                return Some(addr);
            }
            fallback.get_or_insert(addr);
            None
        };
        if !self.gnu_hash.is_null() {
            // SAFETY: a DT_GNU_HASH table: header, bloom words, buckets, chains, all mapped.
            unsafe {
                let h = self.gnu_hash;
                let (nbuckets, symoffset, bloom_size) = (*h, *h.add(1), *h.add(2));
                if nbuckets == 0 {
                    return None;
                }
                let buckets = h.add(4 + bloom_size as usize * 2);
                let chains = buckets.add(nbuckets as usize);
                let hash = gnu_hash(name);
                let mut i = *buckets.add((hash % nbuckets) as usize);
                if i >= symoffset {
                    loop {
                        let h2 = *chains.add((i - symoffset) as usize);
                        if (h2 | 1) == (hash | 1) {
                            if let Some(a) = consider(i) {
                                return Some(a);
                            }
                        }
                        if h2 & 1 != 0 {
                            break;
                        }
                        i += 1;
                    }
                }
            }
        } else {
            // SAFETY: a DT_HASH table: nbucket, nchain, buckets, chains, all mapped.
            unsafe {
                let h = self.hash;
                let nbucket = *h;
                if nbucket == 0 {
                    return None;
                }
                let buckets = h.add(2);
                let chains = buckets.add(nbucket as usize);
                let mut i = *buckets.add((sysv_hash(name) % nbucket) as usize);
                let mut guard = 0u32;
                while i != 0 && guard < (1 << 24) {
                    if let Some(a) = consider(i) {
                        return Some(a);
                    }
                    i = *chains.add(i as usize);
                    guard += 1;
                }
            }
        }
        fallback
    }
}

fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(u32::from(c)))
}

fn sysv_hash(name: &[u8]) -> u32 {
    let mut h = 0u32;
    for &c in name {
        h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

/// Whether `addr` lies in one of the loadable segments of the object `info` describes.
fn contains(info: &libc::dl_phdr_info, addr: usize) -> bool {
    if info.dlpi_phdr.is_null() {
        return false;
    }
    // SAFETY: dl_iterate_phdr hands out dlpi_phnum program headers at dlpi_phdr.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    phdrs.iter().filter(|p| p.p_type == PT_LOAD).any(|p| {
        let start = (info.dlpi_addr as usize).wrapping_add(p.p_vaddr as usize);
        addr >= start && addr - start < p.p_memsz as usize
    })
}

/// Whether the object is the C library that defines `dlsym`.
fn is_libc(info: &libc::dl_phdr_info) -> bool {
    if info.dlpi_name.is_null() {
        return false;
    }
    // SAFETY: dlpi_name is a NUL-terminated path (possibly empty).
    let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let file = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
    file.starts_with(b"libc.so") || file.starts_with(b"libdl.so")
}

/// Any function of the shim: its address tells the shim's own object apart.
#[inline(never)]
fn shim_marker() {}

struct Search<'a> {
    name: &'a [u8],
    skip: Skip,
    shim: usize,
    found: Option<usize>,
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the Search that find() passed, alive for the whole iteration.
    let search = unsafe { &mut *data.cast::<Search>() };
    // SAFETY: the loader hands out a valid dl_phdr_info for the duration of the callback.
    let Some(info) = (unsafe { info.as_ref() }) else { return 0 };
    let wanted = match search.skip {
        Skip::Shim => !contains(info, search.shim),
        Skip::AllButLibc => is_libc(info) && !contains(info, search.shim),
    };
    if !wanted {
        return 0;
    }
    // SAFETY: the headers come from dl_iterate_phdr, so the object is mapped.
    let Some(tables) = (unsafe { Tables::of(info) }) else { return 0 };
    // SAFETY: as above.
    match unsafe { tables.lookup(search.name) } {
        Some(a) => {
            search.found = Some(a);
            1
        }
        None => 0,
    }
}

fn find(name: &[u8], skip: Skip) -> Option<usize> {
    let mut search = Search { name, skip, shim: shim_marker as *const () as usize, found: None };
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and only reads the headers it is
    // given; `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}

/// The first definition of `name` in load order, in any loaded object but the shim.
pub fn find_in_loaded_objects(name: &[u8], skip: Skip) -> Option<usize> {
    find(name, skip)
}

/// The C library's own definition of `name` (`dlsym`, `dlvsym`), never the shim's.
pub fn find_in_libc(name: &[u8]) -> Option<usize> {
    find(name, Skip::AllButLibc)
}

/// The exported symbol that starts exactly at `addr`, if any (`dladdr`, which never reports a
/// name for an address in the middle of a function).
pub fn exported_name_at(addr: usize) -> Option<&'static [u8]> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    let ok = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
    if ok == 0 || info.dli_sname.is_null() || info.dli_saddr as usize != addr {
        return None;
    }
    // SAFETY: dli_sname points into the object's string table, mapped while the object is loaded
    // (the function at `addr` belongs to it, and the caller holds a pointer to that function).
    Some(unsafe { CStr::from_ptr(info.dli_sname) }.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_the_reference_values() {
        // Values from the GNU hash and SysV hash reference implementations.
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
    }

    #[test]
    fn finds_libc_functions_without_dlsym() {
        let open = find_in_libc(b"dlsym").expect("dlsym in libc");
        assert_eq!(exported_name_at(open), Some(&b"dlsym"[..]));
        let getpid = find_in_loaded_objects(b"getpid", Skip::Shim).expect("getpid");
        assert_eq!(getpid, libc::getpid as *const () as usize);
    }
}
