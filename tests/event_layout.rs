//! The Rust `Event` and the C `struct gpufrag_event` (include/gpufrag_event.h) must never drift:
//! this test compiles the header with the system C compiler, prints the size, every field offset and
//! every kind constant, and compares them with the Rust definitions.

use gpufrag::event::{Event, EventKind};
use std::mem::{offset_of, size_of};
use std::process::Command;

const FIELDS: [&str; 15] = [
    "ts_ns", "addr", "size", "requested", "handle", "stream", "device_free", "pid", "tid", "kind",
    "device", "rc", "flags", "op", "_pad",
];

fn rust_offsets() -> Vec<usize> {
    vec![
        offset_of!(Event, ts_ns),
        offset_of!(Event, addr),
        offset_of!(Event, size),
        offset_of!(Event, requested),
        offset_of!(Event, handle),
        offset_of!(Event, stream),
        offset_of!(Event, device_free),
        offset_of!(Event, pid),
        offset_of!(Event, tid),
        offset_of!(Event, kind),
        offset_of!(Event, device),
        offset_of!(Event, rc),
        offset_of!(Event, flags),
        offset_of!(Event, op),
        offset_of!(Event, _pad),
    ]
}

#[test]
fn c_header_and_rust_struct_have_the_same_layout() {
    let dir = std::env::temp_dir().join(format!("gpufrag-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("layout.c");
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"gpufrag_event.h\"\nint main(void){\n");
    c.push_str("printf(\"%zu\\n\", sizeof(struct gpufrag_event));\n");
    for f in FIELDS {
        c.push_str(&format!("printf(\"%zu\\n\", offsetof(struct gpufrag_event, {f}));\n"));
    }
    let c_names = [
        "MEM_ALLOC", "MEM_ALLOC_PITCH", "MEM_ALLOC_MANAGED", "MEM_FREE", "ADDRESS_RESERVE", "ADDRESS_FREE",
        "PHYS_CREATE", "PHYS_RELEASE", "MAP", "UNMAP", "POOL_ALLOC", "POOL_FREE", "POOL_TRIM", "BLOCK_ALLOC",
        "BLOCK_FREE", "ALLOC_FAILED", "DEVICE_INFO", "PROCESS_EXEC", "PROCESS_EXIT", "DROPPED", "POOL_RESERVED", "ADOPT",
    ];
    for n in c_names {
        c.push_str(&format!("printf(\"%d\\n\", (int)GPUFRAG_EV_{n});\n"));
    }
    c.push_str("printf(\"%d\\n\", (int)GPUFRAG_EV_KIND_COUNT);\nreturn 0;}\n");
    std::fs::write(&src, c).expect("write layout.c");
    let exe = dir.join("layout");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I", include, "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run the C compiler");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().expect("run layout probe");
    let nums: Vec<usize> = String::from_utf8_lossy(&run.stdout).lines().map(|l| l.parse().expect("number")).collect();
    assert_eq!(nums[0], size_of::<Event>(), "sizeof differs: C {} vs Rust {}", nums[0], size_of::<Event>());
    let rust = rust_offsets();
    for (i, f) in FIELDS.iter().enumerate() {
        assert_eq!(nums[1 + i], rust[i], "offset of {f} differs: C {} vs Rust {}", nums[1 + i], rust[i]);
    }
    let kinds = &nums[1 + FIELDS.len()..];
    assert_eq!(kinds.len(), c_names.len() + 1);
    for (i, k) in EventKind::ALL.iter().enumerate() {
        assert_eq!(kinds[i], *k as usize, "kind {} is {} in C but {} in Rust", c_names[i], kinds[i], *k as u16);
    }
    assert_eq!(kinds[c_names.len()], EventKind::ALL.len() + 1, "GPUFRAG_EV_KIND_COUNT");
    let _ = std::fs::remove_dir_all(&dir);
}
