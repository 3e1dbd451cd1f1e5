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
//!   A clone of a `shared` snapshot maps RAM privately, and QEMU can only skip
//!   *shared* RAM in a migration, so its own snapshot carries RAM inside the
//!   migration stream: a `stream` snapshot, whose clones load RAM privately.
//! * Disk: the running top qcow2 layer is frozen with `blockdev-snapshot-sync`
//!   in `existing` mode onto a new overlay we create first, whose header
//!   already names the frozen layer's final path in the store. The frozen file
//!   is hard-linked into the snapshot, so it outlives the source.
//!
//! **Spawning** starts QEMU with `-incoming defer` (or takes one from the warm
//! pool, where that start was paid earlier), loads the device state, resumes,
//! and gives the clone its own identity through the agent (RNG reseed, clock,
//! hostname, machine-id, instance id) before anything else can run in it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use forkvm_api::{codes, Sandbox, SandboxState, SnapshotSizes, SnapshotTimings, SpawnTimings};
use forkvm_qemu::process::{self, Launched};
use forkvm_qemu::{migrate, MachineSpec, MemoryBackend, Qmp};
use forkvm_store::{MachineInfo, Manifest, Snapshot as StoredSnapshot, Store, StoreError};

use crate::agent::{self, AgentError};
use crate::db::{Origin, SandboxRow, SnapshotRow};
use crate::error::ApiError;
use crate::manager::{Manager, Phase, Prepared, Waiter, MAX_POOL};
use crate::util::{self, ms};

/// A snapshot whose source has resumed but whose files are not published yet.
pub struct Frozen {
    staging: forkvm_store::Staging,
    manifest: Manifest,
    pub srow: SnapshotRow,
    pub timings: SnapshotTimings,
    t0: Instant,
    top_file: PathBuf,
    final_disk: PathBuf,
    /// A diff's captured pages, reduced to the changed ones at publish.
    diff: Option<DiffCapture>,
    /// A live save written to tmpfs, moved into the store at publish.
    live_tmp: Option<PathBuf>,
}

/// The private pages of a clone, read while it was stopped.
struct DiffCapture {
    ram_bytes: u64,
    pages: Vec<u64>,
    data: Vec<u8>,
    /// The view the clone started from: its snapshot's chain.
    base: PathBuf,
    /// The base's device state: an ordinary stream, naming the machine.
    base_state: PathBuf,
    links: Vec<PathBuf>,
}

/// How a snapshot saves the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Stop, save devices and all RAM (copy the RAM file of a sandbox that
    /// owns it, or stream RAM from a clone), resume.
    Stopped,
    /// Copy RAM while the guest runs; stop only for the final pass.
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

fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound(id) => ApiError::not_found(format!(
            "no snapshot {id:?}; list snapshots with `forkvm snapshot ls`"
        )),
        StoreError::Corrupt { .. } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::SNAPSHOT_CORRUPT,
            e.to_string(),
        ),
        StoreError::Io { .. } => {
            ApiError::internal(format!("{e}; check free space and permissions"))
        }
    }
}

fn qemu_err(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::QEMU_FAILED,
        format!("{what}: {e}"),
    )
}

/// `cont` after a save. QEMU reports a migration `completed` (event or
/// `query-migrate`) a moment before it leaves the `finish-migrate` run state,
/// and refuses `cont` in between ("Migration is not finalized yet"): retry
/// that for a while rather than leave the source paused.
async fn resume(qmp: &Qmp) -> Result<serde_json::Value, forkvm_qemu::QmpError> {
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
async fn pause_from_events(
    rx: &mut tokio::sync::broadcast::Receiver<forkvm_qemu::QmpEvent>,
) -> Option<u64> {
    let mut stop = None;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .ok()?
            .ok()?;
        match ev.name.as_str() {
            "STOP" => stop = Some(ev.timestamp_us),
            "RESUME" => return stop.map(|s| ev.timestamp_us.saturating_sub(s)),
            _ => {}
        }
    }
}

/// Fresh random bytes from the host.
fn entropy(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b
}

fn hex_random(bytes: usize) -> String {
    entropy(bytes).iter().map(|x| format!("{x:02x}")).collect()
}

