//! What made a snapshot: the `origin` column of the snapshot index, which
//! garbage collection and retention read.

/// What made a snapshot (the `origin` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Made before the daemon recorded origins, or re-indexed from the
    /// store after a crash: never collected.
    Unknown,
    /// `POST /v1/sandboxes/{id}/branch`: a branch point.
    Branch,
    /// `POST /v1/sandboxes/{id}/snapshot`.
    Snapshot,
    /// An image's boot template.
    Template,
    /// `POST /v1/snapshots/{id}/flatten`.
    Flatten,
    /// A paused sandbox's saved state (removed with the sandbox, never
    /// collected while it lives).
    Pause,
    /// `POST /v1/snapshots/pull`: fetched from a registry (with its chain).
    Pull,
    /// `POST /v1/sandboxes/{id}/checkpoints`: a step of a sandbox's
    /// timeline (db/timeline.rs), pruned by its retention policy.
    Checkpoint,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Unknown => "unknown",
            Origin::Branch => "branch",
            Origin::Snapshot => "snapshot",
            Origin::Template => "template",
            Origin::Flatten => "flatten",
            Origin::Pause => "pause",
            Origin::Pull => "pull",
            Origin::Checkpoint => "checkpoint",
        }
    }

    /// The column's value; NULL, and anything a later version may write,
    /// read as `Unknown`, which garbage collection never takes.
    pub(super) fn parse(s: Option<&str>) -> Origin {
        match s {
            Some("branch") => Origin::Branch,
            Some("snapshot") => Origin::Snapshot,
            Some("template") => Origin::Template,
            Some("flatten") => Origin::Flatten,
            Some("pause") => Origin::Pause,
            Some("pull") => Origin::Pull,
            Some("checkpoint") => Origin::Checkpoint,
            _ => Origin::Unknown,
        }
    }
}
