//! Merge planning: from the trees of the branch point (`base`), the target
//! (`ours`) and the child (`theirs`), what to apply to the target and what
//! conflicts. Pure: the contents it needs are given to it. Applying the plan
//! is [`super::apply`].
//!
//! For each path the child changed since the branch point:
//! * the target did not change it: the child's version is applied;
//! * the target changed it the same way: nothing to do;
//! * otherwise it is a conflict, settled by the strategy if there is one
//!   (`theirs`, `ours`, or `text`: a line merge of three text files).
//!
//! A directory the child deleted while the target added something in it is
//! a conflict too (the target's new entries would be lost).

use std::collections::BTreeMap;

use forkvm_api::{ChangeKind, Conflict, MergeStrategy, PathChange};

use super::compare::{candidates, under, verdict, Node, Tree, Verdict};
use super::text;

/// File contents by path, of one side.
pub type Contents = BTreeMap<String, Vec<u8>>;

/// What to do at one path of the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Put the child's entry there (replacing what is there).
    Put(Node),
    /// Put a file with these bytes (a text merge) and this mode.
    PutMerged(Node, Vec<u8>),
    /// Remove what is there.
    Delete,
}

/// The plan of a merge.
#[derive(Debug, Default)]
pub struct Plan {
    /// By path, sorted.
    pub actions: BTreeMap<String, Action>,
    pub applied: Vec<PathChange>,
    pub settled: Vec<Conflict>,
    pub conflicts: Vec<Conflict>,
}

/// The paths whose contents the planner needs: those where a side's
/// metadata cannot tell whether it changed (`Contents` verdicts), and with
/// the `text` strategy the three sides of every file both changed.
pub fn needed(base: &Tree, ours: &Tree, theirs: &Tree, text_strategy: bool) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    let ours_c: BTreeMap<String, Verdict> = candidates(base, ours).into_iter().collect();
    for (p, vt) in candidates(base, theirs) {
        let vo = ours_c.get(&p).copied();
        let is_file = |t: &Tree| t.get(&p).is_some_and(|n| n.kind == "file");
        if vt == Verdict::Contents
            || vo == Some(Verdict::Contents)
            || verdict(ours.get(&p), theirs.get(&p)) == Verdict::Contents
            || (text_strategy && vo.is_some() && is_file(ours) && is_file(theirs))
        {
            v.push(p);
        }
    }
    v
}

fn changed(v: Verdict, a: Option<&Vec<u8>>, b: Option<&Vec<u8>>, modes_differ: bool) -> bool {
    match v {
        Verdict::Same => false,
        Verdict::Differs(_) => true,
        Verdict::Contents => a != b || modes_differ,
    }
}

fn kind_of(v: Verdict) -> ChangeKind {
    match v {
        Verdict::Differs(k) => k,
        _ => ChangeKind::Modified,
    }
}

