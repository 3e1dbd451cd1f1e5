//! The sandboxes of this daemon after their spawn (see [`crate::spawn`]):
//! their views and rows, the monitor that notices a QEMU exit, and the
//! lookup of a running one. Removal is [`crate::teardown`]; re-attaching
//! after a daemon restart is [`crate::recovery`].
//!
//! ```text
//!  POST /v1/sandboxes
//!      │ validate (image, limits)        → 4xx, nothing created
//!      ▼
//!  starting ── QEMU exits / boot timeout ──▶ error; row and files removed
//!      │ agent answers ping
//!      ▼
//!  running ─── QEMU exits (panic, kill) ──▶ failed (reason kept, runtime files removed)
//!      │ DELETE                                   │ DELETE
//!      ▼                                          ▼
//!   removed (process killed, files and row gone)
//! ```
//!
//! Each live sandbox has a monitor task that owns the wait for its QEMU. Any
//! exit the daemon did not ask for turns the sandbox into `failed` with a
//! reason read from the exit status and the serial console.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkvm_api::{Sandbox, SandboxState};
use forkvm_qemu::process;
use tokio::sync::watch;

use crate::config::SandboxPaths;
use crate::db::SandboxRow;
use crate::error::{EngineError, HintAction};
use crate::failure::{describe_status, failure_reason};
use crate::manager::{Live, Manager, Phase, Waiter};
use crate::util;

impl Manager {
    /// The API view of a row (with memory figures when asked and running).
    pub fn view(&self, r: SandboxRow, with_memory: bool) -> Sandbox {
        let memory = match (with_memory, r.state, r.pid) {
            (true, SandboxState::Running, Some(pid)) => util::memory_usage(pid),
            _ => None,
        };
        let disk = match (with_memory, r.state) {
            (true, SandboxState::Running) => self.disk_chain(&r.id),
            _ => None,
        };
        let usage = match (with_memory, r.state, r.pid) {
            (true, SandboxState::Running, Some(pid)) => crate::usage::usage(
                pid,
                &self.cfg.sandbox_paths(&r.id).dir,
                r.network.as_ref().map(|_| forkvm_net::TAP_NAME),
            ),
            _ => None,
        };
        let life = self.db.lifecycle(&r.id).unwrap_or_else(|e| {
            tracing::error!(sandbox = %r.id, "cannot read the lifecycle of {}: {e}", r.id);
            Default::default()
        });
        Sandbox {
            suspended: self.suspended(&r.id),
            volumes: crate::volumes::view(&self.cfg.sandbox_paths(&r.id)),
            lifetime: crate::lifetime::lifetime_view(&life),
            metadata: life.metadata,
            env: life.env,
            paused: life.pause,
            limits: (!life.limits.is_empty()).then_some(life.limits),
            usage,
            disk,
            id: r.id,
            state: r.state,
            image: r.image,
            memory_mib: r.memory_mib,
            cpus: r.cpus,
            accel: r.accel,
            pid: r.pid,
            created_at: r.created_at,
            failure: r.failure,
            timings: r.timings,
            memory,
            snapshot: r.snapshot,
            network: r.network.as_ref().map(crate::net::SandboxNet::info),
        }
    }

