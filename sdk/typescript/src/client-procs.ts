/**
 * The Client's operations on background processes and files
 * (docs/processes.md), one method per `operationId` in camelCase. {@link Client}
 * inherits them from {@link ProcessOps}, which sends through the Client's transport.
 *
 * @module
 */
import { constants } from "node:os";
import { ForkvmError, ProtocolError } from "./errors.js";
import type { TransportRequest, TransportResponse } from "./transport.js";
import type {
  ArchiveWritten,
  DirMade,
  EntryInfo,
  EntryList,
  Exists,
  FsEvent,
  ProcessEvent,
  ProcessList,
  ProcessStarted,
  PtySize,
  StartProcess,
  WatchEvent,
  Watcher,
  WatcherEvents,
} from "./types.js";
import { errorFromDetail, jsonBody, ndjsonLines, parseJson } from "./wire.js";

/** Options of every request (as in `client.ts`). */
interface RequestOptions {
  signal?: AbortSignal | undefined;
}

/** A process: its pid, or the tag it was started with. */
export type ProcessRef = number | string;

/** A signal: its number (`15`), or its name (`"TERM"`, `"SIGTERM"`, any case). */
export type SignalSpec = number | string;

/** The request of a background process (`stream` is set by {@link ProcessOps.startProcessStream}). */
export type StartProcessParams = Omit<StartProcess, "stream">;

/** An event of a process stream other than `keepalive` and `error` (errors are thrown). */
export type ProcessStreamFrame = Exclude<ProcessEvent, { type: "keepalive" } | { type: "error" }>;

/** A watch-stream line other than `keepalive` and `error` (errors are thrown). */
export type WatchStreamFrame = Exclude<WatchEvent, { type: "keepalive" } | { type: "error" }>;

/** The number of a {@link SignalSpec}: `"INT"` → 2. */
export function signalNumber(signal: SignalSpec): number {
  if (typeof signal === "number") return signal;
  const name = signal.trim().toUpperCase();
  if (/^\d+$/.test(name)) return Number(name);
  const number = (constants.signals as Record<string, number | undefined>)[name.startsWith("SIG") ? name : `SIG${name}`];
  if (number === undefined) throw new TypeError(`unknown signal ${JSON.stringify(signal)}: give a number or a name such as "TERM"`);
  return number;
}

const seg = (value: string | number): string => encodeURIComponent(String(value));
const octets = (data: Uint8Array | string): Uint8Array => (typeof data === "string" ? Buffer.from(data) : data);

/** Background processes and filesystem operations; the base class of {@link Client}. */
export abstract class ProcessOps {
  /** Send a request; a 4xx/5xx becomes a {@link ForkvmError}. */
  protected abstract send(req: TransportRequest): Promise<TransportResponse>;

