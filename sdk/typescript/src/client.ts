/**
 * The low-level client: one method per operation of the REST API
 * (`operationId` in docs/openapi.json, in camelCase), with the wire types.
 *
 * @module
 */
import { TimeTravelOps } from "./client-timetravel.js";
import { ForkvmError, ProtocolError, StreamingUnsupportedError } from "./errors.js";
import { EventStream, type EventsOptions } from "./events.js";
import {
  buildQuery,
  discard,
  fileChunks,
  importQuery,
  prepareBuild,
  prepareImport,
  queryParams,
  readImageEvents,
  type BuildImageParams,
  type ImageEventCallback,
  type ImportImageParams,
  type Upload,
} from "./images.js";
import {
  FetchTransport,
  parseEndpoint,
  UnixSocketTransport,
  type Transport,
  type TransportRequest,
  type TransportResponse,
} from "./transport.js";
import {
  readTransferEvents,
  type PullResult,
  type PullSnapshot,
  type PushResult,
  type PushSnapshot,
  type TransferEventCallback,
} from "./transfer.js";
import { volumeMounts, type VolumeSpec } from "./volumes.js";
import { errorFrom, errorFromDetail, jsonBody, ndjsonLines, parseJson } from "./wire.js";
import type {
  BranchRequest,
  BranchResult,
  CreateSandbox,
  CreateSnapshot,
  ExecRequest,
  ExecResult,
  ExecEvent,
  FileWritten,
  FlattenRequest,
  Health,
  Image,
  ImageList,
  Info,
  PortForward,
  PruneRequest,
  PruneResult,
  PullImage,
  PauseRequest,
  ResumeRequest,
  Sandbox,
  SandboxBatch,
  SandboxList,
  NetworkInfo,
  SetNetwork,
  SetTimeout,
  Snapshot,
  SnapshotList,
  Volume,
  VolumeList,
} from "./types.js";

/** The data directory when `FORKVM_HOME` is not set. */
export const DEFAULT_HOME = "/var/lib/forkvm";

/** How to reach the daemon. Every field falls back on the environment. */
export interface ClientOptions {
  /**
   * `unix:///path/to.sock`, a bare socket path, or `http://HOST:PORT`.
   * Default: `$FORKVM_URL`, else `$FORKVM_HOME/forkvm.sock`.
   */
  url?: string | undefined;
  /** Bearer token for TCP. Default: `$FORKVM_TOKEN`. */
  token?: string | undefined;
  /** Data directory whose `forkvm.sock` to use when no URL is given. Default: `$FORKVM_HOME`, else /var/lib/forkvm. */
  home?: string | undefined;
  /** Extra headers for every request. */
  headers?: Record<string, string> | undefined;
  /** A `fetch` to use for TCP instead of the global one (e.g. with an undici dispatcher). */
  fetch?: typeof fetch | undefined;
  /** Use this transport instead of building one from `url`. */
  transport?: Transport | undefined;
}

/** Options of every request. */
export interface RequestOptions {
  /** Abort the request (the promise rejects with an `AbortError`). */
  signal?: AbortSignal | undefined;
}

/** `GET /v1/sandboxes` options. */
export interface ListSandboxesOptions extends RequestOptions {
  /** Only the sandboxes with every one of these metadata pairs (`?metadata.KEY=VALUE`). */
  metadata?: Record<string, string> | undefined;
}

/** `PUT /v1/sandboxes/{id}/files` options. */
export interface WriteFileOptions extends RequestOptions {
  /** File mode: a number (`0o755`) or an octal string (`"755"`). Default 644. */
  mode?: number | string | undefined;
}

/** `DELETE /v1/snapshots/{id}` options. */
export interface DeleteSnapshotOptions extends RequestOptions {
  /** Also remove the sandboxes and snapshots that depend on it. */
  force?: boolean | undefined;
}

