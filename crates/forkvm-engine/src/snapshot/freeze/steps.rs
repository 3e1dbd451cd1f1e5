//! The steps of [`Manager::freeze`], in the order it takes them: find the
//! source, plan the save, set up QEMU's migration, stage the new top disk
//! layer, stop the source, save and freeze in the pause, resume (or hold),
//! then save the volumes and describe the snapshot.
//!
//! Each step that can fail after something was made undoes what it made
//! before it returns, so the caller only has to undo what later steps did.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::SnapshotTimings;
use forkvm_qemu::incremental::{self, Track};
use forkvm_qemu::ram::RamMapping;
use forkvm_qemu::{migrate, Qmp, QmpEvent};
use forkvm_store::{crash, Manifest, Staging};
use tokio::sync::broadcast;

use super::{diff, full, live, node_file};
use crate::config::SandboxPaths;
use crate::db::{Origin, SandboxRow, SnapshotRow};
use crate::error::EngineError;
use crate::manager::{Live, Manager};
use crate::snapshot::{
    pause_from_events, qemu_err, resume, store_err, Chain, Onto, Save, DEVICES_ONLY,
};
use crate::util::{self, ms};
use crate::volumes::VolumeHold;

/// What a freeze decided before it touches QEMU: the kind of save and
/// where its files go.
pub(super) struct Plan {
    pub(super) snap_id: String,
    live_mode: bool,
    /// The chain a clone's RAM maps; `None` for a sandbox that booted.
    chain: Option<Chain>,
    /// The snapshot the new one builds on: the one the sandbox started
    /// from, or (a checkpoint) the sandbox's previous checkpoint.
    pub(super) parent: Option<String>,
    /// The chain the new snapshot's pages are reduced against: the
    /// parent's. A checkpoint's parent is above `chain`, so the pages the
    /// links between them store are compared too ([`Plan::between`]).
    parent_chain: Option<Chain>,
    /// A checkpoint: the new top starts a record of the guest's writes
    /// (forkvm_qemu::incremental).
    checkpoint: bool,
    /// Devices only in the stream, the clone's pages read by the daemon.
    diff_mode: bool,
    /// The sandbox's RAM file is copied into the snapshot (`memory.img`).
    shared: bool,
    pub(super) paths: SandboxPaths,
    ram_bytes: u64,
    /// Where the clone's QEMU maps its RAM (a clone only).
    mapping: Option<RamMapping>,
    /// A live save's state file, on tmpfs.
    pub(super) live_tmp: Option<PathBuf>,
}

/// The new top disk layer, open in QEMU but not attached yet, and the
/// running top it freezes.
pub(super) struct Layer {
    /// The frozen layer's final path in the store (reserved).
    pub(super) final_disk: PathBuf,
    pub(super) top_node: String,
    /// The disk's virtual size.
    pub(super) vsize: u64,
    new_top: PathBuf,
    new_node: String,
}

/// When the source stopped, and whether the work in the pause succeeded.
struct Pause {
    t_stop: Instant,
    ok: bool,
}

/// A pause that succeeded: the source runs again (or is held, for a
/// pause of the sandbox), its state and frozen disk are staged.
pub(super) struct Paused {
    /// A diff's pages, read in the pause.
    pub captured: Option<diff::Captured>,
    pub staging: Staging,
    /// The source is kept stopped (crate::lifetime::pause).
    pub hold: bool,
    pub timings: SnapshotTimings,
    /// A checkpoint whose frozen top records the writes since the previous
    /// checkpoint: its layer can be thinned ([`Manager::thin_layer`]).
    pub incremental: bool,
}

impl Layer {
    /// Undo what is not frozen yet: the new layer (which QEMU may hold
    /// open, unattached) and then the reservation nothing names any more.
    fn unstage(&self, plan: &Plan, staging: &mut Staging) {
        let _ = std::fs::remove_file(&self.new_top);
        if let Some(t) = &plan.live_tmp {
            let _ = std::fs::remove_file(t);
        }
        staging.discard_layer();
    }
}

