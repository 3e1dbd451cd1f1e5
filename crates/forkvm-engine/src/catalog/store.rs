//! The snapshot store as the API sees it: views, look-ups by id or tag,
//! verified opens, removal, and the sweeps that keep the store and the state
//! database in step.

use forkvm_api::SnapshotSizes;
use forkvm_qemu::process;
use forkvm_store::{Snapshot as StoredSnapshot, StoreError};

use crate::db::{Origin, SnapshotRow};
use crate::error::EngineError;
use crate::gc::layers;
use crate::manager::Manager;
use crate::snapshot::{kind, store_err};
use crate::util;

impl Manager {
    /// The API view of a snapshot.
    pub fn snapshot_view(&self, r: &SnapshotRow) -> Result<forkvm_api::Snapshot, EngineError> {
        let s = self.store.open_snapshot(&r.id).map_err(store_err)?;
        let size = |k: &str| {
            s.manifest
                .artefact(k)
                .map_or((0, 0), |a| (a.size, a.allocated))
        };
        let info = self.db.snapshot_info(&r.id)?;
        let live_children: Vec<String> =
            self.db.sandboxes_of_snapshot(&r.id)?.into_iter().collect();
        Ok(forkvm_api::Snapshot {
            id: r.id.clone(),
            tag: r.tag.clone(),
            parent: r.parent.clone(),
            source: r.source.clone(),
            image: r.image.clone(),
            memory_mib: r.memory_mib,
            cpus: r.cpus,
            created_at: r.created_at.clone(),
            kind: kind(&s.manifest).into(),
            depth: if kind(&s.manifest) == "diff" {
                self.chain(&s).map_or(0, |c| c.links.len() as u32)
            } else {
                0
            },
            state: "ready".into(),
            failure: None,
            template: r.template_key.is_some(),
            qemu_version: s.manifest.qemu_version.clone(),
            sizes: SnapshotSizes {
                memory_bytes: size("memory").0,
                memory_allocated_bytes: size("memory").1,
                device_state_bytes: size("device_state").0,
                disk_bytes: size("disk").0,
                memory_diff_bytes: size("memory_diff").0,
                device_state_allocated_bytes: size("device_state").1,
                on_disk_bytes: allocated_in(&self.store.dir(&r.id)),
            },
            pool_size: self.pool_size_of(r),
            pool_default: r.pool_size.is_none(),
            sandboxes: live_children,
            children: self
                .db
                .child_snapshots(&r.id)?
                .into_iter()
                .map(|c| c.id)
                .collect(),
            origin: r.origin.as_str().into(),
            pinned: r.pinned,
            mode: info.mode,
            pause_ms: info.pause_ms,
            flattened_from: info.flattened_from,
            timings: None,
        })
    }

    /// The view of a snapshot by id or tag, including those an asynchronous
    /// branch is still writing (or failed to write).
    pub fn snapshot_by_ref(&self, id_or_tag: &str) -> Result<forkvm_api::Snapshot, EngineError> {
        if let Some(p) = self.pending.get(id_or_tag) {
            return Ok(p);
        }
        let r = self.snapshot_row(id_or_tag)?;
        self.snapshot_view(&r)
    }

    /// A snapshot row by id or tag, or 404.
    pub fn snapshot_row(&self, id_or_tag: &str) -> Result<SnapshotRow, EngineError> {
        if !util::valid_id(id_or_tag) {
            return Err(store_err(StoreError::NotFound(id_or_tag.to_string())));
        }
        self.db
            .snapshot(id_or_tag)?
            .ok_or_else(|| store_err(StoreError::NotFound(id_or_tag.to_string())))
    }

    /// Open a snapshot and verify its files (see forkvm-store on why this is
    /// cheap after the first time).
    pub async fn open_verified(&self, id: &str) -> Result<StoredSnapshot, EngineError> {
        let s = self.store.open_snapshot(id).map_err(store_err)?;
        let store = self.store.clone();
        let s2 = s.clone();
        tokio::task::spawn_blocking(move || store.verify(&s2))
            .await
            .map_err(|e| EngineError::internal(e.to_string()))?
            .map_err(store_err)?;
        Ok(s)
    }

