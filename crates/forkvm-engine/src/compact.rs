//! Keeping a running sandbox's disk chain short.
//!
//! Every snapshot or branch freezes the source's top qcow2 layer and gives
//! it a new, empty one on top (see [`crate::snapshot`]). Left alone, a source
//! branched a hundred times reads through a hundred layers, and each layer
//! costs at every pause: QEMU flushes, inactivates and reopens every node of
//! the chain around a migration. So after each freeze the daemon *streams*
//! the chain in the background: QEMU's `block-stream` copies into the new top
//! every cluster the frozen layers hold, while the guest runs, and then
//! rewrites the top's header to name the base image directly
//! ([`forkvm_qemu::blockjob`]). The frozen layers stay untouched, so the
//! snapshots and children that read them are unaffected; the source simply
//! stops depending on them, and garbage collection can free the ones nobody
//! else reads.
//!
//! The bound: when a freeze starts, the source's chain is its top over the
//! base image (one layer), because a freeze first waits for the previous
//! stream to end ([`Manager::settle_disk`]). Between a freeze and the end of
//! its stream the chain is two layers. A clone inherits its snapshot's chain;
//! one that inherits more than [`INHERITED_BOUND`] layers is streamed as soon
//! as it runs, so that depth does not grow with the depth of a branch tree
//! either.
//!
//! The cost is the copy: each stream copies what the guest has written to its
//! disk since it was first booted (not the base image), once per freeze. The
//! figures are in `docs/disk-chain.md`.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_qemu::{blockjob, Qmp};

use crate::config::SandboxPaths;
use crate::error::EngineError;
use crate::manager::{Live, Manager};
use crate::util::ms;

/// A clone that inherits more layers than this (or than `--disk-chain-max`,
/// if larger) is streamed when it starts. Not every clone: a fan-out of a
/// hundred children would copy the same data a hundred times.
pub const INHERITED_BOUND: usize = 4;

/// The depth past which a new clone is streamed; 0 when streaming is off.
pub fn inherited_bound(chain_max: u32) -> usize {
    match chain_max {
        0 => 0,
        n => INHERITED_BOUND.max(n as usize),
    }
}
/// How long a freeze waits for the previous stream before cancelling it (the
/// chain is then one layer deeper until the next stream, never wrong).
const SETTLE_WAIT: Duration = Duration::from_secs(120);
/// How often a background stream's progress is polled. Polling keeps QMP
/// free between polls: QEMU serves one QMP client at a time, and a snapshot
/// must not wait behind a connection held open for a whole copy.
const POLL: Duration = Duration::from_millis(100);
/// The file in a sandbox directory that names its current top layer.
const TOP_MARKER: &str = "disk.top";

/// The file the sandbox's guest writes to: the layer a freeze last put on
/// top (recorded in [`TOP_MARKER`]), or the disk it started with.
pub fn top_layer(paths: &SandboxPaths) -> PathBuf {
    std::fs::read_to_string(paths.dir.join(TOP_MARKER))
        .ok()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map(|n| paths.dir.join(n))
        .unwrap_or_else(|| paths.disk.clone())
}

/// Record `file` (in the sandbox directory) as the top layer: written aside
/// and renamed, so a reader sees the old name or the new one.
pub fn set_top_layer(paths: &SandboxPaths, file: &Path) -> std::io::Result<()> {
    let name = file
        .file_name()
        .ok_or_else(|| std::io::Error::other("a top layer must be a file"))?;
    let tmp = paths.dir.join(format!("{TOP_MARKER}.tmp"));
    std::fs::write(&tmp, name.as_encoded_bytes())?;
    std::fs::rename(&tmp, paths.dir.join(TOP_MARKER))
}

