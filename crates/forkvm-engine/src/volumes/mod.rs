//! Volumes: host directories and named volumes in sandboxes
//! (docs/volumes.md).
//!
//! The guest mounts each volume with FUSE; its agent relays the raw FUSE
//! requests over the machine's volume port, and the daemon serves them
//! against the host directory ([`forkvm_volume`]). A jailed QEMU never sees
//! a volume's files: only the daemon opens them.
//!
//! What survives what:
//!
//! * **snapshot / branch**: before the source stops, its volumes are
//!   quiesced (the guest's relay holds new requests until every forwarded
//!   one is answered), so the guest memory and the host directories agree
//!   at the instant saved. The node journals are saved into the snapshot,
//!   and a `copy` volume's tree is copied into it (reflinked where the
//!   filesystem can) while the guest runs again but its volume I/O still
//!   waits; then the source's volumes resume.
//! * **a clone** (branch child, spawn from a snapshot): a new server loads
//!   the snapshot's journals, so the guest's node ids and open files keep
//!   working; a `copy` volume gets its own copy of the snapshot's tree, a
//!   `shared` one serves the same host directory.
//! * **a daemon restart**: the journals are on disk (`volume-data/<id>/`);
//!   the new daemon reconnects and serves on.
//! * **pause / resume**: the resumed sandbox serves its own directories again.
//!
//! Per-sandbox state is `volume-data/<id>/state.json` ([`VolState`]); the
//! journal of volume `i` is `volume-data/<id>/<i>.journal`; a private copy
//! is `volume-data/<id>/<i>/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use forkvm_api::{MountedVolume, VolumeMode, VolumeMount};
use forkvm_store::SnapVolume;
use forkvm_volume::{ServerHandle, VolumeConfig};
use serde::{Deserialize, Serialize};

use crate::config::SandboxPaths;
use crate::error::{EngineError, ErrorKind, HintAction};
use crate::manager::Manager;

pub mod named;
pub mod servers;

/// How long a guest may take to answer a quiesce before a snapshot fails.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most volumes one sandbox may have.
pub const MAX_VOLUMES: usize = 16;

/// One volume of a sandbox, as stored in `state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolState {
    pub index: u8,
    pub mount: VolumeMount,
    /// The directory served.
    pub host_path: PathBuf,
}

/// A volume request resolved to its host directory.
#[derive(Debug, Clone)]
pub struct Resolved(Vec<VolState>);

fn state_file(p: &SandboxPaths) -> PathBuf {
    p.volumes.join("state.json")
}

/// The volumes of a sandbox, from its state file (empty when it has none).
pub fn load_state(p: &SandboxPaths) -> Vec<VolState> {
    std::fs::read(state_file(p))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// What `GET /v1/sandboxes/{id}` shows.
pub fn view(p: &SandboxPaths) -> Vec<MountedVolume> {
    load_state(p)
        .into_iter()
        .map(|v| MountedVolume {
            mount: v.mount,
            host_path: v.host_path.display().to_string(),
        })
        .collect()
}

fn internal(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::internal(format!("{what}: {e}"))
}

/// A failed volume copy: over the free-space budget is `507 no_space`
/// (nothing was left behind), anything else a 500 that is classified.
fn copy_error(what: &str, e: forkvm_volume::VolumeError) -> EngineError {
    match e {
        forkvm_volume::VolumeError::NoSpace { .. } => EngineError::new(
            ErrorKind::NoSpace,
            format!(
                "{what}: {e} (a reflink filesystem such as XFS or btrfs for the home copies \
                 volumes without using space)"
            ),
        )
        .hint(HintAction::FreeSpace),
        e => internal(what, e),
    }
}

fn write_state(p: &SandboxPaths, v: &[VolState]) -> Result<(), EngineError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&p.volumes)
        .map_err(|e| internal("cannot create the sandbox's volume directory", e))?;
    let tmp = p.volumes.join("state.json.tmp");
    let body = serde_json::to_vec_pretty(v).map_err(|e| internal("volume state", e))?;
    std::fs::write(&tmp, body)
        .and_then(|_| std::fs::rename(&tmp, state_file(p)))
        .map_err(|e| internal("cannot write the sandbox's volume state", e))
}

/// The guest's view of ownership.
fn guest_owner(m: &VolumeMount) -> (u32, u32) {
    let uid = m.uid.unwrap_or(0);
    (uid, m.gid.unwrap_or(uid))
}

