//! The snapshot catalog: the published snapshots' records (the db rows and
//! the store's manifests), their diff chains and flattened heads, their
//! verification, and the collection of disk layers nobody uses any more.
//! Reading and checking snapshots only: taking one is `crate::snapshot`,
//! removing one is `crate::teardown`. Every other service may use it; it
//! calls nothing above the manager.

pub mod head;
pub mod head_locks;
pub mod recover;
pub mod store;

use forkvm_store::{Manifest, Snapshot as StoredSnapshot, StoreError};

use crate::db::{SandboxRow, SnapshotRow};
use crate::error::{EngineError, ErrorKind, HintAction};
use crate::manager::Manager;
use crate::util;
use forkvm_store::Store;

/// Longest diff chain a spawn follows before calling it corrupt.
pub const MAX_CHAIN: usize = 64;

/// A diff snapshot's chain: the base holding the memory image, then the diff
/// links from the one above the base down to the snapshot itself.
#[derive(Clone)]
pub struct Chain {
    pub base: StoredSnapshot,
    pub links: Vec<StoredSnapshot>,
}

/// How a snapshot holds RAM: a separate image (`shared`), the pages changed
/// over its parent (`diff`), inside the migration stream (`stream`), or in
/// QEMU's mapped-ram layout written while the guest ran (`live`).
pub fn kind(m: &Manifest) -> &'static str {
    if m.artefact("memory").is_some() {
        "shared"
    } else if m.artefact("memory_diff").is_some() {
        "diff"
    } else if m.ram_format.as_deref() == Some("mapped-ram") {
        "live"
    } else {
        "stream"
    }
}

pub fn store_err(e: StoreError) -> EngineError {
    match e {
        StoreError::NotFound(id) => {
            EngineError::not_found(format!("no snapshot {id:?}")).hint(HintAction::ListSnapshots)
        }
        StoreError::Corrupt { .. } => EngineError::new(ErrorKind::SnapshotCorrupt, e.to_string()),
        StoreError::Io { .. } => {
            EngineError::internal(format!("{e}; check free space and permissions"))
        }
    }
}

impl Manager {
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Does this sandbox own its RAM file (`share=on`)? Booted sandboxes
    /// and clones of `stream`/`live` snapshots do; clones of `shared` and
    /// `diff` snapshots map an image privately (the base, or the flattened head).
    pub fn owns_ram(&self, row: &SandboxRow) -> bool {
        match &row.snapshot {
            None => true,
            Some(s) => self
                .store
                .open_snapshot(s)
                .map(|snap| matches!(kind(&snap.manifest), "stream" | "live"))
                .unwrap_or(false),
        }
    }

    /// Follow a `shared` or `diff` snapshot to its base. Each link's parent
    /// is checked by its manifest digest (a few KiB), never by re-reading
    /// the base's memory.
    pub fn chain(&self, snap: &StoredSnapshot) -> Result<Chain, EngineError> {
        let corrupt = |id: &str, why: String| {
            store_err(StoreError::Corrupt {
                id: id.to_string(),
                why,
            })
        };
        let mut links = Vec::new();
        let mut cur = snap.clone();
        let mut reread = false;
        loop {
            match kind(&cur.manifest) {
                "shared" => {
                    links.reverse();
                    return Ok(Chain { base: cur, links });
                }
                "diff" => {
                    let pref = cur.manifest.parent.clone().ok_or_else(|| {
                        corrupt(&cur.manifest.id, "a diff snapshot without a parent".into())
                    })?;
                    let id = cur.manifest.id.clone();
                    links.push(cur);
                    if links.len() > MAX_CHAIN {
                        return Err(corrupt(&id, format!("its chain is over {MAX_CHAIN} links")));
                    }
                    let p = match self.store.open_snapshot(&pref.id) {
                        Ok(p) => p,
                        // Its parent was spliced out of the chain since this
                        // link was read (crate::checkpoint::prune): read the
                        // link again, which names its new parent, once.
                        Err(StoreError::NotFound(_)) if !reread => {
                            reread = true;
                            let again = links.pop().expect("just pushed");
                            cur = self
                                .store
                                .open_snapshot(&again.manifest.id)
                                .map_err(store_err)?;
                            if cur.manifest.parent.as_ref().map(|p| &p.id) != Some(&pref.id) {
                                continue;
                            }
                            return Err(corrupt(&id, format!("its parent {} is missing", pref.id)));
                        }
                        Err(StoreError::NotFound(_)) => {
                            return Err(corrupt(&id, format!("its parent {} is missing", pref.id)))
                        }
                        Err(other) => return Err(store_err(other)),
                    };
                    if !p.answers_to(&pref.manifest_sha256) {
                        return Err(corrupt(
                            &id,
                            format!("its parent {} changed after it was taken", pref.id),
                        ));
                    }
                    cur = p;
                }
                other => {
                    return Err(corrupt(
                        &snap.manifest.id,
                        format!("its chain reaches a {other} snapshot, which has no memory image"),
                    ))
                }
            }
        }
    }

