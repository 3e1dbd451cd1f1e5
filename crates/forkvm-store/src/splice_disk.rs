//! The disk half of a splice ([`crate::splice`]): a thin disk layer.
//!
//! A checkpoint's disk layer may hold only the clusters written since the
//! previous checkpoint, with that checkpoint's layer as its backing file
//! (forkvm_qemu::incremental). Splicing the previous one, `V`, out from
//! under `N` then merges the disks as the memory: `N`'s layer takes `V`'s
//! clusters that it does not hold itself and names `V`'s backing file.
//! `qemu-img rebase` in its safe mode does exactly that: it copies into the
//! image every cluster on which the old backing chain and the new one read
//! differently, where the image holds nothing of its own.
//!
//! The layer must keep its path (`N/disk.qcow2`): the headers of later
//! layers name it. So the merged layer is written beside it as
//! [`DISK_SPLICE`], the new manifest (the splice's commit point) records its
//! digest, and only then is it renamed over `disk.qcow2`. Both files read
//! as the same disk. A crash between the commit and the rename leaves a
//! merged file whose digest the manifest records:
//! [`crate::Store::tidy_splices`] renames it in at start; one from before
//! the commit matches nothing and is removed.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{hash_file, io, Snapshot, StoreError, DISK};

/// The merged disk layer until it is renamed in.
pub const DISK_SPLICE: &str = "disk.splice.qcow2";

fn corrupt(id: &str, why: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        why: why.into(),
    }
}

/// Whether `n`'s disk layer is backed by `v`'s (the same file: compared by
/// device and inode, as names may differ).
pub fn builds_on(n: &Snapshot, v: &Snapshot) -> Result<bool, StoreError> {
    let backing = forkvm_qemu::qcow2::backing_file(&n.path(DISK))
        .map_err(|e| corrupt(&n.manifest.id, e.to_string()))?;
    let Some(b) = backing else { return Ok(false) };
    let key = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    Ok(key(&b).is_some() && key(&b) == key(&v.path(DISK)))
}

/// What a merged layer's artefact records.
pub struct Merged {
    pub path: PathBuf,
    pub size: u64,
    pub allocated: u64,
    pub sha256: String,
}

/// Write `n`'s layer with `v`'s clusters merged in, over `v`'s backing
/// file, as [`DISK_SPLICE`] in `n`'s directory: read-only and durable.
pub fn merge(n: &Snapshot, v: &Snapshot) -> Result<Merged, StoreError> {
    let id = &n.manifest.id;
    let vdisk = v.path(DISK);
    let backing = forkvm_qemu::qcow2::backing_file(&vdisk)
        .map_err(|e| corrupt(&v.manifest.id, e.to_string()))?
        .ok_or_else(|| corrupt(&v.manifest.id, "its disk layer has no backing file"))?;
    let fmt = forkvm_qemu::disk::image_format(&backing).map_err(io(&backing))?;
    let out = n.path(DISK_SPLICE);
    let _ = std::fs::remove_file(&out);
    let src = n.path(DISK);
    std::fs::copy(&src, &out).map_err(io(&out))?;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).map_err(io(&out))?;
    let r = std::process::Command::new(forkvm_qemu::disk::qemu_img_binary())
        .args(["rebase", "-q", "-f", "qcow2", "-F", fmt, "-b"])
        .arg(&backing)
        .arg(&out)
        .output();
    let failed = match r {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Some(format!("cannot run qemu-img: {e}")),
    };
    if let Some(why) = failed {
        let _ = std::fs::remove_file(&out);
        return Err(corrupt(
            id,
            format!("merging the disk layers failed: {why}"),
        ));
    }
    let f = std::fs::File::open(&out).map_err(io(&out))?;
    f.sync_all().map_err(io(&out))?;
    let meta = f.metadata().map_err(io(&out))?;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o444)).map_err(io(&out))?;
    Ok(Merged {
        sha256: hash_file(&out)?,
        path: out,
        size: meta.size(),
        allocated: meta.blocks() * 512,
    })
}

/// After the commit: the merged layer takes the layer's name.
pub fn rename_in(n_dir: &Path) -> Result<(), StoreError> {
    let (from, to) = (n_dir.join(DISK_SPLICE), n_dir.join(DISK));
    std::fs::rename(&from, &to).map_err(io(&to))?;
    crate::fsync_dir(n_dir)
}

/// At start: finish or undo an interrupted disk merge in `s`. Answers the
/// file removed, if one was.
pub fn tidy(s: &Snapshot) -> Option<PathBuf> {
    let p = s.path(DISK_SPLICE);
    if !p.exists() {
        return None;
    }
    let wanted = s.manifest.artefact("disk").map(|a| a.sha256.clone());
    if hash_file(&p).ok().is_some_and(|h| Some(h) == wanted) {
        // Committed: the manifest already describes it.
        let _ = rename_in(&s.dir);
        return None;
    }
    std::fs::remove_file(&p).ok().map(|()| p)
}
