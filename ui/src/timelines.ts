// Keeps the store's copy of sandboxes' timelines (GET /v1/sandboxes/{id}/
// timeline) in step with the event stream. The events carry snapshots and
// sandboxes, not timelines, so the page fetches a sandbox's timeline again
// when something about its checkpoints may have changed:
//   snapshot.created / .updated / .deleted of a checkpoint (origin
//     `checkpoint`): a new step, a splice (a pruned middle step changes the
//     parent of the one above it), a prune;
//   sandbox.updated of a sandbox with checkpoints: the daemon notes one
//     after recording a checkpoint's step number (which comes after the
//     snapshot's `created`), after a retention change, and at each state
//     change of a rewind (paused, starting, running).
// Only sandboxes that have checkpoints are fetched, so a big tree without
// any costs nothing. One request per sandbox is in flight at a time; a
// change noted meanwhile fetches once more when it ends.
import { api, ApiError } from './api'
import { store } from './store'
import type { DaemonEvent, Snapshot } from './types'

const inFlight = new Set<string>()
const again = new Set<string>()

/** Fetch sandbox `id`'s timeline now (or once more after the current fetch). */
export function refreshTimeline(id: string): Promise<void> {
  if (inFlight.has(id)) {
    again.add(id)
    return Promise.resolve()
  }
  inFlight.add(id)
  return (async () => {
    try {
      do {
        again.delete(id)
        try {
          store.putTimeline(await api.timeline(id))
        } catch (err) {
          // Removed meanwhile: its `deleted` event follows.
          if (err instanceof ApiError && err.status === 404) {
            store.timelines.delete(id)
            store.changed()
          } else {
            console.warn(`forkvm: the timeline of ${id}:`, err)
          }
        }
      } while (again.has(id))
    } finally {
      inFlight.delete(id)
    }
  })()
}

const hasTimeline = (id: string) =>
  (store.timelines.get(id)?.checkpoints.length ?? 0) > 0 || store.checkpointsOf(id).length > 0

/** After the lists are (re)loaded: every sandbox with checkpoints. */
export function refreshAllTimelines() {
  const ids = new Set<string>()
  for (const s of store.snapshots.values()) if (s.origin === 'checkpoint') ids.add(s.source)
  for (const [id, t] of store.timelines) if (t.checkpoints.length > 0) ids.add(id)
  for (const id of ids) if (store.sandboxes.has(id)) void refreshTimeline(id)
}

/** Before an event is applied: the checkpoint a `deleted` removes (its source is gone after). */
export function beforeEvent(e: DaemonEvent): Snapshot | undefined {
  return e.kind === 'snapshot.deleted' ? store.snapshots.get(e.id) : undefined
}

/** After an event is applied: fetch the timeline it may have changed. */
export function afterEvent(e: DaemonEvent, removed: Snapshot | undefined) {
  const snap = e.snapshot ?? removed
  if (e.kind.startsWith('snapshot.') && snap?.origin === 'checkpoint') {
    if (store.sandboxes.has(snap.source)) void refreshTimeline(snap.source)
  } else if (e.kind === 'sandbox.updated' && hasTimeline(e.id)) {
    void refreshTimeline(e.id)
  }
}