impl Plan {
    /// The pages to compare with the parent: those the clone wrote, and
    /// (a checkpoint, whose parent is not the snapshot the clone maps) every
    /// page on which the two views can differ: those stored by the links of
    /// either chain above their common part. The clone's RAM equals its own
    /// view where it wrote nothing, and the parent's view may hold other
    /// contents there: a checkpoint taken before a pause and resume, or a
    /// page the guest discarded, which reads from the mapped file again.
    /// `None` (compare every page) when the two chains share no base.
    fn between(&self, written: Option<Vec<u64>>) -> Option<Vec<u64>> {
        let mut written = written?;
        let (Some(mine), Some(theirs)) = (&self.chain, &self.parent_chain) else {
            return Some(written);
        };
        if mine.base.manifest.id != theirs.base.manifest.id {
            return None;
        }
        let common = mine
            .links
            .iter()
            .zip(&theirs.links)
            .take_while(|(a, b)| a.manifest.id == b.manifest.id)
            .count();
        for l in mine.links[common..].iter().chain(&theirs.links[common..]) {
            match forkvm_store::memdiff::MemDiff::open(&l.memory_diff_path()) {
                Ok(d) => written.extend(d.pages),
                // Unreadable: compare every page (publish fails on it anyway).
                Err(_) => return None,
            }
        }
        written.sort_unstable();
        written.dedup();
        Some(written)
    }

    /// The file QEMU writes a stopped save's device state to.
    fn state_file(&self) -> PathBuf {
        self.paths.dir.join(format!("{}.state", self.snap_id))
    }

    /// A failed attempt (a full disk, most likely) frees its files before
    /// the source resumes: on a full disk the guest's own disk writes fail
    /// too, and QEMU would stop the guest again (io-error) at once.
    fn discard_failed_save(&self, staging: Staging) {
        // A frozen layer stays where it is: the source's new top
        // names it (Staging's drop keeps a reserved layer).
        drop(staging);
        if let Some(t) = &self.live_tmp {
            let _ = std::fs::remove_file(t);
        }
        let _ = std::fs::remove_file(self.state_file());
    }
}

impl Manager {
    /// The running sandbox and its row: a freeze needs both.
    pub(super) fn freeze_source(&self, id: &str) -> Result<(Arc<Live>, SandboxRow), EngineError> {
        let live = self.running(id)?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        Ok((live, row))
    }

    /// Decide the kind of save from the sandbox's kind and the mode asked
    /// for, name the snapshot, and find a clone's RAM mapping.
    pub(super) fn plan_freeze(
        &self,
        live: &Live,
        row: &SandboxRow,
        how: Save,
        onto: Onto,
    ) -> Result<Plan, EngineError> {
        let snap_id = self.new_id("sn");
        let live_mode = how == Save::Live;
        // A clone's RAM is a private mapping of a chain's base image (or
        // head): its private pages are then exactly what it changed, and in
        // every mode its snapshot stores only those, over its parent. A
        // stopped save of a clone *is* a diff; a live one copies RAM while
        // the guest runs, and keeps only the changed pages at publish
        // (freeze::live::thin).
        let chain = self.clone_chain(row);
        // Devices only, the pages read by the daemon in the pause.
        let diff_mode = chain.is_some() && !live_mode;
        // A live snapshot copies RAM while the guest runs, so RAM travels in
        // the (mapped-ram) stream whatever the sandbox's kind.
        let shared = self.owns_ram(row) && !live_mode;
        let paths = live.paths.clone();
        let ram_bytes = u64::from(row.memory_mib) << 20;
        let mapping = match &chain {
            Some(c) => Some(diff::find_ram(live.pid, c, ram_bytes)?),
            None => None,
        };
        let live_tmp = live_mode.then(|| live::tmp_path(&paths, &snap_id));
        // A checkpoint builds on the previous one, which must be a link
        // above the chain the clone maps (crate::checkpoint).
        let checkpoint = matches!(onto, Onto::Checkpoint(_));
        let (parent, parent_chain) = match onto {
            Onto::Checkpoint(Some(p)) if chain.is_some() && live_mode => {
                let s = self.store.open_snapshot(&p).map_err(store_err)?;
                let pc = self.chain(&s)?;
                (Some(p), Some(pc))
            }
            Onto::Checkpoint(Some(p)) => {
                return Err(EngineError::internal(format!(
                    "a snapshot onto {p} needs a live save of a clone"
                )))
            }
            _ => (row.snapshot.clone(), chain.clone()),
        };
        Ok(Plan {
            snap_id,
            live_mode,
            chain,
            parent,
            parent_chain,
            checkpoint,
            diff_mode,
            shared,
            paths,
            ram_bytes,
            mapping,
            live_tmp,
        })
    }

