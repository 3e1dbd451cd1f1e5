// The page's copy of the daemon's state: images, snapshots and sandboxes by
// id, plus the history the charts draw (spawn and branch latencies seen since
// the page opened). The event stream and the actions write it; views
// subscribe and re-render once per animation frame however many events came.
import { useEffect, useState } from 'preact/hooks'
import type { BranchInfo, BranchMode, DaemonEvent, Image, PoolInfo, Sandbox, Snapshot, Timeline } from './types'

/** How the page hears about changes. */
export type Link =
  | { kind: 'connecting' }
  | { kind: 'live'; seq: number }
  | { kind: 'polling'; why: string }
  | { kind: 'offline'; why: string }

export interface BranchRecord {
  snapshot: string
  source: string
  mode: BranchMode | null
  count: number
  pause_ms: number | null
  total_ms: number | null
  at: number
}

export interface SpawnRecord {
  sandbox: string
  at: number
  total_ms: number
  from_pool: boolean
  restore: boolean
}

export class Store {
  images = new Map<string, Image>()
  snapshots = new Map<string, Snapshot>()
  sandboxes = new Map<string, Sandbox>()
  pools = new Map<string, PoolInfo>()
  branches = new Map<string, BranchRecord>()
  spawns = new Map<string, SpawnRecord>()
  /** Sandboxes' timelines (GET /v1/sandboxes/{id}/timeline), kept by timelines.ts. */
  timelines = new Map<string, Timeline>()
  link: Link = { kind: 'connecting' }
  loaded = false
  /** Bumped on every change; views compare it to know they are stale. */
  version = 0
  /** Bumped when images, snapshots or sandboxes change (not the link state):
   * the tree is rebuilt and laid out again only then. */
  dataVersion = 0
  private listeners = new Set<() => void>()
  private frame = 0

  subscribe(fn: () => void): () => void {
    this.listeners.add(fn)
    return () => this.listeners.delete(fn)
  }

  /** Note a change; listeners run once in the next animation frame. */
  changed(data = true) {
    this.version++
    if (data) this.dataVersion++
    if (this.frame) return
    const run = () => {
      this.frame = 0
      for (const fn of this.listeners) fn()
    }
    // A hidden tab gets no animation frames; a timer keeps it current.
    this.frame = document.hidden ? window.setTimeout(run, 50) : requestAnimationFrame(run)
  }

  setLink(link: Link) {
    this.link = link
    this.changed(false)
  }

  /** Replace everything with fresh lists (first load, reconnect, poll). */
  replaceAll(images: Image[], snapshots: Snapshot[], sandboxes: Sandbox[]) {
    this.images = new Map(images.map((i) => [i.name, i]))
    this.snapshots = new Map()
    for (const s of snapshots) this.putSnapshot(s)
    this.sandboxes = new Map()
    for (const s of sandboxes) this.putSandbox(s)
    for (const id of [...this.timelines.keys()]) if (!this.sandboxes.has(id)) this.timelines.delete(id)
    this.loaded = true
    this.changed()
  }

  putSandbox(s: Sandbox) {
    const old = this.sandboxes.get(s.id)
    // A list entry lacks the per-sandbox extras (memory, usage); keep the last ones seen.
    this.sandboxes.set(s.id, old ? { ...s, memory: s.memory ?? old.memory, usage: s.usage ?? old.usage } : s)
    if (s.timings && !this.spawns.has(s.id)) {
      this.spawns.set(s.id, {
        sandbox: s.id,
        at: Date.parse(s.created_at),
        total_ms: s.timings.total_ms,
        from_pool: !!s.timings.from_pool,
        restore: s.timings.restore_ms != null,
      })
    }
    this.changed()
  }

  putSnapshot(s: Snapshot) {
    this.snapshots.set(s.id, s)
    const pause = s.pause_ms ?? s.timings?.pause_ms ?? null
    if (s.origin === 'branch' || s.mode) {
      const old = this.branches.get(s.id)
      this.branches.set(s.id, {
        snapshot: s.id,
        source: s.source,
        mode: s.mode ?? old?.mode ?? null,
        count: old?.count ?? s.sandboxes.length,
        pause_ms: pause ?? old?.pause_ms ?? null,
        total_ms: s.timings?.total_ms ?? old?.total_ms ?? null,
        at: Date.parse(s.created_at),
      })
    }
    this.changed()
  }

  /** A finished branch (from the `branch` event or the page's own request). */
  putBranch(b: BranchInfo, at: number) {
    this.branches.set(b.snapshot, {
      snapshot: b.snapshot,
      source: b.source,
      mode: b.mode,
      count: b.count,
      pause_ms: b.pause_ms,
      total_ms: b.total_ms,
      at,
    })
    this.changed()
  }

  putTimeline(t: Timeline) {
    if (!this.sandboxes.has(t.sandbox)) return
    this.timelines.set(t.sandbox, t)
    this.changed()
  }

  /** A sandbox's checkpoints as snapshots (origin `checkpoint`, taken of it). */
  checkpointsOf(sandbox: string): Snapshot[] {
    const out: Snapshot[] = []
    for (const s of this.snapshots.values()) if (s.origin === 'checkpoint' && s.source === sandbox) out.push(s)
    return out
  }

  /** Branch mode and pause of a branch point, from whichever source has them. */
  branchOf(snapshotId: string): BranchRecord | undefined {
    return this.branches.get(snapshotId)
  }

  apply(e: DaemonEvent) {
    switch (e.kind) {
      case 'sandbox.created':
      case 'sandbox.updated':
        if (e.sandbox) this.putSandbox(e.sandbox)
        break
      case 'sandbox.deleted':
        this.sandboxes.delete(e.id)
        this.timelines.delete(e.id)
        break
      case 'snapshot.created':
      case 'snapshot.updated':
        if (e.snapshot) this.putSnapshot(e.snapshot)
        break
      case 'snapshot.deleted':
        this.snapshots.delete(e.id)
        break
      case 'image.created':
        if (e.image) this.images.set(e.image.name, e.image)
        break
      case 'image.deleted':
        this.images.delete(e.id)
        break
      case 'branch':
        if (e.branch) this.putBranch(e.branch, e.at_unix_ms)
        break
      case 'pool':
        if (e.pool) this.pools.set(e.pool.snapshot, e.pool)
        break
      default:
        // A kind this page does not know (a newer daemon): nothing to draw.
        return
    }
    if (this.link.kind === 'live') this.link = { kind: 'live', seq: e.seq }
    // A pool's ready count changes no node, only a badge (drawn from store.pools).
    this.changed(e.kind !== 'pool')
  }
}

export const store = new Store()

/** Re-render the calling component whenever the store changes. */
export function useStore(): Store {
  const [, setVersion] = useState(store.version)
  useEffect(() => store.subscribe(() => setVersion(store.version)), [])
  return store
}
