//! The engine's facade: one typed action per thing a front-end can ask for.
//!
//! Every front-end (the REST API and its dashboard, E2B, MCP, the node's OCI
//! server, the daemon's session) holds an [`Engine`] and calls only its
//! methods; none of them sees the [`Manager`], its fields or its modules. A
//! front-end parses its protocol into these calls and renders what they
//! return, so every decision stays in the engine. The actions are grouped
//! by area in the child modules; the list in `docs/architecture.md` is
//! generated from them (and checked by a test of `forkvm-daemon`).
//!
//! Besides the actions, this module re-exports the few engine types the
//! actions take and give that are not wire types of `forkvm-api`.

use std::sync::Arc;

use forkvm_qemu::AccelChoice;

use crate::config::Config;
use crate::db::Db;
use crate::manager::Manager;

mod guest;
mod host;
mod images;
mod sandboxes;
mod snapshots;
mod timeline;

// The engine's own types in the actions' arguments and results.
pub use crate::agent::{AgentStream, ProcEvent, WatchEvent};
pub use crate::db::{Origin, SnapshotRow};
pub use crate::events::bus::StreamSlot;
pub use crate::events::{Subscription, MAX_STREAMS};
pub use crate::fs::fs_events;
pub use crate::images::install::{PullPlan, Upload};
pub use crate::images::stream::StreamEvent;
pub use crate::lease::Lease;
pub use crate::lifetime::connect::Connected;
pub use crate::process::{ProcStream, ProcessStream};
pub use crate::spawn::Created;
pub use forkvm_image::meta::ImageConfig as ExecDefaults;
// Times in the wire's RFC 3339 form, as every front-end writes and reads
// them.
pub use crate::util::{parse_rfc3339, rfc3339};

/// The engine, as the front-ends see it: a cheap handle (clone it freely)
/// whose methods are the actions. See the module documentation.
#[derive(Clone)]
pub struct Engine {
    m: Arc<Manager>,
}

impl Engine {
    /// Build the engine over an opened state database, snapshot store and
    /// host network; nothing runs until [`Engine::start`].
    pub fn new(
        cfg: Config,
        db: Db,
        store: forkvm_store::Store,
        accel: AccelChoice,
        qemu_version: String,
        default_pool_size: u32,
        net: crate::net::Net,
    ) -> Engine {
        Engine {
            m: Manager::new(cfg, db, store, accel, qemu_version, default_pool_size, net),
        }
    }
}
