//! The Rust `Event` and the C `struct gpufrag_event` (include/gpufrag_event.h) must never drift:
//! this test compiles the header with the system C compiler, prints the size, every field offset,
//! every kind constant and every flag bit, and compares them with the Rust definitions. And the
//! Python start-up hook (python/sitecustomize.py), which packs its hello and its frames by hand
//! with `struct`, is run for real against the Rust definitions of the hello and of the frames the
//! consumer reads.

mod tool_support;

use gpufrag::event::{self, Event, EventKind};
use std::mem::{offset_of, size_of};
use std::process::Command;

const FIELDS: [&str; 15] = [
    "ts_ns",
    "addr",
    "size",
    "requested",
    "handle",
    "stream",
    "device_free",
    "pid",
    "tid",
    "kind",
    "device",
    "rc",
    "flags",
    "op",
    "text_len",
];

/// Every flag bit: its C name (after `GPUFRAG_F_`) and the Rust constant.
const FLAGS: [(&str, u32); 15] = [
    ("DEVICE_FREE_KNOWN", event::F_DEVICE_FREE_KNOWN),
    ("SRC_SHIM", event::F_SRC_SHIM),
    ("SRC_EBPF", event::F_SRC_EBPF),
    ("SRC_SNAPSHOT", event::F_SRC_SNAPSHOT),
    ("SRC_USDT", event::F_SRC_USDT),
    ("BLOCK_SIZE_KNOWN", event::F_BLOCK_SIZE_KNOWN),
    ("FAILED", event::F_FAILED),
    ("FRAMEWORK_OWNED", event::F_FRAMEWORK_OWNED),
    ("ALLOC_XLA_BFC", event::F_ALLOC_XLA_BFC),
    ("ALLOC_CUPY", event::F_ALLOC_CUPY),
    ("SRC_NVML", event::F_SRC_NVML),
    ("COMM", event::F_COMM),
    ("ALLOCATOR_OOM", event::F_ALLOCATOR_OOM),
    ("ALLOWED_KNOWN", event::F_ALLOWED_KNOWN),
    ("OOM_AMEND", event::F_OOM_AMEND),
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
        offset_of!(Event, text_len),
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
    // Each kind's C constant is its Rust name in capitals (`record_end` is GPUFRAG_EV_RECORD_END).
    let c_names: Vec<String> = EventKind::ALL.iter().map(|k| k.name().to_ascii_uppercase()).collect();
    for n in &c_names {
        c.push_str(&format!("printf(\"%d\\n\", (int)GPUFRAG_EV_{n});\n"));
    }
    c.push_str("printf(\"%d\\n\", (int)GPUFRAG_EV_KIND_COUNT);\n");
    for (n, _) in FLAGS {
        c.push_str(&format!("printf(\"%u\\n\", (unsigned)GPUFRAG_F_{n});\n"));
    }
    c.push_str("return 0;}\n");
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
    assert_eq!(kinds.len(), c_names.len() + 1 + FLAGS.len());
    for (i, k) in EventKind::ALL.iter().enumerate() {
        assert_eq!(kinds[i], *k as usize, "kind {} is {} in C but {} in Rust", c_names[i], kinds[i], *k as u16);
    }
    assert_eq!(
        kinds[c_names.len()],
        EventKind::ALL.iter().map(|k| *k as usize).max().unwrap_or(0) + 1,
        "GPUFRAG_EV_KIND_COUNT: one past the largest kind"
    );
    let flags = &kinds[c_names.len() + 1..];
    assert_eq!(flags.len(), FLAGS.len());
    for (i, (n, rust)) in FLAGS.iter().enumerate() {
        assert_eq!(flags[i], *rust as usize, "flag {n} is {:#x} in C but {rust:#x} in Rust", flags[i]);
    }
    // Every flag the header defines is in the list above (a new C flag cannot go unchecked), and
    // no two share a bit.
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/gpufrag_event.h")).expect("header");
    let defined: Vec<&str> =
        header.lines().filter_map(|l| l.strip_prefix("#define GPUFRAG_F_")).filter_map(|l| l.split_whitespace().next()).collect();
    let listed: Vec<&str> = FLAGS.iter().map(|(n, _)| *n).collect();
    assert_eq!(defined, listed, "the header's GPUFRAG_F_* flags vs the ones this test checks");
    let all = FLAGS.iter().fold(0u32, |acc, (n, f)| {
        assert!(f.is_power_of_two() && acc & f == 0, "flag {n} ({f:#x}) is not a bit of its own");
        acc | f
    });
    assert_eq!(all.count_ones() as usize, FLAGS.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Python hook's `hello()` run as it is written (extracted from python/sitecustomize.py and
/// executed by python3), decoded by the Rust `Hello`: the pid, parent, start time, source and
/// name it sends are the ones the consumer reads. And every frame it sends (`send(TYPE,
/// struct.pack(FORMAT, ...))`): the header's and each body's size, and the frame types, against
/// the consumer's definitions.
#[test]
fn python_hook_hello_and_frames_match_the_rust_definitions() {
    use gpufrag::consumer::{
        PY_ARMED, PY_ARMED_BYTES, PY_BLOCKS_SOURCE, PY_EVENTS, PY_FRAMEWORK_OOM, PY_HEADER_BYTES, PY_MAGIC, PY_OOM, PY_OOM_ALLOWED,
        PY_OOM_ALLOWED_BYTES, PY_OOM_BYTES, PY_SNAPSHOT, PY_STATS,
    };
    use gpufrag::hello::{Hello, HELLO_BYTES, SOURCE_PYTHON};
    if std::process::Command::new("python3").arg("--version").output().is_err() {
        tool_support::missing("python3", "apt-get install python3");
        return;
    }
    let hook = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/python/sitecustomize.py")).expect("the hook");
    // The nested `def hello():` block, dedented.
    let lines: Vec<&str> = hook.lines().collect();
    let start = lines.iter().position(|l| l.trim_start().starts_with("def hello():")).expect("def hello() in the hook");
    let indent = lines[start].len() - lines[start].trim_start().len();
    let mut body = vec![lines[start][indent..].to_string()];
    for l in &lines[start + 1..] {
        if !l.trim().is_empty() && l.len() - l.trim_start().len() <= indent {
            break;
        }
        body.push(l.get(indent..).unwrap_or("").to_string());
    }
    let script = format!(
        "import os, struct, sys\n{}\nb = hello()\nprint(len(b), os.getpid(), os.getppid(), int(open('/proc/self/stat','rb').read().rsplit(b')',1)[1].split()[19]))\nprint(b.hex())\n",
        body.join("\n")
    );
    let out = Command::new("python3").arg("-c").arg(&script).output().expect("python3");
    assert!(out.status.success(), "the hook's hello() failed:\n{script}\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.lines();
    let nums: Vec<u64> = it.next().expect("sizes").split_whitespace().map(|n| n.parse().expect("number")).collect();
    let hex = it.next().expect("hex");
    assert_eq!(nums[0] as usize, HELLO_BYTES, "the hook's hello is {} bytes, the Rust hello {HELLO_BYTES}", nums[0]);
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    let h = Hello::from_bytes(bytes.as_slice().try_into().expect("64 bytes")).expect("the hook's hello has the Rust magic");
    assert_eq!((h.pid as u64, h.ppid as u64, h.start_time), (nums[1], nums[2], nums[3]), "pid, parent, start time: {h:?}");
    assert_eq!(h.source, SOURCE_PYTHON, "{h:?}");
    assert_eq!(h.ring_bytes, 0, "a Python hook maps no ring: {h:?}");
    assert!(h.exe_name().starts_with("python"), "{h:?}");

    // Frames: the header format and magic, and each `send(TYPE, struct.pack(FORMAT` with its size.
    let header =
        hook.split("struct.pack(\"").filter_map(|r| r.split('"').next()).find(|f| f.contains("4s")).expect("the frame header's format");
    assert!(hook.contains("b\"GFPY\""), "the hook's frame magic");
    assert_eq!(u32::from_le_bytes(*b"GFPY"), PY_MAGIC);
    let mut sends: Vec<(u32, Option<String>)> = Vec::new();
    // JSON frames go through send_json(TYPE, {...}): their bodies are not struct-packed.
    for part in hook.split("send_json(").skip(1) {
        if let Some(Ok(kind)) = part.split_once(',').map(|(k, _)| k.trim().parse::<u32>()) {
            sends.push((kind, None));
        }
    }
    for part in hook.split("send(").skip(1) {
        let Some((kind, rest)) = part.split_once(',') else { continue };
        let Ok(kind) = kind.trim().parse::<u32>() else { continue };
        let fmt = rest.trim_start().strip_prefix("struct.pack(\"").and_then(|r| r.split('"').next()).map(str::to_string);
        sends.push((kind, fmt));
    }
    let formats: Vec<String> = std::iter::once(header.to_string()).chain(sends.iter().filter_map(|(_, f)| f.clone())).collect();
    let calc = format!("import struct\nfor f in {formats:?}: print(struct.calcsize(f))\n");
    let out = Command::new("python3").arg("-c").arg(&calc).output().expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sizes: Vec<usize> = String::from_utf8_lossy(&out.stdout).lines().map(|l| l.parse().expect("size")).collect();
    assert_eq!(sizes[0], PY_HEADER_BYTES, "frame header {header:?}");
    let mut sized = sizes[1..].iter();
    let mut seen = Vec::new();
    for (kind, fmt) in &sends {
        seen.push(*kind);
        match (*kind, fmt) {
            (k, None) => assert!(
                [PY_SNAPSHOT, PY_EVENTS, PY_STATS, PY_FRAMEWORK_OOM, PY_BLOCKS_SOURCE].contains(&k),
                "frame {k}: only the snapshot, events and JSON frames have bodies that are not struct-packed"
            ),
            (k, Some(f)) => {
                let n = *sized.next().expect("a size per format");
                let want = if k == PY_OOM {
                    PY_OOM_BYTES
                } else if k == PY_OOM_ALLOWED {
                    PY_OOM_ALLOWED_BYTES
                } else if k == PY_ARMED {
                    PY_ARMED_BYTES
                } else {
                    panic!("frame type {k} ({f}) is not one the consumer reads")
                };
                assert_eq!(n, want, "frame {k} packs {f:?}: {n} bytes, the consumer reads {want}");
            }
        }
    }
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen,
        [PY_SNAPSHOT, PY_OOM, PY_ARMED, PY_EVENTS, PY_STATS, PY_FRAMEWORK_OOM, PY_BLOCKS_SOURCE, PY_OOM_ALLOWED],
        "the frames the hook sends"
    );
    // An events frame carries whole wire events: the hook's EVENT struct is the 80-byte record.
    let event_fmt = hook.split("EVENT = struct.Struct(\"").nth(1).and_then(|r| r.split('"').next()).expect("the hook's EVENT format");
    let out =
        Command::new("python3").arg("-c").arg(format!("import struct; print(struct.calcsize({event_fmt:?}))")).output().expect("python3");
    let n: usize = String::from_utf8_lossy(&out.stdout).trim().parse().expect("size");
    assert_eq!(n, gpufrag::event::EVENT_SIZE, "the hook's EVENT {event_fmt:?} is {n} bytes");
}
