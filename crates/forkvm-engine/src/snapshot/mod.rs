//! Snapshots and spawning from them: templates, copy-on-write clones and the
//! warm pool.
//!
//! **Taking a snapshot** of a running sandbox (the source keeps running):
//!
//! ```text
//! stop ─▶ migrate device state to device.state ─▶ freeze the disk ─▶ copy RAM ─▶ cont
//!                                                                               │
//!                          hash every file, write the manifest, rename ◀────────┘
//! ```
//!
//! * RAM: a sandbox that owns its RAM file (`share=on`: booted, or spawned
//!   from a `stream` snapshot) is snapshotted with `x-ignore-shared`, so the
//!   migration stream holds only device state and the RAM file is copied
//!   sparsely into `memory.img`. That is a `shared` snapshot: its clones map
//!   `memory.img` copy-on-write and share every page they do not write.
//!   A clone of a `shared` or `diff` snapshot maps RAM privately, and QEMU
//!   can only skip *shared* RAM in a migration, so the daemon reads the
//!   pages the clone wrote itself: its snapshot, in every mode, is a `diff`
//!   holding only the pages that differ from its parent (a live one takes
//!   them out of QEMU's mapped-ram file, see `freeze::live::thin`).
//! * Disk: the running top qcow2 layer is frozen with `blockdev-snapshot`
//!   onto a new overlay we create (and QEMU opens) before the pause, whose header
//!   already names the frozen layer's final path in the store. The frozen file
//!   is hard-linked into the snapshot, so it outlives the source.
//!
//! **Spawning** starts QEMU with `-incoming defer` (or takes one from the warm
//! pool, where that start was paid earlier), loads the device state, resumes,
//! and gives the clone its own identity through the agent (RNG reseed, clock,
//! hostname, machine-id, instance id) before anything else can run in it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_qemu::Qmp;
use forkvm_store::{Manifest, Snapshot as StoredSnapshot, Store, StoreError};

use crate::db::SandboxRow;
/// A stored snapshot's record and where it came from, for front-ends that
/// show snapshots their own way.
pub use crate::db::{Origin, SnapshotRow};
use crate::error::{EngineError, ErrorKind, HintAction};
use crate::manager::Manager;
use crate::util;

pub mod flatten;
pub mod freeze;
pub mod head;
pub mod head_locks;
pub mod publish;
pub mod recover;
pub mod store;

/// How a snapshot saves the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Stop, save devices and RAM (copy the RAM file of a sandbox that owns
    /// it; a clone's changed pages, as [`Save::Diff`]), resume.
    Stopped,
    /// Copy RAM while the guest runs; stop only for the final pass. A
    /// clone's snapshot keeps only its changed pages of it.
    Live,
    /// Stop, save devices and the pages changed since the parent snapshot,
    /// resume. Needs a clone of a `shared` or `diff` snapshot; otherwise
    /// falls back to [`Save::Stopped`].
    Diff,
}

/// The `state_format` of device-only streams.
pub const DEVICES_ONLY: &str = "devices-only";
/// Longest diff chain a spawn follows before calling it corrupt.
pub const MAX_CHAIN: usize = 64;

/// A diff snapshot's chain: the base holding the memory image, then the diff
/// links from the one above the base down to the snapshot itself.
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

pub fn qemu_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::new(ErrorKind::QemuFailed, format!("{what}: {e}"))
}

/// `cont` after a save. QEMU reports a migration `completed` (event or
/// `query-migrate`) a moment before it leaves the `finish-migrate` run state,
/// and refuses `cont` in between ("Migration is not finalized yet"): retry
/// that for a while rather than leave the source paused.
pub async fn resume(qmp: &Qmp) -> Result<serde_json::Value, forkvm_qemu::QmpError> {
    let t = Instant::now();
    loop {
        match qmp.execute("cont", None).await {
            Err(e)
                if e.to_string().contains("not finalized")
                    && t.elapsed() < Duration::from_secs(30) =>
            {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            r => return r,
        }
    }
}

/// Microseconds between the STOP and the following RESUME event.
pub async fn pause_from_events(
    rx: &mut tokio::sync::broadcast::Receiver<forkvm_qemu::QmpEvent>,
) -> Option<u64> {
    use tokio::sync::broadcast::error::RecvError;
    let mut stop = None;
    loop {
        let ev = match tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .ok()?
        {
            Ok(ev) => ev,
            // A live save sends one MIGRATION_PASS event per precopy pass,
            // and a guest that keeps writing memory can take more passes
            // than the channel holds (325 were seen). The receiver then
            // skips to the oldest event still held; the STOP and RESUME of
            // the final pause come last, so they are among those. Giving
            // up here made the caller time the whole save as the pause.
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return None,
        };
        match ev.name.as_str() {
            "STOP" => stop = Some(ev.timestamp_us),
            "RESUME" => return stop.map(|s| ev.timestamp_us.saturating_sub(s)),
            _ => {}
        }
    }
}

/// Fresh random bytes from the host.
pub fn entropy(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b
}

pub fn hex_random(bytes: usize) -> String {
    entropy(bytes).iter().map(|x| format!("{x:02x}")).collect()
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
                    let p = self.store.open_snapshot(&pref.id).map_err(|e| match e {
                        StoreError::NotFound(_) => {
                            corrupt(&id, format!("its parent {} is missing", pref.id))
                        }
                        other => store_err(other),
                    })?;
                    if p.digest != pref.manifest_sha256 {
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

    /// Snapshot a running sandbox. The source keeps running.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        tag: Option<String>,
        template_key: Option<String>,
        how: Save,
    ) -> Result<forkvm_api::Snapshot, EngineError> {
        let r = async {
            self.check_disk(&format!("snapshot of sandbox {id}"))?;
            let f = self.freeze(id, tag, template_key, None, how).await?;
            self.publish_frozen(f).await
        }
        .await;
        let snap = r.inspect_err(|e| {
            tracing::warn!(sandbox = %id, code = e.code(), "snapshot of sandbox {id} failed: {}", e.message);
        })?;
        // It follows the daemon's default pool size, which may be > 0.
        self.refill_pool(&snap.id);
        Ok(snap)
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

#[cfg(test)]
mod pause_tests {
    use super::pause_from_events;
    use forkvm_qemu::QmpEvent;
    use tokio::sync::broadcast;

    fn ev(name: &str, t: u64) -> QmpEvent {
        QmpEvent {
            name: name.into(),
            data: serde_json::Value::Null,
            timestamp_us: t,
        }
    }

    #[tokio::test]
    async fn the_pause_is_found_after_more_passes_than_the_channel_holds() {
        let (tx, mut rx) = broadcast::channel(8);
        for i in 0..325 {
            tx.send(ev("MIGRATION_PASS", i)).unwrap();
        }
        tx.send(ev("STOP", 1_000)).unwrap();
        tx.send(ev("MIGRATION", 1_500)).unwrap();
        tx.send(ev("RESUME", 4_250)).unwrap();
        assert_eq!(pause_from_events(&mut rx).await, Some(3_250));
    }

    #[tokio::test]
    async fn no_stop_or_a_closed_channel_gives_none() {
        let (tx, mut rx) = broadcast::channel(8);
        tx.send(ev("RESUME", 10)).unwrap();
        assert_eq!(pause_from_events(&mut rx).await, None);
        let (tx, mut rx) = broadcast::channel(8);
        tx.send(ev("STOP", 10)).unwrap();
        drop(tx);
        assert_eq!(pause_from_events(&mut rx).await, None);
    }
}
