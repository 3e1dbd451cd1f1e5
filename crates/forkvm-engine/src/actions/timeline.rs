//! Actions of time travel: checkpoints, a sandbox's timeline and its
//! retention, rewind (crate::checkpoint), and filesystem diff and merge
//! (crate::treediff); docs/timetravel.md.

use forkvm_api::{
    Checkpoint, Diff, DiffRequest, MergeRequest, Merged, Retention, RewindRequest, Rewound,
    Timeline,
};

use super::Engine;
use crate::error::EngineError;

impl Engine {
    /// Checkpoint a running sandbox onto its timeline: a live save that
    /// stores only what changed since its previous checkpoint. Then apply
    /// its retention policy.
    pub async fn checkpoint(
        &self,
        id: &str,
        tag: Option<String>,
    ) -> Result<Checkpoint, EngineError> {
        self.m.checkpoint(id, tag).await
    }

    /// A sandbox's checkpoints, oldest first, with its retention policy.
    pub fn timeline(&self, id: &str) -> Result<Timeline, EngineError> {
        self.m.timeline(id)
    }

    /// Set a sandbox's retention policy and prune by it now.
    pub async fn set_retention(&self, id: &str, r: Retention) -> Result<Timeline, EngineError> {
        self.m.set_retention(id, r).await
    }

    /// Bring a running sandbox back to one of its checkpoints or snapshots,
    /// as the same sandbox (optionally checkpointing the present first).
    pub async fn rewind(&self, id: &str, req: RewindRequest) -> Result<Rewound, EngineError> {
        self.m.rewind(id, req).await
    }

    /// The filesystem differences between two sandboxes, snapshots or
    /// checkpoints (read through their guests).
    pub async fn diff(&self, a: &str, req: DiffRequest) -> Result<Diff, EngineError> {
        self.m.diff(a, req).await
    }

    /// Apply a child's filesystem changes since its branch point to a
    /// running sandbox, three-way; all or nothing.
    pub async fn merge(&self, child: &str, req: MergeRequest) -> Result<Merged, EngineError> {
        self.m.merge(child, req).await
    }
}
