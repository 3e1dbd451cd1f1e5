/**
 * Wire types of the forkvm REST API, one per schema in `docs/openapi.json`
 * (`components.schemas`), with the server's field names.
 *
 * Response objects may gain fields in later versions of the daemon; request
 * objects are parsed strictly by the server (unknown fields are a 400).
 * `test/openapi.test.ts` fails when a schema or property is missing here.
 *
 * @module
 */
import type { Lifetime, OnTimeout, PauseInfo } from "./lifecycle.js";
import type { Capacity, SandboxLimits, Usage } from "./resources.js";
import type { MountedVolume, VolumeMount } from "./volumes.js";
import type { ErrorHint } from "./error-types.js";

/** The lifetime schemas live in `lifecycle.ts`, those of resources in `resources.ts`. */
export type { Lifetime, OnTimeout, PauseInfo, PauseRequest, ResumeRequest, SetTimeout } from "./lifecycle.js";
export type { Capacity, SandboxLimits, Usage } from "./resources.js";
export type { Checkpoint, CheckpointRequest, Retention, RewindRequest, Rewound, Timeline } from "./timeline.js";
export type {
  ChangeKind,
  Conflict,
  Diff,
  DiffRequest,
  DiffStats,
  MergeRequest,
  MergeStrategy,
  Merged,
  PathChange,
  PathState,
} from "./treediff.js";
export type { ErrorHint, HintAction } from "./error-types.js";
/** The schemas of volumes live in `volumes.ts`. */
export type { CreateVolume, MountedVolume, Volume, VolumeList, VolumeMode, VolumeMount } from "./volumes.js";
/** The schemas of processes and filesystem operations live in `proc-types.ts`. */
export type * from "./proc-types.js";
/** The schemas of the event stream live in `events.ts`. */
export type { BranchEvent, Event, EventKind, EventsReady, PoolEvent } from "./events.js";
/** The schemas of snapshot push and pull live in `transfer.ts`. */
export type { PullResult, PullSnapshot, PushResult, PushSnapshot, TransferEvent } from "./transfer.js";

/** The accelerator in use and why it was chosen. */
export interface AccelInfo {
  /** `kvm` or `tcg`. */
  kind: string;
  reason: string;
}

/** How a branch copies memory. */
export type BranchMode = "live" | "diff" | "full";

/** `POST /v1/sandboxes/{id}/branch`. */
export interface BranchRequest {
  mode?: BranchMode | null;
  /** Children to spawn from the branch point (0–1000, default 1). */
  count?: number | null;
  tag?: string | null;
  /**
   * Wait for the snapshot and children before answering (default true).
   * With `false` the call returns as soon as the source has resumed; the
   * snapshot is then `writing` until it is `ready` or `failed`.
   */
  wait?: boolean | null;
  /**
   * Ports to publish for each child. Omitted: the source's guest ports, each
   * on a newly allocated host port (host ports cannot be shared). Every child
   * keeps the source's network mode and egress allow-list.
   */
  ports?: PortForward[] | null;
  /** As for `POST /v1/sandboxes` (default true). */
  wait_for_network?: boolean | null;
  /** Limits for the children, field by field over the source's. */
  limits?: SandboxLimits | null;
  /** The children's timeout in seconds, from their start (default: the source's). */
  timeout?: number | null;
}

/** The result of a branch. */
export interface BranchResult {
  mode: BranchMode;
  /** The snapshot of the branch point. */
  snapshot: Snapshot;
  children: Sandbox[];
  /** How long the source's vCPUs were stopped (QEMU STOP/RESUME timestamps). */
  pause_ms: number;
  /** Taking the snapshot. */
  snapshot_ms: number;
  /** Spawning the children. */
  spawn_ms: number;
  total_ms: number;
}

