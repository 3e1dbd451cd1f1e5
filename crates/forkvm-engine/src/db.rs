//! The daemon's persistent state, in SQLite (`$FORKVM_HOME/state.db`).
//!
//! The database is the source of truth across daemon restarts: on start the
//! daemon reads every sandbox row and re-attaches to the QEMU processes that
//! are still alive. SQLite runs in WAL mode with `synchronous=NORMAL`: a
//! crash can lose the last transaction but never corrupts the file.
//!
//! Schema changes bump `user_version` and add a migration step in
//! [`Db::migrate`].

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use forkvm_api::{SandboxState, SpawnTimings};

use crate::changes::{Action, Change, Notifier};
use crate::error::EngineError;

mod info;
mod lifecycle;
mod machine;
mod origin;
mod timeline;
pub use info::SnapshotInfo;
pub use lifecycle::LifecycleRow;
pub use origin::Origin;
pub use timeline::{CheckpointRow, TimelineRow};

/// A stored sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub id: String,
    pub state: SandboxState,
    pub image: String,
    pub memory_mib: u32,
    pub cpus: u32,
    pub accel: String,
    pub pid: Option<u32>,
    pub created_at: String,
    pub failure: Option<String>,
    pub timings: Option<SpawnTimings>,
    /// The snapshot this sandbox was spawned from, if any.
    pub snapshot: Option<String>,
    /// Its network (JSON in the `network` column), once set up.
    pub network: Option<crate::net::types::SandboxNet>,
}

/// A stored snapshot (the files are in the store; this is the index).
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    pub id: String,
    pub tag: Option<String>,
    pub parent: Option<String>,
    pub source: String,
    pub image: String,
    pub memory_mib: u32,
    pub cpus: u32,
    pub created_at: String,
    /// Set for boot templates: the key they serve.
    pub template_key: Option<String>,
    /// The snapshot's own warm-pool size; `None` follows the daemon's
    /// default (`serve --pool-size`).
    pub pool_size: Option<u32>,
    /// What made it; garbage collection only ever takes branch points.
    pub origin: Origin,
    /// Kept from garbage collection whatever else holds (`snapshot pin`).
    pub pinned: bool,
}

/// Database errors.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("state database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("state database holds an unreadable row: {0}")]
    Corrupt(String),
}

/// A handle on the state database.
pub struct Db {
    conn: Mutex<Connection>,
    /// Every insert, update and delete is reported here (crate::changes).
    pub changes: Notifier,
}

const SCHEMA_VERSION: i64 = 9;

/// A state's name, as stored and as the API spells it.
pub fn state_str(s: SandboxState) -> &'static str {
    match s {
        SandboxState::Starting => "starting",
        SandboxState::Running => "running",
        SandboxState::Failed => "failed",
        SandboxState::Paused => "paused",
        // Only a cluster gateway reports it; a daemon never stores it.
        SandboxState::Lost => "lost",
    }
}

fn parse_state(s: &str) -> Result<SandboxState, DbError> {
    Ok(match s {
        "starting" => SandboxState::Starting,
        "running" => SandboxState::Running,
        "failed" => SandboxState::Failed,
        "paused" => SandboxState::Paused,
        "lost" => SandboxState::Lost,
        other => return Err(DbError::Corrupt(format!("unknown state {other:?}"))),
    })
}

