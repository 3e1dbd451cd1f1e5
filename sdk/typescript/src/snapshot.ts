/**
 * Snapshots: frozen sandboxes to spawn children from.
 *
 * @module
 */
import {
  defaultClient,
  type Client,
  type PullSnapshotParams,
  type PushSnapshotParams,
  type RequestOptions,
  type TransferOptions,
} from "./client.js";
import { ForkvmError } from "./errors.js";
import { networkFields, type NetworkOptions } from "./network.js";
import { lifetimeFields, Sandbox, type LifetimeOptions } from "./sandbox.js";
import type { PushResult } from "./transfer.js";
import type * as api from "./types.js";
import { volumeMounts, type VolumeSpec } from "./volumes.js";

/** A snapshot of a sandbox: memory, devices and disk at one instant. */
export class Snapshot {
  readonly client: Client;
  readonly id: string;
  /** What the daemon last said about it; {@link refresh} updates it. */
  info: api.Snapshot;

  /** Wrap a snapshot the daemon described. Use {@link Snapshot.get} or `Sandbox.snapshot()` instead. */
  constructor(client: Client, info: api.Snapshot) {
    this.client = client;
    this.id = info.id;
    this.info = info;
  }

  /** An existing snapshot, by id or tag. */
  static async get(ref: string, opts: { client?: Client | undefined } & RequestOptions = {}): Promise<Snapshot> {
    const client = opts.client ?? defaultClient();
    return new Snapshot(client, await client.getSnapshot(ref, opts));
  }

  /** Every snapshot, boot templates included. */
  static async list(opts: { client?: Client | undefined } & RequestOptions = {}): Promise<Snapshot[]> {
    const client = opts.client ?? defaultClient();
    const { snapshots } = await client.listSnapshots(opts);
    return snapshots.map((info) => new Snapshot(client, info));
  }

  /** Its tag, if it has one. */
  get tag(): string | undefined {
    return this.info.tag ?? undefined;
  }

  /** `ready`, `writing` or `failed`, as last seen. */
  get state(): string {
    return this.info.state;
  }

  /** `shared`, `stream`, `live` or `diff`. */
  get kind(): string {
    return this.info.kind;
  }

  /** Fetch its current state. */
  async refresh(opts?: RequestOptions): Promise<api.Snapshot> {
    this.info = await this.client.getSnapshot(this.id, opts);
    return this.info;
  }

  /**
   * Spawn `count` (default 1) sandboxes from it, concurrently; all or nothing.
   * The network, lifetime, `limits` and `volumes` options are those of `Sandbox.create`; with `count` above 1,
   * published ports need host port 0 (one is allocated for each). A snapshot taken with volumes
   * gives its clones the same ones (`volumes` is then refused).
   */
  async spawn(
    opts: {
      count?: number | undefined;
      limits?: api.SandboxLimits | undefined;
      volumes?: VolumeSpec[] | undefined;
    } & NetworkOptions &
      LifetimeOptions &
      RequestOptions = {},
  ): Promise<Sandbox[]> {
    const req: api.CreateSandbox & { count: number } = {
      snapshot: this.id,
      count: opts.count ?? 1,
      ...networkFields(opts),
      ...lifetimeFields(opts),
    };
    if (opts.limits !== undefined) req.limits = opts.limits;
    if (opts.volumes !== undefined) req.volumes = volumeMounts(opts.volumes);
    const batch = await this.client.createSandbox(req, opts);
    return batch.sandboxes.map((info) => new Sandbox(this.client, info));
  }

  /** Merge a diff snapshot's chain into one standalone snapshot. */
  async flatten(opts: { tag?: string | undefined } & RequestOptions = {}): Promise<Snapshot> {
    const req: api.FlattenRequest = opts.tag === undefined ? {} : { tag: opts.tag };
    return new Snapshot(this.client, await this.client.flattenSnapshot(this.id, req, opts));
  }

  /**
   * Push it, with its chain and base image, to the OCI registry `reference`
   * (`host[:port]/repo[:tag]`, e.g. `127.0.0.1:5000/team/warm:v1`); what the
   * registry has is not sent again. `username`/`password` log in (default:
   * the daemon host's `~/.docker/config.json`, else anonymous), `insecure`
   * allows plain HTTP to a registry off loopback, and `onEvent` sees each
   * progress event (see `Client.pushSnapshot`). Pull it anywhere with
   * {@link Snapshot.pull}.
   */
  push(
    reference: string,
    opts: {
      username?: string | undefined;
      password?: string | undefined;
      insecure?: boolean | undefined;
    } & TransferOptions = {},
  ): Promise<PushResult> {
    const req: PushSnapshotParams = { reference };
    if (opts.username !== undefined) req.username = opts.username;
    if (opts.password !== undefined) req.password = opts.password;
    if (opts.insecure !== undefined) req.insecure = opts.insecure;
    return this.client.pushSnapshot(this.id, req, opts);
  }

