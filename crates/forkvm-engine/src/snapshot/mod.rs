//! Taking snapshots (freeze, publish, flatten). Reading them back is
//! [`crate::catalog`], restoring one is [`crate::launcher`], removing one
//! is [`crate::teardown`]; the overview of how a snapshot and its clones
//! share RAM and disk follows.
//!
//! **Taking a snapshot** of a running sandbox (the source keeps running):
//!
//! ```text
//! stop ─▶ migrate device state to device.state ─▶ freeze the disk ─▶ copy RAM ─▶ cont
//!                                                                               │
//!                          hash every file, write the manifest, rename ◀────────┘
//! ```
//!
//! * RAM: a sandbox that owns its RAM file (`share=on`: booted, or spawned
//!   from a `stream` snapshot) is snapshotted with `x-ignore-shared`, so the
//!   migration stream holds only device state and the RAM file is copied
//!   sparsely into `memory.img`. That is a `shared` snapshot: its clones map
//!   `memory.img` copy-on-write and share every page they do not write.
//!   A clone of a `shared` or `diff` snapshot maps RAM privately, and QEMU
//!   can only skip *shared* RAM in a migration, so the daemon reads the
//!   pages the clone wrote itself: its snapshot, in every mode, is a `diff`
//!   holding only the pages that differ from its parent (a live one takes
//!   them out of QEMU's mapped-ram file, see `freeze::live::thin`).
//! * Disk: the running top qcow2 layer is frozen with `blockdev-snapshot`
//!   onto a new overlay we create (and QEMU opens) before the pause, whose header
//!   already names the frozen layer's final path in the store. The frozen file
//!   is hard-linked into the snapshot, so it outlives the source.
//!
//! **Spawning** starts QEMU with `-incoming defer` (or takes one from the warm
//! pool, where that start was paid earlier), loads the device state, resumes,
//! and gives the clone its own identity through the agent (RNG reseed, clock,
//! hostname, machine-id, instance id) before anything else can run in it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_qemu::Qmp;

/// A stored snapshot's record and where it came from, for front-ends that
/// show snapshots their own way.
pub use crate::db::{Origin, SnapshotRow};
use crate::error::{EngineError, ErrorKind};
use crate::manager::Manager;

pub mod flatten;
pub mod freeze;
pub mod publish;

pub use crate::catalog::{kind, store_err, Chain, MAX_CHAIN};

/// How a snapshot saves the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Stop, save devices and RAM (copy the RAM file of a sandbox that owns
    /// it; a clone's changed pages, as [`Save::Diff`]), resume.
    Stopped,
    /// Copy RAM while the guest runs; stop only for the final pass. A
    /// clone's snapshot keeps only its changed pages of it.
    Live,
    /// Stop, save devices and the pages changed since the parent snapshot,
    /// resume. Needs a clone of a `shared` or `diff` snapshot; otherwise
    /// falls back to [`Save::Stopped`].
    Diff,
}

/// What a freeze's snapshot builds on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Onto {
    /// The snapshot the sandbox started from (none if it booted).
    Origin,
    /// A checkpoint ([`crate::checkpoint`]): the sandbox's previous
    /// checkpoint, when it has one. Its disk layer then stores only what
    /// the guest wrote since that one, when the sandbox kept a record
    /// (forkvm_qemu::incremental).
    Checkpoint(Option<String>),
}

/// The `state_format` of device-only streams.
pub const DEVICES_ONLY: &str = "devices-only";
pub fn qemu_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::new(ErrorKind::QemuFailed, format!("{what}: {e}"))
}

/// `cont` after a save. QEMU reports a migration `completed` (event or
/// `query-migrate`) a moment before it leaves the `finish-migrate` run state,
/// and refuses `cont` in between ("Migration is not finalized yet"): retry
/// that for a while rather than leave the source paused.
pub async fn resume(qmp: &Qmp) -> Result<serde_json::Value, forkvm_qemu::QmpError> {
    let t = Instant::now();
    loop {
        match qmp.execute("cont", None).await {
            Err(e)
                if e.to_string().contains("not finalized")
                    && t.elapsed() < Duration::from_secs(30) =>
            {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            r => return r,
        }
    }
}

/// Microseconds between the STOP and the following RESUME event.
pub async fn pause_from_events(
    rx: &mut tokio::sync::broadcast::Receiver<forkvm_qemu::QmpEvent>,
) -> Option<u64> {
    use tokio::sync::broadcast::error::RecvError;
    let mut stop = None;
    loop {
        let ev = match tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .ok()?
        {
            Ok(ev) => ev,
            // A live save sends one MIGRATION_PASS event per precopy pass,
            // and a guest that keeps writing memory can take more passes
            // than the channel holds (325 were seen). The receiver then
            // skips to the oldest event still held; the STOP and RESUME of
            // the final pause come last, so they are among those. Giving
            // up here made the caller time the whole save as the pause.
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return None,
        };
        match ev.name.as_str() {
            "STOP" => stop = Some(ev.timestamp_us),
            "RESUME" => return stop.map(|s| ev.timestamp_us.saturating_sub(s)),
            _ => {}
        }
    }
}

/// Fresh random bytes from the host.
pub fn entropy(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b
}

pub fn hex_random(bytes: usize) -> String {
    entropy(bytes).iter().map(|x| format!("{x:02x}")).collect()
}

impl Manager {
    /// Snapshot a running sandbox. The source keeps running.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        tag: Option<String>,
        template_key: Option<String>,
        how: Save,
    ) -> Result<forkvm_api::Snapshot, EngineError> {
        let r = async {
            self.check_disk(&format!("snapshot of sandbox {id}"))?;
            let f = self
                .freeze(id, tag, template_key, None, how, Onto::Origin)
                .await?;
            self.publish_frozen(f).await
        }
        .await;
        let snap = r.inspect_err(|e| {
            tracing::warn!(sandbox = %id, code = e.code(), "snapshot of sandbox {id} failed: {}", e.message);
        })?;
        // It follows the daemon's default pool size, which may be > 0.
        self.refill_pool(&snap.id);
        Ok(snap)
    }
}

#[cfg(test)]
mod pause_tests {
    use super::pause_from_events;
    use forkvm_qemu::QmpEvent;
    use tokio::sync::broadcast;

    fn ev(name: &str, t: u64) -> QmpEvent {
        QmpEvent {
            name: name.into(),
            data: serde_json::Value::Null,
            timestamp_us: t,
        }
    }

    #[tokio::test]
    async fn the_pause_is_found_after_more_passes_than_the_channel_holds() {
        let (tx, mut rx) = broadcast::channel(8);
        for i in 0..325 {
            tx.send(ev("MIGRATION_PASS", i)).unwrap();
        }
        tx.send(ev("STOP", 1_000)).unwrap();
        tx.send(ev("MIGRATION", 1_500)).unwrap();
        tx.send(ev("RESUME", 4_250)).unwrap();
        assert_eq!(pause_from_events(&mut rx).await, Some(3_250));
    }

    #[tokio::test]
    async fn no_stop_or_a_closed_channel_gives_none() {
        let (tx, mut rx) = broadcast::channel(8);
        tx.send(ev("RESUME", 10)).unwrap();
        assert_eq!(pause_from_events(&mut rx).await, None);
        let (tx, mut rx) = broadcast::channel(8);
        tx.send(ev("STOP", 10)).unwrap();
        drop(tx);
        assert_eq!(pause_from_events(&mut rx).await, None);
    }
}
