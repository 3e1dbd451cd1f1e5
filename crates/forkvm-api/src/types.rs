//! Request and response bodies of the REST API.
//!
//! Every request body uses `deny_unknown_fields`: a misspelt field is an
//! error, never silently ignored. Response bodies may gain fields over time,
//! so clients should ignore fields they do not know.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gc::GcInfo;
use utoipa::ToSchema;

/// `POST /v1/sandboxes`: start a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Image name; `default` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Guest RAM in MiB (default 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// vCPUs (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Spawn from this snapshot (id or tag) instead of booting an image.
    /// The snapshot fixes the image, memory and cpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Spawn this many sandboxes at once (1–1000). When given, the response
    /// is a [`SandboxBatch`] instead of a single [`Sandbox`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Use (and on first use, create) the image's boot template, so only the
    /// first spawn of an image pays for a boot (default true). `false` forces
    /// a cold boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_template: Option<bool>,
    /// `nat` (the default): a network of its own with NAT egress; `none`:
    /// no way out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// Guest TCP ports to publish on host loopback ports (needs `nat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PortForward>>,
    /// Allow egress only to these destinations (needs `nat`). Omitted: any
    /// destination except the host and other sandboxes. An entry that
    /// covers another sandbox's uplink opens it too; one that covers the
    /// host opens it only with `allow_host`. The list holds for every
    /// packet leaving the sandbox's namespace, the guest's and those of any
    /// process in the namespace (QEMU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<EgressRule>>,
    /// Let the `egress` entries reach the host itself: its own services on
    /// the addresses and ports they name (default false; needs `egress`).
    /// Without it nothing a sandbox sends reaches the host, whatever the
    /// allow-list says (`0.0.0.0/0:PORT` does not open the host's PORT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_host: Option<bool>,
    /// Answer only once the guest's network path is proven to work
    /// (default true). With `false` the spawn returns right after the guest
    /// has its identity; the network is set up either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_network: Option<bool>,
    /// Root disk size in bytes (default: the image's). A larger size grows
    /// the guest's root filesystem; a smaller one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<u64>,
    /// Labels (up to 64 pairs; keys of letters, digits and `._-/:`, up to 64
    /// bytes; values up to 512 bytes), listed and filterable with
    /// `GET /v1/sandboxes?metadata.KEY=VALUE`. A branch's children inherit
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment variables every exec in the sandbox starts with (over the
    /// image's `Env`; an exec's own `env` wins). A branch's children inherit
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Seconds until the sandbox is removed, or paused with `on_timeout:
    /// pause` (1 to 2,592,000). Omitted: it lives until removed.
    /// `PUT /v1/sandboxes/{id}/timeout` changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// What happens when the timeout runs out (default `kill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<crate::OnTimeout>,
    /// CPU quota, QEMU memory overhead, disk IOPS and bandwidth, network
    /// rate and pids (docs/limits.md). A branch's children inherit them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::SandboxLimits>,
    /// Host directories and named volumes to mount (docs/volumes.md). A
    /// snapshot taken with volumes fixes them: its clones get the same ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<crate::VolumeMount>>,
}

/// A sandbox's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// No route out: the guest sees only its own link.
    None,
    /// A network namespace of its own, NAT to the host's network.
    Nat,
}

/// A published guest port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortForward {
    /// The TCP port in the guest.
    pub guest: u16,
    /// The host loopback port; 0 (or omitted) picks a free one, reported back.
    #[serde(default)]
    pub host: u16,
}

/// One egress allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// An IPv4 address or network, `A.B.C.D` or `A.B.C.D/N`.
    pub cidr: String,
    /// TCP and UDP ports; empty or omitted means every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// `PUT /v1/sandboxes/{id}/network`: a running sandbox's new egress
/// allow-list, replacing the one it has. New connections follow it at once;
/// connections already established are kept until they close.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetNetwork {
    /// The destinations the sandbox may open connections to; everything
    /// else is refused. `null` or omitted: any egress.
    #[serde(default)]
    pub egress: Option<Vec<EgressRule>>,
    /// The `egress` entries apply to the host itself too (needs `egress`).
    /// Omitted: `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_host: Option<bool>,
}

