//! The hello: the first message a traced process sends the consumer on its Unix socket, with the
//! memfd of its event region attached (`SCM_RIGHTS`; the region is K ring lanes, see
//! [`crate::lanes`]). Fixed-size and little-endian, so the shim builds it on the stack. The
//! consumer checks `ring bytes` against the memfd's own size and takes the layout from the
//! region's headers, never from the hello.
//!
//! ```text
//!  0 magic "GFHELLO1"  8 pid u32  12 ppid u32  16 ring bytes u64  24 start time (clock ticks
//!  since boot, /proc/PID/stat field 22) u64  32 flags u32 (bit 0: follows a fork; bit 1: events
//!  stamped in TSC ticks; bit 2: an environment block follows)  36 source u32  40 executable
//!  name, 24 bytes NUL-padded
//! ```
//!
//! With `HELLO_F_ENV` the hello is followed, in the same stream, by an environment block: a u16
//! length (at most [`HELLO_ENV_MAX`]) and that many bytes of NUL-terminated `KEY=VALUE` pairs,
//! the process's values of [`HELLO_ENV_KEYS`] when it armed (after any `setenv` the program made
//! before its first CUDA call). The consumer needs them to place the process's CUDA ordinals on
//! the node's GPUs and to name its pod, and a short-lived process is gone before `/proc` could
//! be read.

/// Magic of a hello.
pub const HELLO_MAGIC: [u8; 8] = *b"GFHELLO1";
/// Bytes in a hello.
pub const HELLO_BYTES: usize = 64;
/// The process is a fork child (re-armed with its own ring).
pub const HELLO_F_FORKED: u32 = 1;
/// The region's events carry raw TSC ticks in `ts_ns`, not `CLOCK_MONOTONIC` ns: the consumer
/// merges its lanes on them and converts each event after the merge ([`crate::clock`]).
pub const HELLO_F_TSC: u32 = 2;
/// An environment block follows the hello (see the module's documentation).
pub const HELLO_F_ENV: u32 = 4;
/// The most bytes of an environment block.
pub const HELLO_ENV_MAX: usize = 1024;
/// The variables an environment block carries: which GPUs the process sees, the names
/// of its Kubernetes pod where the downward API or the kubelet set them, its allocator settings,
/// and the sharing layers' limits (MPS's, and its daemon's pipe folder for the daemon's default;
/// HAMi-core's quota for every device and devices 0..7, and `LD_PRELOAD`, which names the quota
/// library).
pub const HELLO_ENV_KEYS: [&str; 25] = [
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "K8S_POD_NAME",
    "K8S_NAMESPACE_NAME",
    "K8S_POD_UID",
    "K8S_CONTAINER_NAME",
    "POD_NAME",
    "POD_NAMESPACE",
    "HOSTNAME",
    "KUBERNETES_SERVICE_HOST",
    ALLOC_CONF_KEYS[0],
    ALLOC_CONF_KEYS[1],
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "CUDA_DEVICE_MEMORY_LIMIT_2",
    "CUDA_DEVICE_MEMORY_LIMIT_3",
    "CUDA_DEVICE_MEMORY_LIMIT_4",
    "CUDA_DEVICE_MEMORY_LIMIT_5",
    "CUDA_DEVICE_MEMORY_LIMIT_6",
    "CUDA_DEVICE_MEMORY_LIMIT_7",
    "LD_PRELOAD",
];

/// The variables PyTorch's caching allocator takes its settings from, in their order of
/// precedence: the first that is set wins, and when neither is, PyTorch's defaults apply (`""`).
/// The one statement of that order: a process's environment ([`Environ::alloc_conf`], which the
/// live pipeline states as the process's settings at exec) and a snapshot's `allocator_settings`
/// (whose string stands under one of these keys) both follow it through [`first_set`].
pub const ALLOC_CONF_KEYS: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

/// The value of the first of `keys` that `get` finds: how a precedence list (such as
/// [`ALLOC_CONF_KEYS`]) is applied to any map of variables.
pub fn first_set<'k, V>(keys: &[&'k str], get: impl FnMut(&'k str) -> Option<V>) -> Option<V> {
    let mut get = get;
    keys.iter().find_map(|k| get(k))
}

/// A process's environment, parsed once from its block (`/proc/PID/environ`, or the block that
/// follows a hello): NUL-separated `KEY=VALUE` pairs; a pair without `=` is skipped, and of a
/// key given twice the first is kept, as `getenv(3)` finds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environ(pub std::collections::HashMap<String, String>);