  /**
   * Pull the snapshot pushed to `reference` (`host[:port]/repo[:tag]` or
   * `…@sha256:<digest>`) onto the daemon and return it, ready to
   * {@link spawn} from. `tag` tags it there; the credentials and `insecure`
   * are those of {@link push}. The last event `onEvent` sees (`pulled`)
   * carries the whole `api.PullResult` (what was fetched, what was there
   * already); `Client.pullSnapshot` returns it.
   */
  static async pull(
    reference: string,
    opts: {
      tag?: string | undefined;
      username?: string | undefined;
      password?: string | undefined;
      insecure?: boolean | undefined;
      client?: Client | undefined;
    } & TransferOptions = {},
  ): Promise<Snapshot> {
    const client = opts.client ?? defaultClient();
    const req: PullSnapshotParams = { reference };
    if (opts.tag !== undefined) req.tag = opts.tag;
    if (opts.username !== undefined) req.username = opts.username;
    if (opts.password !== undefined) req.password = opts.password;
    if (opts.insecure !== undefined) req.insecure = opts.insecure;
    const result = await client.pullSnapshot(req, opts);
    return new Snapshot(client, result.snapshot);
  }

  /** Remove it; refused (409) while sandboxes or snapshots depend on it, unless `force`. */
  delete(opts: { force?: boolean | undefined } & RequestOptions = {}): Promise<void> {
    return this.client.deleteSnapshot(this.id, opts);
  }

  /** Keep `size` QEMU processes waiting for it, so spawns skip QEMU's start (0 turns the pool off, `null` follows the daemon's default). */
  async setPool(size: number | null, opts?: RequestOptions): Promise<Snapshot> {
    this.info = await this.client.setPool(this.id, size, opts);
    return this;
  }

  /** Whether garbage collection must keep it, as last seen. */
  get pinned(): boolean {
    return this.info.pinned;
  }

  /** Keep it (and what it builds on) from garbage collection. */
  async pin(opts?: RequestOptions): Promise<Snapshot> {
    this.info = await this.client.pinSnapshot(this.id, opts);
    return this;
  }

  /** Let garbage collection take it once nothing needs it. */
  async unpin(opts?: RequestOptions): Promise<Snapshot> {
    this.info = await this.client.unpinSnapshot(this.id, opts);
    return this;
  }

  /**
   * Remove the branch points nothing needs (untagged, unpinned, no sandbox or
   * snapshot built on them) past the daemon's grace period, or however young
   * with `all`; `dryRun` only lists them.
   */
  static async prune(
    opts: { all?: boolean | undefined; dryRun?: boolean | undefined; client?: Client | undefined } & RequestOptions = {},
  ): Promise<api.PruneResult> {
    const client = opts.client ?? defaultClient();
    const req: api.PruneRequest = {};
    if (opts.all !== undefined) req.all = opts.all;
    if (opts.dryRun !== undefined) req.dry_run = opts.dryRun;
    return client.pruneSnapshots(req, opts);
  }

  /**
   * Wait until an asynchronous branch's snapshot (`wait: false`) is published:
   * resolves when it is `ready`, throws when it `failed`.
   */
  async waitReady(opts: { timeoutMs?: number; intervalMs?: number } & RequestOptions = {}): Promise<Snapshot> {
    const deadline = Date.now() + (opts.timeoutMs ?? 120_000);
    const interval = opts.intervalMs ?? 100;
    for (;;) {
      if (this.info.state === "ready") return this;
      if (this.info.state === "failed") {
        throw new ForkvmError(`snapshot ${this.id} failed: ${this.info.failure ?? "no reason given"}`, "snapshot_failed", 0);
      }
      if (Date.now() >= deadline) {
        throw new ForkvmError(`snapshot ${this.id} is still ${this.info.state} after ${opts.timeoutMs ?? 120_000} ms`, "timeout", 0);
      }
      await new Promise((resolve) => setTimeout(resolve, interval));
      opts.signal?.throwIfAborted();
      await this.refresh(opts);
    }
  }
}