/// A sandbox's network as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NetworkInfo {
    pub mode: NetworkMode,
    /// The guest's address (the same in every sandbox; each has its own
    /// namespace).
    pub guest_ip: String,
    pub gateway: String,
    /// The host end of the sandbox's uplink (unique per sandbox), for `nat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// The sandbox end of its uplink: the source address its egress has
    /// before the host's NAT, for `nat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink_ip: Option<String>,
    pub ports: Vec<PortForward>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<EgressRule>>,
    /// The `egress` entries apply to the host itself too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_host: bool,
}

/// Networking as `GET /v1/info` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NetInfo {
    /// Can sandboxes get `nat` networks on this host?
    pub available: bool,
    /// Why not, when they cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The uplink address pool.
    pub pool: String,
    /// The mode used when a spawn does not name one.
    pub default_mode: NetworkMode,
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// QEMU is up and the guest is booting.
    Starting,
    /// The guest agent answers.
    Running,
    /// QEMU exited or the guest died; `failure` says why.
    Failed,
    /// Saved to disk with no QEMU running (`POST .../pause`, or its timeout
    /// with `on_timeout: pause`); `POST .../resume` brings it back.
    Paused,
    /// Only from a cluster gateway: the node that held it was declared dead,
    /// so its state is gone; `failure` says why. `DELETE` forgets it.
    Lost,
}

/// Where the time of a spawn went, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpawnTimings {
    /// Creating the sandbox directory, RAM file and disk overlay.
    pub prepare_ms: f64,
    /// Starting QEMU until QMP answered.
    pub qemu_start_ms: f64,
    /// From QMP ready until the guest agent answered a ping (0 for a
    /// restore, which has no boot).
    pub boot_ms: f64,
    /// Loading the snapshot's device state and resuming (restores only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_ms: Option<f64>,
    /// Giving the clone its identity: RNG reseed, clock, hostname (restores
    /// only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_ms: Option<f64>,
    /// The QEMU process came from the warm pool (its start was paid earlier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_pool: Option<bool>,
    /// Creating the image's boot template (first spawn of an image only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ms: Option<f64>,
    /// Setting up the host side of the network: namespace, uplink, rules,
    /// forwarded ports (the part not done ahead of time by a warm pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_ms: Option<f64>,
    /// From the guest's resume (or the end of its boot) until its network
    /// path was proven to work (`wait_for_network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_ready_ms: Option<f64>,
    /// When the guest resumed (restores only), in host Unix time: a
    /// reference point for measuring what the guest does afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_unix_ms: Option<f64>,
    pub total_ms: f64,
}

/// Memory use of a sandbox's QEMU process, from `/proc/<pid>/smaps_rollup`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MemoryUsage {
    pub rss_kib: u64,
    pub pss_kib: u64,
    pub private_dirty_kib: u64,
}

/// The disk chain of a running sandbox: how many qcow2 layers its disk
/// reads through above the base image. A snapshot or branch adds one, and a
/// background stream folds them back into the top (see docs/disk-chain.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DiskChain {
    pub layers: u32,
    /// A stream is copying the frozen layers into the top right now.
    pub streaming: bool,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    pub id: String,
    pub state: SandboxState,
    pub image: String,
    pub memory_mib: u32,
    pub cpus: u32,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// The QEMU process id while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// Why the sandbox failed, when `state` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Why a `running` sandbox is stopped by the daemon's disk pressure
    /// watch (docs/limits.md); calls into its guest get 507 until it resumes
    /// by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<SpawnTimings>,
    /// Present on `GET /v1/sandboxes/{id}` while QEMU runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryUsage>,
    /// Present on `GET /v1/sandboxes/{id}` while QEMU runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskChain>,
    /// The snapshot the sandbox was spawned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Its network; absent for a sandbox without a NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkInfo>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The default environment of its execs (from the spawn's `env`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its timeout, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<crate::Lifetime>,
    /// Its saved state while `paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<crate::PauseInfo>,
    /// Its resource limits, when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::SandboxLimits>,
    /// CPU, disk and network use; on `GET /v1/sandboxes/{id}` while QEMU
    /// runs (memory is in `memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::Usage>,
    /// Its volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::MountedVolume>,
}

