// A sandbox's timeline as the page draws it: the steps of GET .../timeline
// (step number, size, pause, head), joined with the checkpoint snapshots the
// event stream brought since it was fetched (a new one shows at once, its
// number once the timeline is fetched again; a pruned one goes at once).
import type { Store } from './store'
import type { Retention } from './types'

export interface Step {
  id: string
  /** Its step number; null until the timeline is fetched again. */
  seq: number | null
  tag: string | null
  /** Bytes stored for it alone (null: not fetched yet). */
  bytes: number | null
  pause_ms: number | null
  head: boolean
  created_at: string
}

export interface Steps {
  sandbox: string
  steps: Step[]
  retention: Retention | null
  /** What the kept steps store together, as far as known. */
  bytes: number | null
}

export function stepsOf(store: Store, sandbox: string): Steps {
  const t = store.timelines.get(sandbox)
  const snaps = store.checkpointsOf(sandbox)
  const live = new Set(snaps.map((s) => s.id))
  const steps: Step[] = []
  const known = new Set<string>()
  for (const c of t?.checkpoints ?? []) {
    known.add(c.id)
    // Gone from the snapshot list: pruned since the timeline was fetched.
    if (store.loaded && !live.has(c.id)) continue
    const snap = store.snapshots.get(c.id)
    steps.push({
      id: c.id,
      seq: c.seq,
      tag: snap?.tag ?? c.tag ?? null,
      bytes: c.bytes,
      pause_ms: c.pause_ms ?? null,
      head: c.head,
      created_at: c.created_at,
    })
  }
  const fresh = snaps.filter((s) => !known.has(s.id)).sort((a, b) => Date.parse(a.created_at) - Date.parse(b.created_at))
  for (const s of fresh) {
    steps.push({ id: s.id, seq: null, tag: s.tag ?? null, bytes: null, pause_ms: s.pause_ms ?? s.timings?.pause_ms ?? null, head: false, created_at: s.created_at })
  }
  // A new checkpoint becomes the head; until the timeline says so, the newest one is.
  if (fresh.length > 0) {
    for (const s of steps) s.head = false
    steps[steps.length - 1].head = true
  }
  const all = steps.every((s) => s.bytes != null)
  return {
    sandbox,
    steps,
    retention: t?.retention ?? null,
    bytes: all ? steps.reduce((a, s) => a + (s.bytes ?? 0), 0) : null,
  }
}

export function retentionText(r: Retention | null): string {
  if (!r || (r.keep_last == null && r.keep_every == null)) return 'keeps all'
  const parts = []
  if (r.keep_last != null) parts.push(`keeps last ${r.keep_last}`)
  if (r.keep_every != null) parts.push(`every ${r.keep_every}th`)
  return parts.join(', ')
}

/** The label of a step: its number (`#3`), or `new` until it is known. */
export const stepName = (s: Step) => (s.seq != null ? `#${s.seq}` : 'new')