/** Options of the image operations that report progress (pull, import, build). */
export interface ImageOptions extends RequestOptions {
  /** Called with each event of the progress stream, the last `done` or `error` included. */
  onEvent?: ImageEventCallback | undefined;
}

/** Options of snapshot push and pull. */
export interface TransferOptions extends RequestOptions {
  /** Called with each event of the progress stream, the last `pushed`, `pulled` or `error` included. */
  onEvent?: TransferEventCallback | undefined;
}

/** `POST /v1/snapshots/{id}/push`: where to push (`stream` is set by {@link Client.pushSnapshot}). */
export type PushSnapshotParams = Omit<PushSnapshot, "stream">;

/** `POST /v1/snapshots/pull`: what to pull (`stream` is set by {@link Client.pullSnapshot}). */
export type PullSnapshotParams = Omit<PullSnapshot, "stream">;

/** `POST /v1/sandboxes`: the wire fields, with `volumes` also as `"SOURCE:GUEST_PATH[:OPTIONS]"` strings. */
export type CreateSandboxParams = Omit<CreateSandbox, "volumes"> & { volumes?: VolumeSpec[] | null | undefined };

/** `POST /v1/images`: what to pull (`stream` is set by {@link Client.pullImage}). */
export type PullImageParams = Omit<PullImage, "stream">;

/** A streamed-exec event other than `error` (errors are thrown). */
export type ExecStreamFrame = Exclude<ExecEvent, { type: "error" }>;

/** The request of a (non-streaming) exec. */
export type ExecParams = Omit<ExecRequest, "stream">;

/** The request of a streamed exec (output is neither buffered nor re-encoded). */
export type ExecStreamParams = Omit<ExecRequest, "stream" | "max_output_bytes" | "encoding">;

const seg = (value: string): string => encodeURIComponent(value);

/**
 * Low-level forkvm client. The operations on background processes and files
 * (`startProcess`, `attachProcess`, `statFile`, `watchDir`,
 * `downloadArchive`…) are inherited from {@link ProcessOps}.
 */
export class Client extends TimeTravelOps {
  readonly transport: Transport;

  constructor(options: ClientOptions = {}) {
    super();
    this.transport = options.transport ?? Client.#transportFor(options);
  }

