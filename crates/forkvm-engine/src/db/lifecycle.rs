//! The `lifecycles` table: each sandbox's metadata, default environment,
//! timeout and pause record (schema version 6).
//!
//! ```text
//! lifecycles(id PRIMARY KEY      the sandbox id (deleted with the sandbox)
//!            metadata TEXT       JSON object of strings
//!            env TEXT            JSON object of strings
//!            timeout_s INTEGER   the timeout last set, or NULL
//!            on_timeout TEXT     'kill' | 'pause'
//!            deadline_ms INTEGER Unix ms the timeout runs out; NULL while
//!                                paused or without a timeout
//!            remaining_ms INTEGER time left, kept while paused
//!            pause TEXT          JSON PauseInfo while paused
//!            net TEXT            JSON network (ports, egress) to set up
//!                                again on resume, while paused
//!            limits TEXT)        JSON SandboxLimits
//! ```
//!
//! Deadlines are absolute times, so a timeout keeps running across a daemon
//! restart: the first sweep after the restart acts on whatever ran out while
//! no daemon was there.

use std::collections::BTreeMap;

use forkvm_api::{OnTimeout, PauseInfo};
use rusqlite::{params, OptionalExtension};

use super::{Db, DbError};
use crate::changes::Action;

/// One sandbox's lifecycle record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LifecycleRow {
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub timeout_s: Option<u64>,
    pub on_timeout: OnTimeout,
    pub deadline_ms: Option<i64>,
    pub remaining_ms: Option<i64>,
    pub pause: Option<PauseInfo>,
    /// The network a paused sandbox gets back on resume.
    pub paused_net: Option<crate::net::types::SandboxNet>,
    pub limits: forkvm_api::SandboxLimits,
}

impl LifecycleRow {
    /// Nothing worth storing.
    pub fn is_empty(&self) -> bool {
        *self == LifecycleRow::default()
    }
}

pub(super) const CREATE: &str = "CREATE TABLE IF NOT EXISTS lifecycles (
    id TEXT PRIMARY KEY,
    metadata TEXT,
    env TEXT,
    timeout_s INTEGER,
    on_timeout TEXT NOT NULL DEFAULT 'kill',
    deadline_ms INTEGER,
    remaining_ms INTEGER,
    pause TEXT,
    net TEXT,
    limits TEXT
);
CREATE INDEX IF NOT EXISTS lifecycles_deadline ON lifecycles(deadline_ms);";

fn on_timeout_str(o: OnTimeout) -> &'static str {
    match o {
        OnTimeout::Kill => "kill",
        OnTimeout::Pause => "pause",
        OnTimeout::PauseFilesystem => "pause_filesystem",
    }
}

fn json_map(id: &str, what: &str, s: Option<String>) -> Result<BTreeMap<String, String>, DbError> {
    match s {
        None => Ok(BTreeMap::new()),
        Some(s) => {
            serde_json::from_str(&s).map_err(|e| DbError::Corrupt(format!("{what} of {id}: {e}")))
        }
    }
}

