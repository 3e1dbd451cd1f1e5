/**
 * HTTP transports: `fetch` for TCP (`http://HOST:PORT`) and `node:http` over
 * a unix socket (`unix:///path/to.sock`).
 *
 * @module
 */
import * as http from "node:http";
import type { Socket } from "node:net";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { ConnectionError } from "./errors.js";

/** One HTTP request, relative to the daemon's base URL. */
export interface TransportRequest {
  method: "GET" | "POST" | "PUT" | "DELETE" | (string & {});
  /** Absolute path, e.g. `/v1/sandboxes`; already percent-encoded. */
  path: string;
  /** Query parameters; an array repeats its parameter (`?path=/a&path=/b`). */
  query?: Record<string, string | readonly string[] | undefined>;
  headers?: Record<string, string>;
  /**
   * The body: bytes, text, or a stream of bytes sent as it is produced
   * (e.g. a file read from disk; give its `content-length` in `headers`).
   */
  body?: Uint8Array | string | AsyncIterable<Uint8Array>;
  signal?: AbortSignal;
}

/** A body that is a stream rather than bytes or text. */
export function isStreamBody(body: TransportRequest["body"]): body is AsyncIterable<Uint8Array> {
  return body !== undefined && typeof body !== "string" && !(body instanceof Uint8Array);
}

/** A response whose body has not been read yet. */
export interface TransportResponse {
  status: number;
  /** A response header (case-insensitive), or null. */
  header(name: string): string | null;
  /** The body as it arrives. Read it once, either this way or with `bytes()`. */
  body(): AsyncIterable<Uint8Array>;
  bytes(): Promise<Uint8Array>;
  /** Stop reading and release the connection. */
  cancel(): void;
}

/** Sends requests to one daemon. */
export interface Transport {
  /** Where requests go, for messages: `unix:///…` or `http://…`. */
  readonly url: string;
  request(req: TransportRequest): Promise<TransportResponse>;
  /** Release pooled connections. */
  close(): void;
}

/** Options shared by the transports. */
export interface TransportOptions {
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string | undefined;
  /** Extra headers for every request. */
  headers?: Record<string, string> | undefined;
}

function buildPath(req: TransportRequest): string {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(req.query ?? {})) {
    if (typeof value === "string") params.append(key, value);
    else if (value !== undefined) for (const item of value) params.append(key, item);
  }
  const qs = params.toString();
  return qs ? `${req.path}?${qs}` : req.path;
}

function baseHeaders(opts: TransportOptions, req: TransportRequest): Record<string, string> {
  const headers: Record<string, string> = { accept: "application/json", ...opts.headers, ...req.headers };
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  return headers;
}

function unreachable(url: string, cause: unknown): ConnectionError {
  const detail = cause instanceof Error ? cause.message : String(cause);
  return new ConnectionError(
    `cannot reach the forkvm daemon at ${url} (${detail}); is \`forkvm serve\` running? ` +
      "Set FORKVM_URL (unix:///path/to.sock or http://HOST:PORT) to point at another daemon",
    { cause },
  );
}

function isAbort(err: unknown): boolean {
  return err instanceof Error && (err.name === "AbortError" || (err as NodeJS.ErrnoException).code === "ABORT_ERR");
}

async function collect(chunks: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const chunk of chunks) parts.push(chunk);
  return Buffer.concat(parts);
}

/** TCP transport on the global `fetch` (or one you pass). */
export class FetchTransport implements Transport {
  readonly url: string;
  readonly #fetch: typeof fetch;
  readonly #opts: TransportOptions;

  constructor(baseUrl: string, opts: TransportOptions & { fetch?: typeof fetch | undefined } = {}) {
    this.url = baseUrl.replace(/\/+$/, "");
    this.#fetch = opts.fetch ?? globalThis.fetch;
    this.#opts = opts;
  }

