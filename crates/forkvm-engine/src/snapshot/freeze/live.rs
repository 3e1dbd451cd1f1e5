//! A `live` freeze: RAM is copied while the guest runs (`mapped-ram`), and
//! QEMU stops the guest itself for the final pass. The frame does not stop
//! the source, and the state file is written to tmpfs. A live save of a
//! clone is then thinned to the pages the clone changed ([`thin`]).

use std::path::{Path, PathBuf};

use forkvm_qemu::ram::RamMapping;
use forkvm_qemu::{migrate, Qmp};

use crate::config::SandboxPaths;
use crate::error::EngineError;
use crate::snapshot::freeze::diff::Captured;
use crate::snapshot::qemu_err;

/// Where a live save is written. It goes to tmpfs: QEMU finishes the file
/// while the guest is stopped, and on a disk that final write was most of
/// the pause. (In the sandbox's RAM scratch directory, which its jail shows
/// it.)
pub fn tmp_path(paths: &SandboxPaths, snap_id: &str) -> PathBuf {
    paths.shm.join(format!("{snap_id}.state"))
}

/// The migration parameters of a save while the guest runs.
pub async fn set_parameters(qmp: &Qmp) -> Result<(), EngineError> {
    migrate::set_live_parameters(qmp)
        .await
        .map_err(|e| qemu_err("cannot set migration parameters", e))
}

/// Create the state file now: the run directory is removed when it is empty
/// (the last sandbox RAM file going), and a file in it is what keeps it for
/// QEMU's own open below. On failure the new disk layer `new_top` goes.
pub fn create_tmp(paths: &SandboxPaths, t: &Path, new_top: &Path) -> Result<(), EngineError> {
    let mut tries = 0;
    loop {
        let r = std::fs::create_dir_all(&paths.shm)
            .and_then(|_| std::fs::File::create(t).map(drop))
            .and_then(|_| crate::jail::share_with_qemu(paths, t));
        match r {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 10 => tries += 1,
            Err(e) => {
                let _ = std::fs::remove_file(new_top);
                return Err(EngineError::internal(format!(
                    "cannot create {}: {e}",
                    t.display()
                )));
            }
        }
    }
    Ok(())
}

/// The pages a just-resumed clone holds privately: every page it wrote
/// before its live save ended is among them. `None` (every page is then
/// compared at publish, slower but as exact) if they cannot be listed.
pub async fn written_pages(id: &str, m: RamMapping) -> Option<Vec<u64>> {
    let r = tokio::task::spawn_blocking(move || forkvm_qemu::ram::private_pages(&m))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    r.map_err(|e| {
        tracing::warn!(sandbox = %id, "cannot list sandbox {id}'s written pages ({e}); its live snapshot compares every page");
    })
    .ok()
}

/// Keep only a clone's changed pages out of its live save, `tmp`: read
/// `pages` (from [`written_pages`]; all of them if `None`) as the file has
/// them, then take the guest RAM block out of the file
/// (forkvm_qemu::mapped_ram). The file keeps the device state and the small
/// firmware blocks; its children load it over the chain's RAM, which they
/// map, so the pages it no longer holds are the parent's. Publish reduces
/// the pages read here to those that differ from the parent, as for a diff.
pub fn thin(tmp: &Path, ram_bytes: u64, pages: Option<Vec<u64>>) -> std::io::Result<Captured> {
    const PAGE: usize = forkvm_qemu::mapped_ram::PAGE as usize;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(tmp)?;
    let block = forkvm_qemu::mapped_ram::guest_ram(&f, ram_bytes)?;
    let bitmap = block.bitmap(&f)?;
    let pages = pages.unwrap_or_else(|| (0..block.pages()).collect());
    let mut data = vec![0u8; pages.len() * PAGE];
    for (chunk, &p) in data.chunks_exact_mut(PAGE).zip(&pages) {
        block.read_page(&f, &bitmap, p, chunk)?;
    }
    block.clear(&f)?;
    Ok((pages, data))
}
