//! What the daemon decides for each jailed QEMU: its uid, its cgroup, and
//! which host paths it sees (`forkvm_qemu::jail` does the confining).
//!
//! * **uid/gid**: one per QEMU from `--jail-uids` (gid = uid). A uid is taken
//!   by holding an flock on `/run/forkvm-jail/uids/<uid>`, and QEMU inherits
//!   that lock, so the uid stays taken exactly as long as that QEMU lives:
//!   across daemon restarts, and across daemons with different homes.
//! * **files**: the sandbox directory becomes `root:<gid>` mode `1770`, and
//!   the files QEMU writes in it (disk layers, console, RAM, snapshot
//!   staging files) `root:<gid>` `0660`. QEMU can write them but cannot
//!   rename, replace or chmod them (sticky directory, not the owner), so a
//!   compromised QEMU cannot turn the daemon's own file operations into
//!   symlink attacks on them. Shared read-only files (kernel, images,
//!   snapshot layers) are world-readable and bound read-only.
//! * **rlimits**: NOFILE 2048 (Firecracker's jailer default; QEMU uses
//!   about 35) and FSIZE [`fsize_limit`]: the largest file a QEMU writes is
//!   a disk layer (at most the disk's virtual size plus qcow2 metadata), its
//!   RAM file or a snapshot's RAM stream (the RAM size plus a header).
//! * **view**: the sandbox directory and its RAM scratch directory
//!   (read-write), its RAM file, kernel, initrd, every layer of its disk's
//!   backing chain and the snapshot state it will load (read-only), /usr and
//!   the loader (read-only, executable), and a few device nodes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use forkvm_qemu::jail::{Access, Jail, Mount, Rlimits};
use forkvm_qemu::MachineSpec;

use crate::cgroup::{Cgroup, Layout};
use crate::config::{Config, SandboxPaths};
use crate::error::{EngineError, ErrorKind};

/// Host-wide: every daemon allocates uids here.
const UID_LOCKS: &str = "/run/forkvm-jail/uids";

/// The jail policy of one daemon.
#[derive(Debug)]
pub struct Jailer {
    pub enabled: bool,
    /// First uid and how many.
    uids: (u32, u32),
    pub layout: Option<Layout>,
    /// The cgroup that holds this daemon's sandboxes (`forkvm-<home hash>`).
    group: String,
    /// The empty directory QEMU's root tmpfs is mounted on.
    root: PathBuf,
    qemu: PathBuf,
}

impl Jailer {
    pub fn new(cfg: &Config) -> Jailer {
        // Detected even with the jail off: sandboxes a jailing daemon left
        // running still have cgroups to remove when they end.
        let layout = Layout::for_daemon();
        Jailer {
            enabled: cfg.jail,
            uids: cfg.jail_uids,
            layout,
            group: format!("forkvm-{}", crate::config::home_hash(&cfg.home)),
            root: cfg.home.join("jail-root"),
            qemu: cfg.qemu.clone(),
        }
    }

    /// The cgroup a sandbox's QEMU is (or was) in.
    pub fn cgroup(&self, id: &str) -> Option<Cgroup> {
        self.layout.as_ref().map(|l| Cgroup::at(l, &self.group, id))
    }