  async request(req: TransportRequest): Promise<TransportResponse> {
    let res: Response;
    try {
      const streaming = isStreamBody(req.body);
      const init: RequestInit & { duplex?: "half" } = {
        method: req.method,
        headers: baseHeaders(this.#opts, req),
        // Node's fetch takes an async iterable as a streamed body (with duplex "half").
        body: (req.body ?? null) as RequestInit["body"],
        signal: req.signal ?? null,
      };
      if (streaming) init.duplex = "half";
      res = await this.#fetch(this.url + buildPath(req), init);
    } catch (err) {
      if (isAbort(err)) throw err;
      throw unreachable(this.url, err instanceof Error && err.cause ? err.cause : err);
    }
    let used = false;
    const take = (): ReadableStream<Uint8Array> | null => {
      if (used) throw new Error("the response body was already read");
      used = true;
      return res.body;
    };
    return {
      status: res.status,
      header: (name) => res.headers.get(name),
      body: () => take() ?? emptyBody(),
      bytes: async () => {
        const stream = take();
        return stream ? collect(stream) : new Uint8Array();
      },
      cancel: () => {
        res.body?.cancel().catch(() => {});
      },
    };
  }

  close(): void {
    // fetch's connection pool belongs to the global dispatcher; nothing to do.
  }
}

async function* emptyBody(): AsyncIterable<Uint8Array> {}

/** How long a socket whose write failed waits, silent, for the rest of an answer. */
const ANSWER_GRACE_MS = 10_000;
/** A socket whose writes {@link keepReadingAfterWriteFailure} has wrapped. */
const WRAPPED = Symbol("forkvm.keepsReading");
/** The write failure such a socket kept reading after. */
const WRITE_FAILURE = Symbol("forkvm.writeFailure");

type WriteCallback = (err?: Error | null) => void;
type WrappedSocket = Socket & {
  [WRAPPED]?: true;
  [WRITE_FAILURE]?: Error;
  _write(chunk: unknown, encoding: BufferEncoding, cb: WriteCallback): void;
  _writev?(chunks: unknown[], cb: WriteCallback): void;
};

/** A write to the connection failed because the peer has closed it. */
function isBrokenPipe(err: unknown): err is NodeJS.ErrnoException {
  const e = err as NodeJS.ErrnoException | null | undefined;
  return e?.syscall === "write" && (e.code === "EPIPE" || e.code === "ECONNRESET");
}

/**
 * The daemon may answer before it has read a request's body (a 409 for an
 * import of an image that exists, a 413 for a body over the limit) and close
 * the connection. A write of the rest of the body then fails with EPIPE or
 * ECONNRESET, and node would error the socket at once, often before it has
 * read the answer waiting in it: the caller would be told the daemon is
 * unreachable. Instead, such a write is left pending (what follows waits
 * behind it, as behind a peer that reads nothing) and the socket goes on
 * reading: node:http reads the answer, then closes the socket at the peer's
 * end ("socket hang up" when no answer came). A socket that stays silent for
 * {@link ANSWER_GRACE_MS} after the failure is destroyed with it.
 */
function keepReadingAfterWriteFailure(socket: WrappedSocket): void {
  if (socket[WRAPPED]) return; // a pooled socket, wrapped for an earlier request
  socket[WRAPPED] = true;
  let timer: NodeJS.Timeout | undefined;
  const arm = (err: Error): void => {
    clearTimeout(timer);
    timer = setTimeout(() => socket.destroy(err), ANSWER_GRACE_MS).unref();
  };
  socket.once("close", () => clearTimeout(timer));
  const guard =
    (cb: WriteCallback): WriteCallback =>
    (err) => {
      if (!isBrokenPipe(err) || !socket.readable) return cb(err);
      if (!socket[WRITE_FAILURE]) {
        socket[WRITE_FAILURE] = err;
        socket.on("data", () => arm(err));
      }
      arm(err);
    };
  const write = socket._write.bind(socket);
  socket._write = (chunk, encoding, cb) => write(chunk, encoding, guard(cb));
  const writev = socket._writev?.bind(socket);
  if (writev) socket._writev = (chunks, cb) => writev(chunks, guard(cb));
}

/** Unix-socket transport on `node:http` with `socketPath`. */
export class UnixSocketTransport implements Transport {
  readonly url: string;
  readonly socketPath: string;
  readonly #agent = new http.Agent({ keepAlive: true });
  readonly #opts: TransportOptions;

