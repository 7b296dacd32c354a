//! Shell completions and man pages generated from the CLI definition (issue 27 item 7): bash's
//! completion function, sourced in a real bash, completes subcommands and flags as a user's
//! <TAB> would; every man page renders with man(1) and documents its subcommand's flags; a symlink
//! planted at a page's name is replaced, its target untouched.

mod tool_support;

use std::path::Path;
use std::process::Command;

/// A fresh folder of this test's own under cargo's temporary directory.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-docs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch");
    d
}

fn gpufrag(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).output().expect("run gpufrag")
}

/// What bash's completion gives for the words typed so far (the last one being completed).
fn complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cmd = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; _gpufrag gpufrag '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        if words.len() > 1 { words[words.len() - 2] } else { "" }
    );
    let out = Command::new("bash").arg("-c").arg(&cmd).output().expect("bash");
    assert!(out.status.success(), "bash: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn bash_completion_completes_subcommands_and_flags_as_the_cli_defines_them() {
    let out = gpufrag(&["completions", "bash"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = scratch("bash");
    let script = dir.join("gpufrag.bash");
    std::fs::write(&script, &out.stdout).expect("write");
    let subs = complete(&script, &["gpufrag", ""]);
    for s in ["analyze", "run", "demo", "report", "top", "attach", "agent", "whatif", "completions", "man"] {
        assert!(subs.iter().any(|c| c == s), "`gpufrag <TAB>` offers {s}: {subs:?}");
    }
    assert_eq!(complete(&script, &["gpufrag", "wh"]), vec!["whatif"], "gpufrag wh<TAB>");
    let flags = complete(&script, &["gpufrag", "run", "--rec"]);
    assert_eq!(flags, vec!["--record"], "gpufrag run --rec<TAB>");
    let top = complete(&script, &["gpufrag", "top", "--"]);
    for f in ["--once", "--replay", "--connect", "--width"] {
        assert!(top.iter().any(|c| c == f), "gpufrag top --<TAB> offers {f}: {top:?}");
    }
    let shells = complete(&script, &["gpufrag", "completions", ""]);
    for s in ["bash", "zsh", "fish"] {
        assert!(shells.iter().any(|c| c == s), "gpufrag completions <TAB> offers {s}: {shells:?}");
    }
    // The other shells' scripts name every subcommand too.
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = gpufrag(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            ["whatif", "attach", "agent", "record"].iter().all(|w| text.contains(w)),
            "{shell}'s script names the subcommands and flags"
        );
    }
    let bad = gpufrag(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "an unknown shell is a usage error");
}

#[test]
fn every_man_page_renders_and_documents_its_subcommands_flags() {
    if Command::new("man").arg("--version").output().is_err() {
        tool_support::missing("man", "apt-get install man-db");
        return;
    }
    let dir = scratch("man");
    // A symlink planted at a page's name: replaced, never followed.
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep").expect("write");
    std::os::unix::fs::symlink(&victim, dir.join("gpufrag-run.1")).expect("symlink");
    let out = gpufrag(&["man", "--dir", &dir.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&victim).expect("victim"), b"keep", "the symlink's target is untouched");
    assert!(!std::fs::symlink_metadata(dir.join("gpufrag-run.1")).expect("page").file_type().is_symlink());
    let want: &[(&str, &[&str])] = &[
        ("gpufrag", &["analyze", "whatif", "agent", "completions"]),
        ("gpufrag-run", &["--record", "--summary-json", "--prometheus", "--otlp"]),
        ("gpufrag-agent", &["--record", "--lib"]),
        ("gpufrag-whatif", &["--min-memory", "--together"]),
        ("gpufrag-top", &["--once", "--replay"]),
        ("gpufrag-analyze", &["--json"]),
    ];
    for (page, words) in want {
        let path = dir.join(format!("{page}.1"));
        let r = Command::new("man").arg("-l").arg(&path).env("MANWIDTH", "100").env("MAN_KEEP_FORMATTING", "0").output().expect("man");
        assert!(r.status.success(), "man -l {}: {}", path.display(), String::from_utf8_lossy(&r.stderr));
        // man's overstriking (bold "N\bN", underline "_\bx") undone as col -b does.
        let mut text = String::new();
        for c in String::from_utf8_lossy(&r.stdout).chars() {
            match c {
                '\u{8}' => drop(text.pop()),
                '\u{2010}' => text.push('-'),
                c => text.push(c),
            }
        }
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{page}:\n{text}");
        for w in *words {
            assert!(text.contains(w), "{page}(1) documents {w}:\n{text}");
        }
    }
    // Without --dir, gpufrag(1) on stdout.
    let out = gpufrag(&["man"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with(".ie"), "roff on stdout");
    let out = gpufrag(&["man", "--dir", "/nonexistent/dir"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dir"));
}