/// A lexically clean absolute guest path, not `/`, outside the kernel's
/// own filesystems.
fn check_guest_path(p: &str) -> Result<(), EngineError> {
    let bad = !p.starts_with('/')
        || p == "/"
        || p.ends_with('/')
        || p.split('/')
            .skip(1)
            .any(|c| c.is_empty() || c == "." || c == "..")
        || ["/proc", "/sys", "/dev", "/run/forkvm"]
            .iter()
            .any(|k| p == *k || p.starts_with(&format!("{k}/")));
    if bad {
        return Err(EngineError::invalid(format!(
            "bad guest path {p:?} for a volume: give an absolute path such as /work, not /, \
             without . or .. components, outside /proc, /sys, /dev and /run/forkvm"
        )));
    }
    Ok(())
}

impl Manager {
    /// Check a spawn's volumes and find their host directories. Nothing is
    /// created.
    pub fn resolve_volumes(&self, req: &[VolumeMount]) -> Result<Resolved, EngineError> {
        if req.len() > MAX_VOLUMES {
            return Err(EngineError::invalid(format!(
                "{} volumes asked for; a sandbox may have at most {MAX_VOLUMES}",
                req.len()
            )));
        }
        let mut out: Vec<VolState> = Vec::new();
        for (i, m) in req.iter().enumerate() {
            check_guest_path(&m.path)?;
            if out.iter().any(|o| o.mount.path == m.path) {
                return Err(EngineError::invalid(format!(
                    "two volumes are mounted at {}",
                    m.path
                )));
            }
            let host = if m.is_host_path() {
                self.check_host_dir(&m.source)?
            } else {
                forkvm_api::check_volume_name(&m.source).map_err(EngineError::invalid)?;
                let p = self.named_volume_dir(&m.source);
                if !p.is_dir() {
                    return Err(EngineError::not_found(format!(
                        "there is no volume {:?} (a host directory is named by its absolute path)",
                        m.source
                    ))
                    .hint_on(HintAction::CreateVolume, m.source.clone()));
                }
                p
            };
            out.push(VolState {
                index: i as u8,
                mount: m.clone(),
                host_path: host,
            });
        }
        Ok(Resolved(out))
    }

    /// A host directory a guest may be given: it exists, and neither is nor
    /// contains nor lies inside forkvm's home or the kernel's filesystems
    /// (a guest must never reach snapshots, other sandboxes or /proc).
    fn check_host_dir(&self, src: &str) -> Result<PathBuf, EngineError> {
        let p = std::fs::canonicalize(src).map_err(|e| {
            EngineError::invalid(format!(
                "volume source {src}: {e}; give an existing host directory"
            ))
        })?;
        if !p.is_dir() {
            return Err(EngineError::invalid(format!(
                "volume source {src} is not a directory"
            )));
        }
        let home = std::fs::canonicalize(&self.cfg.home).unwrap_or(self.cfg.home.clone());
        let kernel = ["/proc", "/sys", "/dev"].iter().any(|k| p.starts_with(k));
        if kernel || p.starts_with(&home) || home.starts_with(&p) {
            return Err(EngineError::new(
                ErrorKind::Forbidden,
                format!(
                    "volume source {} is refused: it is, holds or lies in forkvm's home ({}) \
                     or a kernel filesystem; use a named volume or another directory",
                    p.display(),
                    home.display()
                ),
            ));
        }
        Ok(p)
    }

    /// Start serving a sandbox's volumes on its volume port.
    async fn serve_volumes(&self, id: &str, vols: &[VolState]) -> Result<(), EngineError> {
        use std::os::unix::fs::MetadataExt;
        let paths = self.cfg.sandbox_paths(id);
        let mut configs = Vec::new();
        for v in vols {
            let md = std::fs::metadata(&v.host_path).map_err(|e| {
                EngineError::new(
                    ErrorKind::Conflict,
                    format!(
                        "volume directory {} of sandbox {id} is gone ({e}); restore it and retry",
                        v.host_path.display()
                    ),
                )
            })?;
            configs.push(VolumeConfig {
                index: v.index,
                root: v.host_path.clone(),
                read_only: v.mount.read_only,
                journal: paths.volumes.join(format!("{}.journal", v.index)),
                host_owner: (md.uid(), md.gid()),
                guest_owner: guest_owner(&v.mount),
            });
        }
        let sock = paths.volumes_sock.clone();
        let s = tokio::net::UnixStream::connect(&sock).await.map_err(|e| {
            internal(
                &format!(
                    "cannot reach the volume port of sandbox {id} ({})",
                    sock.display()
                ),
                e,
            )
        })?;
        forkvm_qemu::jail::check_peer(&s, &sock)
            .map_err(|e| internal("refusing the volume socket", e))?;
        let s = s.into_std().map_err(|e| internal("volume socket", e))?;
        s.set_nonblocking(false)
            .map_err(|e| internal("volume socket", e))?;
        let log_id = id.to_string();
        let h = tokio::task::spawn_blocking(move || forkvm_volume::serve(s, configs, log_id))
            .await
            .map_err(|e| internal("volume server task", e))?
            .map_err(|e| internal("cannot start the volume server", e))?;
        self.volumes.insert(id, h);
        Ok(())
    }