    /// Remove a sandbox's cgroup once its QEMU has exited. The kernel may
    /// still count a process that was just reaped (EBUSY), so a failed
    /// removal is retried in the background for a while; what is left after
    /// that (or after a daemon crash) goes in the next [`Jailer::sweep`].
    pub fn release(&self, id: &str) {
        let Some(cg) = self.cgroup(id) else { return };
        if cg.remove().is_ok() {
            return;
        }
        let id = id.to_string();
        let retry = async move {
            for _ in 0..100 {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                if cg.remove().is_ok() {
                    return;
                }
            }
            if let Err(e) = cg.remove() {
                tracing::warn!(sandbox = %id, "cannot remove the cgroup of sandbox {id}: {e}");
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(retry);
        }
    }

    /// Remove every sandbox cgroup of this daemon that no process is in
    /// any more (a QEMU that died while no daemon watched it, or whose
    /// removal a stopping daemon did not finish). Only while no spawn runs
    /// (daemon start and shutdown): a spawn's cgroup is empty until its QEMU
    /// joins it.
    pub fn sweep(&self) {
        let Some(l) = &self.layout else { return };
        let parent = Cgroup::at(l, &self.group, "");
        let mut names = std::collections::BTreeSet::new();
        for dir in parent.dirs() {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    names.insert(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
        for n in names {
            // rmdir of a cgroup with processes fails (EBUSY): those stay.
            let _ = Cgroup::at(l, &self.group, &n).remove();
        }
    }

    /// Remove the parent cgroup of this daemon's sandboxes if it is empty
    /// (daemon shutdown); one with sandboxes in it stays.
    pub fn remove_group(&self) {
        self.sweep();
        if let Some(l) = &self.layout {
            let _ = Cgroup::at(l, &self.group, "").remove();
        }
    }

    /// Take a free uid: the flock on its lock file is the allocation.
    fn take_uid(&self) -> Result<(u32, std::fs::File), EngineError> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(UID_LOCKS).map_err(|e| {
            EngineError::internal(format!("cannot create {UID_LOCKS}: {e}; the jail needs it"))
        })?;
        let (first, n) = self.uids;
        for uid in first..first.saturating_add(n) {
            let p = Path::new(UID_LOCKS).join(uid.to_string());
            let Ok(f) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
            else {
                continue;
            };
            // SAFETY: flock(2) on an fd we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok((uid, f));
            }
        }
        Err(EngineError::new(ErrorKind::CapacityExceeded, format!(
                "all {n} jail uids from {first} are in use; widen `serve --jail-uids` or remove sandboxes"
            ),
        ))
    }

    /// Everything one QEMU's jail needs; `None` with the jail off.
    pub fn prepare(
        &self,
        id: &str,
        spec: &MachineSpec,
        paths: &SandboxPaths,
    ) -> Result<Option<Jail>, EngineError> {
        if !self.enabled {
            return Ok(None);
        }
        let err = |what: &str, e: std::io::Error| {
            EngineError::internal(format!(
                "cannot prepare the jail of sandbox {id}: {what}: {e}"
            ))
        };
        std::fs::create_dir_all(&self.root).map_err(|e| err("its root directory", e))?;
        let (uid, lock) = self.take_uid()?;
        let gid = uid;
        // The sandbox's own files: QEMU writes them through its group.
        set_owner(&paths.dir, gid, 0o1770).map_err(|e| err("its directory", e))?;
        std::fs::create_dir_all(&paths.shm).map_err(|e| err("its RAM scratch directory", e))?;
        set_owner(&paths.shm, gid, 0o1770).map_err(|e| err("its RAM scratch directory", e))?;
        for f in [&paths.disk, &paths.console] {
            precreate(f, gid).map_err(|e| err("its files", e))?;
        }
        let mut mounts = Jail::base_mounts(
            &forkvm_qemu::process::resolve(&self.qemu).unwrap_or_else(|| self.qemu.clone()),
            spec.config.accel == forkvm_qemu::Accel::Kvm,
        );
        let mut ro = |p: &Path| {
            mounts.push(Mount {
                path: p.to_path_buf(),
                access: Access::ReadOnly,
            })
        };
        ro(&spec.config.kernel);
        ro(&spec.config.initrd);
        // Every layer under the top: QEMU opens the chain by name at start.
        let chain = forkvm_qemu::qcow2::chain(&spec.root_disk)
            .map_err(|e| EngineError::internal(format!("cannot read the disk chain: {e}")))?;
        for layer in chain.iter().skip(1) {
            ro(layer);
        }
        for f in &spec.later_reads {
            ro(f);
        }
        if spec.memory.readonly {
            ro(&spec.memory.path);
        }
        // A shared file QEMU cannot read as its uid would fail the spawn
        // with a bare EACCES from inside QEMU: say which file and why.
        for m in mounts.iter().filter(|m| m.access == Access::ReadOnly) {
            let readable = std::fs::metadata(&m.path).is_ok_and(|md| md.mode() & 0o004 != 0);
            if !readable {
                return Err(EngineError::internal(format!(
                    "{} is not world-readable, so the jailed QEMU of sandbox {id} (uid {uid}) \
                     cannot read it; make it readable (chmod a+r {}), or debug with the daemon's --no-jail",
                    m.path.display(),
                    m.path.display()
                )));
            }
        }
        if !spec.memory.readonly {
            precreate(&spec.memory.path, gid).map_err(|e| err("its RAM file", e))?;
            mounts.push(Mount {
                path: spec.memory.path.clone(),
                access: Access::ReadWrite,
            });
        }
        for d in [&paths.dir, &paths.shm] {
            mounts.push(Mount {
                path: d.clone(),
                access: Access::ReadWrite,
            });
        }
        let cgroup_procs = match &self.layout {
            // (Only a jailed QEMU gets one: `--no-jail` is for debugging.)
            Some(l) => Cgroup::create(l, &self.group, id)
                .map_err(|e| err("its cgroup", e))?
                .procs_files(),
            None => vec![],
        };
        let disk = disk_bytes(&spec.root_disk).map_err(|e| err("the size of its disk", e))?;
        Ok(Some(Jail {
            uid,
            gid,
            root: self.root.clone(),
            mounts,
            cgroup_procs,
            inherit: vec![lock],
            rlimits: Rlimits {
                fsize: fsize_limit(u64::from(spec.config.memory_mib) << 20, disk),
                ..Rlimits::default()
            },
        }))
    }
}

/// RLIMIT_FSIZE of a QEMU with `ram` bytes of RAM and a `disk`-byte disk:
/// the larger of the two, an eighth more (qcow2 tables and refcounts, a
/// mapped-ram stream's header and bitmap) and 1 GiB. It bounds what one
/// file a compromised QEMU writes can take; its disk and RAM files never
/// reach it.
pub fn fsize_limit(ram: u64, disk: u64) -> u64 {
    let big = ram.max(disk);
    big.saturating_add(big / 8).saturating_add(1 << 30)
}

/// The virtual size of a disk: a qcow2 header's `size` (bytes 24..32, big
/// endian), or the length of a raw file.
fn disk_bytes(disk: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(disk)?;
    let mut head = [0u8; 32];
    if f.read_exact_at(&mut head, 0).is_ok() && head[..4] == forkvm_qemu::qcow2::MAGIC[..] {
        let mut size = [0u8; 8];
        size.copy_from_slice(&head[24..32]);
        return Ok(u64::from_be_bytes(size));
    }
    Ok(f.metadata()?.len())
}

/// `path` as `root:<gid>` with `mode`.
fn set_owner(path: &Path, gid: u32, mode: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(0), Some(gid))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Create `path` if missing (empty) and make it `root:<gid>` `0660`.
fn precreate(path: &Path, gid: u32) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    set_owner(path, gid, 0o660)
}

