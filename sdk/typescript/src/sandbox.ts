/**
 * The high-level API: a running sandbox you can run commands in, read and
 * write files of, snapshot and branch.
 *
 * @module
 */
import { defaultClient, type Client, type ListSandboxesOptions, type RequestOptions } from "./client.js";
import { NotFoundError } from "./errors.js";
import {
  commandResult,
  execParams,
  ExecStream,
  type BinaryExecOptions,
  type Command,
  type CommandResult,
  type ExecOptions,
  type ExecStreamOptions,
} from "./exec.js";
import { SandboxFs } from "./fs.js";
import { SandboxProcesses } from "./processes.js";
import { networkFields, type NetworkOptions, type PortSpec } from "./network.js";
import { Snapshot } from "./snapshot.js";
import type * as api from "./types.js";
import { volumeMounts, type VolumeSpec } from "./volumes.js";

/** The lifetime of a new sandbox (every field is optional): labels, default env, timeout. */
export interface LifetimeOptions {
  /** Labels, e.g. `{ team: "a" }`: `Sandbox.list({ metadata })` filters by them. A branch's children inherit them. */
  metadata?: Record<string, string> | undefined;
  /** Environment variables every exec starts with (an exec's own `env` wins). A branch's children inherit them. */
  env?: Record<string, string> | undefined;
  /** Seconds (1 to 2,592,000) until it is removed, or paused with `onTimeout: "pause"`. */
  timeout?: number | undefined;
  /** What happens when `timeout` runs out: `kill` (the default) or `pause`. */
  onTimeout?: api.OnTimeout | undefined;
}

/** The wire fields of {@link LifetimeOptions}. */
export function lifetimeFields(opts: LifetimeOptions): Pick<api.CreateSandbox, "metadata" | "env" | "timeout" | "on_timeout"> {
  const req: Pick<api.CreateSandbox, "metadata" | "env" | "timeout" | "on_timeout"> = {};
  if (opts.metadata !== undefined) req.metadata = opts.metadata;
  if (opts.env !== undefined) req.env = opts.env;
  if (opts.timeout !== undefined) req.timeout = opts.timeout;
  if (opts.onTimeout !== undefined) req.on_timeout = opts.onTimeout;
  return req;
}

/**
 * Options of {@link Sandbox.create}. The network ones (`network`, `ports`,
 * `egress`, `waitForNetwork`) are described in {@link NetworkOptions}, the
 * lifetime ones (`metadata`, `env`, `timeout`, `onTimeout`) in {@link LifetimeOptions}.
 */
export interface SandboxCreateOptions extends NetworkOptions, LifetimeOptions, RequestOptions {
  /** Image name (default `default`). Ignored with `snapshot`. */
  image?: string | undefined;
  /** Guest RAM in MiB (default 512). */
  memoryMib?: number | undefined;
  /** vCPUs (default 1). */
  cpus?: number | undefined;
  /** Spawn from this snapshot (id or tag) instead of an image. */
  snapshot?: string | undefined;
  /** `false` forces a cold boot instead of using the image's boot template. */
  useTemplate?: boolean | undefined;
  /** Root disk size in bytes (default: the image's); a larger one grows the guest's root filesystem. */
  diskSize?: number | undefined;
  /**
   * Resource limits, e.g. `{ disk_iops: 100, net_kbps: 10000 }` (omitted
   * fields: unlimited; docs/limits.md). A branch's children inherit them.
   */
  limits?: api.SandboxLimits | undefined;
  /**
   * Host directories and named volumes to mount (docs/volumes.md), each the
   * CLI string `"SOURCE:GUEST_PATH[:OPTIONS]"` or a {@link api.VolumeMount},
   * e.g. `["/srv/repo:/work:ro", { source: "data", path: "/data", mode: "copy" }]`.
   */
  volumes?: VolumeSpec[] | undefined;
  /** The daemon to use (default: from the environment). */
  client?: Client | undefined;
}

