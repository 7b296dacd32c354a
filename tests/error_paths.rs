//! Every error about a file names the file, and a decoding error the offset where it failed
//! (issue 14: "some errors name no path"). Each case is a command a user could type, run as the
//! user would; the error must be one line starting `gpufrag: `, naming the path, with exit 2 for
//! bad input or arguments and 1 for an output that cannot be written or a feed that is not there.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufrag-error-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Runs `gpufrag ARGS` in `dir` and checks its error: one line, naming `names` (and `also`).
fn fails_naming(dir: &Path, args: &[&str], code: i32, names: &str, also: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).current_dir(dir).stdin(Stdio::null()).output().expect("run gpufrag");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("gpufrag {}: exit {:?}, stderr: {stderr}", args.join(" "), out.status.code());
    assert_eq!(out.status.code(), Some(code), "{what}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line of error: {what}");
    assert!(lines[0].starts_with("gpufrag: "), "{what}");
    assert!(lines[0].contains(names), "the error names {names}: {what}");
    for a in also {
        assert!(lines[0].contains(a), "the error says {a:?}: {what}");
    }
}

#[test]
fn every_error_about_a_file_names_the_file_and_a_decoding_error_its_offset() {
    let dir = scratch();
    let pickle = std::fs::read(fixture("frag_oom.pickle")).expect("fixture");
    let record = std::fs::read(fixture("gpt2_run_h200.rec")).expect("fixture");
    std::fs::write(dir.join("empty.pickle"), b"").expect("write");
    std::fs::write(dir.join("cut.pickle"), &pickle[..300]).expect("write");
    std::fs::write(dir.join("bad_opcode.pickle"), b"\x80\x04N\xffN.").expect("write");
    std::fs::write(dir.join("short.rec"), &record[..10]).expect("write");
    let mut version = record.clone();
    version[8] = 99;
    std::fs::write(dir.join("version.rec"), &version).expect("write");
    let mut gz = Vec::new();
    {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::fast());
        enc.write_all(&pickle[..100]).expect("compress");
        enc.finish().expect("finish");
    }
    std::fs::write(dir.join("cut.pickle.gz"), &gz).expect("write");
    std::fs::write(dir.join("cut_stream.pickle.gz"), &gz[..gz.len() / 2]).expect("write");
    std::fs::create_dir_all(dir.join("a_dir")).expect("dir");
    let good = fixture("frag_oom.pickle");
    let good = good.to_str().expect("utf-8");

    // Inputs: missing, a directory, empty, cut short, a bad opcode, record headers, gzip.
    for reader in [&["analyze"][..], &["report", "-o", "r.html"], &["whatif"], &["top", "--speed", "0", "--replay"]] {
        let with = |f: &'static str| -> Vec<&'static str> { [reader, &[f]].concat() };
        fails_naming(&dir, &with("missing.pickle"), 2, "missing.pickle", &["No such file"]);
        fails_naming(&dir, &with("a_dir"), 2, "a_dir", &[]);
        fails_naming(&dir, &with("empty.pickle"), 2, "empty.pickle", &[]);
        fails_naming(&dir, &with("cut.pickle"), 2, "cut.pickle", &["at byte 300"]);
        fails_naming(&dir, &with("bad_opcode.pickle"), 2, "bad_opcode.pickle", &["at byte 3"]);
        fails_naming(&dir, &with("short.rec"), 2, "short.rec", &["offset 0"]);
        fails_naming(&dir, &with("version.rec"), 2, "version.rec", &["version 99"]);
        fails_naming(&dir, &with("cut.pickle.gz"), 2, "cut.pickle.gz", &["at byte 100 of the decompressed pickle"]);
        fails_naming(&dir, &with("cut_stream.pickle.gz"), 2, "cut_stream.pickle.gz", &["at byte"]);
    }
    // Outputs that cannot be written.
    fails_naming(&dir, &["report", good, "-o", "no_dir/r.html"], 1, "no_dir/r.html", &[]);
    fails_naming(&dir, &["report", good, "-o", "a_dir"], 1, "a_dir", &[]);
    fails_naming(&dir, &["report", good, "--memviz", "no_dir/m.pickle"], 1, "no_dir/m.pickle", &[]);
    for flag in ["--record", "--summary-json", "--feed", "--memviz", "--report"] {
        fails_naming(&dir, &["run", flag, "no_dir/out", "--", "true"], 2, "no_dir/out", &[flag]);
    }
    fails_naming(&dir, &["run", "--record", "a_dir", "--", "true"], 2, "a_dir", &["--record"]);
    fails_naming(&dir, &["top", "--connect", "missing.sock"], 1, "missing.sock", &[]);
    let _ = std::fs::remove_dir_all(&dir);
}