impl Db {
    /// Open (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let db = Db {
            conn: Mutex::new(conn),
            changes: Notifier::default(),
        };
        db.migrate()?;
        Ok(db)
    }

    pub fn sandbox_changed(&self, id: &str, a: Action) {
        self.changes.send(Change::Sandbox(id.to_string(), a));
    }

    pub fn snapshot_changed(&self, id: &str, a: Action) {
        self.changes.send(Change::Snapshot(id.to_string(), a));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection usable: SQLite
        // rolls back the open statement itself.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn migrate(&self) -> Result<(), DbError> {
        let conn = self.lock();
        let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if v < 1 {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS sandboxes (
                    id TEXT PRIMARY KEY,
                    state TEXT NOT NULL,
                    image TEXT NOT NULL,
                    memory_mib INTEGER NOT NULL,
                    cpus INTEGER NOT NULL,
                    accel TEXT NOT NULL,
                    pid INTEGER,
                    created_at TEXT NOT NULL,
                    failure TEXT,
                    timings TEXT
                );",
            )?;
            conn.pragma_update(None, "user_version", 1)?;
        }
        if v < 2 {
            conn.execute_batch(
                "ALTER TABLE sandboxes ADD COLUMN snapshot TEXT;
                 CREATE TABLE IF NOT EXISTS snapshots (
                    id TEXT PRIMARY KEY,
                    tag TEXT UNIQUE,
                    parent TEXT,
                    source TEXT NOT NULL,
                    image TEXT NOT NULL,
                    memory_mib INTEGER NOT NULL,
                    cpus INTEGER NOT NULL,
                    created_at TEXT NOT NULL,
                    template_key TEXT UNIQUE,
                    pool_size INTEGER NOT NULL DEFAULT 0
                 );",
            )?;
            conn.pragma_update(None, "user_version", 2)?;
        }
        if v < 3 {
            conn.execute_batch("ALTER TABLE sandboxes ADD COLUMN network TEXT;")?;
            conn.pragma_update(None, "user_version", 3)?;
        }
        if v < 4 {
            // `pool_size` becomes nullable: NULL follows the daemon's
            // default. SQLite cannot drop a NOT NULL constraint in place, so
            // the table is rebuilt, in one transaction. Every snapshot used
            // to have a size (0 when unset), so 0 becomes NULL.
            conn.execute_batch(
                "BEGIN;
                 CREATE TABLE snapshots_v4 (
                    id TEXT PRIMARY KEY,
                    tag TEXT UNIQUE,
                    parent TEXT,
                    source TEXT NOT NULL,
                    image TEXT NOT NULL,
                    memory_mib INTEGER NOT NULL,
                    cpus INTEGER NOT NULL,
                    created_at TEXT NOT NULL,
                    template_key TEXT UNIQUE,
                    pool_size INTEGER
                 );
                 INSERT INTO snapshots_v4
                    SELECT id, tag, parent, source, image, memory_mib, cpus,
                           created_at, template_key, NULLIF(pool_size, 0)
                    FROM snapshots;
                 DROP TABLE snapshots;
                 ALTER TABLE snapshots_v4 RENAME TO snapshots;
                 PRAGMA user_version = 4;
                 COMMIT;",
            )?;
        }
        if v < 5 {
            // What made each snapshot, and pins, for garbage collection.
            // Rows from before are of unknown origin (never collected),
            // except boot templates, which their key identifies.
            conn.execute_batch(
                "BEGIN;
                 ALTER TABLE snapshots ADD COLUMN origin TEXT;
                 ALTER TABLE snapshots ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
                 UPDATE snapshots SET origin = 'template' WHERE template_key IS NOT NULL;
                 PRAGMA user_version = 5;
                 COMMIT;",
            )?;
        }
        if v < 6 {
            // Metadata, default environment, timeouts and pauses
            // (see db/lifecycle.rs).
            conn.execute_batch(lifecycle::CREATE)?;
            conn.pragma_update(None, "user_version", 6)?;
        }
        if v < 7 {
            // How each snapshot was made, for the dashboard (db/info.rs).
            conn.execute_batch(info::CREATE)?;
            conn.pragma_update(None, "user_version", 7)?;
        }
        if v < 8 {
            // Each sandbox's machine and QEMU identity (db/machine.rs).
            conn.execute_batch(machine::MIGRATE)?;
            conn.pragma_update(None, "user_version", 8)?;
        }
        if v < 9 {
            // Checkpoint timelines and their retention (db/timeline.rs).
            conn.execute_batch(timeline::CREATE)?;
            conn.pragma_update(None, "user_version", 9)?;
        }
        debug_assert_eq!(SCHEMA_VERSION, 9);
        Ok(())
    }

    pub fn insert(&self, r: &SandboxRow) -> Result<(), DbError> {
        let timings = r
            .timings
            .as_ref()
            .map(|t| serde_json::to_string(t).unwrap_or_default());
        self.lock().execute(
            "INSERT INTO sandboxes (id, state, image, memory_mib, cpus, accel, pid, created_at, failure, timings, snapshot, network)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                r.id,
                state_str(r.state),
                r.image,
                r.memory_mib,
                r.cpus,
                r.accel,
                r.pid,
                r.created_at,
                r.failure,
                timings,
                r.snapshot,
                r.network
                    .as_ref()
                    .map(|n| serde_json::to_string(n).unwrap_or_default())
            ],
        )?;
        self.sandbox_changed(&r.id, Action::Created);
        Ok(())
    }

    /// Record that the sandbox runs (with its pid and spawn timings).
    pub fn set_running(&self, id: &str, pid: u32, timings: &SpawnTimings) -> Result<(), DbError> {
        let t = serde_json::to_string(timings).unwrap_or_default();
        self.lock().execute(
            "UPDATE sandboxes SET state='running', pid=?2, timings=?3 WHERE id=?1",
            params![id, pid, t],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    /// Record a sandbox's network once it is set up.
    pub fn set_network(
        &self,
        id: &str,
        net: Option<&crate::net::types::SandboxNet>,
    ) -> Result<(), DbError> {
        let j = net.map(|n| serde_json::to_string(n).unwrap_or_default());
        self.lock().execute(
            "UPDATE sandboxes SET network=?2 WHERE id=?1",
            params![id, j],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    pub fn set_failed(&self, id: &str, reason: &str) -> Result<(), DbError> {
        self.lock().execute(
            "UPDATE sandboxes SET state='failed', pid=NULL, qemu=NULL, failure=?2 WHERE id=?1",
            params![id, reason],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    pub fn delete(&self, id: &str) -> Result<bool, DbError> {
        let gone = {
            let conn = self.lock();
            self.delete_lifecycle(&conn, id)?;
            conn.execute("DELETE FROM timelines WHERE sandbox=?1", params![id])?;
            conn.execute("DELETE FROM sandboxes WHERE id=?1", params![id])? > 0
        };
        if gone {
            self.sandbox_changed(id, Action::Deleted);
        }
        Ok(gone)
    }

    pub fn get(&self, id: &str) -> Result<Option<SandboxRow>, DbError> {
        let conn = self.lock();
        let row = conn
            .query_row(
                "SELECT id, state, image, memory_mib, cpus, accel, pid, created_at, failure, timings, snapshot, network
                 FROM sandboxes WHERE id=?1",
                params![id],
                raw_row,
            )
            .optional()?;
        row.map(finish_row).transpose()
    }

    pub fn list(&self) -> Result<Vec<SandboxRow>, DbError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT id, state, image, memory_mib, cpus, accel, pid, created_at, failure, timings, snapshot, network
             FROM sandboxes ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], raw_row)?;
        let mut out = Vec::new();
        for r in rows {
            out.push(finish_row(r?)?);
        }
        Ok(out)
    }

    /// Sandboxes spawned from a snapshot (any state).
    pub fn sandboxes_of_snapshot(&self, snap: &str) -> Result<Vec<String>, DbError> {
        let conn = self.lock();
        let mut st = conn.prepare("SELECT id FROM sandboxes WHERE snapshot=?1 ORDER BY id")?;
        let v = st
            .query_map(params![snap], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        Ok(v)
    }

    pub fn insert_snapshot(&self, r: &SnapshotRow) -> Result<(), DbError> {
        self.lock().execute(
            "INSERT INTO snapshots (id, tag, parent, source, image, memory_mib, cpus, created_at, template_key, pool_size, origin, pinned)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                r.id,
                r.tag,
                r.parent,
                r.source,
                r.image,
                r.memory_mib,
                r.cpus,
                r.created_at,
                r.template_key,
                r.pool_size,
                r.origin.as_str(),
                r.pinned
            ],
        )?;
        self.snapshot_changed(&r.id, Action::Created);
        Ok(())
    }

    fn snapshot_where(&self, clause: &str, arg: &str) -> Result<Vec<SnapshotRow>, DbError> {
        let conn = self.lock();
        let mut st = conn.prepare(&format!(
            "SELECT id, tag, parent, source, image, memory_mib, cpus, created_at, template_key, pool_size, origin, pinned
             FROM snapshots {clause} ORDER BY created_at, id"
        ))?;
        let map = |r: &rusqlite::Row<'_>| {
            Ok(SnapshotRow {
                id: r.get(0)?,
                tag: r.get(1)?,
                parent: r.get(2)?,
                source: r.get(3)?,
                image: r.get(4)?,
                memory_mib: r.get(5)?,
                cpus: r.get(6)?,
                created_at: r.get(7)?,
                template_key: r.get(8)?,
                pool_size: r.get(9)?,
                origin: Origin::parse(r.get::<_, Option<String>>(10)?.as_deref()),
                pinned: r.get(11)?,
            })
        };
        let rows = if clause.contains("?1") {
            st.query_map(params![arg], map)?
                .collect::<Result<Vec<_>, _>>()?
        } else {
            st.query_map([], map)?.collect::<Result<Vec<_>, _>>()?
        };
        Ok(rows)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>, DbError> {
        self.snapshot_where("", "")
    }

    /// A snapshot by id or tag.
    pub fn snapshot(&self, id_or_tag: &str) -> Result<Option<SnapshotRow>, DbError> {
        Ok(self
            .snapshot_where("WHERE id=?1 OR tag=?1", id_or_tag)?
            .into_iter()
            .next())
    }

    pub fn snapshot_by_template(&self, key: &str) -> Result<Option<SnapshotRow>, DbError> {
        Ok(self
            .snapshot_where("WHERE template_key=?1", key)?
            .into_iter()
            .next())
    }

    pub fn child_snapshots(&self, parent: &str) -> Result<Vec<SnapshotRow>, DbError> {
        self.snapshot_where("WHERE parent=?1", parent)
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<bool, DbError> {
        let gone = {
            let conn = self.lock();
            conn.execute("DELETE FROM snapshot_info WHERE id=?1", params![id])?;
            conn.execute("DELETE FROM checkpoints WHERE id=?1", params![id])?;
            conn.execute("DELETE FROM snapshots WHERE id=?1", params![id])? > 0
        };
        if gone {
            self.snapshot_changed(id, Action::Deleted);
        }
        Ok(gone)
    }

    /// Set (or with `None`, drop) a snapshot's own warm-pool size.
    pub fn set_pool_size(&self, id: &str, n: Option<u32>) -> Result<(), DbError> {
        self.lock().execute(
            "UPDATE snapshots SET pool_size=?2 WHERE id=?1",
            params![id, n],
        )?;
        self.snapshot_changed(id, Action::Updated);
        Ok(())
    }

    /// Pin or unpin a snapshot; false when there is no such row.
    pub fn set_pinned(&self, id: &str, pinned: bool) -> Result<bool, DbError> {
        let found = self.lock().execute(
            "UPDATE snapshots SET pinned=?2 WHERE id=?1",
            params![id, pinned],
        )? > 0;
        if found {
            self.snapshot_changed(id, Action::Updated);
        }
        Ok(found)
    }

    /// How many sandboxes (in any state) run from each snapshot.
    pub fn sandboxes_per_snapshot(
        &self,
    ) -> Result<std::collections::HashMap<String, u32>, DbError> {
        let conn = self.lock();
        let mut st = conn.prepare(
            "SELECT snapshot, COUNT(*) FROM sandboxes WHERE snapshot IS NOT NULL GROUP BY snapshot",
        )?;
        let v = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        Ok(v)
    }

    pub fn count(&self) -> Result<u32, DbError> {
        Ok(self
            .lock()
            .query_row("SELECT COUNT(*) FROM sandboxes", [], |r| r.get(0))?)
    }
}

type Raw = (
    String,
    String,
    String,
    u32,
    u32,
    String,
    Option<u32>,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
    ))
}

fn finish_row(r: Raw) -> Result<SandboxRow, DbError> {
    let timings = match r.9 {
        Some(t) => Some(
            serde_json::from_str(&t)
                .map_err(|e| DbError::Corrupt(format!("timings of {}: {e}", r.0)))?,
        ),
        None => None,
    };
    let network = match &r.11 {
        Some(n) => Some(
            serde_json::from_str(n)
                .map_err(|e| DbError::Corrupt(format!("network of {}: {e}", r.0)))?,
        ),
        None => None,
    };
    Ok(SandboxRow {
        state: parse_state(&r.1)?,
        id: r.0,
        image: r.2,
        memory_mib: r.3,
        cpus: r.4,
        accel: r.5,
        pid: r.6,
        created_at: r.7,
        failure: r.8,
        timings,
        snapshot: r.10,
        network,
    })
}

impl From<DbError> for EngineError {
    fn from(e: DbError) -> Self {
        EngineError::internal(format!("{e}; check the disk holding FORKVM_HOME"))
    }
}

/// A starting sandbox's row, for the db's unit tests.
#[cfg(test)]
pub(crate) fn test_row(id: &str) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        state: SandboxState::Starting,
        image: "default".into(),
        memory_mib: 512,
        cpus: 1,
        accel: "tcg".into(),
        pid: None,
        created_at: "2026-01-01T00:00:00Z".into(),
        failure: None,
        timings: None,
        snapshot: None,
        network: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> SandboxRow {
        test_row(id)
    }

    #[test]
    fn lifecycle_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let db = Db::open(&path).unwrap();
            db.insert(&row("a")).unwrap();
            db.insert(&row("b")).unwrap();
            let t = SpawnTimings {
                total_ms: 5.0,
                ..Default::default()
            };
            db.set_running("a", 42, &t).unwrap();
            db.set_failed("b", "boom").unwrap();
            assert!(db.insert(&row("a")).is_err(), "duplicate id must fail");
        }
        let db = Db::open(&path).unwrap();
        let a = db.get("a").unwrap().unwrap();
        assert_eq!(a.state, SandboxState::Running);
        assert_eq!(a.pid, Some(42));
        assert_eq!(a.timings.unwrap().total_ms, 5.0);
        let b = db.get("b").unwrap().unwrap();
        assert_eq!(b.failure.as_deref(), Some("boom"));
        assert_eq!(db.count().unwrap(), 2);
        assert!(db.delete("a").unwrap());
        assert!(!db.delete("a").unwrap());
        assert!(db.get("a").unwrap().is_none());
    }

    #[test]
    fn corrupt_rows_are_reported_not_panicked() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("s.db")).unwrap();
        db.insert(&row("x")).unwrap();
        db.lock()
            .execute("UPDATE sandboxes SET state='exploded'", [])
            .unwrap();
        assert!(matches!(db.get("x"), Err(DbError::Corrupt(_))));
        db.lock()
            .execute("UPDATE sandboxes SET state='running', timings='{bad'", [])
            .unwrap();
        assert!(matches!(db.list(), Err(DbError::Corrupt(_))));
    }

    #[test]
    fn pool_sizes_migrate_from_v3_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            // A version 3 database, as the daemon left it before v4.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE snapshots (
                    id TEXT PRIMARY KEY, tag TEXT UNIQUE, parent TEXT,
                    source TEXT NOT NULL, image TEXT NOT NULL,
                    memory_mib INTEGER NOT NULL, cpus INTEGER NOT NULL,
                    created_at TEXT NOT NULL, template_key TEXT UNIQUE,
                    pool_size INTEGER NOT NULL DEFAULT 0);
                 CREATE TABLE sandboxes (id TEXT PRIMARY KEY, state TEXT NOT NULL,
                    image TEXT NOT NULL, memory_mib INTEGER NOT NULL,
                    cpus INTEGER NOT NULL, accel TEXT NOT NULL, pid INTEGER,
                    created_at TEXT NOT NULL, failure TEXT, timings TEXT,
                    snapshot TEXT, network TEXT);
                 INSERT INTO snapshots VALUES
                    ('sn-a', 'keep', NULL, 'sb-1', 'default', 512, 1, 't1', NULL, 3),
                    ('sn-b', NULL, 'sn-a', 'sb-1', 'default', 512, 1, 't2', 'k', 0);
                 PRAGMA user_version = 3;",
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        let a = db.snapshot("keep").unwrap().unwrap();
        assert_eq!((a.id.as_str(), a.pool_size), ("sn-a", Some(3)));
        let b = db.snapshot_by_template("k").unwrap().unwrap();
        assert_eq!((b.parent.as_deref(), b.pool_size), (Some("sn-a"), None));
        db.set_pool_size("sn-b", Some(0)).unwrap();
        assert_eq!(db.snapshot("sn-b").unwrap().unwrap().pool_size, Some(0));
        db.set_pool_size("sn-a", None).unwrap();
        drop(db);
        let db = Db::open(&path).unwrap();
        assert_eq!(db.snapshot("sn-a").unwrap().unwrap().pool_size, None);
        assert_eq!(db.snapshot("sn-b").unwrap().unwrap().pool_size, Some(0));
        let v: i64 = db
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn origins_and_pins_migrate_from_v4_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            // A version 4 database, as the daemon left it before v5.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE snapshots (
                    id TEXT PRIMARY KEY, tag TEXT UNIQUE, parent TEXT,
                    source TEXT NOT NULL, image TEXT NOT NULL,
                    memory_mib INTEGER NOT NULL, cpus INTEGER NOT NULL,
                    created_at TEXT NOT NULL, template_key TEXT UNIQUE,
                    pool_size INTEGER);
                 CREATE TABLE sandboxes (id TEXT PRIMARY KEY, state TEXT NOT NULL,
                    image TEXT NOT NULL, memory_mib INTEGER NOT NULL,
                    cpus INTEGER NOT NULL, accel TEXT NOT NULL, pid INTEGER,
                    created_at TEXT NOT NULL, failure TEXT, timings TEXT,
                    snapshot TEXT, network TEXT);
                 INSERT INTO snapshots VALUES
                    ('sn-t', NULL, NULL, 'sb-0', 'default', 512, 1, 't0', 'key', NULL),
                    ('sn-a', NULL, 'sn-t', 'sb-1', 'default', 512, 1, 't1', NULL, 0);
                 INSERT INTO sandboxes VALUES
                    ('sb-2', 'running', 'default', 512, 1, 'tcg', 7, 't2', NULL, NULL, 'sn-a', NULL),
                    ('sb-3', 'failed', 'default', 512, 1, 'tcg', NULL, 't3', 'x', NULL, 'sn-a', NULL);
                 PRAGMA user_version = 4;",
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        let t = db.snapshot("sn-t").unwrap().unwrap();
        assert_eq!((t.origin, t.pinned), (Origin::Template, false));
        // A snapshot from before origins were recorded is never taken for
        // a branch point, even one with a branch's pool size of 0.
        let a = db.snapshot("sn-a").unwrap().unwrap();
        assert_eq!(
            (a.origin, a.pinned, a.pool_size),
            (Origin::Unknown, false, Some(0))
        );
        assert!(db.set_pinned("sn-a", true).unwrap());
        assert!(!db.set_pinned("sn-nope", true).unwrap());
        let mut b = a.clone();
        b.id = "sn-b".into();
        b.origin = Origin::Branch;
        b.pinned = false;
        db.insert_snapshot(&b).unwrap();
        let per = db.sandboxes_per_snapshot().unwrap();
        assert_eq!(per.get("sn-a"), Some(&2));
        assert_eq!(per.get("sn-b"), None);
        drop(db);
        let db = Db::open(&path).unwrap();
        assert!(db.snapshot("sn-a").unwrap().unwrap().pinned);
        let b = db.snapshot("sn-b").unwrap().unwrap();
        assert_eq!((b.origin, b.pinned), (Origin::Branch, false));
        // A value some later version might write reads as unknown.
        db.lock()
            .execute("UPDATE snapshots SET origin='martian' WHERE id='sn-b'", [])
            .unwrap();
        assert_eq!(
            db.snapshot("sn-b").unwrap().unwrap().origin,
            Origin::Unknown
        );
        let v: i64 = db
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn a_garbage_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        std::fs::write(&path, b"this is not a database, just some bytes........").unwrap();
        assert!(Db::open(&path).is_err());
    }
}
