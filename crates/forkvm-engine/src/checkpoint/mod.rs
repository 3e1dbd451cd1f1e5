//! Checkpoints: a sandbox's timeline of snapshots, each building on the one
//! before (docs/timetravel.md).
//!
//! A checkpoint is a `live` save of a clone ([`crate::snapshot::Save::Live`]):
//! QEMU copies RAM while the guest runs and stops it only for the final
//! pass, so the pause does not grow with what the guest has written. Its
//! parent is the sandbox's previous checkpoint (the timeline's head), not
//! the snapshot the sandbox started from, so publish keeps only the pages
//! that differ from the previous checkpoint's view of RAM, and its disk
//! layer holds only the blocks written since (the running top is frozen
//! and a new one started at every snapshot anyway).
//!
//! ```text
//!   template ── cp1 ── cp2 ── cp3        (head: cp3; the sandbox runs on)
//!                  pages changed since cp1 only
//! ```
//!
//! Retention ([`prune`]) keeps the last N, every Kth and the tagged ones;
//! a pruned checkpoint in the middle is spliced out of the chain
//! (forkvm_store::splice), so the ones above it still restore exactly.

pub mod prune;
pub mod rewind;

use std::sync::Arc;

use forkvm_api::{Checkpoint, Retention, Timeline};

use crate::catalog::MAX_CHAIN;
use crate::db::{CheckpointRow, Origin};
use crate::error::{EngineError, HintAction};
use crate::manager::Manager;
use crate::snapshot::{Onto, Save};

impl Manager {
    /// Take a checkpoint of running sandbox `id` onto its timeline's head,
    /// then apply its retention policy.
    pub async fn checkpoint(
        self: &Arc<Self>,
        id: &str,
        tag: Option<String>,
    ) -> Result<Checkpoint, EngineError> {
        let r = self.take_checkpoint(id, tag).await;
        let c = r.inspect_err(|e| {
            tracing::warn!(sandbox = %id, code = e.code(), "checkpoint of sandbox {id} failed: {}", e.message);
        })?;
        if let Err(e) = self.apply_retention(id).await {
            tracing::warn!(sandbox = %id, "retention of sandbox {id}'s checkpoints failed: {}", e.message);
        }
        Ok(c)
    }

    async fn take_checkpoint(
        self: &Arc<Self>,
        id: &str,
        tag: Option<String>,
    ) -> Result<Checkpoint, EngineError> {
        self.check_disk(&format!("checkpoint of sandbox {id}"))?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        if self.clone_chain(&row).is_none() {
            return Err(EngineError::conflict(format!(
                "sandbox {id} owns its RAM (it booted without a template, or runs from a live \
                 snapshot), so a checkpoint could not store only what changed; take snapshots \
                 of it instead (forkvm snapshot {id})"
            )));
        }
        let tl = self.db.timeline(id)?;
        // The head is the previous checkpoint, while it exists.
        let head = tl
            .head
            .as_deref()
            .and_then(|h| self.store.open_snapshot(h).ok());
        let onto = head.as_ref().map(|s| s.manifest.id.clone());
        // The lease keeps the collector off the head until its child is
        // indexed (a checkpoint of a removed sandbox may be collected).
        let _lease = match &onto {
            Some(h) => Some(self.gc_lease(h)?),
            None => None,
        };
        let depth = match &head {
            Some(s) => self.chain(s)?.links.len(),
            None => self.clone_chain(&row).map_or(0, |c| c.links.len()),
        };
        if depth + 1 > MAX_CHAIN {
            return Err(EngineError::conflict(format!(
                "sandbox {id}'s timeline keeps {depth} checkpoints in one chain, the most a \
                 chain holds ({MAX_CHAIN}); set a retention policy (forkvm checkpoint {id} \
                 --keep-last N) or untag some"
            ))
            .hint(HintAction::ListSnapshots));
        }
        let mut f = self
            .freeze(id, tag, None, Some(0), Save::Live, Onto::Checkpoint(onto))
            .await?;
        f.srow.origin = Origin::Checkpoint;
        let pause_ms = f.timings.pause_ms;
        let snap = self.publish_frozen(f).await?;
        let row = CheckpointRow {
            id: snap.id.clone(),
            sandbox: id.to_string(),
            seq: tl.next_seq,
            pause_ms: Some(pause_ms),
        };
        self.db.add_checkpoint(&row)?;
        tracing::info!(sandbox = %id, checkpoint = %snap.id, seq = row.seq, pause_ms, "checkpoint {} of sandbox {id}", row.seq);
        self.checkpoint_view(&row, Some(&row.id))
    }

    /// A checkpoint as the API shows it.
    pub fn checkpoint_view(
        &self,
        c: &CheckpointRow,
        head: Option<&str>,
    ) -> Result<Checkpoint, EngineError> {
        let srow = self.snapshot_row(&c.id)?;
        let bytes = self
            .store
            .open_snapshot(&c.id)
            .map(|s| {
                s.manifest
                    .artefacts
                    .iter()
                    .filter(|a| a.kind != "memory")
                    .map(|a| a.allocated)
                    .sum()
            })
            .unwrap_or(0);
        Ok(Checkpoint {
            id: c.id.clone(),
            tag: srow.tag,
            sandbox: c.sandbox.clone(),
            seq: c.seq,
            created_at: srow.created_at,
            parent: srow.parent,
            pause_ms: c.pause_ms,
            bytes,
            head: head == Some(c.id.as_str()),
        })
    }

    /// A sandbox's timeline: its checkpoints, oldest first.
    pub fn timeline(&self, id: &str) -> Result<Timeline, EngineError> {
        if self.db.get(id)?.is_none() {
            return Err(EngineError::sandbox_not_found(id));
        }
        let tl = self.db.timeline(id)?;
        let checkpoints = self
            .db
            .checkpoints(id)?
            .iter()
            .map(|c| self.checkpoint_view(c, tl.head.as_deref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Timeline {
            sandbox: id.to_string(),
            head: tl.head,
            retention: Retention {
                keep_last: tl.keep_last,
                keep_every: tl.keep_every,
            },
            bytes: checkpoints.iter().map(|c| c.bytes).sum(),
            checkpoints,
        })
    }

    /// Set a sandbox's retention policy and apply it now.
    pub async fn set_retention(
        self: &Arc<Self>,
        id: &str,
        r: Retention,
    ) -> Result<Timeline, EngineError> {
        if r.keep_last == Some(0) || r.keep_every == Some(0) {
            return Err(EngineError::invalid(
                "keep_last and keep_every must be 1 or more (leave one out to keep all)",
            ));
        }
        if self.db.get(id)?.is_none() {
            return Err(EngineError::sandbox_not_found(id));
        }
        self.db.set_retention(id, r.keep_last, r.keep_every)?;
        self.apply_retention(id).await?;
        self.timeline(id)
    }
}
