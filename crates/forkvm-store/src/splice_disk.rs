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
    if n.manifest.artefact("disk").is_none() || v.manifest.artefact("disk").is_none() {
        return Ok(false);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Artefact, Manifest, ParentRef};
    use crate::{Store, DEVICE_STATE, MEMORY_DIFF};

    fn tool(name: &str, args: &[&str]) {
        let o = std::process::Command::new(name)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{name} is needed (scripts/setup.sh installs it): {e}"));
        assert!(o.status.success(), "{name} {args:?}: {o:?}");
    }

    /// Publish a diff snapshot whose disk layer is backed by `backing`
    /// and holds `writes` (qemu-io commands).
    fn publish(
        store: &Store,
        id: &str,
        parent: Option<&Snapshot>,
        backing: &Path,
        writes: &[&str],
    ) -> Snapshot {
        let st = store.begin(id).unwrap();
        crate::memdiff::write(&st.path(MEMORY_DIFF), 4 * 4096, &[0], &[1u8; 4096]).unwrap();
        std::fs::write(st.path(DEVICE_STATE), b"devices").unwrap();
        let disk = st.path(DISK);
        let fmt = forkvm_qemu::disk::image_format(backing).unwrap();
        let (b, d) = (backing.to_str().unwrap(), disk.to_str().unwrap());
        tool(
            "qemu-img",
            &["create", "-q", "-f", "qcow2", "-F", fmt, "-b", b, d, "4M"],
        );
        for w in writes {
            tool("qemu-io", &["-f", "qcow2", "-c", w, d]);
        }
        let mut m: Manifest = crate::manifest::tests_support::sample();
        m.id = id.into();
        m.artefacts = [
            ("memory_diff", MEMORY_DIFF),
            ("device_state", DEVICE_STATE),
            ("disk", DISK),
        ]
        .iter()
        .map(|(k, f)| Artefact {
            kind: k.to_string(),
            file: f.to_string(),
            size: 0,
            allocated: 0,
            sha256: String::new(),
        })
        .collect();
        m.parent = parent.map(|p| ParentRef {
            id: p.manifest.id.clone(),
            manifest_sha256: p.digest.clone(),
        });
        store.publish(st, m).unwrap()
    }

    /// The whole disk as `image` presents it through its chain.
    fn view(image: &Path, out: &Path) -> Vec<u8> {
        let (i, o) = (image.to_str().unwrap(), out.to_str().unwrap());
        tool("qemu-img", &["convert", "-U", "-O", "raw", i, o]);
        std::fs::read(out).unwrap()
    }

    #[test]
    fn a_thin_layer_takes_the_pruned_ones_clusters_and_its_backing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let base = dir.path().join("base.raw");
        std::fs::write(&base, vec![0x0b; 4 << 20]).unwrap();
        let p = publish(&store, "sn-p", None, &base, &["write -P 0x11 0 64k"]);
        // V writes, zeroes a cluster P wrote and one the base holds.
        let v = publish(
            &store,
            "sn-v",
            Some(&p),
            &p.path(DISK),
            &[
                "write -P 0x22 64k 128k",
                "write -z 0 64k",
                "write -z 1M 64k",
            ],
        );
        let n = publish(
            &store,
            "sn-n",
            Some(&v),
            &v.path(DISK),
            &["write -P 0x33 128k 4k"],
        );
        let before = view(&n.path(DISK), &dir.path().join("before.raw"));
        assert!(builds_on(&n, &v).unwrap());
        assert!(!builds_on(&v, &n).unwrap());

        store.splice_out("sn-v", "sn-n").unwrap();
        let n2 = store.open_snapshot("sn-n").unwrap();
        let after = view(&n2.path(DISK), &dir.path().join("after.raw"));
        assert!(before == after, "the merged layer reads differently");
        let backing = forkvm_qemu::qcow2::backing_file(&n2.path(DISK))
            .unwrap()
            .unwrap();
        assert_eq!(
            std::fs::canonicalize(backing).unwrap(),
            std::fs::canonicalize(p.path(DISK)).unwrap()
        );
        // The manifest describes the merged file, which verifies.
        store.verify(&n2).unwrap();
        assert!(!n2.path(DISK_SPLICE).exists());
    }

    #[test]
    fn tidy_renames_a_committed_merge_in_and_removes_an_uncommitted_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let base = dir.path().join("base.raw");
        std::fs::write(&base, vec![0u8; 4 << 20]).unwrap();
        let s = publish(&store, "sn-s", None, &base, &["write -P 0x44 0 64k"]);
        let disk = std::fs::read(s.path(DISK)).unwrap();

        // Uncommitted (the manifest records other bytes): removed.
        std::fs::write(s.path(DISK_SPLICE), b"half a merge").unwrap();
        assert_eq!(tidy(&s), Some(s.path(DISK_SPLICE)));
        assert_eq!(std::fs::read(s.path(DISK)).unwrap(), disk);

        // Committed (its digest is the manifest's): it takes the name.
        std::fs::write(s.path(DISK_SPLICE), &disk).unwrap();
        std::fs::remove_file(s.path(DISK)).unwrap();
        assert_eq!(tidy(&s), None);
        assert!(!s.path(DISK_SPLICE).exists());
        assert_eq!(std::fs::read(s.path(DISK)).unwrap(), disk);
        assert_eq!(store.tidy_splices(), Vec::<PathBuf>::new());
    }
}
