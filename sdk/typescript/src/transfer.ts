/**
 * Snapshots that travel: push a snapshot (with its chain and base image) to
 * an OCI registry, `POST /v1/snapshots/{id}/push`, and pull it on any host,
 * `POST /v1/snapshots/pull`. Here are their wire types (schemas of
 * docs/openapi.json, re-exported by `types.ts` so that they are part of
 * `api`) and the reading of their progress stream.
 *
 * A pushed snapshot travels with every snapshot it builds on (each a chain
 * "link") and its base image's root disk; what the registry already has is
 * not sent again, what the pulling host already has is not fetched again.
 * With `stream: true` (the Client always sets it) the answer is
 * `application/x-ndjson`, one {@link TransferEvent} per line:
 *
 * ```text
 * {"type":"phase","phase":"resolving 127.0.0.1:5000/team/warm:v1"}
 * {"type":"progress","item":"chunking sn-…/memory.img","done":4194304,"total":536870912}
 * {"type":"cached","item":"link sn-…"}
 * {"type":"pushed","result":{…}}    or {"type":"pulled","result":{…}}   (the last line), or
 * {"type":"error","error":{"code":"…","message":"…"}}
 * ```
 *
 * An `error` line is thrown as the {@link ForkvmError} of its code; a stream
 * that ends without its result or an `error` is a {@link ProtocolError}.
 * Errors found before the work starts (a bad reference, a tag taken, no such
 * snapshot) are ordinary HTTP errors.
 *
 * @module
 */
import { ForkvmError, ProtocolError } from "./errors.js";
import type { ErrorDetail, Snapshot } from "./types.js";

/** `POST /v1/snapshots/{id}/push`: where to push a snapshot. */
export interface PushSnapshot {
  /** Where to: `host[:port]/repo[:tag]` (the tag defaults to `latest`), e.g. `127.0.0.1:5000/team/warm:v1`. */
  reference: string;
  /**
   * Registry user name (give `password` too); default: from the daemon
   * host's `~/.docker/config.json`, else anonymous.
   */
  username?: string | null;
  /** Registry password (with `username`). */
  password?: string | null;
  /** Speak plain HTTP to a registry that is not on loopback (loopback registries always may). */
  insecure?: boolean;
  /** Stream progress as NDJSON {@link TransferEvent}s (`Client.pushSnapshot` sets it). */
  stream?: boolean;
}

/** `POST /v1/snapshots/pull`: which pushed snapshot to pull. */
export interface PullSnapshot {
  /** `host[:port]/repo[:tag]`, or `host[:port]/repo@sha256:<digest>` for exactly one push ({@link PushResult.digest}). */
  reference: string;
  /** A tag for the pulled snapshot on this host (its ancestors get none). */
  tag?: string | null;
  /** Registry user name, as for {@link PushSnapshot.username}. */
  username?: string | null;
  /** Registry password (with `username`). */
  password?: string | null;
  /** Speak plain HTTP to a registry that is not on loopback. */
  insecure?: boolean;
  /** Stream progress as NDJSON {@link TransferEvent}s (`Client.pullSnapshot` sets it). */
  stream?: boolean;
}

/**
 * What a push did. Blobs and bytes count what went over the wire
 * (compressed chunks, configs and manifests); `skipped` ones were in the
 * registry already. A push of what the registry has in full sends only the
 * index manifest: `links_skipped === links`, `blobs_sent === 0`.
 */
export interface PushResult {
  /** The reference, normalised (`127.0.0.1:5000/team/warm:latest`). */
  reference: string;
  /** The digest of the index the tag now names: pull `REPO@DIGEST` to get exactly this snapshot. */
  digest: string;
  /** The snapshot pushed (its id). */
  snapshot: string;
  /** How many snapshots its chain holds (itself and every ancestor). */
  links: number;
  /** Chain links whose manifest the registry already had: nothing of theirs was sent. */
  links_skipped: number;
  /** Whether the base image's root disk was sent (false: the registry had it). */
  image_sent: boolean;
  blobs_sent: number;
  bytes_sent: number;
  blobs_skipped: number;
  bytes_skipped: number;
  /** Manifests written (links, image, and the index). */
  manifests_sent: number;
  total_ms: number;
}

