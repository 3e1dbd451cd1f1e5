//! The trees of snapshots that diffs and merges read: a snapshot never
//! changes, so its tree is listed once (through a temporary clone) and
//! kept, the last few of them.

use std::sync::{Arc, Mutex};

use super::compare::Tree;

/// Trees of snapshots read before: they never change.
#[derive(Default)]
pub struct TreeCache(Mutex<Vec<(TreeKey, Arc<Tree>)>>);

/// A snapshot and the directory listed.
type TreeKey = (String, String);

impl TreeCache {
    const KEEP: usize = 16;

    pub fn get(&self, snap: &str, root: &str) -> Option<Arc<Tree>> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .find(|((s, r), _)| s == snap && r == root)
            .map(|(_, t)| t.clone())
    }

    pub fn put(&self, snap: &str, root: &str, t: Arc<Tree>) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|((s, r), _)| !(s == snap && r == root));
        if g.len() >= Self::KEEP {
            g.remove(0);
        }
        g.push(((snap.to_string(), root.to_string()), t));
    }
}
