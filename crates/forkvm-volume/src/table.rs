//! The node table: nodeid → (parent, name), rebuilt from the journal.
//!
//! Nodeids are ours to hand out (root is 1, FUSE_ROOT_ID). A path is never
//! stored: it is rebuilt from the parent chain, so a rename is one update.
//! Every mutation is made by applying a [`Record`], the same way a journal
//! replay does, so the live table and a replayed one cannot disagree.
//!
//! `(dev, ino)` of each node is kept in memory only. It tells a LOOKUP
//! whether the name still refers to the same file (if not, the old node is
//! detached and a new nodeid handed out). It is not journaled because a
//! `copy` fork gives every file a new inode: a restored node adopts the
//! identity of whatever its path holds at its first lookup.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use crate::journal::Record;

pub const ROOT: u64 = 1;

#[derive(Debug, Clone)]
pub struct Node {
    pub parent: u64,
    pub name: OsString,
    pub lookups: u64,
    /// (dev, ino) once seen by this server instance.
    pub ident: Option<(u64, u64)>,
    /// Unlinked, or replaced on the host: the node has no path any more.
    pub detached: bool,
}

/// Negotiated FUSE_INIT parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitParams {
    pub minor: u32,
    pub flags: u32,
    pub max_write: u32,
}

#[derive(Default)]
pub struct Table {
    pub nodes: HashMap<u64, Node>,
    by_name: HashMap<(u64, OsString), u64>,
    next: u64,
    pub init: Option<InitParams>,
}

impl Table {
    pub fn new() -> Table {
        Table {
            next: ROOT + 1,
            ..Table::default()
        }
    }

    pub fn replay(recs: &[Record]) -> Table {
        let mut t = Table::new();
        for r in recs {
            t.apply(r);
        }
        t
    }

    /// The next unused nodeid.
    pub fn alloc(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        n
    }

