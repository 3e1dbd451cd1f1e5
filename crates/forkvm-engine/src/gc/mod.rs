//! Garbage collection of branch points.
//!
//! Every `branch` publishes a snapshot, and a `live` or `full` one holds a
//! memory image as large as the guest's RAM. A tree search branches often and
//! keeps few of them, so the branch points that nothing needs any more are
//! collected:
//!
//! ```text
//!   background, every --gc-interval (and after a sandbox is removed)
//!   POST /v1/snapshots/prune  (forkvm snapshot prune [--all] [--dry-run])
//!        │
//!        ▼
//!   facts from the index: parents, origins, tags, pins, sandboxes, warm
//!   pools, leases of operations in flight, parents of snapshots being written
//!        │  select::select (pure: roots, reachability, grace)
//!        ▼
//!   for each chosen snapshot, children first:
//!     doom it (refused while an operation holds a lease on it)
//!     ─▶ Manager::remove_snapshot(id, force = false), the code of `snapshot rm`
//!     ─▶ log at info with the bytes freed (a failure at warn)
//! ```
//!
//! Only snapshots made by a branch are ever taken; the ones taken with
//! `snapshot`, boot templates, flattened ones and any made before the daemon
//! recorded origins are roots. See docs/gc.md.
//!
//! **Leases** close the window between an operation choosing a snapshot and
//! the row that makes it a root: a spawn reads a snapshot's files before its
//! sandbox row exists, and a branch spawns its children after its snapshot
//! is indexed. Such an operation holds a lease on the snapshot; the
//! collector removes a snapshot only after dooming it, which a lease
//! prevents, and a lease cannot be taken on a doomed snapshot (409).

pub mod layers;
pub mod select;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use forkvm_api::{PruneFailure, PruneRequest, PruneResult, PrunedSnapshot};

use crate::db::Origin;
use crate::error::EngineError;
use crate::manager::Manager;
use crate::util;

/// A file of a snapshot: its allocated bytes, and whether the store's link
/// is its only one (deleting a hard-linked file frees nothing).
struct FileUse {
    path: PathBuf,
    allocated: u64,
    sole: bool,
}

fn files_of(dir: &Path) -> Vec<FileUse> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok().filter(|m| m.is_file())?;
            Some(FileUse {
                path: e.path(),
                allocated: m.blocks() * 512,
                sole: m.nlink() == 1,
            })
        })
        .collect()
}

/// The bytes the files that are gone gave back.
fn freed(before: &[FileUse]) -> u64 {
    before
        .iter()
        .filter(|f| f.sole && !f.path.exists())
        .map(|f| f.allocated)
        .sum()
}

/// What removing a snapshot surely gives back: everything but its disk
/// layer, which stays while some disk chain goes through it.
fn estimate(before: &[FileUse]) -> u64 {
    before
        .iter()
        .filter(|f| f.sole && !f.path.ends_with(forkvm_store::DISK))
        .map(|f| f.allocated)
        .sum()
}

impl Manager {
    /// The collector's settings, as `GET /v1/info` shows them.
    pub fn gc_info(&self) -> forkvm_api::GcInfo {
        forkvm_api::GcInfo {
            enabled: self.cfg.gc_interval.is_some(),
            grace_secs: self.cfg.gc_grace.as_secs(),
            interval_secs: self.cfg.gc_interval.map_or(0, |d| d.as_secs()),
        }
    }

    /// Pin (or unpin) a snapshot: a pinned snapshot, and every ancestor of
    /// it, is never collected.
    pub fn set_pinned(
        &self,
        id_or_tag: &str,
        pinned: bool,
    ) -> Result<forkvm_api::Snapshot, EngineError> {
        if let Some(p) = self.pending.get(id_or_tag) {
            return Err(EngineError::conflict(if p.state == "writing" {
                format!(
                    "snapshot {} is still being written; pin it once it is ready, or give the branch a tag",
                    p.id
                )
            } else {
                format!(
                    "snapshot {} failed ({}); there is nothing to pin",
                    p.id,
                    p.failure.unwrap_or_default()
                )
            }));
        }
        let row = self.snapshot_row(id_or_tag)?;
        // Not while the collector removes it: one or the other wins.
        let _lease = self.gc_lease(&row.id)?;
        self.db.set_pinned(&row.id, pinned)?;
        tracing::info!(
            "snapshot {} {}",
            row.id,
            if pinned { "pinned" } else { "unpinned" }
        );
        self.snapshot_view(&self.snapshot_row(&row.id)?)
    }

