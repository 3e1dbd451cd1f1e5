//! Which snapshots a collection takes: the pure part, no I/O.
//!
//! It works from roots, as containerd's collector does, never from
//! reference counts:
//!
//! ```text
//!  roots: tagged · pinned · run by a sandbox (any state) · held by an
//!         operation in flight (a spawn, a branch, a pin) · with a warm pool ·
//!         parent of a snapshot being written · not made by a branch ·
//!         younger than the grace period
//!    │
//!    └── parent links ──▶ every ancestor of a root is kept
//!
//!  the rest: branch points that nothing needs, past the grace
//!    └──▶ removed, children before their parents
//! ```
//!
//! Everything that is not itself collectable is a root, not only tags,
//! pins and sandboxes: a snapshot that must stay (a young branch point, one
//! taken with `snapshot`) keeps its parent too, since its memory chain or
//! disk may go through it and `snapshot rm` refuses a parent with children.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

/// What the collector knows of one indexed snapshot.
#[derive(Debug, Clone)]
pub struct Facts {
    pub id: String,
    pub parent: Option<String>,
    /// `None` when its timestamp is unreadable: then it counts as young.
    pub created: Option<SystemTime>,
    /// Made by a branch (the only origin ever collected).
    pub branch: bool,
    pub tagged: bool,
    pub pinned: bool,
    /// A sandbox runs from it, an operation holds it, it has a warm pool,
    /// or a snapshot being written names it as parent.
    pub in_use: bool,
}

/// Why a snapshot is a root (kept by itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    Tagged,
    Pinned,
    InUse,
    NotBranch,
    Young,
}

/// Whether `f` is a root, and why.
pub fn root(f: &Facts, now: SystemTime, grace: Duration) -> Option<Root> {
    if f.tagged {
        Some(Root::Tagged)
    } else if f.pinned {
        Some(Root::Pinned)
    } else if f.in_use {
        Some(Root::InUse)
    } else if !f.branch {
        Some(Root::NotBranch)
    } else {
        // A timestamp in the future (the clock went back) is young too.
        let old = f
            .created
            .and_then(|c| now.duration_since(c).ok())
            .is_some_and(|age| age >= grace);
        (!old).then_some(Root::Young)
    }
}

