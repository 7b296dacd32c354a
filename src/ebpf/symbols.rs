//! How the caching allocators are found inside their libraries: PyTorch's in `libc10_cuda.so`
//! (its USDT probes `pytorch:malloc`, `pytorch:free` in `.note.stapsdt`, or, where the build has
//! none, the local C++ functions in `.symtab`), and XLA's BFC allocator in JAX's
//! `xla_cuda_plugin.so` (local `.symtab` symbols only) or TensorFlow's
//! `libtensorflow_framework.so.2` (exported in `.dynsym` too): functions found by demangling the
//! symbols whose raw name mentions the class and matching the signature, turned into the file
//! offsets that a uprobe takes. And PyTorch's out-of-memory report,
//! `c10::reportOutOfMemoryToProfiler`, exported by `libc10.so` beside `libc10_cuda.so`.

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use std::path::Path;

/// The demangled tail of the block allocation function (a member: `this` is its first argument).
pub const TORCH_MALLOC: &str = "NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)";
/// The demangled tail of the block free function.
pub const TORCH_FREE: &str = "Native::local_raw_delete(void*)";

/// The demangled name of the function PyTorch's caching allocator calls on every OOM it raises,
/// exported by `libc10.so`.
pub const TORCH_OOM_REPORT: &str = "c10::reportOutOfMemoryToProfiler(long, unsigned long, unsigned long, c10::Device)";
/// Its file name, beside `libc10_cuda.so` in a PyTorch install (`torch/lib/`).
pub const TORCH_OOM_LIB: &str = "libc10.so";

/// How PyTorch's out-of-memory report is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorchOomProbe {
    /// A uprobe on [`TORCH_OOM_REPORT`] at this file offset of this `libc10.so`.
    Symbol {
        /// The library.
        path: std::path::PathBuf,
        /// File offset of the function.
        offset: u64,
    },
    /// Not probed, with why: an OOM PyTorch raises without a failed driver call goes unseen.
    None(String),
}

/// Where the `libc10.so` beside the `libc10_cuda.so` at `c10_cuda` has PyTorch's OOM report.
pub fn torch_oom_probe(c10_cuda: &Path) -> TorchOomProbe {
    let path = c10_cuda.with_file_name(TORCH_OOM_LIB);
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) => return TorchOomProbe::None(format!("no {} beside {} ({e})", TORCH_OOM_LIB, c10_cuda.display())),
    };
    let file = match object::File::parse(&*data) {
        Ok(f) => f,
        Err(e) => return TorchOomProbe::None(format!("{} is not an ELF file: {e}", path.display())),
    };
    match find_demangled_among(&file, TORCH_OOM_REPORT, &["reportOutOfMemoryToProfiler"]) {
        Some((offset, _)) => TorchOomProbe::Symbol { path, offset },
        None => TorchOomProbe::None(format!("{} has no {TORCH_OOM_REPORT}", path.display())),
    }
}

/// XLA's BFC allocation entry: `AllocateRaw(this, alignment, num_bytes, attributes)`, returning the chunk.
pub const BFC_ALLOCATE: &str = "tsl::BFCAllocator::AllocateRaw(unsigned long, unsigned long, tsl::AllocationAttributes const&)";
/// The two-argument overload (inline in the header, so often a weak copy that calls the other).
pub const BFC_ALLOCATE_PLAIN: &str = "tsl::BFCAllocator::AllocateRaw(unsigned long, unsigned long)";
/// XLA's BFC free: `DeallocateRaw(this, ptr)`.
pub const BFC_DEALLOCATE: &str = "tsl::BFCAllocator::DeallocateRaw(void*)";

/// How a library with XLA's BFC allocator can be probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BfcProbes {
    /// Uprobes at these file offsets.
    Symbols {
        /// `AllocateRaw(unsigned long, unsigned long, tsl::AllocationAttributes const&)` (entry and return).
        allocate: u64,
        /// `AllocateRaw(unsigned long, unsigned long)` where the file has a copy (entry and return;
        /// the three-argument call it makes inside is not reported twice).
        allocate_plain: Option<u64>,
        /// `DeallocateRaw(void*)` (entry).
        deallocate: u64,
        /// Whether the symbols came from `.dynsym` (exported) rather than `.symtab` alone.
        exported: bool,
    },
    /// Not probed, with why.
    None(String),
}