    /// `POST /v1/snapshots/prune`: collect now, with the daemon's grace
    /// period, or none with `all`.
    pub async fn prune(self: &Arc<Self>, req: PruneRequest) -> Result<PruneResult, EngineError> {
        let grace = if req.all == Some(true) {
            Duration::ZERO
        } else {
            self.cfg.gc_grace
        };
        self.collect_snapshots(grace, req.dry_run == Some(true))
            .await
    }

    /// What the selection needs to know of every indexed snapshot.
    fn gc_facts(&self) -> Result<Vec<select::Facts>, EngineError> {
        let rows = self.db.snapshots()?;
        let users = self.db.sandboxes_per_snapshot()?;
        let leased = self.gc.leases.held();
        // A snapshot being written is not indexed yet; its parent is.
        let writing: HashSet<String> = self
            .pending
            .all()
            .into_iter()
            .filter(|p| p.state == "writing")
            .filter_map(|p| p.parent)
            .collect();
        Ok(rows
            .iter()
            .map(|r| select::Facts {
                id: r.id.clone(),
                parent: r.parent.clone(),
                created: util::parse_rfc3339(&r.created_at),
                // A checkpoint is its timeline's to prune while its
                // sandbox lives, and collected like a branch point after.
                branch: r.origin == Origin::Branch
                    || (r.origin == Origin::Checkpoint
                        && matches!(self.db.get(&r.source), Ok(None))),
                tagged: r.tag.is_some(),
                pinned: r.pinned,
                in_use: users.contains_key(&r.id)
                    || leased.contains(&r.id)
                    || writing.contains(&r.id)
                    || self.pool_size_of(r) > 0
                    || self.pools.ready_count(&r.id) > 0,
            })
            .collect())
    }