/// Plan the merge. `cb`, `co`, `ct`: contents of the paths [`needed`]
/// named, from base, ours and theirs.
pub fn plan(
    base: &Tree,
    ours: &Tree,
    theirs: &Tree,
    cb: &Contents,
    co: &Contents,
    ct: &Contents,
    strategy: Option<MergeStrategy>,
) -> Plan {
    let mut p = Plan::default();
    let ours_c: BTreeMap<String, Verdict> = candidates(base, ours).into_iter().collect();
    let mode = |t: &Tree, path: &str| t.get(path).map(|n| n.mode);
    for (path, vt) in candidates(base, theirs) {
        let (b, o, t) = (base.get(&path), ours.get(&path), theirs.get(&path));
        if !changed(
            vt,
            cb.get(&path),
            ct.get(&path),
            mode(base, &path) != mode(theirs, &path),
        ) {
            continue;
        }
        let change = PathChange {
            path: path.clone(),
            change: match vt {
                Verdict::Contents => ChangeKind::Modified,
                v => kind_of(v),
            },
            a: o.map(Node::state),
            b: t.map(Node::state),
            patch: None,
        };
        let vo = ours_c.get(&path).copied().unwrap_or(Verdict::Same);
        let ours_changed = changed(
            vo,
            cb.get(&path),
            co.get(&path),
            mode(base, &path) != mode(ours, &path),
        );
        let action = match t {
            Some(n) => Action::Put(n.clone()),
            None => Action::Delete,
        };
        if !ours_changed {
            p.actions.insert(path.clone(), action);
            p.applied.push(change);
            continue;
        }
        let same_now = !changed(
            verdict(o, t),
            co.get(&path),
            ct.get(&path),
            mode(ours, &path) != mode(theirs, &path),
        );
        if same_now {
            continue;
        }
        let mut c = Conflict {
            path: path.clone(),
            base: b.map(Node::state),
            ours: o.map(Node::state),
            theirs: t.map(Node::state),
            reason: "both changed it differently since the branch point".into(),
        };
        let merged = match (strategy, b, o, t) {
            (Some(MergeStrategy::Text), Some(_), Some(on), Some(tn))
                if on.kind == "file" && tn.kind == "file" =>
            {
                match (cb.get(&path), co.get(&path), ct.get(&path)) {
                    (Some(x), Some(y), Some(z)) => text::merge3(x, y, z),
                    _ => None,
                }
            }
            _ => None,
        };
        match (strategy, merged) {
            (_, Some(bytes)) => {
                let n = t.cloned().expect("a text merge has their file");
                p.actions.insert(path.clone(), Action::PutMerged(n, bytes));
                p.applied.push(change);
                c.reason = "merged line by line".into();
                p.settled.push(c);
            }
            (Some(MergeStrategy::Theirs), None) => {
                p.actions.insert(path.clone(), action);
                p.applied.push(change);
                c.reason = "the child's version taken (--theirs)".into();
                p.settled.push(c);
            }
            (Some(MergeStrategy::Ours), None) => {
                c.reason = "the target's version kept (--ours)".into();
                p.settled.push(c);
            }
            (_, None) => {
                if strategy == Some(MergeStrategy::Text) {
                    c.reason = "both changed it and the changes overlap (or it is not text)".into();
                }
                p.conflicts.push(c);
            }
        }
    }
    deleted_dirs_keep_new_entries(&mut p, ours, base);
    p
}

