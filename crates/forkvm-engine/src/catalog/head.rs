//! The flattened head of a diff snapshot's chain (`memory.head`, see
//! `forkvm_store::head`): built once, at the first spawn that needs it, and
//! then mapped by every clone exactly like a `shared` snapshot's image.
//!
//! Before it existed, every clone mapped the chain's base and had each
//! link's pages written into its private mapping: each clone paid that copy
//! at spawn and kept the pages privately, so siblings shared nothing of the
//! links. Mapping one flat file gives every clone the chain's pages through
//! the page cache, shared, and makes a spawn from a diff cost what a spawn
//! from a `shared` snapshot costs once the head exists.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::error::EngineError;
use crate::manager::Manager;
use crate::snapshot::{store_err, Chain};
use crate::util::ms;

impl Chain {
    /// The file a private clone of this chain maps as its RAM: the base
    /// image for a `shared` snapshot, the flattened head for a `diff` one.
    pub fn mapped(&self) -> PathBuf {
        match self.links.last() {
            Some(top) => top.path(forkvm_store::head::HEAD),
            None => self.base.path(forkvm_store::MEMORY),
        }
    }
}

impl Manager {
    /// Make the chain's head ready to map (verify the chain first): use it
    /// if it is complete and unchanged, else build it. Concurrent spawns of
    /// the same snapshot build it once; the others wait for it.
    pub async fn chain_head(&self, c: &Chain, ram_bytes: u64) -> Result<PathBuf, EngineError> {
        let Some(top) = c.links.last() else {
            return Ok(c.mapped());
        };
        let id = top.manifest.id.clone();
        let lock = {
            let mut m = self.heads.0.lock().unwrap_or_else(|p| p.into_inner());
            m.entry(id.clone()).or_default().clone()
        };
        let r = async {
            let _g = lock.lock().await;
            if forkvm_store::head::usable(&top.dir, &top.digest) {
                return Ok(());
            }
            let t = Instant::now();
            let (dir, key) = (top.dir.clone(), top.digest.clone());
            let base = c.base.path(forkvm_store::MEMORY);
            let links: Vec<PathBuf> = c.links.iter().map(|l| l.memory_diff_path()).collect();
            let built = tokio::task::spawn_blocking(move || {
                forkvm_store::head::build(&dir, &key, &base, &links, ram_bytes)
            })
            .await
            .map_err(|e| EngineError::internal(e.to_string()))?
            .map_err(|e| {
                store_err(match e {
                    forkvm_store::memdiff::MemDiffError::Format(why) => {
                        forkvm_store::StoreError::Corrupt {
                            id: id.clone(),
                            why,
                        }
                    }
                    forkvm_store::memdiff::MemDiffError::Io { path, source } => {
                        forkvm_store::StoreError::Io { path, source }
                    }
                })
            })?;
            tracing::info!(
                snapshot = %id,
                links = c.links.len(),
                base = ?built.base,
                base_bytes = built.base_bytes,
                pages = built.pages,
                ms = ms(t.elapsed()),
                "built the flattened memory of diff snapshot {id}"
            );
            Ok(())
        }
        .await;
        // The last one out forgets the lock (others clone it under the map's
        // lock, so a count of 2 here means nobody else holds or awaits it).
        let mut m = self.heads.0.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&lock) == 2 {
            m.remove(&id);
        }
        drop(m);
        r.map(|()| c.mapped())
    }
}