    /// Reach the sandbox's QMP socket, let its disk settle, and set the
    /// migration capabilities (and a live save's parameters) for this save.
    pub(super) async fn prepare_migration(
        &self,
        id: &str,
        plan: &Plan,
    ) -> Result<Arc<Qmp>, EngineError> {
        let qmp = Qmp::connect(&plan.paths.qmp, Duration::from_secs(10))
            .await
            .map_err(|e| qemu_err("cannot reach the sandbox's QMP socket", e))?;
        self.settle_disk(&qmp, id).await?;
        migrate::set_capabilities(
            &qmp,
            &[
                ("x-ignore-shared", plan.shared),
                ("mapped-ram", plan.live_mode),
                // MIGRATION events wake the daemon when the save completes.
                ("events", true),
            ],
        )
        .await
        .map_err(|e| qemu_err("cannot set migration capabilities", e))?;
        if plan.live_mode {
            live::set_parameters(&qmp).await?;
        }
        Ok(qmp)
    }

    /// Begin the snapshot's staging directory, reserve the running top
    /// layer's final path in the store, and have QEMU open a new top layer
    /// over it (not attached yet). On failure nothing staged is left.
    pub(super) async fn stage_layer(
        &self,
        qmp: &Qmp,
        plan: &Plan,
    ) -> Result<(Staging, Layer), EngineError> {
        let (top_node, top_file, vsize) = migrate::top_disk(qmp)
            .await
            .map_err(|e| qemu_err("cannot find the disk", e))?;
        let top_file = node_file(&plan.paths, &top_node, top_file)
            .ok_or_else(|| {
                EngineError::internal(format!("cannot tell which file disk node {top_node} is"))
            })?
            .display()
            .to_string();
        let mut staging = self.store.begin(&plan.snap_id).map_err(store_err)?;
        crash::point("freeze.staged");
        // The layer about to be frozen gets its final path in the store
        // first, as a link to the running top: the new top's header names
        // that path, and a crash at any later point must find a file there
        // (forkvm_store::Store::reserve_layer, docs/snapshots.md).
        let final_disk = self
            .store
            .reserve_layer(&mut staging, std::path::Path::new(&top_file))
            .map_err(store_err)?;
        crash::point("freeze.layer_reserved");
        let layer_n = util::new_id("l");
        let layer = Layer {
            final_disk,
            top_node,
            vsize,
            new_top: plan.paths.dir.join(format!("disk-{layer_n}.qcow2")),
            new_node: format!("root-{layer_n}"),
        };
        match open_new_layer(qmp, plan, &layer, vsize).await {
            Ok(()) => Ok((staging, layer)),
            Err(e) => {
                layer.unstage(plan, &mut staging);
                Err(e)
            }
        }
    }
}

/// Create the new top layer, naming the frozen layer by its final path,
/// give it to QEMU's jail, create a live save's tmpfs file, and have QEMU
/// open the layer. The caller unstages on failure.
async fn open_new_layer(
    qmp: &Qmp,
    plan: &Plan,
    layer: &Layer,
    vsize: u64,
) -> Result<(), EngineError> {
    // The new top layer is created by us, naming the frozen layer by its
    // final path in the store, then opened by QEMU with no backing and
    // attached over the running top in the pause.
    forkvm_qemu::disk::create_overlay_unchecked(&layer.final_disk, "qcow2", &layer.new_top, vsize)
        .await
        .map_err(EngineError::internal)?;
    crate::jail::share_with_qemu(&plan.paths, &layer.new_top)
        .map_err(|e| EngineError::internal(format!("cannot give QEMU its new disk layer: {e}")))?;
    crash::point("freeze.overlay_created");

    if let Some(t) = &plan.live_tmp {
        live::create_tmp(&plan.paths, t, &layer.new_top)?;
    }
    // QEMU opens the new layer now, while the guest still runs: in the
    // pause only the block graph changes (see migrate::attach_overlay).
    migrate::add_overlay(qmp, &layer.new_top, &layer.new_node)
        .await
        .map_err(|e| qemu_err("cannot open the new disk layer", e))?;
    crash::point("freeze.overlay_opened");
    Ok(())
}

