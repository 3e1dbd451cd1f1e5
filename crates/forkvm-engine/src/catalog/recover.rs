//! What a snapshot that a crashed daemon left half-done leaves in its
//! source's directory, tidied at the next start.
//!
//! The store's side needs nothing here: a frozen layer is at its final path
//! before anything names it, so the source's chain is whole whatever step the
//! crash hit (forkvm_store::Store::reserve_layer). What remains are files of
//! the source's own directory that its QEMU no longer uses or never used:
//!
//! * a new top layer created, or opened by QEMU but never attached (a crash
//!   before the freeze): it would keep the reserved layer it names, a link to
//!   the source's old data, for as long as the sandbox lives. It is found as
//!   a `disk-l-*.qcow2` that is on no chain QEMU reports (`query-block`,
//!   which names every image of the attached disk's chain) and has no other
//!   link: every layer frozen by this version is also linked in the store
//!   from before its freeze (a layer an older daemon lost that link of is
//!   still on QEMU's chain, and kept);
//! * a checkpoint's thin disk layer whose copy a crash interrupted
//!   (`thin-*.qcow2`, see crate::snapshot::freeze::thin): the checkpoint
//!   was never published;
//! * a device state file not yet moved into the staging directory;
//! * the record of the top layer, if the crash came between the freeze and
//!   its update (GET and the pre-freeze flush read it);
//! * the mode of a layer frozen by a snapshot that was never published: it
//!   is made read-only for everyone, as publication would have.
//!
//! When QEMU's answer is missing or unexpected, nothing is touched.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_qemu::{blockjob, Qmp};

use crate::manager::Manager;

impl Manager {
    /// Tidy the running sandboxes' directories after a crash (see the module
    /// doc). Run once at start, after [`Manager::recover`] re-attached them.
    /// The state files go at once; the layers in the background, each
    /// sandbox under its stream lock (a freeze waits for it), once no stream
    /// job runs in its QEMU: QEMU 10.0 was seen to crash when its block graph
    /// was queried as a stream finished (crate::compact), and a stream the
    /// old daemon started runs on by itself.
    pub fn tidy_snapshot_leftovers(self: &Arc<Self>) {
        let running: Vec<String> = self
            .db
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.state == forkvm_api::SandboxState::Running)
            .map(|r| r.id)
            .collect();
        for id in &running {
            let Some(live) = self.live(id) else { continue };
            let paths = &live.paths;
            // A state file is only ever in flight during a snapshot, and none
            // runs yet.
            for dir in [&paths.dir, &paths.shm] {
                for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with("sn-") && n.ends_with(".state") {
                        tracing::info!(sandbox = %id, "removing {n}, left by an interrupted snapshot of sandbox {id}");
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        // What an interrupted splice of a checkpoint left (forkvm_store::splice).
        for f in self.store.tidy_splices() {
            tracing::info!(
                "removed {}, left by an interrupted checkpoint prune",
                f.display()
            );
        }
        let me = self.clone();
        tokio::spawn(async move { me.tidy_layers(running).await });
    }

    async fn tidy_layers(&self, running: Vec<String>) {
        let mut tops = std::collections::HashSet::new();
        let mut every_top_known = true;
        for id in running {
            let Some(live) = self.live(&id) else {
                every_top_known = false;
                continue;
            };
            let paths = &live.paths;
            let _one = live.stream_lock.lock().await;
            let Some(qmp) = no_stream_running(&paths.qmp).await else {
                tracing::warn!(sandbox = %id, "cannot check sandbox {id}'s disk layers for leftovers of a crash: its QEMU did not answer, or a stream still ran");
                every_top_known = false;
                continue;
            };
            // Only `query-block`, which every freeze sends too: QEMU 10.0.2
            // was seen to crash (SIGSEGV, bdrv_refresh_filename) when
            // `query-named-block-nodes` came right after a crash like this
            // one, with a stream the old daemon started and half cleaned up.
            let top = match forkvm_qemu::migrate::top_disk(&qmp).await {
                Ok((node, reported, _)) => {
                    crate::snapshot::freeze::node_file(paths, &node, reported)
                }
                Err(_) => None,
            };
            let Some(top) = top.filter(|t| t.parent() == Some(paths.dir.as_path())) else {
                every_top_known = false;
                continue; // not a layout this code knows: touch nothing
            };
            if let Ok(m) = std::fs::metadata(&top) {
                tops.insert((m.dev(), m.ino()));
            }
            let in_use = match qmp.execute("query-block", None).await {
                Ok(v) => chain_files(&v),
                Err(_) => None,
            };
            let Some(in_use) = in_use else {
                continue; // names this code cannot compare: touch nothing
            };
            if crate::compact::top_layer(paths) != top {
                if let Err(e) = crate::compact::set_top_layer(paths, &top) {
                    tracing::warn!(sandbox = %id, "cannot record sandbox {id}'s top disk layer: {e}");
                }
            }
            // A layer of the sandbox directory that is not its top and has no
            // other link was never frozen (a frozen one is linked in the
            // store from before the freeze): a new top a crash left behind.
            for e in std::fs::read_dir(&paths.dir)
                .into_iter()
                .flatten()
                .flatten()
            {
                let n = e.file_name().to_string_lossy().into_owned();
                // A checkpoint's thin layer is renamed into the store or
                // removed before the checkpoint returns: one left here is
                // from a copy a crash interrupted (snapshot::freeze::thin).
                if let Some(node) = n.strip_suffix(".qcow2").filter(|n| n.starts_with("thin-")) {
                    let _ = blockjob::delete_node(&qmp, node).await;
                    tracing::info!(sandbox = %id, "removing {n} of sandbox {id}: an interrupted checkpoint was writing it");
                    let _ = std::fs::remove_file(e.path());
                    continue;
                }
                let Some(layer) = n
                    .strip_prefix("disk-l-")
                    .and_then(|l| l.strip_suffix(".qcow2"))
                else {
                    continue;
                };
                if e.path() == top
                    || in_use.contains(&e.path())
                    || e.metadata().map_or(true, |m| m.nlink() != 1)
                {
                    continue;
                }
                // Opened by QEMU (unattached) if the crash came after that.
                let _ = blockjob::delete_node(&qmp, &format!("root-l-{layer}")).await;
                tracing::info!(sandbox = %id, "removing disk layer {n} of sandbox {id}: an interrupted snapshot made it, and its QEMU does not use it");
                let _ = std::fs::remove_file(e.path());
            }
        }
        // A layer frozen by a snapshot that never got published (or by a
        // daemon older than this rule) is read-only for everyone, as a
        // published one: a later snapshot's layer may name it, and its
        // children's jailed QEMUs read it. Not a layer some QEMU still
        // writes to (a crash before the freeze reserved the running top).
        if !every_top_known {
            return;
        }
        for d in self.store.orphan_layers() {
            let disk = d.join(forkvm_store::DISK);
            let Ok(m) = std::fs::metadata(&disk) else {
                continue;
            };
            if m.mode() & 0o777 != 0o444 && !tops.contains(&(m.dev(), m.ino())) {
                let _ = std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o444));
            }
        }
        // What the removed layers named may be free now.
        self.collect_layers().await;
    }
}

