//! The layering of `src/`: reads every `crate::` and `super::` path in src/**/*.rs (comments,
//! strings and `#[cfg(test)]` modules left out), builds the import graph between top-level
//! modules, and fails, printing the offending arrows or the cycle, when a module imports from a
//! layer it may not, or when the top-level modules import each other in a circle.
//!
//! The layers (README.md, "Where things are", says the same):
//!
//! ```text
//! foundation  event hello owner ring (the wire crate), units, alloc (every allocator model)
//! state       map, ingest, attribution          may import: foundation
//! sources     snapshot record source consumer ebpf input
//!                                               may import: foundation, state
//! analysis    analysis                          may import: foundation, state, sources
//! simulation  sim foresight                     may import: foundation, state, analysis, sources
//! outputs     observe export views              may import: all of the above
//! pipeline    live                              may import: all of the above
//! cli         cli, guard                        may import: everything
//! ```
//!
//! Data flows sources → state → analysis → outputs; a source may read the state it feeds (the
//! Python hook's blocks are diffed against it, eBPF coverage compares NVML with it) but never the
//! analysis, an output, the pipeline or the command line; the analysis may read inputs (the
//! what-if simulation replays a snapshot's request stream).
//!
//! Rerun with `cargo test --release --test layering -- --nocapture` to see the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer, its top-level modules, and the layers it may import from (besides itself).
const LAYERS: &[(&str, &[&str], &[&str])] = &[
    ("foundation", &["event", "hello", "owner", "ring", "units", "alloc", "private", "terminal", "budget"], &[]),
    ("state", &["map", "ingest", "attribution", "limits"], &["foundation"]),
    ("sources", &["snapshot", "record", "source", "consumer", "ebpf", "input"], &["foundation", "state"]),
    ("analysis", &["analysis"], &["foundation", "state", "sources"]),
    ("simulation", &["sim", "foresight"], &["foundation", "state", "analysis", "sources"]),
    ("outputs", &["observe", "export", "views"], &["foundation", "state", "analysis", "sources", "simulation"]),
    ("pipeline", &["live"], &["foundation", "state", "analysis", "sources", "simulation", "outputs"]),
    ("cli", &["cli", "guard"], &["foundation", "state", "analysis", "sources", "simulation", "outputs", "pipeline"]),
];

fn layer_of(module: &str) -> Option<&'static str> {
    LAYERS.iter().find(|(_, mods, _)| mods.contains(&module)).map(|(l, _, _)| *l)
}

fn may_import(from: &str, to: &str) -> bool {
    from == to || LAYERS.iter().any(|(l, _, allowed)| *l == from && allowed.contains(&to))
}

/// The source with comments, string and char literals blanked (their newlines kept), so that
/// neither a doc link nor a message text counts as an import.
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || (next == Some('#') && !b.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')))
        {
            // Raw string r"..." / r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if b[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if b.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` without the bodies of `#[cfg(test)]` items (test modules may reach anywhere).
fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // Skip to the item's end: its `;` or its balanced `{ ... }`.
        let mut depth = 0usize;
        let mut end = after.len();
        for (k, ch) in after.char_indices().skip("#[cfg(test)]".len()) {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        out.extend(after[..end].chars().filter(|&c| c == '\n'));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The module path of a file under src/: src/a/b.rs → [a, b], src/a/mod.rs → [a], lib.rs → [].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" && stem != "lib" && stem != "main" {
            parts.push(stem);
        }
    }
    parts
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first identifiers of a `{a, b::c, d}` group (the text just after its `{`).
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut start = true;
    for (k, ch) in s.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && (c.is_alphanumeric() || c == '_') => {
                heads.push(ident_at(&s[k..]).to_string());
                start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The top-level modules a file's code names, each with the line it is first named on.
fn imports(code: &str, module: &[String]) -> BTreeMap<String, usize> {
    let mut found = BTreeMap::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let bytes = code.as_bytes();
    let mut add = |name: String, at: usize| {
        found.entry(name).or_insert_with(|| line_of(at));
    };
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b'$') {
            continue; // gpufrag_crate::, $crate::
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            for h in group_heads(group) {
                add(h, at);
            }
        } else {
            add(ident_at(rest).to_string(), at);
        }
    }
    for (at, _) in code.match_indices("super::") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
            continue; // part of super::super:: (handled from its first super)
        }
        let mut rest = &code[at..];
        let mut path = module.to_vec();
        while let Some(r) = rest.strip_prefix("super::") {
            path.pop();
            rest = r;
        }
        match path.first() {
            Some(top) => add(top.clone(), at),
            None => {
                if let Some(group) = rest.strip_prefix('{') {
                    for h in group_heads(group) {
                        add(h, at);
                    }
                } else {
                    add(ident_at(rest).to_string(), at);
                }
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// (from, to) → the first place (file:line) the arrow is drawn.
type Graph = BTreeMap<(String, String), String>;

fn graph() -> (Graph, BTreeSet<String>) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g = Graph::new();
    let mut modules = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src");
        let module = module_path(rel);
        let Some(from) = module.first().cloned() else { continue }; // lib.rs, main.rs: the roots
        modules.insert(from.clone());
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let code = without_test_items(&code_only(&text));
        for (to, line) in imports(&code, &module) {
            if to != from && !to.is_empty() {
                g.entry((from.clone(), to)).or_insert_with(|| format!("src/{}:{line}", rel.display()));
            }
        }
    }
    (g, modules)
}

