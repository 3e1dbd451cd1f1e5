//! Tests of source resolution and the context walk.

use super::*;
use std::os::unix::fs::symlink;

/// ```text
/// ctx/
///   .dockerignore   *.log, secret, node_modules, !node_modules/keep.js
///   a.txt  b.txt  x.log  secret
///   dir/ b.txt  sub/c.txt  empty/  ln -> ../a.txt  out -> /etc
///   node_modules/ x.js keep.js
///   lnk -> a.txt    abs_out -> /etc/hostname    rel_out -> ../outside
/// ```
fn ctx() -> (tempfile::TempDir, Context) {
    let t = tempfile::tempdir().unwrap();
    let r = t.path().join("ctx");
    fs::create_dir_all(r.join("dir/sub")).unwrap();
    fs::create_dir_all(r.join("dir/empty")).unwrap();
    fs::create_dir_all(r.join("node_modules")).unwrap();
    fs::write(
        r.join(".dockerignore"),
        "*.log\nsecret\nnode_modules\n!node_modules/keep.js\n",
    )
    .unwrap();
    for (p, d) in [
        ("a.txt", "A"),
        ("b.txt", "B"),
        ("x.log", "L"),
        ("secret", "S"),
        ("dir/b.txt", "DB"),
        ("dir/sub/c.txt", "C"),
        ("node_modules/x.js", "X"),
        ("node_modules/keep.js", "K"),
    ] {
        fs::write(r.join(p), d).unwrap();
    }
    fs::write(t.path().join("outside"), "O").unwrap();
    symlink("../a.txt", r.join("dir/ln")).unwrap();
    symlink("/etc", r.join("dir/out")).unwrap();
    symlink("a.txt", r.join("lnk")).unwrap();
    symlink("/etc/hostname", r.join("abs_out")).unwrap();
    symlink("../outside", r.join("rel_out")).unwrap();
    let c = Context::open(&r).unwrap();
    (t, c)
}

fn rels(v: &[Source]) -> Vec<&str> {
    v.iter().map(|s| s.rel.as_str()).collect()
}

#[test]
fn literal_sources() {
    let (_t, c) = ctx();
    assert_eq!(rels(&c.sources("a.txt", 3).unwrap()), ["a.txt"]);
    assert_eq!(rels(&c.sources("/a.txt", 3).unwrap()), ["a.txt"]);
    assert_eq!(rels(&c.sources("./dir/../a.txt", 3).unwrap()), ["a.txt"]);
    let root = c.sources(".", 3).unwrap();
    assert_eq!(rels(&root), [""]);
    assert!(root[0].is_dir);
    let d = c.sources("dir/", 3).unwrap();
    assert!(d[0].is_dir);
    assert_eq!(d[0].name(), "dir");
    // A symlink named as a source is followed inside the context.
    let l = c.sources("lnk", 3).unwrap();
    assert_eq!(l[0].name(), "lnk");
    assert_eq!(l[0].host, c.root().join("a.txt"));
}

#[test]
fn bad_sources() {
    let (_t, c) = ctx();
    let msg = |s: &str| c.sources(s, 7).unwrap_err().to_string();
    let e = msg("../outside");
    assert!(
        e.contains("line 7") && e.contains("outside the build context"),
        "{e}"
    );
    assert!(msg("dir/../../x").contains("outside"));
    let e = msg("missing.txt");
    assert!(
        e.contains("line 7") && e.contains("\"missing.txt\" not found"),
        "{e}"
    );
    let e = msg("abs_out");
    assert!(e.contains("outside the build context"), "{e}");
    assert!(msg("rel_out").contains("outside the build context"));
    assert!(msg("dir/out/passwd").contains("outside the build context"));
    assert!(msg("secret").contains("excluded by .dockerignore"));
    assert!(msg("x.log").contains("excluded by .dockerignore"));
    assert!(msg("node_modules/x.js").contains("excluded"));
    assert_eq!(
        rels(&c.sources("node_modules/keep.js", 7).unwrap()),
        ["node_modules/keep.js"]
    );
    let e = msg("*.nothing");
    assert!(e.contains("no file") && e.contains("*.nothing"), "{e}");
}

