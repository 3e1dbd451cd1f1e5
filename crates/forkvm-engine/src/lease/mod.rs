//! Leases that hold snapshots against garbage collection. Below every
//! service that reads a snapshot (spawn, branch, pin), so that the collector
//! (`crate::gc`) can sit above them.

pub mod state;

pub use state::{Doom, Gc, Lease, LeaseState, Leases};

use crate::error::{EngineError, HintAction};
use crate::manager::Manager;

impl Manager {
    /// Hold snapshot `id` against collection while an operation reads it
    /// before anything else keeps it (a spawn, before its sandbox row; a
    /// pin). 409 while the collector removes it, 404 once it has.
    pub fn gc_lease(&self, id: &str) -> Result<Lease, EngineError> {
        let lease = self.gc.leases.try_lease(id).ok_or_else(|| {
            EngineError::conflict(format!(
                "snapshot {id} is being removed by garbage collection (a branch point nothing \
                 needed, past its grace period); tag or pin the branch points you want to keep"
            ))
        })?;
        if self.db.snapshot(id)?.is_none() {
            return Err(EngineError::not_found(format!(
                "no snapshot {id:?} (garbage collection may have removed it)"
            ))
            .hint(HintAction::ListSnapshots));
        }
        Ok(lease)
    }

    /// A lease on a snapshot that is not indexed yet (a branch's, from its
    /// freeze until its children run).
    pub fn gc_lease_new(&self, id: &str) -> Option<Lease> {
        self.gc.leases.try_lease(id)
    }

    /// Wake the background collector (after something stopped using a
    /// snapshot); it still applies the grace period.
    pub fn poke_gc(&self) {
        self.gc.wake.notify_one();
    }
}
