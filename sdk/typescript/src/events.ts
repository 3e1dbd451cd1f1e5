/**
 * The daemon's event stream, `GET /v1/events` (docs/events.md): its wire
 * types (schemas of docs/openapi.json, re-exported by `types.ts` so that they
 * are part of `api`), and {@link EventStream}, which reads it as typed events.
 *
 * ```ts
 * await using events = await client.events();
 * const { sandboxes } = await client.listSandboxes(); // after `ready`: nothing falls in between
 * for await (const event of events) {
 *   if (event.kind === "reset") ... // events were lost: list again
 *   else if (event.kind === "sandbox.deleted") ...
 *   else if (event.sandbox) ...
 * }
 * ```
 *
 * @module
 */
import { ProtocolError } from "./errors.js";
import { sseMessages, type SseMessage } from "./sse.js";
import type { TransportResponse } from "./transport.js";
import type { Image, Sandbox, Snapshot } from "./types.js";

/**
 * The kinds of {@link Event} (its `kind`, the SSE `event:` field). `reset` is
 * not a change: the stream lost events (a reconnect after more than the
 * daemon keeps, or a reader too slow); re-read the lists.
 */
export type EventKind =
  | "sandbox.created"
  | "sandbox.updated"
  | "sandbox.deleted"
  | "snapshot.created"
  | "snapshot.updated"
  | "snapshot.deleted"
  | "branch"
  | "pool"
  | "image.created"
  | "image.deleted"
  | "reset";

/** One change, as `GET /v1/events` sends it; the object that changed comes whole, as `GET` of it returns it. */
export interface Event {
  /** One more than the event before (from 1 at daemon start). */
  seq: number;
  /** When the daemon saw the change (Unix time, ms). */
  at_unix_ms: number;
  /** One of {@link EventKind}, or a kind newer than this SDK. */
  kind: EventKind | (string & {});
  /** The sandbox or snapshot id, or the image name; for `branch`, the source sandbox; for `pool`, the snapshot. */
  id: string;
  /** The sandbox now (absent on `sandbox.deleted`). */
  sandbox?: Sandbox | null;
  /** The snapshot now (absent on `snapshot.deleted`). */
  snapshot?: Snapshot | null;
  /** The image now (absent on `image.deleted`). */
  image?: Image | null;
  branch?: BranchEvent | null;
  pool?: PoolEvent | null;
}

/** A completed branch (`kind: "branch"`): its source, branch point and children. */
export interface BranchEvent {
  source: string;
  /** The branch point's snapshot id. */
  snapshot: string;
  /** `live`, `diff` or `full`. */
  mode: string;
  children: string[];
  /** How long the source was paused. */
  pause_ms: number;
  /** From the request until every child ran. */
  total_ms: number;
}

/** A warm pool's size or fill changed (`kind: "pool"`). */
export interface PoolEvent {
  snapshot: string;
  /** QEMUs the pool keeps waiting. */
  size: number;
  /** QEMUs waiting now. */
  ready: number;
}

/** The data of the stream's first message, `ready`: the seq of the last event before the stream opened. */
export interface EventsReady {
  seq: number;
}

/** `GET /v1/events` options. */
export interface EventsOptions {
  /**
   * Resume after this event's `seq`: the daemon first sends the later events
   * it kept (the last 1,024), or a `reset` when some are gone.
   */
  lastEventId?: number | undefined;
  /** Abort the request; once the stream is open, a loop over it then throws the `AbortError` (`close()` ends it quietly). */
  signal?: AbortSignal | undefined;
}

function bad(message: string, cause?: unknown): ProtocolError {
  return new ProtocolError(message, 200, cause === undefined ? undefined : { cause });
}

/**
 * The model of one message of the stream: {@link EventsReady} for `ready`,
 * an {@link Event} for every change, and for `reset` an Event whose `kind` is
 * `reset`, `seq` what the daemon gave (0 when the reader fell behind),
 * `at_unix_ms` the client's clock and `id` empty.
 */