    /// Delete the disk layers of removed snapshots that no disk chain still
    /// goes through (garbage collection from the roots: every sandbox's disk
    /// files and every published snapshot's layer). A chain that cannot be
    /// followed is cut and reported, and the rest of the home is still
    /// collected (crate::gc::layers).
    pub async fn collect_layers(&self) {
        // One collection at a time: two would each see the other's deletions
        // as unreadable chains.
        static GC: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _gc = GC.lock().await;
        // The candidates are fixed before the roots are read (see
        // Store::collect_layers).
        let candidates = self.store.orphan_layers();
        if candidates.is_empty() {
            return;
        }
        let mut roots = Vec::new();
        for e in std::fs::read_dir(self.cfg.sandboxes_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let owner = e.file_name().to_string_lossy().into_owned();
            for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                if f.file_name().to_string_lossy().ends_with(".qcow2") {
                    roots.push(layers::Root {
                        owner: owner.clone(),
                        file: f.path(),
                    });
                }
            }
        }
        for id in self.store.ids() {
            roots.push(layers::Root {
                file: self.store.dir(&id).join(forkvm_store::DISK),
                owner: id,
            });
        }
        let Ok(found) = tokio::task::spawn_blocking(move || layers::referenced(&roots)).await
        else {
            return;
        };
        for b in &found.broken {
            let (sandbox, snapshot) = match b.owner.starts_with("sb-") {
                true => (b.owner.as_str(), ""),
                false => ("", b.owner.as_str()),
            };
            tracing::warn!(
                sandbox,
                snapshot,
                "layer collection: the disk chain of {} ({}) is broken, skipped past the break: {}",
                b.owner,
                b.file.display(),
                b.why
            );
        }
        if let Some(u) = &found.unsure {
            // Unsure what this chain holds: delete nothing this time.
            tracing::warn!(
                "layer collection skipped this pass: cannot read the disk chain of {} ({}): {}",
                u.owner,
                u.file.display(),
                u.why
            );
            return;
        }
        for gone in self.store.collect_layers(&candidates, &found.files) {
            tracing::info!("collected unused disk layer {}", gone.display());
        }
    }

    /// Make the index agree with the store after a crash: a published
    /// snapshot missing from the index (the daemon died between the rename
    /// and the insert) is added; an index row whose files are gone is dropped.
    pub fn reconcile_snapshots(&self) {
        let rows = self.db.snapshots().unwrap_or_default();
        let ids = self.store.ids();
        for r in &rows {
            if !ids.contains(&r.id) {
                tracing::warn!("snapshot {} has no files; dropping it from the index", r.id);
                let _ = self.db.delete_snapshot(&r.id);
            }
        }
        for id in ids {
            if rows.iter().any(|r| r.id == id) {
                continue;
            }
            match self.store.open_snapshot(&id) {
                Ok(s) => {
                    let m = s.manifest;
                    let _ = self.db.insert_snapshot(&SnapshotRow {
                        id: m.id.clone(),
                        tag: m.tag.clone(),
                        parent: m.parent.as_ref().map(|p| p.id.clone()),
                        source: m.source.clone(),
                        image: m.image.clone(),
                        memory_mib: m.machine.memory_mib,
                        cpus: m.machine.cpus,
                        created_at: m.created_at.clone(),
                        template_key: None,
                        pool_size: None,
                        origin: Origin::Unknown,
                        pinned: false,
                    });
                }
                Err(e) => tracing::warn!("snapshot {id} is unreadable: {e}"),
            }
        }
    }

    /// Directories under `sandboxes/` with no row belong to nobody: pooled
    /// processes of a daemon that died, or a crash mid-spawn. Kill their QEMU
    /// (the process their pid file records, if it still runs as recorded)
    /// and delete them.
    pub async fn reap_orphans(&self) {
        let Ok(rd) = std::fs::read_dir(self.cfg.sandboxes_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(id) = e.file_name().into_string() else {
                continue;
            };
            if matches!(self.db.get(&id), Ok(Some(_))) {
                continue;
            }
            let paths = self.cfg.sandbox_paths(&id);
            if let Some(q) = crate::cleanup::recorded_qemu(&paths.dir).await {
                if process::is_our_qemu(&q) {
                    process::kill(q.pid, libc::SIGKILL);
                }
            }
            paths.remove_all();
            // (Retried until the killed QEMU is gone.)
            self.jail.release(&id);
        }
    }
}

/// The allocated bytes of every regular file directly in `dir` (a
/// snapshot's directory has no subdirectories).
fn allocated_in(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn on_disk_counts_allocated_bytes_of_every_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("manifest.fvs"), vec![1u8; 10_000]).unwrap();
        // A cache built later counts too; a sparse file only what it holds.
        std::fs::write(d.path().join("memory.head"), vec![2u8; 1 << 20]).unwrap();
        let f = std::fs::File::create(d.path().join("memory.img")).unwrap();
        f.set_len(64 << 20).unwrap();
        let n = super::allocated_in(d.path());
        assert!(n >= (1 << 20) + 10_000, "{n}");
        assert!(n < 4 << 20, "a sparse file counted its holes: {n}");
        assert_eq!(super::allocated_in(&d.path().join("missing")), 0);
    }
}