/// A directory the plan deletes must not hold anything the target has that
/// the plan does not delete too (the target's own additions).
fn deleted_dirs_keep_new_entries(p: &mut Plan, ours: &Tree, base: &Tree) {
    let dirs: Vec<String> = p
        .actions
        .iter()
        .filter(|(path, a)| {
            **a == Action::Delete && ours.get(*path).is_some_and(|n| n.kind == "dir")
        })
        .map(|(path, _)| path.clone())
        .collect();
    for d in dirs {
        let kept: Vec<&String> = ours
            .keys()
            .filter(|k| **k != d && under(k, &d))
            .filter(|k| p.actions.get(*k) != Some(&Action::Delete))
            .collect();
        if let Some(first) = kept.first() {
            let reason = format!(
                "the child deleted this directory, and the target has {} in it that the child \
                 never had (first: {first})",
                kept.len()
            );
            p.actions.remove(&d);
            p.applied.retain(|c| c.path != d);
            p.conflicts.push(Conflict {
                path: d.clone(),
                base: base.get(&d).map(Node::state),
                ours: ours.get(&d).map(Node::state),
                theirs: None,
                reason,
            });
        }
    }
    p.conflicts.sort_by(|a, b| a.path.cmp(&b.path));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(size: u64, mtime: i64) -> Node {
        Node {
            kind: "file",
            size,
            mode: 0o644,
            mtime_ns: mtime,
            target: None,
        }
    }

    fn dir() -> Node {
        Node {
            kind: "dir",
            size: 0,
            mode: 0o755,
            mtime_ns: 0,
            target: None,
        }
    }

    fn tree(v: &[(&str, Node)]) -> Tree {
        v.iter().map(|(p, n)| (p.to_string(), n.clone())).collect()
    }

    fn none() -> Contents {
        Contents::new()
    }

    #[test]
    fn one_sided_changes_apply_and_equal_ones_are_nothing() {
        let base = tree(&[
            ("/w", dir()),
            ("/w/a", f(1, 1)),
            ("/w/b", f(1, 1)),
            ("/w/c", f(1, 1)),
        ]);
        // Ours changed b; theirs changed a, deleted c, added d, and changed b
        // exactly as ours did.
        let ours = tree(&[
            ("/w", dir()),
            ("/w/a", f(1, 1)),
            ("/w/b", f(2, 5)),
            ("/w/c", f(1, 1)),
        ]);
        let theirs = tree(&[
            ("/w", dir()),
            ("/w/a", f(3, 2)),
            ("/w/b", f(2, 5)),
            ("/w/d", f(1, 9)),
        ]);
        let p = plan(&base, &ours, &theirs, &none(), &none(), &none(), None);
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        let paths: Vec<&str> = p.actions.keys().map(String::as_str).collect();
        assert_eq!(paths, ["/w/a", "/w/c", "/w/d"]);
        assert_eq!(p.actions["/w/c"], Action::Delete);
    }

    #[test]
    fn conflicts_are_listed_and_settled_by_strategies() {
        let base = tree(&[("/x", f(4, 1))]);
        let ours = tree(&[("/x", f(5, 2))]);
        let theirs = tree(&[("/x", f(6, 3))]);
        let p = plan(&base, &ours, &theirs, &none(), &none(), &none(), None);
        assert_eq!(p.conflicts.len(), 1);
        assert!(p.actions.is_empty());
        let p = plan(
            &base,
            &ours,
            &theirs,
            &none(),
            &none(),
            &none(),
            Some(MergeStrategy::Theirs),
        );
        assert!(p.conflicts.is_empty());
        assert_eq!(p.actions["/x"], Action::Put(f(6, 3)));
        let p = plan(
            &base,
            &ours,
            &theirs,
            &none(),
            &none(),
            &none(),
            Some(MergeStrategy::Ours),
        );
        assert!(p.actions.is_empty() && p.conflicts.is_empty() && p.settled.len() == 1);
    }

    #[test]
    fn text_merges_when_the_lines_are_apart() {
        let base = tree(&[("/t", f(10, 1))]);
        let ours = tree(&[("/t", f(10, 2))]);
        let theirs = tree(&[("/t", f(10, 3))]);
        let c = |b: &[u8]| Contents::from([("/t".to_string(), b.to_vec())]);
        let need = needed(&base, &ours, &theirs, true);
        assert_eq!(need, ["/t"]);
        let p = plan(
            &base,
            &ours,
            &theirs,
            &c(b"a\nb\nc\nd\ne\n"),
            &c(b"A\nb\nc\nd\ne\n"),
            &c(b"a\nb\nc\nd\nE\n"),
            Some(MergeStrategy::Text),
        );
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
        match &p.actions["/t"] {
            Action::PutMerged(_, b) => assert_eq!(b, b"A\nb\nc\nd\nE\n"),
            a => panic!("{a:?}"),
        }
        // Same size, new mtime, same bytes: the child did not change it.
        let same = plan(&base, &ours, &theirs, &c(b"x"), &c(b"y"), &c(b"x"), None);
        assert!(same.actions.is_empty() && same.conflicts.is_empty());
    }

    #[test]
    fn a_deleted_directory_keeps_what_the_target_added_in_it() {
        let base = tree(&[("/d", dir()), ("/d/a", f(1, 1))]);
        let ours = tree(&[("/d", dir()), ("/d/a", f(1, 1)), ("/d/mine", f(1, 1))]);
        let theirs = tree(&[]);
        let p = plan(&base, &ours, &theirs, &none(), &none(), &none(), None);
        assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
        assert_eq!(p.conflicts[0].path, "/d");
        assert!(!p.actions.contains_key("/d"));
    }
}
