//! Filesystem-only pauses, and resumes that cold-boot from a disk.
//!
//! A pause with `memory: false` (and a timeout with `on_timeout:
//! pause_filesystem`) keeps the sandbox's disk and nothing of its RAM:
//!
//! 1. the guest agent runs `sync`, so the guest's page cache reaches the
//!    virtual disk (a guest that does not answer refuses the pause: its disk
//!    would be whatever it had last written out);
//! 2. QEMU is stopped (`stop` drains and flushes every block device, so the
//!    qcow2 file is complete on the host) and its top disk file noted;
//! 3. QEMU is killed, the network torn down (settings kept, as for any
//!    pause), runtime files removed except the disk chain in the sandbox's
//!    directory. The top layer is renamed to the sandbox's `disk.qcow2` (a
//!    freeze may have left it as `disk-<layer>.qcow2`): a boot's root disk
//!    is that file, and later freezes find the node `root` there. No
//!    header names a sandbox's top layer as its backing file, so the rename
//!    breaks no chain. No snapshot is made.
//!
//! A resume then boots the image's kernel and initramfs on that disk, with
//! the same id (the hostname), metadata, environment, network and published
//! ports; the image's start command runs again, as at any cold boot. A
//! resume with `memory: false` of a sandbox paused *with* its memory does
//! the same on a new overlay of its pause snapshot's disk, leaving the
//! snapshot as it was. Either way the resumed sandbox owns its RAM from
//! then on, so its row no longer names a snapshot (a later branch or pause
//! saves its memory whole). A failed cold resume leaves it paused, disk
//! kept.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::{PauseInfo, Sandbox};
use forkvm_qemu::{migrate, Qmp};

use crate::config::SandboxPaths;
use crate::db::LifecycleRow;
use crate::error::{EngineError, ErrorKind};
use crate::images::start::BootReq;
use crate::manager::{Manager, Phase};
use crate::snapshot::qemu_err;

/// How long the guest gets to write out its page cache.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// Remove what a stopped VM leaves (its pid file included), except its disk
/// chain (the `.qcow2` files of its directory), its logs and the directory
/// itself.
pub fn remove_runtime_keep_disk(paths: &SandboxPaths) {
    let pid_file = paths.dir.join("qemu.pid");
    for p in [
        &paths.mem,
        &paths.qmp,
        &paths.agent,
        &paths.volumes_sock,
        &pid_file,
    ] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&paths.shm);
}

/// Make `top` the sandbox's `disk.qcow2` (see the module docs).
fn keep_as_root(paths: &SandboxPaths, top: &Path) -> std::io::Result<()> {
    if top != paths.disk {
        std::fs::rename(top, &paths.disk)?;
    }
    Ok(())
}

