//! Bodies of the time-travel operations: checkpoints, a sandbox's
//! timeline and its retention, and rewind (docs/timetravel.md).
//!
//! A checkpoint is a snapshot (origin `checkpoint`) of a running sandbox
//! whose parent is the sandbox's previous checkpoint, so it stores only what
//! changed since then. Its RAM is copied while the guest runs; the guest
//! stops only for the final pass. A rewind brings the sandbox back to one of
//! its checkpoints (or any snapshot of its lineage) as the same sandbox.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/checkpoints` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRequest {
    /// A tag for the checkpoint: retention keeps tagged ones, and a rewind
    /// or spawn can name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// One checkpoint of a sandbox's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Checkpoint {
    /// The snapshot holding it (`sn-…`): spawn, branch or rewind from it.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The sandbox it was taken of.
    pub sandbox: String,
    /// Its step number in the timeline, from 1.
    pub seq: u64,
    pub created_at: String,
    /// The snapshot it builds on: the previous checkpoint (or, for the
    /// first, the snapshot the sandbox started from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// How long the guest was stopped for it, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// Bytes stored for it alone: the memory pages that changed since its
    /// parent, the device state and its disk layer (allocated bytes).
    pub bytes: u64,
    /// The snapshot the sandbox runs from now is this one or builds on it.
    pub head: bool,
}

/// How many checkpoints a sandbox keeps. Tagged and pinned ones are always
/// kept, and so is the newest; a checkpoint something else builds on (a
/// sandbox spawned from it, a snapshot of such a sandbox) stays until it
/// no longer does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Keep the last N (1 or more). Absent: keep all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// Also keep every Kth by step number (1 or more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_every: Option<u32>,
}

/// `GET /v1/sandboxes/{id}/timeline`: a sandbox's checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Timeline {
    pub sandbox: String,
    /// The checkpoint its next one builds on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    pub retention: Retention,
    /// Oldest first.
    pub checkpoints: Vec<Checkpoint>,
    /// What the kept checkpoints store together, in bytes.
    pub bytes: u64,
}

/// `POST /v1/sandboxes/{id}/rewind`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindRequest {
    /// The checkpoint or snapshot (id or tag) to go back to: one of the
    /// sandbox's own checkpoints, or a snapshot of its lineage.
    pub to: String,
    /// Take a checkpoint of the present first, so the rewind can itself be
    /// undone by rewinding to it.
    #[serde(default)]
    pub checkpoint_first: bool,
}

/// What a rewind did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Rewound {
    pub sandbox: crate::Sandbox,
    /// The snapshot it runs from now.
    pub to: String,
    /// The checkpoint of the present taken first (`checkpoint_first`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<Checkpoint>,
    /// Milliseconds from the request to the sandbox answering again.
    pub rewind_ms: f64,
}
