//! The first half of a snapshot: everything that needs the source paused,
//! up to and including resuming it.
//!
//! This module is the frame every mode shares: take the sandbox's snapshot
//! lock, set the migration capabilities, create the new top disk layer,
//! stop the source, save its state, freeze the disk onto the new layer,
//! resume (or hold, for a pause), and build the manifest. What differs by
//! [`Save`] mode lives in one module each:
//!
//! * [`full`]: a stopped save; a source that owns its RAM file has it copied
//!   sparsely into `memory.img` (a `shared` snapshot);
//! * [`live`]: RAM copied while the guest runs, the state file on tmpfs;
//! * [`diff`]: device state only, plus the clone's private pages.
//!
//! [`Manager::freeze`] reads as its sequence of steps; each step is in
//! [`steps`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use forkvm_api::SnapshotTimings;
use forkvm_store::Manifest;

use crate::db::SnapshotRow;
use crate::error::EngineError;
use crate::manager::Manager;
use crate::snapshot::{Onto, Save};

pub mod diff;
pub mod full;
pub mod live;
mod steps;
mod thin;

/// A snapshot whose source has resumed but whose files are not published yet.
pub struct Frozen {
    pub staging: forkvm_store::Staging,
    pub manifest: Manifest,
    pub srow: SnapshotRow,
    pub timings: SnapshotTimings,
    pub t0: Instant,
    /// A diff's captured pages, reduced to the changed ones at publish.
    pub diff: Option<diff::DiffCapture>,
    /// A live save written to tmpfs, moved into the store at publish.
    pub live_tmp: Option<PathBuf>,
    /// How it was made, stored with its row (a branch sets the mode).
    pub info: crate::db::SnapshotInfo,
    /// Children are spawned from it at once (a branch with `count` > 0):
    /// publish starts their chain head alongside (`forkvm_store::head`).
    pub head_ahead: bool,
}

/// The file a disk node of a sandbox reads. Our node names say which file
/// each layer is: `root` is the disk the sandbox started with, `root-<layer>`
/// the overlay a freeze made; otherwise what QEMU reports, if it is a plain
/// file name.
pub fn node_file(
    paths: &crate::config::SandboxPaths,
    node: &str,
    reported: Option<String>,
) -> Option<PathBuf> {
    match node.strip_prefix("root-") {
        Some(l) if node != "root-file" => Some(paths.dir.join(format!("disk-{l}.qcow2"))),
        _ if node == "root" => Some(paths.disk.clone()),
        _ => reported.map(PathBuf::from),
    }
}

impl Manager {
    /// First half of a snapshot: everything that needs the source paused, up
    /// to and including resuming it.
    pub async fn freeze(
        self: &Arc<Self>,
        id: &str,
        tag: Option<String>,
        template_key: Option<String>,
        pool_size: Option<u32>,
        how: Save,
        onto: Onto,
    ) -> Result<Frozen, EngineError> {
        self.check_tag(tag.as_deref())?;
        let (live, row) = self.freeze_source(id)?;
        // One snapshot of a sandbox at a time: two would race on the disk chain.
        let _guard = live.op_lock.try_lock().map_err(|_| {
            EngineError::conflict(format!(
                "sandbox {id} is already being snapshotted; retry when it finishes"
            ))
        })?;
        let t0 = Instant::now();
        // Volumes come to rest first: nothing in flight between the guest
        // and the host directories at the instant saved (crate::volumes).
        // They resume when `vols` is dropped, on every path out of here.
        let vols = self.hold_volumes(id).await?;
        let mut plan = self.plan_freeze(&live, &row, how, onto)?;
        // The previous freeze's stream must end first (a job holds the top
        // node, and the chain this freeze sees is then one layer deep), and
        // the next one waits for this freeze to end.
        let _stream = self.disk_guard(&live).await;
        let qmp = self.prepare_migration(id, &plan).await?;
        let (staging, layer) = self.stage_layer(&qmp, &plan).await?;
        let paused = self
            .pause_and_save(id, &qmp, &live, &plan, &layer, staging)
            .await?;
        // A checkpoint's layer keeps only what changed since the previous
        // one, copied while the guest runs (and before the stream, which
        // waits for `_stream`, takes the frozen top out of the chain).
        if paused.incremental && !paused.hold {
            self.thin_layer(id, &qmp, &plan, &layer).await;
        }
        let steps::Paused {
            captured,
            staging,
            hold,
            timings,
            ..
        } = paused;
        self.save_volumes(id, vols.as_ref(), &staging, hold).await?;
        let manifest = self.build_manifest(id, tag.clone(), &row, &live, &plan, vols.as_ref())?;
        let diff = steps::pending_diff(id, &mut plan, captured).await;
        let parent = manifest.parent.as_ref().map(|p| p.id.clone());
        let srow = steps::snapshot_row(id, tag, &row, parent, &manifest, template_key, pool_size);
        let info = crate::db::SnapshotInfo {
            pause_ms: Some(timings.pause_ms),
            ..Default::default()
        };
        Ok(Frozen {
            info,
            staging,
            manifest,
            srow,
            timings,
            t0,
            diff,
            live_tmp: plan.live_tmp,
            head_ahead: false,
        })
    }
}
