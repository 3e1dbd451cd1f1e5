//! Branching a paused sandbox without resuming it.
//!
//! A pause that kept memory saved the whole machine as a snapshot (origin
//! `pause`, see crate::lifetime::pause). That snapshot is the branch point,
//! whatever mode the request names: the modes differ only in how a
//! *running* source is saved, and this one is saved already, so the source
//! is not touched and stays paused, and the branch pauses nothing
//! (`pause_ms` 0). Each child restores the saved state with a fresh
//! identity, as every branch child does. A filesystem-only pause kept no
//! memory, so there is nothing to fork from: it is refused (409) with the
//! hint to resume first.
//!
//! The pause snapshot belongs to its sandbox: it is removed with it
//! (crate::teardown::snapshots). Children change that in two ways:
//! - while they start, a GC lease holds the snapshot, and removing the
//!   source skips a leased pause snapshot, so a removal that races the
//!   fork does not delete what the children are restoring;
//! - once they run, the snapshot is in use, so it stays when the source
//!   goes, and the last child removed after its source takes it along.

use std::sync::Arc;
use std::time::Instant;

use forkvm_api::{BranchRequest, BranchResult, PauseInfo, SandboxState};

use crate::error::{EngineError, HintAction};
use crate::manager::Manager;
use crate::util::ms;

impl Manager {
    /// The pause snapshot a branch of `id` starts from, when `id` is
    /// paused; None when it is not (it is then branched as it runs).
    pub(super) fn paused_branch_point(&self, id: &str) -> Result<Option<String>, EngineError> {
        let Some(row) = self.db.get(id)? else {
            return Ok(None);
        };
        if row.state != SandboxState::Paused {
            return Ok(None);
        }
        match self.db.lifecycle(id)?.pause {
            Some(PauseInfo {
                snapshot: Some(s),
                memory: true,
                ..
            }) => Ok(Some(s)),
            _ => Err(EngineError::conflict(format!(
                "sandbox {id} is paused with its filesystem only: no memory was saved to \
                 branch from"
            ))
            .hint_on(HintAction::ResumeSandbox, id)),
        }
    }

    /// Spawn the children of paused sandbox `id` from its pause snapshot
    /// `pause` (see the module doc).
    pub(super) async fn branch_paused(
        self: &Arc<Self>,
        id: &str,
        req: &BranchRequest,
        pause: String,
        t0: Instant,
    ) -> Result<BranchResult, EngineError> {
        if req.tag.is_some() {
            return Err(EngineError::invalid(format!(
                "sandbox {id} is paused: its children start from the snapshot its pause saved, \
                 which is the sandbox's own and takes no tag; branch without `tag`, or resume it \
                 and branch with one"
            )));
        }
        let lease = self.gc_lease(&pause)?;
        let r = self.branch_paused_leased(id, req, &pause, t0).await;
        drop(lease);
        // The source may have been removed while the children started: its
        // pause snapshot was left to them, and goes now if none runs from it.
        if matches!(self.db.get(id), Ok(None)) {
            self.drop_pause_snapshots(id).await;
        }
        r
    }

    async fn branch_paused_leased(
        self: &Arc<Self>,
        id: &str,
        req: &BranchRequest,
        pause: &str,
        t0: Instant,
    ) -> Result<BranchResult, EngineError> {
        let count = req.count.unwrap_or(1);
        let view = self.snapshot_by_ref(pause)?;
        let _admitted = self.admit(
            u64::from(count) * crate::admission::clone_estimate_mib(&view.sizes, &view.kind),
            &format!("branch of paused sandbox {id}"),
        )?;
        let snap = self.open_verified(pause).await?;
        let paused_net = self.db.lifecycle(id)?.paused_net;
        let nic = snap.manifest.machine.nic.is_some();
        let net = self.children_network_of(paused_net, req, count, nic)?;
        let snapshot_ms = ms(t0.elapsed());
        let t1 = Instant::now();
        let children = if count > 0 {
            self.spawn_clones(&snap, count, &net).await?
        } else {
            Vec::new()
        };
        Ok(BranchResult {
            mode: req.mode.unwrap_or_default(),
            pause_ms: 0.0,
            // Again, now that it lists the children.
            snapshot: self.snapshot_by_ref(pause).unwrap_or(view),
            children,
            snapshot_ms,
            spawn_ms: ms(t1.elapsed()),
            total_ms: ms(t0.elapsed()),
        })
    }
}