/** `POST /v1/sandboxes`: start a sandbox. */
export interface CreateSandbox {
  /** Image name; `default` when omitted. */
  image?: string | null;
  /** Guest RAM in MiB (default 512). */
  memory_mib?: number | null;
  /** vCPUs (default 1). */
  cpus?: number | null;
  /** Spawn from this snapshot (id or tag); it fixes the image, memory and cpus. */
  snapshot?: string | null;
  /** Spawn this many sandboxes at once (1–1000); the response is then a {@link SandboxBatch}. */
  count?: number | null;
  /** Use (and on first use, create) the image's boot template (default true). */
  use_template?: boolean | null;
  /** `nat` (the default where the host allows it): a network of its own with NAT egress; `none`: no way out. */
  network?: NetworkMode | null;
  /** Guest TCP ports to publish on host loopback ports (needs `nat`). */
  ports?: PortForward[] | null;
  /**
   * Allow egress only to these destinations (needs `nat`). Omitted: any
   * destination except the host and other sandboxes. An entry that covers
   * another sandbox's uplink opens it too; one that covers the host opens
   * it only with `allow_host`. The list holds for every packet leaving the
   * sandbox's namespace (the guest's and any process's in it, QEMU's).
   */
  egress?: EgressRule[] | null;
  /**
   * Let the `egress` entries reach the host itself: its own services on the
   * addresses and ports they name (default false; needs `egress`).
   */
  allow_host?: boolean | null;
  /**
   * Answer only once the guest's network path is proven to work (default
   * true). With `false` the spawn returns right after the guest has its
   * identity; the network is set up either way.
   */
  wait_for_network?: boolean | null;
  /**
   * Root disk size in bytes (default: the image's). A larger size grows the
   * guest's root filesystem; a smaller one is refused.
   */
  disk_size?: number | null;
  /**
   * Labels (up to 64 pairs), listed and filterable with
   * `GET /v1/sandboxes?metadata.KEY=VALUE`. A branch's children inherit them.
   */
  metadata?: Record<string, string> | null;
  /** Environment variables every exec starts with (an exec's own `env` wins); children inherit them. */
  env?: Record<string, string> | null;
  /** Seconds until the sandbox is removed, or paused with `on_timeout: "pause"` (1 to 2,592,000). */
  timeout?: number | null;
  /** What happens when the timeout runs out (default `kill`; needs `timeout`). */
  on_timeout?: OnTimeout | null;
  /** Resource limits (omitted fields: unlimited); a branch's children inherit them. */
  limits?: SandboxLimits | null;
  /**
   * Host directories and named volumes to mount (docs/volumes.md). A
   * snapshot taken with volumes fixes them: its clones get the same ones.
   */
  volumes?: VolumeMount[] | null;
}

/** `POST /v1/sandboxes/{id}/snapshot`. */
export interface CreateSnapshot {
  /** A unique name to refer to the snapshot by. */
  tag?: string | null;
}

/** One egress allow-list entry. */
export interface EgressRule {
  /** An IPv4 address or network, `A.B.C.D` or `A.B.C.D/N`. */
  cidr: string;
  /** TCP and UDP ports; empty or omitted means every port. */
  ports?: number[];
}

/** The body of every error response. */
export interface ErrorBody {
  error: ErrorDetail;
}

/** A machine-readable code and a message saying what to do. */
export interface ErrorDetail {
  code: string;
  /** What went wrong, ending with the hint in plain words when there is one. */
  message: string;
  /** What to do next, as an action (the message already says it in words). */
  hint?: ErrorHint;
}

