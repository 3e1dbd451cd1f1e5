//! Retention: which checkpoints a timeline keeps, and pruning the others.
//!
//! Kept: the last `keep_last`, every `keep_every`th by step number, the
//! tagged and pinned ones, and the timeline's head. A checkpoint that
//! something else needs stays until it does not: a sandbox runs from it
//! (a rewind, a spawn), a snapshot other than the next checkpoint builds on
//! it, or an operation holds a lease on it.
//!
//! A pruned checkpoint with the next checkpoint built on it is spliced out
//! (forkvm_store::splice): its pages move into the next one, which then
//! builds on its parent, so every later checkpoint restores exactly as
//! before. One with nothing built on it is simply removed.

use std::sync::Arc;

use crate::db::{CheckpointRow, Origin};
use crate::error::EngineError;
use crate::manager::Manager;

/// One checkpoint as retention sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: String,
    pub seq: u64,
    /// Tagged or pinned.
    pub marked: bool,
}

/// The checkpoints a policy drops, oldest first (`cps` oldest first).
pub fn select(
    cps: &[Candidate],
    keep_last: Option<u32>,
    keep_every: Option<u32>,
    head: Option<&str>,
) -> Vec<String> {
    if keep_last.is_none() && keep_every.is_none() {
        return Vec::new();
    }
    let last_from = keep_last.map_or(0, |n| cps.len().saturating_sub(n as usize));
    cps.iter()
        .enumerate()
        .filter(|(i, c)| {
            let kept = (keep_last.is_some() && *i >= last_from)
                || keep_every.is_some_and(|k| c.seq % u64::from(k) == 0)
                || c.marked
                || head == Some(c.id.as_str())
                || *i + 1 == cps.len();
            !kept
        })
        .map(|(_, c)| c.id.clone())
        .collect()
}

impl Manager {
    /// Apply sandbox `id`'s retention policy to its timeline.
    pub async fn apply_retention(self: &Arc<Self>, id: &str) -> Result<(), EngineError> {
        let tl = self.db.timeline(id)?;
        let rows = self.db.checkpoints(id)?;
        let mut cands = Vec::new();
        for c in &rows {
            let Some(s) = self.db.snapshot(&c.id)? else {
                continue;
            };
            cands.push(Candidate {
                id: c.id.clone(),
                seq: c.seq,
                marked: s.tag.is_some() || s.pinned,
            });
        }
        let victims = select(&cands, tl.keep_last, tl.keep_every, tl.head.as_deref());
        let pruned = !victims.is_empty();
        for v in victims {
            if let Err(e) = self.prune_checkpoint(id, &v, &rows).await {
                tracing::warn!(sandbox = %id, checkpoint = %v, "checkpoint {v} of sandbox {id} is kept: {}", e.message);
            }
        }
        // The pruned checkpoints' disk layers go once nothing reads through
        // them (a thin layer above was merged; a clone may still run on
        // one): one collection for all of them.
        if pruned {
            self.collect_layers().await;
        }
        Ok(())
    }

    /// Remove checkpoint `v`, splicing it out when the next checkpoint
    /// builds on it. Refused (and kept) while anything else needs it.
    async fn prune_checkpoint(
        self: &Arc<Self>,
        id: &str,
        v: &str,
        rows: &[CheckpointRow],
    ) -> Result<(), EngineError> {
        let users = self.db.sandboxes_of_snapshot(v)?;
        if !users.is_empty() {
            return Err(EngineError::conflict(format!(
                "sandboxes {} run from it",
                users.join(", ")
            )));
        }
        let children = self.db.child_snapshots(v)?;
        let next = match children.as_slice() {
            [] => None,
            [c] if c.origin == Origin::Checkpoint
                && c.source == id
                && rows.iter().any(|r| r.id == c.id) =>
            {
                Some(c.id.clone())
            }
            _ => {
                return Err(EngineError::conflict(format!(
                    "snapshots {} build on it",
                    children
                        .iter()
                        .map(|c| c.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        };
        let Some(_doom) = self.gc.leases.doom(v) else {
            return Err(EngineError::conflict("an operation is using it"));
        };
        let Some(next) = next else {
            return self.remove_snapshot(v, false).await;
        };
        let store = self.store.clone();
        let (victim, n) = (v.to_string(), next.clone());
        let spliced = tokio::task::spawn_blocking(move || store.splice_out(&victim, &n))
            .await
            .map_err(|e| EngineError::internal(e.to_string()))?
            .map_err(crate::catalog::store_err)?;
        let parent = spliced.next.manifest.parent.as_ref().map(|p| p.id.as_str());
        self.db.set_snapshot_parent(&next, parent)?;
        self.db.delete_snapshot(v)?;
        tracing::info!(
            sandbox = %id,
            checkpoint = %v,
            into = %next,
            moved_pages = spliced.moved_pages,
            dropped_pages = spliced.dropped_pages,
            "pruned checkpoint {v} of sandbox {id}: spliced into {next}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cps(n: u64, marked: &[u64]) -> Vec<Candidate> {
        (1..=n)
            .map(|seq| Candidate {
                id: format!("c{seq}"),
                seq,
                marked: marked.contains(&seq),
            })
            .collect()
    }

    #[test]
    fn keeps_the_last_every_kth_marked_and_head() {
        let got = select(&cps(10, &[2]), Some(3), Some(4), Some("c5"));
        // Kept: 8, 9, 10 (last 3), 4, 8 (every 4th), 2 (tagged), 5 (head).
        assert_eq!(got, ["c1", "c3", "c6", "c7"]);
    }

    #[test]
    fn no_policy_keeps_everything() {
        assert!(select(&cps(5, &[]), None, None, None).is_empty());
    }

    #[test]
    fn every_kth_alone_keeps_the_newest_too() {
        let got = select(&cps(5, &[]), None, Some(2), None);
        assert_eq!(got, ["c1", "c3"]);
    }
}
