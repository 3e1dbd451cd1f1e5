// Keeps the store in step with the daemon through GET /v1/events (Server-Sent
// Events). Each `ready` message (the first of every connection) reloads the
// three lists, because after a reconnect the page cannot know what it missed.
// Events that arrive while those lists load are held back and their objects
// fetched again afterwards, so an event older than the list never overwrites
// a newer state.
//
// A daemon without the stream (older builds) makes EventSource fail for good;
// the page then polls the lists and says so in the header ("polling"), so a
// missing stream is visible rather than papered over.
import { api, ApiError, toLogin } from './api'
import { store } from './store'
import { afterEvent, beforeEvent, refreshAllTimelines } from './timelines'
import type { DaemonEvent } from './types'

const KINDS = [
  'sandbox.created',
  'sandbox.updated',
  'sandbox.deleted',
  'snapshot.created',
  'snapshot.updated',
  'snapshot.deleted',
  'branch',
  'pool',
  'image.created',
  'image.deleted',
]
const POLL_MS = 3000

let source: EventSource | null = null
let pollTimer = 0
let loading: DaemonEvent[] | null = null

async function loadLists() {
  const [images, snapshots, sandboxes] = await Promise.all([api.images(), api.snapshots(), api.sandboxes()])
  performance.mark('forkvm:lists-loaded')
  store.replaceAll(images, snapshots, sandboxes)
  refreshAllTimelines()
}

async function refetch(e: DaemonEvent) {
  try {
    if (e.kind.startsWith('sandbox.') && e.kind !== 'sandbox.deleted') {
      store.putSandbox(await api.sandbox(e.id))
      afterEvent(e, undefined)
    } else if (e.kind.startsWith('snapshot.') && e.kind !== 'snapshot.deleted') {
      store.putSnapshot(await api.snapshot(e.id))
      afterEvent(e, undefined)
    } else applyEvent(e)
  } catch (err) {
    // Gone again since the event: the deletion event follows in the stream.
    if (!(err instanceof ApiError && err.status === 404)) throw err
  }
}

async function onReady(seq: number) {
  performance.mark('forkvm:stream-ready')
  loading = []
  try {
    await loadLists()
    const held = loading
    loading = null
    for (const e of held) await refetch(e)
    store.setLink({ kind: 'live', seq })
  } catch (err) {
    loading = null
    store.setLink({ kind: 'offline', why: String((err as Error).message ?? err) })
  }
}

function onEvent(msg: MessageEvent) {
  let e: DaemonEvent
  try {
    e = JSON.parse(msg.data)
  } catch {
    console.warn('forkvm: an event that is not JSON', msg.data)
    return
  }
  if (loading) loading.push(e)
  else applyEvent(e)
}

/** Apply one event to the store, and fetch the timeline it may have changed. */
function applyEvent(e: DaemonEvent) {
  const removed = beforeEvent(e)
  store.apply(e)
  afterEvent(e, removed)
}

/** Why the stream failed: a 401 goes to the login page; else fall back to polling. */
async function onStreamError() {
  if (source && source.readyState === EventSource.CONNECTING) {
    // EventSource retries by itself (with Last-Event-ID); say so meanwhile.
    store.setLink({ kind: 'connecting' })
    return
  }
  source?.close()
  source = null
  try {
    await api.info()
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) toLogin()
    store.setLink({ kind: 'offline', why: (err as Error).message })
  }
  startPolling('the daemon has no event stream (GET /v1/events failed)')
}

function startPolling(why: string) {
  store.setLink({ kind: 'polling', why })
  const tick = async () => {
    try {
      await loadLists()
      if (store.link.kind !== 'polling') store.setLink({ kind: 'polling', why })
    } catch (err) {
      store.setLink({ kind: 'offline', why: (err as Error).message })
    }
    pollTimer = window.setTimeout(tick, POLL_MS)
  }
  void tick()
}

export function connect() {
  if (source || pollTimer) return
  source = new EventSource('/v1/events', { withCredentials: true })
  source.addEventListener('ready', (m) => {
    let seq = 0
    try {
      seq = JSON.parse((m as MessageEvent).data).seq ?? 0
    } catch {
      // A ready without a body still means the stream is up.
    }
    void onReady(seq)
  })
  for (const k of KINDS) source.addEventListener(k, onEvent as EventListener)
  source.onerror = () => void onStreamError()
}