/** `POST /v1/sandboxes/{id}/exec`: run a command. */
export interface ExecRequest {
  /**
   * Program and arguments; `argv[0]` is looked up on the guest's PATH.
   * Empty or omitted: the image's default command (its `Entrypoint` and `Cmd`),
   * or what `cmd` and `entrypoint` say.
   */
  argv?: string[];
  /**
   * Arguments as `docker run IMAGE ARGS` takes them: they replace the image's
   * `Cmd` after its `Entrypoint` (or `entrypoint`). Not with `argv`.
   */
  cmd?: string[] | null;
  /**
   * Replaces the image's `Entrypoint` (`[]`: none), as `docker run --entrypoint`;
   * the image's `Cmd` is then dropped. Not with `argv`.
   */
  entrypoint?: string[] | null;
  /** Extra environment variables, on top of the image's `Env` and the agent's. */
  env?: Record<string, string>;
  /** Working directory (default: the image's `WorkingDir`, else `/`). */
  cwd?: string | null;
  /** Run as this user: `name`, `uid`, `name:group` or `uid:gid` (default: the image's `User`, else root). */
  user?: string | null;
  /** Standard input as text. */
  stdin?: string | null;
  /** Standard input as base64 bytes (instead of `stdin`). */
  stdin_base64?: string | null;
  /** Kill the command after this many milliseconds. */
  timeout_ms?: number | null;
  /** Keep at most this many bytes of each of stdout and stderr. */
  max_output_bytes?: number | null;
  /** Encoding of the output in the response (default `utf8`). */
  encoding?: OutputEncoding | null;
  /**
   * Stream the output as it happens: the response is `application/x-ndjson`,
   * one {@link ExecEvent} per line. `max_output_bytes` and `encoding` do not
   * apply. `Client.execStream` sets it.
   */
  stream?: boolean;
}

/** The result of a finished command. */
export interface ExecResult {
  /** Exit status, when the command exited normally. */
  exit_code?: number | null;
  /** The signal that ended the command, if one did. */
  signal?: number | null;
  /** The command ran past `timeout_ms` and was killed. */
  timed_out: boolean;
  stdout: string;
  stderr: string;
  encoding: OutputEncoding;
  /** Total bytes the command wrote, including any dropped past the cap. */
  stdout_bytes: number;
  stderr_bytes: number;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** Run time inside the guest. */
  duration_ms: number;
}

/**
 * One line of a streamed exec (`stream: true`), newline-delimited JSON:
 * output chunks (base64) as they happen, then `exit` or `error`.
 */
export type ExecEvent =
  | {
      /** A chunk of standard output, base64. */
      type: "stdout";
      data: string;
    }
  | {
      /** A chunk of standard error, base64. */
      type: "stderr";
      data: string;
    }
  | {
      /** The command finished; always the last line of a successful stream. */
      type: "exit";
      exit_code?: number | null;
      signal?: number | null;
      timed_out: boolean;
      duration_ms: number;
      stdout_bytes: number;
      stderr_bytes: number;
    }
  | {
      /** The command could not run to the end (the guest went away…); the last line of a failed stream. */
      type: "error";
      error: ErrorDetail;
    };

/** `PUT /v1/sandboxes/{id}/files`. */
export interface FileWritten {
  path: string;
  size: number;
}

/** `POST /v1/snapshots/{id}/flatten`. */
export interface FlattenRequest {
  /** A unique name for the flat snapshot. */
  tag?: string | null;
}

/** Query of `POST /v1/images/build` (the body is the build context as a tar). */
export interface BuildQuery {
  /** The image's name. */
  tag: string;
  /** The Dockerfile's path inside the context (default `Dockerfile`). */
  dockerfile?: string | null;
  /** `--build-arg`s as a JSON object, e.g. `{"V":"1"}`. */
  build_args?: string | null;
  /** Run every step again, ignoring the cache. */
  no_cache?: boolean | null;
  /** Build this stage (`FROM … AS name`) instead of the last, as `docker build --target`. */
  target?: string | null;
  disk_size?: number | null;
  /** Guest RAM of the build sandbox in MiB. */
  memory_mib?: number | null;
}

/** Garbage collection of branch points, as `GET /v1/info` shows it. */
export interface GcInfo {
  /** Whether the daemon collects in the background (`serve --gc-interval`, 0 turns it off). */
  enabled: boolean;
  /** A branch point younger than this is never collected unless a prune asks for `all` (`serve --gc-grace`). */
  grace_secs: number;
  /** Seconds between background collections (0: off). */
  interval_secs: number;
}

/** `GET /v1/health`. */
export interface Health {
  /** Always `ok` when the daemon answers. */
  status: string;
  version: string;
}

