// The buttons that change things: spawn, branch, snapshot, flatten, pool size,
// pause/resume and remove (time travel in time-travel.tsx, a branch child's
// changes and merge in changes.tsx). Each result is written into the store at once, so
// the tree shows it even before the event stream's copy arrives (applying
// both is harmless: the same object twice). Remove and flatten ask first.
import { useCallback, useState } from 'preact/hooks'
import { api } from './api'
import { ChangesAction } from './changes'
import { Dialog } from './dialog'
import { ms } from './format'
import { store } from './store'
import { TimeTravelActions } from './time-travel'
import type { TreeNode } from './tree-model'
import type { BranchMode } from './types'

type Kind = 'spawn' | 'branch' | 'snapshot' | 'flatten' | 'pool' | 'remove'

/** A one-line report of the last action, read out by screen readers. */
export function useNotice() {
  const [notice, setNotice] = useState<{ text: string; error: boolean } | null>(null)
  return { notice, setNotice }
}

interface Props {
  node: TreeNode
  /** After a sandbox or snapshot is removed (e.g. leave its page). */
  onRemoved?: () => void
  onNotice: (text: string, error?: boolean) => void
}

function clampCount(v: string, min: number): number {
  const n = Math.floor(Number(v))
  return Number.isFinite(n) ? Math.min(1000, Math.max(min, n)) : min
}