    /// Mount freshly asked-for volumes in a running sandbox.
    pub async fn attach_volumes(&self, id: &str, r: &Resolved) -> Result<(), EngineError> {
        let live = self.running(id)?;
        if !live.machine.volume_port {
            return Err(EngineError::invalid(format!(
                "sandbox {id} cannot mount volumes: its machine was made before volumes \
                 existed. Spawn from an image, or from a snapshot taken since"
            )));
        }
        let paths = self.cfg.sandbox_paths(id);
        write_state(&paths, &r.0)?;
        self.serve_volumes(id, &r.0).await?;
        let specs =
            r.0.iter()
                .map(|v| forkvm_agent_protocol::VolumeMountSpec {
                    index: v.index,
                    path: v.mount.path.clone(),
                    read_only: v.mount.read_only,
                })
                .collect();
        let conn = live
            .agent()
            .await
            .map_err(|e| EngineError::new(ErrorKind::Guest, e.to_string()))?;
        conn.mount_volumes(specs, Duration::from_secs(30))
            .await
            .map_err(|e| {
                EngineError::new(
                    ErrorKind::Guest,
                    format!("the guest could not mount its volumes: {e}"),
                )
            })
    }

    /// Serve the volumes of a clone of `snap` (its guest has them mounted
    /// already). A fresh clone gets copies of `copy` volumes; a resumed
    /// sandbox (`own`) serves its own directories again.
    pub async fn attach_restored_volumes(
        &self,
        id: &str,
        snap: &forkvm_store::Snapshot,
        own: bool,
    ) -> Result<(), EngineError> {
        let Some(svols) = &snap.manifest.volumes else {
            return Ok(());
        };
        let paths = self.cfg.sandbox_paths(id);
        let mine = load_state(&paths);
        let vols = if own && !mine.is_empty() {
            mine
        } else {
            let sdir = snap.dir.join(forkvm_store::VOLUMES_DIR);
            let (svols, sdir, dst) = (svols.clone(), sdir.clone(), paths.volumes.clone());
            let budget = self.disk_budget_bytes();
            let vols =
                tokio::task::spawn_blocking(move || clone_volumes(&svols, &sdir, &dst, budget))
                    .await
                    .map_err(|e| internal("volume copy task", e))??;
            write_state(&paths, &vols)?;
            vols
        };
        self.serve_volumes(id, &vols).await
    }

    /// Quiesce a sandbox's volumes for a snapshot. `None` when it has none.
    pub async fn hold_volumes(&self, id: &str) -> Result<Option<VolumeHold>, EngineError> {
        let paths = self.cfg.sandbox_paths(id);
        let vols = load_state(&paths);
        if vols.is_empty() {
            return Ok(None);
        }
        let Some(h) = self.volumes.get(id) else {
            return Err(EngineError::new(
                ErrorKind::Guest,
                format!("the volumes of sandbox {id} are not being served; retry in a moment"),
            ));
        };
        let h2 = h.clone();
        tokio::task::spawn_blocking(move || h2.quiesce(QUIESCE_TIMEOUT))
            .await
            .map_err(|e| internal("volume quiesce task", e))?
            .map_err(|e| {
                EngineError::new(
                    ErrorKind::GuestTimeout,
                    format!("the volumes of sandbox {id} did not come to rest: {e}"),
                )
            })?;
        Ok(Some(VolumeHold { handle: h, vols }))
    }

    /// Stop serving a sandbox's volumes (it is being removed or has ended).
    pub fn detach_volumes(&self, id: &str) {
        self.volumes.remove(id);
    }

    /// Reconnect to the volumes of a sandbox an earlier daemon served.
    pub async fn recover_volumes(&self, id: &str) {
        let vols = load_state(&self.cfg.sandbox_paths(id));
        if vols.is_empty() {
            return;
        }
        match self.serve_volumes(id, &vols).await {
            Ok(()) => tracing::info!(sandbox = %id, "serving the volumes of sandbox {id} again"),
            Err(e) => {
                tracing::warn!(sandbox = %id, "cannot serve the volumes of sandbox {id}: {}", e.message)
            }
        }
    }
}