    /// One collection: choose, then remove (or in a dry run, only list)
    /// the branch points nothing needs that are older than `grace`.
    pub async fn collect_snapshots(
        self: &Arc<Self>,
        grace: Duration,
        dry_run: bool,
    ) -> Result<PruneResult, EngineError> {
        let _one = self.gc.running.lock().await;
        let chosen = select::select(&self.gc_facts()?, SystemTime::now(), grace);
        let mut out = PruneResult {
            dry_run,
            grace_secs: grace.as_secs(),
            snapshots: Vec::new(),
            freed_bytes: 0,
            failed: Vec::new(),
        };
        for id in chosen {
            let Some(row) = self.db.snapshot(&id)? else {
                continue; // removed meanwhile
            };
            let files = files_of(&self.store.dir(&id));
            let mut entry = PrunedSnapshot {
                id: id.clone(),
                kind: self.store.open_snapshot(&id).map_or_else(
                    |_| "unknown".into(),
                    |s| crate::snapshot::kind(&s.manifest).into(),
                ),
                parent: row.parent.clone(),
                created_at: row.created_at.clone(),
                bytes: estimate(&files),
            };
            if dry_run {
                out.freed_bytes += entry.bytes;
                out.snapshots.push(entry);
                continue;
            }
            let Some(_doom) = self.gc.leases.doom(&id) else {
                tracing::debug!("garbage collection: snapshot {id} is held by an operation; kept");
                continue;
            };
            // Pinned since it was chosen (a pin holds a lease while it
            // writes, so this read sees it).
            if !matches!(self.db.snapshot(&id)?, Some(r) if !r.pinned) {
                continue;
            }
            match self.remove_snapshot(&id, false).await {
                Ok(()) => {
                    entry.bytes = freed(&files);
                    tracing::info!(
                        snapshot = %id,
                        freed_bytes = entry.bytes,
                        "garbage collection removed snapshot {id} (an unneeded branch point): freed {} bytes",
                        entry.bytes
                    );
                    out.freed_bytes += entry.bytes;
                    out.snapshots.push(entry);
                }
                // Something started using it after it was chosen: a
                // sandbox, or a snapshot of one. It stays; that is no error.
                Err(e) if e.kind == crate::error::ErrorKind::Conflict => {
                    tracing::debug!("garbage collection: snapshot {id} kept: {}", e.message);
                }
                Err(e) if e.kind == crate::error::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(
                        snapshot = %id,
                        "garbage collection could not remove snapshot {id}: {}",
                        e.message
                    );
                    out.failed.push(PruneFailure {
                        id,
                        message: e.message,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Collect in the background: at start, then every `gc_interval` and
    /// whenever a sandbox goes, with the configured grace period. Off when
    /// no interval is set.
    pub fn start_gc(self: &Arc<Self>) {
        let Some(every) = self.cfg.gc_interval else {
            tracing::info!("garbage collection of branch points is off (--gc-interval 0)");
            return;
        };
        tracing::info!(
            "garbage collection of branch points every {} s, grace {} s",
            every.as_secs(),
            self.cfg.gc_grace.as_secs()
        );
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                match me.collect_snapshots(me.cfg.gc_grace, false).await {
                    Ok(r) if !r.snapshots.is_empty() => tracing::info!(
                        "garbage collection removed {} snapshots, {} bytes",
                        r.snapshots.len(),
                        r.freed_bytes
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("garbage collection failed: {}", e.message),
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = me.gc.wake.notified() => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Leases;

    #[test]
    fn leases_and_dooms_exclude_each_other() {
        let l = Leases::default();
        let a = l.try_lease("sn-a").unwrap();
        let a2 = l.try_lease("sn-a").unwrap();
        assert!(
            l.doom("sn-a").is_none(),
            "a leased snapshot cannot be doomed"
        );
        drop(a);
        assert!(l.doom("sn-a").is_none(), "one lease is still held");
        drop(a2);
        assert!(l.held().is_empty());
        let d = l.doom("sn-a").unwrap();
        assert!(
            l.try_lease("sn-a").is_none(),
            "a doomed snapshot cannot be leased"
        );
        assert!(l.doom("sn-a").is_none(), "nor doomed twice");
        assert!(l.try_lease("sn-b").is_some(), "others are unaffected");
        drop(d);
        assert!(l.try_lease("sn-a").is_some());
    }

    #[test]
    fn freed_bytes_count_only_files_gone_with_their_last_link() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("sn-x");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join(forkvm_store::MEMORY), vec![1u8; 64 << 10]).unwrap();
        std::fs::write(d.join(forkvm_store::DEVICE_STATE), vec![3u8; 16 << 10]).unwrap();
        std::fs::write(d.join(forkvm_store::DISK), vec![2u8; 32 << 10]).unwrap();
        // A second link elsewhere, as a source's frozen disk layer has.
        std::fs::hard_link(d.join(forkvm_store::DISK), dir.path().join("top.qcow2")).unwrap();
        let before = files_of(&d);
        assert_eq!(before.len(), 3);
        let size = |name: &str| {
            before
                .iter()
                .find(|f| f.path.ends_with(name))
                .unwrap()
                .allocated
        };
        let (mem, dev) = (size(forkvm_store::MEMORY), size(forkvm_store::DEVICE_STATE));
        assert!(mem >= 64 << 10 && dev >= 16 << 10, "allocated {mem} {dev}");
        // The estimate leaves the disk layer out.
        assert_eq!(estimate(&before), mem + dev);
        std::fs::remove_file(d.join(forkvm_store::MEMORY)).unwrap();
        std::fs::remove_file(d.join(forkvm_store::DISK)).unwrap();
        // Only memory.img counts: the disk file lives on through its other
        // link, and device.state is still there.
        assert_eq!(freed(&before), mem);
    }
}
