//! The manager: the daemon's core object. It holds the configuration, the
//! state database, the snapshot store, the host resources (network, jail)
//! and the registry of live sandboxes. What the daemon *does* with them is
//! added by the action modules, each an `impl Manager` block of its own
//! concern (see docs/architecture.md); this module depends on none of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkvm_qemu::AccelChoice;

use crate::config::Config;
use crate::db::Db;

pub mod live;
pub mod pools;

pub use live::Live;
pub use live::{Phase, Waiter};
pub use pools::{Pending, Pools, Prepared, MAX_POOL};

/// The sandbox manager: the daemon's core.
pub struct Manager {
    pub cfg: Config,
    pub db: Db,
    pub accel: AccelChoice,
    pub qemu_version: String,
    pub live: Mutex<HashMap<String, Arc<Live>>>,
    pub store: Arc<forkvm_store::Store>,
    pub pools: Pools,
    pub pending: Pending,
    /// Template keys being created right now (one creator per key).
    pub templating: Mutex<std::collections::HashSet<String>>,
    /// Warm-pool size given to new boot templates (`--pool-size`).
    pub default_pool_size: u32,
    pub net: crate::net::Net,
    /// Garbage collection of branch points: leases and the collector.
    pub gc: crate::lease::state::Gc,
    /// Memory held by admissions still starting (crate::admission).
    pub admissions: crate::admission::reserve::Reservations,
    /// How QEMUs are confined (crate::jail).
    pub jail: crate::jail::Jailer,
    /// The volume servers of running sandboxes (crate::volumes).
    pub volumes: crate::volumes::servers::Servers,
    /// One builder at a time per diff snapshot's head (crate::catalog::head).
    pub heads: crate::catalog::head_locks::Builders,
    /// The event stream (crate::events).
    pub events: crate::events::bus::Bus,
    /// Sandboxes suspended by disk pressure (crate::pressure).
    pub suspended: Arc<crate::pressure::suspended::Suspended>,
    /// Trees of snapshots read by diffs and merges (crate::treediff).
    pub trees: crate::treediff::cache::TreeCache,
}

impl Manager {
    pub fn new(
        cfg: Config,
        db: Db,
        store: forkvm_store::Store,
        accel: AccelChoice,
        qemu_version: String,
        default_pool_size: u32,
        net: crate::net::Net,
    ) -> Arc<Manager> {
        let jail = crate::jail::Jailer::new(&cfg);
        let pools = Pools {
            changes: db.changes.clone(),
            ..Default::default()
        };
        Arc::new(Manager {
            jail,
            cfg,
            db,
            accel,
            qemu_version,
            live: Mutex::new(HashMap::new()),
            store: Arc::new(store),
            pools,
            pending: Default::default(),
            templating: Mutex::new(Default::default()),
            default_pool_size,
            net,
            gc: Default::default(),
            admissions: Default::default(),
            volumes: Default::default(),
            heads: Default::default(),
            events: Default::default(),
            suspended: Default::default(),
            trees: Default::default(),
        })
    }

    pub fn live_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn live(&self, id: &str) -> Option<Arc<Live>> {
        self.live_map().get(id).cloned()
    }

    /// Exec timeout handling: the agent kills at `timeout_ms`; the host gives
    /// it this much longer before declaring the guest hung.
    pub const HOST_GRACE: Duration = Duration::from_secs(15);

    /// A new sandbox (`sb`) or snapshot (`sn`) id, with this daemon's node
    /// name in it when it has one (`serve --node`).
    pub fn new_id(&self, prefix: &str) -> String {
        crate::util::node_id(prefix, self.cfg.node.as_deref())
    }
}
