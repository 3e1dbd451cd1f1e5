/**
 * The Client's time-travel operations (docs/timetravel.md): checkpoints, the
 * timeline and its retention, rewind, and filesystem diff and merge, one
 * method per `operationId` in camelCase. {@link Client} inherits them, with
 * those of {@link ProcessOps}; they send through the Client's transport.
 *
 * @module
 */
import { ProcessOps } from "./client-procs.js";
import type {
  Checkpoint,
  CheckpointRequest,
  Diff,
  DiffRequest,
  MergeRequest,
  Merged,
  Retention,
  RewindRequest,
  Rewound,
  Timeline,
} from "./types.js";
import type { TransportRequest } from "./transport.js";
import { jsonBody, parseJson } from "./wire.js";

/** Options of every request (as in `client.ts`). */
interface RequestOptions {
  signal?: AbortSignal | undefined;
}

const seg = (value: string): string => encodeURIComponent(value);

/** The operations of time travel; {@link Client} extends it. */
export abstract class TimeTravelOps extends ProcessOps {
  async #json<T>(req: TransportRequest): Promise<T> {
    return parseJson<T>(await this.send(req));
  }

  /**
   * `POST /v1/sandboxes/{id}/checkpoints` (operation `checkpoint`): save a
   * running sandbox as the next step of its timeline, storing only what
   * changed since its previous checkpoint; it keeps running. Tagged ones are
   * never pruned. Its retention policy is applied afterwards.
   */
  checkpoint(id: string, req: CheckpointRequest = {}, opts?: RequestOptions): Promise<Checkpoint> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/checkpoints`, ...jsonBody(req), signal: opts?.signal });
  }

  /** `GET /v1/sandboxes/{id}/timeline` (operation `get_timeline`): its kept checkpoints, oldest first. */
  getTimeline(id: string, opts?: RequestOptions): Promise<Timeline> {
    return this.#json({ method: "GET", path: `/v1/sandboxes/${seg(id)}/timeline`, signal: opts?.signal });
  }

  /**
   * `PUT /v1/sandboxes/{id}/timeline/retention` (operation `set_retention`):
   * replace its retention policy and prune by it now; resolves with the timeline.
   */
  setRetention(id: string, req: Retention, opts?: RequestOptions): Promise<Timeline> {
    const path = `/v1/sandboxes/${seg(id)}/timeline/retention`;
    return this.#json({ method: "PUT", path, ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes/{id}/rewind` (operation `rewind`): bring a running
   * sandbox back to a checkpoint (or a snapshot of its lineage) as the same
   * sandbox. `checkpoint_first` saves the present first (`undo`).
   */
  rewind(id: string, req: RewindRequest, opts?: RequestOptions): Promise<Rewound> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/rewind`, ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/diff/{id}` (operation `diff`): the filesystem differences
   * between `id` and `req.b` (each a sandbox, snapshot or checkpoint, by id
   * or tag): added, deleted, modified paths and mode and type changes,
   * sorted by path, under `req.path`; `req.text` adds unified diffs of text
   * files. Read through the guests; a snapshot through a temporary clone.
   */
  diff(id: string, req: DiffRequest, opts?: RequestOptions): Promise<Diff> {
    return this.#json({ method: "POST", path: `/v1/diff/${seg(id)}`, ...jsonBody(req), signal: opts?.signal });
  }

  /**
   * `POST /v1/sandboxes/{id}/merge` (operation `merge`): apply sandbox `id`'s
   * file changes since its branch point to the running sandbox `req.into`,
   * three-way. A path both changed differently is a conflict: the merge is
   * refused whole with a `ConflictError` listing them, unless `req.strategy`
   * settles them; `req.dry_run` changes nothing and lists them. Memory is
   * not merged.
   */
  merge(id: string, req: MergeRequest, opts?: RequestOptions): Promise<Merged> {
    return this.#json({ method: "POST", path: `/v1/sandboxes/${seg(id)}/merge`, ...jsonBody(req), signal: opts?.signal });
  }
}
