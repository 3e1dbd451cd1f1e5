//! Bodies of filesystem diff and merge (docs/timetravel.md).
//!
//! A diff lists the filesystem differences between two sandboxes,
//! snapshots or checkpoints of one lineage: added, modified and deleted
//! paths with their kinds, sizes and modes, optionally with a unified text
//! diff of text files. A merge applies a child's changes since its branch
//! point to a running sandbox, three-way against that branch point.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/diff/{a}`: compare `a` (a sandbox, snapshot or checkpoint, by
/// id or tag) with `b`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffRequest {
    /// The other side: a sandbox, snapshot or checkpoint (id or tag).
    pub b: String,
    /// Only paths under this absolute directory (default `/`, without the
    /// kernel's and the agent's own trees: /proc, /sys, /dev, /run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Also give a unified diff of each modified, added or deleted text
    /// file (UTF-8, at most 1 MiB a side).
    #[serde(default)]
    pub text: bool,
}

/// What happened to a path between two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Deleted,
    /// Content changed (and perhaps its mode).
    Modified,
    /// Only its permission bits changed.
    Mode,
    /// A file became a directory, a symlink a file, …
    Type,
}

/// What one side has at a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PathState {
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// One difference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PathChange {
    /// Absolute path.
    pub path: String,
    pub change: ChangeKind,
    /// What `a` has there (absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<PathState>,
    /// What `b` has there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<PathState>,
    /// A unified diff (`text: true`, text files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

/// Counts of a diff, as `git diff --stat` sums them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiffStats {
    pub added: u64,
    pub deleted: u64,
    pub modified: u64,
    /// Mode and type changes.
    pub other: u64,
}

/// What a diff found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Diff {
    pub a: String,
    pub b: String,
    pub path: String,
    /// Sorted by path.
    pub changes: Vec<PathChange>,
    pub stats: DiffStats,
    /// Entries compared (both sides).
    pub entries: u64,
    /// Files whose contents were read to decide (their metadata alone could
    /// not).
    pub contents_read: u64,
    pub diff_ms: f64,
}

/// How a merge settles paths both sides changed differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MergeStrategy {
    /// Keep the target's version.
    Ours,
    /// Take the child's version.
    Theirs,
    /// Merge text files line by line (three-way); other conflicts stay.
    Text,
}

/// `POST /v1/sandboxes/{id}/merge`: apply sandbox `id`'s changes since its
/// branch point to `into`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// The running sandbox to change (usually the branch source).
    pub into: String,
    /// Only paths under this absolute directory (default `/`, as for diff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// How to settle conflicts; without one, a conflict refuses the merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MergeStrategy>,
    /// Plan and report, change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A path both sides changed differently since the branch point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Conflict {
    pub path: String,
    /// What the branch point had (absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<PathState>,
    /// What the target has now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours: Option<PathState>,
    /// What the child has now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theirs: Option<PathState>,
    /// Why it is one, in words.
    pub reason: String,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Merged {
    pub child: String,
    pub into: String,
    /// The branch point both descend from.
    pub base: String,
    /// The changes applied to `into` (or, in a dry run, to be applied).
    pub applied: Vec<PathChange>,
    /// Conflicts settled by the strategy.
    pub settled: Vec<Conflict>,
    /// Conflicts left (a dry run only: a merge with any is refused, 409).
    pub conflicts: Vec<Conflict>,
    pub dry_run: bool,
    pub merge_ms: f64,
}
