//! The module graph of the engine (`forkvm-engine`) and its front-ends
//! (`forkvm-daemon`): no import circles, no file over 800 lines, the graph
//! drawn in `docs/architecture.md` is the one in the code, the engine names
//! no HTTP crate, no front-end reaches the database, the guest agent or
//! QEMU except through the engine, and front-ends name no engine module but
//! its facade (`actions`) and its error.
//!
//! The daemon re-exports engine modules under their own names, so the two
//! crates make one namespace: `crate::db` in the daemon is the engine's
//! `db` (and an engine module it does not re-export cannot be named there
//! at all).
//!
//! The unit of the graph is one source file (`sandbox.rs` is `sandbox`,
//! `snapshot/freeze/mod.rs` is `snapshot::freeze`). An edge `a -> b` means a
//! file of `a` names something in `b` by path: `crate::b::..`, `super::..`,
//! `self::..`, or a child module's name, in `use` items and in expressions
//! alike (comments and strings are ignored). A path is charged to the longest
//! module it names, so `crate::net::types::SandboxNet` is an edge to
//! `net::types`. A parent naming its own descendants (declaring,
//! re-exporting, routing to them) is not an edge: they are part of it. A
//! child naming its parent is one. Methods called through `self` are not
//! seen: the graph is of names, which is what the compiler lets circle.
//!
//! On a mismatch with the document, the test prints the block to paste.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use support::*;

const MAX_LINES: usize = 800;
const BEGIN: &str =
    "<!-- module-graph:begin (generated: cargo test -p forkvm-daemon --test module_graph) -->";
const END: &str = "<!-- module-graph:end -->";

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Sep, // ::
    Open,
    Close,
    Comma,
    Other,
}

fn tokens(code: &str) -> Vec<Tok> {
    let b = code.as_bytes();
    let mut v = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if is_ident(c) {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            v.push(Tok::Ident(code[s..i].to_string()));
            continue;
        }
        match c {
            b':' if b.get(i + 1) == Some(&b':') => {
                v.push(Tok::Sep);
                i += 2;
                continue;
            }
            b'{' => v.push(Tok::Open),
            b'}' => v.push(Tok::Close),
            b',' => v.push(Tok::Comma),
            c if c.is_ascii_whitespace() => {}
            _ => v.push(Tok::Other),
        }
        i += 1;
    }
    v
}

/// Every path a file names that starts at `crate`, `super`, `self` or one of
/// its own child modules, resolved to absolute segments, with the inline
/// module it was written in. `use` groups (`a::{b, c::d}`) are expanded.
fn paths_in(module: &str, src: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let toks = tokens(&strip(src));
    let base: Vec<String> = if module == "crate" {
        vec![]
    } else {
        module.split("::").map(String::from).collect()
    };
    // Inline modules (`mod tests { .. }`): (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(m) if m == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(first) if i == 0 || toks[i - 1] != Tok::Sep => {
                let mut here = base.clone();
                here.extend(inline.iter().map(|(n, _)| n.clone()));
                let start: Option<Vec<String>> = match first.as_str() {
                    "crate" => Some(vec![]),
                    "self" => Some(here.clone()),
                    "super" => {
                        let mut p = here.clone();
                        p.pop();
                        Some(p)
                    }
                    c if inline.is_empty()
                        && children.contains(c)
                        && toks.get(i + 1) == Some(&Tok::Sep) =>
                    {
                        let mut p = here.clone();
                        p.push(c.to_string());
                        Some(p)
                    }
                    _ => None,
                };
                let named = toks.get(i + 1) == Some(&Tok::Sep);
                if let (Some(mut prefix), true) = (start, named) {
                    let mut j = i + 1;
                    // Further `super`s climb on.
                    while toks.get(j) == Some(&Tok::Sep)
                        && toks.get(j + 1) == Some(&Tok::Ident("super".into()))
                    {
                        prefix.pop();
                        j += 2;
                    }
                    let n = expand(&toks, j, prefix, &mut out);
                    i = n;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Read `::seg::seg..` or `::{tree, ..}` from `j`, pushing each full path.
/// Returns the index after what was read.
fn expand(
    toks: &[Tok],
    mut j: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        if toks.get(j) != Some(&Tok::Sep) {
            out.push(prefix);
            return j;
        }
        match toks.get(j + 1) {
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                j += 2;
            }
            Some(Tok::Open) => {
                j += 2;
                loop {
                    match toks.get(j) {
                        Some(Tok::Close) => return j + 1,
                        Some(Tok::Comma) => j += 1,
                        Some(Tok::Ident(s)) => {
                            let mut p = prefix.clone();
                            if s != "self" {
                                p.push(s.clone());
                            }
                            // Pretend a `::` precedes the rest of this item.
                            j = expand(toks, j + 1, p, out);
                        }
                        Some(_) => j += 1,
                        None => return j,
                    }
                }
            }
            _ => {
                out.push(prefix);
                return j + 1;
            }
        }
    }
}

