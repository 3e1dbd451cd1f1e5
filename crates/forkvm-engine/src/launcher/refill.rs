//! Refilling warm pools: clones of a snapshot prepared ahead (QEMU started
//! with `-incoming`, device state loaded) so that a spawn only resumes one.

use std::sync::Arc;

use forkvm_store::Snapshot as StoredSnapshot;

use crate::manager::{Manager, Prepared};

impl Manager {
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
}
