//! Injected crash points, for testing crash consistency.
//!
//! `FORKVM_CRASH_AT=<name>` in the daemon's environment makes the process
//! kill itself with SIGKILL (what `kill -9` does: no destructor, no flush,
//! no reply) when it reaches the step called `<name>`. Without the variable
//! every point is a single comparison with `None`; the points are compiled
//! into every build so that the binary tested is the binary shipped.
//! [`POINTS`] lists every name; docs/testing.md says how the tests use them.

use std::sync::OnceLock;

/// The environment variable naming the crash point.
pub const ENV: &str = "FORKVM_CRASH_AT";

/// Every crash point, in the order a snapshot reaches them. The `freeze.*`
/// points are the first half of a snapshot (the source paused), the
/// `publish.*` and `store.*` ones the second (hashing and publication).
/// Mode-specific ones: `freeze.pages_captured` (a clone's `diff` or `full`
/// save), `freeze.memory_copied` (a `shared` snapshot of a sandbox that owns
/// its RAM), `publish.live_copied` (a `live` save), `publish.diff_written`
/// (a clone's snapshot in any mode), `store.files_moved` and
/// `store.committed` (a snapshot with a frozen disk layer).
pub const POINTS: &[&str] = &[
    "freeze.staged",
    "freeze.layer_reserved",
    "freeze.overlay_created",
    "freeze.overlay_opened",
    "freeze.stopped",
    "freeze.state_saved",
    "freeze.state_moved",
    "freeze.disk_frozen",
    "freeze.pages_captured",
    "freeze.memory_copied",
    "freeze.resumed",
    "freeze.top_recorded",
    "freeze.volumes_saved",
    "publish.live_copied",
    "publish.diff_written",
    "store.hashed",
    "store.manifest_written",
    "store.files_moved",
    "store.committed",
    "publish.info_indexed",
    "publish.indexed",
    "splice.pages_written",
    "splice.disk_merged",
    "splice.committed",
];

fn armed() -> Option<&'static str> {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    AT.get_or_init(|| std::env::var(ENV).ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Die here, as `kill -9` would, if `FORKVM_CRASH_AT` names this point.
pub fn point(name: &str) {
    debug_assert!(POINTS.contains(&name), "unlisted crash point {name}");
    if armed() == Some(name) {
        eprintln!("{ENV}={name}: the daemon kills itself here (SIGKILL)");
        // SAFETY: kill(2) of our own pid; no memory is passed.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::process::abort();
    }
}
