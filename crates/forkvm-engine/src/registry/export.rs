//! What a push sends: a snapshot's chain (itself and every ancestor, base
//! first) and its base image, each file cut into chunks
//! (forkvm_artifact::chunk), with what each disk layer backs onto.
//!
//! A disk layer's qcow2 header names its backing file by this host's path.
//! That file is identified by device and inode (a frozen layer is
//! hard-linked into its snapshot, so names differ but inodes do not): it must
//! be the base image's root disk or the disk layer of an earlier link, and
//! the pulling host points the header at its own copy of that file.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use forkvm_artifact::compat::Requires;
use forkvm_artifact::format::{DiskBacking, ImageConfig, LinkConfig, ParentLink, SCHEMA};
use forkvm_artifact::push::{ImagePart, LinkPart};
use forkvm_image::progress::{Progress, ProgressEvent};
use forkvm_store::Snapshot as StoredSnapshot;

use crate::error::EngineError;
use crate::manager::Manager;
use crate::registry::host;
use crate::snapshot::{kind, store_err};

fn inode(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

impl Manager {
    /// The snapshot's chain, base first, each link checked against the
    /// digest its child recorded.
    pub fn lineage(&self, top: &StoredSnapshot) -> Result<Vec<StoredSnapshot>, EngineError> {
        let mut v = vec![top.clone()];
        while let Some(p) = v.last().and_then(|s| s.manifest.parent.clone()) {
            let s = self.store.open_snapshot(&p.id).map_err(store_err)?;
            if !s.answers_to(&p.manifest_sha256) {
                return Err(store_err(forkvm_store::StoreError::Corrupt {
                    id: v.last().map(|s| s.manifest.id.clone()).unwrap_or_default(),
                    why: format!("its parent {} changed after it was taken", p.id),
                }));
            }
            if v.len() > forkvm_artifact::format::MAX_LINKS {
                return Err(EngineError::invalid(
                    "the snapshot's chain is too long to push",
                ));
            }
            v.push(s);
        }
        v.reverse();
        Ok(v)
    }

    /// Build the parts of a push of snapshot `id` (blocking work runs on
    /// blocking threads; chunk lists come from the cache when the files are
    /// unchanged).
    pub async fn export(
        &self,
        id: &str,
        progress: &(dyn Progress + 'static),
    ) -> Result<(ImagePart, Vec<LinkPart>), EngineError> {
        let top = self.open_verified(id).await?;
        let chain = self.lineage(&top)?;
        for s in &chain {
            if s.manifest.volumes.as_ref().is_some_and(|v| !v.is_empty()) {
                return Err(EngineError::invalid(format!(
                    "snapshot {} has volumes mounted (docs/volumes.md); snapshots with volumes \
                     cannot be pushed: take one without volumes",
                    s.manifest.id
                )));
            }
        }
        let image_name = top.manifest.image.clone();
        let rootfs = self.cfg.image_rootfs(&image_name);
        let rootfs_ino = inode(&rootfs).ok_or_else(|| {
            EngineError::invalid(format!(
                "the snapshot's image {image_name:?} is gone from this host; it cannot be pushed"
            ))
        })?;
        let meta = self.image_meta(&image_name)?;
        let (vendor, flags) = host::cpu();
        let home = self.cfg.home.clone();
        let mut links = Vec::new();
        let mut disk_inodes: Vec<((u64, u64), String)> = Vec::new();
        for s in &chain {
            let m = &s.manifest;
            let disk = s.path(forkvm_store::DISK);
            let files = forkvm_qemu::disk::backing_chain(&disk)
                .await
                .map_err(|e| EngineError::internal(format!("cannot read the disk chain: {e}")))?;
            let next = files.get(1).and_then(|p| inode(p));
            let disk_backing = if next == Some(rootfs_ino) {
                DiskBacking::Image
            } else if let Some((_, id)) = disk_inodes.iter().find(|(i, _)| Some(*i) == next) {
                DiskBacking::Snapshot(id.clone())
            } else {
                return Err(EngineError::invalid(format!(
                    "the disk layer of snapshot {} backs onto {}, which is neither the image \
                     nor a snapshot of its chain; flatten it and \
                     push the result",
                    m.id,
                    files
                        .get(1)
                        .map_or("nothing".into(), |p| p.display().to_string())
                )));
            };
            if let Some(i) = inode(&disk) {
                disk_inodes.push((i, m.id.clone()));
            }
            let accel = m.machine.accel.to_string();
            let (kernel, initrd) = (
                PathBuf::from(&m.machine.kernel),
                PathBuf::from(&m.machine.initrd),
            );
            let arts: Vec<(String, PathBuf)> = m
                .artefacts
                .iter()
                .map(|a| (a.file.clone(), s.path(&a.file)))
                .collect();
            let (h, sid) = (home.clone(), m.id.clone());
            let emit = |item: String, done: u64, total: u64| {
                progress.event(ProgressEvent::Bytes {
                    item,
                    done,
                    total: Some(total),
                })
            };
            let (ks, is, entries) = blocking_scope(|| {
                let ks = host::file_sha256(&h, &kernel)?;
                let is = host::file_sha256(&h, &initrd)?;
                let mut entries = Vec::new();
                for (name, p) in &arts {
                    let item = format!("chunking {sid}/{name}");
                    entries.push(host::chunks(&h, p, name, &mut |d, t| {
                        emit(item.clone(), d, t)
                    })?);
                }
                Ok((ks, is, entries))
            })?;
            let fvs = std::fs::read(s.path(forkvm_store::MANIFEST))
                .map_err(|e| EngineError::internal(format!("cannot read the manifest: {e}")))?;
            let config = LinkConfig {
                schema: SCHEMA,
                id: m.id.clone(),
                kind: kind(m).to_string(),
                parent: m.parent.as_ref().map(|p| ParentLink {
                    id: p.id.clone(),
                    // Filled in by the push, from the parent's manifest.
                    manifest: String::new(),
                }),
                manifest_fvs: base64::engine::general_purpose::STANDARD.encode(&fvs),
                disk_backing,
                requires: Requires {
                    arch: std::env::consts::ARCH.into(),
                    qemu: m.qemu_version.clone(),
                    machine: m.machine.machine.clone(),
                    cpu_model: if accel == "kvm" { "host" } else { "max" }.into(),
                    cpu_vendor: vendor.clone(),
                    cpu_flags: if accel == "kvm" {
                        flags.clone()
                    } else {
                        Vec::new()
                    },
                    accel,
                    kernel_sha256: ks,
                    initrd_sha256: is,
                },
                files: entries,
            };
            let paths: BTreeMap<String, PathBuf> = arts.into_iter().collect();
            links.push(LinkPart { config, paths });
        }
        let item = format!("chunking image {image_name}");
        let root = rootfs.clone();
        let entry = blocking_scope(|| {
            host::chunks(&home, &root, "rootfs.ext4", &mut |d, t| {
                progress.event(ProgressEvent::Bytes {
                    item: item.clone(),
                    done: d,
                    total: Some(t),
                })
            })
        })?;
        let image = ImagePart {
            config: ImageConfig {
                schema: SCHEMA,
                name: image_name,
                image_json: serde_json::to_value(&meta).unwrap_or_default(),
                files: vec![entry],
            },
            rootfs,
        };
        Ok((image, links))
    }
}

/// Run blocking work that borrows from the caller on this thread, telling
/// the runtime so (chunking reads and compresses whole files).
fn blocking_scope<T>(f: impl FnOnce() -> Result<T, EngineError>) -> Result<T, EngineError> {
    tokio::task::block_in_place(f)
}