/** An installed image. */
export interface Image {
  name: string;
  /** `ext4`. */
  format: string;
  /** Size of its root filesystem (a sandbox may ask for a larger `disk_size`). */
  size_bytes: number;
  created_at: string;
  /** `builtin`, `registry`, `import` or `build`. */
  source: string;
  /** The registry reference, archive name or base image it came from. */
  reference?: string | null;
  /** The manifest digest, when it came with one. */
  digest?: string | null;
  /** Layer digests, bottom first. */
  layers?: string[];
  config: ImageConfig;
  /** The process its boot template starts, if any. */
  start?: StartCommand | null;
  /** Sandboxes that use the image (on `GET /v1/images/{name}`); while any exist it cannot be deleted. */
  sandboxes?: string[];
  /** Snapshots made from it (on `GET /v1/images/{name}`). */
  snapshots?: string[];
}

/**
 * The defaults of every exec in a sandbox of the image (from the OCI image
 * config), and what an exec with an empty `argv` runs.
 */
export interface ImageConfig {
  /** `KEY=value` strings. */
  env?: string[];
  working_dir?: string | null;
  /** `name`, `uid`, `name:group` or `uid:gid`. */
  user?: string | null;
  entrypoint?: string[];
  cmd?: string[];
  /** `8080/tcp` style. */
  exposed_ports?: string[];
  labels?: Record<string, string>;
}

/**
 * One line of an image operation's NDJSON progress stream (pull, import,
 * build); the last one is `done` or `error`.
 */
export type ImageEvent =
  | {
      /** A phase starts (`resolving`, `fetching`, `unpacking`, `mkfs`, …). */
      type: "phase";
      phase: string;
    }
  | {
      /** Bytes of one item (a blob, a layer) done so far. */
      type: "progress";
      item: string;
      done: number;
      total?: number | null;
    }
  | {
      /** An item needed no work: a blob already present, a cached build step. */
      type: "cached";
      item: string;
    }
  | {
      /** A build step starts. */
      type: "step";
      index: number;
      total: number;
      text: string;
      cached: boolean;
    }
  | {
      /** A line of output or a note. */
      type: "log";
      line: string;
    }
  | {
      /** The operation finished: the installed image. */
      type: "done";
      image: Image;
    }
  | {
      /** The operation failed; nothing was installed. */
      type: "error";
      error: ErrorDetail;
    };

/** `GET /v1/images`. */
export interface ImageList {
  images: Image[];
}

/** Query of `POST /v1/images/import` (the body is the archive). */
export interface ImportQuery {
  /** The image's name. */
  name: string;
  /** The archive's file name, for the record and the error messages. */
  file?: string | null;
  /** Root filesystem size in bytes (default: content plus room). */
  disk_size?: number | null;
  /** Replace an image of the same name. */
  replace?: boolean | null;
}

/** `GET /v1/info`. */
export interface Info {
  version: string;
  /** The daemon's node name in a cluster (`serve --node`): new sandbox and snapshot ids carry it (`sb-NAME-<12 hex>`); null for a daemon of its own. */
  node?: string | null;
  accel: AccelInfo;
  qemu: QemuInfo;
  limits: Limits;
  /** The daemon's data directory. */
  home: string;
  /** Images that can be spawned. */
  images: string[];
  /** Sandboxes known to the daemon, in any state. */
  sandboxes: number;
  snapshots: number;
  /** The warm-pool size of every snapshot without one of its own (`serve --pool-size`); branch points start at 0. */
  default_pool_size: number;
  pools: PoolInfo[];
  network: NetInfo;
  /** Garbage collection of branch points. */
  gc: GcInfo;
  /** Memory and disk capacity as admission control sees it (absent from older daemons). */
  capacity?: Capacity;
}

/** Limits the daemon enforces. */
export interface Limits {
  max_memory_mib: number;
  max_cpus: number;
  max_sandboxes: number;
  max_exec_output_bytes: number;
  max_exec_timeout_ms: number;
  max_file_bytes: number;
  max_request_bytes: number;
  /** Requests handled at once; more get 429 `limit_exceeded`. */
  max_concurrent_requests?: number;
  /** A request body must arrive within this long, or 408 `request_timeout`. */
  request_body_timeout_ms?: number;
}

