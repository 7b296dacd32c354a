//! The hello: the first message a traced process sends the consumer on its Unix socket, with the
//! memfd of its event region attached (`SCM_RIGHTS`; the region is K ring lanes, see
//! [`crate::lanes`]). Fixed-size and little-endian, so the shim builds it on the stack. The
//! consumer checks `ring bytes` against the memfd's own size and takes the layout from the
//! region's headers, never from the hello.
//!
//! ```text
//!  0 magic "GFHELLO1"  8 pid u32  12 ppid u32  16 ring bytes u64  24 start time (clock ticks
//!  since boot, /proc/PID/stat field 22) u64  32 flags u32 (bit 0: follows a fork; bit 1: events
//!  stamped in TSC ticks)  36 source u32  40 executable name, 24 bytes NUL-padded
//! ```

/// Magic of a hello.
pub const HELLO_MAGIC: [u8; 8] = *b"GFHELLO1";
/// Bytes in a hello.
pub const HELLO_BYTES: usize = 64;
/// The process is a fork child (re-armed with its own ring).
pub const HELLO_F_FORKED: u32 = 1;
/// The region's events carry raw TSC ticks in `ts_ns`, not `CLOCK_MONOTONIC` ns: the consumer
/// merges its lanes on them and converts each event after the merge ([`crate::clock`]).
pub const HELLO_F_TSC: u32 = 2;
/// Source: the LD_PRELOAD shim.
pub const SOURCE_SHIM: u32 = 1;
/// Source: a Python start-up hook sending allocator snapshots.
pub const SOURCE_PYTHON: u32 = 2;

/// A decoded hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Traced process.
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// Size of the event region (all lanes, headers included).
    pub ring_bytes: u64,
    /// Start time in clock ticks since boot (with pid: a key PID reuse cannot collide with).
    pub start_time: u64,
    /// `HELLO_F_*`.
    pub flags: u32,
    /// `SOURCE_*`.
    pub source: u32,
    /// Executable name (comm), NUL-padded.
    pub exe: [u8; 24],
}

impl Hello {
    /// The wire bytes.
    pub fn to_bytes(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&HELLO_MAGIC);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.ppid.to_le_bytes());
        b[16..24].copy_from_slice(&self.ring_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.start_time.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.source.to_le_bytes());
        b[40..64].copy_from_slice(&self.exe);
        b
    }

    /// Decodes wire bytes; `None` if the magic is wrong.
    pub fn from_bytes(b: &[u8; HELLO_BYTES]) -> Option<Hello> {
        if b[0..8] != HELLO_MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let mut exe = [0u8; 24];
        exe.copy_from_slice(&b[40..64]);
        Some(Hello { pid: u32_at(8), ppid: u32_at(12), ring_bytes: u64_at(16), start_time: u64_at(24), flags: u32_at(32), source: u32_at(36), exe })
    }

    /// The executable name as text.
    pub fn exe_name(&self) -> String {
        let end = self.exe.iter().position(|&c| c == 0).unwrap_or(self.exe.len());
        String::from_utf8_lossy(&self.exe[..end]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut exe = [0u8; 24];
        exe[..6].copy_from_slice(b"python");
        let h = Hello { pid: 1, ppid: 2, ring_bytes: 3, start_time: 4, flags: HELLO_F_FORKED, source: SOURCE_SHIM, exe };
        assert_eq!(Hello::from_bytes(&h.to_bytes()), Some(h));
        assert_eq!(h.exe_name(), "python");
        assert_eq!(Hello::from_bytes(&[0; HELLO_BYTES]), None);
    }
}
