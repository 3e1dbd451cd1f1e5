//! What a cluster gateway (`forkvm cluster gateway`, docs/cluster.md) answers
//! beyond the daemon's API: `GET /v1/cluster`, the nodes it routes to.
//!
//! A gateway serves the same `/v1` as a daemon; sandboxes and snapshots keep
//! their types. A sandbox on a node the cluster declared dead is listed with
//! state [`crate::SandboxState::Lost`].

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A node as the gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Its daemon answers.
    Alive,
    /// The cluster still counts it as a member, but its daemon does not
    /// answer: its sandboxes are not lost yet, requests for them get 503.
    Unreachable,
    /// The cluster declared it dead: its sandboxes are `lost`.
    Dead,
}

/// One node of a cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterNode {
    /// The node's name; it is the middle part of the ids its daemon makes
    /// (`sb-NAME-…`, `sn-NAME-…`).
    pub name: String,
    /// Where the gateway reaches its daemon.
    pub url: String,
    pub state: NodeState,
    /// Why it is unreachable or dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Sandboxes on it (any state), as last seen.
    pub sandboxes: u32,
    /// Its capacity as last seen (absent until its daemon first answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<crate::Capacity>,
    /// Its `--max-sandboxes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u32>,
    /// The images it can spawn.
    #[serde(default)]
    pub images: Vec<String>,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    pub nodes: Vec<ClusterNode>,
    /// Sandboxes on live nodes.
    pub sandboxes: u32,
    /// Sandboxes lost with dead nodes and not yet deleted.
    pub lost: u32,
}
