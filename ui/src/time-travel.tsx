// The time-travel actions: Checkpoint… and Retention… on a sandbox, Rewind
// here… on one of its checkpoints. Like the other actions (actions.tsx), each
// asks in a dialog, shows the daemon's error there, reports its result in the
// notice line, and writes what it got back into the store at once; the event
// stream's copies follow. The timeline is fetched again after each, since no
// event carries it.
import { useCallback, useState } from 'preact/hooks'
import { api } from './api'
import { Dialog } from './dialog'
import { bytes, ms } from './format'
import { store } from './store'
import { stepsOf } from './timeline-model'
import { refreshTimeline } from './timelines'
import type { Sandbox, Snapshot } from './types'

type Kind = 'checkpoint' | 'retention' | 'rewind'

interface Props {
  /** A sandbox: Checkpoint… and Retention…. */
  sandbox?: Sandbox
  /** A checkpoint (or other snapshot) of a sandbox that exists: Rewind here…. */
  target?: Snapshot
  onNotice: (text: string, error?: boolean) => void
}

/** A positive count from a field; empty means none; anything else is an error. */
function count(v: string, what: string): number | null {
  const t = v.trim()
  if (t === '') return null
  const n = Number(t)
  if (!Number.isInteger(n) || n < 1) throw new Error(`${what} must be a whole number of 1 or more, or empty`)
  return n
}

export function TimeTravelActions({ sandbox, target, onNotice }: Props) {
  const [open, setOpen] = useState<Kind | null>(null)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const [tag, setTag] = useState('')
  const [keepLast, setKeepLast] = useState('')
  const [keepEvery, setKeepEvery] = useState('')
  const [first, setFirst] = useState(true)
  const close = useCallback(() => {
    setOpen(null)
    setError(null)
    setBusy(false)
  }, [])

  const owner = target ? store.sandboxes.get(target.source) : sandbox
  const show = (k: Kind) => {
    setError(null)
    setTag('')
    setFirst(true)
    if (k === 'retention' && sandbox) {
      const r = store.timelines.get(sandbox.id)?.retention
      setKeepLast(r?.keep_last != null ? String(r.keep_last) : '')
      setKeepEvery(r?.keep_every != null ? String(r.keep_every) : '')
    }
    setOpen(k)
  }
  const run = async (what: () => Promise<string>) => {
    setBusy(true)
    setError(null)
    try {
      onNotice(await what())
      close()
    } catch (err) {
      setBusy(false)
      setError((err as Error).message)
    }
  }

  const doCheckpoint = () =>
    run(async () => {
      const id = sandbox!.id
      const c = await api.checkpoint(id, tag.trim() || undefined)
      store.putSnapshot(await api.snapshot(c.id))
      await refreshTimeline(id)
      return `Checkpoint ${c.id} (step ${c.seq}) of ${id}: pause ${ms(c.pause_ms)}, ${bytes(c.bytes)} stored`
    })
  const doRetention = () =>
    run(async () => {
      const id = sandbox!.id
      const r = { keep_last: count(keepLast, 'Keep last'), keep_every: count(keepEvery, 'Keep every') }
      const t = await api.setRetention(id, r)
      store.putTimeline(t)
      const what = r.keep_last == null && r.keep_every == null ? 'keeps all' : `keeps last ${r.keep_last ?? 'all'}${r.keep_every ? `, every ${r.keep_every}th` : ''}`
      return `Retention of ${id}: ${what}; ${t.checkpoints.length} checkpoints kept (${bytes(t.bytes)})`
    })
  const doRewind = () =>
    run(async () => {
      const id = owner!.id
      const r = await api.rewind(id, target!.id, first)
      store.putSandbox(r.sandbox)
      if (r.undo) store.putSnapshot(await api.snapshot(r.undo.id))
      await refreshTimeline(id)
      const undo = r.undo ? `; the present was saved as ${r.undo.id} (step ${r.undo.seq})` : ''
      return `Rewound ${id} to ${r.to} in ${ms(r.rewind_ms)}${undo}`
    })

  const running = owner?.state === 'running'
  const step = target ? stepsOf(store, target.source).steps.find((s) => s.id === target.id) : undefined
  const targetName = target ? `${step?.seq != null ? `step ${step.seq} ` : ''}(${target.tag ?? target.id})` : ''
  return (
    <>
      {sandbox && (
        <>
          <button type="button" onClick={() => show('checkpoint')} disabled={!running} title="Save its present state as the next step of its timeline">
            Checkpoint…
          </button>
          <button type="button" onClick={() => show('retention')} title="How many checkpoints it keeps">
            Retention…
          </button>
        </>
      )}
      {target && owner && (
        <button type="button" onClick={() => show('rewind')} disabled={!running} title={`Bring ${owner.id} back to this state`}>
          Rewind here…
        </button>
      )}

      {open === 'checkpoint' && sandbox && (
        <Dialog title={`Checkpoint ${sandbox.id}`} confirm="Checkpoint" busy={busy} error={error} onConfirm={doCheckpoint} onClose={close}>
          <label>
            Tag (optional) <input name="tag" value={tag} onInput={(e) => setTag(e.currentTarget.value)} />
          </label>
          <p class="hint">It stores only what changed since its previous checkpoint; the guest stops only for the final copy. Retention keeps tagged ones.</p>
        </Dialog>
      )}
      {open === 'retention' && sandbox && (
        <Dialog title={`Retention of ${sandbox.id}`} confirm="Set" busy={busy} error={error} onConfirm={doRetention} onClose={close}>
          <label>
            Keep last <input name="keep_last" type="number" min={1} value={keepLast} onInput={(e) => setKeepLast(e.currentTarget.value)} />
          </label>
          <label>
            Keep every <input name="keep_every" type="number" min={1} value={keepEvery} onInput={(e) => setKeepEvery(e.currentTarget.value)} />
          </label>
          <p class="hint">
            Empty keeps all. Tagged and pinned checkpoints, the newest and those something builds on are always kept. It applies now and after
            every checkpoint: the others are deleted.
          </p>
        </Dialog>
      )}
      {open === 'rewind' && target && owner && (
        <Dialog title={`Rewind ${owner.id} to ${targetName}?`} confirm="Rewind" busy={busy} error={error} onConfirm={doRewind} onClose={close}>
          <p>
            The sandbox keeps its id, network and ports; its processes, memory and disk become those of {target.id}. What it runs now is lost unless
            it is checkpointed first.
          </p>
          <label class="check">
            <input name="checkpoint_first" type="checkbox" checked={first} onChange={(e) => setFirst(e.currentTarget.checked)} /> Checkpoint the present
            first (so this rewind can be undone)
          </label>
        </Dialog>
      )}
    </>
  )
}
