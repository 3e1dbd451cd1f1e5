//! Wire types of snapshot transfer: pushing a snapshot to an OCI registry
//! (`POST /v1/snapshots/{id}/push`) and pulling one from it
//! (`POST /v1/snapshots/pull`). The artifact's layout is documented in
//! `docs/registry.md` and in the `forkvm-artifact` crate.
//!
//! Both are long: with `stream` the response is `application/x-ndjson`, one
//! [`TransferEvent`] per line, ending with `pushed`, `pulled` or `error`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ErrorDetail, Snapshot};

/// Body of `POST /v1/snapshots/{id}/push`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushSnapshot {
    /// Where to: `host[:port]/repo[:tag]` (default tag `latest`).
    pub reference: String,
    /// Registry user name (with `password`); default: from the daemon
    /// host's `~/.docker/config.json`, else anonymous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Speak plain HTTP to the registry (loopback registries always may).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Stream progress as NDJSON [`TransferEvent`]s.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// Body of `POST /v1/snapshots/pull`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullSnapshot {
    /// `host[:port]/repo[:tag]` or `…@sha256:<digest>`.
    pub reference: String,
    /// A tag for the pulled snapshot on this host (its ancestors get none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// What a push did. Blobs and bytes count what went over the wire
/// (compressed chunks, configs and manifests); `skipped` ones were already
/// in the registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PushResult {
    /// The reference, normalised (`127.0.0.1:5000/team/warm:latest`).
    pub reference: String,
    /// The digest of the index the tag now names: pull `REPO@DIGEST` to get
    /// exactly this snapshot.
    pub digest: String,
    /// The snapshot pushed, and how many snapshots its chain holds (itself
    /// and every ancestor).
    pub snapshot: String,
    pub links: u32,
    /// Chain links whose manifest the registry already had: nothing of
    /// theirs was sent.
    pub links_skipped: u32,
    /// Whether the base image's root disk was sent (false: the registry had
    /// it).
    pub image_sent: bool,
    pub blobs_sent: u32,
    pub bytes_sent: u64,
    pub blobs_skipped: u32,
    pub bytes_skipped: u64,
    /// Manifests written (links, image, and the index).
    pub manifests_sent: u32,
    pub total_ms: u64,
}

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PullResult {
    /// The pulled snapshot as `GET /v1/snapshots/{id}` shows it.
    pub snapshot: Snapshot,
    /// The index digest pulled.
    pub digest: String,
    pub links: u32,
    /// Links this host already had (same snapshot, same content).
    pub links_cached: u32,
    /// The image the chain's disk ends in on this host, and whether this
    /// pull created it.
    pub image: String,
    pub image_created: bool,
    pub blobs_fetched: u32,
    pub bytes_fetched: u64,
    pub total_ms: u64,
}

/// One line of a push or pull progress stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TransferEvent {
    /// A phase starts (`resolving`, `chunking`, `uploading`, `fetching`,
    /// `checking`, `publishing`, …).
    Phase { phase: String },
    /// Bytes of one item (a file, a chain link) done so far.
    Progress {
        item: String,
        done: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
    /// An item needed no work (the registry, or this host, had it).
    Cached { item: String },
    /// A line of text.
    Log { line: String },
    /// The push finished.
    Pushed { result: PushResult },
    /// The pull finished: the snapshot is published.
    Pulled { result: Box<PullResult> },
    /// The operation failed; nothing was published.
    Error { error: ErrorDetail },
}