/// Stop the guest for a stopped save (a live one runs on: QEMU stops it
/// for the final copy). If it cannot be stopped, the new layer is closed
/// and unstaged: nothing was frozen.
async fn stop_source(
    qmp: &Qmp,
    plan: &Plan,
    layer: &Layer,
    staging: &mut Staging,
) -> Result<(), EngineError> {
    if !plan.live_mode {
        if let Err(e) = qmp.execute("stop", None).await {
            let _ = forkvm_qemu::blockjob::delete_node(qmp, &layer.new_node).await;
            layer.unstage(plan, staging);
            return Err(qemu_err("cannot pause the source", e));
        }
        crash::point("freeze.stopped");
    }
    Ok(())
}

/// Everything done while the source is stopped: save its state, freeze the
/// disk onto the new layer, finish reading a diff's pages and copy a
/// shared RAM file. `frozen` says whether the disk was frozen, also when
/// a later part fails. Answers a diff's pages, read in the pause.
async fn save_paused(
    qmp: &Qmp,
    plan: &Plan,
    layer: &Layer,
    staging: &Staging,
    timings: &mut SnapshotTimings,
    frozen: &mut bool,
) -> Result<Option<diff::Captured>, EngineError> {
    let capture = save_state(qmp, plan, staging, timings).await?;
    freeze_disk(qmp, layer, timings, frozen).await?;
    let mut captured = None;
    if let Some(c) = capture {
        captured = Some(diff::finish_capture(c, timings).await?);
        crash::point("freeze.pages_captured");
    }
    if plan.shared {
        full::copy_memory(&plan.paths, staging, timings).await?;
        crash::point("freeze.memory_copied");
    }
    Ok(captured)
}

/// The pages a diff reads while QEMU saves and freezes.
type CaptureTask = tokio::task::JoinHandle<std::io::Result<(diff::Captured, f64)>>;

/// Save the device state (and a live save's RAM), starting a diff's page
/// capture alongside, and move a stopped save's state file into staging.
async fn save_state(
    qmp: &Qmp,
    plan: &Plan,
    staging: &Staging,
    timings: &mut SnapshotTimings,
) -> Result<Option<CaptureTask>, EngineError> {
    let t = Instant::now();
    // QEMU writes only where its jail shows it: the sandbox's own
    // directory, from which the file moves into the staging one.
    let state_path = plan.live_tmp.clone().unwrap_or_else(|| plan.state_file());
    if plan.live_tmp.is_none() {
        crate::jail::share_with_qemu(&plan.paths, &state_path).map_err(|e| {
            EngineError::internal(format!("cannot create {}: {e}", state_path.display()))
        })?;
    }
    // A diff's pages are read while QEMU saves and freezes.
    let capture = plan
        .mapping
        .filter(|_| plan.diff_mode)
        .map(diff::start_capture);
    if capture.is_some() {
        diff::save_devices(qmp, &state_path, t, timings).await?;
    } else {
        migrate::save_state(qmp, &state_path)
            .await
            .map_err(|e| qemu_err("saving the device state failed", e))?;
        timings.save_state_ms = ms(t.elapsed());
    }
    crash::point("freeze.state_saved");
    if plan.live_tmp.is_none() {
        let dst = staging.path(forkvm_store::DEVICE_STATE);
        std::fs::rename(&state_path, &dst)
            .and_then(|_| crate::jail::take_back(&dst))
            .map_err(|e| {
                let _ = std::fs::remove_file(&state_path);
                EngineError::internal(format!("cannot move the device state: {e}"))
            })?;
        crash::point("freeze.state_moved");
    }
    Ok(capture)
}