    /// The stored row of a sandbox, or 404 (also for ids we could never
    /// have made, before they reach a path).
    pub fn row(&self, id: &str) -> Result<SandboxRow, EngineError> {
        if !util::valid_id(id) {
            return Err(EngineError::sandbox_not_found(id));
        }
        self.db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))
    }

    pub fn get(&self, id: &str) -> Result<Sandbox, EngineError> {
        Ok(self.view(self.row(id)?, true))
    }

    /// Every sandbox with all the given metadata pairs.
    pub fn list(
        &self,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<Sandbox>, EngineError> {
        Ok(self
            .db
            .list()?
            .into_iter()
            .map(|r| self.view(r, false))
            .filter(|s| crate::lifetime::matches(&s.metadata, metadata))
            .collect())
    }

    /// Register a live sandbox and start its monitor.
    pub fn attach(
        self: &Arc<Self>,
        id: &str,
        qemu: process::QemuId,
        paths: SandboxPaths,
        phase: Phase,
        waiter: Waiter,
        machine: forkvm_qemu::MachineConfig,
    ) -> Arc<Live> {
        let (tx, rx) = watch::channel(None);
        let live = Arc::new(Live {
            id: id.to_string(),
            pid: qemu.pid,
            qemu,
            phase: Mutex::new(phase),
            agent: tokio::sync::Mutex::new(None),
            exited: rx,
            paths,
            op_lock: tokio::sync::Mutex::new(()),
            machine,
            streaming: std::sync::atomic::AtomicBool::new(false),
            stream_lock: tokio::sync::Mutex::new(()),
            keep_stopped: std::sync::atomic::AtomicBool::new(false),
            tracked_since: Mutex::new(None),
        });
        self.live_map().insert(id.to_string(), live.clone());
        let me = self.clone();
        let l2 = live.clone();
        tokio::spawn(async move {
            let status = match waiter {
                Waiter::Child(mut c) => match c.wait().await {
                    Ok(s) => describe_status(s),
                    Err(e) => {
                        // Not knowing is not an exit (crate::cleanup): watch
                        // it as a foreign process until it is certainly gone.
                        tracing::warn!(
                            sandbox = %l2.id,
                            "cannot wait for QEMU (pid {}) of {}: {e}; watching it instead",
                            l2.pid,
                            l2.id
                        );
                        process::wait_foreign_exit(&l2.qemu, &l2.id).await;
                        let _ = c.try_wait();
                        "QEMU exited (its exit status could not be read)".to_string()
                    }
                },
                Waiter::Foreign => {
                    process::wait_foreign_exit(&l2.qemu, &l2.id).await;
                    "QEMU exited (started by an earlier daemon, so its exit status is unknown)"
                        .to_string()
                }
            };
            me.jail.release(&l2.id);
            let reason = failure_reason(&status, &l2.paths);
            let _ = tx.send(Some(reason.clone()));
            if me.on_exit(&l2, &reason) {
                // A failed sandbox keeps its record, not its network.
                let net = me.db.get(&l2.id).ok().flatten().and_then(|r| r.network);
                me.net.teardown(&l2.id, net.as_ref()).await;
                let _ = me.db.set_network(&l2.id, None);
                let _ = me.keep_if_left(&l2.id, crate::cleanup::Pending::Teardown, &reason);
            }
        });
        live
    }

    /// QEMU exited. If nobody asked for that, the sandbox has failed (and
    /// `true` is returned).
    pub fn on_exit(&self, live: &Live, reason: &str) -> bool {
        if live.phase() != Phase::Running {
            return false; // a removal or a failing spawn handles its own cleanup
        }
        tracing::warn!("sandbox {} failed: {reason}", live.id);
        if let Err(e) = self.db.set_failed(&live.id, reason) {
            tracing::error!("cannot record failure of {}: {e}", live.id);
        }
        live.paths.remove_runtime();
        self.live_map().remove(&live.id);
        true
    }

    /// End a sandbox's QEMU (its phase already `Removing`) and forget it.
    pub async fn kill_live(&self, live: &Live) -> Result<(), EngineError> {
        process::kill(live.pid, libc::SIGKILL);
        if !live.wait_exit(Duration::from_secs(15)).await {
            return Err(EngineError::internal(format!(
                "QEMU (pid {}) of sandbox {} did not exit after SIGKILL",
                live.pid, live.id
            )));
        }
        self.live_map().remove(&live.id);
        Ok(())
    }

    /// `PUT /v1/sandboxes/{id}/network` (and E2B's): replace a running
    /// `nat` sandbox's egress allow-list in place, without a restart, and
    /// record it, so that `GET`, a daemon restart, a pause and resume, and
    /// branches and snapshots of it have the new list. Established
    /// connections are kept (see [`crate::net::Net::change`]).
    pub async fn set_network(
        &self,
        id: &str,
        egress: Option<Vec<forkvm_api::EgressRule>>,
        allow_host: Option<bool>,
    ) -> Result<forkvm_api::NetworkInfo, EngineError> {
        let r = self.set_network_unlogged(id, egress, allow_host).await;
        match &r {
            Ok(n) => tracing::info!(sandbox = %id,
                "egress of sandbox {id} changed to {} (allow_host {})",
                n.egress.as_ref().map_or("any".to_string(), |l| format!("{} entries", l.len())),
                n.allow_host),
            Err(e) => tracing::warn!(sandbox = %id, code = e.code(),
                "egress change of sandbox {id} refused or failed: {}", e.message),
        }
        r
    }

    async fn set_network_unlogged(
        &self,
        id: &str,
        egress: Option<Vec<forkvm_api::EgressRule>>,
        allow_host: Option<bool>,
    ) -> Result<forkvm_api::NetworkInfo, EngineError> {
        crate::net::check_egress(egress.as_deref())?;
        let allow_host = crate::net::check_allow_host(egress.as_deref(), allow_host)?;
        let live = self.running(id)?;
        // Not while a snapshot, branch or pause is saving it: they read the
        // record's network as it stands.
        let _guard = live.op_lock.try_lock().map_err(|_| {
            EngineError::conflict(format!(
                "sandbox {id} is being snapshotted; retry when it finishes"
            ))
        })?;
        if live.keep_stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is being paused"
            )));
        }
        let old = match self.row(id)?.network {
            Some(n) if n.mode == forkvm_api::NetworkMode::Nat && n.slot.is_some() => n,
            _ => {
                return Err(EngineError::invalid(format!(
                    "sandbox {id} has no network (network: none), so it has no egress to change; spawn it with network: nat"
                )))
            }
        };
        let new = self.net.change(id, &old, egress, allow_host).await?;
        if let Err(e) = self.db.set_network(id, Some(&new)) {
            // Put the rules back as the record says, so that they agree.
            if let Err(back) = self
                .net
                .change(id, &new, old.egress.clone(), old.allow_host)
                .await
            {
                tracing::error!(sandbox = %id, "cannot put back the old egress rules of sandbox {id}: {}", back.message);
            }
            return Err(e.into());
        }
        Ok(new.info())
    }

    /// A running sandbox, or a clear error.
    pub fn running(&self, id: &str) -> Result<Arc<Live>, EngineError> {
        let row = self.get(id)?;
        match row.state {
            SandboxState::Running if row.suspended.is_some() => {
                Err(self.suspended_error(id, row.suspended.as_deref().unwrap_or_default()))
            }
            SandboxState::Running => self.live(id).ok_or_else(|| {
                EngineError::conflict(format!("sandbox {id} is not attached to this daemon"))
            }),
            SandboxState::Starting => Err(EngineError::conflict(format!(
                "sandbox {id} is still starting"
            ))),
            SandboxState::Failed => Err(EngineError::conflict(format!(
                "sandbox {id} has failed ({})",
                row.failure.unwrap_or_default()
            ))
            .hint_on(HintAction::RemoveSandbox, id)),
            SandboxState::Paused => Err(EngineError::conflict(format!("sandbox {id} is paused"))
                .hint_on(HintAction::ResumeSandbox, id)),
            SandboxState::Lost => Err(EngineError::conflict(format!("sandbox {id} is lost"))
                .hint_on(HintAction::RemoveSandbox, id)),
        }
    }
}
