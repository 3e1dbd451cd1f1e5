//! Warm pools: QEMU processes started ahead of time for a snapshot, waiting
//! for its state, so that a spawn skips QEMU's start-up.

use std::sync::Arc;

use forkvm_qemu::process;
use forkvm_store::Snapshot as StoredSnapshot;

use crate::db::SnapshotRow;
use crate::error::EngineError;
use crate::manager::{Manager, Prepared, MAX_POOL};

impl Manager {
    pub async fn kill_prepared(&self, v: Vec<Prepared>) {
        for mut p in v {
            process::kill(p.qemu.pid, libc::SIGKILL);
            let _ = p.child.wait().await;
            self.jail.release(&p.id);
            self.net.teardown(&p.id, p.net.as_ref()).await;
            p.paths.remove_all();
        }
    }

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

    /// Keep the warm pool of a snapshot at its configured size, in the
    /// background.
    pub fn refill_pool(self: &Arc<Self>, snap_id: &str) {
        let Ok(Some(row)) = self.db.snapshot(snap_id) else {
            return;
        };
        if self.pool_size_of(&row) == 0 {
            return;
        }
        {
            let Ok(mut f) = self.pools.filling.lock() else {
                return;
            };
            if !f.insert(row.id.clone()) {
                return; // a filler is already running
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let want = me
                    .db
                    .snapshot(&row.id)
                    .ok()
                    .flatten()
                    .map_or(0, |r| me.pool_size_of(&r));
                if me.pools.ready_count(&row.id) >= want || me.pools.is_closed() {
                    break;
                }
                let Ok(snap) = me.open_verified(&row.id).await else {
                    break;
                };
                let prepared = match me.prepare_restore(&snap, &me.new_id("sb")).await {
                    Ok(p) => Ok(me.pool_network(&snap, p).await),
                    Err(e) => Err(e),
                };
                match prepared {
                    // The snapshot may have been removed, or its pool shrunk,
                    // while we prepared.
                    Ok(p)
                        if !me.pools.is_closed()
                            && me.db.snapshot(&row.id).ok().flatten().is_some_and(|r| {
                                me.pools.ready_count(&row.id) < me.pool_size_of(&r)
                            }) =>
                    {
                        me.pools.put(&row.id, p)
                    }
                    Ok(p) => {
                        me.kill_prepared(vec![p]).await;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("warm pool of {}: {}", row.id, e.message);
                        break;
                    }
                }
            }
            if let Ok(mut f) = me.pools.filling.lock() {
                f.remove(&row.id);
            }
        });
    }

    /// Give a pooled QEMU the network a spawn gets by default (`nat`, no
    /// published port, no allow-list), so that a pool hit does not pay the
    /// uplink, the rulesets and the address claim (~70-100 ms here) on its
    /// critical path. A spawn that asks for another network undoes it (see
    /// [`Manager::finish_restore`]), which costs about as much again, so
    /// after such a spawn the snapshot's refills leave the network to the
    /// spawn until a default request comes back. If the set-up fails, the
    /// spawn does it itself, as without a pool.
    pub async fn pool_network(&self, snap: &StoredSnapshot, mut p: Prepared) -> Prepared {
        if snap.manifest.machine.nic.is_none()
            || !self.net.available()
            || !self.pools.wants_network(&snap.manifest.id)
        {
            return p;
        }
        let req = match self.net.validate(None, None, None, None, None, true, 1) {
            Ok(r) if r.is_default_nat() => r,
            _ => return p,
        };
        match self.net.setup(&p.id, &req).await {
            Ok(n) => p.net = Some(n),
            Err(e) => tracing::warn!(
                "warm pool of {}: the network is left to the spawn: {}",
                snap.manifest.id,
                e.message
            ),
        }
        p
    }

    /// The warm-pool size in effect for a snapshot: its own, or the
    /// daemon's default.
    pub fn pool_size_of(&self, row: &SnapshotRow) -> u32 {
        row.pool_size.unwrap_or(self.default_pool_size)
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
