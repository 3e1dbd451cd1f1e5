//! The cluster gateway: one endpoint in front of many forkvm nodes.
//!
//! Every node runs its own `forkvm serve` (started by the Ray node service,
//! docs/cluster.md), which stays the only thing that touches QEMU. The
//! gateway speaks the daemon's REST API, E2B's API and MCP, and sends each
//! request to the node that holds what it names:
//!
//! * [`route`] classifies every [`forkvm_api::routes::Op`] (an exhaustive
//!   match, so a new operation cannot ship unrouted) and finds a sandbox's
//!   node in its id (`sb-NODE-…`);
//! * [`nodes`] is the node table: read from `DIR/nodes.json`, which the Ray
//!   supervisor writes, and refreshed by polling each daemon;
//! * [`place`] chooses a node for a spawn (the documented policy);
//! * `proxy` forwards a request with its body streamed both ways, so exec
//!   output, events, PTYs and Connect-RPC streams pass through unbuffered;
//! * `fanout` merges what every node answers (lists, metrics, events);
//! * `branch` spreads a branch's children over nodes, moving the branch
//!   point by the nodes' own OCI endpoints;
//! * `lost` remembers the sandboxes of dead nodes;
//! * `ui` serves the dashboard: its files come from a node, its login and
//!   session are the gateway's own.
//!
//! State: the gateway keeps nothing that only it holds. Routing comes from
//! ids and the nodes file; what it caches (capacity, sandbox lists) is
//! rebuilt by polling; the one record it writes, the sandboxes lost with a
//! dead node (`DIR/gateway/lost.json`), is a copy of what the nodes last
//! said, kept so a restarted gateway still answers `lost` for them.
//!
//! Auth: clients present the gateway's token (`FORKVM_TOKEN`); the gateway
//! presents the cluster token (`FORKVM_CLUSTER_TOKEN`) to nodes, which refuse
//! anything without it. E2B's per-sandbox access tokens are derived by the
//! node from the cluster token and checked there.

// Routing helpers return the HTTP answer to give instead of a value; a
// response is built at most once per request, so its size does not matter.
#![allow(clippy::result_large_err)]

mod branch;
mod e2b;
mod fanout;
mod lost;
pub mod nodes;
pub mod place;
mod proxy;
pub mod route;
mod server;
mod state;
mod ui;

use std::net::SocketAddr;
use std::path::PathBuf;

/// How a gateway runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Its TCP listener.
    pub listen: SocketAddr,
    /// Holds `nodes.json` (written by the supervisor) and `gateway/` (its own).
    pub state_dir: PathBuf,
    /// What clients must present.
    pub client_token: String,
    /// What it presents to nodes.
    pub cluster_token: String,
    /// A registry snapshots travel through between nodes, instead of the
    /// nodes' own `/v2` endpoints.
    pub registry: Option<Registry>,
}

/// A cluster registry (`forkvm cluster gateway --registry`).
#[derive(Debug, Clone)]
pub struct Registry {
    /// `HOST[:PORT]/REPOSITORY`; a snapshot goes to `REPOSITORY:ID`.
    pub repository: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Plain HTTP (a registry on a private network).
    pub insecure: bool,
}

/// Run the gateway until SIGTERM or SIGINT.
pub async fn run(cfg: Config) -> Result<(), String> {
    server::run(cfg).await
}
