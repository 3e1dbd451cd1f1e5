//! The daemon's event stream, `GET /v1/events`: Server-Sent Events.
//!
//! ```text
//! event: ready            first message: {"seq": N}, N = the last seq sent so far
//! data: {"seq": 41}
//!
//! id: 42                  one message per change, in order, with no gaps
//! event: sandbox.created  the kind, as in Event::kind
//! data: {...Event...}     one line of JSON
//!
//! : keep-alive            a comment every 15 s, so proxies keep the stream open
//! ```
//!
//! A client that reconnects with `Last-Event-ID: N` first gets the events
//! after N that the daemon still remembers (the last [`REPLAY`]); a message
//! `event: reset` says it fell further behind, and should re-read the lists.
//! Objects in events are what the REST API lists for them, so a
//! client keeps one model: list once, then apply events.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Image, Sandbox, Snapshot};

/// How many recent events the daemon keeps for `Last-Event-ID`.
pub const REPLAY: usize = 1024;

/// Event kinds (the SSE `event:` field and [`Event::kind`]).
pub mod kinds {
    pub const READY: &str = "ready";
    pub const RESET: &str = "reset";
    pub const SANDBOX_CREATED: &str = "sandbox.created";
    pub const SANDBOX_UPDATED: &str = "sandbox.updated";
    pub const SANDBOX_DELETED: &str = "sandbox.deleted";
    pub const SNAPSHOT_CREATED: &str = "snapshot.created";
    pub const SNAPSHOT_UPDATED: &str = "snapshot.updated";
    pub const SNAPSHOT_DELETED: &str = "snapshot.deleted";
    pub const BRANCH: &str = "branch";
    pub const POOL: &str = "pool";
    pub const IMAGE_CREATED: &str = "image.created";
    pub const IMAGE_DELETED: &str = "image.deleted";
}

/// One change, as `GET /v1/events` sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Increases by one per event of this daemon process.
    pub seq: u64,
    /// When the daemon saw the change (Unix time, ms).
    pub at_unix_ms: i64,
    /// `sandbox.created`, `sandbox.updated`, `sandbox.deleted`,
    /// `snapshot.created`, `snapshot.updated`, `snapshot.deleted`, `branch`,
    /// `pool`, `image.created` or `image.deleted`.
    pub kind: String,
    /// The id (or image name) of what changed; for `branch`, the source
    /// sandbox; for `pool`, the snapshot.
    pub id: String,
    /// The sandbox as `GET /v1/sandboxes` lists it now (without the
    /// `memory`, `usage` and `disk` figures that `GET /v1/sandboxes/{id}`
    /// measures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    /// The snapshot as `GET /v1/snapshots/{id}` shows it now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<BranchEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolEvent>,
}

/// A completed `branch`: its branch point, children and timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BranchEvent {
    pub source: String,
    pub snapshot: String,
    /// `live`, `diff` or `full`.
    pub mode: String,
    pub children: Vec<String>,
    /// How long the source was paused.
    pub pause_ms: f64,
    /// From the request until every child ran.
    pub total_ms: f64,
}

/// A warm pool's size or fill changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolEvent {
    pub snapshot: String,
    /// QEMUs the pool keeps waiting.
    pub size: u32,
    /// QEMUs waiting now.
    pub ready: u32,
}

/// The `ready` message's data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventsReady {
    pub seq: u64,
}
