//! How a snapshot was made, beyond its row: a branch point's mode, the
//! source's pause, and what a flattened snapshot was flattened from. The
//! dashboard's tree shows them; they live in their own table so that older
//! rows simply have none.

use rusqlite::{params, OptionalExtension};

use super::{Db, DbError};

pub(super) const CREATE: &str = "CREATE TABLE IF NOT EXISTS snapshot_info (
    id TEXT PRIMARY KEY,
    mode TEXT,
    pause_ms REAL,
    flattened_from TEXT
);";

/// The `snapshot_info` row of a snapshot (all `None` when it has none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotInfo {
    /// `live`, `diff` or `full` for a branch point.
    pub mode: Option<String>,
    pub pause_ms: Option<f64>,
    pub flattened_from: Option<String>,
}

impl Db {
    /// Record how a snapshot was made (replacing what was recorded).
    /// Called before its row is inserted, so no notice is sent: the row's
    /// `created` notice carries it.
    pub fn set_snapshot_info(&self, id: &str, i: &SnapshotInfo) -> Result<(), DbError> {
        self.lock().execute(
            "INSERT OR REPLACE INTO snapshot_info (id, mode, pause_ms, flattened_from)
             VALUES (?1, ?2, ?3, ?4)",
            params![id, i.mode, i.pause_ms, i.flattened_from],
        )?;
        Ok(())
    }

    pub fn snapshot_info(&self, id: &str) -> Result<SnapshotInfo, DbError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT mode, pause_ms, flattened_from FROM snapshot_info WHERE id=?1",
                params![id],
                |r| {
                    Ok(SnapshotInfo {
                        mode: r.get(0)?,
                        pause_ms: r.get(1)?,
                        flattened_from: r.get(2)?,
                    })
                },
            )
            .optional()?
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_is_stored_replaced_and_removed_with_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("state.db")).unwrap();
        let mut rx = db.changes.receiver();
        assert_eq!(db.snapshot_info("sn-1").unwrap(), SnapshotInfo::default());
        let i = SnapshotInfo {
            mode: Some("live".into()),
            pause_ms: Some(6.5),
            flattened_from: None,
        };
        db.set_snapshot_info("sn-1", &i).unwrap();
        assert_eq!(db.snapshot_info("sn-1").unwrap(), i);
        assert!(rx.try_recv().is_err(), "the row's own notice carries it");
        let j = SnapshotInfo {
            flattened_from: Some("sn-0".into()),
            ..Default::default()
        };
        db.set_snapshot_info("sn-1", &j).unwrap();
        assert_eq!(db.snapshot_info("sn-1").unwrap(), j);
        // No snapshots row: nothing to delete, but the info goes.
        assert!(!db.delete_snapshot("sn-1").unwrap());
        assert_eq!(db.snapshot_info("sn-1").unwrap(), SnapshotInfo::default());
    }
}
