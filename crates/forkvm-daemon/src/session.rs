//! A daemon whose life is bound to something outside it: `forkvm serve
//! --ephemeral` (the test launcher, docs/testing.md).
//!
//! A plain daemon leaves its sandboxes running when it stops, for the next
//! daemon on the same home to re-attach. A session can instead ask for a
//! *teardown* at the end: every sandbox is removed (its QEMU, tap,
//! namespace, cgroup and host rules go with it, through the same
//! [`Engine::remove`](crate::actions::Engine::remove) a client's `DELETE`
//! uses), so that nothing outlives the run that started the daemon.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::actions::Engine;

/// How a `serve` run reports readiness and how it may end.
#[derive(Default)]
pub struct Session {
    /// Told where the daemon serves once it accepts requests on every
    /// listener (a TCP port 0 becomes the port the kernel chose).
    pub ready: Option<tokio::sync::oneshot::Sender<Ready>>,
    /// Ends the daemon (besides SIGTERM and SIGINT) with the reason given,
    /// e.g. "stdin closed". A dropped sender counts as a stop too.
    pub stop: Option<tokio::sync::oneshot::Receiver<String>>,
    /// Remove every sandbox when SIGTERM or SIGINT ends the daemon.
    pub teardown_on_signal: bool,
    /// Remove every sandbox when `stop` ends the daemon.
    pub teardown_on_stop: bool,
}

/// Where a started daemon serves.
#[derive(Debug, Clone)]
pub struct Ready {
    pub socket: PathBuf,
    pub tcp: Option<SocketAddr>,
}

/// What ended a `serve` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// SIGTERM or SIGINT; `true` when the sandboxes were torn down.
    Signal(bool),
    /// The session's stop; `true` when the sandboxes were torn down.
    Stopped(String, bool),
}

impl Ended {
    pub fn torn_down(&self) -> bool {
        matches!(self, Ended::Signal(true) | Ended::Stopped(_, true))
    }
}

/// Remove every sandbox of this daemon ([`Engine::remove_all`]); returns
/// what could not be removed.
pub async fn teardown(mgr: &Engine) -> Vec<String> {
    mgr.remove_all().await
}
