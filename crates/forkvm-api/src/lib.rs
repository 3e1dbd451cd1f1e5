//! The forkvm REST API as shared by the daemon, the CLI and the tests.
//!
//! * [`types`]: request and response bodies (with OpenAPI schemas);
//! * [`routes`]: the table of operations — the daemon builds its router from
//!   it, and a test checks it against the checked-in OpenAPI document;
//! * [`images`]: the bodies of the image operations;
//! * [`lifecycle`]: timeouts, pause and resume;
//! * [`processes`] and [`fs`]: background processes and PTYs, filesystem
//!   operations, watches and archives in a sandbox;
//! * [`volumes`]: host directories and named volumes in sandboxes;
//! * [`timeline`]: checkpoints, timelines and rewind;
//! * [`treediff`]: filesystem diff and merge;
//! * [`transfer`]: snapshot push and pull to OCI registries;
//! * [`events`]: the event stream (`GET /v1/events`, Server-Sent Events);
//! * [`cluster`]: what a cluster gateway adds (`GET /v1/cluster`);
//! * [`codes`]: the machine-readable error codes;
//! * [`client`]: a small HTTP/1.1 client for the unix socket and TCP.
//!
//! The transport is HTTP/1.1 on a unix socket (default
//! `$FORKVM_HOME/forkvm.sock`) or on TCP with a bearer token. Bodies are JSON
//! except file contents (`application/octet-stream`) and logs (`text/plain`).
//! Errors are `{"error": {"code": "...", "message": "..."}}` with a 4xx/5xx
//! status.

pub mod client;
mod client_fs;
mod client_images;
mod client_lifecycle;
mod client_procs;
mod client_timeline;
mod client_transfer;
mod client_volumes;
pub mod cluster;
pub mod codes;
pub mod errors;
pub mod events;
pub mod fs;
pub mod gc;
pub mod images;
pub mod lifecycle;
pub mod processes;
pub mod routes;
pub mod timeline;
pub mod transfer;
pub mod treediff;
pub mod types;
pub mod volumes;

pub use client::{Client, ClientError, Target};
pub use cluster::*;
pub use events::{BranchEvent, Event, EventsReady, PoolEvent};
pub use fs::*;
pub use gc::*;
pub use hyper::Method;
pub use images::*;
pub use lifecycle::*;
pub use processes::*;
pub use timeline::*;
pub use transfer::*;
pub use treediff::*;
pub use types::*;
pub use volumes::*;

/// The environment variable naming the daemon's address.
pub const ENV_URL: &str = "FORKVM_URL";
/// The environment variable holding the bearer token for TCP.
pub const ENV_TOKEN: &str = "FORKVM_TOKEN";
/// The environment variable naming the data directory.
pub const ENV_HOME: &str = "FORKVM_HOME";
/// The data directory when `FORKVM_HOME` is unset.
pub const DEFAULT_HOME: &str = "/var/lib/forkvm";
/// The socket file name inside the data directory.
pub const SOCKET_NAME: &str = "forkvm.sock";

/// The data directory: `$FORKVM_HOME` or `/var/lib/forkvm`.
pub fn home_dir() -> std::path::PathBuf {
    std::env::var_os(ENV_HOME)
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| DEFAULT_HOME.into())
}