/// The response to `POST /v1/sandboxes` with `count`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxBatch {
    pub sandboxes: Vec<Sandbox>,
    /// Wall time of the whole batch.
    pub total_ms: f64,
}

/// `POST /v1/sandboxes/{id}/snapshot`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// A unique name to refer to the snapshot by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Where the time of a snapshot went, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotTimings {
    /// How long the source's vCPUs were stopped.
    pub pause_ms: f64,
    pub save_state_ms: f64,
    pub freeze_disk_ms: f64,
    pub copy_memory_ms: f64,
    /// Hashing and publishing, after the source resumed.
    pub publish_ms: f64,
    pub total_ms: f64,
}

/// Sizes of a snapshot's files.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotSizes {
    pub memory_bytes: u64,
    /// Memory image bytes actually allocated (it is sparse).
    pub memory_allocated_bytes: u64,
    pub device_state_bytes: u64,
    pub disk_bytes: u64,
    /// A diff snapshot's changed pages (`memory.diff`), header included.
    #[serde(default)]
    pub memory_diff_bytes: u64,
    /// Device state bytes actually allocated: a live save keeps RAM pages
    /// at fixed offsets in it, and one of a clone keeps none of the guest's
    /// (they are in `memory.diff`), so it is sparse.
    #[serde(default)]
    pub device_state_allocated_bytes: u64,
    /// What the snapshot's directory holds on disk: the allocated bytes of
    /// every file in it, caches built after it was taken (a diff chain's
    /// `memory.head`) and its disk layer included. Extents a file shares
    /// with another by reflink are counted in both.
    #[serde(default)]
    pub on_disk_bytes: u64,
}

/// A snapshot as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The snapshot the source was spawned from (its disk layer is this
    /// snapshot's backing layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The sandbox that was snapshotted.
    pub source: String,
    pub image: String,
    pub memory_mib: u32,
    pub cpus: u32,
    pub created_at: String,
    /// `shared` (memory image mapped copy-on-write by clones), `diff` (the
    /// pages changed over its parent; every branch point of a clone),
    /// `stream` (RAM inside the device state; clones load it privately) or
    /// `live` (RAM in QEMU's mapped-ram layout, written while the guest ran).
    pub kind: String,
    /// Diff links between this snapshot and its base memory image: 0 for
    /// every kind but `diff`.
    #[serde(default)]
    pub depth: u32,
    /// `ready`, `writing` (an asynchronous branch is still publishing it) or
    /// `failed` (see `failure`).
    pub state: String,
    /// Why an asynchronous branch's snapshot failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// True for an image's boot template.
    pub template: bool,
    pub qemu_version: String,
    pub sizes: SnapshotSizes,
    /// Warm-pool size in effect (QEMU processes kept waiting for this
    /// snapshot): its own, or the daemon's default when it has none.
    pub pool_size: u32,
    /// True when `pool_size` is the daemon's default (`serve --pool-size`)
    /// because the snapshot has no size of its own.
    pub pool_default: bool,
    /// Sandboxes spawned from it that still exist.
    pub sandboxes: Vec<String>,
    /// Snapshots whose disk layer builds on this one.
    pub children: Vec<String>,
    /// What made it: `branch`, `snapshot`, `template`, `flatten`, or
    /// `unknown` (made before the daemon recorded it). Garbage collection
    /// only ever removes `branch` snapshots.
    pub origin: String,
    /// Kept from garbage collection (`PUT /v1/snapshots/{id}/pin`).
    pub pinned: bool,
    /// A branch point's mode: `live`, `diff` or `full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// How long the source was paused to take it (branch points and
    /// snapshots of a running sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// The diff snapshot a `flatten` made this one from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flattened_from: Option<String>,
    /// Present in the response that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<SnapshotTimings>,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// `POST /v1/snapshots/{id}/flatten`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlattenRequest {
    /// A unique name for the flat snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `PUT /v1/snapshots/{id}/pool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// QEMU processes to keep started and waiting (0 disables the pool).
    /// `null` (or leaving it out) drops the snapshot's own size, so it
    /// follows the daemon's default again.
    #[serde(default)]
    pub size: Option<u32>,
}

