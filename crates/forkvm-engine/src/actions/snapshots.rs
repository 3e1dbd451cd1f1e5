//! Actions on snapshots: take, flatten, list, pin, pool, prune and remove
//! them, and move them between nodes (push, pull, export).

use forkvm_api::{
    PruneRequest, PruneResult, PullSnapshot, PushSnapshot, Snapshot, SnapshotList, TransferEvent,
};
use forkvm_artifact::push::{ImagePart, LinkPart};
use forkvm_image::progress::Progress;
use tokio::sync::mpsc;

use super::{Engine, Lease, SnapshotRow};
use crate::error::EngineError;
use crate::snapshot::Save;

impl Engine {
    /// Snapshot a running sandbox (memory and disk) into the store, under
    /// an optional tag; the sandbox keeps running.
    pub async fn snapshot(&self, id: &str, tag: Option<String>) -> Result<Snapshot, EngineError> {
        self.m.snapshot(id, tag, None, Save::Diff).await
    }

    /// Merge a diff snapshot's chain into one new snapshot with no parent,
    /// under an optional tag.
    pub async fn flatten(
        &self,
        id_or_tag: &str,
        tag: Option<String>,
    ) -> Result<Snapshot, EngineError> {
        self.m.flatten(id_or_tag, tag).await
    }

    /// Every snapshot of this node: those being written first, then the
    /// stored ones.
    pub fn list_snapshots(&self) -> Result<SnapshotList, EngineError> {
        self.m.list_snapshots()
    }

    /// One snapshot by id or tag.
    pub fn snapshot_by_ref(&self, id_or_tag: &str) -> Result<Snapshot, EngineError> {
        self.m.snapshot_by_ref(id_or_tag)
    }

    /// One stored snapshot's record by id or tag (with its origin and
    /// template key), `None` when there is none.
    pub fn snapshot_record(&self, id_or_tag: &str) -> Result<Option<SnapshotRow>, EngineError> {
        self.m.snapshot_record(id_or_tag)
    }

    /// Every snapshot's record.
    pub fn snapshot_records(&self) -> Result<Vec<SnapshotRow>, EngineError> {
        self.m.snapshot_records()
    }

    /// A snapshot's record by id or tag; a not-found error when there is
    /// none.
    pub fn snapshot_row(&self, id_or_tag: &str) -> Result<SnapshotRow, EngineError> {
        self.m.snapshot_row(id_or_tag)
    }

    /// A snapshot still being written, by id or tag (`None` when it is
    /// ready or unknown).
    pub fn pending_snapshot(&self, id_or_tag: &str) -> Option<Snapshot> {
        self.m.pending.get(id_or_tag)
    }

    /// The content digest of a stored snapshot's manifest.
    pub fn snapshot_digest(&self, id: &str) -> Result<String, EngineError> {
        let s = self
            .m
            .store
            .open_snapshot(id)
            .map_err(crate::snapshot::store_err)?;
        Ok(s.digest)
    }

    /// Hold a snapshot against garbage collection while the lease lives;
    /// `None` when it is being removed.
    pub fn lease_snapshot(&self, id: &str) -> Option<Lease> {
        self.m.gc.leases.try_lease(id)
    }

    /// Remove a snapshot; refused while sandboxes or child snapshots depend
    /// on it, unless `force`, which removes those first.
    pub async fn remove_snapshot(&self, id_or_tag: &str, force: bool) -> Result<(), EngineError> {
        self.m.remove_snapshot(id_or_tag, force).await
    }

    /// Pin a snapshot so garbage collection keeps it, or unpin it.
    pub fn set_pinned(&self, id_or_tag: &str, pinned: bool) -> Result<Snapshot, EngineError> {
        self.m.set_pinned(id_or_tag, pinned)
    }

    /// Set (or clear) how many sandboxes a snapshot keeps restored in its
    /// warm pool.
    pub async fn set_pool(
        &self,
        id_or_tag: &str,
        size: Option<u32>,
    ) -> Result<Snapshot, EngineError> {
        self.m.set_pool(id_or_tag, size).await
    }

    /// Collect the snapshots nothing needs now, with the daemon's grace
    /// period (or none, with `all`).
    pub async fn prune(&self, req: PruneRequest) -> Result<PruneResult, EngineError> {
        self.m.prune(req).await
    }

    /// A snapshot as OCI parts (its image and the links to its parents),
    /// for a registry or another node.
    pub async fn export(
        &self,
        id: &str,
        progress: &(dyn Progress + 'static),
    ) -> Result<(ImagePart, Vec<LinkPart>), EngineError> {
        self.m.export(id, progress).await
    }

    /// Check a push before it starts; returns the snapshot's id.
    pub fn check_push(&self, id: &str, req: &PushSnapshot) -> Result<String, EngineError> {
        self.m.check_push(id, req)
    }

    /// Push a snapshot to an OCI registry, sending progress on `tx`.
    pub async fn push_snapshot(
        &self,
        id: String,
        req: PushSnapshot,
        tx: mpsc::UnboundedSender<TransferEvent>,
    ) -> Result<TransferEvent, EngineError> {
        self.m.push_snapshot(id, req, tx).await
    }

    /// Check a snapshot pull before it starts.
    pub fn check_pull_snapshot(&self, req: &PullSnapshot) -> Result<(), EngineError> {
        self.m.check_pull_snapshot(req)
    }

    /// Pull a snapshot from an OCI registry or another node, sending
    /// progress on `tx`.
    pub async fn pull_snapshot(
        &self,
        req: PullSnapshot,
        tx: mpsc::UnboundedSender<TransferEvent>,
    ) -> Result<TransferEvent, EngineError> {
        self.m.pull_snapshot(req, tx).await
    }
}