/// The qcow2 layers the sandbox's disk reads through (the base image not
/// counted); `None` when the files cannot be read (the sandbox is going).
pub fn layers(paths: &SandboxPaths) -> Option<u32> {
    forkvm_qemu::qcow2::layers(&top_layer(paths))
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// `fdatasync` the sandbox's top layer from the host, then drop its pages
/// from the host's page cache. The page cache is the file's, not QEMU's, so
/// the sync writes back what QEMU wrote through it; QEMU's own flush at the
/// next stop then finds little left.
///
/// The drop is for the same pause: when a migration ends, QEMU inactivates
/// the disk's nodes, and `cont` activates them again; activating a file
/// node flushes it and drops the *whole* file from the page cache
/// (`POSIX_FADV_DONTNEED`, so that it reads what another host may have
/// written). That takes time in proportion to the cached pages, and the
/// stream leaves every cluster the guest ever wrote cached in the top: 300
/// MiB written made each checkpoint pause 21 ms instead of 3 here. Dropped
/// now, while the guest runs, the pause only meets what was cached since.
/// Failures only cost pause time, so they are logged, not returned.
async fn flush_top(paths: &SandboxPaths) {
    let top = top_layer(paths);
    let r = tokio::task::spawn_blocking(move || {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(&top)?;
        f.sync_data()?;
        // SAFETY: a plain advice call on a descriptor this function owns.
        match unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    })
    .await;
    if let Ok(Err(e)) = r {
        tracing::debug!("cannot flush {}: {e}", paths.dir.display());
    }
}

impl Manager {
    /// The disk part of a running sandbox's view.
    pub fn disk_chain(&self, id: &str) -> Option<forkvm_api::DiskChain> {
        let live = self.live(id)?;
        Some(forkvm_api::DiskChain {
            layers: layers(&live.paths)?,
            streaming: live.streaming.load(Ordering::SeqCst),
        })
    }

    /// Before a freeze, and before its QMP connection (the stream task needs
    /// QMP to finish): wait for the sandbox's stream task to end, and keep
    /// the next one from starting until the freeze is done. After
    /// [`SETTLE_WAIT`] the running job is cancelled instead (the chain is one
    /// layer deeper until the next stream, never wrong).
    pub async fn disk_guard<'a>(&self, live: &'a Live) -> tokio::sync::MutexGuard<'a, ()> {
        let t0 = Instant::now();
        let guard = match tokio::time::timeout(SETTLE_WAIT, live.stream_lock.lock()).await {
            Ok(g) => g,
            Err(_) => {
                let id = &live.id;
                tracing::warn!(sandbox = %id, "disk stream of sandbox {id} still copying after {SETTLE_WAIT:?}: cancelled, the chain stays one layer deeper until the next stream");
                if let Ok(qmp) = Qmp::connect(&live.paths.qmp, Duration::from_secs(10)).await {
                    for j in blockjob::jobs(&qmp).await.unwrap_or_default() {
                        if !j.concluded() {
                            let _ = blockjob::cancel(&qmp, &j.id).await;
                        }
                    }
                }
                live.stream_lock.lock().await
            }
        };
        if t0.elapsed() > Duration::from_millis(50) {
            let id = &live.id;
            tracing::info!(sandbox = %id, "sandbox {id}: waited {:.0} ms for its disk stream before freezing", ms(t0.elapsed()));
        }
        guard
    }

    /// Before a freeze: let the sandbox's stream finish (or cancel it after
    /// [`SETTLE_WAIT`]), and clear concluded jobs, which would otherwise keep
    /// their nodes busy. `qmp` is the freeze's own connection.
    pub async fn settle_disk(&self, qmp: &Qmp, id: &str) -> Result<(), EngineError> {
        let qerr = |e: forkvm_qemu::QmpError| {
            EngineError::internal(format!("cannot query sandbox {id}'s disk jobs: {e}"))
        };
        let t0 = Instant::now();
        let mut cancelled = false;
        loop {
            let jobs = blockjob::jobs(qmp).await.map_err(qerr)?;
            let mut running = false;
            for j in jobs {
                if j.concluded() {
                    // The stream task reads the outcome if it sees the job
                    // first; otherwise log it here.
                    if let Some(e) = &j.error {
                        if !cancelled {
                            tracing::warn!(sandbox = %id, "disk stream {} of sandbox {id} failed: {e}", j.id);
                        }
                    }
                    let _ = blockjob::dismiss(qmp, &j.id).await;
                } else {
                    running = true;
                    if t0.elapsed() > SETTLE_WAIT && !cancelled {
                        tracing::warn!(
                            sandbox = %id,
                            "disk stream {} of sandbox {id} still copying after {:?} ({} of {} bytes): cancelled, the chain stays one layer deeper until the next stream",
                            j.id, SETTLE_WAIT, j.done, j.total
                        );
                        blockjob::cancel(qmp, &j.id).await.map_err(qerr)?;
                        cancelled = true;
                    }
                }
            }
            if !running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // QEMU flushes every disk file when it stops the guest; what the
        // guest (or a stream) wrote since the last flush would be written
        // back inside the pause. Write it back now, while the guest runs.
        if let Some(live) = self.live(id) {
            flush_top(&live.paths).await;
        }
        Ok(())
    }

    /// Stream sandbox `id`'s chain down to its base image in the background,
    /// if it has more than `bound` layers.
    pub fn stream_disk_later(self: &Arc<Self>, id: &str, bound: usize) {
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            if let Err(e) = me.stream_disk(&id, bound).await {
                // A sandbox removed meanwhile is not a failure.
                if me.live(&id).is_some() {
                    tracing::warn!(sandbox = %id, "disk stream of sandbox {id} failed: {e}");
                }
            }
        });
    }

    async fn stream_disk(self: &Arc<Self>, id: &str, bound: usize) -> Result<(), String> {
        let Some(live) = self.live(id) else {
            return Ok(());
        };
        if bound == 0 {
            return Ok(()); // --disk-chain-max 0: never.
        }
        // One stream task per sandbox at a time, and none during a freeze
        // (which takes the lock first, see disk_guard). QEMU 10.0 was seen to
        // crash (SIGSEGV in bdrv_refresh_filename) when one task's graph
        // query (query-named-block-nodes) met another task's job as it
        // completed and dropped its copy-on-read filter node. Under the lock
        // the graph is only queried when no job of ours is running: before
        // this task starts its job, and after the job has concluded.
        let _one = live.stream_lock.lock().await;
        let t0 = Instant::now();
        let Some(qmp) = self.qmp_while_running(&live).await else {
            return Ok(());
        };
        let chain = blockjob::disk_chain(&qmp)
            .await
            .map_err(|e| e.to_string())?;
        // top, …, base: only the layers strictly between go.
        if chain.len() < 3 || chain.len() - 1 <= bound {
            return Ok(());
        }
        let busy = blockjob::jobs(&qmp).await.map_err(|e| e.to_string())?;
        if !busy.is_empty() {
            return Ok(()); // a stream already runs, or awaits a freeze's dismissal
        }
        // The copy writes what the frozen layers hold into the top, in the
        // home. A stream that ran out of room would keep its partial copy
        // (QEMU cannot give back clusters it streamed), so one that would
        // take the home under its reserve is not started: the chain stays
        // one layer deeper until a later snapshot streams it.
        let need_mib = chain[1..chain.len() - 1]
            .iter()
            .map(|n| crate::pressure::allocated(Path::new(&n.file)))
            .sum::<u64>()
            >> 20;
        if let Some(free) = crate::admission::disk_free_mib(&self.cfg.home) {
            if free < need_mib + self.cfg.disk_reserve_mib {
                tracing::info!(
                    sandbox = %id,
                    "disk stream of sandbox {id} skipped: it would copy up to {need_mib} MiB with \
                     {free} MiB free, under the {} MiB reserve; the chain stays {} layers until a \
                     later snapshot streams it",
                    self.cfg.disk_reserve_mib,
                    chain.len() - 1
                );
                return Ok(());
            }
        }
        let job = format!("{}{}", blockjob::JOB_PREFIX, crate::util::new_id("j"));
        let (top, base) = (&chain[0], &chain[chain.len() - 1]);
        blockjob::start_stream(&qmp, &job, &top.node_name, &base.node_name)
            .await
            .map_err(|e| e.to_string())?;
        drop(qmp);
        let _flag = Streaming::set(&live);
        let (intermediates, before) = (chain[1..chain.len() - 1].to_vec(), chain.len() - 1);
        // Wait for the job to conclude, on short connections (see POLL).
        let outcome = loop {
            tokio::time::sleep(POLL).await;
            let Some(qmp) = self.qmp_while_running(&live).await else {
                return Ok(()); // the sandbox is going, and the job with it
            };
            let jobs = blockjob::jobs(&qmp).await.map_err(|e| e.to_string())?;
            match jobs.into_iter().find(|j| j.id == job) {
                // A freeze that waited for it dismissed it.
                None => break None,
                Some(j) if j.concluded() => {
                    let _ = blockjob::dismiss(&qmp, &job).await;
                    break Some(j);
                }
                Some(_) => {}
            }
        };
        let Some(qmp) = self.qmp_while_running(&live).await else {
            return Ok(());
        };
        let now = blockjob::disk_chain(&qmp)
            .await
            .map_err(|e| e.to_string())?;
        let detached: Vec<_> = intermediates
            .iter()
            .filter(|n| !now.iter().any(|c| c.node_name == n.node_name))
            .collect();
        if detached.is_empty() {
            // A job a freeze dismissed was logged there (failed or cancelled).
            let Some(j) = outcome else { return Ok(()) };
            let why = j.error.unwrap_or_else(|| "it ended early".to_string());
            return Err(format!(
                "{why}; the chain is unchanged ({before} layers) until the next snapshot streams it"
            ));
        }
        // Drop what the stream detached: the node the sandbox started with,
        // which the command line created (QEMU closes the others itself), and
        // the sandbox's own links to the frozen layers (the store keeps its
        // copies while their snapshots exist).
        for n in detached {
            // The layers a freeze opened (`blockdev-add`) are the monitor's
            // too; older ones, from `blockdev-snapshot-sync`, QEMU closed
            // already and refuses to delete.
            let nodes: &[&str] = if n.node_name == "root" {
                &["root", "root-file"]
            } else {
                &[n.node_name.as_str()]
            };
            for node in nodes {
                if let Err(e) = blockjob::delete_node(&qmp, node).await {
                    tracing::debug!(sandbox = %id, "cannot delete node {node}: {e}");
                }
            }
            let f = Path::new(&n.file);
            if f.parent() == Some(live.paths.dir.as_path()) {
                let _ = std::fs::remove_file(f);
            }
        }
        drop(qmp);
        // The stream wrote the frozen layers' data into the top through the
        // host page cache: write it back now rather than in the next pause.
        flush_top(&live.paths).await;
        tracing::info!(
            sandbox = %id,
            "sandbox {id}: disk chain streamed, {} frozen layer(s) folded into the top in {:.0} ms ({before} layers before, {} now)",
            before - 1,
            ms(t0.elapsed()),
            now.len().saturating_sub(1),
        );
        self.collect_layers().await;
        Ok(())
    }

    /// A QMP connection to a running sandbox, waiting while another client
    /// (a snapshot, say) holds the socket; `None` once QEMU has exited.
    async fn qmp_while_running(&self, live: &Live) -> Option<Arc<Qmp>> {
        loop {
            if live.exited.borrow().is_some() || self.live(&live.id).is_none() {
                return None;
            }
            match Qmp::connect(&live.paths.qmp, Duration::from_secs(10)).await {
                Ok(q) => return Some(q),
                Err(e) => {
                    tracing::debug!(sandbox = %live.id, "QMP busy or gone: {e}");
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
}

/// Sets [`Live::streaming`] while it lives.
struct Streaming<'a>(&'a Live);

impl<'a> Streaming<'a> {
    fn set(live: &'a Live) -> Self {
        live.streaming.store(true, Ordering::SeqCst);
        Streaming(live)
    }
}

impl Drop for Streaming<'_> {
    fn drop(&mut self) {
        self.0.streaming.store(false, Ordering::SeqCst);
    }
}
