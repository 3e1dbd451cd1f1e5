//! Removing every sandbox at once: what a daemon whose life is bound to a
//! test run (`forkvm serve --ephemeral`) does at its end, so that nothing
//! outlives the run. Each removal is the one a client's `DELETE` makes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::manager::Manager;

/// How long a teardown waits for spawns and branches still in flight (a
/// sandbox being made cannot be removed until its spawn returns).
const TEARDOWN_WAIT: Duration = Duration::from_secs(120);

impl Manager {
    /// Remove every sandbox of this daemon. A removal refused because the
    /// sandbox is still starting is retried until [`TEARDOWN_WAIT`]; after
    /// that any QEMU still attached is killed (when it is still that QEMU),
    /// so none outlives the daemon. Returns what could not be removed.
    pub async fn remove_all(self: &Arc<Self>) -> Vec<String> {
        let mgr = self;
        let t = Instant::now();
        let mut last = Vec::new();
        loop {
            let rows = match mgr.db.list() {
                Ok(r) => r,
                Err(e) => return vec![format!("cannot list the sandboxes: {e}")],
            };
            if rows.is_empty() {
                return Vec::new();
            }
            last.clear();
            for r in rows {
                if let Err(e) = mgr.remove(&r.id).await {
                    last.push(format!("{}: {e}", r.id));
                }
            }
            if last.is_empty() {
                continue; // removals may have added nothing; list again to be sure
            }
            if t.elapsed() > TEARDOWN_WAIT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let live: Vec<_> = mgr.live_map().values().cloned().collect();
        for l in live {
            tracing::warn!(sandbox = %l.id, "teardown: killing QEMU (pid {}) of {}", l.pid, l.id);
            if forkvm_qemu::process::is_our_qemu(&l.qemu) {
                forkvm_qemu::process::kill(l.pid, libc::SIGKILL);
            }
        }
        last
    }
}
