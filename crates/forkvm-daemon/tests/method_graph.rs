//! Method calls between the engine's concerns. The module graph
//! (`module_graph.rs`) is of names; an action calls another concern through
//! `self.method()`, which it does not name. These calls are what tie the
//! `Manager` into one object, so they are graphed here by top-level module:
//! `a => b` when code of `a` calls, on the manager, a method defined in an
//! `impl Manager` block of `b` (and of no other module). "On the manager"
//! is `self` in an `impl Manager` block, or a handle the calling function
//! binds to it: `let me = self.clone()` (or `Arc::clone(self)`, or `self`,
//! or `let Some(me) = weak.upgrade()`) in such a block, or a parameter typed
//! `&Manager`, `Arc<Manager>` or `&Arc<Manager>`. A local that is not one (a map named `m`) is not.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use support::*;

/// The identifiers of stripped code with their byte offsets.
fn idents(code: &str) -> Vec<(usize, &str)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if is_ident(b[i]) && !b[i].is_ascii_digit() && (i == 0 || !is_ident(b[i - 1])) {
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            out.push((start, &code[start..i]));
        } else {
            i += 1;
        }
    }
    out
}

/// The offset of the `}` that closes the `{` at `open` in stripped code.
fn closing_brace(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// The byte ranges of the `impl Manager { .. }` blocks of stripped code.
fn manager_blocks(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let ids = idents(code);
    let mut out = Vec::new();
    for w in ids.windows(2) {
        if w[0].1 == "impl" && w[1].1 == "Manager" {
            let Some(open) = code[w[1].0..].find('{').map(|o| w[1].0 + o) else {
                continue;
            };
            if let Some(close) = closing_brace(b, open) {
                out.push((open, close));
            }
        }
    }
    out
}

/// The next non-blank byte at or after `i`.
fn next_byte(b: &[u8], mut i: usize) -> Option<u8> {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    b.get(i).copied()
}

/// The `(fn keyword, end of body)` byte ranges of the functions with a body.
fn fn_ranges(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for w in idents(code).windows(2) {
        if w[0].1 != "fn" {
            continue;
        }
        let after = w[1].0 + w[1].1.len();
        let (Some(open), semi) = (
            code[after..].find('{').map(|o| after + o),
            code[after..].find(';').map(|o| after + o),
        ) else {
            continue;
        };
        if semi.is_some_and(|s| s < open) {
            continue; // a declaration without a body
        }
        if let Some(close) = closing_brace(b, open) {
            out.push((w[0].0, close));
        }
    }
    out
}

/// The names a function (its text `f`) binds to the manager: parameters
/// typed as it, and, when `in_block` (an `impl Manager` method), clones of
/// `self`.
fn handles(f: &str, in_block: bool) -> BTreeSet<String> {
    let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let ids = idents(f);
    let mut out = BTreeSet::new();
    for (k, &(at, name)) in ids.iter().enumerate() {
        let rest = &f[at + name.len()..];
        // `name: &Manager`, `name: Arc<Manager>`, `name: &Arc<Manager>`.
        let ty = squeeze(&rest[..rest.find([',', ')', '=', ';', '{']).unwrap_or(rest.len())]);
        if let Some(ty) = ty.strip_prefix(':') {
            let ty = ty.trim_start_matches('&').replace("std::sync::", "");
            if ty == "Manager" || ty == "Arc<Manager>" {
                out.insert(name.to_string());
            }
        }
        // `let [mut] name = self.clone();` and the like.
        let after_let = k > 0 && ids[k - 1].1 == "let"
            || k > 1 && ids[k - 1].1 == "mut" && ids[k - 2].1 == "let";
        if in_block && after_let && name != "mut" {
            let init = squeeze(&rest[..rest.find(';').unwrap_or(rest.len())]);
            if [
                "=self",
                "=self.clone()",
                "=Arc::clone(self)",
                "=Arc::clone(&self)",
            ]
            .contains(&init.as_str())
            {
                out.insert(name.to_string());
            }
        }
        // `let Some(name) = weak.upgrade()`: a task's weak handle.
        let after_let_some = k > 1 && ids[k - 1].1 == "Some" && ids[k - 2].1 == "let";
        if in_block && after_let_some {
            let init = squeeze(&rest[..rest.find(';').unwrap_or(rest.len())]);
            if init.starts_with(")=") && init.contains(".upgrade()") {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// Method-call graph of `files` (module, source) by top-level module.
fn method_graph(files: &[(String, String)]) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_string();
    let mut owner: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let stripped: Vec<(String, String)> =
        files.iter().map(|(m, s)| (m.clone(), strip(s))).collect();
    for (m, code) in &stripped {
        for (a, z) in manager_blocks(code) {
            let ids = idents(&code[a..z]);
            for w in ids.windows(2) {
                if w[0].1 == "fn" {
                    owner.entry(w[1].1.to_string()).or_default().insert(top(m));
                }
            }
        }
    }
    let mut g = Graph::new();
    for (m, code) in &stripped {
        if m == "crate" {
            continue;
        }
        let b = code.as_bytes();
        let blocks = manager_blocks(code);
        let fns = fn_ranges(code);
        let ids = idents(code);
        for w in ids.windows(2) {
            let (recv_at, recv) = w[0];
            let (name_at, name) = w[1];
            let dot = code[recv_at + recv.len()..name_at].trim();
            if dot != "." || next_byte(b, name_at + name.len()) != Some(b'(') {
                continue;
            }
            let in_block = blocks.iter().any(|(a, z)| (*a..*z).contains(&recv_at));
            // The innermost function around the call decides what `recv` is.
            let around = fns
                .iter()
                .filter(|(a, z)| (*a..*z).contains(&recv_at))
                .min_by_key(|(a, z)| z - a);
            let on_manager = (recv == "self" && in_block)
                || around.is_some_and(|(a, z)| handles(&code[*a..*z], in_block).contains(recv));
            if !on_manager {
                continue;
            }
            // A name defined by one concern only: a shared name is not charged.
            if let Some(o) = owner.get(name).filter(|o| o.len() == 1) {
                let o = o.iter().next().cloned().unwrap_or_default();
                if o != top(m) {
                    g.entry(top(m)).or_default().insert(o);
                }
            }
        }
    }
    g
}

/// The strongly connected groups of more than one node (Tarjan).
fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        out: Vec<Vec<String>>,
    }
    fn visit(t: &mut T, n: &str) {
        let i = t.index.len();
        t.index.insert(n.into(), i);
        t.low.insert(n.into(), i);
        t.stack.push(n.into());
        t.on.insert(n.into());
        let deps: Vec<String> = t.g.get(n).into_iter().flatten().cloned().collect();
        for d in deps {
            if !t.index.contains_key(&d) {
                visit(t, &d);
                let l = t.low[&d].min(t.low[n]);
                t.low.insert(n.into(), l);
            } else if t.on.contains(&d) {
                let l = t.index[&d].min(t.low[n]);
                t.low.insert(n.into(), l);
            }
        }
        if t.low[n] == t.index[n] {
            let mut group = Vec::new();
            while let Some(x) = t.stack.pop() {
                t.on.remove(&x);
                let done = x == n;
                group.push(x);
                if done {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                t.out.push(group);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: Vec<String> = g.keys().cloned().collect();
    for n in nodes {
        if !t.index.contains_key(&n) {
            visit(&mut t, &n);
        }
    }
    t.out.sort();
    t.out
}

/// The engine's concerns that call each other in circles. Empty: the
/// services are layered (see docs/architecture.md, "Services"), and a call
/// that closes a circle is a design change to make there first.
const METHOD_CIRCLES_TODAY: &[&[&str]] = &[];

#[test]
fn method_calls_between_concerns_do_not_circle_more_than_today() {
    let files = sources(&engine_dir().join("src"));
    let have = circles(&method_graph(&files));
    let want: Vec<Vec<String>> = METHOD_CIRCLES_TODAY
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(
        have, want,
        "the engine's concerns that call each other in a circle changed; if this is a cut, \
         put the new list in METHOD_CIRCLES_TODAY"
    );
}

#[test]
fn method_circles_are_found_through_self_and_handles() {
    let g = method_graph(&files(&[
        ("a", "impl Manager { fn fa(&self) { self.fb() } }"),
        (
            "b",
            "impl Manager { fn fb(&self) { let m = self.clone(); m.fc(); } }",
        ),
        ("c", "impl Manager { fn fc(&self) { self.fa(); x.fb(); } }"),
        (
            "d",
            "impl Manager { fn fd(&self) { self.fa() } } impl Other { fn o(&self) { self.fd() } }",
        ),
        // A map named like a handle is not the manager; a typed parameter is.
        (
            "e",
            "impl Manager { fn fe(&self) { let mut m = HashMap::new(); m.fd(); } }",
        ),
        ("f", "fn free(x: &Arc<Manager>) { x.fe(); }"),
        (
            "g",
            "impl Manager { fn fg(self: &Arc<Self>) { let me = Arc::clone(self); \
             spawn(async move { me.fa() }); } }",
        ),
        (
            "h",
            "impl Manager { fn fh(self: &Arc<Self>) { let w = Arc::downgrade(self); \
             spawn(async move { let Some(x) = w.upgrade() else { return }; x.fg(); }); } }",
        ),
    ]));
    assert_eq!(
        circles(&g),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    assert_eq!(g["d"], BTreeSet::from(["a".to_string()]));
    assert!(!g.contains_key("e"), "{g:?}");
    assert_eq!(g["f"], BTreeSet::from(["e".to_string()]));
    assert_eq!(g["g"], BTreeSet::from(["a".to_string()]));
    assert_eq!(g["h"], BTreeSet::from(["g".to_string()]));
}

const BEGIN: &str =
    "<!-- service-graph:begin (generated: cargo test -p forkvm-daemon --test method_graph) -->";
const END: &str = "<!-- service-graph:end -->";

/// The graph as the block in docs/architecture.md shows it: each service
/// that calls others, by name, with the services it calls.
fn render(g: &Graph) -> String {
    let mut s = String::from("```text\n");
    for (m, deps) in g {
        let d: Vec<&str> = deps.iter().map(String::as_str).collect();
        s.push_str(&format!("{m} => {}\n", d.join(", ")));
    }
    s.push_str("```\n");
    s
}

#[test]
fn the_documented_service_graph_is_the_code_graph() {
    let doc_path = crate_dir().join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_default();
    let want = render(&method_graph(&sources(&engine_dir().join("src"))));
    let have = doc
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(block, _)| block.trim_start_matches('\n').to_string());
    if have.as_deref() != Some(want.as_str()) {
        panic!(
            "the service graph in {} does not match the code (a service calls another it did \
             not, or no longer does). Put this between its markers:\n{BEGIN}\n{want}{END}\n",
            doc_path.display()
        );
    }
}
