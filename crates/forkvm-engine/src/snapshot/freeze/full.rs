//! A stopped (`full`) freeze of a sandbox that owns its RAM file
//! (`share=on`): the migration stream skips shared RAM (`x-ignore-shared`),
//! and the RAM file is copied sparsely into the snapshot's `memory.img` while
//! the source is stopped. That makes a `shared` snapshot, whose clones map
//! `memory.img` copy-on-write. (A source that does not own its RAM streams
//! it with the device state, as the frame does by default.)

use std::time::Instant;

use forkvm_api::SnapshotTimings;

use crate::config::SandboxPaths;
use crate::error::EngineError;
use crate::snapshot::store_err;
use crate::util::ms;

/// Copy the source's RAM file into the staging directory.
pub async fn copy_memory(
    paths: &SandboxPaths,
    staging: &forkvm_store::Staging,
    timings: &mut SnapshotTimings,
) -> Result<(), EngineError> {
    let t = Instant::now();
    let src = paths.mem.clone();
    let dst = staging.path(forkvm_store::MEMORY);
    tokio::task::spawn_blocking(move || forkvm_store::sparse_copy(&src, &dst))
        .await
        .map_err(|e| EngineError::internal(e.to_string()))?
        .map_err(store_err)?;
    timings.copy_memory_ms = ms(t.elapsed());
    Ok(())
}

/// The manifest entry of the memory image.
pub fn memory_artefact() -> forkvm_store::Artefact {
    forkvm_store::Artefact {
        kind: "memory".into(),
        file: forkvm_store::MEMORY.into(),
        size: 0,
        allocated: 0,
        sha256: String::new(),
    }
}
