//! Pause and resume with the same id.
//!
//! A pause is a snapshot that keeps the guest stopped, followed by the end
//! of its QEMU:
//!
//! 1. `freeze` in `diff` mode (only the pages a clone changed since its
//!    snapshot; a sandbox that owns its RAM saves it whole), with
//!    [`Live::keep_stopped`](crate::manager::Live) set so the guest is not
//!    resumed past what was saved;
//! 2. the snapshot is published (origin `pause`), and becomes the sandbox's
//!    `snapshot`, which keeps it from being removed while the sandbox exists;
//! 3. QEMU is killed, its network torn down (the ports and egress rules are
//!    kept in the lifecycle record), its runtime files removed; the row says
//!    `paused`, and the time left on its timeout is frozen.
//!
//! A resume restores that snapshot into the same id, sets the same network
//! up again (the same host ports), keeps the guest's identity and only sets
//! its clock. A failed resume leaves the sandbox paused as it was. Removing
//! a paused (or resumed) sandbox removes its pause snapshots.
//!
//! A pause with `memory: false` keeps only the disk, and its resume
//! cold-boots: see [`super::cold`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::{ResumeRequest, Sandbox, SandboxState};
use forkvm_qemu::process;

use crate::config::SandboxPaths;
use crate::db::Origin;
use crate::error::EngineError;
use crate::manager::{Manager, Phase};
use crate::snapshot::{Onto, Save};

