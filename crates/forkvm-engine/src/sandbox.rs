//! The sandbox lifecycle after its spawn (see [`crate::spawn`]): views,
//! the monitor, remove, and re-attach after a daemon restart.
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
        // Its disk files may have been the last to name a removed snapshot's
        // layer.
        self.collect_layers().await;
        // And it may have been the last user of a branch point.
        self.poke_gc();
        Ok(())
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

    /// Re-attach to the sandboxes of an earlier daemon (run once at start).
    pub async fn recover(self: &Arc<Self>) -> Result<(), EngineError> {
        for row in self.db.list()? {
            let paths = self.cfg.sandbox_paths(&row.id);
            let (qemu, machine) = self.db.launched(&row.id)?;
            let qemu = match (qemu, row.pid) {
                (Some(q), _) => Some(q),
                // A row from before the identity was recorded.
                (None, Some(pid)) => legacy_qemu(pid, &paths).await,
                (None, None) => None,
            };
            // A check that fails (rather than finding the process gone)
            // counts as alive: the monitor attached below waits until it
            // is certainly gone (forkvm_qemu::process::liveness).
            let alive = qemu
                .as_ref()
                .is_some_and(|q| !matches!(process::liveness(q), process::Liveness::Gone));
            match (row.state, qemu) {
                (SandboxState::Running, Some(q)) if alive => {
                    tracing::info!("re-attached to sandbox {} (pid {})", row.id, q.pid);
                    // A daemon that died in the middle of a snapshot left the
                    // source stopped: resume it.
                    let qmp = forkvm_qemu::Qmp::connect(&paths.qmp, Duration::from_secs(5))
                        .await
                        .ok();
                    if let Some(qmp) = &qmp {
                        if let Ok(st) = qmp.status().await {
                            if st == "paused" || st == "postmigrate" || st == "io-error" {
                                tracing::warn!(
                                    "sandbox {} was left {st} by a crash; resuming it",
                                    row.id
                                );
                                let _ = qmp.execute("cont", None).await;
                            }
                        }
                    }
                    let machine = match machine {
                        Some(m) => Ok(m),
                        // A row from before the machine was recorded: asked
                        // once, and stored with the identity.
                        None => legacy_machine(&row, qmp.as_deref()).await.and_then(|m| {
                            self.db
                                .set_launched(&row.id, &q, &m)
                                .map(|_| m)
                                .map_err(|e| e.to_string())
                        }),
                    };
                    let machine = match machine {
                        Ok(m) => m,
                        Err(e) => {
                            // Not knowing its machine, the daemon could not
                            // snapshot, branch or network it correctly.
                            let reason = format!(
                                "re-attaching after a daemon restart failed: {e}; its QEMU was stopped"
                            );
                            tracing::error!(sandbox = %row.id, "sandbox {}: {reason}", row.id);
                            process::kill(q.pid, libc::SIGKILL);
                            process::wait_foreign_exit(&q, &row.id).await;
                            self.db.set_failed(&row.id, &reason)?;
                            self.db.set_network(&row.id, None)?;
                            paths.remove_runtime();
                            self.jail.release(&row.id);
                            continue;
                        }
                    };
                    drop(qmp);
                    self.attach(&row.id, q, paths, Phase::Running, Waiter::Foreign, machine);
                    self.recover_volumes(&row.id).await;
                }
                (SandboxState::Starting, q) if self.resuming(&row.id) => {
                    // A resume died with the old daemon: the sandbox is
                    // still paused, its saved state untouched.
                    if let Some(q) = q.filter(|_| alive) {
                        process::kill(q.pid, libc::SIGKILL);
                    }
                    self.back_to_paused(&row.id, &paths).await;
                }
                (SandboxState::Starting, q) => {
                    // The spawn request died with the old daemon; its caller
                    // never got an id, so nobody can use this sandbox.
                    if let Some(q) = q.filter(|_| alive) {
                        process::kill(q.pid, libc::SIGKILL);
                        process::wait_foreign_exit(&q, &row.id).await;
                    }
                    self.jail.release(&row.id);
                    paths.remove_all();
                    paths.remove_volumes();
                    self.db.delete(&row.id)?;
                }
                (SandboxState::Running, _) => {
                    let reason = "QEMU exited while the daemon was not running";
                    self.db.set_failed(&row.id, reason)?;
                    // Its namespace and pool claim go in `reconcile` below.
                    self.db.set_network(&row.id, None)?;
                    paths.remove_runtime();
                    self.jail.release(&row.id);
                }
                // A daemon never stores `lost` (only a cluster gateway says it).
                (SandboxState::Failed | SandboxState::Lost, _) => paths.remove_runtime(),
                (SandboxState::Paused, _) => {}
            }
        }
        self.reap_orphans().await;
        // QEMUs of this home that no running record holds (crate::cleanup).
        self.reap_strays().await;
        // Cleanups left pending by the last daemon: retried now, before
        // the namespaces are reconciled.
        self.retry_cleanups().await;
        // Cgroups of QEMUs that ended while no daemon watched them.
        self.jail.sweep();
        let running: Vec<(String, Option<crate::net::SandboxNet>)> = self
            .db
            .list()?
            .into_iter()
            .filter(|r| r.state == SandboxState::Running)
            .map(|r| (r.id, r.network))
            .collect();
        self.net.reconcile(&running).await;
        Ok(())
    }
}

/// The QEMU of a row written before QEMU identities were recorded: the
/// process serving the sandbox's QMP socket, if that is the row's pid
/// (see forkvm_qemu::legacy). `None`: no QEMU of it runs. Its pid file gets
/// the identity too, so later starts need not ask again.
async fn legacy_qemu(pid: u32, paths: &SandboxPaths) -> Option<process::QemuId> {
    let peer = process::qmp_peer_pid(&paths.qmp, Duration::from_secs(2))
        .await
        .ok()?;
    let q = (peer == pid).then(|| process::QemuId::of(pid).ok())??;
    let tmp = paths.dir.join("qemu.pid.tmp");
    if std::fs::write(&tmp, q.to_file()).is_ok() {
        let _ = std::fs::rename(&tmp, paths.dir.join("qemu.pid"));
    }
    Some(q)
}

/// The machine of a row written before machines were recorded, asked of
/// its QEMU (forkvm_qemu::legacy); stored by the caller, so asked once.
async fn legacy_machine(
    row: &SandboxRow,
    qmp: Option<&forkvm_qemu::Qmp>,
) -> Result<forkvm_qemu::MachineConfig, String> {
    let qmp = qmp.ok_or("its QMP socket did not answer")?;
    let facts = forkvm_qemu::legacy::RowFacts {
        memory_mib: row.memory_mib,
        cpus: row.cpus,
        accel: row.accel.parse()?,
    };
    forkvm_qemu::legacy::ask_machine(qmp, &facts).await
}
