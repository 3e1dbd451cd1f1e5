//! Wire types of the image operations (`/v1/images…`).
//!
//! Pulls, imports and builds are long: with `stream` (pull) or always
//! (import, build) the response is `application/x-ndjson`, one
//! [`ImageEvent`] per line, ending with a `done` or an `error` event. The
//! upload operations (import, build) take the archive or the build context
//! as the raw request body (`application/octet-stream`: a tar, optionally
//! compressed), with
//! their parameters in the query string.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::ErrorDetail;

/// The name under which the CLI and the SDKs put the Dockerfile's text in a
/// build context tar (`dockerfile=` names it); it is not part of the
/// context the build sees.
pub const DOCKERFILE_IN_CONTEXT: &str = ".forkvm-dockerfile";

/// An installed image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Image {
    pub name: String,
    /// `ext4`.
    pub format: String,
    /// Size of its root filesystem (a sandbox may ask for a larger disk).
    pub size_bytes: u64,
    pub created_at: String,
    /// `builtin`, `registry`, `import` or `build`.
    pub source: String,
    /// The registry reference, archive name or base image it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The manifest digest, when it came with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Layer digests, bottom first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    pub config: ImageConfig,
    /// The process its boot template starts, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartCommand>,
    /// Sandboxes that use the image (on `GET /v1/images/{name}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sandboxes: Vec<String>,
    /// Snapshots made from it (on `GET /v1/images/{name}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<String>,
}

/// The defaults of every exec in a sandbox of the image (from the OCI image
/// config), and what `forkvm run` runs with no command.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageConfig {
    /// `KEY=value` strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// `name`, `uid`, `name:group` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    /// `8080/tcp` style.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A process the image's boot template starts before it is captured, so
/// that every spawn resumes with it already running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartCommand {
    pub command: Vec<String>,
    /// Ready when this TCP port in the guest accepts connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_port: Option<u16>,
    /// Ready when this command exits 0 (instead of a port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_command: Option<Vec<String>>,
    /// How long the check may take (default 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_timeout_secs: Option<u64>,
}

/// `GET /v1/images`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<Image>,
}

/// `POST /v1/images`: pull an image from an OCI Distribution registry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImage {
    /// e.g. `registry.example:5000/team/py:3.12` or `ubuntu@sha256:…`.
    pub reference: String,
    /// The local name (default: the repository's last part and the tag,
    /// e.g. `py-3.12`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Registry user name (with `password`); default: from the daemon
    /// host's `~/.docker/config.json`, else anonymous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Speak plain HTTP to the registry (loopback registries always may).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Root filesystem size in bytes (default: content plus room).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<u64>,
    /// Replace an image of the same name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
    /// A start command for the image's boot template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartCommand>,
    /// Stream progress as NDJSON [`ImageEvent`]s.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// Query of `POST /v1/images/import` (body: the archive).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The image's name.
    pub name: String,
    /// The archive's file name, for the record and the error messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Root filesystem size in bytes (default: content plus room).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<bool>,
}

/// Query of `POST /v1/images/build` (body: the build context as a tar).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BuildQuery {
    /// The image's name.
    pub tag: String,
    /// The Dockerfile's path inside the context (default `Dockerfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
    /// `--build-arg`s as a JSON object, e.g. `{"V":"1"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_args: Option<String>,
    /// Run every step again, ignoring the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_cache: Option<bool>,
    /// Build this stage (`FROM … AS name`) of a multi-stage Dockerfile
    /// instead of the last one, as `docker build --target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<u64>,
    /// Guest RAM of the build sandbox in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
}

/// One line of an image operation's NDJSON progress stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageEvent {
    /// A phase starts (`resolving`, `fetching`, `unpacking`, `mkfs`, …).
    Phase { phase: String },
    /// Bytes of one item (a blob, a layer) done so far.
    Progress {
        item: String,
        done: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
    /// An item needed no work: a blob already present, a cached build step.
    Cached { item: String },
    /// A build step starts.
    Step {
        index: u32,
        total: u32,
        text: String,
        cached: bool,
    },
    /// A line of output or a note.
    Log { line: String },
    /// The operation finished: the installed image.
    Done { image: Box<Image> },
    /// The operation failed; nothing was installed.
    Error { error: ErrorDetail },
}
