//! A checkpoint's disk layer, thinned to what the guest wrote since the
//! previous checkpoint.
//!
//! The frozen top of a checkpoint holds everything the stream folded into
//! it (crate::compact): all the guest wrote since it first booted, not
//! only since the previous checkpoint. When the sandbox kept a record of
//! its writes since that checkpoint (a dirty bitmap,
//! forkvm_qemu::incremental), the daemon writes the checkpoint's layer
//! again after the guest resumes:
//!
//! ```text
//!   before:  cp(n) disk = frozen top ─▶ base image      (all since boot)
//!   after:   cp(n) disk = thin layer ─▶ cp(n-1) disk    (the marked clusters)
//! ```
//!
//! 1. a new qcow2 file in the sandbox's directory, backed by the previous
//!    checkpoint's layer, receives the marked clusters of the frozen top by
//!    a `blockdev-backup` job in the sandbox's own (jailed) QEMU;
//! 2. it is renamed over the checkpoint's reserved layer path, before the
//!    snapshot is published (and hashed).
//!
//! Both files present the disk exactly as it was at the freeze, so the
//! rename changes no reader's view: the running sandbox still reads the
//! frozen top it has open, and the new top's header, which names the path,
//! now finds the thin layer there. A failure leaves the whole layer in
//! place, which is only larger. It runs while the freeze still holds the
//! sandbox's stream lock, so the stream cannot drop the frozen top from
//! QEMU's graph before the copy has read it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use forkvm_qemu::{blockjob, incremental, Qmp};

use super::steps::{Layer, Plan};
use crate::manager::Manager;
use crate::util::{self, ms};

/// How long the copy may take before it is cancelled (the whole layer is
/// then kept). It copies what one step of an agent wrote.
const COPY_LIMIT: Duration = Duration::from_secs(300);
/// How often the job's progress is polled.
const POLL: Duration = Duration::from_millis(10);

impl Manager {
    /// Rewrite checkpoint `plan`'s disk layer over its parent's, keeping
    /// only the clusters written since; on failure keep the whole layer.
    pub(super) async fn thin_layer(&self, id: &str, qmp: &Qmp, plan: &Plan, layer: &Layer) {
        let Some(parent) = plan.parent.as_deref() else {
            return;
        };
        let snap = &plan.snap_id;
        let t = Instant::now();
        match self.write_thin_layer(qmp, plan, layer, parent).await {
            Ok(bytes) => tracing::info!(
                sandbox = %id,
                "checkpoint {snap} of sandbox {id}: disk layer thinned to {} KiB over {parent} in {:.0} ms",
                bytes >> 10,
                ms(t.elapsed())
            ),
            Err(e) => tracing::warn!(
                sandbox = %id,
                "checkpoint {snap} of sandbox {id} keeps its whole disk layer: {e}"
            ),
        }
    }

    /// Steps 1 and 2 of the module doc; answers the thin layer's
    /// allocated bytes.
    async fn write_thin_layer(
        &self,
        qmp: &Qmp,
        plan: &Plan,
        layer: &Layer,
        parent: &str,
    ) -> Result<u64, String> {
        let backing = self.store.dir(parent).join(forkvm_store::DISK);
        let n = util::new_id("l");
        let file = plan.paths.dir.join(format!("thin-{n}.qcow2"));
        let node = format!("thin-{n}");
        forkvm_qemu::disk::create_overlay_unchecked(&backing, "qcow2", &file, layer.vsize).await?;
        let copied = async {
            crate::jail::share_with_qemu(&plan.paths, &file)
                .map_err(|e| format!("cannot give QEMU the thin layer: {e}"))?;
            incremental::open_target(qmp, &file, &node)
                .await
                .map_err(|e| format!("cannot open the thin layer: {e}"))?;
            let r = copy_marked(qmp, &layer.top_node, &node, &n).await;
            if let Err(e) = blockjob::delete_node(qmp, &node).await {
                tracing::debug!("cannot close node {node}: {e}");
            }
            r
        }
        .await;
        let placed = copied.and_then(|()| place(&file, &layer.final_disk));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&file);
            return Err(e);
        }
        // The frozen top's record is spent; the stream drops the node soon.
        if let Err(e) = incremental::remove_bitmap(qmp, &layer.top_node).await {
            tracing::debug!("cannot drop the write record of {}: {e}", layer.top_node);
        }
        Ok(crate::pressure::allocated(&layer.final_disk))
    }
}

/// Run the backup job from `source` into `target` to its end.
async fn copy_marked(qmp: &Qmp, source: &str, target: &str, n: &str) -> Result<(), String> {
    let job = format!("{}thin-{n}", blockjob::JOB_PREFIX);
    incremental::start_backup(qmp, &job, source, target)
        .await
        .map_err(|e| format!("cannot start the copy: {e}"))?;
    let t0 = Instant::now();
    let mut cancelled = false;
    loop {
        tokio::time::sleep(POLL).await;
        let jobs = blockjob::jobs(qmp)
            .await
            .map_err(|e| format!("cannot follow the copy: {e}"))?;
        let Some(j) = jobs.into_iter().find(|j| j.id == job) else {
            return Err("the copy job vanished".into());
        };
        if j.concluded() {
            let _ = blockjob::dismiss(qmp, &job).await;
            return match (j.error, cancelled) {
                (_, true) => Err(format!("the copy took over {COPY_LIMIT:?}: cancelled")),
                (Some(e), _) => Err(format!("the copy failed: {e}")),
                (None, _) => Ok(()),
            };
        }
        if t0.elapsed() > COPY_LIMIT && !cancelled {
            let _ = blockjob::cancel(qmp, &job).await;
            cancelled = true;
        }
    }
}

/// Take the written file back from QEMU's jail, make it read-only and
/// durable, and rename it over the reserved layer path.
fn place(file: &Path, final_disk: &Path) -> Result<(), String> {
    let err = |what: &str, e: std::io::Error| format!("cannot {what} the thin layer: {e}");
    crate::jail::take_back(file).map_err(|e| err("take back", e))?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444))
        .map_err(|e| err("protect", e))?;
    std::fs::File::open(file)
        .and_then(|f| f.sync_all())
        .map_err(|e| err("sync", e))?;
    std::fs::rename(file, final_disk).map_err(|e| err("place", e))?;
    if let Some(d) = final_disk.parent() {
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(|e| err("record", e))?;
    }
    Ok(())
}