  static #transportFor(options: ClientOptions): Transport {
    const env = process.env;
    const url =
      options.url ?? (env.FORKVM_URL || `unix://${options.home ?? (env.FORKVM_HOME || DEFAULT_HOME)}/forkvm.sock`);
    const token = options.token ?? (env.FORKVM_TOKEN || undefined);
    const endpoint = parseEndpoint(url);
    return endpoint.kind === "unix"
      ? new UnixSocketTransport(endpoint.socketPath, { token, headers: options.headers })
      : new FetchTransport(endpoint.baseUrl, { token, headers: options.headers, fetch: options.fetch });
  }

  /** The daemon's URL (`unix:///…` or `http://…`). */
  get url(): string {
    return this.transport.url;
  }

  /** Release pooled connections (the client must not be used afterwards). */
  close(): void {
    this.transport.close();
  }

  // ---- daemon ---------------------------------------------------------

  /** `GET /v1/health` (operation `health`). */
  health(opts?: RequestOptions): Promise<Health> {
    return this.#json({ method: "GET", path: "/v1/health", signal: opts?.signal });
  }

  /** `GET /v1/info` (operation `info`): version, accelerator, QEMU, limits, pools, networking, capacity. */
  info(opts?: RequestOptions): Promise<Info> {
    return this.#json({ method: "GET", path: "/v1/info", signal: opts?.signal });
  }

  /**
   * `GET /metrics` (operation `metrics`): the daemon's Prometheus metrics, in
   * the text exposition format (`forkvm_spawns_total`, …; docs/lifetimes.md lists them).
   */
  async metrics(opts?: RequestOptions): Promise<string> {
    const res = await this.#send({ method: "GET", path: "/metrics", headers: { accept: "text/plain" }, signal: opts?.signal });
    return new TextDecoder().decode(await res.bytes());
  }

  /**
   * `GET /v1/events` (operation `events`): the daemon's changes as they
   * happen (docs/events.md). Resolves once the stream's `ready` message came,
   * with the stream open (`readySeq` set); iterate it for {@link Event}s and
   * close it when done (or `await using`). `lastEventId` (an event's `seq`)
   * resumes after that event: the daemon first sends the later ones it kept,
   * or an Event of kind `reset` when some are gone.
   */
  async events(opts?: EventsOptions): Promise<EventStream> {
    const headers: Record<string, string> = { accept: "text/event-stream" };
    const last = opts?.lastEventId;
    if (last !== undefined) {
      if (!Number.isSafeInteger(last) || last < 0) {
        throw new TypeError(`lastEventId is an event's seq (an integer >= 0), not ${String(last)}`);
      }
      headers["last-event-id"] = String(last);
    }
    return EventStream.open((signal) => this.#send({ method: "GET", path: "/v1/events", headers, signal }), opts);
  }

  // ---- sandboxes ------------------------------------------------------

  /**
   * `GET /v1/sandboxes` (operation `list_sandboxes`): every sandbox, in any
   * state; with `metadata`, only those that have every given pair.
   */
  listSandboxes(opts?: ListSandboxesOptions): Promise<SandboxList> {
    return this.#json({ method: "GET", path: "/v1/sandboxes", query: metadataQuery(opts?.metadata), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes` (operation `create_sandbox`). Resolves once every
   * guest agent answers (and, unless `wait_for_network: false`, its network
   * works): with one sandbox, or a batch when `count` is given. `volumes`
   * may also be given as `"SOURCE:GUEST_PATH[:OPTIONS]"` strings (see `parseVolume`).
   */
  createSandbox(req: CreateSandboxParams & { count: number }, opts?: RequestOptions): Promise<SandboxBatch>;
  createSandbox(req?: CreateSandboxParams & { count?: null | undefined }, opts?: RequestOptions): Promise<Sandbox>;
  createSandbox(req?: CreateSandboxParams, opts?: RequestOptions): Promise<Sandbox | SandboxBatch>;
  async createSandbox(req: CreateSandboxParams = {}, opts?: RequestOptions): Promise<Sandbox | SandboxBatch> {
    const body: CreateSandbox = req.volumes ? { ...req, volumes: volumeMounts(req.volumes) } : (req as CreateSandbox);
    return this.#json({ method: "POST", path: "/v1/sandboxes", ...jsonBody(body), signal: opts?.signal });
  }

  /** `GET /v1/sandboxes/{id}` (operation `get_sandbox`), with the memory use of its QEMU. */
  getSandbox(id: string, opts?: RequestOptions): Promise<Sandbox> {
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}`, signal: opts?.signal });
  }

  /** `DELETE /v1/sandboxes/{id}` (operation `delete_sandbox`). */
  async deleteSandbox(id: string, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: `/v1/sandboxes/${seg(id)}`, signal: opts?.signal });
  }

  /**
   * `PUT /v1/sandboxes/{id}/timeout` (operation `set_timeout`): a new timeout
   * in seconds, counted from now (`timeout: null` removes it); `on_timeout`
   * also changes what happens when it runs out. On a paused sandbox it is
   * the time the sandbox will have once resumed.
   */
  setTimeout(id: string, req: SetTimeout, opts?: RequestOptions): Promise<Sandbox> {
    // `timeout: null` clears the timeout: send it rather than leave it out.
    const body = { ...req, timeout: req.timeout ?? null };
    return this.#json({ method: "PUT", path: `/v1/sandboxes/${seg(id)}/timeout`, ...jsonBody(body), signal: opts?.signal });
  }

  /**
   * `PUT /v1/sandboxes/{id}/network` (operation `set_network`): replace a
   * running sandbox's egress allow-list in place (`egress` omitted or `null`:
   * any egress). New connections follow it at once; established ones are
   * kept. Resolves with the sandbox's network.
   */
  setNetwork(id: string, req: SetNetwork, opts?: RequestOptions): Promise<NetworkInfo> {
    return this.#json({ method: "PUT", path: `/v1/sandboxes/${seg(id)}/network`, ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes/{id}/pause` (operation `pause`): save a running
   * sandbox to disk and free its RAM and QEMU. Resolves with it `paused`.
   * `{ memory: false }` keeps only the disk (the resume cold-boots).
   */
  pause(id: string, req: PauseRequest = {}, opts?: RequestOptions): Promise<Sandbox> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/pause`, ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes/{id}/resume` (operation `resume`): bring a paused
   * sandbox back, `running`, with the same id, memory, disk and network.
   * Without `timeout` it gets the time it had left.
   */
  resume(id: string, req: ResumeRequest = {}, opts?: RequestOptions): Promise<Sandbox> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/resume`, ...jsonBody(req), signal: opts?.signal });
  }

  /** `POST /v1/sandboxes/{id}/branch` (operation `branch_sandbox`). */
  branchSandbox(id: string, req: BranchRequest = {}, opts?: RequestOptions): Promise<BranchResult> {
    return this.#json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/branch`,
      ...jsonBody(req),
      signal: opts?.signal,
    });
  }

  /** `POST /v1/sandboxes/{id}/exec` (operation `exec`): run a command and wait for it. */
  exec(id: string, req: ExecParams, opts?: RequestOptions): Promise<ExecResult> {
    return this.#json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/exec`,
      ...jsonBody(req),
      signal: opts?.signal,
    });
  }

  /**
   * `POST /v1/sandboxes/{id}/exec` with `"stream": true` (operation `exec`):
   * the command's output as it is written (base64 chunks), then its exit.
   * An `error` line is thrown as a {@link ForkvmError}. Breaking out of the
   * loop closes the connection; the command itself runs on (bound it with
   * `timeout_ms`).
   */
  async *execStream(id: string, req: ExecStreamParams, opts?: RequestOptions): AsyncGenerator<ExecStreamFrame, void> {
    const res = await this.#send({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/exec`,
      ...jsonBody({ ...req, stream: true }),
      headers: { "content-type": "application/json", accept: "application/x-ndjson" },
      signal: opts?.signal,
    }).catch((err: unknown) => {
      throw streamingRefusal(err) ?? err;
    });
    let finished = false;
    try {
      if (!(res.header("content-type") ?? "").includes("ndjson")) {
        // A daemon that answered with a whole ExecResult: replay it as events.
        yield* framesOf(await parseJson<ExecResult>(res));
        finished = true;
        return;
      }
      for await (const line of ndjsonLines(res.body())) {
        const event = parseLine(line, res.status);
        if (event.type === "error") {
          throw errorFromDetail(event.error, ForkvmError.statusOf(event.error.code) ?? res.status);
        }
        yield event;
        if (event.type === "exit") {
          finished = true;
          return;
        }
      }
      throw new ProtocolError("the exec stream ended before the command's exit", res.status);
    } finally {
      if (!finished) res.cancel();
    }
  }

  /** `GET /v1/sandboxes/{id}/files?path=` (operation `read_file`): the file's bytes. */
  async readFile(id: string, path: string, opts?: RequestOptions): Promise<Uint8Array> {
    const res = await this.#send({
      method: "GET",
      path: `/v1/sandboxes/${seg(id)}/files`,
      query: { path },
      headers: { accept: "application/octet-stream" },
      signal: opts?.signal,
    });
    return res.bytes();
  }

  /**
   * `PUT /v1/sandboxes/{id}/files?path=&mode=` (operation `write_file`):
   * write a guest file atomically.
   */
  writeFile(id: string, path: string, data: Uint8Array | string, opts?: WriteFileOptions): Promise<FileWritten> {
    const mode = typeof opts?.mode === "number" ? opts.mode.toString(8) : opts?.mode;
    return this.#json({
      method: "PUT",
      path: `/v1/sandboxes/${seg(id)}/files`,
      query: { path, mode },
      headers: { "content-type": "application/octet-stream" },
      body: typeof data === "string" ? Buffer.from(data) : data,
      signal: opts?.signal,
    });
  }

  /** `GET /v1/sandboxes/{id}/logs` (operation `logs`): the serial console, last 1 MiB. */
  async logs(id: string, opts?: RequestOptions): Promise<string> {
    const res = await this.#send({
      method: "GET",
      path: `/v1/sandboxes/${seg(id)}/logs`,
      headers: { accept: "text/plain" },
      signal: opts?.signal,
    });
    return new TextDecoder().decode(await res.bytes());
  }

  /**
   * `GET /v1/sandboxes/{id}/ports` (operation `ports`): each published guest
   * port and the host loopback port that reaches it (empty without a `nat`
   * network).
   */
  ports(id: string, opts?: RequestOptions): Promise<PortForward[]> {
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/ports`, signal: opts?.signal });
  }

  /** `POST /v1/sandboxes/{id}/snapshot` (operation `snapshot_sandbox`); the source keeps running. */
  snapshotSandbox(id: string, req: CreateSnapshot = {}, opts?: RequestOptions): Promise<Snapshot> {
    return this.#json({
      method: "POST",
      path: `/v1/sandboxes/${seg(id)}/snapshot`,
      ...jsonBody(req),
      signal: opts?.signal,
    });
  }

  // ---- snapshots ------------------------------------------------------

  /** `GET /v1/snapshots` (operation `list_snapshots`). */
  listSnapshots(opts?: RequestOptions): Promise<SnapshotList> {
    return this.#json({ method: "GET", path: "/v1/snapshots", signal: opts?.signal });
  }

  /** `GET /v1/snapshots/{id}` (operation `get_snapshot`), by id or tag. */
  getSnapshot(ref: string, opts?: RequestOptions): Promise<Snapshot> {
    return this.#json({ method: "GET", path: `/v1/snapshots/${seg(ref)}`, signal: opts?.signal });
  }

  /** `DELETE /v1/snapshots/{id}[?force=true]` (operation `delete_snapshot`). */
  async deleteSnapshot(ref: string, opts?: DeleteSnapshotOptions): Promise<void> {
    await this.#empty({
      method: "DELETE",
      path: `/v1/snapshots/${seg(ref)}`,
      query: { force: opts?.force ? "true" : undefined },
      signal: opts?.signal,
    });
  }

  /** `POST /v1/snapshots/{id}/flatten` (operation `flatten_snapshot`): merge a diff chain into one snapshot. */
  flattenSnapshot(ref: string, req: FlattenRequest = {}, opts?: RequestOptions): Promise<Snapshot> {
    return this.#json({
      method: "POST",
      path: `/v1/snapshots/${seg(ref)}/flatten`,
      ...jsonBody(req),
      signal: opts?.signal,
    });
  }

  /** `PUT /v1/snapshots/{id}/pool` (operation `set_pool`): warm-pool size (0 turns it off, `null` follows the daemon's default). */
  setPool(ref: string, size: number | null, opts?: RequestOptions): Promise<Snapshot> {
    return this.#json({
      method: "PUT",
      path: `/v1/snapshots/${seg(ref)}/pool`,
      ...jsonBody({ size }),
      signal: opts?.signal,
    });
  }

  /** `PUT /v1/snapshots/{id}/pin` (operation `pin_snapshot`): garbage collection keeps it and what it builds on. */
  pinSnapshot(ref: string, opts?: RequestOptions): Promise<Snapshot> {
    return this.#json({ method: "PUT", path: `/v1/snapshots/${seg(ref)}/pin`, signal: opts?.signal });
  }

  /** `DELETE /v1/snapshots/{id}/pin` (operation `unpin_snapshot`): garbage collection may take it once nothing needs it. */
  unpinSnapshot(ref: string, opts?: RequestOptions): Promise<Snapshot> {
    return this.#json({ method: "DELETE", path: `/v1/snapshots/${seg(ref)}/pin`, signal: opts?.signal });
  }

  /**
   * `POST /v1/snapshots/prune` (operation `prune_snapshots`): remove the branch
   * points nothing needs, past the grace period (or however young, with
   * `all`); `dry_run` only lists them.
   */
  pruneSnapshots(req: PruneRequest = {}, opts?: RequestOptions): Promise<PruneResult> {
    return this.#json({ method: "POST", path: "/v1/snapshots/prune", ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/snapshots/{id}/push` with `"stream": true` (operation
   * `push_snapshot`): push the snapshot `ref` (id or tag), with its chain and
   * base image, to the OCI registry `req.reference` (`host[:port]/repo[:tag]`);
   * what the registry has is not sent again. `onEvent` sees the progress;
   * resolves with the {@link PushResult}, or rejects with the error of the
   * stream's `error` line (`RegistryAuthFailedError`,
   * `RegistryUnreachableError`…) or of the answer (`NotFoundError` for no such
   * snapshot).
   */
  pushSnapshot(ref: string, req: PushSnapshotParams, opts?: TransferOptions): Promise<PushResult> {
    return this.#transferStream(
      "push",
      { method: "POST", path: `/v1/snapshots/${seg(ref)}/push`, ...jsonBody({ ...req, stream: true }), signal: opts?.signal },
      opts?.onEvent,
    );
  }

  /**
   * `POST /v1/snapshots/pull` with `"stream": true` (operation
   * `pull_snapshot`): pull the snapshot pushed to `req.reference` and publish
   * it here, tagged `req.tag` if given; only the links and the image this
   * host lacks are fetched, and every blob is verified. Resolves with the
   * {@link PullResult} (its `snapshot` can be spawned from at once). Rejects
   * with a `NotFoundError` (code `image_not_found`) when the registry has no
   * such repository, tag or digest, a `ConflictError` when the tag is taken,
   * an `IncompatibleSnapshotError` when this host cannot restore it, an
   * `InvalidImageError` when a blob fails verification.
   */
  pullSnapshot(req: PullSnapshotParams, opts?: TransferOptions): Promise<PullResult> {
    return this.#transferStream(
      "pull",
      { method: "POST", path: "/v1/snapshots/pull", ...jsonBody({ ...req, stream: true }), signal: opts?.signal },
      opts?.onEvent,
    );
  }

  /** Send a push or a pull and read its progress stream to its result (see `transfer.ts`). */
  async #transferStream<K extends "push" | "pull">(
    what: K,
    req: TransportRequest,
    onEvent: TransferEventCallback | undefined,
  ): Promise<K extends "push" ? PushResult : PullResult> {
    type Result = K extends "push" ? PushResult : PullResult;
    const res = await this.#send({ ...req, headers: { ...req.headers, accept: "application/x-ndjson" } });
    let finished = false;
    try {
      const result = (res.header("content-type") ?? "").includes("ndjson")
        ? ((await readTransferEvents(what, ndjsonLines(res.body()), res.status, onEvent)) as Result)
        : await parseJson<Result>(res); // the result itself, from a daemon that did not stream
      finished = true;
      return result;
    } finally {
      if (!finished) res.cancel();
    }
  }

  // ---- volumes --------------------------------------------------------

  /** `GET /v1/volumes` (operation `list_volumes`): the named volumes, with the sandboxes that mount each. */
  listVolumes(opts?: RequestOptions): Promise<VolumeList> {
    return this.#json({ method: "GET", path: "/v1/volumes", signal: opts?.signal });
  }

  /**
   * `POST /v1/volumes` (operation `create_volume`): create the named volume
   * `name` (an empty directory under the daemon's home; 1 to 64 letters,
   * digits, `.`, `_` or `-`, not starting with `.` or `-`). A
   * {@link ConflictError} when it exists.
   */
  createVolume(name: string, opts?: RequestOptions): Promise<Volume> {
    return this.#json({ method: "POST", path: "/v1/volumes", ...jsonBody({ name }), signal: opts?.signal });
  }

  /**
   * `DELETE /v1/volumes/{name}` (operation `delete_volume`): remove a named
   * volume and its files; a {@link ConflictError} while a sandbox mounts it,
   * a {@link NotFoundError} when there is none.
   */
  async deleteVolume(name: string, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: `/v1/volumes/${seg(name)}`, signal: opts?.signal });
  }

  // ---- images ---------------------------------------------------------

  /** `GET /v1/images` (operation `list_images`): the installed images. */
  listImages(opts?: RequestOptions): Promise<ImageList> {
    return this.#json({ method: "GET", path: "/v1/images", signal: opts?.signal });
  }

  /** `GET /v1/images/{name}` (operation `get_image`), with the sandboxes and snapshots that use it. */
  getImage(name: string, opts?: RequestOptions): Promise<Image> {
    return this.#json({ method: "GET", path: `/v1/images/${seg(name)}`, signal: opts?.signal });
  }

  /**
   * `DELETE /v1/images/{name}` (operation `delete_image`): remove an image and
   * its boot templates; a {@link ConflictError} (naming them) while sandboxes
   * or snapshots use it.
   */
  async deleteImage(name: string, opts?: RequestOptions): Promise<void> {
    await this.#empty({ method: "DELETE", path: `/v1/images/${seg(name)}`, signal: opts?.signal });
  }

  /**
   * `POST /v1/images` with `"stream": true` (operation `pull_image`): pull an
   * image from an OCI registry. `onEvent` sees the progress; resolves with
   * the image, or rejects with the error of the stream's `error` line
   * (`RegistryAuthFailedError`, `RegistryUnreachableError`, `InvalidImageError`…).
   */
  pullImage(req: PullImageParams, opts?: ImageOptions): Promise<Image> {
    return this.#imageStream(
      { method: "POST", path: "/v1/images", ...jsonBody({ ...req, stream: true }), signal: opts?.signal },
      opts?.onEvent,
    );
  }

  /**
   * `POST /v1/images/import` (operation `import_image`): install the archive
   * at `path` (a `docker save` tar, an OCI layout tar or a root filesystem
   * tarball, streamed from disk; or an OCI layout directory, packed into a
   * temporary tar first) as the image `req.name`.
   */
  async importImage(path: string, req: ImportImageParams, opts?: ImageOptions): Promise<Image> {
    const query = importQuery(path, req);
    const upload = await prepareImport(path);
    try {
      return await this.#upload("/v1/images/import", queryParams(query), upload, opts);
    } finally {
      await discard(upload);
    }
  }

  /**
   * `POST /v1/images/build` (operation `build_image`): build the image
   * `req.tag` from a Dockerfile (default `<context>/Dockerfile`). The context
   * directory is packed into a temporary tar with the Dockerfile and
   * uploaded; the steps run in a sandbox of the base image. A failed step
   * rejects with a `BuildFailedError` (its output came as `log` events).
   */
  async buildImage(context: string, req: BuildImageParams, opts?: ImageOptions): Promise<Image> {
    const query = buildQuery(req);
    const upload = await prepareBuild(context, req.dockerfile);
    try {
      return await this.#upload("/v1/images/build", queryParams(query), upload, opts);
    } finally {
      await discard(upload);
    }
  }

  #upload(
    path: string,
    query: Record<string, string | undefined>,
    upload: Upload,
    opts: ImageOptions | undefined,
  ): Promise<Image> {
    return this.#imageStream(
      {
        method: "POST",
        path,
        query,
        headers: { "content-type": "application/octet-stream", "content-length": String(upload.size) },
        body: fileChunks(upload.path),
        signal: opts?.signal,
      },
      opts?.onEvent,
    );
  }

  /** Send an image operation and read its progress stream to the image (see `images.ts`). */
  async #imageStream(req: TransportRequest, onEvent: ImageEventCallback | undefined): Promise<Image> {
    const res = await this.#send({ ...req, headers: { ...req.headers, accept: "application/x-ndjson" } });
    let finished = false;
    try {
      const image = (res.header("content-type") ?? "").includes("ndjson")
        ? await readImageEvents(ndjsonLines(res.body()), res.status, onEvent)
        : await parseJson<Image>(res); // the image itself, from a daemon that did not stream
      finished = true;
      return image;
    } finally {
      if (!finished) res.cancel();
    }
  }

  // ---- plumbing -------------------------------------------------------

  /** The transport for the operations of {@link ProcessOps} (processes and files) and {@link TimeTravelOps}. */
  protected override send(req: TransportRequest): Promise<TransportResponse> {
    return this.#send(req);
  }

  /** Send a request; a 4xx/5xx becomes a {@link ForkvmError}. */
  async #send(req: TransportRequest): Promise<TransportResponse> {
    const res = await this.transport.request(req);
    if (res.status >= 400) throw await errorFrom(res);
    return res;
  }

  async #json<T>(req: TransportRequest): Promise<T> {
    return parseJson<T>(await this.#send(req));
  }

  async #empty(req: TransportRequest): Promise<void> {
    await (await this.#send(req)).bytes();
  }
}

