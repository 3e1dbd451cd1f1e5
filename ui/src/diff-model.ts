// What the Changes… and Merge into source… views need to know, kept apart
// from their markup: where a sandbox branched from and what to compare it
// with, how a change reads in one row, which directory to ask for one file's
// patch, and paging through long lists.
import { bytes } from './format'
import type { Store } from './store'
import type { ChangeKind, PathChange, PathState, Sandbox, Snapshot } from './types'

/** Where a sandbox was spawned from, and what its changes are measured against. */
export interface BranchPoint {
  /** The snapshot it was spawned from (its branch point). */
  point: Snapshot
  /** The sandbox the branch point was taken of, if it still exists. */
  source: Sandbox | null
  /** The other side of the diff: the source, or the branch point once the source is gone. */
  against: string
}

/**
 * The branch point of a sandbox spawned from a snapshot, or null for one
 * booted from an image (its boot template is not a branch point). A sandbox
 * that was paused or rewound runs from a snapshot of its own; as in the
 * tree (tree-model.ts), those are skipped to reach the one it came from.
 */
export function branchPointOf(store: Store, sb: Sandbox): BranchPoint | null {
  let s = sb.snapshot ? store.snapshots.get(sb.snapshot) : undefined
  for (let n = 0; s && s.source === sb.id && n < 4096; n++) s = s.parent ? store.snapshots.get(s.parent) : undefined
  if (!s || s.template) return null
  const source = store.sandboxes.get(s.source) ?? null
  return { point: s, source, against: source ? source.id : s.id }
}

/** `docker diff`'s letters, as the CLI prints them (docs/timetravel.md). */
export const LETTER: Record<ChangeKind, string> = { added: 'A', deleted: 'D', modified: 'C', mode: 'M', type: 'T' }
export const CHANGE_WORD: Record<ChangeKind, string> = {
  added: 'added',
  deleted: 'deleted',
  modified: 'changed',
  mode: 'mode changed',
  type: 'type changed',
}

export const octal = (m: number) => m.toString(8).padStart(3, '0')

function sizeOf(s: PathState | null | undefined): string {
  if (!s) return ''
  if (s.kind === 'dir') return 'dir'
  if (s.kind === 'symlink') return `→ ${s.symlink_target ?? '?'}`
  return bytes(s.size)
}

/** One side's value, or "old → new" when both sides have different ones. */
function both(a: string, b: string): string {
  return a && b && a !== b ? `${a} → ${b}` : b || a
}

/** The size and mode columns of a change (a: the source's side, b: the child's). */
export function sizeText(c: PathChange): string {
  return both(sizeOf(c.a), sizeOf(c.b))
}
export function modeText(c: PathChange): string {
  return both(c.a ? octal(c.a.mode) : '', c.b ? octal(c.b.mode) : '')
}

/** A change can have a text patch if a side is a regular file. */
export const mayHavePatch = (c: PathChange) => c.a?.kind === 'file' || c.b?.kind === 'file'

const parentOf = (p: string) => p.replace(/\/[^/]*$/, '') || '/'

/**
 * The directory to diff with `text: true` to get one file's patch. The
 * daemon's `path` must be a directory that both sides have (it lists it on
 * each), so this is the file's nearest ancestor that is not itself added,
 * deleted or of another type on one side; at most the diff's own root.
 */
export function patchScope(path: string, root: string, byPath: Map<string, PathChange>): string {
  let d = parentOf(path)
  while (d !== root && d.startsWith(root === '/' ? '/' : `${root}/`)) {
    const c = byPath.get(d)
    if (!c || (c.a?.kind === 'dir' && c.b?.kind === 'dir')) return d
    d = parentOf(d)
  }
  return root
}

/** Rows per page of the change lists: a page renders at once however long the list. */
export const PAGE = 100

/** Page `page` (from 0) of `items`, with where it starts and how many pages there are. */
export function pageOf<T>(items: T[], page: number, size = PAGE): { rows: T[]; page: number; pages: number; first: number } {
  const pages = Math.max(1, Math.ceil(items.length / size))
  const p = Math.min(Math.max(0, page), pages - 1)
  return { rows: items.slice(p * size, (p + 1) * size), page: p, pages, first: p * size }
}

/** Changes whose path contains `filter` (case-insensitive); all for an empty one. */
export function filterPaths<T extends { path: string }>(items: T[], filter: string): T[] {
  const f = filter.trim().toLowerCase()
  return f ? items.filter((c) => c.path.toLowerCase().includes(f)) : items
}