/// A warm pool as `GET /v1/info` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolInfo {
    pub snapshot: String,
    pub size: u32,
    /// Processes ready to be claimed right now.
    pub ready: u32,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// How `stdout`/`stderr` are encoded in an [`ExecResult`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// UTF-8 text; invalid sequences are replaced with U+FFFD.
    #[default]
    Utf8,
    /// Exact bytes, base64 (standard alphabet, padded).
    Base64,
}

/// `POST /v1/sandboxes/{id}/exec`: run a command and wait for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments, run as they are; `argv[0]` is looked up on
    /// the guest's PATH. Empty: the image's default command (its
    /// `Entrypoint` and `Cmd`), or what `cmd` and `entrypoint` say.
    #[serde(default)]
    pub argv: Vec<String>,
    /// Arguments as `docker run IMAGE ARGS` takes them: they replace the
    /// image's `Cmd` and follow its `Entrypoint` (or `entrypoint`); empty:
    /// the image's `Cmd`. Not together with `argv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// Replaces the image's `Entrypoint`, as `docker run --entrypoint`
    /// does (`[]` runs `cmd` alone); the image's `Cmd` is then dropped.
    /// Not together with `argv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// Extra environment variables, on top of the image's `Env` and the
    /// agent's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the image's `WorkingDir`, else `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Run as this user: `name`, `uid`, `name:group` or `uid:gid`
    /// (default: the image's `User`, else root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Standard input as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Standard input as base64 bytes (instead of `stdin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Kill the command after this many milliseconds (default: no limit,
    /// bounded by the server's maximum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Keep at most this many bytes of each of stdout and stderr (default and
    /// maximum: the server's `max_exec_output_bytes`). Output past it is
    /// drained and counted, and the `*_truncated` flag is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Encoding of the output in the response (default `utf8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<OutputEncoding>,
    /// Stream the output as it happens instead of one JSON result: the
    /// response is `application/x-ndjson`, one [`ExecEvent`] per line, the
    /// last one `exit` or `error`. `max_output_bytes` and `encoding` do not
    /// apply (nothing is buffered; chunks are base64).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// One line of a streamed exec (`stream: true`), newline-delimited JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// A chunk of standard output, base64.
    Stdout { data: String },
    /// A chunk of standard error, base64.
    Stderr { data: String },
    /// The command finished; always the last line of a successful stream.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        duration_ms: u64,
        stdout_bytes: u64,
        stderr_bytes: u64,
    },
    /// The command could not run to the end (the guest went away, the
    /// sandbox stopped...); the last line of a failed stream.
    Error { error: ErrorDetail },
}

/// The result of a finished command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// Exit status, when the command exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// The command ran past `timeout_ms` and was killed.
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub encoding: OutputEncoding,
    /// Total bytes the command wrote, including any dropped past the cap.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Run time inside the guest.
    pub duration_ms: u64,
}

/// `PUT /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileWritten {
    pub path: String,
    pub size: u64,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the daemon answers.
    pub status: String,
    pub version: String,
}

/// The accelerator in use and why it was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AccelInfo {
    /// `kvm` or `tcg`.
    pub kind: String,
    pub reason: String,
}

/// The QEMU in use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QemuInfo {
    pub path: String,
    pub version: String,
}

/// Limits the daemon enforces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    pub max_memory_mib: u32,
    pub max_cpus: u32,
    pub max_sandboxes: u32,
    pub max_exec_output_bytes: u64,
    pub max_exec_timeout_ms: u64,
    pub max_file_bytes: u64,
    pub max_request_bytes: u64,
    /// Requests handled at once; more get 429 `limit_exceeded`.
    #[serde(default)]
    pub max_concurrent_requests: u32,
    /// A request body must arrive within this long, or 408 `request_timeout`.
    #[serde(default)]
    pub request_body_timeout_ms: u64,
}

