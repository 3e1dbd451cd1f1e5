//! The placement policy (docs/cluster.md, "Placement").
//!
//! A spawn of `count` sandboxes of `memory` MiB each goes to one node. A node
//! qualifies when it is alive, has the image (or the snapshot, or can fetch
//! the snapshot), has `count` sandbox slots left under its
//! `--max-sandboxes`, and has `count × memory` MiB left under its memory
//! commitment. Among those:
//!
//! 1. a node that already holds the snapshot beats one that would fetch it;
//! 2. then the node with the least committed memory, as a share of its
//!    commitment: the memory its running and starting sandboxes were given
//!    (not what they touch, which page sharing makes noisy);
//! 3. then the node with fewer sandboxes;
//! 4. then the name, so the choice is stable.
//!
//! Spawns the gateway sent and the node's last poll does not show yet count
//! as committed (and against its room), so a burst of spawns spreads
//! instead of piling onto the node that looked emptiest at the last poll.

/// What the policy knows of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub memory_left_mib: u64,
    pub slots_left: u32,
    pub sandboxes: u32,
    /// Committed memory, per mille of its commitment.
    pub committed_permille: u64,
    /// It can spawn the image (or holds the snapshot).
    pub has: bool,
    /// It could fetch the snapshot from a node that holds it.
    pub can_fetch: bool,
}

impl Candidate {
    /// How many sandboxes of `memory` MiB it can take.
    pub fn room(&self, memory: u64) -> u32 {
        let by_mem = self.memory_left_mib / memory.max(1);
        self.slots_left
            .min(u32::try_from(by_mem).unwrap_or(u32::MAX))
    }

    fn key(
        &self,
    ) -> (
        bool,
        std::cmp::Reverse<u64>,
        std::cmp::Reverse<u32>,
        std::cmp::Reverse<&str>,
    ) {
        (
            self.has,
            std::cmp::Reverse(self.committed_permille),
            std::cmp::Reverse(self.sandboxes),
            std::cmp::Reverse(self.name.as_str()),
        )
    }
}

/// The node for `count` sandboxes of `memory` MiB, or why none fits.
pub fn choose(cands: &[Candidate], memory: u64, count: u32) -> Result<&Candidate, String> {
    let fit = cands
        .iter()
        .filter(|c| (c.has || c.can_fetch) && c.room(memory) >= count)
        .max_by(|a, b| a.key().cmp(&b.key()));
    fit.ok_or_else(|| no_fit(cands, memory, count))
}

/// How many of `count` children each node takes: `first` (the source's
/// node) as many as fit, then the others by the policy's order, each as many
/// as fit. Errors when the whole cluster cannot take them.
pub fn spread(
    cands: &[Candidate],
    first: &str,
    memory: u64,
    count: u32,
) -> Result<Vec<(String, u32)>, String> {
    let mut left = count;
    let mut out = Vec::new();
    if let Some(c) = cands.iter().find(|c| c.name == first) {
        let n = c.room(memory).min(left);
        if n > 0 {
            out.push((c.name.clone(), n));
            left -= n;
        }
    }
    let mut rest: Vec<&Candidate> = cands
        .iter()
        .filter(|c| c.name != first && (c.has || c.can_fetch))
        .collect();
    rest.sort_by(|a, b| b.key().cmp(&a.key()));
    for c in rest {
        if left == 0 {
            break;
        }
        let n = c.room(memory).min(left);
        if n > 0 {
            out.push((c.name.clone(), n));
            left -= n;
        }
    }
    if left > 0 {
        return Err(no_fit(cands, memory, count));
    }
    Ok(out)
}

fn no_fit(cands: &[Candidate], memory: u64, count: u32) -> String {
    if cands.is_empty() {
        return "no live node in the cluster; check `forkvm cluster status`".into();
    }
    let rooms: Vec<String> = cands
        .iter()
        .map(|c| {
            if c.has || c.can_fetch {
                format!("{} has room for {}", c.name, c.room(memory))
            } else {
                format!("{} lacks the image", c.name)
            }
        })
        .collect();
    format!(
        "no node can take {count} sandbox(es) of {memory} MiB ({}); remove sandboxes or add nodes",
        rooms.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of 64 GB whose commitment is what is not left.
    fn c(name: &str, left: u64, slots: u32, sandboxes: u32, has: bool) -> Candidate {
        Candidate {
            name: name.into(),
            memory_left_mib: left,
            slots_left: slots,
            sandboxes,
            committed_permille: (64000 - left.min(64000)) * 1000 / 64000,
            has,
            can_fetch: false,
        }
    }

    #[test]
    fn least_committed_wins_then_fewer_sandboxes_then_name() {
        let cs = [
            c("n1", 8000, 10, 2, true),
            c("n2", 12000, 10, 5, true),
            c("n3", 12010, 10, 1, true),
        ];
        // n2 and n3 have 812 per mille committed; n3 has fewer sandboxes.
        assert_eq!(choose(&cs, 512, 1).unwrap().name, "n3");
        let cs = [c("n2", 4096, 10, 1, true), c("n1", 4096, 10, 1, true)];
        assert_eq!(choose(&cs, 512, 1).unwrap().name, "n1");
    }

    #[test]
    fn a_node_without_the_image_or_room_is_never_chosen() {
        let cs = [c("n1", 64000, 10, 0, false), c("n2", 2048, 10, 0, true)];
        assert_eq!(choose(&cs, 512, 1).unwrap().name, "n2");
        // n2 fits 4 by memory, not 5.
        let e = choose(&cs, 512, 5).unwrap_err();
        assert!(
            e.contains("n2 has room for 4") && e.contains("n1 lacks the image"),
            "{e}"
        );
        let cs = [c("n1", 64000, 0, 3, true)];
        assert!(choose(&cs, 512, 1).is_err());
        assert!(choose(&[], 512, 1).unwrap_err().contains("no live node"));
    }

    #[test]
    fn holding_the_snapshot_beats_fetching_it() {
        let mut far = c("n1", 64000, 10, 0, false);
        far.can_fetch = true;
        let near = c("n2", 2048, 10, 0, true);
        assert_eq!(choose(&[far.clone(), near], 512, 1).unwrap().name, "n2");
        assert_eq!(choose(&[far], 512, 1).unwrap().name, "n1");
    }

    #[test]
    fn a_branch_fills_the_source_first_then_the_emptiest() {
        let cs = [
            c("n1", 64000, 3, 4, true),
            c("n2", 64000, 100, 2, true),
            c("n3", 32000, 100, 0, true),
        ];
        let s = spread(&cs, "n1", 512, 9).unwrap();
        assert_eq!(s, vec![("n1".into(), 3), ("n2".into(), 6)]);
        let cs = [
            c("n1", 64000, 3, 4, true),
            c("n2", 1024, 100, 2, true),
            c("n3", 32000, 100, 0, true),
        ];
        let s = spread(&cs, "n1", 512, 9).unwrap();
        assert_eq!(
            s,
            vec![("n1".into(), 3), ("n3".into(), 6)],
            "n3 has more memory left"
        );
        let s = spread(&cs, "n1", 512, 2).unwrap();
        assert_eq!(s, vec![("n1".into(), 2)]);
        let cs = [c("n1", 64000, 3, 4, true), c("n2", 1024, 100, 2, true)];
        let e = spread(&cs, "n1", 512, 9).unwrap_err();
        assert!(
            e.contains("n1 has room for 3") && e.contains("n2 has room for 2"),
            "{e}"
        );
    }
}