/// Attach the new layer over the running top, so the guest writes to it
/// from now on, and make the frozen layer read-only.
async fn freeze_disk(
    qmp: &Qmp,
    layer: &Layer,
    timings: &mut SnapshotTimings,
    frozen: &mut bool,
) -> Result<(), EngineError> {
    let t = Instant::now();
    // The frozen layer is at its final path already (stage_layer reserved it),
    // so the source's chain is whole from this instant on.
    migrate::attach_overlay(qmp, &layer.top_node, &layer.new_node)
        .await
        .map_err(|e| qemu_err("freezing the disk failed", e))?;
    *frozen = true;
    // Read-only from now on, for everyone: a child's jailed QEMU
    // reads it whether or not the snapshot is ever published (a
    // later snapshot's layer may name it). Publication does the same.
    std::fs::set_permissions(&layer.final_disk, std::fs::Permissions::from_mode(0o444)).map_err(
        |e| EngineError::internal(format!("cannot make the frozen disk layer read-only: {e}")),
    )?;
    crash::point("freeze.disk_frozen");
    timings.freeze_disk_ms = ms(t.elapsed());
    Ok(())
}

impl Manager {
    /// Stop the source, do the work of the pause, and resume it (or hold
    /// it), whatever happened. On failure, what the pause made is freed
    /// before the source resumes, and the new layer after, unless the disk
    /// was frozen onto it.
    pub(super) async fn pause_and_save(
        self: &Arc<Self>,
        id: &str,
        qmp: &Qmp,
        live: &Live,
        plan: &Plan,
        layer: &Layer,
        mut staging: Staging,
    ) -> Result<Paused, EngineError> {
        let mut timings = SnapshotTimings::default();
        let t_stop = Instant::now();
        // Subscribe before `stop`, so the STOP and RESUME events are ours.
        let mut events = qmp.events();
        // The record of writes since the last checkpoint: started anew by
        // a checkpoint, carried over by any other freeze. The new top's
        // bitmap is made now, outside the pause: nothing writes to the
        // layer before it is attached.
        let since = live.tracked_since.lock().ok().and_then(|s| s.clone());
        let mut track = match (plan.checkpoint, &since) {
            (true, _) => Track::Start,
            (false, Some(_)) => Track::Carry,
            (false, None) => Track::Off,
        };
        let incremental = plan.checkpoint && since.is_some() && since == plan.parent;
        if track != Track::Off {
            if let Err(e) = incremental::start_record(qmp, &layer.new_node).await {
                tracing::warn!(sandbox = %id, "no record of sandbox {id}'s disk writes on its new layer ({e}): its next checkpoint stores its whole disk layer");
                track = Track::Off;
            }
        }
        stop_source(qmp, plan, layer, &mut staging).await?;
        // From here on the source must be resumed whatever happens. (A live
        // save runs while the guest does, and QEMU itself stops it for the
        // final copy; it is still stopped when the save completes, so the
        // disk can be frozen at exactly the instant the memory was.)
        let mut frozen = false;
        let paused = save_paused(qmp, plan, layer, &staging, &mut timings, &mut frozen).await;
        let paused = match paused {
            Ok(captured) => Ok((captured, staging)),
            Err(e) => {
                plan.discard_failed_save(staging);
                Err(e)
            }
        };
        let pause = Pause {
            t_stop,
            ok: paused.is_ok(),
        };
        let hold = self
            .resume_source(id, qmp, live, pause, &mut events, &mut timings)
            .await;
        if frozen {
            self.keep_record(id, qmp, live, plan, layer, track).await;
        }
        if frozen && !hold {
            self.record_top(id, plan, layer);
        }
        match paused {
            Ok((captured, staging)) => Ok(Paused {
                captured,
                staging,
                hold,
                timings,
                incremental,
            }),
            Err(e) => {
                self.undo_failed_pause(id, qmp, plan, layer, frozen).await;
                Err(e)
            }
        }
    }

