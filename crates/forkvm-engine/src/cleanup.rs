//! Never lose a VM: cleanup that is retried until it is done, and QEMUs of
//! this home that no record accounts for.
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
//!   At start, [`Manager::reap_strays`] looks at every process on the host
//!   whose command line names a VM `forkvm-<id>` with its files under this
//!   home's `sandboxes/` directory. One that a `running` record holds (same
//!   pid) was re-attached already; any other (a record marked `failed` while
//!   its QEMU ran on, a record gone, a pid that changed) is killed and waited
//!   for, so its namespace, cgroup and pool claim can be reclaimed by the
//!   reconciliation that follows. Until then the host firewall keeps treating
//!   its interface as a sandbox's (the rules outlive the daemon).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use forkvm_api::SandboxState;

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

fn marked(dir: &Path) -> Option<Pending> {
    std::fs::read_to_string(dir.join(MARKER))
        .ok()
        .and_then(|s| Pending::parse(&s))
}

fn unmark(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(MARKER));
}

/// Processes whose command line names the VM `forkvm-<id>` and has a path
/// under `sandboxes` (this home's): `(pid, id)`.
pub fn qemus_of_home(sandboxes: &Path) -> Vec<(u32, String)> {
    let prefix = format!("{}/", sandboxes.display());
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if let Some(id) = vm_of(&cmdline, &prefix) {
            out.push((pid, id));
        }
    }
    out
}

/// The sandbox id of a QEMU command line (NUL-separated) that names a VM
/// `forkvm-<id>` and refers to a file under `prefix/<id>/`.
fn vm_of(cmdline: &[u8], prefix: &str) -> Option<String> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let id = args.iter().find_map(|a| {
        let rest = a.strip_prefix("forkvm-")?;
        let id = rest.split(',').next()?;
        (!id.is_empty() && rest.len() > id.len()).then(|| id.to_string())
    })?;
    let own = format!("{prefix}{id}/");
    args.iter().any(|a| a.contains(&own)).then_some(id)
}

impl Manager {
    /// Kill every QEMU of this home that no `running` record holds (run at
    /// start, after re-attaching and before serving). Returns the ids.
    pub async fn reap_strays(self: &Arc<Self>) -> Vec<String> {
        let mut killed = Vec::new();
        for (pid, id) in qemus_of_home(&self.cfg.sandboxes_dir()) {
            let row = self.db.get(&id).ok().flatten();
            let held = row
                .as_ref()
                .is_some_and(|r| r.state == SandboxState::Running && r.pid == Some(pid));
            if held && self.live(&id).is_some_and(|l| l.pid == pid) {
                continue;
            }
            if !process::is_our_qemu(pid, &id) {
                continue;
            }
            let state = row
                .as_ref()
                .map(|r| format!("its record is {:?}", r.state).to_lowercase())
                .unwrap_or_else(|| "it has no record".into());
            tracing::warn!(
                sandbox = %id,
                "found QEMU pid {pid} of sandbox {id} running unmanaged ({state}); killing it"
            );
            process::kill(pid, libc::SIGKILL);
            if tokio::time::timeout(
                Duration::from_secs(15),
                process::wait_foreign_exit(pid, &id),
            )
            .await
            .is_err()
            {
                tracing::error!(sandbox = %id, "QEMU pid {pid} of sandbox {id} did not exit after SIGKILL");
                continue;
            }
            self.jail.release(&id);
            killed.push(id);
        }
        killed
    }

    /// Retry the cleanups left pending (see the module doc).
    pub async fn retry_cleanups(self: &Arc<Self>) {
        let Ok(rd) = std::fs::read_dir(self.cfg.sandboxes_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(id) = e.file_name().into_string() else {
                continue;
            };
            let Some(what) = marked(&e.path()) else {
                continue;
            };
            let Ok(Some(row)) = self.db.get(&id) else {
                unmark(&e.path());
                continue;
            };
            if row.state != SandboxState::Failed || self.live(&id).is_some() {
                continue;
            }
            self.net.teardown(&id, None).await;
            if let Some(left) = leftover(&id) {
                tracing::debug!(sandbox = %id, "cleanup of {id} still incomplete: {left}");
                continue;
            }
            unmark(&e.path());
            match what {
                Pending::Teardown => {
                    let _ = self.db.set_failed(
                        &id,
                        row.failure
                            .as_deref()
                            .and_then(|f| f.split(" (cleanup incomplete").next())
                            .unwrap_or("failed"),
                    );
                    tracing::info!(sandbox = %id, "cleanup of failed sandbox {id} finished");
                }
                Pending::Remove => match self.remove(&id).await {
                    Ok(()) => tracing::info!(sandbox = %id, "removal of {id} finished"),
                    Err(err) => tracing::warn!(
                        sandbox = %id,
                        "removal of {id} still incomplete: {}",
                        err.message
                    ),
                },
            }
        }
    }

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

    fn cmdline(args: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for a in args {
            v.extend_from_slice(a.as_bytes());
            v.push(0);
        }
        v
    }

    #[test]
    fn a_vm_of_this_home_is_recognised() {
        let c = cmdline(&[
            "qemu-system-x86_64",
            "-name",
            "forkvm-sb-1234,debug-threads=on",
            "-qmp",
            "unix:/var/lib/forkvm/sandboxes/sb-1234/qmp.sock,server=on",
        ]);
        assert_eq!(
            vm_of(&c, "/var/lib/forkvm/sandboxes/").as_deref(),
            Some("sb-1234")
        );
        // Another home's VM, or a file of another sandbox, is not ours.
        assert_eq!(vm_of(&c, "/tmp/other/sandboxes/"), None);
        let c = cmdline(&[
            "qemu",
            "-name",
            "forkvm-sb-1,x=y",
            "/h/sandboxes/sb-2/disk.qcow2",
        ]);
        assert_eq!(vm_of(&c, "/h/sandboxes/"), None);
        // Not a VM name at all, an empty id, garbage.
        assert_eq!(
            vm_of(&cmdline(&["bash", "/h/sandboxes/x/"]), "/h/sandboxes/"),
            None
        );
        assert_eq!(
            vm_of(&cmdline(&["forkvm-,a", "/h/sandboxes//"]), "/h/sandboxes/"),
            None
        );
        assert_eq!(vm_of(b"\xff\xfe\0\0", "/h/sandboxes/"), None);
        assert_eq!(vm_of(b"", "/h/sandboxes/"), None);
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