/// A cycle among the arrows, if there is one, as the list of modules around it.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in g.keys() {
        next.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(n, 1);
        stack.push(n);
        for &m in next.get(n).map(Vec::as_slice).unwrap_or(&[]) {
            match state.get(m) {
                Some(1) => {
                    let from = stack.iter().position(|x| *x == m).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[from..].iter().map(|s| s.to_string()).collect();
                    cycle.push(m.to_string());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, next, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n, 2);
        None
    }
    let mut state = BTreeMap::new();
    for &n in next.keys() {
        if !state.contains_key(n) {
            if let Some(c) = visit(n, &next, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn print_graph(g: &Graph) {
    println!("import graph of src/ (from -> to: first place):");
    for ((a, b), at) in g {
        println!("  {a:9} ({:10}) -> {b:9} ({:10})  {at}", layer_of(a).unwrap_or("?"), layer_of(b).unwrap_or("?"));
    }
}

#[test]
fn src_modules_import_only_their_own_or_lower_layers_and_form_no_cycle() {
    let (g, modules) = graph();
    print_graph(&g);
    let unplaced: Vec<&String> = modules.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(unplaced.is_empty(), "top-level modules with no layer in tests/layering.rs (add them to LAYERS and README.md): {unplaced:?}");
    let wrong: Vec<String> = g
        .iter()
        .filter_map(|((a, b), at)| {
            let (la, lb) = (layer_of(a)?, layer_of(b)?);
            (!may_import(la, lb)).then(|| format!("{a} ({la}) -> {b} ({lb}) at {at}"))
        })
        .collect();
    let mut problems = Vec::new();
    if !wrong.is_empty() {
        problems.push(format!("arrows against the layer order:\n  {}", wrong.join("\n  ")));
    }
    if let Some(c) = find_cycle(&g) {
        let arrows: Vec<String> = c.windows(2).map(|w| format!("{} -> {} ({})", w[0], w[1], g[&(w[0].clone(), w[1].clone())])).collect();
        problems.push(format!("a cycle between top-level modules: {}\n  {}", c.join(" -> "), arrows.join("\n  ")));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(g.len() > 20, "only {} arrows found: the scan of src/ is broken", g.len());
}

/// The scanner itself against small inputs with a known answer.
#[test]
fn the_import_scan_reads_groups_super_paths_and_skips_comments_strings_and_tests() {
    let src = r#"
//! [`crate::cli`] in a doc comment
use crate::{map::Figures, ingest::{State, histogram}, units};
use super::sibling;
use super::super::views::x;
fn f() { let s = "crate::export"; let c = '{'; g::<'static>(); crate::analysis::fragmentation(); }
/* crate::live */
#[cfg(test)]
mod tests { use crate::cli::Cli; fn t() { let _ = "}"; } }
fn after() { crate::record::read(); }
"#;
    let code = without_test_items(&code_only(src));
    let got: Vec<String> = imports(&code, &["ebpf".into(), "session".into()]).into_keys().collect();
    assert_eq!(got, ["analysis", "ebpf", "ingest", "map", "record", "units", "views"], "{code}");
    let top: Vec<String> = imports(&code_only("use super::consumer::Msg;"), &["input".into()]).into_keys().collect();
    assert_eq!(top, ["consumer"]);
    let mut g = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.insert((a.into(), b.into()), "here".into());
    }
    assert_eq!(find_cycle(&g), Some(vec!["a".to_string(), "b".into(), "c".into(), "a".into()]));
    g.remove(&("c".to_string(), "a".to_string()));
    assert_eq!(find_cycle(&g), None);
}