/// PyTorch's allocator entry points besides `allocate()`, whose USDT probe `pytorch:malloc` is
/// the only one PyTorch fires: `raw_alloc` and `raw_alloc_with_stream` (CUB's temporary storage,
/// workspaces, `torch.cuda.caching_allocator_alloc`) call `malloc()` directly, and `raw_delete`
/// calls `free()` directly, past `local_raw_delete` and its `pytorch:free` probe. Virtual
/// methods, so each has its own body whatever the compiler inlined.
pub const TORCH_RAW_ALLOC: &str = "NativeCachingAllocator::raw_alloc(unsigned long)";
/// See [`TORCH_RAW_ALLOC`].
pub const TORCH_RAW_ALLOC_STREAM: &str = "NativeCachingAllocator::raw_alloc_with_stream(unsigned long, CUstream_st*)";
/// See [`TORCH_RAW_ALLOC`].
pub const TORCH_RAW_DELETE: &str = "NativeCachingAllocator::raw_delete(void*)";

/// File offsets of [`TORCH_RAW_ALLOC`], [`TORCH_RAW_ALLOC_STREAM`] and [`TORCH_RAW_DELETE`] in
/// a `libc10_cuda.so`, each where found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawEntries {
    /// `raw_alloc` (entry and return).
    pub alloc: Option<u64>,
    /// `raw_alloc_with_stream` (entry and return).
    pub alloc_stream: Option<u64>,
    /// `raw_delete` (entry).
    pub delete: Option<u64>,
}

/// `torch._C._cuda_setMemoryFraction`'s C function, in `libtorch_python.so`: what
/// `torch.cuda.set_per_process_memory_fraction` calls (its arguments a tuple of a float and a
/// device index). The allocator's own setter takes the fraction as a `double`, in a register
/// that uprobes cannot read (x86-64 passes it in xmm0).
pub const TORCH_FRACTION: &str = "THCPModule_setMemoryFraction(_object*, _object*)";
/// Its file name, beside `libc10_cuda.so` in a PyTorch install (`torch/lib/`).
pub const TORCH_FRACTION_LIB: &str = "libtorch_python.so";

/// How PyTorch's memory-fraction setter is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorchFractionProbe {
    /// A uprobe on [`TORCH_FRACTION`] at this file offset of this `libtorch_python.so`.
    Symbol {
        /// The library.
        path: std::path::PathBuf,
        /// File offset of the function.
        offset: u64,
    },
    /// Not probed, with why: a cap set at run time has no allowed bytes under attach/agent.
    None(String),
}

/// Where the `libtorch_python.so` beside the `libc10_cuda.so` at `c10_cuda` has the fraction
/// setter. The library is large (tens of MB): it is read lazily through its section and symbol
/// tables, not whole.
pub fn torch_fraction_probe(c10_cuda: &Path) -> TorchFractionProbe {
    let path = c10_cuda.with_file_name(TORCH_FRACTION_LIB);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => return TorchFractionProbe::None(format!("no {} beside {} ({e})", TORCH_FRACTION_LIB, c10_cuda.display())),
    };
    let cache = object::ReadCache::new(f);
    let file = match object::File::parse(&cache) {
        Ok(f) => f,
        Err(e) => return TorchFractionProbe::None(format!("{} is not an ELF file: {e}", path.display())),
    };
    match find_demangled_among(&file, TORCH_FRACTION, &["setMemoryFraction"]) {
        Some((offset, _)) => TorchFractionProbe::Symbol { path, offset },
        None => TorchFractionProbe::None(format!("{} has no {TORCH_FRACTION}", path.display())),
    }
}

/// How a `libc10_cuda.so` can be probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorchProbes {
    /// USDT `pytorch:malloc` and `pytorch:free` are present.
    Usdt,
    /// No USDT; uprobes at these file offsets: `malloc` (entry and return) and `free` (entry).
    Symbols {
        /// File offset of `NativeCachingAllocator::malloc`.
        malloc: u64,
        /// File offset of `Native::local_raw_delete`.
        free: u64,
    },
    /// Neither: no block-level events from this file.
    None(String),
}

/// Whether a `.note.stapsdt` section body names `provider:name`.
pub fn has_usdt(notes: &[u8], provider: &str, name: &str) -> bool {
    let needle: Vec<u8> = [provider.as_bytes(), b"\0", name.as_bytes(), b"\0"].concat();
    notes.windows(needle.len()).any(|w| w == needle.as_slice())
}