/** Memory use of a sandbox's QEMU process, from `/proc/<pid>/smaps_rollup`. */
/**
 * The qcow2 layers a running sandbox's disk reads through above its base
 * image. A snapshot or branch adds one; a background stream folds them back
 * into the top (`streaming` while it copies).
 */
export interface DiskChain {
  layers: number;
  streaming: boolean;
}

export interface MemoryUsage {
  rss_kib: number;
  pss_kib: number;
  private_dirty_kib: number;
}

/** Networking as `GET /v1/info` shows it. */
export interface NetInfo {
  /** Can sandboxes get `nat` networks on this host? */
  available: boolean;
  /** Why not, when they cannot (`forkvm doctor` says more). */
  reason?: string | null;
  /** The uplink address pool. */
  pool: string;
  /** The mode used when a spawn does not name one. */
  default_mode: NetworkMode;
}

/** A sandbox's network as the API shows it. */
export interface NetworkInfo {
  mode: NetworkMode;
  /** The guest's address (the same in every sandbox; each has its own namespace). */
  guest_ip: string;
  gateway: string;
  /** The host end of the sandbox's uplink (unique per sandbox), for `nat`. */
  host_ip?: string | null;
  /** The sandbox end of its uplink: the source address of its egress before the host's NAT, for `nat`. */
  uplink_ip?: string | null;
  /** Its published ports, with the host port in use. */
  ports: PortForward[];
  /** Its egress allow-list, if it has one. */
  egress?: EgressRule[] | null;
  /** The `egress` entries reach the host itself too (absent: false). */
  allow_host?: boolean;
}

/**
 * `PUT /v1/sandboxes/{id}/network`: a running sandbox's new egress
 * allow-list. New connections follow it at once; established ones are kept.
 */
export interface SetNetwork {
  /** Allow egress only to these destinations; `null` or omitted: any egress (but the host and other sandboxes). */
  egress?: EgressRule[] | null;
  /** The `egress` entries reach the host itself too (needs `egress`; omitted: false). */
  allow_host?: boolean | null;
}

/** A sandbox's network: `nat`, a namespace of its own with NAT to the host's network; `none`, no route out. */
export type NetworkMode = "none" | "nat";

/** How `stdout`/`stderr` are encoded in an {@link ExecResult}. */
export type OutputEncoding = "utf8" | "base64";

/** `PUT /v1/snapshots/{id}/pool`. */
export interface PoolConfig {
  /** QEMU processes to keep started and waiting (0 disables the pool); `null` follows the daemon's default. */
  size?: number | null;
}

/** A warm pool as `GET /v1/info` shows it. */
export interface PoolInfo {
  snapshot: string;
  size: number;
  /** Processes ready to be claimed right now. */
  ready: number;
}

/** A published guest port. */
export interface PortForward {
  /** The TCP port in the guest. */
  guest: number;
  /** The host loopback port; 0 (or omitted) picks a free one, reported back. */
  host?: number;
}

/** `POST /v1/images`: pull an image from an OCI Distribution registry. */
export interface PullImage {
  /** e.g. `registry.example:5000/team/py:3.12` or `ubuntu@sha256:…`. */
  reference: string;
  /** The local name (default: the repository's last part and the tag, e.g. `py-3.12`). */
  name?: string | null;
  /** Registry user name (with `password`); default: from the daemon host's `~/.docker/config.json`, else anonymous. */
  username?: string | null;
  password?: string | null;
  /** Speak plain HTTP to the registry (loopback registries always may). */
  insecure?: boolean;
  /** Root filesystem size in bytes (default: content plus room). */
  disk_size?: number | null;
  /** Replace an image of the same name. */
  replace?: boolean;
  /** A start command for the image's boot template. */
  start?: StartCommand | null;
  /** Stream progress as NDJSON {@link ImageEvent}s (`Client.pullImage` sets it). */
  stream?: boolean;
}