    pub fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.by_name.get(&(parent, name.to_owned())).copied()
    }

    fn unlink_name(&mut self, node: u64) {
        if let Some(n) = self.nodes.get_mut(&node) {
            if !n.detached {
                let key = (n.parent, n.name.clone());
                if self.by_name.get(&key) == Some(&node) {
                    self.by_name.remove(&key);
                }
            }
            n.detached = true;
        }
    }

    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::Add { node, parent, name } => {
                if let Some(old) = self.child(*parent, name) {
                    self.unlink_name(old);
                }
                self.next = self.next.max(node + 1);
                self.nodes.insert(
                    *node,
                    Node {
                        parent: *parent,
                        name: name.clone(),
                        lookups: 1,
                        ident: None,
                        detached: false,
                    },
                );
                self.by_name.insert((*parent, name.clone()), *node);
            }
            Record::Ref { node, n } => {
                if let Some(x) = self.nodes.get_mut(node) {
                    x.lookups += n;
                }
            }
            Record::Forget { node, n } => {
                let gone = match self.nodes.get_mut(node) {
                    Some(x) => {
                        x.lookups = x.lookups.saturating_sub(*n);
                        x.lookups == 0
                    }
                    None => false,
                };
                if gone && *node != ROOT {
                    self.unlink_name(*node);
                    self.nodes.remove(node);
                }
            }
            Record::Move { node, parent, name } => {
                // Whatever the new name held is replaced by the rename.
                if let Some(old) = self.child(*parent, name) {
                    if old != *node {
                        self.unlink_name(old);
                    }
                }
                self.unlink_name(*node);
                if let Some(x) = self.nodes.get_mut(node) {
                    x.parent = *parent;
                    x.name = name.clone();
                    x.detached = false;
                    self.by_name.insert((*parent, name.clone()), *node);
                }
            }
            Record::Init {
                minor,
                flags,
                max_write,
            } => {
                self.init = Some(InitParams {
                    minor: *minor,
                    flags: *flags,
                    max_write: *max_write,
                })
            }
            Record::Remove { node } => self.unlink_name(*node),
        }
    }

    /// The path of `node` relative to the volume root ("" for the root),
    /// or `None` when it (or an ancestor) is gone.
    pub fn path(&self, node: u64) -> Option<PathBuf> {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = node;
        while cur != ROOT {
            let n = self.nodes.get(&cur)?;
            if n.detached || parts.len() > 4096 {
                return None;
            }
            parts.push(&n.name);
            cur = n.parent;
        }
        let mut p = PathBuf::new();
        for part in parts.iter().rev() {
            p.push(part);
        }
        Some(p)
    }

    /// The records that rebuild this table (compaction): INIT, then every
    /// live node after its parent, with its lookup count.
    pub fn snapshot(&self) -> Vec<Record> {
        let mut out = Vec::new();
        if let Some(i) = self.init {
            out.push(Record::Init {
                minor: i.minor,
                flags: i.flags,
                max_write: i.max_write,
            });
        }
        let mut done: std::collections::HashSet<u64> = [ROOT].into_iter().collect();
        let mut ids: Vec<u64> = self.nodes.keys().copied().filter(|&n| n != ROOT).collect();
        ids.sort_unstable();
        // Parents first: a detached or orphaned node is still emitted (an
        // open file whose name is gone), after its parent when it has one.
        let mut stack = Vec::new();
        for id in ids {
            let mut cur = id;
            while !done.contains(&cur) {
                stack.push(cur);
                match self.nodes.get(&cur) {
                    Some(n) if self.nodes.contains_key(&n.parent) || n.parent == ROOT => {
                        cur = n.parent
                    }
                    _ => break,
                }
            }
            while let Some(c) = stack.pop() {
                if !done.insert(c) {
                    continue;
                }
                let Some(n) = self.nodes.get(&c) else {
                    continue;
                };
                out.push(Record::Add {
                    node: c,
                    parent: n.parent,
                    name: n.name.clone(),
                });
                if n.lookups > 1 {
                    out.push(Record::Ref {
                        node: c,
                        n: n.lookups - 1,
                    });
                }
                if n.detached {
                    out.push(Record::Remove { node: c });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(t: &mut Table, parent: u64, name: &str) -> u64 {
        let node = t.alloc();
        t.apply(&Record::Add {
            node,
            parent,
            name: name.into(),
        });
        node
    }

    #[test]
    fn paths_rename_forget() {
        let mut t = Table::new();
        let d = add(&mut t, ROOT, "d");
        let f = add(&mut t, d, "f");
        assert_eq!(t.path(f).unwrap(), PathBuf::from("d/f"));
        let e = add(&mut t, ROOT, "e");
        t.apply(&Record::Move {
            node: f,
            parent: e,
            name: "g".into(),
        });
        assert_eq!(t.path(f).unwrap(), PathBuf::from("e/g"));
        assert_eq!(t.child(e, OsStr::new("g")), Some(f));
        assert_eq!(t.child(d, OsStr::new("f")), None);
        t.apply(&Record::Ref { node: f, n: 1 });
        t.apply(&Record::Forget { node: f, n: 1 });
        assert!(t.nodes.contains_key(&f));
        t.apply(&Record::Forget { node: f, n: 1 });
        assert!(!t.nodes.contains_key(&f));
        t.apply(&Record::Remove { node: e });
        assert!(t.path(e).is_none());
    }

    #[test]
    fn snapshot_replays_to_the_same_table() {
        let mut t = Table::new();
        t.apply(&Record::Init {
            minor: 31,
            flags: 7,
            max_write: 1 << 20,
        });
        let d = add(&mut t, ROOT, "d");
        let f = add(&mut t, d, "f");
        t.apply(&Record::Ref { node: f, n: 2 });
        // Move the child under a newer directory so ids are not in order.
        let z = add(&mut t, ROOT, "z");
        t.apply(&Record::Move {
            node: d,
            parent: z,
            name: "d2".into(),
        });
        let gone = add(&mut t, ROOT, "gone");
        t.apply(&Record::Remove { node: gone });
        let mut r = Table::replay(&t.snapshot());
        assert_eq!(r.init, t.init);
        assert_eq!(r.path(f).unwrap(), PathBuf::from("z/d2/f"));
        assert_eq!(r.nodes[&f].lookups, 3);
        assert!(r.path(gone).is_none() && r.nodes.contains_key(&gone));
        assert_eq!(r.alloc(), t.next);
    }
}