/// A clone's volumes from its snapshot's: `copy` volumes get a private copy
/// of the snapshot's tree, `shared` ones the same directory; every journal
/// is copied so the new server knows the guest's nodes.
/// `budget` bounds the bytes the `copy` trees may write (see
/// `Manager::disk_budget_bytes`), shared by all of them.
fn clone_volumes(
    svols: &[SnapVolume],
    sdir: &Path,
    dst: &Path,
    mut budget: Option<u64>,
) -> Result<Vec<VolState>, EngineError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dst)
        .map_err(|e| internal("cannot create the clone's volume directory", e))?;
    let mut out = Vec::new();
    for v in svols {
        let journal = format!("{}.journal", v.index);
        std::fs::copy(sdir.join(&journal), dst.join(&journal))
            .map_err(|e| internal("cannot copy the snapshot's volume journal", e))?;
        let copy = v.mode == "copy";
        let host_path = if copy {
            let to = dst.join(v.index.to_string());
            let _ = std::fs::remove_dir_all(&to);
            let st = forkvm_volume::copy_tree_within(&sdir.join(v.index.to_string()), &to, budget)
                .map_err(|e| copy_error("cannot copy the snapshot's volume", e))?;
            budget = budget.map(|b| b.saturating_sub(if st.reflinked { 0 } else { st.bytes }));
            to
        } else {
            PathBuf::from(&v.host_path)
        };
        out.push(VolState {
            index: v.index,
            mount: VolumeMount {
                source: v.source.clone(),
                path: v.path.clone(),
                read_only: v.read_only,
                mode: if copy {
                    VolumeMode::Copy
                } else {
                    VolumeMode::Shared
                },
                uid: Some(v.uid),
                gid: Some(v.gid),
            },
            host_path,
        });
    }
    Ok(out)
}

/// A sandbox's volumes held at rest for a snapshot; they resume when this
/// is dropped, whatever happened.
pub struct VolumeHold {
    handle: Arc<ServerHandle>,
    vols: Vec<VolState>,
}

impl VolumeHold {
    /// The manifest's record of them.
    pub fn manifest_entries(&self) -> Vec<SnapVolume> {
        self.vols
            .iter()
            .map(|v| {
                let (uid, gid) = guest_owner(&v.mount);
                SnapVolume {
                    index: v.index,
                    source: v.mount.source.clone(),
                    path: v.mount.path.clone(),
                    read_only: v.mount.read_only,
                    mode: match v.mount.mode {
                        VolumeMode::Copy => "copy".into(),
                        VolumeMode::Shared => "shared".into(),
                    },
                    host_path: v.host_path.display().to_string(),
                    uid,
                    gid,
                }
            })
            .collect()
    }

    /// Save the journals, and the trees of `copy` volumes (unless `journals_only`:
    /// a pause keeps serving the sandbox's own directories), into `dir`.
    /// `budget` bounds the bytes the `copy` trees may write.
    pub async fn save_into(
        &self,
        dir: PathBuf,
        journals_only: bool,
        mut budget: Option<u64>,
    ) -> Result<(), EngineError> {
        let h = self.handle.clone();
        let vols = self.vols.clone();
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)
                .map_err(|e| internal("cannot create the snapshot's volume directory", e))?;
            h.save_journals(&dir)
                .map_err(|e| internal("cannot save the volume journals", e))?;
            if !journals_only {
                for v in vols.iter().filter(|v| v.mount.mode == VolumeMode::Copy) {
                    let st = forkvm_volume::copy_tree_within(
                        &v.host_path,
                        &dir.join(v.index.to_string()),
                        budget,
                    )
                    .map_err(|e| copy_error("cannot copy a volume into the snapshot", e))?;
                    budget =
                        budget.map(|b| b.saturating_sub(if st.reflinked { 0 } else { st.bytes }));
                }
            }
            Ok::<(), EngineError>(())
        })
        .await
        .map_err(|e| internal("volume save task", e))?
    }
}

impl Drop for VolumeHold {
    fn drop(&mut self) {
        self.handle.resume();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_must_be_clean_absolute_and_outside_kernel_trees() {
        for ok in [
            "/work",
            "/home/user/repo",
            "/data.d/x-1",
            "/runx",
            "/devices",
        ] {
            assert!(check_guest_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/",
            "work",
            "/work/",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/proc",
            "/proc/x",
            "/sys",
            "/dev/shm",
            "/run/forkvm",
            "/run/forkvm/x",
        ] {
            assert!(check_guest_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn guest_owner_defaults_gid_to_uid() {
        let mut m = VolumeMount::parse("/a:/b").unwrap();
        assert_eq!(guest_owner(&m), (0, 0));
        m.uid = Some(1000);
        assert_eq!(guest_owner(&m), (1000, 1000));
        m.gid = Some(5);
        assert_eq!(guest_owner(&m), (1000, 5));
    }
}
