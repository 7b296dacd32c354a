//! The caching allocators gpufrag models, one file each, each implementing [`AllocatorModel`]
//! (src/alloc/model.rs): PyTorch's `CUDACachingAllocator` ([`pytorch`]), XLA's BFC allocator
//! ([`bfc`], JAX and TensorFlow), CuPy's memory pool ([`cupy`]) and RAPIDS RMM's
//! `pool_memory_resource` ([`rmm`]). Each file owns its allocator's rules (how a request becomes
//! a block, what is split, what is stranded, what its OOM means and what fixes it); [`REGISTRY`]
//! lists them once, and a [`Framework`] is a place in that list. The address map, the analysis
//! and the simulator all apply the rules from here: the foundation floor, importing nothing but
//! units and the wire's flag bits. Adding an allocator: docs/design.md, "Adding an allocator".

pub mod bfc;
pub mod cupy;
mod framework;
mod model;
pub mod pytorch;
pub mod rmm;

pub use framework::{Framework, FrameworkReport, ALLOC_FLAGS};
pub use model::{AllocatorModel, FreeRun, OomFigures, OomKind, RegionFree, Rules};

/// Every allocator model, once. A [`Framework`] is an index into this table: PyTorch first (the
/// allocator of events that name none), then in the order of [`Framework`]'s constants; a new
/// allocator appends its line.
#[rustfmt::skip]
pub static REGISTRY: &[&dyn AllocatorModel] = &[
    &pytorch::MODEL,
    &bfc::MODEL,
    &cupy::MODEL,
    &rmm::MODEL,
];

/// The libraries an allocator is found in by its symbols, by file name (exact, or followed by a
/// version: `libtensorflow_framework.so.2`), and the allocator they carry: the eBPF probes attach
/// that allocator's uprobes there.
#[rustfmt::skip]
pub static LIBRARIES: &[(&str, Framework)] = &[
    ("xla_cuda_plugin.so", Framework::XLA),
    ("libtensorflow_framework.so", Framework::XLA),
];

/// The allocator carried by the library file `name` (a base name) by [`LIBRARIES`].
pub fn library_allocator(name: &str) -> Option<Framework> {
    LIBRARIES.iter().find(|(lib, _)| name == *lib || name.strip_prefix(lib).is_some_and(|v| v.starts_with('.'))).map(|&(_, f)| f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_names_its_allocator_with_or_without_a_version() {
        assert_eq!(library_allocator("xla_cuda_plugin.so"), Some(Framework::XLA));
        assert_eq!(library_allocator("libtensorflow_framework.so.2"), Some(Framework::XLA));
        assert_eq!(library_allocator("libtensorflow_framework.so"), Some(Framework::XLA));
        assert_eq!(library_allocator("libtensorflow_framework.sox"), None);
        assert_eq!(library_allocator("libcudart.so.13"), None);
    }

    /// The annotation header's allocator ids (an ABI: include/gpufrag_annotate.h) are the places
    /// of the table, one per registered model under its name, and the default is PyTorch's place.
    #[test]
    fn the_annotation_headers_allocator_ids_are_the_registrys_places() {
        let header = include_str!("../../include/gpufrag_annotate.h");
        let ids: Vec<(String, usize)> = header
            .lines()
            .filter_map(|l| l.strip_prefix("#define GPUFRAG_ALLOCATOR_"))
            .map(|l| {
                let mut w = l.split_whitespace();
                let (name, id) = (w.next().unwrap_or_default(), w.next().unwrap_or_default());
                (name.to_ascii_lowercase(), id.parse().unwrap_or_else(|_| panic!("GPUFRAG_ALLOCATOR_{name} is not a number: {l}")))
            })
            .collect();
        for (name, id) in &ids {
            let place = if name == "default" { Some(0) } else { Framework::all().position(|f| f.name() == name) };
            assert_eq!(place, Some(*id), "GPUFRAG_ALLOCATOR_{} is {id}; the registry's place for {name:?}: {place:?}", name.to_uppercase());
        }
        for f in Framework::all() {
            assert!(ids.iter().any(|(n, _)| n == f.name()), "the header has no GPUFRAG_ALLOCATOR_{} for {f}", f.name().to_uppercase());
        }
    }
}