export function parseEvent(message: SseMessage): EventsReady | Event {
  let data: unknown;
  try {
    data = JSON.parse(message.data);
  } catch (cause) {
    throw bad(`bad data in the event stream (${message.event}): ${message.data.slice(0, 200)}`, cause);
  }
  const obj = data as Record<string, unknown> | null;
  const isObject = typeof obj === "object" && obj !== null && !Array.isArray(obj);
  if (message.event === "ready" || message.event === "reset") {
    if (!isObject || typeof obj.seq !== "number") {
      throw bad(`bad ${message.event} message in the event stream: ${message.data.slice(0, 200)}`);
    }
    if (message.event === "ready") return { seq: obj.seq };
    return { seq: obj.seq, at_unix_ms: Date.now(), kind: "reset", id: "" };
  }
  if (!isObject || typeof obj.seq !== "number" || typeof obj.kind !== "string" || typeof obj.id !== "string") {
    throw bad(`bad ${message.event} message in the event stream: ${message.data.slice(0, 200)}`);
  }
  return obj as unknown as Event;
}

/**
 * The daemon's changes, one {@link Event} at a time, in the order it saw
 * them. {@link Client.events} resolves with it open: the `ready` message has
 * come and {@link readySeq} is the seq of the last event before it. List what
 * you need after that, then apply the events (each carries its object whole,
 * so one the list already shows does no harm).
 *
 * A `reset` comes in line, as an Event of kind `reset`, because what follows
 * it is still good: only what was before it is in doubt. The loop ends when
 * the daemon closes the stream (it stops), when you leave it, or on
 * `close()`; a new stream opened with `lastEventId: stream.lastSeq` gets the
 * events missed meanwhile (or a `reset` when the daemon no longer has them).
 */
export class EventStream implements AsyncIterable<Event>, AsyncDisposable {
  /** The seq of the last event before the stream opened (its `ready` message). */
  readonly readySeq: number;
  /** The seq to resume after: that of the last event read, else the one the stream was opened after. */
  lastSeq: number;
  readonly #messages: AsyncGenerator<SseMessage, void>;
  readonly #res: TransportResponse;
  readonly #abort: AbortController;
  #iterated = false;

  private constructor(
    res: TransportResponse,
    messages: AsyncGenerator<SseMessage, void>,
    abort: AbortController,
    readySeq: number,
    lastSeq: number,
  ) {
    this.#res = res;
    this.#messages = messages;
    this.#abort = abort;
    this.readySeq = readySeq;
    this.lastSeq = lastSeq;
  }

  /**
   * Send the request (`send` makes it with the signal it is given) and wait
   * for the `ready` message. Used by {@link Client.events}.
   */
  static async open(send: (signal: AbortSignal) => Promise<TransportResponse>, opts?: EventsOptions): Promise<EventStream> {
    const abort = new AbortController();
    const signal = opts?.signal ? AbortSignal.any([opts.signal, abort.signal]) : abort.signal;
    const res = await send(signal);
    const messages = sseMessages(res.body());
    try {
      const type = res.header("content-type") ?? "";
      if (!type.startsWith("text/event-stream")) throw bad(`GET /v1/events answered ${type || "no content type"}, not text/event-stream`);
      const first = await messages.next();
      if (first.done) throw bad("the event stream ended before its ready message");
      const ready = parseEvent(first.value);
      if (first.value.event !== "ready") throw bad(`the event stream began with ${first.value.event}, not ready`);
      return new EventStream(res, messages, abort, ready.seq, opts?.lastEventId ?? ready.seq);
    } catch (err) {
      abort.abort();
      res.cancel();
      await messages.return().catch(() => {});
      throw err;
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Event, void> {
    if (this.#iterated) throw new Error("an EventStream can be read only once");
    this.#iterated = true;
    try {
      for await (const message of this.#messages) {
        const event = parseEvent(message);
        if (!("kind" in event)) continue; // a ready is only ever first, where open() took it
        if (event.kind !== "reset") this.lastSeq = event.seq;
        yield event;
      }
    } catch (err) {
      if (!this.#abort.signal.aborted) throw err; // else closed: the read was cut on purpose
    } finally {
      await this.close();
    }
  }

  /** Close the connection (the daemon forgets this reader); a loop over the stream ends. */
  async close(): Promise<void> {
    this.#abort.abort();
    this.#res.cancel();
    await this.#messages.return().catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
