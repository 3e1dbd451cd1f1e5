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
export { Sandbox, SandboxFiles, type Branch, type BranchOptions, type SandboxCreateOptions } from "./sandbox.js";
export { Snapshot } from "./snapshot.js";
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
  type DeleteSnapshotOptions,
  type ExecParams,
  type ExecStreamParams,
  type ExecStreamFrame,
  type RequestOptions,
  type WriteFileOptions,
} from "./client.js";
export {
  ConflictError,
  ConnectionError,
  ForkvmError,
  GuestError,
  GuestTimeoutError,
  InvalidRequestError,
  LimitExceededError,
  NetworkUnavailableError,
  NotFoundError,
  PayloadTooLargeError,
  ProtocolError,
  RequestTimeoutError,
  ServerError,
  SnapshotCorruptError,
  StreamingUnsupportedError,
  UnauthorizedError,
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
export type { Sandbox as SandboxInfo, Snapshot as SnapshotInfo } from "./types.js";
