//! The Rust `Event` and the C `struct gpufrag_event` (include/gpufrag_event.h) must never drift:
//! this test compiles the header with the system C compiler, prints the size, every field offset,
//! every kind constant and every flag bit, and compares them with the Rust definitions. And the
//! Python start-up hook's connection module (python/_gpufrag/conn.py), which packs its hello, its
//! frames and its wire events with `struct`, is imported and run for real against the Rust
//! definitions of the hello, the frames the consumer reads and the event.

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
const FLAGS: [(&str, u32); 17] = [
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
    ("PARTIAL", event::F_PARTIAL),
    ("OWNER_KNOWN", event::F_OWNER_KNOWN),
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
    assert_eq!(all & event::F_ALLOC_ID_MASK, 0, "the allocator field (bits 16-19) overlaps a flag");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Python hook's connection module (python/_gpufrag/conn.py) imported and run by python3:
/// its `hello()` decoded by the Rust `Hello` (the pid, parent, start time, source and name it sends
/// are the ones the consumer reads); every frame kind it names and every struct format it packs,
/// against the consumer's definitions; its wire event against the 80-byte record and its event
/// kinds and flags against the Rust ones. The hook's other modules send frames only through
/// `conn.PY_*` names (checked below by reading them), so this covers every frame it sends.
#[test]
fn python_hook_hello_and_frames_match_the_rust_definitions() {
    use gpufrag::consumer::{
        PY_ARMED, PY_ARMED_BYTES, PY_BLOCKS_SOURCE, PY_EVENTS, PY_FRACTION, PY_FRACTION_BYTES, PY_FRAMEWORK, PY_FRAMEWORK_OOM,
        PY_HEADER_BYTES, PY_MAGIC, PY_OOM, PY_OOM_ALLOWED, PY_OOM_ALLOWED_BYTES, PY_OOM_BYTES, PY_SETTINGS, PY_SNAPSHOT, PY_STATS,
    };
    use gpufrag::hello::{Hello, HELLO_BYTES, SOURCE_PYTHON};
    if std::process::Command::new("python3").arg("--version").output().is_err() {
        tool_support::missing("python3", "apt-get install python3");
        return;
    }
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let script = r#"
import os, struct, sys, json
sys.path.insert(0, sys.argv[1])
from _gpufrag import conn as c
b = c.hello()
start = int(open('/proc/self/stat', 'rb').read().rsplit(b')', 1)[1].split()[19])
print(json.dumps({
    "hello": b.hex(), "pid": os.getpid(), "ppid": os.getppid(), "start": start,
    "kinds": {k: v for k, v in vars(c).items() if k.startswith("PY_")},
    "header": struct.calcsize(c.FRAME_HEADER), "magic": c.FRAME_MAGIC.decode(),
    "bodies": {str(k): struct.calcsize(f) for k, f in c.BODY_FORMATS.items()},
    "json": list(c.JSON_FRAMES), "raw": list(c.RAW_FRAMES),
    "event": c.EVENT.size,
    "event_kinds": {"block_alloc": c.EV_BLOCK_ALLOC, "block_free": c.EV_BLOCK_FREE, "adopt": c.EV_ADOPT},
    "flags": {"block_size_known": c.F_BLOCK_SIZE_KNOWN, "alloc_cupy": c.F_ALLOC_CUPY},
}))
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(python).output().expect("python3");
    assert!(out.status.success(), "the hook's conn module failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from the hook's conn module");
    let num = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));

    let hex = v["hello"].as_str().expect("hello hex");
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    assert_eq!(bytes.len(), HELLO_BYTES, "the hook's hello is {} bytes, the Rust hello {HELLO_BYTES}", bytes.len());
    let h = Hello::from_bytes(bytes.as_slice().try_into().expect("64 bytes")).expect("the hook's hello has the Rust magic");
    assert_eq!((h.pid as u64, h.ppid as u64, h.start_time), (num("pid"), num("ppid"), num("start")), "pid, parent, start time: {h:?}");
    assert_eq!(h.source, SOURCE_PYTHON, "{h:?}");
    assert_eq!(h.ring_bytes, 0, "a Python hook maps no ring: {h:?}");
    assert!(h.exe_name().starts_with("python"), "{h:?}");

    assert_eq!(num("header") as usize, PY_HEADER_BYTES, "the frame header");
    assert_eq!(u32::from_le_bytes(v["magic"].as_str().expect("magic").as_bytes().try_into().expect("4 bytes")), PY_MAGIC);
    let kind = |name: &str| v["kinds"][name].as_u64().unwrap_or_else(|| panic!("conn.{name} is not defined"));
    let rust = [
        ("PY_SNAPSHOT", PY_SNAPSHOT),
        ("PY_OOM", PY_OOM),
        ("PY_ARMED", PY_ARMED),
        ("PY_EVENTS", PY_EVENTS),
        ("PY_STATS", PY_STATS),
        ("PY_FRAMEWORK_OOM", PY_FRAMEWORK_OOM),
        ("PY_BLOCKS_SOURCE", PY_BLOCKS_SOURCE),
        ("PY_OOM_ALLOWED", PY_OOM_ALLOWED),
        ("PY_SETTINGS", PY_SETTINGS),
        ("PY_FRACTION", PY_FRACTION),
        ("PY_FRAMEWORK", PY_FRAMEWORK),
    ];
    for (name, r) in rust {
        assert_eq!(kind(name), r as u64, "conn.{name} against the consumer's {name}");
    }
    assert_eq!(v["kinds"].as_object().map(|o| o.len()), Some(rust.len()), "conn names frames the consumer does not read: {}", v["kinds"]);
    let body = |k: u32| v["bodies"][k.to_string()].as_u64().map(|n| n as usize);
    assert_eq!(body(PY_OOM), Some(PY_OOM_BYTES), "the OOM frame's body");
    assert_eq!(body(PY_OOM_ALLOWED), Some(PY_OOM_ALLOWED_BYTES), "the allowed-bytes frame's body");
    assert_eq!(body(PY_ARMED), Some(PY_ARMED_BYTES), "the armed frame's body");
    assert_eq!(body(PY_FRACTION), Some(PY_FRACTION_BYTES), "the memory-fraction frame's body");
    let listed: Vec<u64> = ["bodies", "json", "raw"]
        .iter()
        .flat_map(|k| match &v[*k] {
            serde_json::Value::Object(o) => o.keys().map(|k| k.parse().expect("kind")).collect::<Vec<u64>>(),
            a => a.as_array().expect("list").iter().map(|n| n.as_u64().expect("kind")).collect(),
        })
        .collect();
    let mut sorted = listed.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), listed.len(), "a frame kind is both struct-packed and not: {listed:?}");
    assert_eq!(sorted, rust.iter().map(|(_, k)| *k as u64).collect::<std::collections::BTreeSet<_>>().into_iter().collect::<Vec<_>>());

    assert_eq!(num("event") as usize, gpufrag::event::EVENT_SIZE, "the hook's EVENT struct");
    assert_eq!(v["event_kinds"]["block_alloc"].as_u64(), Some(EventKind::BlockAlloc as u64));
    assert_eq!(v["event_kinds"]["block_free"].as_u64(), Some(EventKind::BlockFree as u64));
    assert_eq!(v["event_kinds"]["adopt"].as_u64(), Some(EventKind::Adopt as u64));
    assert_eq!(v["flags"]["block_size_known"].as_u64(), Some(event::F_BLOCK_SIZE_KNOWN as u64));
    assert_eq!(v["flags"]["alloc_cupy"].as_u64(), Some(event::F_ALLOC_CUPY as u64));

    // Every frame the hook's modules send goes through a conn.PY_* name: no number by hand.
    for f in std::fs::read_dir(format!("{python}/_gpufrag")).expect("the hook's package") {
        let path = f.expect("entry").path();
        if path.extension().is_none_or(|e| e != "py") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        for call in ["send(", "send_json(", "send_packed("] {
            for part in text.split(call).skip(1) {
                let first = part.split([',', ')']).next().unwrap_or("").trim();
                assert!(
                    first.chars().next().is_none_or(|c| !c.is_ascii_digit()),
                    "{}: {call}{first}, ...: a frame kind by number; use conn's PY_ names",
                    path.display()
                );
            }
        }
    }
}

/// The allocator field as the C header gives it to the BPF program (`allocator_field` in
/// bpf/gpufrag.bpf.c: an annotation's allocator id into bits 16-19) is the wire's.
#[test]
fn the_c_headers_allocator_field_is_the_wires() {
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/gpufrag_event.h")).expect("header");
    let def = |name: &str| -> u32 {
        let v = header.lines().find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name)).unwrap_or_else(|| panic!("no {name}"));
        v.trim().parse().unwrap_or_else(|_| panic!("{name} is {v:?}"))
    };
    let (shift, max) = (def("GPUFRAG_ALLOC_ID_SHIFT"), def("GPUFRAG_ALLOC_ID_MAX"));
    assert_eq!((shift, max << shift), (event::F_ALLOC_ID_SHIFT, event::F_ALLOC_ID_MASK), "shift {shift}, max {max}");
    assert_eq!(event::allocator_field(i64::from(max)), event::F_ALLOC_ID_MASK);
}