/// The snapshots to remove, children before their parents (in the order
/// of `facts` among those free at the same time).
pub fn select(facts: &[Facts], now: SystemTime, grace: Duration) -> Vec<String> {
    let by_id: HashMap<&str, &Facts> = facts.iter().map(|f| (f.id.as_str(), f)).collect();
    let mut kept: HashSet<&str> = HashSet::new();
    for f in facts.iter().filter(|f| root(f, now, grace).is_some()) {
        // Walk up until an ancestor already kept (which covers a cycle in
        // a damaged index) or one that is not indexed.
        let mut cur = Some(f);
        while let Some(c) = cur {
            if !kept.insert(c.id.as_str()) {
                break;
            }
            cur = c.parent.as_deref().and_then(|p| by_id.get(p).copied());
        }
    }
    let doomed: Vec<&Facts> = facts
        .iter()
        .filter(|f| !kept.contains(f.id.as_str()))
        .collect();
    // Kahn's algorithm over the doomed: a snapshot goes once none of its
    // children is left. Members of a cycle never get there and stay.
    let mut children: HashMap<&str, usize> = HashMap::new();
    for f in &doomed {
        if let Some(p) = f.parent.as_deref() {
            *children.entry(p).or_default() += 1;
        }
    }
    let mut order = Vec::with_capacity(doomed.len());
    let mut done: HashSet<&str> = HashSet::new();
    loop {
        let ready: Vec<&Facts> = doomed
            .iter()
            .copied()
            .filter(|f| !done.contains(f.id.as_str()))
            .filter(|f| children.get(f.id.as_str()).copied().unwrap_or(0) == 0)
            .collect();
        if ready.is_empty() {
            break;
        }
        for f in ready {
            done.insert(f.id.as_str());
            if let Some(n) = f.parent.as_deref().and_then(|p| children.get_mut(p)) {
                *n = n.saturating_sub(1);
            }
            order.push(f.id.clone());
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(600);

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000)
    }

    /// A branch point `age` seconds old, with nothing holding it.
    fn bp(id: &str, parent: Option<&str>, age: u64) -> Facts {
        Facts {
            id: id.into(),
            parent: parent.map(Into::into),
            created: Some(now() - Duration::from_secs(age)),
            branch: true,
            tagged: false,
            pinned: false,
            in_use: false,
        }
    }

    fn pick(facts: &[Facts]) -> Vec<String> {
        select(facts, now(), GRACE)
    }

    #[test]
    fn tagged_pinned_and_used_branch_points_stay_and_the_rest_go() {
        let mut tagged = bp("t", None, 9000);
        tagged.tagged = true;
        let mut pinned = bp("p", None, 9000);
        pinned.pinned = true;
        let mut used = bp("u", None, 9000);
        used.in_use = true;
        let mut taken = bp("s", None, 9000);
        taken.branch = false; // made by `snapshot`
        let facts = [
            tagged,
            pinned,
            used,
            taken,
            bp("a", None, 9000),
            bp("b", None, 601),
        ];
        assert_eq!(pick(&facts), ["a", "b"]);
        assert_eq!(root(&facts[0], now(), GRACE), Some(Root::Tagged));
        assert_eq!(root(&facts[1], now(), GRACE), Some(Root::Pinned));
        assert_eq!(root(&facts[2], now(), GRACE), Some(Root::InUse));
        assert_eq!(root(&facts[3], now(), GRACE), Some(Root::NotBranch));
        assert_eq!(root(&facts[4], now(), GRACE), None);
    }

    #[test]
    fn the_grace_period_keeps_young_and_undated_ones() {
        let mut undated = bp("undated", None, 0);
        undated.created = None;
        let future = Facts {
            created: Some(now() + Duration::from_secs(60)),
            ..bp("future", None, 0)
        };
        let facts = [
            bp("young", None, 599),
            bp("edge", None, 600),
            undated,
            future,
        ];
        assert_eq!(pick(&facts), ["edge"]);
        assert_eq!(root(&facts[0], now(), GRACE), Some(Root::Young));
        // A grace of 0 (`prune --all`) takes every unneeded one, young too,
        // but never one whose age cannot be told.
        assert_eq!(select(&facts, now(), Duration::ZERO), ["young", "edge"]);
    }

    #[test]
    fn a_root_keeps_its_whole_chain_of_ancestors() {
        // a <- b <- c <- d, with d tagged: all stay. e hangs off b and goes.
        let mut d = bp("d", Some("c"), 9000);
        d.tagged = true;
        let facts = [
            bp("a", None, 9000),
            bp("b", Some("a"), 9000),
            bp("c", Some("b"), 9000),
            d,
            bp("e", Some("b"), 9000),
        ];
        assert_eq!(pick(&facts), ["e"]);
    }

    #[test]
    fn whatever_must_stay_keeps_its_parent_too() {
        // A young branch point, one taken with `snapshot` and one with a
        // sandbox each keep an old, otherwise unneeded parent.
        let mut taken = bp("taken", Some("p2"), 9000);
        taken.branch = false;
        let mut used = bp("used", Some("p3"), 9000);
        used.in_use = true;
        let facts = [
            bp("p1", None, 9000),
            bp("young", Some("p1"), 10),
            bp("p2", None, 9000),
            taken,
            bp("p3", None, 9000),
            used,
        ];
        assert!(pick(&facts).is_empty());
    }

    #[test]
    fn a_dead_chain_goes_children_first() {
        // Listed parents first (as the index orders them, by creation).
        let facts = [
            bp("a", None, 9000),
            bp("b", Some("a"), 8000),
            bp("c", Some("b"), 7000),
            bp("c2", Some("b"), 7000),
            bp("d", Some("c"), 6000),
        ];
        let order = pick(&facts);
        assert_eq!(order.len(), 5);
        let at = |id: &str| order.iter().position(|x| x == id).unwrap();
        for f in &facts {
            if let Some(p) = &f.parent {
                assert!(at(&f.id) < at(p), "{} must go before {p}: {order:?}", f.id);
            }
        }
        assert_eq!(order, ["c2", "d", "c", "b", "a"]);
    }

    #[test]
    fn a_parent_outside_the_index_and_a_damaged_cycle_are_safe() {
        let facts = [
            bp("orphan", Some("gone"), 9000),
            bp("x", Some("y"), 9000),
            bp("y", Some("x"), 9000),
        ];
        // The cycle's members each wait for the other: neither is taken.
        assert_eq!(pick(&facts), ["orphan"]);
        // A root in a cycle ends the walk up instead of looping.
        let mut x = bp("x", Some("y"), 9000);
        x.pinned = true;
        assert!(pick(&[x, bp("y", Some("x"), 9000)]).is_empty());
    }
}
