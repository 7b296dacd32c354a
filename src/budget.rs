//! The memory budget of the commands that read a file (`analyze`, `report`, `whatif`,
//! `top --replay`): the most bytes they may hold for what grows with the input (a replay's
//! events, a request stream, a pickle's values, the OOMs of a record), and the one-line error
//! that names the file and the flag when an input would need more.
//!
//! Why a budget and not only streaming: most of what `analyze` holds is streamed (a record is
//! read entry by entry, docs/benchmarks.md states the bytes per event), but some views need the
//! whole history (the report's timeline plays every event back; `whatif` simulates every request
//! under each setting), and an allocation that fails aborts the process with a backtrace. The
//! holders [`charge`] what they are about to hold and stop with [`Over`] past the budget.
//!
//! The budget is `--max-memory` (or `GPUFRAG_MAX_MEMORY`); by default three quarters of the
//! address-space limit (`ulimit -v`) when one is set, else three quarters of the machine's
//! memory, so that `ulimit -v 2097152` ends in the budget's error, not in an abort.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// 0: not set yet (the default applies).
static BUDGET: AtomicU64 = AtomicU64::new(0);

/// Why an input was not read: it would need more memory than the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {what} would hold {needed} MiB, more than the memory budget of {budget} MiB (raise it with --max-memory BYTES or GPUFRAG_MAX_MEMORY; the default is 3/4 of ulimit -v, else of the machine's memory)", needed = .needed >> 20, budget = .budget >> 20)]
pub struct Over {
    /// The input.
    pub file: String,
    /// What would grow past the budget ("the replay of 52,428,800 events").
    pub what: String,
    /// Bytes it would hold.
    pub needed: u64,
    /// The budget in bytes.
    pub budget: u64,
}

/// The default: 3/4 of `RLIMIT_AS` when finite, else 3/4 of physical memory, else unlimited.
pub fn default_budget() -> u64 {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    let limited = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0 && rl.rlim_cur != libc::RLIM_INFINITY;
    if limited {
        return rl.rlim_cur / 4 * 3;
    }
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    match (u64::try_from(pages), u64::try_from(page)) {
        (Ok(p), Ok(s)) if p > 0 && s > 0 => p.saturating_mul(s) / 4 * 3,
        _ => u64::MAX,
    }
}

/// The budget in bytes.
pub fn budget() -> u64 {
    match BUDGET.load(Ordering::Relaxed) {
        0 => {
            let b = default_budget().max(1);
            BUDGET.store(b, Ordering::Relaxed);
            b
        }
        b => b,
    }
}

/// Sets the budget for the whole process (`--max-memory`); 0 restores the default.
pub fn set(bytes: u64) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// Fails when holding `bytes` (everything the caller holds for `what`, not an increment) would
/// pass the budget.
pub fn charge(file: &Path, what: impl FnOnce() -> String, bytes: u64) -> Result<(), Over> {
    let budget = budget();
    if bytes <= budget {
        return Ok(());
    }
    Err(Over { file: file.display().to_string(), what: what(), needed: bytes, budget })
}

/// Bytes a vector holds (its capacity, which is what the allocator gave it).
pub fn vec_bytes<T>(v: &Vec<T>) -> u64 {
    (v.capacity() as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

/// Bytes a vector needs to take one more item: its capacity, and when it is full, the doubled
/// buffer it allocates while the old one is still held (the moment an allocation would fail).
pub fn vec_growth_bytes<T>(v: &Vec<T>) -> u64 {
    let held = vec_bytes(v);
    if v.len() < v.capacity() {
        return held;
    }
    let next = (v.capacity().max(4) as u64).saturating_mul(2).saturating_mul(std::mem::size_of::<T>() as u64);
    held.saturating_add(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_the_budget_is_one_line_naming_the_file_and_the_flag() {
        let e = Over { file: "/tmp/x.rec".into(), what: "the replay of 1,000 events".into(), needed: 300 << 20, budget: 256 << 20 };
        let m = e.to_string();
        assert!(!m.contains('\n'), "{m}");
        assert!(m.starts_with("/tmp/x.rec: the replay of 1,000 events would hold 300 MiB, more than the memory budget of 256 MiB"), "{m}");
        assert!(m.contains("--max-memory"), "{m}");
    }
}
