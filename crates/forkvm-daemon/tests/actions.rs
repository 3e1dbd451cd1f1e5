//! The action list in `docs/architecture.md` is the engine's facade: every
//! `pub` method of `impl Engine` (crate `forkvm-engine`, `src/actions/`),
//! grouped by the file it is in, with the first paragraph of its doc.
//!
//! On a mismatch the test prints the block to paste between the markers;
//! with `FORKVM_BLESS=1` it writes the block into the document itself.

mod support;

use std::path::Path;

use support::*;

const BEGIN: &str = "<!-- actions:begin (generated: cargo test -p forkvm-daemon --test actions; \
                     FORKVM_BLESS=1 writes it) -->";
const END: &str = "<!-- actions:end -->";

/// One `pub` method of `impl Engine`.
#[derive(Debug, PartialEq)]
struct Action {
    name: String,
    params: Vec<String>,
    doc: String,
}

/// The `pub` methods of every `impl Engine { .. }` block in `src`, in
/// order. Only the block's own level is read (a nested item is not an
/// action); comments and strings inside bodies cannot open or close braces.
fn actions_in(src: &str) -> Vec<Action> {
    let code = strip(src);
    let lines: Vec<&str> = src.lines().collect();
    let code_lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut depth = 0usize;
    // The depth inside an `impl Engine` block, when in one.
    let mut inside: Option<usize> = None;
    for (n, line) in code_lines.iter().enumerate() {
        let t = line.trim();
        if inside.is_none() && t.starts_with("impl Engine") && t.ends_with('{') {
            inside = Some(depth + 1);
        } else if inside == Some(depth) {
            let rest = t
                .strip_prefix("pub async fn ")
                .or_else(|| t.strip_prefix("pub fn "));
            if let Some(rest) = rest {
                out.push(action(rest, &code_lines[n..], &lines[..n]));
            }
        }
        for c in line.bytes() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    if inside == Some(depth) {
                        inside = None;
                    }
                    depth = depth.saturating_sub(1);
                }
                _ => {}
            }
        }
    }
    out
}