/** What a pull did: the snapshot, published on this host and ready to spawn from. */
export interface PullResult {
  /** The pulled snapshot as `GET /v1/snapshots/{id}` shows it (same id as on the pushing host). */
  snapshot: Snapshot;
  /** The index digest pulled. */
  digest: string;
  /** How many snapshots its chain holds. */
  links: number;
  /** Links this host already had (same snapshot, same content): not fetched. */
  links_cached: number;
  /** The image the chain's disk ends in on this host… */
  image: string;
  /** …and whether this pull created it (false: this host had it). */
  image_created: boolean;
  blobs_fetched: number;
  bytes_fetched: number;
  total_ms: number;
}

/** One line of a push's or a pull's progress stream, tagged by `type`. */
export type TransferEvent =
  | {
      /** A phase starts (`resolving`, `chunking`, `uploading`, `fetching`, `checking`, `publishing`, …). */
      type: "phase";
      phase: string;
    }
  | {
      /** Bytes of one item (a file, a chain link) done so far, of `total` when known. */
      type: "progress";
      item: string;
      done: number;
      total?: number | null;
    }
  | {
      /** An item needed no work (the registry, or this host, had it). */
      type: "cached";
      item: string;
    }
  | {
      /** A line of text. */
      type: "log";
      line: string;
    }
  | {
      /** The push finished (the last line of a push). */
      type: "pushed";
      result: PushResult;
    }
  | {
      /** The pull finished: the snapshot is published (the last line of a pull). */
      type: "pulled";
      result: PullResult;
    }
  | {
      /** The operation failed; nothing was published (the last line). */
      type: "error";
      error: ErrorDetail;
    };

/** Called with each progress event; a returned promise is awaited before the next. */
export type TransferEventCallback = (event: TransferEvent) => void | Promise<void>;

/** Parse one NDJSON line of a transfer progress stream (`status`: the response's, for errors). */
export function parseTransferEvent(line: string, status: number): TransferEvent {
  let event: unknown;
  try {
    event = JSON.parse(line);
  } catch (cause) {
    throw new ProtocolError(`bad line in a transfer progress stream: ${line.slice(0, 200)}`, status, { cause });
  }
  if (event === null || typeof event !== "object" || typeof (event as { type?: unknown }).type !== "string") {
    throw new ProtocolError(`bad line in a transfer progress stream: ${line.slice(0, 200)}`, status);
  }
  return event as TransferEvent;
}

/** The result each operation's stream ends with. */
interface Outcomes {
  push: PushResult;
  pull: PullResult;
}

const FINAL = { push: "pushed", pull: "pulled" } as const;

/**
 * Read a push's (`what: "push"`) or a pull's (`"pull"`) progress stream to
 * its end: each event goes to `onEvent` (events of types this SDK does not
 * know too); resolves with the result of the `pushed` or `pulled` line, or
 * throws the error of the `error` line (with the status its code has
 * outside a stream).
 */
export async function readTransferEvents<K extends keyof Outcomes>(
  what: K,
  lines: AsyncIterable<string>,
  status: number,
  onEvent?: TransferEventCallback,
): Promise<Outcomes[K]> {
  const final = FINAL[what];
  for await (const line of lines) {
    const event = parseTransferEvent(line, status);
    await onEvent?.(event);
    if (event.type === "error") {
      const code = event.error?.code ?? "error";
      const message = event.error?.message ?? `the ${what} failed`;
      throw ForkvmError.fromResponse(ForkvmError.statusOf(code) ?? status, code, message);
    }
    if (event.type === final) {
      if (!event.result || typeof event.result !== "object") {
        throw new ProtocolError(`a \`${final}\` line without its result in a ${what} progress stream`, status);
      }
      return event.result as Outcomes[K];
    }
    if (event.type === "pushed" || event.type === "pulled") {
      throw new ProtocolError(`a \`${event.type}\` line in the progress stream of a ${what}`, status);
    }
  }
  throw new ProtocolError(
    `the ${what} progress stream ended before its result (the connection broke, or the daemon stopped); ` +
      `look at ${what === "push" ? "the registry" : "the snapshots"} to see whether it happened`,
    status,
  );
}