impl Environ {
    /// Parses an environment block (bytes that are not UTF-8 are replaced).
    pub fn parse(block: &[u8]) -> Environ {
        let mut map = std::collections::HashMap::new();
        for kv in block.split(|&b| b == 0) {
            let Some(eq) = kv.iter().position(|&b| b == b'=') else { continue };
            let key = String::from_utf8_lossy(&kv[..eq]).into_owned();
            map.entry(key).or_insert_with(|| String::from_utf8_lossy(&kv[eq + 1..]).into_owned());
        }
        Environ(map)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The allocator settings it gives PyTorch ([`ALLOC_CONF_KEYS`]'s precedence); `""` when
    /// neither variable is set.
    pub fn alloc_conf(&self) -> &str {
        first_set(&ALLOC_CONF_KEYS, |k| self.get(k)).unwrap_or("")
    }
}

/// Writes the environment block of the variables `get` returns into `out`: the u16 length,
/// then the pairs; a pair that does not fit is left out whole. Returns the bytes written.
pub fn env_block(get: impl Fn(&str) -> Option<Vec<u8>>, out: &mut [u8; HELLO_ENV_MAX + 2]) -> usize {
    let mut n = 2;
    for key in HELLO_ENV_KEYS {
        let Some(v) = get(key) else { continue };
        let need = key.len() + 1 + v.len() + 1;
        if v.contains(&0) || n + need > out.len() {
            continue;
        }
        out[n..n + key.len()].copy_from_slice(key.as_bytes());
        out[n + key.len()] = b'=';
        out[n + key.len() + 1..n + need - 1].copy_from_slice(&v);
        out[n + need - 1] = 0;
        n += need;
    }
    out[..2].copy_from_slice(&((n - 2) as u16).to_le_bytes());
    n
}

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
        Some(Hello {
            pid: u32_at(8),
            ppid: u32_at(12),
            ring_bytes: u64_at(16),
            start_time: u64_at(24),
            flags: u32_at(32),
            source: u32_at(36),
            exe,
        })
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

    #[test]
    fn env_blocks_carry_whole_pairs_within_their_bound() {
        let mut out = [0u8; HELLO_ENV_MAX + 2];
        let n = env_block(|k| (k == "CUDA_VISIBLE_DEVICES").then(|| b"2".to_vec()), &mut out);
        assert_eq!(&out[..n], b"\x17\x00CUDA_VISIBLE_DEVICES=2\x00");
        let long = vec![b'x'; 2000];
        let n = env_block(|k| Some(if k == "NVIDIA_VISIBLE_DEVICES" { long.clone() } else { b"1".to_vec() }), &mut out);
        assert!(n <= out.len());
        assert!(!out[..n].windows(3).any(|w| w == b"xxx"), "the pair that does not fit is left out whole");
        assert_eq!(u16::from_le_bytes([out[0], out[1]]) as usize, n - 2);
    }

    /// The precedence of the allocator-settings variables, for every combination of them set,
    /// unset, empty, in either order in the block and given twice, against the rule written out
    /// here by hand: PYTORCH_CUDA_ALLOC_CONF when set (even to ""), else PYTORCH_ALLOC_CONF, else
    /// ""; of a repeated key, its first value.
    #[test]
    fn alloc_conf_precedence_is_cuda_first_then_the_new_name_then_defaults() {
        let cases: [(&[&str], &str); 8] = [
            (&[], ""),
            (&["PYTORCH_ALLOC_CONF=expandable_segments:True"], "expandable_segments:True"),
            (&["PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"], "max_split_size_mb:128"),
            (&["PYTORCH_ALLOC_CONF=expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"], "max_split_size_mb:128"),
            (&["PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128", "PYTORCH_ALLOC_CONF=expandable_segments:True"], "max_split_size_mb:128"),
            (&["PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF=expandable_segments:True"], ""),
            (&["PYTORCH_CUDA_ALLOC_CONF=a:1", "PYTORCH_CUDA_ALLOC_CONF=b:2"], "a:1"),
            (&["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF=c:3", "X=y=z"], "c:3"),
        ];
        for (pairs, want) in cases {
            let block: Vec<u8> = pairs.iter().flat_map(|p| p.bytes().chain([0])).collect();
            let env = Environ::parse(&block);
            assert_eq!(env.alloc_conf(), want, "{pairs:?}");
        }
        assert_eq!(Environ::parse(b"X=y=z\0").get("X"), Some("y=z"));
        assert_eq!(first_set(&ALLOC_CONF_KEYS, |k| (k == "PYTORCH_ALLOC_CONF").then_some(7)), Some(7));
        assert!(ALLOC_CONF_KEYS.iter().all(|k| HELLO_ENV_KEYS.contains(k)), "the block carries both");
    }
}