/// The key of an image's boot template: the image, the machine shape and the
/// identity (size and mtime) of every boot artefact, so that rebuilding the
/// kernel, initramfs or image makes a new template instead of reusing one
/// that no longer matches.
pub fn template_key(m: &Manager, boot: &crate::images::BootReq) -> String {
    use std::os::unix::fs::MetadataExt;
    let (image, memory_mib, cpus) = (boot.image.as_str(), boot.memory_mib, boot.cpus);
    // Whether sandboxes get a NIC is part of the machine: a template made
    // without one cannot give its clones a network. The disk size and the
    // image's metadata (its start command) shape the template too.
    let mut s = format!(
        "{image}|{memory_mib}|{cpus}|{}|nic={}|disk={:?}",
        m.accel.accel,
        m.net.available(),
        boot.disk_size
    );
    for p in [
        m.cfg.kernel(),
        m.cfg.initrd(),
        m.cfg.image_rootfs(image),
        m.cfg.images_dir().join(image).join("image.json"),
    ] {
        let (len, mtime) = std::fs::metadata(&p)
            .map(|md| (md.len(), md.mtime_nsec() + md.mtime() * 1_000_000_000))
            .unwrap_or((0, 0));
        s.push_str(&format!("|{len}:{mtime}"));
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{image}-{memory_mib}m-{cpus}c-{h:016x}")
}

impl Manager {
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Does this sandbox own its RAM file (`share=on`)? Booted sandboxes
    /// and clones of `stream`/`live` snapshots do; clones of `shared` and
    /// `diff` snapshots map their base image privately.
    fn owns_ram(&self, row: &SandboxRow) -> bool {
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
    pub fn chain(&self, snap: &StoredSnapshot) -> Result<Chain, ApiError> {
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
    async fn verify_chain(&self, c: &Chain) -> Result<(), ApiError> {
        let store = self.store.clone();
        let all: Vec<StoredSnapshot> = std::iter::once(c.base.clone())
            .chain(c.links.iter().cloned())
            .collect();
        tokio::task::spawn_blocking(move || all.iter().try_for_each(|s| store.verify(s)))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(store_err)
    }

    /// The chain a clone maps, if it is a private clone of a `shared` or
    /// `diff` snapshot.
    fn clone_chain(&self, row: &SandboxRow) -> Option<Chain> {
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
    ) -> Result<forkvm_api::Snapshot, ApiError> {
        let r = async {
            let f = self.freeze(id, tag, template_key, None, how).await?;
            self.publish_frozen(f).await
        }
        .await;
        let snap = r.inspect_err(|e| {
            tracing::warn!(sandbox = %id, code = e.code, "snapshot of sandbox {id} failed: {}", e.message);
        })?;
        // It follows the daemon's default pool size, which may be > 0.
        self.refill_pool(&snap.id);
        Ok(snap)
    }

    /// First half of a snapshot: everything that needs the source paused, up
    /// to and including resuming it.
    pub(crate) async fn freeze(
        self: &Arc<Self>,
        id: &str,
        tag: Option<String>,
        template_key: Option<String>,
        pool_size: Option<u32>,
        how: Save,
    ) -> Result<Frozen, ApiError> {
        self.check_tag(tag.as_deref())?;
        let live = self.running(id)?;
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        // One snapshot of a sandbox at a time: two would race on the disk chain.
        let _guard = live.op_lock.try_lock().map_err(|_| {
            ApiError::conflict(format!(
                "sandbox {id} is already being snapshotted; retry when it finishes"
            ))
        })?;
        let t0 = Instant::now();
        // The devices of the running QEMU, which the snapshot's restores
        // must recreate (a clone of an old snapshot still has the PIC/PIT).
        let machine = forkvm_qemu::process::machine_arg(live.pid).ok_or_else(|| {
            ApiError::internal(format!(
                "cannot read the machine options of sandbox {id}'s QEMU (pid {}); is it still running?",
                live.pid
            ))
        })?;
        let snap_id = util::new_id("sn");
        let live_mode = how == Save::Live;
        // A diff needs a clone whose RAM is a private mapping of a chain's
        // base image: its private pages are then exactly what it changed.
        let chain = match how {
            Save::Diff => self.clone_chain(&row),
            _ => None,
        };
        let diff_mode = chain.is_some();
        // A live snapshot copies RAM while the guest runs, so RAM travels in
        // the (mapped-ram) stream whatever the sandbox's kind.
        let shared = self.owns_ram(&row) && !live_mode;
        let paths = live.paths.clone();
        let ram_bytes = u64::from(row.memory_mib) << 20;
        let mapping = match &chain {
            Some(c) => Some(
                forkvm_qemu::ram::find_mapping(
                    live.pid,
                    &c.base.path(forkvm_store::MEMORY),
                    ram_bytes,
                )
                .map_err(|e| ApiError::internal(format!("cannot find the clone's RAM: {e}")))?,
            ),
            None => None,
        };
        // A live save goes to tmpfs: QEMU finishes the file while the guest
        // is stopped, and on a disk that final write was most of the pause.
        // (In the sandbox's RAM scratch directory, which its jail shows it.)
        let live_tmp = live_mode.then(|| paths.shm.join(format!("{snap_id}.state")));
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
            migrate::set_live_parameters(&qmp)
                .await
                .map_err(|e| qemu_err("cannot set migration parameters", e))?;
        }
        let (top_node, top_file, vsize) = migrate::top_disk(&qmp)
            .await
            .map_err(|e| qemu_err("cannot find the disk", e))?;
        // Our node names say which file each layer is: `root` is the disk the
        // sandbox started with, `root-<layer>` the overlay of that snapshot.
        let top_file = match top_node.strip_prefix("root-") {
            Some(l) if top_node != "root-file" => paths.dir.join(format!("disk-{l}.qcow2")),
            _ if top_node == "root" => paths.disk.clone(),
            _ => PathBuf::from(top_file.ok_or_else(|| {
                ApiError::internal(format!("cannot tell which file disk node {top_node} is"))
            })?),
        };
        let top_file = top_file.display().to_string();
        let staging = self.store.begin(&snap_id).map_err(store_err)?;
        let final_disk = self.store.dir(&snap_id).join(forkvm_store::DISK);
        let layer_n = util::new_id("l");
        let new_top = paths.dir.join(format!("disk-{layer_n}.qcow2"));
        // The new top layer is created by us, naming the frozen layer by its
        // final path in the store, then handed to QEMU in `existing` mode.
        forkvm_qemu::disk::create_overlay_unchecked(&final_disk, "qcow2", &new_top, vsize)
            .await
            .map_err(ApiError::internal)?;
        crate::jail::share_with_qemu(&paths, &new_top)
            .map_err(|e| ApiError::internal(format!("cannot give QEMU its new disk layer: {e}")))?;

        if let Some(t) = &live_tmp {
            // Create the file now: the run directory is removed when it is
            // empty (the last sandbox RAM file going), and a file in it is
            // what keeps it for QEMU's own open below.
            let mut tries = 0;
            loop {
                let r = std::fs::create_dir_all(&paths.shm)
                    .and_then(|_| std::fs::File::create(t).map(drop))
                    .and_then(|_| crate::jail::share_with_qemu(&paths, t));
                match r {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 10 => tries += 1,
                    Err(e) => {
                        let _ = std::fs::remove_file(&new_top);
                        return Err(ApiError::internal(format!(
                            "cannot create {}: {e}",
                            t.display()
                        )));
                    }
                }
            }
        }
        let mut timings = SnapshotTimings::default();
        let frozen = std::sync::atomic::AtomicBool::new(false);
        let t_stop = Instant::now();
        // Subscribe before `stop`, so the STOP and RESUME events are ours.
        let mut events = qmp.events();
        if !live_mode {
            qmp.execute("stop", None)
                .await
                .map_err(|e| qemu_err("cannot pause the source", e))?;
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
                    ApiError::internal(format!("cannot create {}: {e}", state_path.display()))
                })?;
            }
            if let Some(m) = mapping {
                migrate::save_device_state(&qmp, &state_path)
                    .await
                    .map_err(|e| qemu_err("saving the device state failed", e))?;
                timings.save_state_ms = ms(t.elapsed());
                let t = Instant::now();
                let (pages, data) = tokio::task::spawn_blocking(move || {
                    let pages = forkvm_qemu::ram::private_pages(&m)?;
                    let data = forkvm_qemu::ram::read_pages(&m, &pages)?;
                    Ok::<_, std::io::Error>((pages, data))
                })
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .map_err(|e| ApiError::internal(format!("cannot read the clone's pages: {e}")))?;
                captured = Some((pages, data));
                timings.copy_memory_ms = ms(t.elapsed());
            } else {
                migrate::save_state(&qmp, &state_path)
                    .await
                    .map_err(|e| qemu_err("saving the device state failed", e))?;
                timings.save_state_ms = ms(t.elapsed());
            }
            if live_tmp.is_none() {
                let dst = staging.path(forkvm_store::DEVICE_STATE);
                std::fs::rename(&state_path, &dst)
                    .and_then(|_| crate::jail::take_back(&dst))
                    .map_err(|e| {
                        let _ = std::fs::remove_file(&state_path);
                        ApiError::internal(format!("cannot move the device state: {e}"))
                    })?;
            }
            let t = Instant::now();
            qmp.execute(
                "blockdev-snapshot-sync",
                Some(serde_json::json!({
                    "node-name": top_node,
                    "snapshot-file": new_top.display().to_string(),
                    "snapshot-node-name": format!("root-{layer_n}"),
                    "format": "qcow2",
                    "mode": "existing",
                })),
            )
            .await
            .map_err(|e| qemu_err("freezing the disk failed", e))?;
            frozen.store(true, std::sync::atomic::Ordering::SeqCst);
            std::fs::hard_link(&top_file, staging.path(forkvm_store::DISK)).map_err(|e| {
                ApiError::internal(format!("cannot link the frozen disk layer: {e}"))
            })?;
            timings.freeze_disk_ms = ms(t.elapsed());
            if shared {
                let t = Instant::now();
                let src = paths.mem.clone();
                let dst = staging.path(forkvm_store::MEMORY);
                tokio::task::spawn_blocking(move || forkvm_store::sparse_copy(&src, &dst))
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .map_err(store_err)?;
                timings.copy_memory_ms = ms(t.elapsed());
            }
            Ok::<(), ApiError>(())
        }
        .await;
        // A failed attempt (a full disk, most likely) frees its files before
        // the source resumes: on a full disk the guest's own disk writes fail
        // too, and QEMU would stop the guest again (io-error) at once.
        let staging = match &paused {
            Ok(()) => Some(staging),
            Err(_) => {
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
                None => ms(t_stop.elapsed()),
            };
            if let Err(e) = resumed {
                tracing::error!("could not resume sandbox {id} after a snapshot: {e}");
            }
        }
        if frozen.load(std::sync::atomic::Ordering::SeqCst) && !hold {
            // The guest writes to `new_top` now; GET reads the chain's depth
            // from it, and the stream pulls the frozen layers into it.
            if let Err(e) = crate::compact::set_top_layer(&paths, &new_top) {
                tracing::warn!(sandbox = %id, "cannot record sandbox {id}'s top disk layer: {e}");
            }
            self.stream_disk_later(id, self.cfg.disk_chain_max as usize);
        }
        if let Err(e) = paused {
            // If the disk was frozen, the source now writes to `new_top`,
            // whose header names `final_disk`: keep that layer reachable.
            if frozen.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = std::fs::create_dir_all(self.store.dir(&snap_id));
                let _ = std::fs::hard_link(&top_file, &final_disk);
            } else {
                let _ = std::fs::remove_file(&new_top);
            }
            return Err(e);
        }
        let staging = staging
            .ok_or_else(|| ApiError::internal("the snapshot's staging directory vanished"))?;

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
            artefacts.push(forkvm_store::Artefact {
                kind: "memory".into(),
                file: forkvm_store::MEMORY.into(),
                size: 0,
                allocated: 0,
                sha256: String::new(),
            });
        }
        if diff_mode {
            artefacts.push(forkvm_store::Artefact {
                kind: "memory_diff".into(),
                file: forkvm_store::MEMORY_DIFF.into(),
                size: 0,
                allocated: 0,
                sha256: String::new(),
            });
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
            machine: MachineInfo {
                memory_mib: row.memory_mib,
                cpus: row.cpus,
                accel: row.accel.clone(),
                kernel: self.cfg.kernel().display().to_string(),
                initrd: self.cfg.initrd().display().to_string(),
                cmdline: live.cmdline.clone(),
                machine: Some(machine),
            },
            base_image: self.cfg.image_rootfs(&row.image).display().to_string(),
            artefacts,
            ram_format: live_mode.then(|| "mapped-ram".to_string()),
            state_format: diff_mode.then(|| DEVICES_ONLY.to_string()),
        };
        let diff = match (chain, captured) {
            (Some(c), Some((pages, data))) => Some(DiffCapture {
                ram_bytes,
                pages,
                data,
                base: c.base.path(forkvm_store::MEMORY),
                base_state: c.base.path(forkvm_store::DEVICE_STATE),
                links: c
                    .links
                    .iter()
                    .map(|l| l.path(forkvm_store::MEMORY_DIFF))
                    .collect(),
            }),
            _ => None,
        };
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
        Ok(Frozen {
            staging,
            manifest,
            srow,
            timings,
            t0,
            top_file: PathBuf::from(top_file),
            final_disk,
            diff,
            live_tmp,
        })
    }

    /// A new snapshot's tag must be valid and unused.
    fn check_tag(&self, tag: Option<&str>) -> Result<(), ApiError> {
        if let Some(t) = tag {
            if !util::valid_id(t) || t.starts_with("sn-") {
                return Err(ApiError::invalid(format!(
                    "tag {t:?} is not valid: use letters, digits, '-' and '_', not starting with sn-"
                )));
            }
            // `POST /v1/snapshots/prune` would shadow it.
            if t == "prune" {
                return Err(ApiError::invalid(
                    "the tag \"prune\" is reserved (POST /v1/snapshots/prune); choose another",
                ));
            }
            if self.db.snapshot(t)?.is_some() {
                return Err(ApiError::conflict(format!(
                    "tag {t:?} is already used by another snapshot"
                )));
            }
        }
        Ok(())
    }

    /// Merge a diff snapshot's chain into one `shared` snapshot with no
    /// parent: the base image with every link's pages written over it, the
    /// head's device state, and the head's disk layer (qcow2 chains are the
    /// disk's own business; its layers stay reachable through the collector).
    pub async fn flatten(
        self: &Arc<Self>,
        id_or_tag: &str,
        tag: Option<String>,
    ) -> Result<forkvm_api::Snapshot, ApiError> {
        let t0 = Instant::now();
        let row = self.snapshot_row(id_or_tag)?;
        let _lease = self.gc_lease(&row.id)?;
        let head = self.store.open_snapshot(&row.id).map_err(store_err)?;
        let k = kind(&head.manifest);
        if k != "diff" {
            return Err(ApiError::invalid(format!(
                "snapshot {} is of kind {k}, which has no chain; only diff snapshots can be flattened",
                row.id
            )));
        }
        self.check_tag(tag.as_deref())?;
        let chain = self.chain(&head)?;
        self.verify_chain(&chain).await?;
        let new_id = util::new_id("sn");
        let staging = self.store.begin(&new_id).map_err(store_err)?;
        let mut manifest = head.manifest.clone();
        manifest.id = new_id.clone();
        manifest.tag = tag.clone();
        manifest.parent = None;
        manifest.created_at = util::now_rfc3339();
        manifest.ram_format = None;
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
            let mem = staging.path(forkvm_store::MEMORY);
            forkvm_store::sparse_copy(&chain.base.path(forkvm_store::MEMORY), &mem)?;
            let ioerr = |e: std::io::Error| StoreError::Io {
                path: mem.display().to_string(),
                source: e,
            };
            {
                use std::os::unix::fs::{FileExt, PermissionsExt};
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&mem)
                    .or_else(|_| {
                        // sparse_copy leaves files read-only.
                        std::fs::set_permissions(&mem, std::fs::Permissions::from_mode(0o644))?;
                        std::fs::OpenOptions::new().write(true).open(&mem)
                    })
                    .map_err(ioerr)?;
                for l in &chain.links {
                    let d =
                        forkvm_store::memdiff::MemDiff::open(&l.path(forkvm_store::MEMORY_DIFF))
                            .map_err(|e| StoreError::Corrupt {
                                id: l.manifest.id.clone(),
                                why: e.to_string(),
                            })?;
                    let data = d.read_data().map_err(|e| StoreError::Corrupt {
                        id: l.manifest.id.clone(),
                        why: e.to_string(),
                    })?;
                    for (i, &p) in d.pages.iter().enumerate() {
                        let pg = forkvm_store::memdiff::PAGE as usize;
                        f.write_all_at(&data[i * pg..(i + 1) * pg], p * pg as u64)
                            .map_err(ioerr)?;
                    }
                }
            }
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
        .map_err(|e| ApiError::internal(e.to_string()))?
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
        self.db.insert_snapshot(&srow)?;
        let mut view = self.snapshot_view(&srow)?;
        view.timings = Some(SnapshotTimings {
            publish_ms: ms(t0.elapsed()),
            total_ms: ms(t0.elapsed()),
            ..Default::default()
        });
        Ok(view)
    }

    /// Resume a sandbox that QEMU stopped on a disk error (`io-error`).
    async fn resume_after_io_error(&self, id: &str) {
        let Some(live) = self.live(id) else { return };
        let Ok(qmp) = Qmp::connect(&live.paths.qmp, Duration::from_secs(5)).await else {
            return;
        };
        if qmp.status().await.is_ok_and(|s| s == "io-error") {
            match qmp.execute("cont", None).await {
                Ok(_) => tracing::warn!("resumed sandbox {id} after a disk-full error"),
                Err(e) => tracing::error!("could not resume sandbox {id} after io-error: {e}"),
            }
        }
    }

    /// Second half of a snapshot, after the source has resumed: hash and
    /// publish the files, then index the snapshot.
    pub(crate) async fn publish_frozen(
        self: &Arc<Self>,
        f: Frozen,
    ) -> Result<forkvm_api::Snapshot, ApiError> {
        let Frozen {
            staging,
            manifest,
            srow,
            mut timings,
            t0,
            top_file,
            final_disk,
            diff,
            live_tmp,
        } = f;
        let t = Instant::now();
        let store = self.clone();
        let published = tokio::task::spawn_blocking(move || {
            // A live save moves from tmpfs into the store (sparse).
            if let Some(tmp) = &live_tmp {
                let r = forkvm_store::sparse_copy(tmp, &staging.path(forkvm_store::DEVICE_STATE));
                let _ = std::fs::remove_file(tmp);
                r?;
            }
            // A diff keeps only the pages that differ from its parent's view.
            if let Some(d) = diff {
                // The device state gets the configuration section a normal
                // stream has (see forkvm_qemu::migrate::add_configuration).
                let sp = staging.path(forkvm_store::DEVICE_STATE);
                let state_err = |e: String| StoreError::Io {
                    path: sp.display().to_string(),
                    source: std::io::Error::other(e),
                };
                let raw = std::fs::read(&sp).map_err(|e| state_err(e.to_string()))?;
                let mut head = [0u8; 64];
                let machine = std::fs::File::open(&d.base_state)
                    .and_then(|f| {
                        use std::os::unix::fs::FileExt;
                        f.read_at(&mut head, 0)
                    })
                    .ok()
                    .and_then(|n| migrate::stream_machine(&head[..n]))
                    .unwrap_or_else(|| "microvm".to_string());
                let fixed = migrate::add_configuration(&raw, &machine).map_err(state_err)?;
                std::fs::write(&sp, fixed).map_err(|e| state_err(e.to_string()))?;
                let out = staging.path(forkvm_store::MEMORY_DIFF);
                let corrupt = |e: forkvm_store::memdiff::MemDiffError| StoreError::Io {
                    path: out.display().to_string(),
                    source: std::io::Error::other(e.to_string()),
                };
                let view =
                    forkvm_store::memdiff::ChainView::open(&d.base, &d.links).map_err(corrupt)?;
                let (pages, data) = view.changed(&d.pages, &d.data).map_err(corrupt)?;
                forkvm_store::memdiff::write(&out, d.ram_bytes, &pages, &data).map_err(corrupt)?;
            }
            store.store.publish(staging, manifest)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
        if let Err(e) = published {
            // The source's disk chain names the frozen layer's final path.
            let _ = std::fs::create_dir_all(final_disk.parent().unwrap_or(&final_disk));
            let _ = std::fs::hard_link(&top_file, &final_disk);
            // On a full disk the source's own writes may have failed while
            // the snapshot filled it, and QEMU stopped the guest (io-error).
            // The staging files are gone now: let it run again.
            self.resume_after_io_error(&srow.source).await;
            return Err(store_err(e));
        }
        timings.publish_ms = ms(t.elapsed());
        self.db.insert_snapshot(&srow)?;
        timings.total_ms = ms(t0.elapsed());
        let mut view = self.snapshot_view(&srow)?;
        view.timings = Some(timings);
        Ok(view)
    }

    /// Branch: snapshot the sandbox at this instant and spawn children. A
    /// failure is logged with the source's id (the source keeps running).
    pub async fn branch(
        self: &Arc<Self>,
        id: &str,
        req: forkvm_api::BranchRequest,
    ) -> Result<forkvm_api::BranchResult, ApiError> {
        let over = req.limits.clone();
        if let Some(o) = &over {
            crate::limits::check(o, self.cfg.limits.max_cpus)?;
        }
        let mode = serde_json::to_value(req.mode.unwrap_or_default())
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let mut r = self.branch_unlogged(id, req).await;
        crate::metrics::METRICS.branched(&mode, r.is_ok(), r.as_ref().ok().map(|b| b.pause_ms));
        match &mut r {
            Err(e) => {
                tracing::warn!(sandbox = %id, code = e.code, "branch of sandbox {id} failed: {}", e.message)
            }
            Ok(b) => {
                // Children carry the source's metadata, env, timeout and
                // limits; a child that cannot be limited does not stay.
                let ids: Vec<String> = b.children.iter().map(|c| c.id.clone()).collect();
                if let Err(e) = self.inherit_lifecycle(id, &ids, over.as_ref()).await {
                    tracing::warn!(sandbox = %id, "children of sandbox {id} did not get its lifecycle: {}", e.message);
                    for c in &ids {
                        let _ = self.remove(c).await;
                    }
                    return Err(e);
                }
                for c in &mut b.children {
                    if let Ok(v) = self.get(&c.id) {
                        *c = forkvm_api::Sandbox {
                            timings: c.timings.take(),
                            ..v
                        };
                    }
                }
            }
        }
        r
    }

    async fn branch_unlogged(
        self: &Arc<Self>,
        id: &str,
        req: forkvm_api::BranchRequest,
    ) -> Result<forkvm_api::BranchResult, ApiError> {
        use forkvm_api::BranchMode;
        let t0 = Instant::now();
        let mode = req.mode.unwrap_or_default();
        let count = req.count.unwrap_or(1);
        if count > 1000 {
            return Err(ApiError::invalid(format!(
                "count must be between 0 and 1000 (got {count})"
            )));
        }
        let free = self
            .cfg
            .limits
            .max_sandboxes
            .saturating_sub(self.db.count()?);
        if count > free {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::LIMIT_EXCEEDED,
                format!(
                    "{count} children would pass the limit of {} sandboxes ({free} free); remove some with `forkvm rm`",
                    self.cfg.limits.max_sandboxes
                ),
            ));
        }
        // Each child starts mapping what the source has touched.
        let each = self
            .live(id)
            .and_then(|l| util::memory_usage(l.pid))
            .map_or(1, |m| (m.pss_kib >> 10).max(1));
        let _admitted = self.admit(u64::from(count) * each, &format!("branch of sandbox {id}"))?;
        let how = match mode {
            BranchMode::Live => Save::Live,
            BranchMode::Diff => Save::Diff,
            BranchMode::Full => Save::Stopped,
        };
        let net = {
            let src = self.db.get(id)?;
            let src_net = src.as_ref().and_then(|r| r.network.clone());
            let ports: Vec<forkvm_api::PortForward> = match &req.ports {
                Some(p) => p.clone(),
                None => src_net
                    .as_ref()
                    .map(|n| {
                        n.ports
                            .iter()
                            .map(|p| forkvm_api::PortForward {
                                guest: p.guest,
                                host: 0,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            let nic = self
                .live(id)
                .is_some_and(|l| crate::net::Net::has_nic(&l.cmdline));
            self.net.validate(
                Some(
                    src_net
                        .as_ref()
                        .map_or(forkvm_api::NetworkMode::None, |n| n.mode),
                )
                .filter(|_| nic),
                Some(&ports),
                src_net.as_ref().and_then(|n| n.egress.as_deref()),
                req.wait_for_network,
                nic,
                count,
            )?
        };
        // A branch point's children are all spawned now: a pool of the
        // daemon's default size would only hold QEMUs nobody claims.
        let mut frozen = self.freeze(id, req.tag, None, Some(0), how).await?;
        // A branch point: garbage collection takes it once nothing needs it
        // (see crate::gc), but not before its children run.
        frozen.srow.origin = Origin::Branch;
        let lease = self.gc_lease_new(&frozen.srow.id);
        if req.wait == Some(false) {
            // The source has resumed: answer now, finish in the background.
            let r = &frozen.srow;
            let pending = forkvm_api::Snapshot {
                id: r.id.clone(),
                tag: r.tag.clone(),
                parent: r.parent.clone(),
                source: r.source.clone(),
                image: r.image.clone(),
                memory_mib: r.memory_mib,
                cpus: r.cpus,
                created_at: r.created_at.clone(),
                kind: kind(&frozen.manifest).into(),
                depth: 0,
                state: "writing".into(),
                failure: None,
                template: false,
                qemu_version: self.qemu_version.clone(),
                sizes: SnapshotSizes::default(),
                pool_size: 0,
                pool_default: false,
                sandboxes: Vec::new(),
                children: Vec::new(),
                origin: Origin::Branch.as_str().into(),
                pinned: false,
                timings: Some(frozen.timings.clone()),
            };
            self.pending.set(pending.clone());
            let pause_ms = frozen.timings.pause_ms;
            let me = self.clone();
            let sid = pending.id.clone();
            tokio::spawn(async move {
                let _lease = lease;
                match me.publish_frozen(frozen).await {
                    Ok(_) => {
                        me.pending.remove(&sid);
                        if count > 0 {
                            let r = match me.open_verified(&sid).await {
                                Ok(s) => me.spawn_clones(&s, count, &net).await.map(drop),
                                Err(e) => Err(e),
                            };
                            if let Err(e) = r {
                                tracing::warn!("children of branch {sid}: {}", e.message);
                            }
                        }
                    }
                    Err(e) => {
                        if let Some(mut p) = me.pending.get(&sid) {
                            p.state = "failed".into();
                            p.failure = Some(e.message.clone());
                            me.pending.set(p);
                        }
                    }
                }
            });
            return Ok(forkvm_api::BranchResult {
                mode,
                pause_ms,
                snapshot: pending,
                children: Vec::new(),
                snapshot_ms: ms(t0.elapsed()),
                spawn_ms: 0.0,
                total_ms: ms(t0.elapsed()),
            });
        }
        let snap = self.publish_frozen(frozen).await?;
        let snapshot_ms = ms(t0.elapsed());
        let t1 = Instant::now();
        let children = if count > 0 {
            let s = self.open_verified(&snap.id).await?;
            self.spawn_clones(&s, count, &net).await?
        } else {
            Vec::new()
        };
        Ok(forkvm_api::BranchResult {
            mode,
            pause_ms: snap.timings.as_ref().map_or(0.0, |t| t.pause_ms),
            snapshot: snap,
            children,
            snapshot_ms,
            spawn_ms: ms(t1.elapsed()),
            total_ms: ms(t0.elapsed()),
        })
    }

    /// The API view of a snapshot.
    pub fn snapshot_view(&self, r: &SnapshotRow) -> Result<forkvm_api::Snapshot, ApiError> {
        let s = self.store.open_snapshot(&r.id).map_err(store_err)?;
        let size = |k: &str| {
            s.manifest
                .artefact(k)
                .map_or((0, 0), |a| (a.size, a.allocated))
        };
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
            timings: None,
        })
    }

    /// The view of a snapshot by id or tag, including those an asynchronous
    /// branch is still writing (or failed to write).
    pub fn snapshot_by_ref(&self, id_or_tag: &str) -> Result<forkvm_api::Snapshot, ApiError> {
        if let Some(p) = self.pending.get(id_or_tag) {
            return Ok(p);
        }
        let r = self.snapshot_row(id_or_tag)?;
        self.snapshot_view(&r)
    }

    /// A snapshot row by id or tag, or 404.
    pub fn snapshot_row(&self, id_or_tag: &str) -> Result<SnapshotRow, ApiError> {
        if !util::valid_id(id_or_tag) {
            return Err(store_err(StoreError::NotFound(id_or_tag.to_string())));
        }
        self.db
            .snapshot(id_or_tag)?
            .ok_or_else(|| store_err(StoreError::NotFound(id_or_tag.to_string())))
    }

    /// Open a snapshot and verify its files (see forkvm-store on why this is
    /// cheap after the first time).
    pub async fn open_verified(&self, id: &str) -> Result<StoredSnapshot, ApiError> {
        let s = self.store.open_snapshot(id).map_err(store_err)?;
        let store = self.store.clone();
        let s2 = s.clone();
        tokio::task::spawn_blocking(move || store.verify(&s2))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(store_err)?;
        Ok(s)
    }

    /// Remove a snapshot. Refused (409) while sandboxes or child snapshots
    /// depend on it, unless `force`, which removes those first.
    pub async fn remove_snapshot(
        self: &Arc<Self>,
        id_or_tag: &str,
        force: bool,
    ) -> Result<(), ApiError> {
        if let Some(p) = self.pending.get(id_or_tag) {
            if p.state == "writing" {
                return Err(ApiError::conflict(format!(
                    "snapshot {} is still being written; remove it once it is ready",
                    p.id
                )));
            }
            self.pending.remove(&p.id);
            return Ok(());
        }
        let row = self.snapshot_row(id_or_tag)?;
        let sandboxes = self.db.sandboxes_of_snapshot(&row.id)?;
        let children = self.db.child_snapshots(&row.id)?;
        if !force && (!sandboxes.is_empty() || !children.is_empty()) {
            let mut why = Vec::new();
            if !sandboxes.is_empty() {
                why.push(format!("sandboxes {} run from it", sandboxes.join(", ")));
            }
            if !children.is_empty() {
                why.push(format!(
                    "snapshots {} are built on it",
                    children
                        .iter()
                        .map(|c| c.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            return Err(ApiError::conflict(format!(
                "snapshot {} is in use: {}; remove those first, or force it (`forkvm snapshot rm --force`) to remove them too",
                row.id,
                why.join("; ")
            )));
        }
        for c in children {
            Box::pin(self.remove_snapshot(&c.id, true)).await?;
        }
        for sb in sandboxes {
            match self.remove(&sb).await {
                Ok(()) => {}
                Err(e) if e.status == StatusCode::NOT_FOUND => {}
                Err(e) => return Err(e),
            }
        }
        self.kill_prepared(self.pools.drain(&row.id)).await;
        self.db.delete_snapshot(&row.id)?;
        match self.store.remove(&row.id) {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(store_err(e)),
        }
        self.collect_layers().await;
        Ok(())
    }

    /// Delete the disk layers of removed snapshots that no disk chain still
    /// goes through (garbage collection from the roots: every sandbox's disk
    /// files and every published snapshot's layer).
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
            for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                if f.file_name().to_string_lossy().ends_with(".qcow2") {
                    roots.push(f.path());
                }
            }
        }
        for id in self.store.ids() {
            roots.push(self.store.dir(&id).join(forkvm_store::DISK));
        }
        let mut referenced = HashSet::new();
        for r in roots {
            match forkvm_qemu::disk::backing_chain(&r).await {
                Ok(chain) => referenced.extend(chain),
                // A sandbox removed while we looked: its files reference
                // nothing any more.
                Err(_) if !r.exists() => {}
                Err(e) => {
                    // Unsure what this chain holds: delete nothing this time.
                    tracing::warn!(
                        "layer collection skipped: cannot read the chain of {}: {e}",
                        r.display()
                    );
                    return;
                }
            }
        }
        for gone in self.store.collect_layers(&candidates, &referenced) {
            tracing::info!("collected unused disk layer {}", gone.display());
        }
    }

    async fn kill_prepared(&self, v: Vec<Prepared>) {
        for mut p in v {
            process::kill(p.pid, libc::SIGKILL);
            let _ = p.child.wait().await;
            self.jail.release(&p.id);
            self.net.teardown(&p.id, p.net.as_ref()).await;
            p.paths.remove_all();
        }
    }

    /// Stop every pooled QEMU (daemon shutdown).
    pub async fn drain_pools(&self) {
        let all = self.pools.drain_all();
        self.kill_prepared(all).await;
    }

    /// Start a QEMU for a snapshot, waiting in `-incoming defer`.
    pub async fn prepare_restore(
        &self,
        snap: &StoredSnapshot,
        id: &str,
    ) -> Result<Prepared, ApiError> {
        let t0 = Instant::now();
        let paths = self.cfg.sandbox_paths(id);
        let io = |e: std::io::Error| {
            ApiError::internal(format!("cannot create the sandbox directory: {e}"))
        };
        std::fs::create_dir_all(&paths.dir).map_err(io)?;
        std::fs::create_dir_all(&self.cfg.run_dir).map_err(io)?;
        forkvm_qemu::disk::create_overlay(&snap.path(forkvm_store::DISK), &paths.disk)
            .await
            .map_err(|e| ApiError::internal(format!("cannot create the root disk: {e}")))?;
        let m = &snap.manifest;
        let k = kind(m);
        let shared = k == "shared";
        let devices_only = m.state_format.as_deref() == Some(DEVICES_ONLY);
        // A diff maps its chain's base and has its links' pages written in.
        let chain = if k == "diff" {
            let c = self.chain(snap)?;
            self.verify_chain(&c).await?;
            Some(c)
        } else {
            None
        };
        let netns = if crate::net::Net::has_nic(&m.machine.cmdline) {
            match self.net.create_ns(id).await {
                Ok(p) => Some(p),
                Err(e) => {
                    paths.remove_all();
                    return Err(e);
                }
            }
        } else {
            None
        };
        let memory = if let Some(c) = &chain {
            MemoryBackend {
                path: c.base.path(forkvm_store::MEMORY),
                share: false,
                readonly: true,
            }
        } else if shared {
            MemoryBackend {
                path: snap.path(forkvm_store::MEMORY),
                share: false,
                readonly: true,
            }
        } else {
            MemoryBackend {
                path: paths.mem.clone(),
                share: true,
                readonly: false,
            }
        };
        let spec = MachineSpec {
            name: id.to_string(),
            // The devices the stream holds: a snapshot made before the
            // options were recorded had the PIC and the PIT.
            machine: m
                .machine
                .machine
                .clone()
                .unwrap_or_else(|| forkvm_qemu::spec::LEGACY_MACHINE.to_string()),
            accel: self.accel.accel,
            memory_mib: m.machine.memory_mib,
            cpus: m.machine.cpus,
            kernel: PathBuf::from(&m.machine.kernel),
            initrd: PathBuf::from(&m.machine.initrd),
            cmdline: m.machine.cmdline.clone(),
            memory,
            root_disk: paths.disk.clone(),
            agent_socket: paths.agent.clone(),
            qmp_socket: paths.qmp.clone(),
            console_log: paths.console.clone(),
            incoming: Some("defer".into()),
            device_state_only: devices_only,
            no_configuration_section: devices_only && {
                let mut head = [0u8; 9];
                let n = std::fs::File::open(snap.path(forkvm_store::DEVICE_STATE))
                    .and_then(|f| {
                        use std::os::unix::fs::FileExt;
                        f.read_at(&mut head, 0)
                    })
                    .unwrap_or(0);
                !migrate::has_configuration(&head[..n])
            },
            nic: netns.as_ref().map(|_| crate::net::Net::nic()),
            netns,
            later_reads: vec![snap.path(forkvm_store::DEVICE_STATE)],
        };
        let prepare_ms = ms(t0.elapsed());
        let t1 = Instant::now();
        let Launched { child, pid, qmp } = match self.launch_qemu(&spec, &paths).await {
            Ok(l) => l,
            Err(e) => {
                self.net.teardown(id, None).await;
                paths.remove_all();
                return Err(e);
            }
        };
        // A devices-only stream carries no RAM and no capability
        // subsection, so the validated capabilities stay off for it.
        migrate::set_capabilities(
            &qmp,
            &[
                ("x-ignore-shared", shared && !devices_only),
                ("mapped-ram", k == "live"),
            ],
        )
        .await
        .map_err(|e| qemu_err("cannot set migration capabilities", e))?;
        if let Some(c) = chain {
            let ram_bytes = u64::from(m.machine.memory_mib) << 20;
            let base = c.base.path(forkvm_store::MEMORY);
            let links: Vec<PathBuf> = c
                .links
                .iter()
                .map(|l| l.path(forkvm_store::MEMORY_DIFF))
                .collect();
            let applied = tokio::task::spawn_blocking(move || {
                let map = forkvm_qemu::ram::find_mapping(pid, &base, ram_bytes)
                    .map_err(|e| e.to_string())?;
                for l in &links {
                    let d = forkvm_store::memdiff::MemDiff::open(l).map_err(|e| e.to_string())?;
                    let data = d.read_data().map_err(|e| e.to_string())?;
                    forkvm_qemu::ram::write_pages(&map, &d.pages, &data)
                        .map_err(|e| format!("writing the pages of {}: {e}", l.display()))?;
                }
                Ok::<(), String>(())
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
            if let Err(e) = applied {
                let _ = qmp.execute("quit", None).await;
                let mut child = child;
                let _ = child.wait().await;
                self.jail.release(id);
                self.net.teardown(id, None).await;
                paths.remove_all();
                return Err(ApiError::internal(format!(
                    "cannot lay the snapshot's memory diff into the clone: {e}"
                )));
            }
        }
        Ok(Prepared {
            id: id.to_string(),
            paths,
            child,
            pid,
            qmp,
            prepare_ms,
            qemu_start_ms: ms(t1.elapsed()),
            net: None,
        })
    }

    /// Spawn `n` clones of a snapshot, concurrently. All or nothing: if one
    /// fails, the others are removed and the first error is returned.
    pub async fn spawn_clones(
        self: &Arc<Self>,
        snap: &StoredSnapshot,
        n: u32,
        net: &crate::net::NetRequest,
    ) -> Result<Vec<Sandbox>, ApiError> {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let me = self.clone();
            let s = snap.clone();
            let net = net.clone();
            set.spawn(async move { me.spawn_clone(&s, &net).await });
        }
        let mut ok = Vec::new();
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(sb)) => ok.push(sb),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(ApiError::internal(format!("spawn task failed: {e}")));
                }
            }
        }
        if let Some(e) = first_err {
            for sb in &ok {
                let _ = self.remove(&sb.id).await;
            }
            return Err(e);
        }
        ok.sort_by(|a, b| a.id.cmp(&b.id));
        self.refill_pool(&snap.manifest.id);
        Ok(ok)
    }

    /// Spawn one clone: from the warm pool when one is waiting.
    async fn spawn_clone(
        self: &Arc<Self>,
        snap: &StoredSnapshot,
        net: &crate::net::NetRequest,
    ) -> Result<Sandbox, ApiError> {
        let t0 = Instant::now();
        let m = &snap.manifest;
        self.pools.note_request(&m.id, net.is_default_nat());
        let mut pooled = None;
        while let Some(mut p) = self.pools.take(&m.id) {
            // A pooled QEMU may have died while it waited.
            if matches!(p.child.try_wait(), Ok(None)) {
                pooled = Some(p);
                break;
            }
            self.net.teardown(&p.id, p.net.as_ref()).await;
            p.paths.remove_all();
        }
        let from_pool = pooled.is_some();
        let id = match &pooled {
            Some(p) => p.id.clone(),
            None => util::new_id("sb"),
        };
        let row = SandboxRow {
            id: id.clone(),
            state: SandboxState::Starting,
            image: m.image.clone(),
            memory_mib: m.machine.memory_mib,
            cpus: m.machine.cpus,
            accel: self.accel.accel.to_string(),
            pid: pooled.as_ref().map(|p| p.pid),
            created_at: util::now_rfc3339(),
            failure: None,
            timings: None,
            snapshot: Some(m.id.clone()),
            network: None,
        };
        self.db.insert(&row)?;
        let r = async {
            let p = match pooled {
                Some(p) => p,
                None => self.prepare_restore(snap, &id).await?,
            };
            self.finish_restore(p, snap, from_pool, t0, net, true).await
        }
        .await;
        self.conclude_spawn(&id, r).await
    }

    /// Load the state, resume, and give the clone its identity. A resume
    /// of a paused sandbox (`fresh_identity: false`) keeps the identity it
    /// had and only has its clock set.
    pub(crate) async fn finish_restore(
        self: &Arc<Self>,
        p: Prepared,
        snap: &StoredSnapshot,
        from_pool: bool,
        t0: Instant,
        net: &crate::net::NetRequest,
        fresh_identity: bool,
    ) -> Result<SpawnTimings, ApiError> {
        let Prepared {
            id,
            paths,
            child,
            pid,
            qmp,
            prepare_ms,
            qemu_start_ms,
            net: ready_net,
        } = p;
        self.db.set_pid(&id, pid)?;
        let live = self.attach(
            &id,
            pid,
            paths.clone(),
            Phase::Booting,
            Waiter::Child(child),
            snap.manifest.machine.cmdline.clone(),
        );
        // Connect to the agent's socket before the guest runs (QEMU listens
        // from its start), so the identity can go out right after `cont`.
        let conn = agent::AgentConn::connect(&paths.agent).await.map_err(|e| {
            ApiError::new(StatusCode::BAD_GATEWAY, codes::GUEST_ERROR, e.to_string())
        })?;
        // The network is complete before the guest runs a single
        // instruction: its first packet already finds its way out.
        let network_ms = if crate::net::Net::has_nic(&snap.manifest.machine.cmdline) {
            let t = Instant::now();
            let n = match ready_net {
                // A warm pool set up exactly this network ahead of time.
                Some(n) if n.serves(net) => n,
                // It set up the default one, and this spawn asks for
                // another: undo the uplink part, keep the namespace (the
                // QEMU's tap lives in it), and set up what was asked.
                Some(n) => {
                    self.net.release_uplink(&id, &n).await;
                    self.net.setup(&id, net).await?
                }
                None => self.net.setup(&id, net).await?,
            };
            self.db.set_network(&id, Some(&n))?;
            Some(ms(t.elapsed()))
        } else {
            None
        };
        let t2 = Instant::now();
        migrate::load_state(&qmp, &snap.path(forkvm_store::DEVICE_STATE))
            .await
            .map_err(|e| qemu_err("loading the snapshot failed", e))?;
        qmp.execute("cont", None)
            .await
            .map_err(|e| qemu_err("cannot resume the clone", e))?;
        let resumed = Instant::now();
        let resumed_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1000.0)
            .ok();
        drop(qmp);
        let restore_ms = ms(t2.elapsed());
        // The identity is the first request the clone sees: its answer also
        // proves the agent is alive, so no separate ping round trip is paid
        // (under TCG each guest round trip right after a restore costs ~100 ms
        // of code translation).
        let t3 = Instant::now();
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let mut exited = live.exited.clone();
        let (machine_id, instance_id, seed) = (
            hex_random(16),
            format!("{id}-{}", hex_random(4)),
            entropy(64),
        );
        let ident = async {
            if fresh_identity {
                conn.identity(
                    &id,
                    now_ns,
                    &machine_id,
                    &instance_id,
                    &seed,
                    Duration::from_secs(60),
                )
                .await
            } else {
                conn.set_clock(Duration::from_secs(60)).await.map(|_| 0)
            }
        };
        let guest_us = tokio::select! {
            r = ident => { r.map_err(|e| match e {
                AgentError::Timeout(_) => ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    codes::GUEST_TIMEOUT,
                    format!("the clone did not take its identity: {e}"),
                ),
                other => ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    codes::GUEST_ERROR,
                    format!("the clone refused its identity: {other}"),
                ),
            })? }
            r = exited.wait_for(|e| e.is_some()) => {
                let why = r.map(|g| g.clone().unwrap_or_default()).unwrap_or_default();
                return Err(qemu_err("the clone died while resuming", why));
            }
        };
        let ident_rt = t3.elapsed();
        // Now that the agent runs warm, set the clock again so it is off by
        // one short round trip at most.
        conn.set_clock(Duration::from_secs(30)).await.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                codes::GUEST_ERROR,
                format!("the clone did not set its clock: {e}"),
            )
        })?;
        let identity_ms = ms(t3.elapsed());
        tracing::debug!(
            sandbox = %id,
            identity_round_trip_ms = ms(ident_rt),
            identity_in_guest_ms = guest_us as f64 / 1000.0,
            set_clock_ms = identity_ms - ms(ident_rt),
            "clone identity"
        );
        let network_ready_ms = if net.wait && network_ms.is_some() {
            crate::net::Net::probe_guest(&conn).await?;
            Some(ms(resumed.elapsed()))
        } else {
            None
        };
        *live.agent_slot().lock().await = Some(conn);
        let timings = SpawnTimings {
            prepare_ms: if from_pool { 0.0 } else { prepare_ms },
            qemu_start_ms: if from_pool { 0.0 } else { qemu_start_ms },
            boot_ms: 0.0,
            restore_ms: Some(restore_ms),
            identity_ms: Some(identity_ms),
            from_pool: Some(from_pool),
            template_ms: None,
            network_ms,
            network_ready_ms,
            resumed_unix_ms,
            total_ms: ms(t0.elapsed()),
        };
        if live.set_phase(Phase::Running) != Phase::Booting {
            return Err(ApiError::conflict(
                "the sandbox was removed while it started",
            ));
        }
        self.db.set_running(&id, pid, &timings)?;
        // A clone deep in a branch tree inherits its snapshot's whole chain:
        // stream it down when it is long (a header read decides; most are not).
        if crate::compact::layers(&live.paths)
            .is_some_and(|n| n as usize > crate::compact::INHERITED_BOUND)
        {
            self.stream_disk_later(&id, crate::compact::INHERITED_BOUND);
        }
        Ok(timings)
    }

    /// Keep the warm pool of a snapshot at its configured size, in the
    /// background.
    pub fn refill_pool(self: &Arc<Self>, snap_id: &str) {
        let Ok(Some(row)) = self.db.snapshot(snap_id) else {
            return;
        };
        if self.pool_size_of(&row) == 0 {
            return;
        }
        {
            let Ok(mut f) = self.pools.filling.lock() else {
                return;
            };
            if !f.insert(row.id.clone()) {
                return; // a filler is already running
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let want = me
                    .db
                    .snapshot(&row.id)
                    .ok()
                    .flatten()
                    .map_or(0, |r| me.pool_size_of(&r));
                if me.pools.ready_count(&row.id) >= want {
                    break;
                }
                let Ok(snap) = me.open_verified(&row.id).await else {
                    break;
                };
                let prepared = match me.prepare_restore(&snap, &util::new_id("sb")).await {
                    Ok(p) => Ok(me.pool_network(&snap, p).await),
                    Err(e) => Err(e),
                };
                match prepared {
                    // The snapshot may have been removed, or its pool shrunk,
                    // while we prepared.
                    Ok(p)
                        if me.db.snapshot(&row.id).ok().flatten().is_some_and(|r| {
                            me.pools.ready_count(&row.id) < me.pool_size_of(&r)
                        }) =>
                    {
                        me.pools.put(&row.id, p)
                    }
                    Ok(p) => {
                        me.kill_prepared(vec![p]).await;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("warm pool of {}: {}", row.id, e.message);
                        break;
                    }
                }
            }
            if let Ok(mut f) = me.pools.filling.lock() {
                f.remove(&row.id);
            }
        });
    }

    /// Give a pooled QEMU the network a spawn gets by default (`nat`, no
    /// published port, no allow-list), so that a pool hit does not pay the
    /// uplink, the rulesets and the address claim (~70-100 ms here) on its
    /// critical path. A spawn that asks for another network undoes it (see
    /// [`Manager::finish_restore`]), which costs about as much again, so
    /// after such a spawn the snapshot's refills leave the network to the
    /// spawn until a default request comes back. If the set-up fails, the
    /// spawn does it itself, as without a pool.
    async fn pool_network(&self, snap: &StoredSnapshot, mut p: Prepared) -> Prepared {
        if !crate::net::Net::has_nic(&snap.manifest.machine.cmdline)
            || !self.net.available()
            || !self.pools.wants_network(&snap.manifest.id)
        {
            return p;
        }
        let req = match self.net.validate(None, None, None, None, true, 1) {
            Ok(r) if r.is_default_nat() => r,
            _ => return p,
        };
        match self.net.setup(&p.id, &req).await {
            Ok(n) => p.net = Some(n),
            Err(e) => tracing::warn!(
                "warm pool of {}: the network is left to the spawn: {}",
                snap.manifest.id,
                e.message
            ),
        }
        p
    }

    /// The warm-pool size in effect for a snapshot: its own, or the
    /// daemon's default.
    pub fn pool_size_of(&self, row: &SnapshotRow) -> u32 {
        row.pool_size.unwrap_or(self.default_pool_size)
    }

    /// Set the warm-pool size of a snapshot (`None`: follow the default).
    pub async fn set_pool(
        self: &Arc<Self>,
        id_or_tag: &str,
        size: Option<u32>,
    ) -> Result<forkvm_api::Snapshot, ApiError> {
        if size.is_some_and(|n| n > MAX_POOL) {
            return Err(ApiError::invalid(format!(
                "a warm pool holds at most {MAX_POOL} processes"
            )));
        }
        let row = self.snapshot_row(id_or_tag)?;
        self.db.set_pool_size(&row.id, size)?;
        let row = self.snapshot_row(&row.id)?;
        let size = self.pool_size_of(&row);
        // Shrink now; grow in the background.
        let mut extra = Vec::new();
        while self.pools.ready_count(&row.id) > size {
            match self.pools.take(&row.id) {
                Some(p) => extra.push(p),
                None => break,
            }
        }
        self.kill_prepared(extra).await;
        self.refill_pool(&row.id);
        self.snapshot_view(&row)
    }

    /// Pools as `GET /v1/info` shows them.
    pub fn pool_infos(&self) -> Vec<forkvm_api::PoolInfo> {
        self.db
            .snapshots()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| self.pool_size_of(r) > 0)
            .map(|r| forkvm_api::PoolInfo {
                ready: self.pools.ready_count(&r.id),
                size: self.pool_size_of(&r),
                snapshot: r.id,
            })
            .collect()
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
    /// (checked by pid file and command line) and delete them.
    pub fn reap_orphans(&self) {
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
            if let Some(pid) = std::fs::read_to_string(paths.dir.join("qemu.pid"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                if process::is_our_qemu(pid, &id) {
                    process::kill(pid, libc::SIGKILL);
                }
            }
            paths.remove_all();
            // (Retried until the killed QEMU is gone.)
            self.jail.release(&id);
        }
    }
}