    /// After a freeze, with the guest running again: carry the frozen top's
    /// record of writes over to the new top (it is final now), and note
    /// since which checkpoint the new top's record runs, if it has one.
    async fn keep_record(
        &self,
        id: &str,
        qmp: &Qmp,
        live: &Live,
        plan: &Plan,
        layer: &Layer,
        mut track: Track,
    ) {
        if track == Track::Carry {
            if let Err(e) = incremental::carry_record(qmp, &layer.top_node, &layer.new_node).await {
                tracing::warn!(sandbox = %id, "cannot carry sandbox {id}'s record of disk writes over ({e}): its next checkpoint stores its whole disk layer");
                track = Track::Off;
            }
        }
        if let Ok(mut s) = live.tracked_since.lock() {
            match track {
                Track::Start => *s = Some(plan.snap_id.clone()),
                Track::Carry => {}
                Track::Off => *s = None,
            }
        }
    }

    /// Resume the source, or keep it stopped for a pause that succeeded,
    /// and measure the pause. Answers whether it is held.
    async fn resume_source(
        &self,
        id: &str,
        qmp: &Qmp,
        live: &Live,
        pause: Pause,
        events: &mut broadcast::Receiver<QmpEvent>,
        timings: &mut SnapshotTimings,
    ) -> bool {
        // A pause (crate::lifetime::pause) keeps a saved guest stopped: QEMU
        // is about to go, and the guest must not run past its saved state.
        let hold = pause.ok && live.keep_stopped.load(std::sync::atomic::Ordering::SeqCst);
        if hold {
            timings.pause_ms = ms(pause.t_stop.elapsed());
            return hold;
        }
        let resumed = resume(qmp).await;
        // The pause as the VM saw it: QEMU's own timestamps of the STOP
        // and RESUME events, not our clock (which adds scheduling and QMP
        // round-trips). Fall back to our clock if an event is missing.
        timings.pause_ms = match pause_from_events(events).await {
            Some(us) => us as f64 / 1000.0,
            None => {
                // For a live save this clock also counts the precopy,
                // while the guest ran: an upper bound, said so.
                tracing::warn!(sandbox = %id, "no STOP/RESUME event pair from sandbox {id}'s QEMU; its pause_ms is the daemon's clock since the save began");
                ms(pause.t_stop.elapsed())
            }
        };
        if let Err(e) = resumed {
            tracing::error!("could not resume sandbox {id} after a snapshot: {e}");
        }
        crash::point("freeze.resumed");
        hold
    }

    /// Record the source's new top layer once it runs on it, and have the
    /// stream shorten its chain later.
    fn record_top(self: &Arc<Self>, id: &str, plan: &Plan, layer: &Layer) {
        // The guest writes to `new_top` now; GET reads the chain's depth
        // from it, and the stream pulls the frozen layers into it.
        if let Err(e) = crate::compact::set_top_layer(&plan.paths, &layer.new_top) {
            tracing::warn!(sandbox = %id, "cannot record sandbox {id}'s top disk layer: {e}");
        }
        crash::point("freeze.top_recorded");
        self.stream_disk_later(id, self.cfg.disk_chain_max as usize);
    }

    /// After a failed pause (the source has resumed): close and remove the
    /// new layer and the snapshot's directory, unless the disk was frozen.
    async fn undo_failed_pause(
        &self,
        id: &str,
        qmp: &Qmp,
        plan: &Plan,
        layer: &Layer,
        frozen: bool,
    ) {
        // If the disk was frozen, the source now writes to `new_top`,
        // whose header names the frozen layer's reserved path, which
        // stays (see Plan::discard_failed_save). Otherwise nothing names it.
        if !frozen {
            if let Err(e) = forkvm_qemu::blockjob::delete_node(qmp, &layer.new_node).await {
                let new_node = &layer.new_node;
                tracing::warn!(sandbox = %id, "cannot close the unused disk layer {new_node}: {e}");
            }
            let _ = std::fs::remove_file(&layer.new_top);
            std::fs::remove_dir_all(self.store.dir(&plan.snap_id)).ok();
        }
    }