/// The file offset of the code at virtual address `addr`, through the loadable segments.
fn file_offset<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>, addr: u64) -> Option<u64> {
    file.segments().find_map(|s| {
        let (off, len) = s.file_range();
        (addr >= s.address() && addr < s.address() + len).then(|| addr - s.address() + off)
    })
}

/// Finds the function whose demangled name ends with `tail` (a `.symtab` or `.dynsym` symbol),
/// as a file offset.
pub fn find_demangled(file: &object::File<'_>, tail: &str) -> Option<u64> {
    find_demangled_among(file, tail, &["NativeCachingAllocator", "local_raw_delete"]).map(|(off, _)| off)
}

/// [`find_demangled`] over the symbols whose raw name contains one of `needles` (demangling
/// only those keeps a scan of a large library short); also says whether the symbol is exported.
fn find_demangled_among<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>, tail: &str, needles: &[&str]) -> Option<(u64, bool)> {
    let opts = cpp_demangle::DemangleOptions::default();
    let dynamic = file.dynamic_symbols().map(|s| (s, true));
    for (sym, exported) in file.symbols().map(|s| (s, false)).chain(dynamic) {
        if sym.kind() != SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(raw) = sym.name() else { continue };
        if !raw.starts_with("_Z") || !needles.iter().any(|n| raw.contains(n)) {
            continue;
        }
        let Ok(s) = cpp_demangle::Symbol::new(raw) else { continue };
        let Ok(d) = s.demangle(&opts) else { continue };
        if d.ends_with(tail) {
            let exported = exported || file.dynamic_symbols().any(|d| d.name() == Ok(raw));
            return file_offset(file, sym.address()).map(|o| (o, exported));
        }
    }
    None
}

/// How the library with XLA's BFC allocator at `path` can be probed.
pub fn bfc_probes(path: &Path) -> BfcProbes {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) => return BfcProbes::None(format!("cannot read {}: {e}", path.display())),
    };
    let file = match object::File::parse(&*data) {
        Ok(f) => f,
        Err(e) => return BfcProbes::None(format!("{} is not an ELF file: {e}", path.display())),
    };
    let find = |tail| find_demangled_among(&file, tail, &["BFCAllocator"]);
    match (find(BFC_ALLOCATE), find(BFC_DEALLOCATE)) {
        (Some((allocate, exported)), Some((deallocate, _))) => {
            BfcProbes::Symbols { allocate, allocate_plain: find(BFC_ALLOCATE_PLAIN).map(|(o, _)| o), deallocate, exported }
        }
        (a, _) => BfcProbes::None(format!(
            "{} has no {} in .symtab or .dynsym (stripped, or another XLA version)",
            path.display(),
            if a.is_none() { BFC_ALLOCATE } else { BFC_DEALLOCATE }
        )),
    }
}

/// How the `libc10_cuda.so` at `path` can be probed, and its raw entry points
/// ([`RawEntries`], empty when the file cannot be read).
pub fn torch_probes(path: &Path) -> (TorchProbes, RawEntries) {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) => return (TorchProbes::None(format!("cannot read {}: {e}", path.display())), RawEntries::default()),
    };
    let file = match object::File::parse(&*data) {
        Ok(f) => f,
        Err(e) => return (TorchProbes::None(format!("{} is not an ELF file: {e}", path.display())), RawEntries::default()),
    };
    let raw = |tail| find_demangled_among(&file, tail, &["raw_alloc", "raw_delete"]).map(|(o, _)| o);
    let entries = RawEntries { alloc: raw(TORCH_RAW_ALLOC), alloc_stream: raw(TORCH_RAW_ALLOC_STREAM), delete: raw(TORCH_RAW_DELETE) };
    (torch_blocks(&file, path), entries)
}

/// [`torch_probes`]'s block probes of a parsed `libc10_cuda.so`.
fn torch_blocks(file: &object::File<'_>, path: &Path) -> TorchProbes {
    if let Some(notes) = file.section_by_name(".note.stapsdt").and_then(|s| s.data().ok()) {
        if has_usdt(notes, "pytorch", "malloc") && has_usdt(notes, "pytorch", "free") {
            return TorchProbes::Usdt;
        }
    }
    match (find_demangled(file, TORCH_MALLOC), find_demangled(file, TORCH_FREE)) {
        (Some(malloc), Some(free)) => TorchProbes::Symbols { malloc, free },
        _ => TorchProbes::None(format!("{} has neither the pytorch USDT probes nor the allocator's symbols in .symtab", path.display())),
    }
}

