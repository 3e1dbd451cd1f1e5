//! Recovery at start: what a daemon finds of its previous run (sandboxes
//! whose QEMU still runs or is gone, half-made snapshots, volumes, paused
//! sandboxes, stray processes and files) is adopted, put back to rest or
//! removed, before the first request is served. It sits above every other
//! service, since it may need any of them, and nothing calls it but the
//! daemon's start.

use std::sync::Arc;
use std::time::Duration;

use forkvm_api::SandboxState;
use forkvm_qemu::process;

use crate::cleanup::qemus_of_home;
use crate::config::SandboxPaths;
use crate::db::SandboxRow;
use crate::error::EngineError;
use crate::manager::{Manager, Phase, Waiter};

impl Manager {
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

impl Manager {
    /// Kill every QEMU of this home that no `running` record holds (run at
    /// start, after re-attaching and before serving). Returns the ids.
    pub async fn reap_strays(self: &Arc<Self>) -> Vec<String> {
        let mut killed = Vec::new();
        for (id, q) in qemus_of_home(&self.cfg.sandboxes_dir()).await {
            let pid = q.pid;
            let row = self.db.get(&id).ok().flatten();
            let held = row
                .as_ref()
                .is_some_and(|r| r.state == SandboxState::Running && r.pid == Some(pid));
            if held && self.live(&id).is_some_and(|l| l.qemu == q) {
                continue;
            }
            let state = row
                .as_ref()
                .map(|r| format!("its record is {:?}", r.state).to_lowercase())
                .unwrap_or_else(|| "it has no record".into());
            tracing::warn!(
                sandbox = %id,
                "found QEMU pid {pid} of sandbox {id} running unmanaged ({state}); killing it"
            );
            process::kill(pid, libc::SIGKILL);
            if tokio::time::timeout(Duration::from_secs(15), process::wait_foreign_exit(&q, &id))
                .await
                .is_err()
            {
                tracing::error!(sandbox = %id, "QEMU pid {pid} of sandbox {id} did not exit after SIGKILL");
                continue;
            }
            self.jail.release(&id);
            killed.push(id);
        }
        killed
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
