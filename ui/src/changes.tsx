// Changes… and Merge into source… on a sandbox spawned from a snapshot (a
// branch child). Changes… diffs it against its branch point's source sandbox
// (POST /v1/diff/{source} with b = the child; the branch point itself once
// the source is gone) under a path prefix, and fetches a text file's patch
// when asked. Merge into source… first runs a dry run (what would be
// applied, what conflicts), lets a strategy settle conflicts, then merges
// (POST /v1/sandboxes/{child}/merge). Errors, a 409's list of conflicts
// included, show in the dialog as every action's do.
import { useCallback, useEffect, useRef, useState } from 'preact/hooks'
import { api } from './api'
import { ChangeTable, ConflictTable } from './change-list'
import { Dialog } from './dialog'
import { branchPointOf, patchScope, type BranchPoint } from './diff-model'
import { ms } from './format'
import { store } from './store'
import type { Diff, Merged, MergeStrategy, PathChange, Sandbox } from './types'

const DEFAULT_PATH = '/root'

const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`

interface Props {
  sandbox: Sandbox
  onNotice: (text: string, error?: boolean) => void
}

/** The Changes… button (only on a branch child) and its dialog. */
export function ChangesAction({ sandbox, onNotice }: Props) {
  const [open, setOpen] = useState(false)
  const bp = branchPointOf(store, sandbox)
  const close = useCallback(() => setOpen(false), [])
  if (!bp) return null
  return (
    <>
      <button type="button" onClick={() => setOpen(true)} title={`What ${sandbox.id} changed in its files since it was branched`}>
        Changes…
      </button>
      {open && <ChangesDialog sandbox={sandbox} bp={bp} onNotice={onNotice} onClose={close} />}
    </>
  )
}

/** What a merge of the child into the source needs; null while showing the changes. */
type MergeState = { strategy: MergeStrategy | ''; plan: Merged | null; done: Merged | null }

function ChangesDialog({ sandbox, bp, onNotice, onClose }: Props & { bp: BranchPoint; onClose: () => void }) {
  const [typed, setTyped] = useState(DEFAULT_PATH)
  const [diff, setDiff] = useState<Diff | null>(null)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const [patches, setPatches] = useState(new Map<string, string | null | 'loading'>())
  const [shown, setShown] = useState(new Set<string>())
  const [merge, setMerge] = useState<MergeState | null>(null)
  // Answers that arrive after the dialog closed, or after a newer request, are dropped.
  const gen = useRef(0)
  useEffect(() => () => void (gen.current = -1), [])
  const child = sandbox.id
  const source = bp.source

  const compare = async (path: string) => {
    const g = ++gen.current
    setBusy(true)
    setError(null)
    try {
      const d = await api.diff(bp.against, child, path, false)
      if (g !== gen.current) return
      setDiff(d)
      setPatches(new Map())
      setShown(new Set())
    } catch (err) {
      if (g === gen.current) setError((err as Error).message)
    } finally {
      if (g === gen.current) setBusy(false)
    }
  }
  useEffect(() => void compare(DEFAULT_PATH), [])

  const togglePatch = async (c: PathChange) => {
    const next = new Set(shown)
    if (next.has(c.path)) {
      next.delete(c.path)
      setShown(next)
      return
    }
    next.add(c.path)
    setShown(next)
    if (!diff || patches.has(c.path)) return
    // One file's patch: the daemon diffs directories, so ask for the file's
    // directory with text and keep every patch that comes back.
    const scope = patchScope(c.path, diff.path, new Map(diff.changes.map((x) => [x.path, x])))
    const g = gen.current
    setPatches((m) => new Map(m).set(c.path, 'loading'))
    try {
      const d = await api.diff(bp.against, child, scope, true)
      if (g !== gen.current) return
      setPatches((m) => {
        const n = new Map(m)
        for (const x of d.changes) if (!n.has(x.path) || n.get(x.path) === 'loading') n.set(x.path, x.patch ?? null)
        if (n.get(c.path) === 'loading') n.set(c.path, null)
        return n
      })
    } catch (err) {
      if (g !== gen.current) return
      setPatches((m) => {
        const n = new Map(m)
        n.delete(c.path)
        return n
      })
      setShown((s) => {
        const n = new Set(s)
        n.delete(c.path)
        return n
      })
      setError(`patch of ${c.path}: ${(err as Error).message}`)
    }
  }

  /** A dry run with `strategy`: what a merge would apply, settle and leave. */
  const plan = async (strategy: MergeStrategy | '') => {
    if (!source || !diff) return
    const g = ++gen.current
    setMerge({ strategy, plan: null, done: null })
    setBusy(true)
    setError(null)
    try {
      const m = await api.merge(child, source.id, diff.path, strategy || null, true)
      if (g === gen.current) setMerge({ strategy, plan: m, done: null })
    } catch (err) {
      if (g === gen.current) setError((err as Error).message)
    } finally {
      if (g === gen.current) setBusy(false)
    }
  }
  const doMerge = async () => {
    if (!source || !diff || !merge) return
    const g = ++gen.current
    setBusy(true)
    setError(null)
    try {
      const m = await api.merge(child, source.id, diff.path, merge.strategy || null, false)
      if (g !== gen.current) return
      setMerge({ ...merge, done: m })
      const settled = m.settled.length ? `, ${count(m.settled.length, 'conflict')} settled (${merge.strategy})` : ''
      onNotice(`Merged ${count(m.applied.length, 'change')} of ${child} into ${m.into}${settled} in ${ms(m.merge_ms)}`)
    } catch (err) {
      if (g === gen.current) setError((err as Error).message)
    } finally {
      if (g === gen.current) setBusy(false)
    }
  }

  if (merge && source && diff) {
    const m = merge.done ?? merge.plan
    return (
      <Dialog
        wide
        title={merge.done ? `Merged ${child} into ${source.id}` : `Merge ${child} into ${source.id}?`}
        confirm={merge.done ? 'Done' : 'Merge'}
        cancel={merge.done ? 'Close' : 'Cancel'}
        busy={busy}
        error={error}
        onConfirm={merge.done ? onClose : doMerge}
        onClose={onClose}
      >
        {!merge.done && (
          <>
            <p>
              Applies the changes {child} made under <span class="mono">{diff.path}</span> since its branch point to the running {source.id}, three-way: a
              path both changed differently is a conflict. All or nothing; {source.id}'s processes keep what they hold in memory.
            </p>
            <fieldset class="strategy">
              <legend>Conflicts</legend>
              {(
                [
                  ['', 'none: refuse the merge if any remain'],
                  ['ours', `ours: keep ${source.id}'s version`],
                  ['theirs', `theirs: take ${child}'s version`],
                  ['text', 'text: merge text files line by line'],
                ] as [MergeStrategy | '', string][]
              ).map(([v, label]) => (
                <label class="check">
                  <input type="radio" name="strategy" value={v} checked={merge.strategy === v} disabled={busy} onChange={() => void plan(v)} /> {label}
                </label>
              ))}
            </fieldset>
          </>
        )}
        {!merge.done && (
          <button
            type="button"
            onClick={() => {
              gen.current++
              setBusy(false)
              setError(null)
              setMerge(null)
            }}
          >
            ← Back to the changes
          </button>
        )}
        {!m && busy && <p class="muted">Dry run…</p>}
        {m && (
          <div data-testid="merge-result">
            <p>
              {merge.done ? 'Applied' : 'Would apply'} {count(m.applied.length, 'change')} (base <span class="mono">{m.base}</span>)
              {m.settled.length ? `, ${count(m.settled.length, 'conflict')} settled by ${merge.strategy}` : ''}
              {m.conflicts.length ? `; ${count(m.conflicts.length, 'conflict')} left, so the merge would be refused` : ''}
              {merge.done ? ` in ${ms(m.merge_ms)}.` : '.'}
            </p>
            {m.base !== bp.point.id && (
              <p class="warn">
                The daemon merges the changes since <span class="mono">{m.base}</span>, the snapshot {child} runs from now (after a pause or rewind), not
                since its branch point {bp.point.id}.
              </p>
            )}
            {m.conflicts.length > 0 && <h3>Conflicts</h3>}
            <ConflictTable caption="Conflicts that remain" conflicts={m.conflicts} testid="merge-conflicts" />
            {m.settled.length > 0 && (
              <>
                <h3>Settled conflicts ({merge.strategy})</h3>
                <ConflictTable caption="Conflicts settled by the strategy" conflicts={m.settled} testid="merge-settled" />
              </>
            )}
            <h3>{merge.done ? 'Applied' : 'To apply'}</h3>
            <ChangeTable caption={merge.done ? 'Changes applied' : 'Changes to apply'} changes={m.applied} testid="merge-applied" />
          </div>
        )}
      </Dialog>
    )
  }

  const mergeBlocked = !source
    ? `the source ${bp.point.source} is gone`
    : source.state !== 'running'
      ? `the source ${source.id} is ${source.state} (a merge changes a running sandbox)`
      : null
  return (
    <Dialog wide title={`Changes of ${child}`} confirm="Compare" cancel="Close" busy={busy} error={error} onConfirm={() => void compare(typed.trim() || '/')} onClose={onClose}>
      <p>
        Against {source ? <>its source <span class="mono">{source.id}</span></> : <>its branch point <span class="mono">{bp.point.id}</span> (the source is gone)</>}
        : A added, D deleted, C changed, M mode, T type, as {child} has them.
      </p>
      <label>
        Path prefix <input name="path" class="mono" value={typed} onInput={(e) => setTyped(e.currentTarget.value)} />
      </label>
      {busy && !diff && <p class="muted">Comparing…</p>}
      {diff && (
        <>
          <p class="muted" data-testid="diff-summary">
            Under <span class="mono">{diff.path}</span>: {diff.stats.added} added, {diff.stats.deleted} deleted, {diff.stats.modified} changed,{' '}
            {diff.stats.other} mode or type; {diff.entries} entries compared, {diff.contents_read} read, in {ms(diff.diff_ms)}.
          </p>
          <ChangeTable caption={`Changes of ${child} under ${diff.path}`} changes={diff.changes} patches={patches} open={shown} onPatch={togglePatch} testid="changes" />
          <p>
            <button type="button" onClick={() => void plan('')} disabled={busy || !!mergeBlocked} title={mergeBlocked ?? undefined}>
              Merge into source…
            </button>
            {mergeBlocked && <span class="hint"> Merge is not possible: {mergeBlocked}.</span>}
          </p>
        </>
      )}
    </Dialog>
  )
}
