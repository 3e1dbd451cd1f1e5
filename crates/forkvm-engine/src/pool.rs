//! Warm pools: QEMU processes started ahead of time for a snapshot, waiting
//! for its state, so that a spawn skips QEMU's start-up. This module sets a
//! snapshot's pool size and reports the pools; the launcher
//! ([`crate::launcher::refill`]) starts the clones.

use std::sync::Arc;

use crate::error::EngineError;
use crate::manager::{Manager, MAX_POOL};

impl Manager {
    /// Stop every pooled QEMU (daemon shutdown). A filler may be starting
    /// one right now: the pools are closed first, so it kills what it
    /// finishes, and the drain waits (up to 60 s) for fillers to stop, so
    /// that the daemon never exits leaving a QEMU nobody knows.
    pub async fn drain_pools(&self) {
        self.pools
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let all = self.pools.drain_all();
        self.kill_prepared(all).await;
        let t = std::time::Instant::now();
        while self.pools.filling_any() && t.elapsed() < std::time::Duration::from_secs(60) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        if self.pools.filling_any() {
            tracing::warn!("a warm-pool filler did not stop within 60 s of shutdown");
        }
        let late = self.pools.drain_all();
        self.kill_prepared(late).await;
    }

    /// Set the warm-pool size of a snapshot (`None`: follow the default).
    pub async fn set_pool(
        self: &Arc<Self>,
        id_or_tag: &str,
        size: Option<u32>,
    ) -> Result<forkvm_api::Snapshot, EngineError> {
        if size.is_some_and(|n| n > MAX_POOL) {
            return Err(EngineError::invalid(format!(
                "a warm pool holds at most {MAX_POOL} processes"
            )));
        }
        let row = self.snapshot_row(id_or_tag)?;
        self.db.set_pool_size(&row.id, size)?;
        let row = self.snapshot_row(&row.id)?;
        let size = self.pool_size_of(&row);
        // Shrink now; grow in the background.
        let mut extra = Vec::new();
        while self.pools.ready_count(&row.id) > size {
            match self.pools.take(&row.id) {
                Some(p) => extra.push(p),
                None => break,
            }
        }
        self.kill_prepared(extra).await;
        self.refill_pool(&row.id);
        self.snapshot_view(&row)
    }

    /// Pools as `GET /v1/info` shows them.
    pub fn pool_infos(&self) -> Vec<forkvm_api::PoolInfo> {
        self.db
            .snapshots()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| self.pool_size_of(r) > 0)
            .map(|r| forkvm_api::PoolInfo {
                ready: self.pools.ready_count(&r.id),
                size: self.pool_size_of(&r),
                snapshot: r.id,
            })
            .collect()
    }
}