/** A snapshot a prune chose but could not remove. */
export interface PruneFailure {
  id: string;
  message: string;
}

/** `POST /v1/snapshots/prune`. */
export interface PruneRequest {
  /** Ignore the grace period: take unneeded branch points however young (default false). */
  all?: boolean | null;
  /** Only list what would be removed (default false). */
  dry_run?: boolean | null;
}

/** The result of `POST /v1/snapshots/prune`. */
export interface PruneResult {
  /** True when nothing was removed. */
  dry_run: boolean;
  /** The grace period this collection applied (0 with `all`). */
  grace_secs: number;
  /** In the order removed: children before their parents. */
  snapshots: PrunedSnapshot[];
  /** The sum of their `bytes`. */
  freed_bytes: number;
  /** Snapshots chosen but not removed, with why. */
  failed: PruneFailure[];
}

/** A snapshot a prune removed (or, in a dry run, would remove). */
export interface PrunedSnapshot {
  id: string;
  kind: string;
  parent?: string | null;
  created_at: string;
  /** Bytes given back to the filesystem (in a dry run, an estimate that leaves disk layers out). */
  bytes: number;
}

/** The QEMU in use. */
export interface QemuInfo {
  path: string;
  version: string;
}

/** A sandbox as the API shows it. */
export interface Sandbox {
  id: string;
  state: SandboxState;
  image: string;
  memory_mib: number;
  cpus: number;
  /** `kvm` or `tcg`. */
  accel: string;
  /** The QEMU process id while it runs. */
  pid?: number | null;
  /** RFC 3339 creation time. */
  created_at: string;
  /** Why the sandbox failed, when `state` is `failed`. */
  failure?: string | null;
  /** Why a `running` sandbox is suspended by disk pressure (calls into it get 507 until it resumes by itself). */
  suspended?: string | null;
  timings?: SpawnTimings | null;
  /** Present on `GET /v1/sandboxes/{id}` while QEMU runs. */
  memory?: MemoryUsage | null;
  /** Its disk chain (`GET` of one running sandbox). */
  disk?: DiskChain | null;
  /** The snapshot the sandbox was spawned from. */
  snapshot?: string | null;
  /** Its network; absent for a sandbox without a NIC. */
  network?: NetworkInfo | null;
  /** Its labels (absent when it has none). */
  metadata?: Record<string, string>;
  /** The default environment of its execs, from the spawn's `env` (absent when empty). */
  env?: Record<string, string>;
  /** Its timeout, when it has one. */
  lifetime?: Lifetime | null;
  /** Its saved state while `paused`. */
  paused?: PauseInfo | null;
  /** Its resource limits (absent when it has none). */
  limits?: SandboxLimits | null;
  /** What it has used: present on `GET /v1/sandboxes/{id}` of a running sandbox. */
  usage?: Usage | null;
  /** Its volumes, each with the `host_path` its guest reads and writes (absent when it has none). */
  volumes?: MountedVolume[];
}

/** The response to `POST /v1/sandboxes` with `count`. */
export interface SandboxBatch {
  sandboxes: Sandbox[];
  /** Wall time of the whole batch. */
  total_ms: number;
}

/** `GET /v1/sandboxes`. */
export interface SandboxList {
  sandboxes: Sandbox[];
}

/** Lifecycle state of a sandbox. */
export type SandboxState = "starting" | "running" | "failed" | "paused" | "lost";

