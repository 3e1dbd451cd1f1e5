//! The pure part of diff and merge: trees of path states, and what differs
//! between them. No guest, no I/O: unit-tested here.
//!
//! Two entries are the same when their kind, permission bits and (for a
//! symlink) target match, and, for a file, its size and modification time.
//! A file with the same size but another modification time may still hold
//! the same bytes (rewritten unchanged, or touched): its contents decide,
//! read from both sides ([`Verdict::Contents`]). A file whose mtime was set
//! back to the old one with other bytes of the same size is taken as
//! unchanged, as `git status` takes it; a branch's child inherits every
//! inode's mtime from its branch point, so an unchanged file always
//! matches on metadata alone and is never read.

use std::collections::BTreeMap;

use forkvm_agent_protocol::caps::{EntryInfo, FileKind};
use forkvm_api::{ChangeKind, PathState};

/// One side's entry at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    pub target: Option<String>,
}

/// A side's tree: absolute path → entry.
pub type Tree = BTreeMap<String, Node>;

impl Node {
    pub fn from_entry(e: &EntryInfo) -> Node {
        Node {
            kind: match e.kind {
                FileKind::File => "file",
                FileKind::Dir => "dir",
                FileKind::Symlink => "symlink",
                _ => "other",
            },
            size: e.size,
            mode: e.mode & 0o7777,
            mtime_ns: e.modified_ns,
            target: e.symlink_target.clone(),
        }
    }

    pub fn state(&self) -> PathState {
        PathState {
            kind: self.kind.to_string(),
            size: if self.kind == "dir" { 0 } else { self.size },
            mode: self.mode,
            symlink_target: self.target.clone(),
        }
    }
}

/// How two entries at one path compare on metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Same,
    /// Differs: what changed.
    Differs(ChangeKind),
    /// Two files of one size and mode, modified at different times: their
    /// contents decide (the same → `Same`, else `Modified`).
    Contents,
}

/// Compare what two sides have at one path (`None`: nothing).
pub fn verdict(a: Option<&Node>, b: Option<&Node>) -> Verdict {
    match (a, b) {
        (None, None) => Verdict::Same,
        (None, Some(_)) => Verdict::Differs(ChangeKind::Added),
        (Some(_), None) => Verdict::Differs(ChangeKind::Deleted),
        (Some(x), Some(y)) if x.kind != y.kind => Verdict::Differs(ChangeKind::Type),
        (Some(x), Some(y)) => match x.kind {
            "symlink" if x.target != y.target => Verdict::Differs(ChangeKind::Modified),
            "file" if x.size != y.size => Verdict::Differs(ChangeKind::Modified),
            "file" if x.mtime_ns != y.mtime_ns => Verdict::Contents,
            _ if x.mode != y.mode => Verdict::Differs(ChangeKind::Mode),
            _ => Verdict::Same,
        },
    }
}

/// Every path where the trees differ on metadata, sorted, with its verdict
/// (never `Same`).
pub fn candidates(a: &Tree, b: &Tree) -> Vec<(String, Verdict)> {
    let mut out = Vec::new();
    let mut ia = a.iter().peekable();
    let mut ib = b.iter().peekable();
    loop {
        let (path, x, y) = match (ia.peek(), ib.peek()) {
            (None, None) => break,
            (Some((pa, _)), Some((pb, _))) if pa == pb => {
                let (p, x) = ia.next().unwrap();
                let (_, y) = ib.next().unwrap();
                (p, Some(x), Some(y))
            }
            (Some((pa, _)), Some((pb, _))) if pa < pb => {
                let (p, x) = ia.next().unwrap();
                (p, Some(x), None)
            }
            (Some(_), None) => {
                let (p, x) = ia.next().unwrap();
                (p, Some(x), None)
            }
            _ => {
                let (p, y) = ib.next().unwrap();
                (p, None, Some(y))
            }
        };
        match verdict(x, y) {
            Verdict::Same => {}
            v => out.push((path.clone(), v)),
        }
    }
    out
}

/// `path` is `dir` or lies under it.
pub fn under(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64, mode: u32, mtime: i64) -> Node {
        Node {
            kind: "file",
            size,
            mode,
            mtime_ns: mtime,
            target: None,
        }
    }

    fn link(t: &str) -> Node {
        Node {
            kind: "symlink",
            size: t.len() as u64,
            mode: 0o777,
            mtime_ns: 1,
            target: Some(t.into()),
        }
    }

    #[test]
    fn verdicts_cover_every_kind_of_change() {
        let f = file(10, 0o644, 5);
        assert_eq!(verdict(Some(&f), Some(&f)), Verdict::Same);
        assert_eq!(verdict(None, Some(&f)), Verdict::Differs(ChangeKind::Added));
        assert_eq!(
            verdict(Some(&f), None),
            Verdict::Differs(ChangeKind::Deleted)
        );
        assert_eq!(
            verdict(Some(&f), Some(&file(11, 0o644, 5))),
            Verdict::Differs(ChangeKind::Modified)
        );
        assert_eq!(
            verdict(Some(&f), Some(&file(10, 0o644, 6))),
            Verdict::Contents
        );
        assert_eq!(
            verdict(Some(&f), Some(&file(10, 0o755, 5))),
            Verdict::Differs(ChangeKind::Mode)
        );
        assert_eq!(
            verdict(Some(&f), Some(&link("x"))),
            Verdict::Differs(ChangeKind::Type)
        );
        assert_eq!(
            verdict(Some(&link("x")), Some(&link("y"))),
            Verdict::Differs(ChangeKind::Modified)
        );
        // A directory's mtime changes with its entries: only its mode counts.
        let mut d = file(0, 0o755, 1);
        d.kind = "dir";
        let mut d2 = d.clone();
        d2.mtime_ns = 99;
        d2.size = 4096;
        assert_eq!(verdict(Some(&d), Some(&d2)), Verdict::Same);
    }

    #[test]
    fn candidates_walk_both_trees_in_order() {
        let a: Tree = [
            ("/a", file(1, 0o644, 1)),
            ("/b", file(1, 0o644, 1)),
            ("/d", file(1, 0o644, 1)),
        ]
        .into_iter()
        .map(|(p, n)| (p.to_string(), n))
        .collect();
        let b: Tree = [
            ("/b", file(2, 0o644, 1)),
            ("/c", file(1, 0o644, 1)),
            ("/d", file(1, 0o644, 1)),
        ]
        .into_iter()
        .map(|(p, n)| (p.to_string(), n))
        .collect();
        let got: Vec<(String, Verdict)> = candidates(&a, &b);
        assert_eq!(
            got,
            [
                ("/a".to_string(), Verdict::Differs(ChangeKind::Deleted)),
                ("/b".to_string(), Verdict::Differs(ChangeKind::Modified)),
                ("/c".to_string(), Verdict::Differs(ChangeKind::Added)),
            ]
        );
    }

    #[test]
    fn under_means_the_directory_or_below_it() {
        assert!(under("/root/x", "/root"));
        assert!(under("/root", "/root"));
        assert!(!under("/rootkit", "/root"));
        assert!(under("/anything", "/"));
    }
}
