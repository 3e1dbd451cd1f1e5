/**
 * forkvm: AI-agent sandboxes as microVMs that fork while they run.
 *
 * ```ts
 * import { Sandbox } from "forkvm";
 * await using sb = await Sandbox.create();
 * console.log((await sb.exec("python3 -c 'print(6 * 7)'")).stdout);
 * ```
 *
 * @module
 */
export {
  lifetimeFields,
  Sandbox,
  SandboxFiles,
  type Branch,
  type BranchOptions,
  type LifetimeOptions,
  type SandboxCreateOptions,
} from "./sandbox.js";
export {
  ProcessStream,
  SandboxProcess,
  SandboxProcesses,
  startParams,
  type ProcessExit,
  type ProcessStreamEvent,
  type StartProcessOptions,
} from "./processes.js";
export { FsWatcher, SandboxFs, WatchStream } from "./fs.js";
export {
  ProcessOps,
  signalNumber,
  type ProcessRef,
  type ProcessStreamFrame,
  type SignalSpec,
  type StartProcessParams,
  type WatchStreamFrame,
} from "./client-procs.js";
export { TimeTravelOps } from "./client-timetravel.js";
export { MAX_TIMEOUT_S, type Lifetime, type OnTimeout, type PauseInfo } from "./lifecycle.js";
export type { Capacity, SandboxLimits, Usage } from "./resources.js";
export type { Checkpoint, Retention, Rewound, Timeline } from "./timeline.js";
export type {
  ChangeKind,
  Conflict as MergeConflict,
  Diff,
  DiffStats,
  MergeStrategy,
  Merged,
  PathChange,
  PathState,
} from "./treediff.js";
export {
  parseVolume,
  volumeMount,
  volumeMounts,
  type MountedVolume,
  type Volume,
  type VolumeMode,
  type VolumeMount,
  type VolumeSpec,
} from "./volumes.js";
export { Snapshot } from "./snapshot.js";
export {
  EventStream,
  parseEvent,
  type BranchEvent,
  type Event,
  type EventKind,
  type EventsOptions,
  type EventsReady,
  type PoolEvent,
} from "./events.js";
export { SseParser, sseMessages, type SseMessage } from "./sse.js";
export { egressRule, portForward, type EgressSpec, type NetworkOptions, type PortSpec } from "./network.js";
export {
  ExecStream,
  type BinaryExecOptions,
  type Command,
  type CommandResult,
  type ExecEvent,
  type ExecExit,
  type ExecOptions,
  type ExecStreamOptions,
} from "./exec.js";
export {
  Client,
  DEFAULT_HOME,
  defaultClient,
  setDefaultClient,
  type ClientOptions,
  type CreateSandboxParams,
  type DeleteSnapshotOptions,
  type ImageOptions,
  type ListSandboxesOptions,
  type PullImageParams,
  type PullSnapshotParams,
  type PushSnapshotParams,
  type TransferOptions,
  type ExecParams,
  type ExecStreamParams,
  type ExecStreamFrame,
  type RequestOptions,
  type WriteFileOptions,
} from "./client.js";
export {
  DOCKERFILE_IN_CONTEXT,
  parseImageEvent,
  readImageEvents,
  type BuildImageParams,
  type ImageEventCallback,
  type ImportImageParams,
} from "./images.js";
export {
  parseTransferEvent,
  readTransferEvents,
  type PullResult,
  type PullSnapshot,
  type PushResult,
  type PushSnapshot,
  type TransferEvent,
  type TransferEventCallback,
} from "./transfer.js";
export { headerBlocks, packDirectory, paxRecord, TarWriter, type ExtraFile, type TarEntry } from "./tar.js";
export {
  BuildFailedError,
  CapacityExceededError,
  ConflictError,
  ConnectionError,
  ForbiddenError,
  ForkvmError,
  GuestError,
  GuestTimeoutError,
  IncompatibleSnapshotError,
  InvalidImageError,
  InvalidRequestError,
  LimitExceededError,
  NetworkUnavailableError,
  NoSpaceError,
  NodeLostError,
  NodeUnreachableError,
  NotFoundError,
  PayloadTooLargeError,
  ProtocolError,
  RegistryAuthFailedError,
  RegistryUnreachableError,
  RequestTimeoutError,
  ServerError,
  SnapshotCorruptError,
  StreamingUnsupportedError,
  UnauthorizedError,
  UnprocessableError,
  type ErrorCode,
} from "./errors.js";
export {
  FetchTransport,
  parseEndpoint,
  UnixSocketTransport,
  type Endpoint,
  type Transport,
  type TransportOptions,
  type TransportRequest,
  type TransportResponse,
} from "./transport.js";
/** The wire types of the REST API, one per OpenAPI schema: `api.Sandbox`, `api.ExecResult`, … */
export type * as api from "./types.js";
export type { Image as ImageInfo, Sandbox as SandboxInfo, Snapshot as SnapshotInfo } from "./types.js";
