//! A sandbox's machine and its QEMU process, as typed values in its row:
//! the [`MachineConfig`] it was launched with (`machine`, JSON) and the
//! [`QemuId`] of the QEMU running it (`qemu`, JSON; with the `pid` column).
//!
//! Both are written when QEMU is launched. A restarted daemon re-attaches
//! by them: it trusts the pid only while the process' start time matches
//! (see [`QemuId`]), and knows the machine's NIC, volume port and options
//! without asking the process. Rows written before these columns existed
//! have neither; the daemon derives them once when it re-attaches to such a
//! sandbox (crate::sandbox, `adopt_legacy`) and stores them.

use forkvm_qemu::process::QemuId;
use forkvm_qemu::MachineConfig;
use rusqlite::{params, OptionalExtension};

use super::{Db, DbError};
use crate::changes::Action;

/// The migration to schema 8.
pub(super) const MIGRATE: &str = "ALTER TABLE sandboxes ADD COLUMN machine TEXT;
     ALTER TABLE sandboxes ADD COLUMN qemu TEXT;";

impl Db {
    /// Record a QEMU just launched for the sandbox, and its machine, as
    /// soon as it starts, so a daemon crash during boot can still find and
    /// clean up the process.
    pub fn set_launched(&self, id: &str, q: &QemuId, m: &MachineConfig) -> Result<(), DbError> {
        let (qj, mj) = (json(q)?, json(m)?);
        self.lock().execute(
            "UPDATE sandboxes SET pid=?2, qemu=?3, machine=?4 WHERE id=?1",
            params![id, q.pid, qj, mj],
        )?;
        self.sandbox_changed(id, Action::Updated);
        Ok(())
    }

    /// The machine and QEMU recorded for a sandbox (`None` for what its row
    /// lacks: no QEMU now, or a row from before the columns). A column
    /// that does not parse is reported, not guessed around.
    pub fn launched(&self, id: &str) -> Result<(Option<QemuId>, Option<MachineConfig>), DbError> {
        let r: Option<(Option<String>, Option<String>)> = self
            .lock()
            .query_row(
                "SELECT qemu, machine FROM sandboxes WHERE id=?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((q, m)) = r else {
            return Ok((None, None));
        };
        Ok((parse(id, "qemu", q)?, parse(id, "machine", m)?))
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, DbError> {
    serde_json::to_string(v).map_err(|e| DbError::Corrupt(format!("cannot encode: {e}")))
}

fn parse<T: serde::de::DeserializeOwned>(
    id: &str,
    what: &str,
    v: Option<String>,
) -> Result<Option<T>, DbError> {
    v.map(|s| {
        serde_json::from_str(&s).map_err(|e| DbError::Corrupt(format!("{what} of {id}: {e}")))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MachineConfig {
        MachineConfig {
            machine: forkvm_qemu::spec::MACHINE.into(),
            accel: forkvm_qemu::Accel::Tcg,
            memory_mib: 512,
            cpus: 1,
            kernel: "/k".into(),
            initrd: "/i".into(),
            cmdline: "console=ttyS0".into(),
            volume_port: true,
            nic: Some(forkvm_qemu::Nic::standard()),
        }
    }

    fn row(id: &str) -> super::super::SandboxRow {
        super::super::test_row(id)
    }

    #[test]
    fn the_machine_and_qemu_round_trip_and_go_with_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let q = QemuId {
            pid: 42,
            start: 777,
            boot: "b".into(),
        };
        {
            let db = Db::open(&path).unwrap();
            db.insert(&row("a")).unwrap();
            assert_eq!(db.launched("a").unwrap(), (None, None));
            db.set_launched("a", &q, &config()).unwrap();
        }
        let db = Db::open(&path).unwrap();
        assert_eq!(db.get("a").unwrap().unwrap().pid, Some(42));
        assert_eq!(db.launched("a").unwrap(), (Some(q), Some(config())));
        // A failed sandbox has no QEMU; its machine stays on record.
        db.set_failed("a", "boom").unwrap();
        assert_eq!(db.launched("a").unwrap(), (None, Some(config())));
        assert_eq!(db.launched("nobody").unwrap(), (None, None));
    }

    #[test]
    fn a_garbled_column_is_reported_not_guessed() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("state.db")).unwrap();
        db.insert(&row("a")).unwrap();
        db.lock()
            .execute(
                "UPDATE sandboxes SET machine='{\"cpus\": 1}' WHERE id='a'",
                [],
            )
            .unwrap();
        let e = db.launched("a").unwrap_err().to_string();
        assert!(
            e.contains("machine of a") && e.contains("missing field"),
            "{e}"
        );
        db.lock()
            .execute(
                "UPDATE sandboxes SET machine=NULL, qemu='12' WHERE id='a'",
                [],
            )
            .unwrap();
        let e = db.launched("a").unwrap_err().to_string();
        assert!(e.contains("qemu of a"), "{e}");
    }

    /// A row of schema 7 (no machine, no qemu) reads with neither, and
    /// gets both once recorded.
    #[test]
    fn rows_from_schema_7_migrate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let db = Db::open(&path).unwrap();
            db.insert(&row("a")).unwrap();
            // Undo the migration: what a schema 7 database looked like.
            db.lock()
                .execute_batch(
                    "ALTER TABLE sandboxes DROP COLUMN machine;
                     ALTER TABLE sandboxes DROP COLUMN qemu;
                     PRAGMA user_version = 7;",
                )
                .unwrap();
        }
        let db = Db::open(&path).unwrap();
        assert_eq!(db.launched("a").unwrap(), (None, None));
        let q = QemuId {
            pid: 7,
            start: 1,
            boot: "b".into(),
        };
        db.set_launched("a", &q, &config()).unwrap();
        assert_eq!(db.launched("a").unwrap(), (Some(q), Some(config())));
    }
}
