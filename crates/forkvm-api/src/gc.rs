//! Bodies of garbage collection: `POST /v1/snapshots/prune` and the
//! collector as `GET /v1/info` shows it (split from `types` by concern).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/snapshots/prune`: collect the branch points nothing needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneRequest {
    /// Ignore the grace period: collect unneeded branch points however
    /// young (default false: only those older than `gc.grace_secs` of
    /// `GET /v1/info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
    /// Only say what would be collected; remove nothing (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// A snapshot that a collection removed (or, in a dry run, would remove).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PrunedSnapshot {
    pub id: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub created_at: String,
    /// Bytes given back to the filesystem: the files of the snapshot that
    /// are gone and had no other link. In a dry run, an estimate: the
    /// memory, device state and manifest (a disk layer that a sandbox's
    /// disk still goes through stays until that sandbox goes).
    pub bytes: u64,
}

/// A snapshot the collection chose but could not remove.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PruneFailure {
    pub id: String,
    pub message: String,
}

/// The result of `POST /v1/snapshots/prune`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PruneResult {
    /// True when nothing was removed (`dry_run`).
    pub dry_run: bool,
    /// The grace period this collection applied (0 with `all`).
    pub grace_secs: u64,
    /// In the order removed: children before their parents.
    pub snapshots: Vec<PrunedSnapshot>,
    /// The sum of their `bytes`.
    pub freed_bytes: u64,
    /// Snapshots chosen but not removed, with why (also logged at warn).
    pub failed: Vec<PruneFailure>,
}

/// Garbage collection of branch points, as `GET /v1/info` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GcInfo {
    /// Whether the daemon collects in the background (`serve
    /// --gc-interval`, 0 turns it off); `POST /v1/snapshots/prune` works
    /// either way.
    pub enabled: bool,
    /// A branch point younger than this is never collected unless a prune
    /// asks for `all` (`serve --gc-grace`).
    pub grace_secs: u64,
    /// Seconds between background collections (0: off).
    pub interval_secs: u64,
}