/// The graph of the modules given as (module path, source).
fn graph(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g = Graph::new();
    for (m, src) in files {
        let prefix = if m == "crate" {
            String::new()
        } else {
            format!("{m}::")
        };
        let children: BTreeSet<String> = modules
            .iter()
            .filter_map(|c| c.strip_prefix(&prefix))
            .filter(|rest| !rest.contains("::") && !rest.is_empty())
            .map(String::from)
            .collect();
        let deps = g.entry(m.clone()).or_default();
        for p in paths_in(m, src, &children) {
            // The longest module the path names.
            let target = (0..=p.len())
                .rev()
                .map(|k| {
                    if k == 0 {
                        "crate".to_string()
                    } else {
                        p[..k].join("::")
                    }
                })
                .find(|c| modules.contains(c));
            let Some(t) = target else { continue };
            let inside = m == "crate" || t.starts_with(&prefix);
            if t != *m && !inside {
                deps.insert(t);
            }
        }
    }
    g
}

/// One cycle of the graph, if it has any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &str,
        g: &Graph,
        mark: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        mark.insert(n.to_string(), Mark::Open);
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            match mark.get(d.as_str()).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = stack.iter().position(|s| s == d).unwrap_or(0);
                    let mut c = stack[from..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                Mark::New => {
                    if let Some(c) = visit(d, g, mark, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        mark.insert(n.to_string(), Mark::Done);
        None
    }
    let mut mark = BTreeMap::new();
    for n in g.keys() {
        if mark.get(n.as_str()).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(n, g, &mut mark, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The graph as the document shows it: one line per module.
fn render(g: &Graph) -> String {
    let mut s = String::from("```text\n");
    for (m, deps) in g {
        if m == "crate" {
            continue;
        }
        let d: Vec<&str> = deps.iter().map(String::as_str).collect();
        if d.is_empty() {
            s.push_str(&format!("{m}\n"));
        } else {
            s.push_str(&format!("{m} -> {}\n", d.join(", ")));
        }
    }
    s.push_str("```\n");
    s
}

/// The modules of the front-ends (the daemon's own, besides its lib.rs).
fn is_front_end(module: &str) -> bool {
    let top = module.split("::").next().unwrap_or("");
    matches!(top, "api" | "e2b" | "mcp" | "oci" | "session")
}

/// The engine modules a front-end may name: the facade of typed actions
/// (which also re-exports the few engine types its actions take and give),
/// and the error every action returns, whose kinds and hints each front-end
/// maps to its own protocol. Anything else (the `Manager`, its services,
/// the event bus, the store) is reached through an action or not at all.
const FRONT_END_MAY_REACH: [&str; 2] = ["actions", "error"];

/// How front-end modules break the facade rule: an edge to an engine
/// module (one of `engine`) outside [`FRONT_END_MAY_REACH`], or code that
/// names the `Manager` or the engine crate itself (paths the graph does not
/// follow).
fn front_end_breaches(
    files: &[(String, String)],
    engine: &BTreeSet<String>,
    is_front: impl Fn(&str) -> bool,
) -> Vec<String> {
    let g = graph(files);
    let mut bad = Vec::new();
    for (m, deps) in &g {
        if !is_front(m) {
            continue;
        }
        for d in deps {
            let top = d.split("::").next().unwrap_or("");
            if d != "crate" && engine.contains(d) && !FRONT_END_MAY_REACH.contains(&top) {
                bad.push(format!("{m} -> {d}"));
            }
        }
    }
    for (m, src) in files {
        if !is_front(m) {
            continue;
        }
        for t in tokens(&strip(src)) {
            if let Tok::Ident(i) = t {
                if i == "Manager" || i == "forkvm_engine" {
                    bad.push(format!("{m} names {i}"));
                }
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

fn daemon_graph() -> Graph {
    let mut files = sources(&engine_dir().join("src"));
    files.extend(sources(&crate_dir().join("src")));
    graph(&files)
}

/// The names of a Cargo.toml's `[dependencies]` (not dev-dependencies).
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap_or_default();
    let mut on = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            on = l == "[dependencies]";
            continue;
        }
        if on {
            if let Some((name, _)) = l.split_once('=') {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

#[test]
fn the_engine_names_no_http_crate() {
    const HTTP: [&str; 7] = [
        "axum",
        "hyper",
        "hyper-util",
        "tower",
        "tower-http",
        "http-body-util",
        "utoipa",
    ];
    let deps = dependencies(&engine_dir().join("Cargo.toml"));
    assert!(!deps.is_empty(), "no [dependencies] read from the engine");
    let bad: Vec<&String> = deps.iter().filter(|d| HTTP.contains(&d.as_str())).collect();
    assert!(bad.is_empty(), "the engine depends on HTTP crates: {bad:?}");
    for (m, src) in sources(&engine_dir().join("src")) {
        let code = strip(&src);
        for t in tokens(&code) {
            if let Tok::Ident(i) = t {
                assert!(
                    !["axum", "hyper", "utoipa", "tower_http"].contains(&i.as_str()),
                    "engine module {m} names {i}"
                );
            }
        }
    }
}

#[test]
fn no_front_end_reaches_the_db_the_agent_or_qemu() {
    // Not as crates: the daemon cannot name them.
    let deps = dependencies(&crate_dir().join("Cargo.toml"));
    assert!(deps.contains(&"forkvm-engine".to_string()), "{deps:?}");
    for c in ["forkvm-qemu", "forkvm-agent-protocol", "rusqlite"] {
        assert!(!deps.contains(&c.to_string()), "the daemon depends on {c}");
    }
    // Not as engine modules: every call goes through an engine service.
    let g = daemon_graph();
    let mut bad = Vec::new();
    for (m, deps) in &g {
        if !is_front_end(m) {
            continue;
        }
        for d in deps {
            let top = d.split("::").next().unwrap_or("");
            if matches!(top, "db" | "agent") {
                bad.push(format!("{m} -> {d}"));
            }
        }
    }
    assert!(bad.is_empty(), "front-ends reach past the engine: {bad:?}");
}

#[test]
fn front_ends_call_only_the_facade() {
    let engine_files = sources(&engine_dir().join("src"));
    let engine: BTreeSet<String> = engine_files.iter().map(|(m, _)| m.clone()).collect();
    assert!(engine.contains("actions"), "no facade module in the engine");
    let mut all = engine_files;
    let daemon = sources(&crate_dir().join("src"));
    assert!(
        daemon.iter().any(|(m, _)| is_front_end(m)),
        "no front-end read"
    );
    all.extend(daemon);
    let bad = front_end_breaches(&all, &engine, is_front_end);
    assert!(
        bad.is_empty(),
        "front-ends go around the engine's facade (crate::actions::Engine); give them an \
         action instead: {bad:?}"
    );
}

#[test]
fn the_daemon_has_no_import_circles() {
    let g = daemon_graph();
    if let Some(c) = find_cycle(&g) {
        panic!(
            "the daemon's modules import in a circle: {}",
            c.join(" -> ")
        );
    }
}

#[test]
fn no_daemon_file_is_over_800_lines() {
    let mut files = Vec::new();
    rs_files(&crate_dir().join("src"), &mut files);
    rs_files(&crate_dir().join("tests"), &mut files);
    rs_files(&engine_dir().join("src"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines; cut them by concern: {long:?}"
    );
}

#[test]
fn the_documented_graph_is_the_code_graph() {
    let doc_path = crate_dir().join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_default();
    let want = render(&daemon_graph());
    let have = doc
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(block, _)| block.trim_start_matches('\n').to_string());
    if have.as_deref() != Some(want.as_str()) {
        panic!(
            "the module graph in {} does not match the code. Put this between its markers:\n{BEGIN}\n{want}{END}\n",
            doc_path.display()
        );
    }
}

// The checker itself, on small made-up crates.

#[test]
fn a_cycle_is_found_and_printed() {
    let g = graph(&files(&[
        ("crate", "mod a; mod b; mod c;"),
        ("a", "use crate::b::Thing;"),
        ("b", "fn f() { crate::c::g() }"),
        ("c", "use crate::{util, a::{self, X}};"),
    ]));
    let c = find_cycle(&g).expect("a -> b -> c -> a is a cycle");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4, "{c:?}");
}

#[test]
fn no_cycle_in_a_layered_crate() {
    let g = graph(&files(&[
        ("crate", "mod a; mod b; pub use a::X; fn f() { b::g() }"),
        (
            "a",
            "// use crate::b;\n use crate::c; let s = \"crate::b::x\";",
        ),
        ("b", "use crate::a::X;"),
        ("c", ""),
    ]));
    assert_eq!(find_cycle(&g), None, "{g:?}");
    assert_eq!(g["a"], BTreeSet::from(["c".to_string()]));
    assert_eq!(g["b"], BTreeSet::from(["a".to_string()]));
}

#[test]
fn children_parents_and_inline_modules() {
    let g = graph(&files(&[
        (
            "p",
            "mod k; pub use k::Y; fn f() { k::go() } mod tests { use super::*; use crate::q::Z; }",
        ),
        ("p::k", "use super::X; use super::super::q;"),
        ("q", "fn f() { crate::p::k::Y }"),
    ]));
    // The parent naming its child is no edge; the child naming it is.
    assert_eq!(g["p"], BTreeSet::from(["q".to_string()]));
    assert_eq!(
        g["p::k"],
        BTreeSet::from(["p".to_string(), "q".to_string()])
    );
    assert_eq!(g["q"], BTreeSet::from(["p::k".to_string()]));
    // p::k -> q -> p::k
    assert!(find_cycle(&g).is_some());
}

#[test]
fn lifetimes_and_chars_do_not_hide_code() {
    let g = graph(&files(&[
        (
            "a",
            "pub(super) fn f<'a>(x: &'a str) -> char { let c = '{'; crate::b::g(); '\\'' }",
        ),
        ("a::x", "pub(super) fn g() { self.f() }"),
        ("b", ""),
    ]));
    assert_eq!(g["a"], BTreeSet::from(["b".to_string()]));
    // `pub(super)` names no module.
    assert!(!g["a::x"].contains("a"), "{g:?}");
}

#[test]
fn a_front_end_past_the_facade_is_caught() {
    let engine: BTreeSet<String> = ["crate", "actions", "error", "manager", "snapshot"]
        .into_iter()
        .map(String::from)
        .collect();
    let front = |m: &str| m.starts_with("api");
    let mut fixture = vec![
        (
            "crate",
            "pub mod actions; pub mod error; pub mod manager; pub mod snapshot;",
        ),
        ("actions", "use crate::manager::Manager; pub struct Engine;"),
        ("error", ""),
        ("manager", "pub struct Manager;"),
        ("snapshot", "pub enum Save { Diff }"),
        (
            "api",
            "use crate::actions::Engine; use crate::error::EngineError; \
             // crate::manager::Manager in a comment is fine\n fn f(e: &Engine) {}",
        ),
    ];
    assert_eq!(
        front_end_breaches(&files(&fixture), &engine, front),
        Vec::<String>::new()
    );
    fixture.push(("api::x", "fn f() { crate::snapshot::Save::Diff; }"));
    fixture.push(("api::y", "use crate::manager::{Live, Phase};"));
    fixture.push((
        "api::z",
        "fn g(m: std::sync::Arc<forkvm_engine::Manager>) {}",
    ));
    assert_eq!(
        front_end_breaches(&files(&fixture), &engine, front),
        vec![
            "api::x -> snapshot".to_string(),
            "api::y -> manager".to_string(),
            "api::z names Manager".to_string(),
            "api::z names forkvm_engine".to_string(),
        ]
    );
}