/// The action whose signature starts at `rest` (after `fn `), its doc the
/// `///` lines just above it.
fn action(rest: &str, from: &[&str], above: &[&str]) -> Action {
    let name: String = rest
        .bytes()
        .take_while(|c| is_ident(*c))
        .map(char::from)
        .collect();
    // The parameter list, which may span lines: from the first `(` at the
    // generics' end to its matching `)`.
    let sig = from.join("\n");
    let sig = &sig[sig.find(&format!("fn {name}")).unwrap_or(0)..];
    let mut params = Vec::new();
    if let Some(open) = sig.find('(') {
        let mut d = 0;
        let mut cur = String::new();
        for c in sig[open + 1..].chars() {
            match c {
                '(' | '<' | '[' => d += 1,
                ')' if d == 0 => break,
                ')' | '>' | ']' => d -= 1,
                ',' if d == 0 => {
                    params.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        params.push(cur);
    }
    let params = params
        .iter()
        .filter_map(|p| {
            let name = p.split(':').next()?.trim().trim_start_matches("mut ");
            (!name.is_empty() && !name.ends_with("self")).then(|| name.to_string())
        })
        .collect();
    let mut doc: Vec<&str> = above
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("///") || l.starts_with("#["))
        .filter_map(|l| l.strip_prefix("///"))
        .map(str::trim)
        .collect();
    doc.reverse();
    let first: Vec<&str> = doc.into_iter().take_while(|l| !l.is_empty()).collect();
    Action {
        name,
        params,
        doc: first.join(" "),
    }
}

/// The facade's files: `actions/mod.rs`, then its children in the order
/// `mod.rs` declares them.
fn facade() -> Vec<(String, Vec<Action>)> {
    let dir = engine_dir().join("src/actions");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let root = read(&dir.join("mod.rs"));
    assert!(!root.is_empty(), "no facade at {}", dir.display());
    let mut out = vec![("actions".to_string(), actions_in(&root))];
    for line in strip(&root).lines() {
        let t = line.trim();
        let Some(m) = t
            .strip_prefix("mod ")
            .or_else(|| t.strip_prefix("pub mod "))
        else {
            continue;
        };
        let m = m.trim_end_matches(';');
        let src = read(&dir.join(format!("{m}.rs")));
        out.push((format!("actions::{m}"), actions_in(&src)));
    }
    out
}

/// The list as the document shows it.
fn render(facade: &[(String, Vec<Action>)]) -> String {
    let mut s = String::new();
    for (module, actions) in facade {
        if actions.is_empty() {
            continue;
        }
        s.push_str(&format!("\n`{module}`:\n\n"));
        for a in actions {
            s.push_str(&format!(
                "- `{}({})`: {}\n",
                a.name,
                a.params.join(", "),
                a.doc
            ));
        }
    }
    s
}

#[test]
fn every_action_has_a_doc() {
    let f = facade();
    let n: usize = f.iter().map(|(_, a)| a.len()).sum();
    assert!(n > 40, "only {n} actions read from the facade: {f:?}");
    let bare: Vec<&str> = f
        .iter()
        .flat_map(|(_, a)| a)
        .filter(|a| a.doc.is_empty())
        .map(|a| a.name.as_str())
        .collect();
    assert!(
        bare.is_empty(),
        "actions without a `///` doc saying what they do: {bare:?}"
    );
}

#[test]
fn the_documented_actions_are_the_facade() {
    let doc_path = crate_dir().join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_default();
    let want = render(&facade());
    let parts = doc.split_once(BEGIN).and_then(|(head, rest)| {
        rest.split_once(END)
            .map(|(block, tail)| (head, block, tail))
    });
    if parts.map(|(_, block, _)| block) == Some(want.as_str()) {
        return;
    }
    if std::env::var_os("FORKVM_BLESS").is_some() {
        let (head, _, tail) = parts.expect("FORKVM_BLESS: the document has no action markers");
        let new = format!("{head}{BEGIN}{want}{END}{tail}");
        std::fs::write(&doc_path, new).expect("FORKVM_BLESS: cannot write the document");
        return;
    }
    panic!(
        "the action list in {} does not match the facade. Run with FORKVM_BLESS=1, or put this \
         between its markers:\n{BEGIN}{want}{END}\n",
        doc_path.display()
    );
}

// The reader itself, on a made-up facade.

#[test]
fn actions_are_read_with_their_docs() {
    let src = r#"
//! A facade.
pub use x::Y;

/// Not an action.
pub fn free() {}

impl Engine {
    /// Build it.
    pub fn new(m: Arc<Manager>) -> Engine {
        let s = "impl Engine { pub fn fake() {} }";
        Engine { m }
    }

    /// Run a command in a sandbox,
    /// to its end.
    ///
    /// Details nobody lists.
    pub async fn exec(
        &self,
        id: &str,
        req: ExecRequest,
    ) -> Result<ExecResult, EngineError> {
        fn helper() {}
        self.m.exec(id, req).await
    }

    fn private(&self) {}

    pub fn undocumented<S, E>(&self, mut body: S, what: Option<Vec<(u8, u8)>>) {}
}

impl Other {
    /// Not the facade.
    pub fn other(&self) {}
}
"#;
    let got = actions_in(src);
    let want = vec![
        Action {
            name: "new".into(),
            params: vec!["m".into()],
            doc: "Build it.".into(),
        },
        Action {
            name: "exec".into(),
            params: vec!["id".into(), "req".into()],
            doc: "Run a command in a sandbox, to its end.".into(),
        },
        Action {
            name: "undocumented".into(),
            params: vec!["body".into(), "what".into()],
            doc: String::new(),
        },
    ];
    assert_eq!(got, want);
}