/** A metadata filter as query parameters: `{ team: "a" }` → `metadata.team=a`. */
function metadataQuery(metadata: Record<string, string> | undefined): Record<string, string> | undefined {
  if (!metadata) return undefined;
  const query: Record<string, string> = {};
  for (const [key, value] of Object.entries(metadata)) query[`metadata.${key}`] = String(value);
  return query;
}

/** An older daemon refuses `stream` as an unknown field: say so clearly. */
function streamingRefusal(err: unknown): StreamingUnsupportedError | undefined {
  if (err instanceof ForkvmError && err.status === 400 && /unknown field `stream`/.test(err.message)) {
    return new StreamingUnsupportedError(
      `this forkvm daemon does not support streaming exec; upgrade it, or use exec() (server said: ${err.message})`,
      err.code,
      err.status,
    );
  }
  return undefined;
}

function* framesOf(result: ExecResult): Generator<ExecStreamFrame> {
  const b64 = (text: string): string =>
    result.encoding === "base64" ? text : Buffer.from(text, "utf8").toString("base64");
  if (result.stdout) yield { type: "stdout", data: b64(result.stdout) };
  if (result.stderr) yield { type: "stderr", data: b64(result.stderr) };
  yield {
    type: "exit",
    exit_code: result.exit_code ?? null,
    signal: result.signal ?? null,
    duration_ms: result.duration_ms,
    timed_out: result.timed_out,
    stdout_bytes: result.stdout_bytes,
    stderr_bytes: result.stderr_bytes,
  };
}

function parseLine(line: string, status: number): ExecEvent {
  let event: unknown;
  try {
    event = JSON.parse(line);
  } catch (cause) {
    throw new ProtocolError(`bad line in the exec stream: ${line.slice(0, 200)}`, status, { cause });
  }
  const type = (event as { type?: unknown } | null)?.type;
  if (type !== "stdout" && type !== "stderr" && type !== "exit" && type !== "error") {
    throw new ProtocolError(`unknown event in the exec stream: ${line.slice(0, 200)}`, status);
  }
  return event as ExecEvent;
}

export { ndjsonLines } from "./wire.js";

let shared: Client | undefined;

/** The client the high-level API uses when none is given: built from the environment on first use. */
export function defaultClient(): Client {
  shared ??= new Client();
  return shared;
}

/** Replace (or with `undefined`, reset) the client the high-level API uses by default. */
export function setDefaultClient(client: Client | undefined): void {
  shared = client;
}
