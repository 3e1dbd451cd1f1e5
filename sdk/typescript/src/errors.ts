/**
 * Errors raised by the SDK. Every one is a {@link ForkvmError}: the server's
 * `{"error": {"code", "message"}}` with the HTTP status, or a transport or
 * protocol failure on the client side.
 *
 * @module
 */

import type { ErrorHint } from "./error-types.js";

/** Error codes the daemon sends (see docs/api.md), plus the SDK's own. */
export type ErrorCode =
  | "invalid_request"
  | "unauthorized"
  | "not_found"
  | "image_not_found"
  | "conflict"
  | "snapshot_corrupt"
  | "payload_too_large"
  | "limit_exceeded"
  | "request_timeout"
  | "qemu_failed"
  | "network_failed"
  | "network_unavailable"
  | "capacity_exceeded"
  | "internal"
  | "guest_error"
  | "guest_timeout"
  | "registry_auth_failed"
  | "invalid_image"
  | "incompatible_snapshot"
  | "build_failed"
  | "registry_unreachable"
  | "no_space"
  | "node_lost"
  | "node_unreachable"
  | "connection_failed"
  | "protocol_error"
  | "snapshot_failed"
  | "timeout"
  | (string & {});

/** Any error from forkvm: `code` and `message` come from the server when it sent them. */
export class ForkvmError extends Error {
  override name = "ForkvmError";
  /** The machine-readable code, e.g. `not_found`. */
  readonly code: ErrorCode;
  /**
   * The HTTP status, or 0 when no HTTP response was received. For an error
   * reported inside a streamed exec (after a 200), the status that error has
   * outside a stream (e.g. 404 for `not_found`).
   */
  readonly status: number;
  /**
   * What to do next, when the daemon said: an action (`resume_sandbox`,
   * `free_space`, ...) and what it applies to. `message` already ends with
   * it in plain words.
   */
  hint?: ErrorHint | undefined;

  constructor(message: string, code: ErrorCode, status: number, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
    this.status = status;
  }

  /** Build the most specific error class for a server error. */
  static fromResponse(status: number, code: string, message: string, hint?: ErrorHint): ForkvmError {
    const Class = BY_CODE[code] ?? BY_STATUS[status] ?? ForkvmError;
    const e = new Class(message, code, status);
    if (hint !== undefined) e.hint = hint;
    return e;
  }

  /** The HTTP status the daemon gives an error code (docs/api.md), if known. */
  static statusOf(code: string): number | undefined {
    return STATUS_OF_CODE[code];
  }
}

/** 400 (and 405): malformed request, unknown fields, out-of-range values. */
export class InvalidRequestError extends ForkvmError {
  override name = "InvalidRequestError";
}
/** 401: TCP without the right bearer token. */
export class UnauthorizedError extends ForkvmError {
  override name = "UnauthorizedError";
}
/** 403: refused for lack of rights (see {@link RegistryAuthFailedError}). */
export class ForbiddenError extends ForkvmError {
  override name = "ForbiddenError";
}
/** 403 `registry_auth_failed`: a registry refused the credentials of a pull or a push. */
export class RegistryAuthFailedError extends ForbiddenError {
  override name = "RegistryAuthFailedError";
}
/**
 * 404: no such sandbox, snapshot, image, route, guest file or executable; with
 * code `image_not_found`, also no such repository, tag or digest in a registry
 * (an image or snapshot pull).
 */
export class NotFoundError extends ForkvmError {
  override name = "NotFoundError";
}
/** 409: the sandbox failed or is starting, a snapshot is in use, a tag is taken. */
export class ConflictError extends ForkvmError {
  override name = "ConflictError";
}
/** 413: body, stdin or file over the limit. */
export class PayloadTooLargeError extends ForkvmError {
  override name = "PayloadTooLargeError";
}
/** 422: the request is well-formed, but what it names or carries is unusable. */
export class UnprocessableError extends ForkvmError {
  override name = "UnprocessableError";
}
/** 422 `snapshot_corrupt`: a snapshot file fails its size or SHA-256 check. */
export class SnapshotCorruptError extends UnprocessableError {
  override name = "SnapshotCorruptError";
}
/**
 * 422 `invalid_image`: an image's blobs fail verification, its archive or
 * manifest is malformed, or it has no linux/amd64 variant.
 */
export class InvalidImageError extends UnprocessableError {
  override name = "InvalidImageError";
}
/**
 * 422 `incompatible_snapshot`: a pulled snapshot cannot be restored on this
 * host (QEMU release, machine type, accelerator, CPU or guest kernel differ;
 * the message says which). Nothing was written.
 */