  async #json<T>(req: TransportRequest): Promise<T> {
    return parseJson<T>(await this.send(req));
  }

  async #empty(req: TransportRequest): Promise<void> {
    await (await this.send(req)).bytes();
  }

  #proc(id: string, process: ProcessRef, rest = ""): string {
    return `/v1/sandboxes/${seg(id)}/processes/${seg(process)}${rest}`;
  }

  /** An NDJSON stream's parsed lines, keepalives skipped and an `error` line thrown. */
  async *#ndjson<T extends { type: string }>(req: TransportRequest, what: string): AsyncGenerator<T, void> {
    const res = await this.send({ ...req, headers: { ...req.headers, accept: "application/x-ndjson" } });
    let finished = false;
    try {
      for await (const line of ndjsonLines(res.body())) {
        let event: T;
        try {
          event = JSON.parse(line) as T;
        } catch (cause) {
          throw new ProtocolError(`bad line in the ${what} stream: ${line.slice(0, 200)}`, res.status, { cause });
        }
        if (event.type === "keepalive") continue;
        if (event.type === "error") {
          const detail = (event as unknown as { error: { code: string; message: string } }).error;
          throw errorFromDetail(detail, ForkvmError.statusOf(detail.code) ?? 502);
        }
        yield event;
        if (event.type === "end") {
          finished = true;
          return;
        }
      }
      finished = true;
    } finally {
      if (!finished) res.cancel();
    }
  }

  // ---- processes ------------------------------------------------------

  /**
   * `POST /v1/sandboxes/{id}/processes` (operation `start_process`): start a
   * background process; resolves with its pid (and tag) at once. It outlives
   * the request and the client.
   */
  startProcess(id: string, req: StartProcessParams, opts?: RequestOptions): Promise<ProcessStarted> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/processes`, ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes/{id}/processes` with `"stream": true` (operation
   * `start_process`): start it and yield its events (base64 output) until it
   * ends. Breaking out of the loop leaves the process running.
   */
  startProcessStream(id: string, req: StartProcessParams, opts?: RequestOptions): AsyncGenerator<ProcessStreamFrame, void> {
    return this.#ndjson(
      { method: "POST", path: `/v1/sandboxes/${seg(id)}/processes`, ...jsonBody({ ...req, stream: true }), signal: opts?.signal },
      "process",
    );
  }

  /** `GET /v1/sandboxes/{id}/processes` (operation `list_processes`): the running background processes. */
  listProcesses(id: string, opts?: RequestOptions): Promise<ProcessList> {
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/processes`, signal: opts?.signal });
  }

  /**
   * `GET /v1/sandboxes/{id}/processes/{process}/output` (operation
   * `attach_process`): the output the sandbox kept (its last 1 MiB), then
   * live events until the process ends. The request is sent on the first
   * `next()`; breaking out of the loop leaves the process running.
   */
  attachProcess(id: string, process: ProcessRef, opts?: RequestOptions): AsyncGenerator<ProcessStreamFrame, void> {
    return this.#ndjson({ method: "GET", path: this.#proc(id, process, "/output"), signal: opts?.signal }, "process");
  }

  /**
   * `POST /v1/sandboxes/{id}/processes/{process}/stdin` (operation
   * `write_stdin`): queue bytes (text as UTF-8) for its stdin pipe, or type
   * them into its PTY.
   */
  async writeStdin(id: string, process: ProcessRef, data: Uint8Array | string, opts?: RequestOptions): Promise<void> {
    await this.#empty({
      method: "POST",
      path: this.#proc(id, process, "/stdin"),
      headers: { "content-type": "application/octet-stream" },
      body: octets(data),
      signal: opts?.signal,
    });
  }

  /**
   * `DELETE /v1/sandboxes/{id}/processes/{process}/stdin` (operation
   * `close_stdin`): close its stdin once what was queued is written. A PTY
   * has none: write `"\x04"` instead.
   */
  async closeStdin(id: string, process: ProcessRef, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: this.#proc(id, process, "/stdin"), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes/{id}/processes/{process}/signal` (operation
   * `signal_process`): send a signal (`15`, `"TERM"`, `"SIGINT"`…) to its whole group.
   */
  async signalProcess(id: string, process: ProcessRef, signal: SignalSpec, opts?: RequestOptions): Promise<void> {
    await this.#empty({
      method: "POST",
      path: this.#proc(id, process, "/signal"),
      ...jsonBody({ signal: signalNumber(signal) }),
      signal: opts?.signal,
    });
  }

  /** `DELETE /v1/sandboxes/{id}/processes/{process}` (operation `kill_process`): SIGKILL its group. */
  async killProcess(id: string, process: ProcessRef, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: this.#proc(id, process), signal: opts?.signal });
  }

  /** `PUT /v1/sandboxes/{id}/processes/{process}/pty` (operation `resize_pty`): resize its terminal (SIGWINCH). */
  async resizePty(id: string, process: ProcessRef, size: PtySize, opts?: RequestOptions): Promise<void> {
    await this.#empty({
      method: "PUT",
      path: this.#proc(id, process, "/pty"),
      ...jsonBody({ cols: size.cols, rows: size.rows }),
      signal: opts?.signal,
    });
  }

  // ---- files ----------------------------------------------------------

  /** `GET /v1/sandboxes/{id}/fs/stat?path=` (operation `stat_file`): the entry, as `lstat` sees it. */
  statFile(id: string, path: string, opts?: RequestOptions): Promise<EntryInfo> {
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/fs/stat`, query: { path }, signal: opts?.signal });
  }

  /** `GET /v1/sandboxes/{id}/fs/exists?path=` (operation `file_exists`); a dangling symlink exists. */
  async fileExists(id: string, path: string, opts?: RequestOptions): Promise<boolean> {
    const answer = await this.#json<Exists>({
      method: "GET",
      path: `/v1/sandboxes/${seg(id)}/fs/exists`,
      query: { path },
      signal: opts?.signal,
    });
    return answer.exists;
  }

  /**
   * `GET /v1/sandboxes/{id}/fs/list?path=&depth=` (operation `list_dir`): the
   * entries under a directory, `depth` levels down (1–64, default 1).
   */
  listDir(id: string, path: string, opts?: RequestOptions & { depth?: number | undefined }): Promise<EntryList> {
    const depth = opts?.depth === undefined ? undefined : String(opts.depth);
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/fs/list`, query: { path, depth }, signal: opts?.signal });
  }

  /** `POST /v1/sandboxes/{id}/fs/mkdir` (operation `make_dir`): `mkdir -p`; `existed` says it was there. */
  makeDir(id: string, path: string, opts?: RequestOptions): Promise<DirMade> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/fs/mkdir`, ...jsonBody({ path }), signal: opts?.signal });
  }

  /** `POST /v1/sandboxes/{id}/fs/move` (operation `move_file`): rename; resolves with the moved entry. */
  moveFile(id: string, source: string, destination: string, opts?: RequestOptions): Promise<EntryInfo> {
    return this.#json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/fs/move`,
      ...jsonBody({ source, destination }),
      signal: opts?.signal,
    });
  }

  /**
   * `DELETE /v1/sandboxes/{id}/files?path=` (operation `remove_file`): remove a
   * file, a symlink or a directory with all it holds (`/` is refused).
   */
  async removeFile(id: string, path: string, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: `/v1/sandboxes/${seg(id)}/files`, query: { path }, signal: opts?.signal });
  }

  /**
   * `GET /v1/sandboxes/{id}/fs/watch?path=&recursive=` (operation `watch_dir`):
   * `start` once the watch is in place, then batches of changes, until the
   * loop is left (or `opts.signal` aborts).
   */
  watchDir(
    id: string,
    path: string,
    opts?: RequestOptions & { recursive?: boolean | undefined },
  ): AsyncGenerator<WatchStreamFrame, void> {
    return this.#ndjson(
      {
        method: "GET",
        path: `/v1/sandboxes/${seg(id)}/fs/watch`,
        query: { path, recursive: opts?.recursive ? "true" : "false" },
        signal: opts?.signal,
      },
      "watch",
    );
  }

  /** `POST /v1/sandboxes/{id}/fs/watchers` (operation `create_watcher`): a watcher to poll. */
  createWatcher(id: string, path: string, opts?: RequestOptions & { recursive?: boolean | undefined }): Promise<Watcher> {
    const body = opts?.recursive === undefined ? { path } : { path, recursive: opts.recursive };
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/fs/watchers`, ...jsonBody(body), signal: opts?.signal });
  }

  /** `GET /v1/sandboxes/{id}/fs/watchers/{watcher}` (operation `poll_watcher`): the changes since the last poll. */
  pollWatcher(id: string, watcher: string, opts?: RequestOptions): Promise<WatcherEvents> {
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/fs/watchers/${seg(watcher)}`, signal: opts?.signal });
  }

  /** `DELETE /v1/sandboxes/{id}/fs/watchers/{watcher}` (operation `remove_watcher`). */
  async removeWatcher(id: string, watcher: string, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: `/v1/sandboxes/${seg(id)}/fs/watchers/${seg(watcher)}`, signal: opts?.signal });
  }

  /**
   * `GET /v1/sandboxes/{id}/archive?path=…` (operation `download_archive`): a
   * tar of these paths (directories with all they hold), each entry named by
   * its absolute path without the leading `/`.
   */
  async downloadArchive(id: string, paths: string | readonly string[], opts?: RequestOptions): Promise<Uint8Array> {
    const list = typeof paths === "string" ? [paths] : [...paths];
    if (list.length === 0) throw new TypeError("downloadArchive needs at least one path");
    const res = await this.send({
      method: "GET",
      path: `/v1/sandboxes/${seg(id)}/archive`,
      query: { path: list },
      headers: { accept: "application/x-tar" },
      signal: opts?.signal,
    });
    return res.bytes();
  }

  /**
   * `PUT /v1/sandboxes/{id}/archive?path=` (operation `upload_archive`):
   * unpack a tar under the directory `path` (created if missing).
   */
  uploadArchive(id: string, path: string, tar: Uint8Array, opts?: RequestOptions): Promise<ArchiveWritten> {
    return this.#json({
      method: "PUT",
      path: `/v1/sandboxes/${seg(id)}/archive`,
      query: { path },
      headers: { "content-type": "application/octet-stream" },
      body: tar,
      signal: opts?.signal,
    });
  }
}

/** The changes of a watch line (none for `start`). */
export function changesOf(frame: WatchStreamFrame): FsEvent[] {
  return frame.type === "events" ? frame.events : [];
}
