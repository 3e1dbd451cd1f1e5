//! Checkpoint timelines: each sandbox's checkpoints in the order it took
//! them, the one its next checkpoint builds on (its head), and its
//! retention policy. The checkpoints themselves are snapshots (origin
//! `checkpoint`); this table only numbers them and keeps what the timeline
//! shows. See crate::checkpoint and docs/timetravel.md.

use rusqlite::{params, OptionalExtension};

use super::{Action, Db, DbError};

pub(super) const CREATE: &str = "CREATE TABLE IF NOT EXISTS timelines (
    sandbox TEXT PRIMARY KEY,
    head TEXT,
    next_seq INTEGER NOT NULL DEFAULT 1,
    keep_last INTEGER,
    keep_every INTEGER
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL,
    seq INTEGER NOT NULL,
    pause_ms REAL
);
CREATE INDEX IF NOT EXISTS checkpoints_by_sandbox ON checkpoints (sandbox, seq);";

/// A sandbox's timeline (all defaults when it has none yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineRow {
    /// The checkpoint the next one builds on: the last one taken, or the
    /// one the sandbox was rewound to.
    pub head: Option<String>,
    pub next_seq: u64,
    /// Keep the last N checkpoints (`None`: keep all).
    pub keep_last: Option<u32>,
    /// Also keep every Kth (by step number).
    pub keep_every: Option<u32>,
}

impl Default for TimelineRow {
    fn default() -> Self {
        TimelineRow {
            head: None,
            next_seq: 1,
            keep_last: None,
            keep_every: None,
        }
    }
}

/// One checkpoint of a timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointRow {
    pub id: String,
    pub sandbox: String,
    /// Its step number in the sandbox's timeline, from 1.
    pub seq: u64,
    pub pause_ms: Option<f64>,
}

impl Db {
    pub fn timeline(&self, sandbox: &str) -> Result<TimelineRow, DbError> {
        let r = self
            .lock()
            .query_row(
                "SELECT head, next_seq, keep_last, keep_every FROM timelines WHERE sandbox=?1",
                params![sandbox],
                |r| {
                    Ok(TimelineRow {
                        head: r.get(0)?,
                        next_seq: r.get::<_, i64>(1)? as u64,
                        keep_last: r.get(2)?,
                        keep_every: r.get(3)?,
                    })
                },
            )
            .optional()?;
        Ok(r.unwrap_or_default())
    }

    /// Set a sandbox's retention policy (`None` fields: keep all).
    pub fn set_retention(
        &self,
        sandbox: &str,
        keep_last: Option<u32>,
        keep_every: Option<u32>,
    ) -> Result<(), DbError> {
        self.lock().execute(
            "INSERT INTO timelines (sandbox, keep_last, keep_every) VALUES (?1, ?2, ?3)
             ON CONFLICT(sandbox) DO UPDATE SET keep_last=?2, keep_every=?3",
            params![sandbox, keep_last, keep_every],
        )?;
        self.sandbox_changed(sandbox, Action::Updated);
        Ok(())
    }

    /// Record a new checkpoint, make it the head, and number the next.
    pub fn add_checkpoint(&self, c: &CheckpointRow) -> Result<(), DbError> {
        {
            let mut conn = self.lock();
            let tx = conn.transaction()?;
            tx.execute(
                "INSERT INTO checkpoints (id, sandbox, seq, pause_ms) VALUES (?1, ?2, ?3, ?4)",
                params![c.id, c.sandbox, c.seq as i64, c.pause_ms],
            )?;
            tx.execute(
                "INSERT INTO timelines (sandbox, head, next_seq) VALUES (?1, ?2, ?3)
                 ON CONFLICT(sandbox) DO UPDATE SET head=?2, next_seq=?3",
                params![c.sandbox, c.id, c.seq as i64 + 1],
            )?;
            tx.commit()?;
        }
        self.sandbox_changed(&c.sandbox, Action::Updated);
        Ok(())
    }

    /// Make `head` the checkpoint the sandbox's next one builds on (a
    /// rewind).
    pub fn set_timeline_head(&self, sandbox: &str, head: Option<&str>) -> Result<(), DbError> {
        self.lock().execute(
            "INSERT INTO timelines (sandbox, head) VALUES (?1, ?2)
             ON CONFLICT(sandbox) DO UPDATE SET head=?2",
            params![sandbox, head],
        )?;
        // Clients that show the timeline re-read it on this notice.
        self.sandbox_changed(sandbox, Action::Updated);
        Ok(())
    }

    /// A sandbox's checkpoints, oldest first.
    pub fn checkpoints(&self, sandbox: &str) -> Result<Vec<CheckpointRow>, DbError> {
        let conn = self.lock();
        let mut st = conn.prepare(
            "SELECT id, sandbox, seq, pause_ms FROM checkpoints
             WHERE sandbox=?1 ORDER BY seq",
        )?;
        let rows = st.query_map(params![sandbox], row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One checkpoint's row.
    pub fn checkpoint(&self, id: &str) -> Result<Option<CheckpointRow>, DbError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT id, sandbox, seq, pause_ms FROM checkpoints WHERE id=?1",
                params![id],
                row,
            )
            .optional()?)
    }

    /// A snapshot's parent changed: a link below it was spliced out.
    pub fn set_snapshot_parent(&self, id: &str, parent: Option<&str>) -> Result<(), DbError> {
        self.lock().execute(
            "UPDATE snapshots SET parent=?2 WHERE id=?1",
            params![id, parent],
        )?;
        self.snapshot_changed(id, Action::Updated);
        Ok(())
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CheckpointRow> {
    Ok(CheckpointRow {
        id: r.get(0)?,
        sandbox: r.get(1)?,
        seq: r.get::<_, i64>(2)? as u64,
        pause_ms: r.get(3)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_number_themselves_and_move_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("state.db")).unwrap();
        assert_eq!(db.timeline("sb-1").unwrap(), TimelineRow::default());
        db.set_retention("sb-1", Some(3), Some(10)).unwrap();
        for seq in 1..=2 {
            db.add_checkpoint(&CheckpointRow {
                id: format!("sn-{seq}"),
                sandbox: "sb-1".into(),
                seq,
                pause_ms: Some(4.0),
            })
            .unwrap();
        }
        let t = db.timeline("sb-1").unwrap();
        assert_eq!(
            (t.head.as_deref(), t.next_seq, t.keep_last, t.keep_every),
            (Some("sn-2"), 3, Some(3), Some(10))
        );
        db.set_timeline_head("sb-1", Some("sn-1")).unwrap();
        assert_eq!(db.timeline("sb-1").unwrap().head.as_deref(), Some("sn-1"));
        let ids: Vec<String> = db
            .checkpoints("sb-1")
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, ["sn-1", "sn-2"]);
        assert_eq!(db.checkpoint("sn-2").unwrap().unwrap().seq, 2);
        db.delete_snapshot("sn-1").unwrap();
        assert_eq!(db.checkpoints("sb-1").unwrap().len(), 1);
    }
}
