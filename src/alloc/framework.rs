//! Which caching allocator carves a process's segments into blocks: a [`Framework`] is a place in
//! the registration table (`REGISTRY`, src/alloc/mod.rs) and says everything about its allocator
//! through that entry's [`AllocatorModel`]. A block or adopt event names its allocator in its flag
//! bits (the model's `flags`; none = PyTorch, the one every older source meant), the address map
//! applies that allocator's rules, and the outputs name it: a bounded set of values, fit for a
//! metric attribute, written and read by name in JSON.

use super::model::AllocatorModel;
use super::REGISTRY;
use crate::event::{F_ALLOC_CUPY, F_ALLOC_ID_MASK, F_ALLOC_ID_SHIFT, F_ALLOC_XLA_BFC};

/// Every flag bit that may name an allocator: a model's `flags` lies within these.
pub const ALLOC_FLAGS: u32 = F_ALLOC_XLA_BFC | F_ALLOC_CUPY | F_ALLOC_ID_MASK;

/// A caching allocator family: an index into the registration table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Framework(u8);

impl Framework {
    /// PyTorch's `CUDACachingAllocator`.
    pub const PYTORCH: Framework = Framework(0);
    /// XLA's `tsl::BFCAllocator` (JAX; TensorFlow's GPU allocator).
    pub const XLA: Framework = Framework(1);
    /// CuPy's `MemoryPool`.
    pub const CUPY: Framework = Framework(2);

    /// Every registered allocator, in table order.
    pub fn all() -> impl Iterator<Item = Framework> {
        (0..REGISTRY.len()).map(|i| Framework(i as u8))
    }

    /// The allocator's model.
    pub fn model(self) -> &'static dyn AllocatorModel {
        REGISTRY[self.0 as usize]
    }

    /// The allocator a block, adopt or allocator-OOM event's flags name (PyTorch when none or an
    /// unknown one): the place in the allocator field (`F_ALLOC_ID_MASK`) when it holds a
    /// registered one (what gpufrag's sources write for the later allocators, and an
    /// annotation's allocator id, include/gpufrag_annotate.h, for any), else a model's own bits.
    pub fn from_flags(flags: u32) -> Framework {
        let place = ((flags & F_ALLOC_ID_MASK) >> F_ALLOC_ID_SHIFT) as usize;
        if place > 0 && place < REGISTRY.len() {
            return Framework(place as u8);
        }
        let bits = flags & (F_ALLOC_XLA_BFC | F_ALLOC_CUPY);
        Framework::all().find(|f| f.flags() == bits).unwrap_or(Framework::PYTORCH)
    }

    /// The allocator of this name.
    pub fn by_name(name: &str) -> Option<Framework> {
        Framework::all().find(|f| f.name() == name)
    }

    /// The flag bits that name this allocator on the wire: its model's own bits where it has
    /// them (XLA's, CuPy's; none for PyTorch's, the first place), else its place in the table in
    /// the allocator field (`F_ALLOC_ID_MASK`).
    pub fn flags(self) -> u32 {
        match self.model().flags() {
            0 if self.0 > 0 => (self.0 as u32) << F_ALLOC_ID_SHIFT,
            own => own,
        }
    }

    /// The name used in JSON, metric attributes and on screen.
    pub fn name(self) -> &'static str {
        self.model().name()
    }

    /// The allocator's own name, for sentences.
    pub fn allocator(self) -> &'static str {
        self.model().allocator()
    }
}

impl std::fmt::Debug for Framework {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Framework {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Framework {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Framework, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Framework::by_name(&name).ok_or_else(|| {
            let known: Vec<&str> = Framework::all().map(Framework::name).collect();
            serde::de::Error::custom(format!("unknown allocator {name:?} (known: {})", known.join(", ")))
        })
    }
}

/// A framework's own statistics as its Python API reports them (`jax.Device.memory_stats()`,
/// CuPy's `MemoryPool.used_bytes()` / `total_bytes()` / `free_bytes()`), sent by the Python hook
/// under `gpufrag run`: figures that name their source, next to the ones gpufrag computes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FrameworkReport {
    /// Process.
    #[serde(default)]
    pub pid: u32,
    /// The allocator reported on.
    pub framework: Framework,
    /// The call that gave the figures.
    pub source: String,
    /// `periodic`, `oom` (read right after an out-of-memory error) or `exit`.
    pub when: String,
    /// Device ordinal.
    pub device: i16,
    /// The figures, by the framework's own names (bytes, counts).
    pub stats: std::collections::BTreeMap<String, u64>,
}

impl FrameworkReport {
    /// The figures on one line, in the framework's own names.
    pub fn line(&self) -> String {
        let keys = self.framework.model().report_keys();
        let figs: Vec<String> = keys.iter().filter_map(|k| self.stats.get(*k).map(|v| format!("{k}={v}"))).collect();
        format!(
            "pid {} device {}: {} ({}, {}): {}",
            self.pid,
            self.device,
            self.framework.allocator(),
            self.source,
            self.when,
            figs.join(" ")
        )
    }
}

impl std::fmt::Display for Framework {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_round_trip_and_no_flag_means_pytorch() {
        for f in Framework::all() {
            assert_eq!(Framework::from_flags(f.flags() | 0b111), f);
            assert_eq!(f.flags() & !ALLOC_FLAGS, 0, "{f}'s flags lie outside the allocator bits");
            assert_eq!(Framework::by_name(f.name()), Some(f));
            let json = serde_json::to_string(&f).expect("serialize");
            assert_eq!(json, format!("\"{}\"", f.name()));
            assert_eq!(serde_json::from_str::<Framework>(&json).expect("deserialize"), f);
        }
        assert_eq!(Framework::from_flags(0), Framework::PYTORCH);
        let names: Vec<&str> = Framework::all().map(Framework::name).collect();
        assert_eq!(names[..3], ["pytorch", "xla", "cupy"], "the consts name these places of the table");
        let flags: std::collections::BTreeSet<u32> = Framework::all().map(Framework::flags).collect();
        assert_eq!(flags.len(), names.len(), "two allocators share flag bits");
        assert!(serde_json::from_str::<Framework>("\"tensorflow_nope\"").is_err());
        assert!(REGISTRY.len() <= 16, "the allocator field holds places 0 to 15");
    }

    /// An annotation names any allocator by its place in the allocator field (the header's
    /// `GPUFRAG_ALLOCATOR_*` ids), the two with bits of their own included; a place no model
    /// holds is the default, and an event without the field keeps its own bits' meaning.
    #[test]
    fn the_allocator_field_names_any_registered_place_and_an_unknown_one_is_pytorch() {
        for (place, f) in Framework::all().enumerate() {
            let field = crate::event::allocator_field(place as i64);
            assert_eq!(Framework::from_flags(field | crate::event::F_SRC_USDT), f, "place {place}: {field:#x}");
        }
        for place in REGISTRY.len() as i64..16 {
            assert_eq!(Framework::from_flags(crate::event::allocator_field(place)), Framework::PYTORCH, "unregistered place {place}");
        }
        assert_eq!(Framework::from_flags(F_ALLOC_XLA_BFC), Framework::XLA);
        assert_eq!(Framework::from_flags(F_ALLOC_CUPY), Framework::CUPY);
        assert_eq!(Framework::from_flags(F_ALLOC_XLA_BFC | F_ALLOC_CUPY), Framework::PYTORCH, "two own bits name none");
    }
}
