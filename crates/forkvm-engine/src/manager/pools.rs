//! The manager's state for warm pools (QEMUs started ahead of time for a
//! snapshot) and for branches whose snapshot is not published yet.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use forkvm_qemu::Qmp;

use crate::config::SandboxPaths;

/// A QEMU started with `-incoming defer` for a snapshot, not yet loaded.
pub struct Prepared {
    pub id: String,
    pub paths: SandboxPaths,
    pub child: tokio::process::Child,
    /// Which process it is (pid and start time).
    pub qemu: forkvm_qemu::process::QemuId,
    /// The machine it was started as.
    pub machine: forkvm_qemu::MachineConfig,
    pub qmp: Arc<Qmp>,
    pub prepare_ms: f64,
    pub qemu_start_ms: f64,
    /// The network a warm pool set up ahead of time (see
    /// [`Manager::refill_pool`](crate::manager::Manager::refill_pool));
    /// `None` when it is left to the spawn.
    pub net: Option<crate::net::SandboxNet>,
}

/// Most QEMU processes one snapshot's warm pool may hold.
pub const MAX_POOL: u32 = 64;

/// Snapshots of asynchronous branches that are not (or failed to be)
/// published, as the API shows them.
#[derive(Default)]
pub struct Pending(Mutex<HashMap<String, forkvm_api::Snapshot>>);

impl Pending {
    pub fn get(&self, id: &str) -> Option<forkvm_api::Snapshot> {
        self.0.lock().ok()?.get(id).cloned()
    }
    pub fn all(&self) -> Vec<forkvm_api::Snapshot> {
        self.0
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
    pub fn set(&self, s: forkvm_api::Snapshot) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(s.id.clone(), s);
        }
    }
    pub fn remove(&self, id: &str) -> Option<forkvm_api::Snapshot> {
        self.0.lock().ok()?.remove(id)
    }
}

/// Warm pools: per snapshot, QEMU processes waiting for incoming state.
#[derive(Default)]
pub struct Pools {
    pub ready: Mutex<HashMap<String, Vec<Prepared>>>,
    pub filling: Mutex<HashSet<String>>,
    /// Snapshots whose last spawn asked for a network other than the
    /// default: their refills leave the network to the spawn, since
    /// undoing a ready-made uplink costs more than making none.
    pub bare: Mutex<HashSet<String>>,
    /// Told whenever a pool gains or loses a waiting QEMU.
    pub changes: crate::changes::Notifier,
    /// Set at shutdown: a filler that finishes a QEMU afterwards kills it
    /// instead of pooling it, since nothing would ever stop it.
    pub closed: std::sync::atomic::AtomicBool,
}

impl Pools {
    /// Remember whether a spawn from `snap` asked for the default network.
    pub fn note_request(&self, snap: &str, default: bool) {
        if let Ok(mut b) = self.bare.lock() {
            if default {
                b.remove(snap);
            } else {
                b.insert(snap.to_string());
            }
        }
    }

    /// Whether a refill of `snap` should set up the default network.
    pub fn wants_network(&self, snap: &str) -> bool {
        self.bare.lock().map_or(true, |b| !b.contains(snap))
    }

    /// Whether the daemon is shutting down (see [`Pools::closed`]).
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether any filler is still at work.
    pub fn filling_any(&self) -> bool {
        self.filling.lock().is_ok_and(|f| !f.is_empty())
    }

    pub fn ready_count(&self, snap: &str) -> u32 {
        self.ready
            .lock()
            .map(|m| m.get(snap).map_or(0, |v| v.len() as u32))
            .unwrap_or(0)
    }
    fn changed(&self, snap: &str) {
        self.changes
            .send(crate::changes::Change::Pool(snap.to_string()));
    }
    pub fn take(&self, snap: &str) -> Option<Prepared> {
        let p = self.ready.lock().ok()?.get_mut(snap)?.pop();
        if p.is_some() {
            self.changed(snap);
        }
        p
    }
    pub fn put(&self, snap: &str, p: Prepared) {
        if let Ok(mut m) = self.ready.lock() {
            m.entry(snap.to_string()).or_default().push(p);
        }
        self.changed(snap);
    }
    /// Remove every waiting process of a snapshot (to be killed).
    pub fn drain(&self, snap: &str) -> Vec<Prepared> {
        let v: Vec<Prepared> = self
            .ready
            .lock()
            .ok()
            .and_then(|mut m| m.remove(snap))
            .unwrap_or_default();
        if !v.is_empty() {
            self.changed(snap);
        }
        v
    }
    pub fn drain_all(&self) -> Vec<Prepared> {
        self.ready
            .lock()
            .map(|mut m| m.drain().flat_map(|(_, v)| v).collect())
            .unwrap_or_default()
    }
}