type RawLife = (
    Option<String>,
    Option<String>,
    Option<i64>,
    String,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn finish(id: &str, r: RawLife) -> Result<LifecycleRow, DbError> {
    Ok(LifecycleRow {
        metadata: json_map(id, "metadata", r.0)?,
        env: json_map(id, "env", r.1)?,
        timeout_s: r.2.map(|t| t.max(0) as u64),
        on_timeout: match r.3.as_str() {
            "pause" => OnTimeout::Pause,
            "pause_filesystem" => OnTimeout::PauseFilesystem,
            _ => OnTimeout::Kill,
        },
        deadline_ms: r.4,
        remaining_ms: r.5,
        pause: match r.6 {
            None => None,
            Some(p) => Some(
                serde_json::from_str(&p)
                    .map_err(|e| DbError::Corrupt(format!("pause record of {id}: {e}")))?,
            ),
        },
        limits: match r.8 {
            None => Default::default(),
            Some(l) => serde_json::from_str(&l)
                .map_err(|e| DbError::Corrupt(format!("limits of {id}: {e}")))?,
        },
        paused_net: match r.7 {
            None => None,
            Some(n) => Some(
                serde_json::from_str(&n)
                    .map_err(|e| DbError::Corrupt(format!("paused network of {id}: {e}")))?,
            ),
        },
    })
}

impl Db {
    /// Store (replace) a sandbox's lifecycle record.
    pub fn set_lifecycle(&self, id: &str, l: &LifecycleRow) -> Result<(), DbError> {
        let map = |m: &BTreeMap<String, String>| {
            (!m.is_empty()).then(|| serde_json::to_string(m).unwrap_or_default())
        };
        self.lock().execute(
            "INSERT OR REPLACE INTO lifecycles
                (id, metadata, env, timeout_s, on_timeout, deadline_ms, remaining_ms, pause, net, limits)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                id,
                map(&l.metadata),
                map(&l.env),
                l.timeout_s.map(|t| t as i64),
                on_timeout_str(l.on_timeout),
                l.deadline_ms,
                l.remaining_ms,
                l.pause
                    .as_ref()
                    .map(|p| serde_json::to_string(p).unwrap_or_default()),
                l.paused_net
                    .as_ref()
                    .map(|n| serde_json::to_string(n).unwrap_or_default()),
                (!l.limits.is_empty()).then(|| serde_json::to_string(&l.limits).unwrap_or_default()),
            ],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    /// A sandbox's lifecycle record (the default when it has none).
    pub fn lifecycle(&self, id: &str) -> Result<LifecycleRow, DbError> {
        let conn = self.lock();
        let raw = conn
            .query_row(
                "SELECT metadata, env, timeout_s, on_timeout, deadline_ms, remaining_ms, pause, net, limits
                 FROM lifecycles WHERE id=?1",
                params![id],
                |r| {
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
                    ))
                },
            )
            .optional()?;
        drop(conn);
        match raw {
            None => Ok(LifecycleRow::default()),
            Some(r) => finish(id, r),
        }
    }

    /// Sandboxes whose deadline is at or before `now_ms`.
    pub fn expired(&self, now_ms: i64) -> Result<Vec<String>, DbError> {
        let conn = self.lock();
        let mut st = conn.prepare(
            "SELECT id FROM lifecycles WHERE deadline_ms IS NOT NULL AND deadline_ms <= ?1
             ORDER BY deadline_ms",
        )?;
        let v = st
            .query_map(params![now_ms], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        Ok(v)
    }

    pub(super) fn delete_lifecycle(
        &self,
        conn: &rusqlite::Connection,
        id: &str,
    ) -> Result<(), DbError> {
        conn.execute("DELETE FROM lifecycles WHERE id=?1", params![id])?;
        Ok(())
    }

    /// Record a sandbox as paused (`pid` cleared).
    pub fn set_paused(&self, id: &str) -> Result<(), DbError> {
        self.lock().execute(
            "UPDATE sandboxes SET state='paused', pid=NULL, qemu=NULL WHERE id=?1",
            params![id],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    /// Move a paused sandbox to `starting` (a resume begins); false when it
    /// was not paused (another resume or a removal got there first).
    pub fn claim_paused(&self, id: &str) -> Result<bool, DbError> {
        let claimed = self.lock().execute(
            "UPDATE sandboxes SET state='starting' WHERE id=?1 AND state='paused'",
            params![id],
        )? == 1;
        if claimed {
            self.sandbox_changed(id, Action::Updated);
        }
        Ok(claimed)
    }

    /// Record the snapshot a sandbox now restores from (its pause).
    /// The sandbox no longer runs on a snapshot's memory (a cold resume).
    pub fn clear_snapshot(&self, id: &str) -> Result<(), DbError> {
        self.lock().execute(
            "UPDATE sandboxes SET snapshot=NULL WHERE id=?1",
            params![id],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    pub fn set_snapshot(&self, id: &str, snapshot: &str) -> Result<(), DbError> {
        self.lock().execute(
            "UPDATE sandboxes SET snapshot=?2 WHERE id=?1",
            params![id, snapshot],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_round_trip_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("s.db")).unwrap();
        assert!(db.lifecycle("sb-x").unwrap().is_empty());
        let mut l = LifecycleRow {
            metadata: [("team".to_string(), "a".to_string())].into(),
            env: [("K".to_string(), "v".to_string())].into(),
            timeout_s: Some(5),
            on_timeout: OnTimeout::Pause,
            deadline_ms: Some(1_000),
            remaining_ms: None,
            pause: None,
            paused_net: None,
            limits: forkvm_api::SandboxLimits {
                cpu_percent: Some(50),
                ..Default::default()
            },
        };
        db.set_lifecycle("sb-x", &l).unwrap();
        assert_eq!(db.lifecycle("sb-x").unwrap(), l);
        assert_eq!(db.expired(999).unwrap(), Vec::<String>::new());
        assert_eq!(db.expired(1_000).unwrap(), vec!["sb-x".to_string()]);
        l.deadline_ms = None;
        l.remaining_ms = Some(4_000);
        l.pause = Some(PauseInfo {
            snapshot: Some("sn-1".into()),
            memory: true,
            paused_at: "t".into(),
            reason: "request".into(),
            memory_bytes: 1,
            disk_bytes: 2,
            pause_ms: 3.0,
        });
        db.set_lifecycle("sb-x", &l).unwrap();
        assert_eq!(db.lifecycle("sb-x").unwrap(), l);
        // A filesystem-only pause, timing out into another one.
        l.on_timeout = OnTimeout::PauseFilesystem;
        l.pause = Some(PauseInfo {
            snapshot: None,
            memory: false,
            ..l.pause.clone().unwrap()
        });
        db.set_lifecycle("sb-x", &l).unwrap();
        assert_eq!(db.lifecycle("sb-x").unwrap(), l);
        // A record written before filesystem-only pauses existed.
        db.lock()
            .execute(
                "UPDATE lifecycles SET pause=?1 WHERE id='sb-x'",
                [r#"{"snapshot":"sn-1","paused_at":"t","reason":"request","memory_bytes":1,"disk_bytes":2,"pause_ms":3.0}"#],
            )
            .unwrap();
        let old = db.lifecycle("sb-x").unwrap().pause.unwrap();
        assert!(old.memory && old.snapshot.as_deref() == Some("sn-1"));
        assert!(
            db.expired(i64::MAX).unwrap().is_empty(),
            "a paused sandbox has no deadline"
        );
    }

    #[test]
    fn corrupt_records_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("s.db")).unwrap();
        db.lock()
            .execute(
                "INSERT INTO lifecycles (id, metadata) VALUES ('sb-y', '{not json')",
                [],
            )
            .unwrap();
        let e = db.lifecycle("sb-y").unwrap_err();
        assert!(e.to_string().contains("metadata of sb-y"), "{e}");
    }
}