impl Manager {
    /// `pause` with `memory: false` (see the module docs).
    pub(super) async fn pause_filesystem(
        self: &Arc<Self>,
        id: &str,
        reason: &str,
    ) -> Result<Sandbox, EngineError> {
        let live = self.running(id)?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        if !crate::volumes::load_state(&live.paths).is_empty() {
            return Err(EngineError::conflict(format!(
                "sandbox {id} has volumes, which a filesystem-only pause cannot bring back at a \
                 cold boot; pause it with its memory (memory: true)"
            )));
        }
        if live.keep_stopped.swap(true, Ordering::SeqCst) {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is already being paused"
            )));
        }
        let paths = live.paths.clone();
        let stopped = async {
            let _guard = live.op_lock.try_lock().map_err(|_| {
                EngineError::conflict(format!(
                    "sandbox {id} is being snapshotted; retry when it finishes"
                ))
            })?;
            let _stream = self.disk_guard(&live).await;
            let conn = live.agent().await.map_err(|e| guest_err(id, e))?;
            conn.sync(SYNC_TIMEOUT)
                .await
                .map_err(|e| guest_err(id, e))?;
            let qmp = Qmp::connect(&paths.qmp, Duration::from_secs(10))
                .await
                .map_err(|e| qemu_err("cannot reach the sandbox's QMP socket", e))?;
            self.settle_disk(&qmp, id).await?;
            let t = Instant::now();
            qmp.execute("stop", None)
                .await
                .map_err(|e| qemu_err("cannot stop the guest", e))?;
            let top = migrate::top_disk(&qmp)
                .await
                .map_err(|e| qemu_err("cannot find the disk", e))
                .and_then(|(node, file, _)| {
                    crate::snapshot::freeze::node_file(&paths, &node, file).ok_or_else(|| {
                        EngineError::internal(format!("cannot tell which file disk node {node} is"))
                    })
                });
            match top {
                Ok(top) => Ok((top, t)),
                Err(e) => {
                    let _ = qmp.execute("cont", None).await;
                    Err(e)
                }
            }
        }
        .await;
        let (top, t) = match stopped {
            Ok(v) => v,
            Err(e) => {
                live.keep_stopped.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        if top.parent() != Some(paths.dir.as_path()) {
            live.keep_stopped.store(false, Ordering::SeqCst);
            self.cont(&paths).await;
            return Err(EngineError::internal(format!(
                "the disk of sandbox {id} is {}, outside its directory; not paused",
                top.display()
            )));
        }
        if live.set_phase(Phase::Removing) != Phase::Running {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is being removed"
            )));
        }
        self.kill_live(&live).await?;
        let pause_ms = t.elapsed().as_secs_f64() * 1000.0;
        // Read again: an egress change may have been recorded since `row`
        // (one cannot start once the pause has begun).
        let network = match self.db.get(id) {
            Ok(Some(r)) => r.network,
            _ => row.network.clone(),
        };
        self.net.teardown(id, network.as_ref()).await;
        remove_runtime_keep_disk(&paths);
        if let Err(e) = keep_as_root(&paths, &top) {
            let why = format!(
                "a filesystem-only pause could not keep its disk {}: {e}",
                top.display()
            );
            let _ = self.db.set_failed(id, &why);
            return Err(EngineError::internal(format!("sandbox {id}: {why}")));
        }
        let disk_bytes = std::fs::metadata(&paths.disk).map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.blocks() * 512
        });
        let mut l = self.db.lifecycle(id)?;
        l.remaining_ms = l
            .deadline_ms
            .map(|d| (d - super::now_ms()).max(0))
            .or(l.remaining_ms);
        l.deadline_ms = None;
        l.pause = Some(PauseInfo {
            snapshot: None,
            memory: false,
            paused_at: crate::util::now_rfc3339(),
            reason: reason.to_string(),
            memory_bytes: 0,
            disk_bytes,
            pause_ms,
        });
        l.paused_net = network;
        self.db.set_lifecycle(id, &l)?;
        self.db.set_network(id, None)?;
        self.db.set_paused(id)?;
        self.get(id)
    }

    /// Resume by booting the image on the kept disk (a filesystem-only
    /// pause) or on a new overlay of the pause snapshot's disk (a resume
    /// with `memory: false`). The caller checked that `id` is paused.
    pub(super) async fn resume_cold(
        self: &Arc<Self>,
        id: &str,
        l: &LifecycleRow,
        info: &PauseInfo,
    ) -> Result<(), EngineError> {
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        let paths = self.cfg.sandbox_paths(id);
        if let (true, Some(snap)) = (info.memory, &info.snapshot) {
            if self.open_verified(snap).await?.manifest.volumes.is_some() {
                return Err(EngineError::conflict(format!(
                    "sandbox {id} has volumes, which a cold boot cannot bring back; resume it \
                     with its memory"
                )));
            }
        }
        // A cold boot may touch all of its RAM.
        let _admitted = self.admit(
            u64::from(row.memory_mib),
            &format!("resume of sandbox {id}"),
        )?;
        let nic = self.net.available();
        let net = self.net.validate_resume(l.paused_net.as_ref(), nic)?;
        if !self.db.claim_paused(id)? {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is already being resumed"
            )));
        }
        let t0 = Instant::now();
        let boot = BootReq {
            image: row.image.clone(),
            memory_mib: row.memory_mib,
            cpus: row.cpus,
            disk_size: None,
        };
        let r = async {
            match (&info.snapshot, info.memory) {
                (Some(snap), true) => {
                    std::fs::create_dir_all(&paths.dir).map_err(|e| {
                        EngineError::internal(format!("cannot create the sandbox directory: {e}"))
                    })?;
                    let layer = self.store.dir(snap).join(forkvm_store::DISK);
                    forkvm_qemu::disk::create_overlay(&layer, &paths.disk)
                        .await
                        .map_err(|e| {
                            EngineError::internal(format!("cannot create the root disk: {e}"))
                        })?;
                }
                _ if !paths.disk.is_file() => {
                    return Err(EngineError::internal(format!(
                        "the disk a filesystem-only pause kept is missing: {}",
                        paths.disk.display()
                    )))
                }
                _ => {}
            }
            self.boot_on(id, &boot, &paths, t0, true).await?;
            self.after_boot(id, &boot).await?;
            self.connect_booted(id, &net).await?;
            self.apply_limits(id, &l.limits).await
        }
        .await;
        if let Err(e) = r {
            self.back_to_paused(id, &paths).await;
            return Err(e);
        }
        // It owns its RAM now: no snapshot's memory lies under it.
        self.db.clear_snapshot(id)?;
        Ok(())
    }
}

fn guest_err(id: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::new(
        ErrorKind::Guest,
        format!(
            "sandbox {id}: the guest did not write out its disk ({e}); a filesystem-only pause \
             needs an answering guest, so it runs on"
        ),
    )
}

/// Is `p` a layer file of a sandbox directory (for tests)?
#[cfg(test)]
fn is_layer(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "qcow2")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runtime_files_go() {
        let d = std::env::temp_dir().join(format!("forkvm-cold-{}", std::process::id()));
        let paths = crate::config::Config::for_home(&d).sandbox_paths("sb-test");
        std::fs::create_dir_all(&paths.dir).unwrap();
        std::fs::write(&paths.disk, b"q").unwrap();
        std::fs::write(paths.dir.join("disk-l1.qcow2"), b"q").unwrap();
        std::fs::write(&paths.qmp, b"").unwrap();
        std::fs::write(&paths.agent, b"").unwrap();
        std::fs::write(paths.dir.join("qemu.pid"), b"1").unwrap();
        remove_runtime_keep_disk(&paths);
        assert!(!paths.dir.join("qemu.pid").exists());
        assert!(paths.disk.exists() && is_layer(&paths.disk));
        assert!(paths.dir.join("disk-l1.qcow2").exists());
        assert!(!paths.qmp.exists() && !paths.agent.exists());
        std::fs::remove_file(&paths.disk).unwrap();
        keep_as_root(&paths, &paths.dir.join("disk-l1.qcow2")).unwrap();
        assert!(paths.disk.exists() && !paths.dir.join("disk-l1.qcow2").exists());
        keep_as_root(&paths, &paths.disk).unwrap();
        assert!(paths.disk.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
