//! What the front-ends show about the daemon as a whole: its info and the
//! snapshot list, composed here so that no front-end reads the database.

use forkvm_api::{AccelInfo, Info, QemuInfo, SnapshotList};

use crate::db::SnapshotRow;
use crate::error::EngineError;
use crate::manager::Manager;

impl Manager {
    /// Version, node, accelerator and why, QEMU, limits, counts, pools, GC
    /// and capacity (`GET /v1/info`).
    pub fn info(&self) -> Result<Info, EngineError> {
        Ok(Info {
            network: self.net.info(),
            version: env!("CARGO_PKG_VERSION").into(),
            node: self.cfg.node.clone(),
            accel: AccelInfo {
                kind: self.accel.accel.to_string(),
                reason: self.accel.reason.clone(),
            },
            qemu: QemuInfo {
                path: self.cfg.qemu.display().to_string(),
                version: self.qemu_version.clone(),
            },
            limits: self.cfg.limits.clone(),
            home: self.cfg.home.display().to_string(),
            images: self.cfg.images(),
            sandboxes: self.db.count()?,
            snapshots: self.db.snapshots()?.len() as u32,
            default_pool_size: self.default_pool_size,
            pools: self.pool_infos(),
            gc: self.gc_info(),
            capacity: self.capacity(),
        })
    }

    /// Every snapshot: those being written first, then the stored ones. A
    /// stored one that cannot be read is logged and left out.
    pub fn list_snapshots(&self) -> Result<SnapshotList, EngineError> {
        let mut v = self.pending.all();
        for r in self.db.snapshots()? {
            match self.snapshot_view(&r) {
                Ok(s) => v.push(s),
                Err(e) => tracing::warn!("snapshot {} unreadable: {}", r.id, e.message),
            }
        }
        Ok(SnapshotList { snapshots: v })
    }

    /// The stored snapshots' records (for front-ends that show them their
    /// own way, such as E2B's template list).
    pub fn snapshot_records(&self) -> Result<Vec<SnapshotRow>, EngineError> {
        Ok(self.db.snapshots()?)
    }

    /// One stored snapshot's record, by id or tag.
    pub fn snapshot_record(&self, id_or_tag: &str) -> Result<Option<SnapshotRow>, EngineError> {
        Ok(self.db.snapshot(id_or_tag)?)
    }

    /// Fill every snapshot's warm pool (at daemon start).
    pub fn refill_all_pools(self: &std::sync::Arc<Self>) {
        for r in self.db.snapshots().unwrap_or_default() {
            self.refill_pool(&r.id);
        }
    }
}