impl Manager {
    /// `POST /v1/sandboxes/{id}/pause` (E2B's too), and a timeout with
    /// `on_timeout: pause` or `pause_filesystem`. `reason` is `request` or
    /// `timeout`; `memory: false` keeps only the disk ([`super::cold`]).
    pub async fn pause(
        self: &Arc<Self>,
        id: &str,
        reason: &str,
        memory: bool,
    ) -> Result<Sandbox, EngineError> {
        let r = if memory {
            self.pause_unlogged(id, reason).await
        } else {
            self.pause_filesystem(id, reason).await
        };
        crate::metrics::METRICS.paused(reason, r.is_ok());
        match &r {
            Ok(s) if memory => {
                tracing::info!(sandbox = %id, reason, "sandbox {id} paused ({} bytes of memory saved)",
                s.paused.as_ref().map_or(0, |p| p.memory_bytes))
            }
            Ok(_) => {
                tracing::info!(sandbox = %id, reason, "sandbox {id} paused, disk only")
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, code = e.code(), "pause of sandbox {id} failed: {}", e.message)
            }
        }
        r
    }

    async fn pause_unlogged(
        self: &Arc<Self>,
        id: &str,
        reason: &str,
    ) -> Result<Sandbox, EngineError> {
        let live = self.running(id)?;
        // A pause writes the guest's memory into the home.
        self.check_disk(&format!("pause of sandbox {id}"))?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        if live.keep_stopped.swap(true, Ordering::SeqCst) {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is already being paused"
            )));
        }
        let mut frozen = match self
            .freeze(id, None, None, Some(0), Save::Diff, Onto::Origin)
            .await
        {
            Ok(f) => f,
            Err(e) => {
                // freeze resumed the guest: it runs on as before.
                live.keep_stopped.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        frozen.srow.origin = Origin::Pause;
        let pause_ms = frozen.timings.pause_ms;
        let snap = match self.publish_frozen(frozen).await {
            Ok(s) => s,
            Err(e) => {
                // Nothing was saved: the guest carries on where it stopped.
                live.keep_stopped.store(false, Ordering::SeqCst);
                self.cont(&live.paths).await;
                return Err(e);
            }
        };
        self.park(&live, &row, &snap, reason, pause_ms).await
    }

    /// Stop sandbox `id`'s QEMU and leave it paused at `snap`: its
    /// network torn down but recorded for the resume, its timeout's
    /// remaining time kept. A pause parks it at the snapshot it just took;
    /// a rewind (crate::checkpoint::rewind) at the checkpoint it goes to.
    pub async fn park(
        &self,
        live: &crate::manager::Live,
        row: &crate::db::SandboxRow,
        snap: &forkvm_api::Snapshot,
        reason: &str,
        pause_ms: f64,
    ) -> Result<Sandbox, EngineError> {
        let id = row.id.as_str();
        if live.set_phase(Phase::Removing) != Phase::Running {
            // A removal got there first; it takes the sandbox, and this
            // snapshot goes with it (its source is this sandbox).
            return Err(EngineError::conflict(format!(
                "sandbox {id} is being removed"
            )));
        }
        self.kill_live(live).await?;
        // Read again: an egress change may have been recorded since `row`
        // (one cannot start once the pause has begun).
        let network = match self.db.get(id) {
            Ok(Some(r)) => r.network,
            _ => row.network.clone(),
        };
        self.net.teardown(id, network.as_ref()).await;
        live.paths.remove_all();
        let mut l = self.db.lifecycle(id)?;
        l.remaining_ms = l
            .deadline_ms
            .map(|d| (d - super::now_ms()).max(0))
            .or(l.remaining_ms);
        l.deadline_ms = None;
        let sizes = &snap.sizes;
        l.pause = Some(forkvm_api::PauseInfo {
            snapshot: Some(snap.id.clone()),
            memory: true,
            paused_at: crate::util::now_rfc3339(),
            reason: reason.to_string(),
            memory_bytes: match snap.kind.as_str() {
                "diff" => sizes.memory_diff_bytes,
                "shared" => sizes.memory_allocated_bytes,
                // `stream`: the RAM travels inside the device state.
                _ => sizes.device_state_bytes,
            },
            disk_bytes: sizes.disk_bytes,
            pause_ms,
        });
        l.paused_net = network;
        self.db.set_lifecycle(id, &l)?;
        self.db.set_network(id, None)?;
        self.db.set_snapshot(id, &snap.id)?;
        self.db.set_paused(id)?;
        self.get(id)
    }

    /// Resume a guest a failed pause left stopped.
    pub(super) async fn cont(&self, paths: &SandboxPaths) {
        match forkvm_qemu::Qmp::connect(&paths.qmp, Duration::from_secs(5)).await {
            Ok(q) => {
                if let Err(e) = q.execute("cont", None).await {
                    tracing::error!("cannot resume a guest after a failed pause: {e}");
                }
            }
            Err(e) => tracing::error!("cannot resume a guest after a failed pause: {e}"),
        }
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub async fn resume(
        self: &Arc<Self>,
        id: &str,
        req: ResumeRequest,
    ) -> Result<Sandbox, EngineError> {
        let r = self.resume_unlogged(id, req).await;
        crate::metrics::METRICS.resumed(r.is_ok());
        match &r {
            Ok(_) => tracing::info!(sandbox = %id, "sandbox {id} resumed"),
            Err(e) => {
                tracing::warn!(sandbox = %id, code = e.code(), "resume of sandbox {id} failed: {}", e.message)
            }
        }
        r
    }

    async fn resume_unlogged(
        self: &Arc<Self>,
        id: &str,
        req: ResumeRequest,
    ) -> Result<Sandbox, EngineError> {
        if let Some(t) = req.timeout {
            super::check_timeout(t)?;
        }
        let row = self.get(id)?;
        if row.state != SandboxState::Paused {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is {}, not paused",
                crate::db::state_str(row.state)
            )));
        }
        let l = self.db.lifecycle(id)?;
        let info = l.pause.clone().ok_or_else(|| {
            EngineError::internal(format!(
                "sandbox {id} is paused but has no saved state on record"
            ))
        })?;
        let snapshot = match (&info.snapshot, info.memory && req.memory != Some(false)) {
            (Some(s), true) => s.clone(),
            _ => {
                self.resume_cold(id, &l, &info).await?;
                return self.resumed(id, &req, l);
            }
        };
        let v = self.snapshot_by_ref(&snapshot)?;
        let _admitted = self.admit(
            crate::admission::clone_estimate_mib(&v.sizes, &v.kind),
            &format!("resume of sandbox {id}"),
        )?;
        let snap = self.open_verified(&snapshot).await?;
        let nic = snap.manifest.machine.nic.is_some();
        let net = self.net.validate_resume(l.paused_net.as_ref(), nic)?;
        // `starting` claims it: a second resume, a removal or the sweeper
        // leave it alone until this one ends.
        if !self.db.claim_paused(id)? {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is already being resumed"
            )));
        }
        let t0 = Instant::now();
        let r = async {
            let p = self.prepare_restore(&snap, id).await?;
            self.finish_restore(p, &snap, false, t0, &net, false).await
        }
        .await;
        // Limits live in QEMU and the namespace, which are new.
        let r = match r {
            Ok(_) => self.apply_limits(id, &l.limits).await,
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            self.back_to_paused(id, &self.cfg.sandbox_paths(id)).await;
            return Err(e);
        }
        self.resumed(id, &req, l)
    }

    /// The lifecycle of a sandbox that just resumed: its deadline again,
    /// no pause on record.
    fn resumed(
        &self,
        id: &str,
        req: &ResumeRequest,
        mut l: crate::db::LifecycleRow,
    ) -> Result<Sandbox, EngineError> {
        let now = super::now_ms();
        l.deadline_ms = match (req.timeout, l.timeout_s, l.remaining_ms) {
            (Some(t), _, _) => Some(now + t as i64 * 1000),
            (None, None, _) => None,
            // Paused by its timeout: it gets the whole timeout again.
            (None, Some(t), Some(0) | None) => Some(now + t as i64 * 1000),
            (None, Some(_), Some(r)) => Some(now + r),
        };
        if let Some(t) = req.timeout {
            l.timeout_s = Some(t);
        }
        l.remaining_ms = None;
        l.pause = None;
        l.paused_net = None;
        self.db.set_lifecycle(id, &l)?;
        self.get(id)
    }

    /// Undo a resume that did not finish: no QEMU, no network, no runtime
    /// files; the row `paused` again with its saved state (for a
    /// filesystem-only pause, the disk in the sandbox's directory).
    pub async fn back_to_paused(&self, id: &str, paths: &SandboxPaths) {
        let live = self.live_map().remove(id);
        if let Some(live) = live {
            live.set_phase(Phase::Removing);
            process::kill(live.pid, libc::SIGKILL);
            live.wait_exit(Duration::from_secs(10)).await;
        }
        let net = self.db.get(id).ok().flatten().and_then(|r| r.network);
        self.net.teardown(id, net.as_ref()).await;
        let disk_only = self
            .db
            .lifecycle(id)
            .is_ok_and(|l| l.pause.is_some_and(|p| !p.memory));
        if disk_only {
            super::cold::remove_runtime_keep_disk(paths);
        } else {
            paths.remove_all();
        }
        let _ = self.db.set_network(id, None);
        if let Err(e) = self.db.set_paused(id) {
            tracing::error!(sandbox = %id, "cannot mark sandbox {id} paused again: {e}");
        }
    }

    /// Is this `starting` row a resume (it has a saved state)?
    pub fn resuming(&self, id: &str) -> bool {
        self.db.lifecycle(id).is_ok_and(|l| l.pause.is_some())
    }
}