/** A snapshot as the API shows it. */
export interface Snapshot {
  id: string;
  tag?: string | null;
  /** The snapshot the source was spawned from (its disk layer is this snapshot's backing layer). */
  parent?: string | null;
  /** The sandbox that was snapshotted. */
  source: string;
  image: string;
  memory_mib: number;
  cpus: number;
  created_at: string;
  /** `shared`, `stream`, `live` or `diff`. */
  kind: string;
  /** Diff links between this snapshot and its base memory image (0 but for `diff`). */
  depth?: number;
  /** `ready`, `writing` (an asynchronous branch is still publishing it) or `failed`. */
  state: string;
  /** Why an asynchronous branch's snapshot failed. */
  failure?: string | null;
  /** True for an image's boot template. */
  template: boolean;
  qemu_version: string;
  sizes: SnapshotSizes;
  /** Warm-pool size in effect (QEMU processes kept waiting for this snapshot). */
  pool_size: number;
  /** `pool_size` is the daemon's default (`serve --pool-size`): the snapshot has no size of its own. */
  pool_default: boolean;
  /** Sandboxes spawned from it that still exist. */
  sandboxes: string[];
  /** Snapshots whose disk layer builds on this one. */
  children: string[];
  /** What made it: `branch`, `snapshot`, `template`, `flatten` or `unknown`; garbage collection only removes `branch` ones. */
  origin: string;
  /** Kept from garbage collection (`PUT /v1/snapshots/{id}/pin`). */
  pinned: boolean;
  /** A branch point's mode: `live`, `diff` or `full`. */
  mode?: string | null;
  /** How long the source was paused to take it (branch points and snapshots of a running sandbox). */
  pause_ms?: number | null;
  /** The diff snapshot a `flatten` made this one from. */
  flattened_from?: string | null;
  /** Present in the response that created it. */
  timings?: SnapshotTimings | null;
}

/** `GET /v1/snapshots`. */
export interface SnapshotList {
  snapshots: Snapshot[];
}

/** Sizes of a snapshot's files. */
export interface SnapshotSizes {
  memory_bytes: number;
  /** Memory image bytes actually allocated (it is sparse). */
  memory_allocated_bytes: number;
  device_state_bytes: number;
  disk_bytes: number;
  /** A diff snapshot's changed pages (`memory.diff`), header included. */
  memory_diff_bytes?: number;
  /** Device state bytes actually allocated (a live save's file is sparse). */
  device_state_allocated_bytes?: number;
  /** What the snapshot's directory holds on disk, caches and disk layer included. */
  on_disk_bytes?: number;
}

/** Where the time of a snapshot went, in milliseconds. */
export interface SnapshotTimings {
  /** How long the source's vCPUs were stopped. */
  pause_ms: number;
  save_state_ms: number;
  freeze_disk_ms: number;
  copy_memory_ms: number;
  /** Hashing and publishing, after the source resumed. */
  publish_ms: number;
  total_ms: number;
}

/**
 * A process the image's boot template starts before it is captured, so that
 * every spawn resumes with it already running.
 */
export interface StartCommand {
  command: string[];
  /** Ready when this TCP port in the guest accepts connections. */
  ready_port?: number | null;
  /** Ready when this command exits 0 (instead of a port). */
  ready_command?: string[] | null;
  /** How long the check may take (default 60 s). */
  ready_timeout_secs?: number | null;
}

/** Where the time of a spawn went, in milliseconds. */
export interface SpawnTimings {
  /** Creating the sandbox directory, RAM file and disk overlay. */
  prepare_ms: number;
  /** Starting QEMU until QMP answered. */
  qemu_start_ms: number;
  /** From QMP ready until the guest agent answered (0 for a restore). */
  boot_ms: number;
  /** Loading the snapshot's device state and resuming (restores only). */
  restore_ms?: number | null;
  /** Giving the clone its identity: RNG reseed, clock, hostname (restores only). */
  identity_ms?: number | null;
  /** The QEMU process came from the warm pool. */
  from_pool?: boolean | null;
  /** Creating the image's boot template (first spawn of an image only). */
  template_ms?: number | null;
  /** Setting up the host side of the network: namespace, uplink, rules, forwarded ports. */
  network_ms?: number | null;
  /** From the guest's resume (or the end of its boot) until its network path was proven to work. */
  network_ready_ms?: number | null;
  /** When the guest resumed (restores only), in host Unix time (ms): a reference for what it does afterwards. */
  resumed_unix_ms?: number | null;
  total_ms: number;
}