    /// Verify every file of a chain (cached: see forkvm-store).
    pub async fn verify_chain(&self, c: &Chain) -> Result<(), EngineError> {
        let store = self.store.clone();
        let all: Vec<StoredSnapshot> = std::iter::once(c.base.clone())
            .chain(c.links.iter().cloned())
            .collect();
        tokio::task::spawn_blocking(move || all.iter().try_for_each(|s| store.verify(s)))
            .await
            .map_err(|e| EngineError::internal(e.to_string()))?
            .map_err(store_err)
    }

    /// The chain a clone maps, if it is a private clone of a `shared` or
    /// `diff` snapshot.
    pub fn clone_chain(&self, row: &SandboxRow) -> Option<Chain> {
        let s = self.store.open_snapshot(row.snapshot.as_ref()?).ok()?;
        if !matches!(kind(&s.manifest), "shared" | "diff") {
            return None;
        }
        self.chain(&s).ok()
    }

    /// The index rows of the snapshot a sandbox runs from and of its
    /// parents, nearest first (by the index, without opening the store).
    pub fn ancestry(&self, row: &SandboxRow) -> Vec<crate::db::SnapshotRow> {
        let mut out: Vec<crate::db::SnapshotRow> = Vec::new();
        let mut cur = row.snapshot.clone();
        while let Some(id) = cur {
            if out.len() > 4096 || out.iter().any(|s| s.id == id) {
                break;
            }
            let Ok(Some(s)) = self.db.snapshot(&id) else {
                break;
            };
            cur = s.parent.clone();
            out.push(s);
        }
        out
    }

    /// A new snapshot's tag must be valid and unused.
    pub fn check_tag(&self, tag: Option<&str>) -> Result<(), EngineError> {
        if let Some(t) = tag {
            if !util::valid_id(t) || t.starts_with("sn-") {
                return Err(EngineError::invalid(format!(
                    "tag {t:?} is not valid: use letters, digits, '-' and '_', not starting with sn-"
                )));
            }
            // `POST /v1/snapshots/prune` and `…/pull` would shadow it.
            if t == "prune" || t == "pull" {
                return Err(EngineError::invalid(format!(
                    "the tag {t:?} is reserved (POST /v1/snapshots/{t}); choose another"
                )));
            }
            if self.db.snapshot(t)?.is_some() {
                return Err(EngineError::conflict(format!(
                    "tag {t:?} is already used by another snapshot"
                )));
            }
        }
        Ok(())
    }
}

impl Manager {
    /// The warm-pool size in effect for a snapshot: its own, or the
    /// daemon's default.
    pub fn pool_size_of(&self, row: &SnapshotRow) -> u32 {
        row.pool_size.unwrap_or(self.default_pool_size)
    }
}