#[test]
fn glob_sources() {
    let (_t, c) = ctx();
    assert_eq!(rels(&c.sources("*.txt", 1).unwrap()), ["a.txt", "b.txt"]);
    assert_eq!(rels(&c.sources("?.txt", 1).unwrap()), ["a.txt", "b.txt"]);
    assert_eq!(rels(&c.sources("[a].txt", 1).unwrap()), ["a.txt"]);
    // .dockerignore'd files never match.
    assert!(c
        .sources("*.log", 1)
        .unwrap_err()
        .to_string()
        .contains("no file"));
    assert_eq!(
        rels(&c.sources("dir/*/c.txt", 1).unwrap()),
        ["dir/sub/c.txt"]
    );
    assert_eq!(
        rels(&c.sources("**/*.txt", 1).unwrap()),
        ["a.txt", "b.txt", "dir/b.txt", "dir/sub/c.txt"]
    );
    assert_eq!(
        rels(&c.sources("node_modules/*", 1).unwrap()),
        ["node_modules/keep.js"]
    );
    // A glob reaching outside through a symlinked directory is refused.
    assert!(c
        .sources("dir/out/*", 1)
        .unwrap_err()
        .to_string()
        .contains("outside"));
}

fn collect(c: &Context, src: &str, path: &str, chmod: Option<u32>) -> Vec<(String, String)> {
    let s = c.sources(src, 1).unwrap().remove(0);
    let mut out = Vec::new();
    let mut w = Vec::new();
    c.collect(&s, path, chmod, 1, &mut out, &mut w).unwrap();
    out.into_iter()
        .map(|e| {
            let k = match e.kind {
                EntryKind::Dir { mode } => format!("dir {mode:o}"),
                EntryKind::File { mode, size, .. } => format!("file {mode:o} {size}"),
                EntryKind::Symlink { target } => format!("-> {target}"),
                EntryKind::Extract { .. } => "extract".into(),
                EntryKind::Inline { .. } => "inline".into(),
            };
            (e.path, k)
        })
        .collect()
}

#[test]
fn walks_directories() {
    let (_t, c) = ctx();
    fs::set_permissions(c.root().join("dir/sub"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::set_permissions(
        c.root().join("dir/b.txt"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let got = collect(&c, "dir", "", None);
    let want: Vec<(String, String)> = [
        ("b.txt", "file 600 2"),
        ("empty", "dir 755"),
        ("ln", "-> ../a.txt"),
        ("out", "-> /etc"),
        ("sub", "dir 750"),
        ("sub/c.txt", "file 644 1"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
    let got = collect(&c, "dir/sub", "x", Some(0o700));
    assert_eq!(got, [("x/c.txt".to_string(), "file 700 1".to_string())]);
    let got = collect(&c, "a.txt", "renamed", None);
    assert_eq!(got, [("renamed".to_string(), "file 644 1".to_string())]);
}

#[test]
fn walk_honours_dockerignore() {
    let (_t, c) = ctx();
    let got: Vec<String> = collect(&c, ".", "", None)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(got.contains(&"a.txt".to_string()));
    assert!(got.contains(&".dockerignore".to_string()));
    assert!(!got.iter().any(|p| p.ends_with(".log") || p == "secret"));
    // The excluded directory comes back only for its exception.
    assert!(got.contains(&"node_modules".to_string()));
    assert!(got.contains(&"node_modules/keep.js".to_string()));
    assert!(!got.contains(&"node_modules/x.js".to_string()));
    // Without exceptions an excluded directory is not walked at all.
    fs::write(c.root().join(".dockerignore"), "node_modules\n").unwrap();
    let c2 = Context::open(c.root()).unwrap();
    let got: Vec<String> = collect(&c2, ".", "", None)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(!got.iter().any(|p| p.starts_with("node_modules")));
}

#[test]
fn bad_contexts() {
    let t = tempfile::tempdir().unwrap();
    assert!(Context::open(&t.path().join("nope")).is_err());
    fs::write(t.path().join("f"), "x").unwrap();
    let e = Context::open(&t.path().join("f")).unwrap_err().to_string();
    assert!(e.contains("must be a directory"), "{e}");
    fs::write(t.path().join(".dockerignore"), "a\n[oops\n").unwrap();
    let e = Context::open(t.path()).unwrap_err().to_string();
    assert!(e.contains(".dockerignore line 2"), "{e}");
}

#[test]
fn hashes_content() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("f");
    fs::write(&p, "abc").unwrap();
    let (size, sha) = hash_file(&p).unwrap();
    assert_eq!(size, 3);
    assert_eq!(
        sha,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn special_files_are_skipped_with_a_warning() {
    let (_t, c) = ctx();
    let sock = c.root().join("dir/sub/s.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let s = c.sources("dir/sub", 9).unwrap().remove(0);
    let (mut out, mut warnings) = (Vec::new(), Vec::new());
    c.collect(&s, "", None, 9, &mut out, &mut warnings).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].starts_with("line 9: skipped \"dir/sub/s.sock\""),
        "{warnings:?}"
    );
}
