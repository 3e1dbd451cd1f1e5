//! Removing every sandbox at once: what a daemon whose life is bound to a
//! test run (`forkvm serve --ephemeral`) does at its end, so that nothing
//! outlives the run. Each removal is the one a client's `DELETE` makes.

pub mod snapshots;

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::SandboxState;
use forkvm_qemu::process;

use crate::cleanup::{leftover, marked, unmark, Pending};
use crate::db::Origin;
use crate::error::EngineError;
use crate::manager::{Manager, Phase, Prepared};

/// How long a teardown waits for spawns and branches still in flight (a
/// sandbox being made cannot be removed until its spawn returns).
const TEARDOWN_WAIT: Duration = Duration::from_secs(120);

impl Manager {
    /// Remove every sandbox of this daemon. A removal refused because the
    /// sandbox is still starting is retried until [`TEARDOWN_WAIT`]; after
    /// that any QEMU still attached is killed (when it is still that QEMU),
    /// so none outlives the daemon. Returns what could not be removed.
    pub async fn remove_all(self: &Arc<Self>) -> Vec<String> {
        let mgr = self;
        let t = Instant::now();
        let mut last = Vec::new();
        loop {
            let rows = match mgr.db.list() {
                Ok(r) => r,
                Err(e) => return vec![format!("cannot list the sandboxes: {e}")],
            };
            if rows.is_empty() {
                return Vec::new();
            }
            last.clear();
            for r in rows {
                if let Err(e) = mgr.remove(&r.id).await {
                    last.push(format!("{}: {e}", r.id));
                }
            }
            if last.is_empty() {
                continue; // removals may have added nothing; list again to be sure
            }
            if t.elapsed() > TEARDOWN_WAIT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let live: Vec<_> = mgr.live_map().values().cloned().collect();
        for l in live {
            tracing::warn!(sandbox = %l.id, "teardown: killing QEMU (pid {}) of {}", l.pid, l.id);
            if forkvm_qemu::process::is_our_qemu(&l.qemu) {
                forkvm_qemu::process::kill(l.pid, libc::SIGKILL);
            }
        }
        last
    }
}

impl Manager {
    /// Remove a sandbox: kill its VM and delete its files and record.
    pub async fn remove(self: &Arc<Self>, id: &str) -> Result<(), EngineError> {
        let row = self.row(id)?;
        if let Some(live) = self.live(id) {
            match live.set_phase(Phase::Removing) {
                Phase::Booting => {
                    live.set_phase(Phase::Booting);
                    return Err(EngineError::conflict(format!(
                        "sandbox {id} is still starting; remove it once the spawn returns"
                    )));
                }
                Phase::Removing => {
                    return Err(EngineError::conflict(format!(
                        "sandbox {id} is already being removed"
                    )))
                }
                Phase::Running => {}
            }
            self.kill_live(&live).await?;
        } else if row.state == SandboxState::Starting {
            // Its spawn is still preparing (no QEMU attached yet): removing
            // its files now would fail that spawn halfway. (Rows left
            // `starting` by a dead daemon are swept at start, so this spawn
            // is one of ours and will finish.)
            return Err(EngineError::conflict(format!(
                "sandbox {id} is still starting; remove it once the spawn returns"
            )));
        } else if let (SandboxState::Running | SandboxState::Starting, (Some(q), _)) =
            (row.state, self.db.launched(id)?)
        {
            // Not attached (should not happen after recovery), but never leave
            // a VM behind.
            if process::is_our_qemu(&q) {
                process::kill(q.pid, libc::SIGKILL);
            }
        }
        self.net.teardown(id, row.network.as_ref()).await;
        if row.network.is_some() {
            let _ = self.db.set_network(id, None);
        }
        // Forget the sandbox only when nothing of it is left (crate::cleanup).
        if let Some(e) = self.keep_if_left(id, crate::cleanup::Pending::Remove, "") {
            return Err(e);
        }
        self.detach_volumes(id);
        self.cfg.sandbox_paths(id).remove_all();
        self.cfg.sandbox_paths(id).remove_volumes();
        self.db.delete(id)?;
        // The saved states of its pauses go with it.
        self.drop_pause_snapshots(id).await;
        // A child of a paused sandbox ran from its pause snapshot, which
        // stays while any child does: the last one out after the source
        // takes it along (crate::branch::paused).
        if let Some(p) = row
            .snapshot
            .as_deref()
            .and_then(|s| self.db.snapshot(s).ok().flatten())
        {
            if p.origin == Origin::Pause
                && p.source != id
                && matches!(self.db.get(&p.source), Ok(None))
            {
                self.drop_pause_snapshots(&p.source).await;
            }
        }
        // Its disk files may have been the last to name a removed snapshot's
        // layer.
        self.collect_layers().await;
        // And it may have been the last user of a branch point.
        self.poke_gc();
        Ok(())
    }
}

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
}

impl Manager {
    /// Retry the cleanups left pending (see the module doc).
    pub async fn retry_cleanups(self: &Arc<Self>) {
        let Ok(rd) = std::fs::read_dir(self.cfg.sandboxes_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(id) = e.file_name().into_string() else {
                continue;
            };
            let Some(what) = marked(&e.path()) else {
                continue;
            };
            let Ok(Some(row)) = self.db.get(&id) else {
                unmark(&e.path());
                continue;
            };
            if row.state != SandboxState::Failed || self.live(&id).is_some() {
                continue;
            }
            self.net.teardown(&id, None).await;
            if let Some(left) = leftover(&id) {
                tracing::debug!(sandbox = %id, "cleanup of {id} still incomplete: {left}");
                continue;
            }
            unmark(&e.path());
            match what {
                Pending::Teardown => {
                    let _ = self.db.set_failed(
                        &id,
                        row.failure
                            .as_deref()
                            .and_then(|f| f.split(" (cleanup incomplete").next())
                            .unwrap_or("failed"),
                    );
                    tracing::info!(sandbox = %id, "cleanup of failed sandbox {id} finished");
                }
                Pending::Remove => match self.remove(&id).await {
                    Ok(()) => tracing::info!(sandbox = %id, "removal of {id} finished"),
                    Err(err) => tracing::warn!(
                        sandbox = %id,
                        "removal of {id} still incomplete: {}",
                        err.message
                    ),
                },
            }
        }
    }
}
