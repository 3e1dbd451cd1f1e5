/**
 * Wire types of a sandbox's lifetime: timeouts, pause and resume (schemas
 * of docs/openapi.json, re-exported by `types.ts` so that they are part of
 * `api`).
 *
 * A sandbox may carry a timeout in seconds. When it runs out the daemon
 * removes the sandbox, or pauses it when `on_timeout` is `pause` (or
 * `pause_filesystem`). A paused sandbox is saved to disk and holds no RAM
 * and no QEMU; a resume brings it back with the same id, memory, disk,
 * network and published ports. A filesystem-only pause keeps the disk and
 * not the memory, and its resume cold-boots from that disk. Time spent
 * paused does not count against the timeout.
 *
 * @module
 */

/** The longest timeout a sandbox may have, in seconds (30 days). */
export const MAX_TIMEOUT_S = 30 * 24 * 3600;

/**
 * What happens when a sandbox's timeout runs out: `kill` removes it (the
 * default), `pause` pauses it, `pause_filesystem` pauses it keeping only its
 * disk (the resume cold-boots).
 */
export type OnTimeout = "kill" | "pause" | "pause_filesystem";

/** A sandbox's timeout as the API shows it. */
export interface Lifetime {
  /** The timeout last set, in seconds. */
  timeout: number;
  on_timeout: OnTimeout;
  /** RFC 3339 time the timeout runs out; absent while paused. */
  expires_at?: string | null;
  /** Seconds left: counts down while the sandbox runs, frozen while it is paused. */
  remaining_s: number;
}

/** A paused sandbox's saved state. */
export interface PauseInfo {
  /**
   * The snapshot holding it (origin `pause`; removed with the sandbox).
   * Absent for a filesystem-only pause, whose disk stays in the sandbox's
   * own files.
   */
  snapshot?: string | null;
  /** `false`: a filesystem-only pause, which saved no memory; the resume cold-boots from the disk. */
  memory?: boolean;
  /** RFC 3339 time of the pause. */
  paused_at: string;
  /** Why: `request` or `timeout`. */
  reason: string;
  /** Memory bytes the pause stored: for a clone only the pages it changed since its snapshot. */
  memory_bytes: number;
  /** Disk bytes the pause stored (its frozen top layer). */
  disk_bytes: number;
  /** How long the vCPUs were stopped before QEMU went away. */
  pause_ms: number;
}

/** `PUT /v1/sandboxes/{id}/timeout`: a new timeout, counted from now. */
export interface SetTimeout {
  /**
   * Seconds from now (1 to 2,592,000, 30 days); `null` removes the timeout.
   * On a paused sandbox it is the time it will have once resumed.
   */
  timeout?: number | null;
  /** Also change what happens on expiry. */
  on_timeout?: OnTimeout | null;
}

/** `POST /v1/sandboxes/{id}/pause` (the body is optional). */
export interface PauseRequest {
  /**
   * `false`: keep only the disk; no memory is saved and the resume
   * cold-boots from the disk (same id, metadata, environment, network and
   * published ports, none of the processes). Default: memory and disk.
   */
  memory?: boolean | null;
}

/** `POST /v1/sandboxes/{id}/resume`. */
export interface ResumeRequest {
  /**
   * A new timeout in seconds from the resume. Omitted: the time the sandbox
   * had left when it was paused, or, when its timeout paused it, its whole
   * timeout again.
   */
  timeout?: number | null;
  /** `false`: cold-boot from the saved disk even when memory was saved (a filesystem-only pause always resumes that way). */
  memory?: boolean | null;
}