/// A QMP connection once no block job runs in this QEMU (concluded ones may
/// wait for their dismissal); `None` if QEMU does not answer, or a job
/// still runs after [`STREAM_WAIT`].
async fn no_stream_running(sock: &std::path::Path) -> Option<Arc<Qmp>> {
    let t = Instant::now();
    loop {
        let qmp = Qmp::connect(sock, Duration::from_secs(5)).await.ok()?;
        let jobs = blockjob::jobs(&qmp).await.ok()?;
        if jobs.iter().all(|j| j.concluded()) {
            return Some(qmp);
        }
        if t.elapsed() > STREAM_WAIT {
            return None;
        }
        // Short connections: QEMU serves one QMP client at a time.
        drop(qmp);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long the tidying waits for a stream the old daemon started.
const STREAM_WAIT: Duration = Duration::from_secs(300);

/// Every image file of the VM's disks as `query-block` reports them: each
/// disk's image and its `backing-image`s down the chain. `None` if one is
/// not a plain file name (a `json:` one), which a path cannot be compared
/// with.
fn chain_files(v: &serde_json::Value) -> Option<std::collections::HashSet<std::path::PathBuf>> {
    let mut out = std::collections::HashSet::new();
    for d in v.as_array().into_iter().flatten() {
        let mut img = d.get("inserted").and_then(|i| i.get("image"));
        while let Some(i) = img {
            let f = i["filename"].as_str()?;
            if f.starts_with("json:") {
                return None;
            }
            out.insert(std::path::PathBuf::from(f));
            img = i.get("backing-image");
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::chain_files;
    use serde_json::json;

    #[test]
    fn the_chain_is_read_from_query_block() {
        let v = json!([{"device": "", "inserted": {"node-name": "root-l-2", "image": {
            "filename": "/s/disk-l-2.qcow2",
            "backing-image": {"filename": "/s/disk-l-1.qcow2",
                "backing-image": {"filename": "/store/sn-a/disk.qcow2",
                    "backing-image": {"filename": "/images/base/rootfs.img"}}}}}},
            {"device": "cd", "locked": false}]);
        let f = chain_files(&v).unwrap();
        assert_eq!(f.len(), 4);
        assert!(f.contains(std::path::Path::new("/s/disk-l-1.qcow2")));
        let odd = json!([{"inserted": {"image": {"filename": "json:{\"driver\": \"qcow2\"}"}}}]);
        assert!(
            chain_files(&odd).is_none(),
            "a json: name is not comparable"
        );
        assert!(chain_files(&json!([{"inserted": {"image": {}}}])).is_none());
    }
}
