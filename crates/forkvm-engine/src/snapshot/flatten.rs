//! Flattening: a diff snapshot's chain merged into one `shared` snapshot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use forkvm_api::SnapshotTimings;
use forkvm_store::StoreError;

use crate::db::{Origin, SnapshotRow};
use crate::error::EngineError;
use crate::manager::Manager;
use crate::snapshot::{kind, store_err};
use crate::util::{self, ms};

impl Manager {
    /// Merge a diff snapshot's chain into one `shared` snapshot with no
    /// parent: the chain's flattened head (the base image with every link's
    /// pages written over it, see crate::catalog::head) copied, the
    /// head's device state, and the head's disk layer (qcow2 chains are the
    /// disk's own business; its layers stay reachable through the collector).
    pub async fn flatten(
        self: &Arc<Self>,
        id_or_tag: &str,
        tag: Option<String>,
    ) -> Result<forkvm_api::Snapshot, EngineError> {
        let t0 = Instant::now();
        let row = self.snapshot_row(id_or_tag)?;
        let _lease = self.gc_lease(&row.id)?;
        let head = self.store.open_snapshot(&row.id).map_err(store_err)?;
        let k = kind(&head.manifest);
        if k != "diff" {
            return Err(EngineError::invalid(format!(
                "snapshot {} is of kind {k}, which has no chain; only diff snapshots can be flattened",
                row.id
            )));
        }
        self.check_tag(tag.as_deref())?;
        let chain = self.chain(&head)?;
        self.verify_chain(&chain).await?;
        let flat = self
            .chain_head(&chain, u64::from(head.manifest.machine.memory_mib) << 20)
            .await?;
        let new_id = self.new_id("sn");
        let staging = self.store.begin(&new_id).map_err(store_err)?;
        let mut manifest = head.manifest.clone();
        manifest.id = new_id.clone();
        manifest.tag = tag.clone();
        manifest.parent = None;
        manifest.created_at = util::now_rfc3339();
        // `ram_format` stays: the device state is the head's own, and one
        // from a live save of a clone is a mapped-ram stream (whose guest RAM
        // block is empty; children load it over `memory.img`).
        manifest.artefacts = [
            ("device_state", forkvm_store::DEVICE_STATE),
            ("disk", forkvm_store::DISK),
            ("memory", forkvm_store::MEMORY),
        ]
        .into_iter()
        .map(|(k, f)| forkvm_store::Artefact {
            kind: k.into(),
            file: f.into(),
            size: 0,
            allocated: 0,
            sha256: String::new(),
        })
        .collect();
        let store = self.clone();
        let published = tokio::task::spawn_blocking(move || {
            // The head is the chain's RAM already: a reflink or sparse copy.
            let mem = staging.path(forkvm_store::MEMORY);
            forkvm_store::head::clone_file(&flat, &mem).map_err(|e| StoreError::Io {
                path: mem.display().to_string(),
                source: std::io::Error::other(e.to_string()),
            })?;
            let copy = |from: PathBuf, to: PathBuf| {
                std::fs::copy(&from, &to)
                    .map(drop)
                    .map_err(|e| StoreError::Io {
                        path: to.display().to_string(),
                        source: e,
                    })
            };
            copy(
                head.path(forkvm_store::DEVICE_STATE),
                staging.path(forkvm_store::DEVICE_STATE),
            )?;
            // The volumes' journals and `copy` trees belong to the head's
            // instant, which the flattened snapshot is.
            let vdir = head.path(forkvm_store::VOLUMES_DIR);
            if vdir.is_dir() {
                let to = staging.path(forkvm_store::VOLUMES_DIR);
                forkvm_volume::copy_tree(&vdir, &to).map_err(|e| StoreError::Io {
                    path: to.display().to_string(),
                    source: std::io::Error::other(e.to_string()),
                })?;
            }
            std::fs::hard_link(
                head.path(forkvm_store::DISK),
                staging.path(forkvm_store::DISK),
            )
            .map_err(|e| StoreError::Io {
                path: staging.path(forkvm_store::DISK).display().to_string(),
                source: e,
            })?;
            store.store.publish(staging, manifest)
        })
        .await
        .map_err(|e| EngineError::internal(e.to_string()))?
        .map_err(store_err)?;
        let srow = SnapshotRow {
            id: new_id,
            tag,
            parent: None,
            source: row.source.clone(),
            image: row.image.clone(),
            memory_mib: row.memory_mib,
            cpus: row.cpus,
            created_at: published.manifest.created_at.clone(),
            template_key: None,
            pool_size: None,
            origin: Origin::Flatten,
            pinned: false,
        };
        self.db.set_snapshot_info(
            &srow.id,
            &crate::db::SnapshotInfo {
                flattened_from: Some(row.id.clone()),
                ..Default::default()
            },
        )?;
        self.db.insert_snapshot(&srow)?;
        let mut view = self.snapshot_view(&srow)?;
        view.timings = Some(SnapshotTimings {
            publish_ms: ms(t0.elapsed()),
            total_ms: ms(t0.elapsed()),
            ..Default::default()
        });
        Ok(view)
    }
}
