//! Rewind: bring a running sandbox back to one of its checkpoints (or any
//! snapshot of its own, or one its lineage started from) as the same
//! sandbox.
//!
//! A rewind is a pause whose saved state is the target rather than the
//! present, followed by a resume:
//!
//! ```text
//!   [checkpoint the present]   optional: the rewind's undo
//!   check the target           lineage, machine, files verified: before anything stops
//!   park at the target         QEMU stopped, network recorded (crate::lifetime::pause)
//!   resume                     the target restored under the same id, network and ports
//! ```
//!
//! So everything a resume keeps is kept: the id, metadata, environment,
//! published ports and network identity, volumes (re-attached by their
//! rules), the timeout's remaining time and the limits. The processes,
//! memory, open connections and disk are the target's. Should the restore
//! fail, the sandbox is left paused at the target (`forkvm resume` retries)
//! and the undo checkpoint, if one was asked for, holds the present.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use forkvm_api::{ResumeRequest, RewindRequest, Rewound, SandboxState};

use crate::db::Origin;
use crate::error::{EngineError, HintAction};
use crate::manager::Manager;
use crate::util::ms;

impl Manager {
    /// `POST /v1/sandboxes/{id}/rewind`.
    pub async fn rewind(
        self: &Arc<Self>,
        id: &str,
        req: RewindRequest,
    ) -> Result<Rewound, EngineError> {
        let r = self.rewind_unlogged(id, req).await;
        match &r {
            Ok(v) => {
                tracing::info!(sandbox = %id, to = %v.to, ms = v.rewind_ms, "sandbox {id} rewound to {}", v.to)
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, code = e.code(), "rewind of sandbox {id} failed: {}", e.message)
            }
        }
        r
    }

    async fn rewind_unlogged(
        self: &Arc<Self>,
        id: &str,
        req: RewindRequest,
    ) -> Result<Rewound, EngineError> {
        let t0 = Instant::now();
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        if row.state != SandboxState::Running {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is {}; only a running sandbox rewinds (resume it first)",
                crate::db::state_str(row.state)
            )));
        }
        let target = self.snapshot_row(&req.to)?;
        self.check_rewind_target(&row, &target)?;
        // The target's files, checked before anything stops.
        let _lease = self.gc_lease(&target.id)?;
        self.open_verified(&target.id).await?;
        let undo = if req.checkpoint_first {
            Some(self.checkpoint(id, None).await?)
        } else {
            None
        };
        let live = self.running(id)?;
        // No snapshot, pause or other rewind of it meanwhile.
        let _op = live.op_lock.try_lock().map_err(|_| {
            EngineError::conflict(format!(
                "sandbox {id} is being snapshotted; rewind when that finishes"
            ))
        })?;
        if live.keep_stopped.swap(true, Ordering::SeqCst) {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is being paused or rewound"
            )));
        }
        let view = self.snapshot_view(&target)?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        self.park(&live, &row, &view, &format!("rewind to {}", target.id), 0.0)
            .await
            .inspect_err(|_| live.keep_stopped.store(false, Ordering::SeqCst))?;
        drop(_op);
        let sandbox = self
            .resume(id, ResumeRequest::default())
            .await
            .map_err(|e| {
                EngineError::new(
                    e.kind,
                    format!(
                        "sandbox {id} could not be restored at {}: {}; it is paused there \
                     (forkvm resume {id} tries again){}",
                        target.id,
                        e.message,
                        undo.as_ref()
                            .map(|u| format!(", and checkpoint {} holds what it was", u.id))
                            .unwrap_or_default()
                    ),
                )
            })?;
        // Its next checkpoint builds on what it runs from now.
        self.db.set_timeline_head(id, Some(&target.id))?;
        Ok(Rewound {
            sandbox,
            to: target.id,
            undo,
            rewind_ms: ms(t0.elapsed()),
        })
    }

    /// A sandbox rewinds to its own snapshots (checkpoints, snapshots,
    /// branch points) and to those its lineage started from, on the same
    /// machine.
    fn check_rewind_target(
        &self,
        row: &crate::db::SandboxRow,
        target: &crate::db::SnapshotRow,
    ) -> Result<(), EngineError> {
        let id = &row.id;
        if target.origin == Origin::Pause {
            return Err(EngineError::invalid(format!(
                "{} is a pause's saved state, not a point to rewind to",
                target.id
            )));
        }
        let own = target.source == *id;
        let ancestor = !own && self.ancestry(row).iter().any(|s| s.id == target.id);
        if !own && !ancestor {
            return Err(EngineError::invalid(format!(
                "snapshot {} is not of sandbox {id}'s lineage (it was taken of {}); rewind \
                 goes to the sandbox's own checkpoints and snapshots, or those it started \
                 from; spawn from it instead",
                target.id, target.source
            ))
            .hint(HintAction::ListSnapshots));
        }
        if (target.memory_mib, target.cpus) != (row.memory_mib, row.cpus) {
            return Err(EngineError::invalid(format!(
                "snapshot {} has {} MiB and {} vCPUs, sandbox {id} {} MiB and {}",
                target.id, target.memory_mib, target.cpus, row.memory_mib, row.cpus
            )));
        }
        Ok(())
    }
}