/// The jail gid of a sandbox, read from its directory; `None` when it is
/// not jailed.
pub fn sandbox_gid(paths: &SandboxPaths) -> Option<u32> {
    let m = std::fs::symlink_metadata(&paths.dir).ok()?;
    (m.gid() != 0).then_some(m.gid())
}

/// Make a file the daemon creates for a running QEMU writable by it (a new
/// disk layer, a snapshot file it writes); nothing for an unjailed QEMU.
pub fn share_with_qemu(paths: &SandboxPaths, file: &Path) -> std::io::Result<()> {
    match sandbox_gid(paths) {
        Some(gid) => precreate(file, gid),
        None => Ok(()),
    }
}

/// Take a file QEMU wrote back (root-owned, no group access).
pub fn take_back(file: &Path) -> std::io::Result<()> {
    std::os::unix::fs::lchown(file, Some(0), Some(0))?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsize_fits_the_ram_file_and_the_disk_with_room() {
        const G: u64 = 1 << 30;
        // A 4 GiB guest's RAM file (and a live snapshot's stream of it)
        // must fit, and a 10 GiB disk's qcow2 layer.
        assert!(fsize_limit(4 * G, 2 * G) >= 4 * G + G);
        assert!(fsize_limit(G / 2, 10 * G) >= 10 * G + G);
        assert_eq!(fsize_limit(u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn disk_size_is_the_qcow2_virtual_size_or_the_raw_length() {
        let d = tempfile::tempdir().unwrap();
        let raw = d.path().join("raw");
        std::fs::write(&raw, vec![0u8; 4096]).unwrap();
        assert_eq!(disk_bytes(&raw).unwrap(), 4096);
        let q = d.path().join("q");
        let mut h = vec![0u8; 72];
        h[..4].copy_from_slice(forkvm_qemu::qcow2::MAGIC);
        h[24..32].copy_from_slice(&(5u64 << 30).to_be_bytes());
        std::fs::write(&q, h).unwrap();
        assert_eq!(disk_bytes(&q).unwrap(), 5 << 30);
        assert!(disk_bytes(&d.path().join("missing")).is_err());
    }
}
