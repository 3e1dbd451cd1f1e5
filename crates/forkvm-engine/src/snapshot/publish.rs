//! The second half of a snapshot: hash and publish what a freeze staged,
//! with the source already running again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_qemu::{migrate, Qmp};
use forkvm_store::{crash, StoreError};

use crate::error::EngineError;
use crate::manager::Manager;
use crate::snapshot::freeze::diff::Pending;
use crate::snapshot::freeze::{live, Frozen};
use crate::snapshot::store_err;
use crate::util::ms;

impl Manager {
    /// Resume a sandbox that QEMU stopped on a disk error (`io-error`).
    pub async fn resume_after_io_error(&self, id: &str) {
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
    pub async fn publish_frozen(
        self: &Arc<Self>,
        f: Frozen,
    ) -> Result<forkvm_api::Snapshot, EngineError> {
        let Frozen {
            staging,
            manifest,
            srow,
            mut timings,
            t0,
            mut diff,
            live_tmp,
            info,
            head_ahead,
        } = f;
        let t = Instant::now();
        let diff_ram_bytes = diff.as_ref().map_or(0, |d| d.ram_bytes);
        let store = self.clone();
        let sid = srow.id.clone();
        let published = tokio::task::spawn_blocking(move || {
            let sp = staging.path(forkvm_store::DEVICE_STATE);
            let state_err = |e: String| StoreError::Io {
                path: sp.display().to_string(),
                source: std::io::Error::other(e),
            };
            // A live save moves from tmpfs into the store (sparse); a live
            // save of a clone first gives up its RAM but the changed pages.
            let mut live_pages = None;
            if let Some(tmp) = &live_tmp {
                let r = match diff.as_mut().map(|d| &mut d.pages) {
                    Some(Pending::Live(p)) => live::thin(tmp, diff_ram_bytes, p.take())
                        .map(|c| live_pages = Some(c))
                        .map_err(|e| state_err(format!("cannot keep the clone's pages: {e}"))),
                    _ => Ok(()),
                }
                .and_then(|()| forkvm_store::sparse_copy(tmp, &sp));
                let _ = std::fs::remove_file(tmp);
                r?;
                crash::point("publish.live_copied");
            }
            // A diff keeps only the pages that differ from its parent's view.
            let mut ahead = None;
            if let Some(d) = diff {
                // Children come at once: their head starts now, on its own
                // thread, as a copy of the view this clone maps.
                let (tx, worker) = match d.view.clone().filter(|_| head_ahead) {
                    Some(view) => {
                        let (tx, rx) = std::sync::mpsc::channel();
                        let path = store
                            .store
                            .root()
                            .join(forkvm_store::head::prebuild_name(&sid));
                        let ram = d.ram_bytes;
                        let h = std::thread::Builder::new()
                            .name("forkvm-head".into())
                            .spawn(move || build_ahead(&path, &view, ram, &rx))
                            .ok();
                        (Some(tx), h)
                    }
                    None => (None, None),
                };
                let (pages, data) = match d.pages {
                    Pending::Read(c) => {
                        state_configuration(&sp, &d.base_state).map_err(state_err)?;
                        c
                    }
                    Pending::Live(_) => live_pages
                        .take()
                        .ok_or_else(|| state_err("the live save's pages were not read".into()))?,
                };
                let out = staging.path(forkvm_store::MEMORY_DIFF);
                let corrupt = |e: forkvm_store::memdiff::MemDiffError| StoreError::Io {
                    path: out.display().to_string(),
                    source: std::io::Error::other(e.to_string()),
                };
                let view =
                    forkvm_store::memdiff::ChainView::open(&d.base, &d.links).map_err(corrupt)?;
                let changed = Arc::new(view.changed(&pages, &data).map_err(corrupt)?);
                if let Some(tx) = tx {
                    let _ = tx.send(changed.clone());
                }
                forkvm_store::memdiff::write(&out, d.ram_bytes, &changed.0, &changed.1)
                    .map_err(corrupt)?;
                crash::point("publish.diff_written");
                ahead = worker;
            }
            // On an error above, the head thread finds its channel closed
            // (or its result dropped) and removes its file.
            let snap = store.store.publish(staging, manifest)?;
            let adopted = ahead.map(|h| {
                h.join()
                    .map_err(|_| "the thread panicked".to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                    .and_then(|p| p.adopt(&snap.dir, &snap.digest).map_err(|e| e.to_string()))
            });
            Ok::<_, StoreError>(adopted)
        })
        .await
        .map_err(|e| EngineError::internal(e.to_string()))?;
        let published = published.map(|adopted| match adopted {
            Some(Ok(b)) => tracing::info!(
                snapshot = %srow.id,
                base = ?b.base,
                base_bytes = b.base_bytes,
                pages = b.pages,
                "built the flattened memory of diff snapshot {} alongside it",
                srow.id
            ),
            // A cache: the first spawn builds it instead.
            Some(Err(e)) => tracing::warn!(
                snapshot = %srow.id,
                "could not build the flattened memory ahead: {e}; the first spawn builds it"
            ),
            None => {}
        });
        if let Err(e) = published {
            // The source's disk chain names the frozen layer's final path,
            // where the layer stays (forkvm_store::Staging's drop).
            // On a full disk the source's own writes may have failed while
            // the snapshot filled it, and QEMU stopped the guest (io-error).
            // The staging files are gone now: let it run again.
            self.resume_after_io_error(&srow.source).await;
            return Err(store_err(e));
        }
        timings.publish_ms = ms(t.elapsed());
        // First, so that the row's `created` notice finds it.
        self.db.set_snapshot_info(&srow.id, &info)?;
        crash::point("publish.info_indexed");
        self.db.insert_snapshot(&srow)?;
        crash::point("publish.indexed");
        timings.total_ms = ms(t0.elapsed());
        let mut view = self.snapshot_view(&srow)?;
        view.timings = Some(timings);
        Ok(view)
    }
}

/// Give a devices-only stream (from `xen-save-devices-state`) the
/// configuration section a normal stream has, naming the machine of the
/// chain's base (see forkvm_qemu::migrate::add_configuration).
fn state_configuration(sp: &std::path::Path, base_state: &std::path::Path) -> Result<(), String> {
    let raw = std::fs::read(sp).map_err(|e| e.to_string())?;
    let mut head = [0u8; 64];
    let machine = std::fs::File::open(base_state)
        .and_then(|f| {
            use std::os::unix::fs::FileExt;
            f.read_at(&mut head, 0)
        })
        .ok()
        .and_then(|n| migrate::stream_machine(&head[..n]))
        .unwrap_or_else(|| "microvm".to_string());
    let fixed = migrate::add_configuration(&raw, &machine)?;
    std::fs::write(sp, fixed).map_err(|e| e.to_string())
}

/// The head of a snapshot being published, built on its own thread: the
/// copy of `view` starts at once, the changed pages come when the compare
/// has found them. A closed channel means publishing failed.
fn build_ahead(
    path: &std::path::Path,
    view: &std::path::Path,
    ram_bytes: u64,
    pages: &std::sync::mpsc::Receiver<Arc<(Vec<u64>, Vec<u8>)>>,
) -> Result<forkvm_store::head::Prebuild, forkvm_store::memdiff::MemDiffError> {
    let mut p = forkvm_store::head::Prebuild::start(path, view, ram_bytes)?;
    let changed = pages.recv().map_err(|_| {
        forkvm_store::memdiff::MemDiffError::Format("the snapshot was not published".into())
    })?;
    p.lay(&changed.0, &changed.1)?;
    Ok(p)
}
