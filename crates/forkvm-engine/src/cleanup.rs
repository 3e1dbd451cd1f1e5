//! Never lose a VM: cleanup that is retried until it is done, and QEMUs of
//! this home that no record accounts for. This module holds the markers and
//! the process checks; the retry itself is in [`crate::teardown`] and the
//! search for strays at start in [`crate::recovery`].
//!
//! Two rules hold whatever fails:
//!
//! - **A sandbox is forgotten only when nothing of it is left.** When a
//!   removal or the teardown after a QEMU exit cannot delete the sandbox's
//!   network namespace (`EMFILE`, `EBUSY`), the record stays, `failed`, with
//!   a reason naming what is left, and a marker file `cleanup.pending` in its
//!   directory. The sweeper retries every [`RETRY_EVERY`] (and after a daemon
//!   restart, since the marker is a file) until the namespace is gone; only
//!   then does a removal delete the record.
//! - **Every QEMU of this home is accounted for before the daemon serves.**
//!   At start, [`Manager::reap_strays`] looks at the QEMU each sandbox
//!   directory under this home's `sandboxes/` records in its `qemu.pid`
//!   file (written at every launch, kept until the directory goes), that
//!   still runs as the same process ([`qemus_of_home`]). One that a
//!   `running` record holds (same process) was re-attached already; any other (a record marked `failed` while
//!   its QEMU ran on, a record gone, a pid that changed) is killed and waited
//!   for, so its namespace, cgroup and pool claim can be reclaimed by the
//!   reconciliation that follows. Until then the host firewall keeps treating
//!   its interface as a sandbox's (the rules outlive the daemon).

use std::path::Path;
use std::time::Duration;

use crate::error::EngineError;
use crate::Manager;
use forkvm_qemu::process;

/// How often pending cleanups are retried.
pub const RETRY_EVERY: Duration = Duration::from_secs(5);

/// The marker of a cleanup still to finish: its content says which.
const MARKER: &str = "cleanup.pending";

/// What a pending cleanup must still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// The user removed the sandbox: delete everything, then the record.
    Remove,
    /// The QEMU exited on its own: tear the network down; the `failed`
    /// record stays until the user removes it.
    Teardown,
}

impl Pending {
    fn as_str(self) -> &'static str {
        match self {
            Pending::Remove => "remove",
            Pending::Teardown => "teardown",
        }
    }

    fn parse(s: &str) -> Option<Pending> {
        match s.trim() {
            "remove" => Some(Pending::Remove),
            "teardown" => Some(Pending::Teardown),
            _ => None,
        }
    }
}

/// What of a sandbox's host state outlived its teardown, if anything.
pub fn leftover(id: &str) -> Option<String> {
    let ns = Path::new("/run/netns").join(forkvm_net::ns_name(id));
    ns.exists().then(|| {
        format!(
            "its network namespace {} could not be deleted",
            ns.display()
        )
    })
}

/// Record that a cleanup must be retried. Returns false if even the marker
/// cannot be written (the record's `failed` reason still says what is left,
/// and the next start retries through [`Manager::reap_strays`]' sweep).
pub fn mark(dir: &Path, what: Pending) -> bool {
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(dir.join(MARKER), what.as_str()).is_ok()
}

pub fn marked(dir: &Path) -> Option<Pending> {
    std::fs::read_to_string(dir.join(MARKER))
        .ok()
        .and_then(|s| Pending::parse(&s))
}

pub fn unmark(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(MARKER));
}

/// The QEMUs of this home: for each sandbox directory under `sandboxes`,
/// the process its `qemu.pid` file records, if that process still runs
/// (`(id, QemuId)`). The file is written at every launch with QEMU's start
/// time, so a pid reused by another process since is not taken for it (see
/// [`process::QemuId`]); a file from an older daemon (a bare pid) is
/// trusted only if that pid serves the sandbox's QMP socket.
pub async fn qemus_of_home(sandboxes: &Path) -> Vec<(String, process::QemuId)> {
    let Ok(rd) = std::fs::read_dir(sandboxes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Ok(id) = e.file_name().into_string() else {
            continue;
        };
        let Some(q) = recorded_qemu(&e.path()).await else {
            continue;
        };
        if process::is_our_qemu(&q) {
            out.push((id, q));
        }
    }
    out
}

