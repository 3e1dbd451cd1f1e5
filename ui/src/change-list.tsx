// The lists of the Changes… and Merge… dialogs: a table of path changes (or
// of conflicts), one page of PAGE rows at a time with a path filter, so that
// ten thousand entries cost what a hundred do. Paging rather than a
// virtual scroller keeps every row a plain table row that Tab and screen
// readers reach.
import type { ComponentChildren } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { CHANGE_WORD, filterPaths, LETTER, mayHavePatch, modeText, pageOf, sizeText } from './diff-model'
import type { Conflict, PathChange } from './types'

/** A patch line's colour: added, deleted, or a hunk header. */
function lineClass(line: string): string {
  if (line.startsWith('+++') || line.startsWith('---')) return ''
  return line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : line.startsWith('@@') ? 'hunk' : ''
}

/** The page and filter of one list, and the bar that moves them. */
function usePaging<T extends { path: string }>(items: T[]) {
  const [page, setPage] = useState(0)
  const [filter, setFilter] = useState('')
  useEffect(() => setPage(0), [items, filter])
  const shown = filterPaths(items, filter)
  const p = pageOf(shown, page)
  return { p, shown, filter, setFilter, setPage }
}

interface BarProps {
  label: string
  total: number
  shown: number
  first: number
  rows: number
  page: number
  pages: number
  filter: string
  setFilter: (f: string) => void
  setPage: (p: number) => void
}

function Bar(b: BarProps) {
  if (b.total <= 10) return null
  return (
    <div class="list-bar">
      <label>
        Filter {b.label} <input
          name="filter"
          class="mono"
          value={b.filter}
          onInput={(e) => b.setFilter(e.currentTarget.value)}
          // Enter would submit the dialog's form (compare, merge); the filter applies as typed.
          onKeyDown={(e) => e.key === 'Enter' && e.preventDefault()}
        />
      </label>
      <span class="muted" role="status">
        {b.shown ? `${b.first + 1}–${b.first + b.rows} of ${b.shown}` : 'none'}
        {b.shown !== b.total ? ` (of ${b.total})` : ''}
      </span>
      {b.pages > 1 && (
        <>
          <button type="button" onClick={() => b.setPage(b.page - 1)} disabled={b.page === 0}>
            Previous
          </button>
          <button type="button" onClick={() => b.setPage(b.page + 1)} disabled={b.page >= b.pages - 1}>
            Next
          </button>
        </>
      )}
    </div>
  )
}

interface ChangesProps {
  caption: string
  changes: PathChange[]
  /** A file's patch: undefined not asked yet, null none (binary, too big), 'loading'. */
  patches?: Map<string, string | null | 'loading'>
  /** Show or hide a file's patch (absent: no patch column). */
  onPatch?: (c: PathChange) => void
  open?: Set<string>
  testid?: string
}

export function ChangeTable({ caption, changes, patches, onPatch, open, testid }: ChangesProps) {
  const { p, shown, filter, setFilter, setPage } = usePaging(changes)
  const cols = onPatch ? 5 : 4
  return (
    <div>
      <Bar label="paths" total={changes.length} shown={shown.length} first={p.first} rows={p.rows.length} page={p.page} pages={p.pages} filter={filter} setFilter={setFilter} setPage={setPage} />
      <table class="change-table" data-testid={testid}>
        <caption class="visually-hidden">{caption}</caption>
        <thead>
          <tr>
            <th scope="col" class="letter" title="A added, D deleted, C changed, M mode, T type">
              Change
            </th>
            <th scope="col">Size</th>
            <th scope="col">Mode</th>
            <th scope="col">Path</th>
            {onPatch && <th scope="col">Patch</th>}
          </tr>
        </thead>
        <tbody>
          {p.rows.map((c) => {
            const isOpen = open?.has(c.path) ?? false
            const patch = patches?.get(c.path)
            const rowId = `patch-${c.path}`
            const rows: ComponentChildren[] = [
              <tr key={c.path} data-path={c.path}>
                <td class={`letter l-${c.change}`}>
                  <abbr title={CHANGE_WORD[c.change]}>{LETTER[c.change]}</abbr>
                  <span class="visually-hidden"> {CHANGE_WORD[c.change]}</span>
                </td>
                <td>{sizeText(c)}</td>
                <td class="mono">{modeText(c)}</td>
                <td class="mono path">{c.path}</td>
                {onPatch && (
                  <td>
                    {mayHavePatch(c) && (
                      <button type="button" class="small" aria-expanded={isOpen} aria-controls={isOpen ? rowId : undefined} onClick={() => onPatch(c)}>
                        {isOpen ? 'Hide' : 'Patch'}
                        <span class="visually-hidden"> of {c.path}</span>
                      </button>
                    )}
                  </td>
                )}
              </tr>,
            ]
            if (isOpen) {
              rows.push(
                <tr key={`${c.path}\0patch`} class="patch-row">
                  <td colSpan={cols}>
                    <div id={rowId}>
                      {patch === 'loading' || patch === undefined ? (
                        <p class="muted">Loading the patch…</p>
                      ) : patch === null ? (
                        <p class="muted">No text patch: not a UTF-8 text file on both sides, or over 1 MiB a side.</p>
                      ) : (
                        <pre class="patch" tabIndex={0} aria-label={`Patch of ${c.path}`} data-testid="patch">
                          {patch.split('\n').map((line) => (
                            <span class={lineClass(line)}>
                              {line}
                              {'\n'}
                            </span>
                          ))}
                        </pre>
                      )}
                    </div>
                  </td>
                </tr>,
              )
            }
            return rows
          })}
        </tbody>
      </table>
      {changes.length === 0 && <p class="muted">No differences.</p>}
    </div>
  )
}

export function ConflictTable({ caption, conflicts, testid }: { caption: string; conflicts: Conflict[]; testid?: string }) {
  const { p, shown, filter, setFilter, setPage } = usePaging(conflicts)
  if (conflicts.length === 0) return null
  return (
    <div>
      <Bar label="conflicts" total={conflicts.length} shown={shown.length} first={p.first} rows={p.rows.length} page={p.page} pages={p.pages} filter={filter} setFilter={setFilter} setPage={setPage} />
      <table class="change-table" data-testid={testid}>
        <caption class="visually-hidden">{caption}</caption>
        <thead>
          <tr>
            <th scope="col">Path</th>
            <th scope="col">Why</th>
          </tr>
        </thead>
        <tbody>
          {p.rows.map((c) => (
            <tr key={c.path} data-path={c.path}>
              <td class="mono path">{c.path}</td>
              <td>{c.reason}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  )
}
