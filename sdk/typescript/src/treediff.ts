/**
 * Wire types of filesystem diff and merge (schemas of docs/openapi.json,
 * re-exported by `types.ts` so that they are part of `api`).
 *
 * A diff lists the filesystem differences between two sandboxes, snapshots
 * or checkpoints of one lineage: added, deleted and modified paths, mode-only
 * and type changes, each with what both sides have there, and with `text` a
 * unified diff of each text file. A merge applies a child's changes since
 * its branch point to a running sandbox (usually the branch source),
 * three-way against that branch point; paths both changed differently are
 * conflicts. `Conflict` here is a merge conflict; the error a refused merge
 * rejects with is a `ConflictError` (HTTP 409) whose message lists them.
 *
 * @module
 */

/** `POST /v1/diff/{a}`: compare `a` with `b`. */
export interface DiffRequest {
  /** The other side: a sandbox, snapshot or checkpoint (id or tag). */
  b: string;
  /** Only paths under this absolute directory (default `/`, without /proc, /sys, /dev and /run). */
  path?: string | null;
  /** Also give a unified diff of each text file (UTF-8, at most 1 MiB a side). */
  text?: boolean;
}

/** What happened to a path: `mode` is a change of permission bits only, `type` of kind. */
export type ChangeKind = "added" | "deleted" | "modified" | "mode" | "type";

/** What one side has at a path. */
export interface PathState {
  /** `file`, `dir`, `symlink` or `other`. */
  kind: string;
  size: number;
  /** Permission bits (`mode & 0o7777`). */
  mode: number;
  symlink_target?: string | null;
}

/** One difference. */
export interface PathChange {
  /** Absolute path. */
  path: string;
  change: ChangeKind;
  /** What `a` has there (absent: nothing). */
  a?: PathState | null;
  /** What `b` has there. */
  b?: PathState | null;
  /** A unified diff (`text: true`, text files only). */
  patch?: string | null;
}

/** Counts of a diff, as `git diff --stat` sums them. */
export interface DiffStats {
  added: number;
  deleted: number;
  modified: number;
  /** Mode and type changes. */
  other: number;
}

/** What a diff found. */
export interface Diff {
  a: string;
  b: string;
  path: string;
  /** Sorted by path. */
  changes: PathChange[];
  stats: DiffStats;
  /** Entries compared (both sides). */
  entries: number;
  /** Files whose contents were read to decide (their metadata alone could not). */
  contents_read: number;
  diff_ms: number;
}

/** How a merge settles conflicts: keep the target's version, take the child's, or merge text files line by line. */
export type MergeStrategy = "ours" | "theirs" | "text";

/** `POST /v1/sandboxes/{id}/merge`: apply sandbox `id`'s changes since its branch point to `into`. */
export interface MergeRequest {
  /** The running sandbox to change (usually the branch source). */
  into: string;
  /** Only paths under this absolute directory (default `/`, as for diff). */
  path?: string | null;
  /** How to settle conflicts; without one, a conflict refuses the merge. */
  strategy?: MergeStrategy | null;
  /** Plan and report, change nothing. */
  dry_run?: boolean;
}

/** A path both sides changed differently since the branch point. */
export interface Conflict {
  path: string;
  /** What the branch point had (absent: nothing). */
  base?: PathState | null;
  /** What the target has now. */
  ours?: PathState | null;
  /** What the child has now. */
  theirs?: PathState | null;
  /** Why it is one, in words. */
  reason: string;
}

/** What a merge did. */
export interface Merged {
  child: string;
  into: string;
  /** The branch point both descend from. */
  base: string;
  /** The changes applied to `into` (or, in a dry run, to be applied). */
  applied: PathChange[];
  /** Conflicts settled by the strategy. */
  settled: Conflict[];
  /** Conflicts left (a dry run only: a merge with any is refused, 409). */
  conflicts: Conflict[];
  dry_run: boolean;
  merge_ms: number;
}
