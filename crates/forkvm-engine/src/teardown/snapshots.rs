//! Removing snapshots: one that nothing uses, or with `force` everything
//! built on it first; and the pause snapshots a removed sandbox leaves.

use std::sync::Arc;

use forkvm_store::StoreError;

use crate::db::Origin;
use crate::error::{EngineError, HintAction};
use crate::manager::Manager;
use crate::snapshot::store_err;

impl Manager {
    /// Remove a snapshot. Refused (409) while sandboxes or child snapshots
    /// depend on it, unless `force`, which removes those first.
    pub async fn remove_snapshot(
        self: &Arc<Self>,
        id_or_tag: &str,
        force: bool,
    ) -> Result<(), EngineError> {
        if let Some(p) = self.pending.get(id_or_tag) {
            if p.state == "writing" {
                return Err(EngineError::conflict(format!(
                    "snapshot {} is still being written; remove it once it is ready",
                    p.id
                )));
            }
            self.pending.remove(&p.id);
            return Ok(());
        }
        let row = self.snapshot_row(id_or_tag)?;
        let sandboxes = self.db.sandboxes_of_snapshot(&row.id)?;
        let children = self.db.child_snapshots(&row.id)?;
        if !force && (!sandboxes.is_empty() || !children.is_empty()) {
            let mut why = Vec::new();
            if !sandboxes.is_empty() {
                why.push(format!("sandboxes {} run from it", sandboxes.join(", ")));
            }
            if !children.is_empty() {
                why.push(format!(
                    "snapshots {} are built on it",
                    children
                        .iter()
                        .map(|c| c.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            return Err(EngineError::conflict(format!(
                "snapshot {} is in use: {}",
                row.id,
                why.join("; ")
            ))
            .hint_on(HintAction::ForceRemoveSnapshot, row.id.clone()));
        }
        for c in children {
            Box::pin(self.remove_snapshot(&c.id, true)).await?;
        }
        for sb in sandboxes {
            match self.remove(&sb).await {
                Ok(()) => {}
                Err(e) if e.kind == crate::error::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        self.kill_prepared(self.pools.drain(&row.id)).await;
        self.db.delete_snapshot(&row.id)?;
        match self.store.remove(&row.id) {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(store_err(e)),
        }
        self.collect_layers().await;
        Ok(())
    }
}

impl Manager {
    /// Remove the pause snapshots a removed sandbox left (its source),
    /// newest first, as long as nothing else uses them.
    pub async fn drop_pause_snapshots(self: &Arc<Self>, id: &str) {
        let Ok(all) = self.db.snapshots() else { return };
        let mut mine: Vec<_> = all
            .into_iter()
            .filter(|s| s.origin == Origin::Pause && s.source == id)
            .collect();
        mine.reverse();
        for s in mine {
            let in_use = !self
                .db
                .sandboxes_of_snapshot(&s.id)
                .unwrap_or_default()
                .is_empty()
                || !self
                    .db
                    .child_snapshots(&s.id)
                    .unwrap_or_default()
                    .is_empty();
            // A lease: children of the paused sandbox are starting from it
            // (crate::branch::paused).
            if in_use || self.gc.leases.held().contains(&s.id) {
                continue;
            }
            if let Err(e) = Box::pin(self.remove_snapshot(&s.id, false)).await {
                tracing::warn!(sandbox = %id, "pause snapshot {} of sandbox {id} stays: {}", s.id, e.message);
            }
        }
    }
}
