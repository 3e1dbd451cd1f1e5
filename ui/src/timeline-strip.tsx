// The inside of a timeline row of the tree: a line saying how many steps the
// sandbox's timeline has, what they store and what it keeps, then a chain of
// step markers, oldest left, the head filled. Only the newest steps that fit
// the row (SHOWN at most) are drawn; older ones fold into a "+N" marker (the
// details panel lists them all), except the head, which is always drawn, so
// a tree with fifty checkpoints still takes one row per sandbox.
//
// The markers are not focusable (the row is one tree item); a click selects
// a step, and the details panel then offers its actions to the keyboard too.
import { bytes, ms } from './format'
import type { Store } from './store'
import { retentionText, stepName, stepsOf, type Step } from './timeline-model'

export const SHOWN = 10
/** A marker's width in pixels, a little over (11 px text, padding, border, gap; a tag shows 6em at most). */
const markerWidth = (s: Step) => 17 + 6.5 * stepName(s).length + (s.tag ? 4 + Math.min(66, 7 * s.tag.length) : 0)
const MORE_W = 38
const GAP_W = 14

/** The newest steps that fit beside the "+N" marker and a folded head (at least one). */
function fit(steps: Step[], room: number): { newest: Step[]; older: Step[] } {
  const n = steps.length
  let k = 0
  let used = 0
  while (k < Math.min(n, SHOWN)) {
    const next = steps[n - 1 - k]
    const rest = steps.slice(0, n - 1 - k)
    const head = rest.find((s) => s.head)
    const extra = (rest.length > (head ? 1 : 0) ? MORE_W : 0) + (head ? markerWidth(head) + GAP_W : 0)
    if (k > 0 && used + markerWidth(next) + extra > room) break
    used += markerWidth(next)
    k++
  }
  return { newest: steps.slice(n - k), older: steps.slice(0, n - k) }
}

interface Props {
  store: Store
  sandbox: string
  /** The row's width in pixels (layout.ts). */
  width: number
  selected: string | null
  onPick: (key: string) => void
}

function stepTitle(s: Step): string {
  return [
    `step ${s.seq ?? '(new)'}`,
    s.tag ? `tag ${s.tag}` : null,
    s.bytes != null ? `stores ${bytes(s.bytes)}` : null,
    s.pause_ms != null ? `paused ${ms(s.pause_ms)}` : null,
    s.head ? 'head: the next checkpoint builds on it' : null,
    s.id,
  ]
    .filter(Boolean)
    .join(' · ')
}

export function TimelineStrip({ store, sandbox, width, selected, onPick }: Props) {
  const t = stepsOf(store, sandbox)
  const n = t.steps.length
  // Room for markers: the row less its padding and borders.
  const { newest, older } = fit(t.steps, width - 22)
  const oldHead = older.find((s) => s.head)
  const marker = (s: Step) => (
    <span
      key={s.id}
      class={`step${s.head ? ' head' : ''}${s.tag ? ' tagged' : ''}${s.id === selected ? ' picked' : ''}`}
      title={stepTitle(s)}
      data-step={s.seq ?? ''}
      data-id={s.id}
      onClick={(e) => {
        e.stopPropagation()
        onPick(s.id)
      }}
    >
      {stepName(s)}
      {s.tag && <span class="step-tag">{s.tag}</span>}
      {s.head && <span class="visually-hidden"> (head)</span>}
    </span>
  )
  return (
    <>
      <span class="node-name">
        <span class="visually-hidden">Timeline of {sandbox}: </span>
        {n} checkpoint{n === 1 ? '' : 's'}
        <span class="muted">
          {' '}
          · {bytes(t.bytes)} · {retentionText(t.retention)}
        </span>
      </span>
      <span class="steps">
        {older.length > (oldHead ? 1 : 0) && (
          <span class="step more" title={`${older.length - (oldHead ? 1 : 0)} older steps: select the row to list them all`}>
            +{older.length - (oldHead ? 1 : 0)}
          </span>
        )}
        {oldHead && marker(oldHead)}
        {oldHead && <span class="step-gap" aria-hidden="true">…</span>}
        {newest.map(marker)}
      </span>
    </>
  )
}