/** Options of {@link Sandbox.branch}. */
export interface BranchOptions extends RequestOptions {
  /** How memory is copied: `live` (default, shortest pause), `diff` or `full`. */
  mode?: api.BranchMode | undefined;
  /** Children to spawn (0–1000, default 1). */
  count?: number | undefined;
  /** A unique name for the branch point's snapshot. */
  tag?: string | undefined;
  /** `false`: return once the source has resumed; the snapshot is then `writing` (default true). */
  wait?: boolean | undefined;
  /**
   * Ports each child publishes. Omitted: the source's guest ports, each on a
   * host port of the child's own. Children keep the source's network mode
   * and egress allow-list.
   */
  ports?: PortSpec[] | undefined;
  /** `false`: return before the children's network is proven to work (default true). */
  waitForNetwork?: boolean | undefined;
  /** The children's limits: the source's, with the fields given here replaced. */
  limits?: api.SandboxLimits | undefined;
  /** The children's timeout in seconds, from their start (default: the source's). */
  timeout?: number | undefined;
}

/** The result of {@link Sandbox.branch}. */
export interface Branch {
  mode: api.BranchMode;
  /** The snapshot of the branch point. */
  snapshot: Snapshot;
  /** The children, running from the branch point (none yet with `wait: false`). */
  children: Sandbox[];
  /** How long the source was paused. */
  pauseMs: number;
  snapshotMs: number;
  spawnMs: number;
  totalMs: number;
}

/** A guest file system. */
export class SandboxFiles {
  readonly #sandbox: Sandbox;

  constructor(sandbox: Sandbox) {
    this.#sandbox = sandbox;
  }

  /** The bytes of a guest file (absolute path). */
  read(path: string, opts?: RequestOptions): Promise<Uint8Array> {
    return this.#sandbox.client.readFile(this.#sandbox.id, path, opts);
  }

  /** A guest file as UTF-8 text. */
  async readText(path: string, opts?: RequestOptions): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /** Write a guest file atomically; `mode` is a number (`0o755`) or octal string, default 644. */
  write(
    path: string,
    data: string | Uint8Array,
    opts?: { mode?: number | string | undefined } & RequestOptions,
  ): Promise<api.FileWritten> {
    return this.#sandbox.client.writeFile(this.#sandbox.id, path, data, opts);
  }
}

/** A sandbox: a microVM with a guest agent. Close it when done (or use `await using`). */
export class Sandbox implements AsyncDisposable {
  readonly client: Client;
  readonly id: string;
  /** What the daemon last said about it; {@link refresh} updates it. */
  info: api.Sandbox;
  /** Its files. */
  readonly files: SandboxFiles;
  /** Its background processes: `start`, `list`, `attach`, `sendStdin`, `signal`, `kill`, `resize`… */
  readonly processes: SandboxProcesses;
  /** Its filesystem: `stat`, `exists`, `list`, `mkdir`, `move`, `remove`, `watch`, archives… */
  readonly fs: SandboxFs;
  #closed = false;

  /** Wrap a sandbox the daemon described. Use {@link Sandbox.create} or {@link Sandbox.get} instead. */
  constructor(client: Client, info: api.Sandbox) {
    this.client = client;
    this.id = info.id;
    this.info = info;
    this.files = new SandboxFiles(this);
    this.processes = new SandboxProcesses(this);
    this.fs = new SandboxFs(this);
  }

  /**
   * Start a sandbox: from an image (its boot template after the first time)
   * or from a snapshot. Resolves once its guest agent answers.
   */
  static async create(opts: SandboxCreateOptions = {}): Promise<Sandbox> {
    const client = opts.client ?? defaultClient();
    const req: api.CreateSandbox & { count?: undefined } = {};
    if (opts.image !== undefined) req.image = opts.image;
    if (opts.memoryMib !== undefined) req.memory_mib = opts.memoryMib;
    if (opts.cpus !== undefined) req.cpus = opts.cpus;
    if (opts.snapshot !== undefined) req.snapshot = opts.snapshot;
    if (opts.useTemplate !== undefined) req.use_template = opts.useTemplate;
    if (opts.diskSize !== undefined) req.disk_size = opts.diskSize;
    if (opts.limits !== undefined) req.limits = opts.limits;
    if (opts.volumes !== undefined) req.volumes = volumeMounts(opts.volumes);
    Object.assign(req, networkFields(opts), lifetimeFields(opts));
    return new Sandbox(client, await client.createSandbox(req, opts));
  }

  /** An existing sandbox, by id. */
  static async get(id: string, opts: { client?: Client | undefined } & RequestOptions = {}): Promise<Sandbox> {
    const client = opts.client ?? defaultClient();
    return new Sandbox(client, await client.getSandbox(id, opts));
  }