  constructor(socketPath: string, opts: TransportOptions = {}) {
    this.socketPath = socketPath;
    this.url = `unix://${socketPath}`;
    this.#opts = opts;
  }

  request(req: TransportRequest): Promise<TransportResponse> {
    const headers = baseHeaders(this.#opts, req);
    const body = typeof req.body === "string" ? Buffer.from(req.body) : req.body;
    if (body instanceof Uint8Array) headers["content-length"] = String(body.byteLength);
    return new Promise((resolve, reject) => {
      const outgoing = http.request(
        {
          socketPath: this.socketPath,
          agent: this.#agent,
          method: req.method,
          path: buildPath(req),
          headers: { host: "localhost", ...headers },
          signal: req.signal,
        },
        (res) => {
          let used = false;
          const take = (): http.IncomingMessage => {
            if (used) throw new Error("the response body was already read");
            used = true;
            return res;
          };
          resolve({
            status: res.statusCode ?? 0,
            header: (name) => {
              const value = res.headers[name.toLowerCase()];
              return value === undefined ? null : Array.isArray(value) ? value.join(", ") : value;
            },
            body: take,
            bytes: () => collect(take()),
            cancel: () => res.destroy(),
          });
        },
      );
      // An answer sent before the body was read wins over the failure to
      // write the rest of the body (see keepReadingAfterWriteFailure).
      outgoing.on("socket", keepReadingAfterWriteFailure);
      // A failure of a streamed body's source (a file that cannot be read) is
      // the caller's, not a connection problem: remember it to say so.
      let sourceError: unknown;
      outgoing.on("error", (err) => {
        if (sourceError !== undefined || isAbort(err)) return reject(sourceError ?? err);
        // No answer came: say why the body could not be sent, rather than "socket hang up".
        reject(unreachable(this.url, (outgoing.socket as WrappedSocket | null)?.[WRITE_FAILURE] ?? err));
      });
      if (isStreamBody(body)) {
        const source = async function* (): AsyncGenerator<Uint8Array> {
          try {
            yield* body;
          } catch (err) {
            sourceError = err;
            throw err;
          }
        };
        // Sent as it is read, with backpressure. A failure destroys the
        // request, which rejects above; one after the response arrived (the
        // daemon answered early, e.g. 409, and closed) changes nothing, and
        // the source is left unread.
        pipeline(Readable.from(source()), outgoing).catch(() => {});
      } else {
        outgoing.end(body);
      }
    });
  }

  close(): void {
    this.#agent.destroy();
  }
}

/** Where a daemon is, from a URL (`unix:///p.sock`, `/p.sock`, `http://host:port`). */
export type Endpoint = { kind: "unix"; socketPath: string } | { kind: "http"; baseUrl: string };

/**
 * Parse a daemon URL, as the CLI does: `unix:///path/to.sock`, a bare socket
 * path, or `http(s)://HOST:PORT`.
 */
export function parseEndpoint(url: string): Endpoint {
  if (url.startsWith("unix:")) {
    const rest = url.slice("unix:".length);
    const socketPath = rest.startsWith("//") ? rest.slice(2) : rest;
    if (!socketPath.startsWith("/")) {
      throw new TypeError(`bad forkvm URL ${JSON.stringify(url)}: use unix:///absolute/path.sock`);
    }
    return { kind: "unix", socketPath };
  }
  if (url.startsWith("/")) return { kind: "unix", socketPath: url };
  if (/^https?:\/\//.test(url)) return { kind: "http", baseUrl: url };
  throw new TypeError(
    `bad forkvm URL ${JSON.stringify(url)}: use unix:///path/to.sock, a socket path, or http://HOST:PORT`,
  );
}