    /// Save the volumes' journals (and `copy` trees) into staging.
    pub(super) async fn save_volumes(
        &self,
        id: &str,
        vols: Option<&VolumeHold>,
        staging: &Staging,
        hold: bool,
    ) -> Result<(), EngineError> {
        if let Some(v) = vols {
            // The guest runs again, but its volume I/O waits until the
            // journals (and `copy` trees) are saved.
            let t = Instant::now();
            v.save_into(
                staging.path(forkvm_store::VOLUMES_DIR),
                hold,
                self.disk_budget_bytes(),
            )
            .await?;
            crash::point("freeze.volumes_saved");
            tracing::debug!(sandbox = %id, ms = ms(t.elapsed()), "saved the volumes for a snapshot");
        }
        Ok(())
    }

    /// The snapshot's manifest: its artefacts, its parent (by digest) and
    /// the machine its restores must recreate.
    pub(super) fn build_manifest(
        &self,
        id: &str,
        tag: Option<String>,
        row: &SandboxRow,
        live: &Live,
        plan: &Plan,
        vols: Option<&VolumeHold>,
    ) -> Result<Manifest, EngineError> {
        let parent = match &plan.parent {
            Some(p) => {
                let ps = self.store.open_snapshot(p).map_err(store_err)?;
                Some(forkvm_store::ParentRef {
                    id: p.clone(),
                    manifest_sha256: ps.digest,
                })
            }
            None => None,
        };
        Ok(Manifest {
            id: plan.snap_id.clone(),
            tag,
            parent,
            created_at: util::now_rfc3339(),
            source: id.to_string(),
            image: row.image.clone(),
            qemu_version: self.qemu_version.clone(),
            // The machine the sandbox runs, which the snapshot's restores
            // must recreate (a clone of an old snapshot still has the
            // PIC/PIT, one from before volumes no volume port).
            machine: live.machine.clone(),
            base_image: self.cfg.image_rootfs(&row.image).display().to_string(),
            artefacts: artefacts(plan),
            ram_format: plan.live_mode.then(|| "mapped-ram".to_string()),
            state_format: plan.diff_mode.then(|| DEVICES_ONLY.to_string()),
            volumes: vols.map(|h| h.manifest_entries()),
            supersedes: Vec::new(),
        })
    }
}

/// The files the snapshot holds, by the kind of save.
fn artefacts(plan: &Plan) -> Vec<forkvm_store::Artefact> {
    let empty = |kind: &str, file: &str| forkvm_store::Artefact {
        kind: kind.into(),
        file: file.into(),
        size: 0,
        allocated: 0,
        sha256: String::new(),
    };
    let mut artefacts = vec![
        empty("device_state", forkvm_store::DEVICE_STATE),
        empty("disk", forkvm_store::DISK),
    ];
    if plan.shared && !plan.diff_mode {
        artefacts.push(full::memory_artefact());
    }
    if plan.chain.is_some() {
        artefacts.push(diff::artefact());
    }
    artefacts
}

/// A clone's changed pages as publish needs them: read in the pause, or
/// (a live save) listed now.
pub(super) async fn pending_diff(
    id: &str,
    plan: &mut Plan,
    captured: Option<diff::Captured>,
) -> Option<diff::DiffCapture> {
    // A live save of a clone: its changed pages are among those it holds
    // privately now, just resumed (a superset of those it had written
    // when the save ended). Asked now, so that publish needs nothing of
    // the source; their contents come from the saved file.
    let captured = match (captured, plan.mapping) {
        (None, Some(m)) if plan.live_mode => {
            let written = live::written_pages(id, m).await;
            Some(diff::Pending::Live(plan.between(written)))
        }
        (c, _) => c.map(diff::Pending::Read),
    };
    diff::capture(plan.parent_chain.take(), captured, plan.ram_bytes)
}

/// The snapshot's database row.
pub(super) fn snapshot_row(
    id: &str,
    tag: Option<String>,
    row: &SandboxRow,
    parent: Option<String>,
    manifest: &Manifest,
    template_key: Option<String>,
    pool_size: Option<u32>,
) -> SnapshotRow {
    SnapshotRow {
        id: manifest.id.clone(),
        tag,
        parent,
        source: id.to_string(),
        image: row.image.clone(),
        memory_mib: row.memory_mib,
        cpus: row.cpus,
        created_at: manifest.created_at.clone(),
        origin: if template_key.is_some() {
            Origin::Template
        } else {
            Origin::Snapshot
        },
        template_key,
        pool_size,
        pinned: false,
    }
}