export class IncompatibleSnapshotError extends UnprocessableError {
  override name = "IncompatibleSnapshotError";
}
/** 422 `build_failed`: a Dockerfile is invalid or one of its steps failed (its output came as `log` events). */
export class BuildFailedError extends UnprocessableError {
  override name = "BuildFailedError";
}
/** 408: the request body did not arrive in time. */
export class RequestTimeoutError extends ForkvmError {
  override name = "RequestTimeoutError";
}
/** 429: the sandbox limit, or the daemon's limit of requests at once, is reached. */
export class LimitExceededError extends ForkvmError {
  override name = "LimitExceededError";
}
/** 5xx other than 502/504: QEMU could not start, the sandbox's network could not be set up, or a host problem. */
export class ServerError extends ForkvmError {
  override name = "ServerError";
}
/**
 * 503 `network_unavailable`: this host cannot give sandboxes a network
 * (`forkvm doctor` says why); spawn with `network: "none"` meanwhile.
 */
export class NetworkUnavailableError extends ServerError {
  override name = "NetworkUnavailableError";
}
/**
 * 503 `capacity_exceeded`: the spawn, branch or resume would pass the host's
 * memory commitment. Nothing was started; retry once sandboxes have been
 * removed or paused (`client.info()` shows `capacity`). A disk below the
 * reserve is {@link NoSpaceError} instead.
 */
export class CapacityExceededError extends ServerError {
  override name = "CapacityExceededError";
}
/** 502 `registry_unreachable`: a registry could not be reached or answered nonsense. */
export class RegistryUnreachableError extends ServerError {
  override name = "RegistryUnreachableError";
}
/** 507 `no_space`: the filesystem holding the daemon's home is full. */
export class NoSpaceError extends ServerError {
  override name = "NoSpaceError";
}
/** 410 `node_lost` (cluster endpoint): the sandbox was on a node the cluster declared dead. */
export class NodeLostError extends ForkvmError {
  override name = "NodeLostError";
}
/** 503 `node_unreachable` (cluster endpoint): the node holding it does not answer; retry. */
export class NodeUnreachableError extends ServerError {
  override name = "NodeUnreachableError";
}
/** 502: the guest agent went away (the VM died). */
export class GuestError extends ForkvmError {
  override name = "GuestError";
}
/** 504: the guest did not boot, or did not answer. */
export class GuestTimeoutError extends ForkvmError {
  override name = "GuestTimeoutError";
}
/** The daemon could not be reached (status 0). */
export class ConnectionError extends ForkvmError {
  override name = "ConnectionError";
  constructor(message: string, options?: ErrorOptions) {
    super(message, "connection_failed", 0, options);
  }
}
/** The daemon answered something the SDK cannot understand. */
export class ProtocolError extends ForkvmError {
  override name = "ProtocolError";
  constructor(message: string, status: number, options?: ErrorOptions) {
    super(message, "protocol_error", status, options);
  }
}
/** The daemon does not support streaming exec (it predates it). */
export class StreamingUnsupportedError extends InvalidRequestError {
  override name = "StreamingUnsupportedError";
}

type ErrorClass = new (message: string, code: string, status: number) => ForkvmError;

const BY_CODE: Record<string, ErrorClass> = {
  invalid_request: InvalidRequestError,
  unauthorized: UnauthorizedError,
  not_found: NotFoundError,
  image_not_found: NotFoundError,
  conflict: ConflictError,
  payload_too_large: PayloadTooLargeError,
  snapshot_corrupt: SnapshotCorruptError,
  limit_exceeded: LimitExceededError,
  request_timeout: RequestTimeoutError,
  qemu_failed: ServerError,
  network_failed: ServerError,
  network_unavailable: NetworkUnavailableError,
  capacity_exceeded: CapacityExceededError,
  internal: ServerError,
  guest_error: GuestError,
  guest_timeout: GuestTimeoutError,
  registry_auth_failed: RegistryAuthFailedError,
  invalid_image: InvalidImageError,
  incompatible_snapshot: IncompatibleSnapshotError,
  build_failed: BuildFailedError,
  registry_unreachable: RegistryUnreachableError,
  no_space: NoSpaceError,
  node_lost: NodeLostError,
  node_unreachable: NodeUnreachableError,
};

const STATUS_OF_CODE: Record<string, number> = {
  invalid_request: 400,
  unauthorized: 401,
  not_found: 404,
  image_not_found: 404,
  conflict: 409,
  payload_too_large: 413,
  snapshot_corrupt: 422,
  limit_exceeded: 429,
  request_timeout: 408,
  qemu_failed: 500,
  network_failed: 500,
  network_unavailable: 503,
  capacity_exceeded: 503,
  internal: 500,
  guest_error: 502,
  guest_timeout: 504,
  registry_auth_failed: 403,
  invalid_image: 422,
  incompatible_snapshot: 422,
  build_failed: 422,
  registry_unreachable: 502,
  no_space: 507,
  node_lost: 410,
  node_unreachable: 503,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  405: InvalidRequestError,
  408: RequestTimeoutError,
  409: ConflictError,
  410: NodeLostError,
  413: PayloadTooLargeError,
  422: UnprocessableError,
  429: LimitExceededError,
  500: ServerError,
  502: GuestError,
  503: ServerError,
  504: GuestTimeoutError,
  507: NoSpaceError,
};
