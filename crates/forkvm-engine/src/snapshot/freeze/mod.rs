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

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::SnapshotTimings;
use forkvm_qemu::{migrate, Qmp};
use forkvm_store::{crash, Manifest};

use crate::db::{Origin, SnapshotRow};
use crate::error::EngineError;
use crate::manager::Manager;
use crate::snapshot::{pause_from_events, qemu_err, resume, store_err, Save, DEVICES_ONLY};
use crate::util::{self, ms};

pub mod diff;
pub mod full;
pub mod live;

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
    ) -> Result<Frozen, EngineError> {
        self.check_tag(tag.as_deref())?;
        let live = self.running(id)?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
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
        let snap_id = self.new_id("sn");
        let live_mode = how == Save::Live;
        // A clone's RAM is a private mapping of a chain's base image (or
        // head): its private pages are then exactly what it changed, and in
        // every mode its snapshot stores only those, over its parent. A
        // stopped save of a clone *is* a diff; a live one copies RAM while
        // the guest runs, and keeps only the changed pages at publish
        // (freeze::live::thin).
        let chain = self.clone_chain(&row);
        // Devices only, the pages read by the daemon in the pause.
        let diff_mode = chain.is_some() && !live_mode;
        // A live snapshot copies RAM while the guest runs, so RAM travels in
        // the (mapped-ram) stream whatever the sandbox's kind.
        let shared = self.owns_ram(&row) && !live_mode;
        let paths = live.paths.clone();
        let ram_bytes = u64::from(row.memory_mib) << 20;
        let mapping = match &chain {
            Some(c) => Some(diff::find_ram(live.pid, c, ram_bytes)?),
            None => None,
        };
        let live_tmp = live_mode.then(|| live::tmp_path(&paths, &snap_id));
        // The previous freeze's stream must end first (a job holds the top
        // node, and the chain this freeze sees is then one layer deep), and
        // the next one waits for this freeze to end.
        let _stream = self.disk_guard(&live).await;
        let qmp = Qmp::connect(&paths.qmp, Duration::from_secs(10))
            .await
            .map_err(|e| qemu_err("cannot reach the sandbox's QMP socket", e))?;
        self.settle_disk(&qmp, id).await?;
        migrate::set_capabilities(
            &qmp,
            &[
                ("x-ignore-shared", shared),
                ("mapped-ram", live_mode),
                // MIGRATION events wake the daemon when the save completes.
                ("events", true),
            ],
        )
        .await
        .map_err(|e| qemu_err("cannot set migration capabilities", e))?;
        if live_mode {
            live::set_parameters(&qmp).await?;
        }
        let (top_node, top_file, vsize) = migrate::top_disk(&qmp)
            .await
            .map_err(|e| qemu_err("cannot find the disk", e))?;
        let top_file = node_file(&paths, &top_node, top_file)
            .ok_or_else(|| {
                EngineError::internal(format!("cannot tell which file disk node {top_node} is"))
            })?
            .display()
            .to_string();
        let mut staging = self.store.begin(&snap_id).map_err(store_err)?;
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
        let new_top = paths.dir.join(format!("disk-{layer_n}.qcow2"));
        // Undo what is not frozen yet: the new layer (which QEMU may hold
        // open, unattached) and then the reservation nothing names any more.
        let unstage = |staging: &mut forkvm_store::Staging| {
            let _ = std::fs::remove_file(&new_top);
            if let Some(t) = &live_tmp {
                let _ = std::fs::remove_file(t);
            }
            staging.discard_layer();
        };
        // The new top layer is created by us, naming the frozen layer by its
        // final path in the store, then opened by QEMU with no backing and
        // attached over the running top in the pause.
        let created =
            forkvm_qemu::disk::create_overlay_unchecked(&final_disk, "qcow2", &new_top, vsize)
                .await
                .map_err(EngineError::internal)
                .and_then(|()| {
                    crate::jail::share_with_qemu(&paths, &new_top).map_err(|e| {
                        EngineError::internal(format!("cannot give QEMU its new disk layer: {e}"))
                    })
                });
        if let Err(e) = created {
            unstage(&mut staging);
            return Err(e);
        }
        crash::point("freeze.overlay_created");

        if let Some(t) = &live_tmp {
            if let Err(e) = live::create_tmp(&paths, t, &new_top) {
                unstage(&mut staging);
                return Err(e);
            }
        }
        // QEMU opens the new layer now, while the guest still runs: in the
        // pause only the block graph changes (see migrate::attach_overlay).
        let new_node = format!("root-{layer_n}");
        if let Err(e) = migrate::add_overlay(&qmp, &new_top, &new_node).await {
            unstage(&mut staging);
            return Err(qemu_err("cannot open the new disk layer", e));
        }
        crash::point("freeze.overlay_opened");
        let mut timings = SnapshotTimings::default();
        let frozen = std::sync::atomic::AtomicBool::new(false);
        let t_stop = Instant::now();
        // Subscribe before `stop`, so the STOP and RESUME events are ours.
        let mut events = qmp.events();
        if !live_mode {
            if let Err(e) = qmp.execute("stop", None).await {
                let _ = forkvm_qemu::blockjob::delete_node(&qmp, &new_node).await;
                unstage(&mut staging);
                return Err(qemu_err("cannot pause the source", e));
            }
            crash::point("freeze.stopped");
        }
        // From here on the source must be resumed whatever happens. (A live
        // save runs while the guest does, and QEMU itself stops it for the
        // final copy; it is still stopped when the save completes, so the
        // disk can be frozen at exactly the instant the memory was.)
        let mut captured = None;
        let paused = async {
            let t = Instant::now();
            // QEMU writes only where its jail shows it: the sandbox's own
            // directory, from which the file moves into the staging one.
            let state_path = live_tmp
                .clone()
                .unwrap_or_else(|| paths.dir.join(format!("{snap_id}.state")));
            if live_tmp.is_none() {
                crate::jail::share_with_qemu(&paths, &state_path).map_err(|e| {
                    EngineError::internal(format!("cannot create {}: {e}", state_path.display()))
                })?;
            }
            // A diff's pages are read while QEMU saves and freezes.
            let capture = mapping.filter(|_| diff_mode).map(diff::start_capture);
            if capture.is_some() {
                diff::save_devices(&qmp, &state_path, t, &mut timings).await?;
            } else {
                migrate::save_state(&qmp, &state_path)
                    .await
                    .map_err(|e| qemu_err("saving the device state failed", e))?;
                timings.save_state_ms = ms(t.elapsed());
            }
            crash::point("freeze.state_saved");
            if live_tmp.is_none() {
                let dst = staging.path(forkvm_store::DEVICE_STATE);
                std::fs::rename(&state_path, &dst)
                    .and_then(|_| crate::jail::take_back(&dst))
                    .map_err(|e| {
                        let _ = std::fs::remove_file(&state_path);
                        EngineError::internal(format!("cannot move the device state: {e}"))
                    })?;
                crash::point("freeze.state_moved");
            }
            let t = Instant::now();
            // The frozen layer is at its final path already (reserved above),
            // so the source's chain is whole from this instant on.
            migrate::attach_overlay(&qmp, &top_node, &new_node)
                .await
                .map_err(|e| qemu_err("freezing the disk failed", e))?;
            frozen.store(true, std::sync::atomic::Ordering::SeqCst);
            // Read-only from now on, for everyone: a child's jailed QEMU
            // reads it whether or not the snapshot is ever published (a
            // later snapshot's layer may name it). Publication does the same.
            std::fs::set_permissions(&final_disk, std::fs::Permissions::from_mode(0o444)).map_err(
                |e| {
                    EngineError::internal(format!(
                        "cannot make the frozen disk layer read-only: {e}"
                    ))
                },
            )?;
            crash::point("freeze.disk_frozen");
            timings.freeze_disk_ms = ms(t.elapsed());
            if let Some(c) = capture {
                captured = Some(diff::finish_capture(c, &mut timings).await?);
                crash::point("freeze.pages_captured");
            }
            if shared {
                full::copy_memory(&paths, &staging, &mut timings).await?;
                crash::point("freeze.memory_copied");
            }
            Ok::<(), EngineError>(())
        }
        .await;
        // A failed attempt (a full disk, most likely) frees its files before
        // the source resumes: on a full disk the guest's own disk writes fail
        // too, and QEMU would stop the guest again (io-error) at once.
        let staging = match &paused {
            Ok(()) => Some(staging),
            Err(_) => {
                // A frozen layer stays where it is: the source's new top
                // names it (Staging's drop keeps a reserved layer).
                drop(staging);
                if let Some(t) = &live_tmp {
                    let _ = std::fs::remove_file(t);
                }
                let _ = std::fs::remove_file(paths.dir.join(format!("{snap_id}.state")));
                None
            }
        };
        // A pause (crate::lifetime::pause) keeps a saved guest stopped: QEMU
        // is about to go, and the guest must not run past its saved state.
        let hold = paused.is_ok() && live.keep_stopped.load(std::sync::atomic::Ordering::SeqCst);
        if hold {
            timings.pause_ms = ms(t_stop.elapsed());
        } else {
            let resumed = resume(&qmp).await;
            // The pause as the VM saw it: QEMU's own timestamps of the STOP
            // and RESUME events, not our clock (which adds scheduling and QMP
            // round-trips). Fall back to our clock if an event is missing.
            timings.pause_ms = match pause_from_events(&mut events).await {
                Some(us) => us as f64 / 1000.0,
                None => {
                    // For a live save this clock also counts the precopy,
                    // while the guest ran: an upper bound, said so.
                    tracing::warn!(sandbox = %id, "no STOP/RESUME event pair from sandbox {id}'s QEMU; its pause_ms is the daemon's clock since the save began");
                    ms(t_stop.elapsed())
                }
            };
            if let Err(e) = resumed {
                tracing::error!("could not resume sandbox {id} after a snapshot: {e}");
            }
            crash::point("freeze.resumed");
        }
        if frozen.load(std::sync::atomic::Ordering::SeqCst) && !hold {
            // The guest writes to `new_top` now; GET reads the chain's depth
            // from it, and the stream pulls the frozen layers into it.
            if let Err(e) = crate::compact::set_top_layer(&paths, &new_top) {
                tracing::warn!(sandbox = %id, "cannot record sandbox {id}'s top disk layer: {e}");
            }
            crash::point("freeze.top_recorded");
            self.stream_disk_later(id, self.cfg.disk_chain_max as usize);
        }
        if let Err(e) = paused {
            // If the disk was frozen, the source now writes to `new_top`,
            // whose header names the frozen layer's reserved path, which
            // stays (see above). Otherwise nothing names it.
            if !frozen.load(std::sync::atomic::Ordering::SeqCst) {
                if let Err(e) = forkvm_qemu::blockjob::delete_node(&qmp, &new_node).await {
                    tracing::warn!(sandbox = %id, "cannot close the unused disk layer {new_node}: {e}");
                }
                let _ = std::fs::remove_file(&new_top);
                std::fs::remove_dir_all(self.store.dir(&snap_id)).ok();
            }
            return Err(e);
        }
        let staging = staging
            .ok_or_else(|| EngineError::internal("the snapshot's staging directory vanished"))?;
        if let Some(v) = &vols {
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

        let mut artefacts = vec![
            forkvm_store::Artefact {
                kind: "device_state".into(),
                file: forkvm_store::DEVICE_STATE.into(),
                size: 0,
                allocated: 0,
                sha256: String::new(),
            },
            forkvm_store::Artefact {
                kind: "disk".into(),
                file: forkvm_store::DISK.into(),
                size: 0,
                allocated: 0,
                sha256: String::new(),
            },
        ];
        if shared && !diff_mode {
            artefacts.push(full::memory_artefact());
        }
        if chain.is_some() {
            artefacts.push(diff::artefact());
        }
        let (parent, parent_ref) = match &row.snapshot {
            Some(p) => {
                let ps = self.store.open_snapshot(p).map_err(store_err)?;
                (
                    Some(p.clone()),
                    Some(forkvm_store::ParentRef {
                        id: p.clone(),
                        manifest_sha256: ps.digest,
                    }),
                )
            }
            None => (None, None),
        };
        let manifest = Manifest {
            id: snap_id.clone(),
            tag: tag.clone(),
            parent: parent_ref,
            created_at: util::now_rfc3339(),
            source: id.to_string(),
            image: row.image.clone(),
            qemu_version: self.qemu_version.clone(),
            // The machine the sandbox runs, which the snapshot's restores
            // must recreate (a clone of an old snapshot still has the
            // PIC/PIT, one from before volumes no volume port).
            machine: live.machine.clone(),
            base_image: self.cfg.image_rootfs(&row.image).display().to_string(),
            artefacts,
            ram_format: live_mode.then(|| "mapped-ram".to_string()),
            state_format: diff_mode.then(|| DEVICES_ONLY.to_string()),
            volumes: vols.as_ref().map(|h| h.manifest_entries()),
        };
        // A live save of a clone: its changed pages are among those it holds
        // privately now, just resumed (a superset of those it had written
        // when the save ended). Asked now, so that publish needs nothing of
        // the source; their contents come from the saved file.
        let captured = match (captured, mapping) {
            (None, Some(m)) if live_mode => {
                Some(diff::Pending::Live(live::written_pages(id, m).await))
            }
            (c, _) => c.map(diff::Pending::Read),
        };
        let diff = diff::capture(chain, captured, ram_bytes);
        let srow = SnapshotRow {
            id: snap_id.clone(),
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
        };
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
            live_tmp,
            head_ahead: false,
        })
    }
}