  /** Every sandbox the daemon knows, in any state; with `metadata`, those with every given pair. */
  static async list(opts: { client?: Client | undefined } & ListSandboxesOptions = {}): Promise<Sandbox[]> {
    const client = opts.client ?? defaultClient();
    const { sandboxes } = await client.listSandboxes(opts);
    return sandboxes.map((info) => new Sandbox(client, info));
  }

  /** `starting`, `running`, `paused` or `failed`, as last seen. */
  get state(): api.SandboxState {
    return this.info.state;
  }

  /** Its labels, as last seen. */
  get metadata(): Record<string, string> {
    return this.info.metadata ?? {};
  }

  /** Its timeout as last seen (undefined without one). */
  get lifetime(): api.Lifetime | undefined {
    return this.info.lifetime ?? undefined;
  }

  /** Its volumes as last seen, each with the `host_path` its guest reads and writes. */
  get volumes(): api.MountedVolume[] {
    return this.info.volumes ?? [];
  }

  /** Its resource limits as last seen (undefined without any). */
  get limits(): api.SandboxLimits | undefined {
    return this.info.limits ?? undefined;
  }

  /** What it had used when last fetched ({@link refresh} of a running sandbox; undefined otherwise). */
  get usage(): api.Usage | undefined {
    return this.info.usage ?? undefined;
  }

  /** Whether {@link close} has removed it. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Its network as last seen: mode, addresses, published ports (undefined for a sandbox without a NIC). */
  get network(): api.NetworkInfo | undefined {
    return this.info.network ?? undefined;
  }

  /** Fetch its current state, with the memory use of its QEMU. */
  async refresh(opts?: RequestOptions): Promise<api.Sandbox> {
    this.info = await this.client.getSandbox(this.id, opts);
    return this.info;
  }

  /**
   * Its published ports: each `guest` port and the `host` port on 127.0.0.1
   * that reaches it.
   *
   * ```ts
   * const sb = await Sandbox.create({ ports: [8000] });
   * const [{ host }] = await sb.ports();
   * await fetch(`http://127.0.0.1:${host}/`);
   * ```
   */
  ports(opts?: RequestOptions): Promise<api.PortForward[]> {
    return this.client.ports(this.id, opts);
  }

  /**
   * Run a command and wait for it: a shell line (`sh -c`) or an argv array.
   * A non-zero exit is not an error: check `exitCode`. With `onStdout` or
   * `onStderr`, the output is streamed to them as it is written.
   */
  exec(cmd: Command, opts: BinaryExecOptions): Promise<CommandResult<Uint8Array>>;
  exec(cmd: Command, opts?: ExecOptions & { binary?: false | undefined }): Promise<CommandResult<string>>;
  async exec(cmd: Command, opts: ExecOptions & { binary?: boolean } = {}): Promise<CommandResult<string | Uint8Array>> {
    const binary = opts.binary === true;
    if (opts.onStdout || opts.onStderr) return this.#execStreamed(cmd, opts, binary);
    const result = await this.client.exec(this.id, execParams(cmd, opts, binary), opts);
    return commandResult(result, binary);
  }

