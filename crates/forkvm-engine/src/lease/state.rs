//! The collector's state in the manager: the leases held on snapshots, the
//! snapshots being collected, and the signal that wakes the collector.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The collector's state in the manager.
#[derive(Default)]
pub struct Gc {
    pub leases: Leases,
    /// Wakes the background collector early (a sandbox went away).
    pub wake: tokio::sync::Notify,
    /// One collection at a time.
    pub running: tokio::sync::Mutex<()>,
}

#[derive(Default)]
pub struct LeaseState {
    pub held: HashMap<String, usize>,
    pub doomed: HashSet<String>,
}

/// Leases on snapshots, and the snapshots being collected.
#[derive(Default, Clone)]
pub struct Leases(Arc<Mutex<LeaseState>>);

impl Leases {
    pub fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A lease, unless the snapshot is being collected.
    pub fn try_lease(&self, id: &str) -> Option<Lease> {
        let mut s = self.state();
        if s.doomed.contains(id) {
            return None;
        }
        *s.held.entry(id.to_string()).or_default() += 1;
        Some(Lease {
            leases: self.clone(),
            id: id.to_string(),
        })
    }

    /// Mark a snapshot as being collected, unless a lease holds it.
    pub fn doom(&self, id: &str) -> Option<Doom> {
        let mut s = self.state();
        if s.held.contains_key(id) || !s.doomed.insert(id.to_string()) {
            return None;
        }
        Some(Doom {
            leases: self.clone(),
            id: id.to_string(),
        })
    }

    pub fn held(&self) -> HashSet<String> {
        self.state().held.keys().cloned().collect()
    }
}

/// Holds a snapshot against collection until dropped.
pub struct Lease {
    pub leases: Leases,
    pub id: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.leases.state();
        if let Some(n) = s.held.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                s.held.remove(&self.id);
            }
        }
    }
}

/// A snapshot being collected: no lease can be taken on it meanwhile.
pub struct Doom {
    pub leases: Leases,
    pub id: String,
}

impl Drop for Doom {
    fn drop(&mut self) {
        self.leases.state().doomed.remove(&self.id);
    }
}
