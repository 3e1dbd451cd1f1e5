/**
 * Wire types of time travel: checkpoints, a sandbox's timeline and its
 * retention, and rewind (schemas of docs/openapi.json, re-exported by
 * `types.ts` so that they are part of `api`).
 *
 * A checkpoint is a snapshot (origin `checkpoint`) of a running sandbox
 * whose parent is the sandbox's previous checkpoint, so it stores only what
 * changed since then; the guest stops only for the final copy pass. A
 * sandbox's checkpoints form its timeline, pruned by its retention policy
 * after every checkpoint. A rewind brings the sandbox back to one of its
 * checkpoints (or any snapshot of its lineage) as the same sandbox: same
 * id, metadata, network and published ports.
 *
 * @module
 */
import type { Sandbox } from "./types.js";

/** `POST /v1/sandboxes/{id}/checkpoints` (the body is optional). */
export interface CheckpointRequest {
  /** A unique name for the checkpoint: retention keeps tagged ones, and a rewind or spawn can name it. */
  tag?: string | null;
}

/** One checkpoint of a sandbox's timeline. */
export interface Checkpoint {
  /** The snapshot holding it (`sn-…`): rewind to it, or spawn and branch from it. */
  id: string;
  tag?: string | null;
  /** The sandbox it was taken of. */
  sandbox: string;
  /** Its step number in the timeline, from 1. */
  seq: number;
  created_at: string;
  /** The snapshot it builds on: the previous checkpoint (or, for the first, the snapshot the sandbox started from). */
  parent?: string | null;
  /** How long the guest was stopped for it, in milliseconds. */
  pause_ms?: number | null;
  /** Bytes stored for it alone: memory pages changed since its parent, device state, its disk layer. */
  bytes: number;
  /** The sandbox runs from this one now, or from something built on it. */
  head: boolean;
}

/**
 * How many checkpoints a sandbox keeps (`PUT /v1/sandboxes/{id}/timeline/retention`).
 * Tagged and pinned ones are always kept, and so is the newest; one that
 * something else builds on stays until nothing does.
 */
export interface Retention {
  /** Keep the last N (1 or more). Absent: keep all. */
  keep_last?: number | null;
  /** Also keep every Kth by step number (1 or more). */
  keep_every?: number | null;
}

/** `GET /v1/sandboxes/{id}/timeline`: a sandbox's checkpoints. */
export interface Timeline {
  sandbox: string;
  /** The checkpoint its next one builds on. */
  head?: string | null;
  retention: Retention;
  /** Oldest first. */
  checkpoints: Checkpoint[];
  /** What the kept checkpoints store together, in bytes. */
  bytes: number;
}

/** `POST /v1/sandboxes/{id}/rewind`. */
export interface RewindRequest {
  /** The checkpoint or snapshot (id or tag) to go back to: one of the sandbox's own checkpoints, or a snapshot of its lineage. */
  to: string;
  /** Checkpoint the present first, so the rewind can itself be undone by rewinding to it. */
  checkpoint_first?: boolean;
}

/** What a rewind did. */
export interface Rewound {
  /** The same sandbox, now running from `to`. */
  sandbox: Sandbox;
  /** The snapshot it runs from now. */
  to: string;
  /** The checkpoint of the present taken first (`checkpoint_first`). */
  undo?: Checkpoint | null;
  /** Milliseconds from the request to the sandbox answering again. */
  rewind_ms: number;
}