  async #execStreamed(cmd: Command, opts: ExecOptions, binary: boolean): Promise<CommandResult<string | Uint8Array>> {
    const cap = opts.maxOutputBytes ?? Infinity;
    const kept = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
    const size = { stdout: 0, stderr: 0 };
    const stream = new ExecStream(this.client, this.id, cmd, opts);
    for await (const event of stream) {
      if (event.type === "exit") continue;
      const room = cap - size[event.type];
      if (room <= 0) continue;
      const chunk = event.data.byteLength > room ? event.data.subarray(0, room) : event.data;
      kept[event.type].push(chunk);
      size[event.type] += chunk.byteLength;
    }
    const exit = await stream.wait();
    const stdout = Buffer.concat(kept.stdout);
    const stderr = Buffer.concat(kept.stderr);
    return {
      stdout: binary ? stdout : stdout.toString("utf8"),
      stderr: binary ? stderr : stderr.toString("utf8"),
      ...exit,
      stdoutTruncated: exit.stdoutBytes > stdout.byteLength,
      stderrTruncated: exit.stderrBytes > stderr.byteLength,
    };
  }

  /**
   * Run a command and read its output as it is written:
   * `for await (const ev of sb.execStream("make")) …`, or `await sb.execStream(cmd, {onStdout}).wait()`.
   */
  execStream(cmd: Command, opts?: ExecStreamOptions): ExecStream {
    return new ExecStream(this.client, this.id, cmd, opts);
  }

  /**
   * Snapshot it at this instant (it keeps running) and spawn `count`
   * children that continue from there.
   */
  async branch(opts: BranchOptions = {}): Promise<Branch> {
    const req: api.BranchRequest = {};
    if (opts.mode !== undefined) req.mode = opts.mode;
    if (opts.count !== undefined) req.count = opts.count;
    if (opts.tag !== undefined) req.tag = opts.tag;
    if (opts.wait !== undefined) req.wait = opts.wait;
    if (opts.ports !== undefined) req.ports = networkFields({ ports: opts.ports }).ports;
    if (opts.waitForNetwork !== undefined) req.wait_for_network = opts.waitForNetwork;
    if (opts.limits !== undefined) req.limits = opts.limits;
    if (opts.timeout !== undefined) req.timeout = opts.timeout;
    const res = await this.client.branchSandbox(this.id, req, opts);
    return {
      mode: res.mode,
      snapshot: new Snapshot(this.client, res.snapshot),
      children: res.children.map((info) => new Sandbox(this.client, info)),
      pauseMs: res.pause_ms,
      snapshotMs: res.snapshot_ms,
      spawnMs: res.spawn_ms,
      totalMs: res.total_ms,
    };
  }

  /** Snapshot it (it keeps running). */
  async snapshot(opts: { tag?: string | undefined } & RequestOptions = {}): Promise<Snapshot> {
    const req: api.CreateSnapshot = opts.tag === undefined ? {} : { tag: opts.tag };
    return new Snapshot(this.client, await this.client.snapshotSandbox(this.id, req, opts));
  }

  /** Its serial console (the last 1 MiB). */
  logs(opts?: RequestOptions): Promise<string> {
    return this.client.logs(this.id, opts);
  }

  /**
   * Remove it (or with `onTimeout: "pause"`, pause it) `timeout` seconds
   * from now; `null` removes the timeout. See {@link lifetime}.
   */
  async setTimeout(
    timeout: number | null,
    opts: { onTimeout?: api.OnTimeout | undefined } & RequestOptions = {},
  ): Promise<Sandbox> {
    const req: api.SetTimeout = { timeout };
    if (opts.onTimeout !== undefined) req.on_timeout = opts.onTimeout;
    this.info = await this.client.setTimeout(this.id, req, opts);
    return this;
  }

  /**
   * Save it to disk and free its RAM and QEMU: `state` becomes `paused` and
   * `info.paused` says what was stored. Its timeout stops counting.
   * `{ memory: false }` keeps only the disk: the resume cold-boots from it.
   */
  async pause(req: api.PauseRequest = {}, opts?: RequestOptions): Promise<Sandbox> {
    this.info = await this.client.pause(this.id, req, opts);
    return this;
  }

  /**
   * Bring it back from {@link pause} with the same id, memory, processes
   * and network. `timeout` sets a new timeout in seconds; without it, it
   * gets the time it had left. `memory: false` cold-boots from the saved
   * disk instead (a filesystem-only pause always resumes that way).
   */
  async resume(
    opts: { timeout?: number | undefined; memory?: boolean | undefined } & RequestOptions = {},
  ): Promise<Sandbox> {
    const req: api.ResumeRequest = {};
    if (opts.timeout !== undefined) req.timeout = opts.timeout;
    if (opts.memory !== undefined) req.memory = opts.memory;
    this.info = await this.client.resume(this.id, req, opts);
    return this;
  }

  // ---- time travel (docs/timetravel.md) ----------------------------------

  /**
   * Save it now as the next step of its timeline; it keeps running. A
   * checkpoint stores only what changed since the previous one, and the
   * guest stops only for the last copy pass (`pause_ms`). `tag` names it
   * (unique among snapshots); tagged checkpoints are never pruned.
   */
  checkpoint(opts: { tag?: string | undefined } & RequestOptions = {}): Promise<api.Checkpoint> {
    const req: api.CheckpointRequest = opts.tag === undefined ? {} : { tag: opts.tag };
    return this.client.checkpoint(this.id, req, opts);
  }

  /** Its kept checkpoints, oldest first, with its retention policy and what they store. */
  timeline(opts?: RequestOptions): Promise<api.Timeline> {
    return this.client.getTimeline(this.id, opts);
  }

  /**
   * Keep only the last `keepLast` checkpoints and every `keepEvery`th, and
   * prune now. Tagged checkpoints and the newest are always kept. The policy
   * replaces the previous one (no `keepLast`: keep all) and applies after
   * every checkpoint. Resolves with the pruned timeline.
   */
  setRetention(
    opts: { keepLast?: number | undefined; keepEvery?: number | undefined } & RequestOptions = {},
  ): Promise<api.Timeline> {
    const req: api.Retention = {};
    if (opts.keepLast !== undefined) req.keep_last = opts.keepLast;
    if (opts.keepEvery !== undefined) req.keep_every = opts.keepEvery;
    return this.client.setRetention(this.id, req, opts);
  }

  /**
   * Bring it back to `to`: one of its checkpoints or a snapshot of its
   * lineage (an id, a tag, a checkpoint or a {@link Snapshot}). It stays the
   * same sandbox (id, metadata, network, ports) with the memory, processes
   * and files of `to`; what happened since is lost unless `checkpointFirst`
   * saves it first, as the result's `undo` (rewind to it to undo this).
   * Rejects with a `NotFoundError` for a `to` that does not exist.
   */
  async rewind(
    to: string | api.Checkpoint | Snapshot,
    opts: { checkpointFirst?: boolean | undefined } & RequestOptions = {},
  ): Promise<api.Rewound> {
    const req: api.RewindRequest = { to: typeof to === "string" ? to : to.id };
    if (opts.checkpointFirst) req.checkpoint_first = true;
    const res = await this.client.rewind(this.id, req, opts);
    this.info = res.sandbox;
    return res;
  }

  /**
   * The filesystem differences from this sandbox to `other`: a sandbox, a
   * snapshot or a checkpoint (an object, or an id or tag), usually of its
   * lineage (a branch child, its branch point, one of its checkpoints).
   * `change` says what `other` has compared to this one (`added`: only
   * `other` has it). `path` limits it to an absolute directory; `text` adds
   * a unified diff of each text file (`patch`).
   */
  diff(
    other: string | { id: string },
    opts: { path?: string | undefined; text?: boolean | undefined } & RequestOptions = {},
  ): Promise<api.Diff> {
    const req: api.DiffRequest = { b: typeof other === "string" ? other : other.id };
    if (opts.path !== undefined) req.path = opts.path;
    if (opts.text) req.text = true;
    return this.client.diff(this.id, req, opts);
  }

  /**
   * Apply this sandbox's file changes since its branch point to the running
   * sandbox `target` (usually the one it was branched from), three-way. A
   * path `target` changed too, differently, is a conflict: then nothing is
   * applied and the promise rejects with a `ConflictError` whose message
   * lists the paths, unless `strategy` settles them (`"ours"` keeps
   * `target`'s version, `"theirs"` takes this one's, `"text"` merges text
   * files line by line). `dryRun` changes nothing and resolves with the plan
   * and its `conflicts`. Only files merge: `target`'s processes keep what
   * they hold in memory.
   */
  mergeInto(
    target: string | { id: string },
    opts: {
      path?: string | undefined;
      strategy?: api.MergeStrategy | undefined;
      dryRun?: boolean | undefined;
    } & RequestOptions = {},
  ): Promise<api.Merged> {
    const req: api.MergeRequest = { into: typeof target === "string" ? target : target.id };
    if (opts.path !== undefined) req.path = opts.path;
    if (opts.strategy !== undefined) req.strategy = opts.strategy;
    if (opts.dryRun) req.dry_run = true;
    return this.client.merge(this.id, req, opts);
  }

  /** Kill it and delete everything it had. Closing twice, or a sandbox already gone, is fine. */
  async close(opts?: RequestOptions): Promise<void> {
    if (this.#closed) return;
    try {
      await this.client.deleteSandbox(this.id, opts);
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
    this.#closed = true;
  }

  /** `await using sb = await Sandbox.create()` closes it at the end of the block. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
