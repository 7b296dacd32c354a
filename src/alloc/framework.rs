//! Which caching allocator carves a process's segments into blocks: PyTorch's, XLA's BFC (JAX,
//! TensorFlow) or CuPy's memory pool. A block or adopt event names its allocator in two flag bits
//! (`F_ALLOC_XLA_BFC`, `F_ALLOC_CUPY`; neither = PyTorch, the one every older source meant), the
//! address map applies that allocator's rules (src/alloc/pytorch.rs, bfc.rs, cupy.rs), and
//! the outputs name it: a bounded set of values, fit for a metric attribute.

use crate::event::{F_ALLOC_CUPY, F_ALLOC_XLA_BFC};

/// A caching allocator family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    /// PyTorch's `CUDACachingAllocator`.
    Pytorch,
    /// XLA's `tsl::BFCAllocator` (JAX; TensorFlow's GPU allocator).
    Xla,
    /// CuPy's `MemoryPool`.
    Cupy,
}

impl Framework {
    /// Every value, in order.
    pub const ALL: [Framework; 3] = [Framework::Pytorch, Framework::Xla, Framework::Cupy];

    /// The allocator a block or adopt event's flags name.
    pub fn from_flags(flags: u32) -> Framework {
        if flags & F_ALLOC_XLA_BFC != 0 {
            Framework::Xla
        } else if flags & F_ALLOC_CUPY != 0 {
            Framework::Cupy
        } else {
            Framework::Pytorch
        }
    }

    /// The flag bits that name this allocator on the wire.
    pub fn flags(self) -> u32 {
        match self {
            Framework::Pytorch => 0,
            Framework::Xla => F_ALLOC_XLA_BFC,
            Framework::Cupy => F_ALLOC_CUPY,
        }
    }

    /// The name used in JSON, metric attributes and on screen.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Pytorch => "pytorch",
            Framework::Xla => "xla",
            Framework::Cupy => "cupy",
        }
    }

    /// The allocator's own name, for sentences.
    pub fn allocator(self) -> &'static str {
        match self {
            Framework::Pytorch => "PyTorch's caching allocator",
            Framework::Xla => "XLA's BFC allocator",
            Framework::Cupy => "CuPy's memory pool",
        }
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
        let keys: &[&str] = match self.framework {
            Framework::Xla => &["bytes_in_use", "largest_free_block_bytes", "pool_bytes", "bytes_limit", "peak_bytes_in_use", "num_allocs"],
            Framework::Cupy => &["used_bytes", "total_bytes", "free_bytes"],
            Framework::Pytorch => &[],
        };
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
        for f in Framework::ALL {
            assert_eq!(Framework::from_flags(f.flags() | 0b111), f);
        }
        assert_eq!(Framework::from_flags(0), Framework::Pytorch);
    }
}