/// The gpufrag annotation probes (`gpufrag:NAME`, [`super::ANNOTATE_PROBES`]) that the ELF file
/// at `path` carries in `.note.stapsdt`; empty when none (or not an ELF file). Reads only the
/// section headers and the note, so it is cheap enough to run on every new executable.
pub fn annotate_probes(path: &Path) -> Vec<&'static str> {
    let Ok(data) = std::fs::read(path) else { return Vec::new() };
    let Ok(file) = object::File::parse(&*data) else { return Vec::new() };
    let Some(notes) = file.section_by_name(".note.stapsdt").and_then(|s| s.data().ok()) else { return Vec::new() };
    super::ANNOTATE_PROBES.iter().copied().filter(|n| has_usdt(notes, "gpufrag", n)).collect()
}

/// [`annotate_probes`] for an open file, reading only what the check needs (the ELF header,
/// the section headers and names, the `.note.stapsdt` section) rather than the whole file: the
/// exec hold reads every new executable of the node before it may run.
pub fn annotate_probes_in(f: std::fs::File) -> Vec<&'static str> {
    let mut magic = [0u8; 4];
    if std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0).is_err() || &magic != b"\x7fELF" {
        return Vec::new();
    }
    let cache = object::ReadCache::new(f);
    let Ok(file) = object::File::parse(&cache) else { return Vec::new() };
    let Some(notes) = file.section_by_name(".note.stapsdt").and_then(|s| s.data().ok()) else { return Vec::new() };
    super::ANNOTATE_PROBES.iter().copied().filter(|n| has_usdt(notes, "gpufrag", n)).collect()
}

/// The file offsets of the functions among `names` that the ELF file at `path` defines
/// (exported or in `.symtab`), parsing the file once.
pub fn function_offsets(path: &Path, names: &[&str]) -> std::io::Result<std::collections::HashMap<String, u64>> {
    let data = std::fs::read(path)?;
    let file = object::File::parse(&*data).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut out = std::collections::HashMap::new();
    for s in file.dynamic_symbols().chain(file.symbols()) {
        if s.kind() != SymbolKind::Text || s.address() == 0 {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        if names.contains(&name) && !out.contains_key(name) {
            if let Some(off) = file_offset(&file, s.address()) {
                out.insert(name.to_string(), off);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usdt_note_names_match_whole_strings() {
        let mut note = vec![0u8; 24];
        note.extend_from_slice(b"pytorch\0malloc\0-8@%rax -1@%dl\0");
        assert!(has_usdt(&note, "pytorch", "malloc"));
        assert!(!has_usdt(&note, "pytorch", "free"));
        assert!(!has_usdt(&note, "torch", "mallo"));
    }

    #[test]
    fn the_bfc_signatures_demangle_as_expected() {
        // The mangled names as in jaxlib's xla_cuda_plugin.so and TensorFlow 2.20's libtensorflow_framework.so.2.
        for (m, want) in [
            ("_ZN3tsl12BFCAllocator11AllocateRawEmmRKNS_20AllocationAttributesE", BFC_ALLOCATE),
            ("_ZN3tsl12BFCAllocator11AllocateRawEmm", BFC_ALLOCATE_PLAIN),
            ("_ZN3tsl12BFCAllocator13DeallocateRawEPv", BFC_DEALLOCATE),
        ] {
            let d = cpp_demangle::Symbol::new(m).expect("mangled").demangle(&Default::default()).expect("demangles");
            assert_eq!(d, want);
        }
    }

    #[test]
    fn the_allocator_signature_demangles_as_expected() {
        // The mangled names as in PyTorch 2.x's libc10_cuda.so.
        let m = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator6mallocEPPvamP11CUstream_st";
        let d = cpp_demangle::Symbol::new(m).expect("mangled").demangle(&Default::default()).expect("demangles");
        assert!(d.ends_with(TORCH_MALLOC), "{d}");
        let o = "_ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE";
        let d = cpp_demangle::Symbol::new(o).expect("mangled").demangle(&Default::default()).expect("demangles");
        assert_eq!(d, TORCH_OOM_REPORT);
        let f = "_ZN3c104cuda20CUDACachingAllocator6Native16local_raw_deleteEPv";
        let d = cpp_demangle::Symbol::new(f).expect("mangled").demangle(&Default::default()).expect("demangles");
        assert!(d.ends_with(TORCH_FREE), "{d}");
    }
}