/// The QEMU a sandbox directory's `qemu.pid` records (not yet checked to
/// run: see [`process::liveness`]). A bare pid from an older daemon counts
/// only if that pid serves the directory's QMP socket now.
pub async fn recorded_qemu(dir: &Path) -> Option<process::QemuId> {
    let text = std::fs::read_to_string(dir.join(PID_FILE)).ok()?;
    match process::QemuId::parse(&text) {
        Ok(q) => Some(q),
        Err(Some(pid)) => {
            let peer = process::qmp_peer_pid(&dir.join(QMP_SOCKET), Duration::from_secs(2)).await;
            match peer {
                Ok(p) if p == pid => process::QemuId::of(pid).ok(),
                _ => None,
            }
        }
        Err(None) => None,
    }
}

/// The pid file and QMP socket in a sandbox's directory
/// (crate::config::SandboxPaths).
const PID_FILE: &str = "qemu.pid";
const QMP_SOCKET: &str = "qmp.sock";

impl Manager {
    /// After a teardown: if something is left, keep the sandbox visible as
    /// `failed` with what is left and schedule a retry. Returns the error a
    /// removal reports.
    pub fn keep_if_left(&self, id: &str, what: Pending, reason: &str) -> Option<EngineError> {
        let left = leftover(id)?;
        mark(&self.cfg.sandbox_paths(id).dir, what);
        let why = match what {
            Pending::Remove => format!(
                "removal incomplete: {left}; the daemon retries every {} s",
                RETRY_EVERY.as_secs()
            ),
            Pending::Teardown => format!(
                "{reason} (cleanup incomplete: {left}; the daemon retries every {} s)",
                RETRY_EVERY.as_secs()
            ),
        };
        let _ = self.db.set_failed(id, &why);
        tracing::warn!(sandbox = %id, "sandbox {id}: {why}");
        Some(EngineError::internal(format!(
            "sandbox {id}: its VM is gone, but {left}; it stays listed as failed and the daemon \
             retries the cleanup every {} s",
            RETRY_EVERY.as_secs()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox directory whose pid file records `text`, with a QMP
    /// socket served by this process when `serve`.
    fn sandbox(root: &Path, id: &str, text: &str, serve: bool) -> Option<UnixListener> {
        let d = root.join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(PID_FILE), text).unwrap();
        serve.then(|| UnixListener::bind(d.join(QMP_SOCKET)).unwrap())
    }

    use std::os::unix::net::UnixListener;

    /// A QEMU of this home is found by its pid file when the process it
    /// records still runs: here, this test process stands in for it.
    #[tokio::test]
    async fn a_vm_of_this_home_is_recognised() {
        let home = tempfile::tempdir().unwrap();
        let root = home.path().join("sandboxes");
        let me = process::QemuId::of(std::process::id()).unwrap();
        sandbox(&root, "sb-1234", &me.to_file(), false);
        // The same pid with another start time: a reused pid, not ours.
        let mut reused = me.clone();
        reused.start += 1;
        sandbox(&root, "sb-reused", &reused.to_file(), false);
        // A process that has gone.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let gone = process::QemuId::of(c.id()).unwrap();
        c.wait().unwrap();
        sandbox(&root, "sb-gone", &gone.to_file(), false);
        // Garbage, an empty file, and a directory without a pid file.
        sandbox(&root, "sb-garbage", "\u{0}\u{ff} x", false);
        sandbox(&root, "sb-empty", "", false);
        std::fs::create_dir_all(root.join("sb-none")).unwrap();
        // An older daemon's bare pid: ours only if it serves the QMP socket.
        let pid = std::process::id().to_string();
        let _l = sandbox(&root, "sb-old", &pid, true);
        sandbox(&root, "sb-old-unserved", &pid, false);
        sandbox(&root, "sb-old-other", "1", true);
        let mut found = qemus_of_home(&root).await;
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            found,
            vec![
                ("sb-1234".to_string(), me.clone()),
                ("sb-old".to_string(), me)
            ]
        );
        // Another home's directory is not looked at; a missing one is empty.
        assert!(qemus_of_home(&home.path().join("other")).await.is_empty());
    }

    #[test]
    fn markers_round_trip_and_garbage_is_ignored() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(marked(d.path()), None);
        assert!(mark(d.path(), Pending::Remove));
        assert_eq!(marked(d.path()), Some(Pending::Remove));
        assert!(mark(d.path(), Pending::Teardown));
        assert_eq!(marked(d.path()), Some(Pending::Teardown));
        std::fs::write(d.path().join(MARKER), "rm -rf /").unwrap();
        assert_eq!(marked(d.path()), None);
        unmark(d.path());
        assert!(!d.path().join(MARKER).exists());
    }

    #[test]
    fn no_namespace_means_nothing_left() {
        assert_eq!(leftover("sb-does-not-exist-0000"), None);
    }
}