/// `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Info {
    pub version: String,
    /// The node name this daemon runs as in a cluster (`serve --node`):
    /// the ids of the sandboxes and snapshots it makes carry it
    /// (`sb-NAME-<12 hex>`). Null for a daemon of its own.
    #[serde(default)]
    pub node: Option<String>,
    pub accel: AccelInfo,
    pub qemu: QemuInfo,
    pub limits: Limits,
    /// The daemon's data directory.
    pub home: String,
    /// Images that can be spawned.
    pub images: Vec<String>,
    /// Sandboxes known to the daemon, in any state.
    pub sandboxes: u32,
    pub snapshots: u32,
    /// The warm-pool size of every snapshot that has none of its own
    /// (`serve --pool-size`). Boot templates and snapshots taken with
    /// `POST /v1/sandboxes/{id}/snapshot` follow it; a branch's snapshot
    /// starts with a size of 0 of its own, as its children are spawned at
    /// once.
    pub default_pool_size: u32,
    pub pools: Vec<PoolInfo>,
    pub network: NetInfo,
    /// Garbage collection of branch points ([`GcInfo`]).
    pub gc: GcInfo,
    /// Memory and disk capacity as admission control sees it.
    #[serde(default)]
    pub capacity: crate::Capacity,
}

pub use crate::errors::{ErrorBody, ErrorDetail, ErrorHint, HintAction};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_request_fields_are_rejected() {
        let e = serde_json::from_str::<CreateSandbox>(r#"{"image":"default","memry_mib":5}"#)
            .unwrap_err();
        assert!(e.to_string().contains("memry_mib"), "{e}");
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":["x"],"shell":true}"#).is_err());
    }

    #[test]
    fn optional_fields_default() {
        let c: CreateSandbox = serde_json::from_str("{}").unwrap();
        assert_eq!(c, CreateSandbox::default());
        let e: ExecRequest = serde_json::from_str(r#"{"argv":["true"]}"#).unwrap();
        assert!(e.env.is_empty() && e.stdin.is_none() && e.encoding.is_none());
    }
}

/// How a branch copies memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchMode {
    /// Memory is copied while the guest runs (QEMU precopy with mapped-ram);
    /// the source stops only for the final short copy.
    #[default]
    Live,
    /// Only the pages the source changed since the snapshot it was spawned
    /// from, copied while it is paused: the branch point is a link of a
    /// diff chain.
    Diff,
    /// Stop, save device state and memory, resume (for a clone, only its
    /// changed pages are kept, as for `diff`).
    Full,
}

impl BranchMode {
    /// The name the API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            BranchMode::Live => "live",
            BranchMode::Diff => "diff",
            BranchMode::Full => "full",
        }
    }
}

/// `POST /v1/sandboxes/{id}/branch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BranchMode>,
    /// Children to spawn from the branch point (0–1000, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Wait for the snapshot and children before answering (default true).
    /// With `false` the call returns as soon as the source has resumed; the
    /// snapshot is then `writing` until it is `ready` or `failed` (see
    /// `GET /v1/snapshots/{id}`), and the children appear in its `sandboxes`
    /// as they come up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    /// Ports to publish for each child. Omitted: the source's guest ports,
    /// each on a newly allocated host port (host ports cannot be shared).
    /// Every child keeps the source's network mode, egress allow-list and
    /// `allow_host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PortForward>>,
    /// As for `POST /v1/sandboxes` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_network: Option<bool>,
    /// Limits for the children, field by field over the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::SandboxLimits>,
    /// The children's timeout in seconds, counted from their start (1 s to
    /// 30 days). Omitted: the source's timeout, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// The result of a branch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BranchResult {
    pub mode: BranchMode,
    /// The snapshot of the branch point.
    pub snapshot: Snapshot,
    pub children: Vec<Sandbox>,
    /// How long the source's vCPUs were stopped, from QEMU's STOP and RESUME
    /// event timestamps.
    pub pause_ms: f64,
    /// Taking the snapshot.
    pub snapshot_ms: f64,
    /// Spawning the children.
    pub spawn_ms: f64,
    pub total_ms: f64,
}