export function Actions({ node, onRemoved, onNotice }: Props) {
  const [open, setOpen] = useState<Kind | null>(null)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const [count, setCount] = useState('1')
  const [mode, setMode] = useState<BranchMode>('diff')
  const [tag, setTag] = useState('')
  const [pool, setPool] = useState('')
  const close = useCallback(() => {
    setOpen(null)
    setError(null)
    setBusy(false)
  }, [])

  const show = (k: Kind) => {
    setError(null)
    setTag('')
    setCount(k === 'branch' ? '3' : '1')
    if (k === 'pool') setPool(String(node.snapshot?.pool_size ?? 0))
    setOpen(k)
  }

  /** Run an action; keep the dialog open with the daemon's message on failure. */
  const run = async (what: () => Promise<string>) => {
    setBusy(true)
    setError(null)
    try {
      const text = await what()
      onNotice(text)
      close()
    } catch (err) {
      setBusy(false)
      setError((err as Error).message)
    }
  }

  const id = node.key
  const sb = node.sandbox
  const sn = node.snapshot
  const img = node.image

  const doSpawn = () =>
    run(async () => {
      const n = clampCount(count, 1)
      const t0 = performance.now()
      const made = await api.spawn(img ? { image: img.name } : { snapshot: id }, n)
      for (const s of made) store.putSandbox(s)
      return `Spawned ${made.map((s) => s.id).join(', ')} in ${ms(performance.now() - t0)}`
    })
  const doBranch = () =>
    run(async () => {
      const n = clampCount(count, 0)
      const r = await api.branch(id, mode, n, tag.trim() || undefined)
      store.putSnapshot({ ...r.snapshot, mode: r.snapshot.mode ?? r.mode, pause_ms: r.snapshot.pause_ms ?? r.pause_ms })
      for (const c of r.children) store.putSandbox(c)
      store.putBranch(
        {
          source: id,
          snapshot: r.snapshot.id,
          mode: r.mode,
          count: r.children.length,
          children: r.children.map((c) => c.id),
          pause_ms: r.pause_ms,
          total_ms: r.total_ms,
        },
        Date.now(),
      )
      return `Branched ${id} at ${r.snapshot.id} (${r.mode}) into ${r.children.length}: pause ${ms(r.pause_ms)}, total ${ms(r.total_ms)}`
    })
  const doSnapshot = () =>
    run(async () => {
      const s = await api.snapshotOf(id, tag.trim() || undefined)
      store.putSnapshot(s)
      return `Snapshot ${s.id} of ${id}${s.timings ? `: pause ${ms(s.timings.pause_ms)}` : ''}`
    })
  const doFlatten = () =>
    run(async () => {
      const s = await api.flatten(id, tag.trim() || undefined)
      store.putSnapshot({ ...s, flattened_from: s.flattened_from ?? id })
      return `Flattened ${id} into ${s.id}`
    })
  const doPool = () =>
    run(async () => {
      const size = pool.trim() === '' ? null : clampCount(pool, 0)
      await api.setPool(id, size)
      store.putSnapshot(await api.snapshot(id))
      return size === null ? `Pool of ${id} follows the daemon's default` : `Pool of ${id} set to ${size}`
    })
  const doRemove = () =>
    run(async () => {
      if (sb) {
        await api.removeSandbox(id)
        store.sandboxes.delete(id)
      } else {
        await api.removeSnapshot(id)
        store.snapshots.delete(id)
      }
      store.changed()
      onRemoved?.()
      return `Removed ${id}`
    })
  const direct = async (label: string, f: () => Promise<unknown>) => {
    setBusy(true)
    try {
      const r = await f()
      if (r && typeof r === 'object' && 'state' in r) store.putSandbox(r as never)
      onNotice(`${label} ${id}`)
    } catch (err) {
      onNotice(`${label} ${id} failed: ${(err as Error).message}`, true)
    } finally {
      setBusy(false)
    }
  }

  const running = sb?.state === 'running'
  return (
    <div class="actions" role="group" aria-label="Actions">
      {(img || sn) && (
        <button type="button" onClick={() => show('spawn')} disabled={sn ? sn.state !== 'ready' : false}>
          Spawn…
        </button>
      )}
      {sb && (
        <>
          {/* A paused sandbox branches from the state its pause saved. */}
          <button type="button" onClick={() => show('branch')} disabled={!running && sb.state !== 'paused'}>
            Branch…
          </button>
          <button type="button" onClick={() => show('snapshot')} disabled={!running}>
            Snapshot…
          </button>
          {sb.state === 'paused' ? (
            <button type="button" disabled={busy} onClick={() => direct('Resumed', () => api.resume(id))}>
              Resume
            </button>
          ) : (
            <button type="button" disabled={busy || !running} onClick={() => direct('Paused', () => api.pause(id))}>
              Pause
            </button>
          )}
          <TimeTravelActions sandbox={sb} onNotice={onNotice} />
          <ChangesAction sandbox={sb} onNotice={onNotice} />
        </>
      )}
      {/* A sandbox rewinds to its own checkpoints and snapshots (not a pause's saved state). */}
      {sn && sn.origin !== 'pause' && store.sandboxes.has(sn.source) && <TimeTravelActions target={sn} onNotice={onNotice} />}
      {sn && sn.kind === 'diff' && (
        <button type="button" onClick={() => show('flatten')}>
          Flatten…
        </button>
      )}
      {sn && (
        <button type="button" onClick={() => show('pool')}>
          Pool size…
        </button>
      )}
      {(sb || sn) && (
        <button type="button" class="danger" onClick={() => show('remove')}>
          Remove…
        </button>
      )}

      {open === 'spawn' && (
        <Dialog title={`Spawn from ${img ? `image ${img.name}` : id}`} confirm="Spawn" busy={busy} error={error} onConfirm={doSpawn} onClose={close}>
          <label>
            Count <input name="count" type="number" min={1} max={1000} value={count} onInput={(e) => setCount(e.currentTarget.value)} />
          </label>
          {img && <p class="hint">The first spawn of an image boots it and saves its boot template; later ones restore that.</p>}
        </Dialog>
      )}
      {open === 'branch' && (
        <Dialog title={`Branch ${id}`} confirm="Branch" busy={busy} error={error} onConfirm={doBranch} onClose={close}>
          <label>
            Mode{' '}
            <select name="mode" value={mode} onChange={(e) => setMode(e.currentTarget.value as BranchMode)}>
              <option value="diff">diff: the pages changed since its snapshot</option>
              <option value="live">live: copy RAM while the guest runs</option>
              <option value="full">full: stop, save everything</option>
            </select>
          </label>
          <label>
            Children <input name="count" type="number" min={0} max={1000} value={count} onInput={(e) => setCount(e.currentTarget.value)} />
          </label>
          <label>
            Tag (optional) <input name="tag" value={tag} onInput={(e) => setTag(e.currentTarget.value)} />
          </label>
          <p class="hint">0 children makes a branch point only; spawn from it later.</p>
        </Dialog>
      )}
      {open === 'snapshot' && (
        <Dialog title={`Snapshot ${id}`} confirm="Snapshot" busy={busy} error={error} onConfirm={doSnapshot} onClose={close}>
          <label>
            Tag (optional) <input name="tag" value={tag} onInput={(e) => setTag(e.currentTarget.value)} />
          </label>
        </Dialog>
      )}
      {open === 'flatten' && (
        <Dialog title={`Flatten ${id}?`} confirm="Flatten" busy={busy} error={error} onConfirm={doFlatten} onClose={close}>
          <p>
            This writes a new standalone snapshot holding the whole chain's memory ({sn?.depth ?? '?'} diff links), which takes disk space
            and time. The chain itself stays until you remove it.
          </p>
          <label>
            Tag (optional) <input name="tag" value={tag} onInput={(e) => setTag(e.currentTarget.value)} />
          </label>
        </Dialog>
      )}
      {open === 'pool' && (
        <Dialog title={`Warm pool of ${id}`} confirm="Set" busy={busy} error={error} onConfirm={doPool} onClose={close}>
          <label>
            QEMU processes kept ready <input name="size" type="number" min={0} max={1000} value={pool} onInput={(e) => setPool(e.currentTarget.value)} />
          </label>
          <p class="hint">Empty: follow the daemon's default. Each waiting process holds memory.</p>
        </Dialog>
      )}
      {open === 'remove' && (
        <Dialog title={`Remove ${id}?`} confirm="Remove" danger busy={busy} error={error} onConfirm={doRemove} onClose={close}>
          {sb ? (
            <p>The sandbox is stopped and its memory, disk and processes are deleted. This cannot be undone.</p>
          ) : (
            <p>The snapshot's files are deleted. The daemon refuses while sandboxes or other snapshots depend on it.</p>
          )}
        </Dialog>
      )}
    </div>
  )
}
