//! A `diff` freeze: the source is a private clone of a `shared` or `diff`
//! snapshot, so the pages it has written since (its private pages) are
//! exactly what changed. Only the device state goes through QEMU; the pages
//! are read from its RAM mapping while it is stopped.

use std::path::{Path, PathBuf};
use std::time::Instant;

use forkvm_api::SnapshotTimings;
use forkvm_qemu::migrate;
use forkvm_qemu::ram::RamMapping;
use forkvm_qemu::Qmp;

use crate::error::EngineError;
use crate::snapshot::{qemu_err, Chain};
use crate::util::ms;

/// The pages a clone's snapshot keeps, reduced at publish to those that
/// differ from its parent's view.
pub struct DiffCapture {
    pub ram_bytes: u64,
    pub pages: Pending,
    /// The view the clone started from: its snapshot's chain.
    pub base: PathBuf,
    /// The base's device state: an ordinary stream, naming the machine.
    pub base_state: PathBuf,
    pub links: Vec<PathBuf>,
    /// The file the clone maps (the base, or the chain's head) when it is
    /// complete: a head for this snapshot can start as a copy of it.
    pub view: Option<PathBuf>,
}

/// The clone's RAM: its QEMU's mapping of the chain's base image (a clone
/// of a `shared` snapshot) or flattened head (of a `diff` one). A head
/// rebuilt since the clone started is still found: /proc lists the old file
/// by its path with " (deleted)" after it, and its content is the same. A
/// clone of a diff that an older daemon started maps the base with the
/// links' pages written privately: its private pages are then a superset of
/// its changes, which publish reduces against the chain as for any clone.
pub fn find_ram(pid: u32, c: &Chain, ram_bytes: u64) -> Result<RamMapping, EngineError> {
    forkvm_qemu::ram::find_mapping(pid, &c.mapped(), ram_bytes)
        .or_else(|e| {
            forkvm_qemu::ram::find_mapping(pid, &c.base.path(forkvm_store::MEMORY), ram_bytes)
                .map_err(|_| e)
        })
        .map_err(|e| EngineError::internal(format!("cannot find the clone's RAM: {e}")))
}

/// The clone's private pages and their contents, read while it is stopped.
pub type Captured = (Vec<u64>, Vec<u8>);

/// A clone's changed pages, as a freeze leaves them for publish.
pub enum Pending {
    /// Read in the pause (a `diff` or `full` save).
    Read(Captured),
    /// In a live save's mapped-ram file: publish reads these pages from the
    /// file (see super::live::thin); `None` when the clone's private pages
    /// could not be listed, and every page is compared.
    Live(Option<Vec<u64>>),
}

/// Start reading the clone's private pages (the source is stopped) on a
/// blocking thread, and answer how long it took with them. The caller saves
/// the device state and freezes the disk meanwhile: QEMU does those, the
/// daemon does this, and neither touches guest RAM, so the pause costs the
/// longer of the two rather than their sum.
pub fn start_capture(m: RamMapping) -> tokio::task::JoinHandle<std::io::Result<(Captured, f64)>> {
    tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let pages = forkvm_qemu::ram::private_pages(&m)?;
        let data = forkvm_qemu::ram::read_pages(&m, &pages)?;
        Ok(((pages, data), ms(t.elapsed())))
    })
}

/// Wait for [`start_capture`].
pub async fn finish_capture(
    task: tokio::task::JoinHandle<std::io::Result<(Captured, f64)>>,
    timings: &mut SnapshotTimings,
) -> Result<Captured, EngineError> {
    let (c, took) = task
        .await
        .map_err(|e| EngineError::internal(e.to_string()))?
        .map_err(|e| EngineError::internal(format!("cannot read the clone's pages: {e}")))?;
    timings.copy_memory_ms = took;
    Ok(c)
}

/// Save the device state only: a diff's RAM is its captured pages.
pub async fn save_devices(
    qmp: &Qmp,
    state_path: &Path,
    t: Instant,
    timings: &mut SnapshotTimings,
) -> Result<(), EngineError> {
    migrate::save_device_state(qmp, state_path)
        .await
        .map_err(|e| qemu_err("saving the device state failed", e))?;
    timings.save_state_ms = ms(t.elapsed());
    Ok(())
}

/// The manifest entry of the changed pages (written at publish).
pub fn artefact() -> forkvm_store::Artefact {
    forkvm_store::Artefact {
        kind: "memory_diff".into(),
        file: forkvm_store::MEMORY_DIFF.into(),
        size: 0,
        allocated: 0,
        sha256: String::new(),
    }
}

/// What publish needs to reduce the captured pages to the changed ones.
pub fn capture(
    chain: Option<Chain>,
    captured: Option<Pending>,
    ram_bytes: u64,
) -> Option<DiffCapture> {
    match (chain, captured) {
        (Some(c), Some(pages)) => Some(DiffCapture {
            ram_bytes,
            pages,
            view: match c.links.last() {
                None => Some(c.mapped()),
                Some(top) => forkvm_store::head::usable(&top.dir, &top.digest).then(|| c.mapped()),
            },
            base: c.base.path(forkvm_store::MEMORY),
            base_state: c.base.path(forkvm_store::DEVICE_STATE),
            links: c.links.iter().map(|l| l.memory_diff_path()).collect(),
        }),
        _ => None,
    }
}
