// The details panel of a timeline row: every step of the sandbox's timeline
// (the row draws only the newest), each a link that selects it (its details
// offer Rewind here…), and the sandbox's Checkpoint… and Retention….
import { ago, bytes, ms } from './format'
import type { Store } from './store'
import { TimeTravelActions } from './time-travel'
import { retentionText, stepName, stepsOf } from './timeline-model'

interface Props {
  store: Store
  sandbox: string
  onSelect: (key: string) => void
  onNotice: (text: string, error?: boolean) => void
}

export function TimelinePanel({ store, sandbox, onSelect, onNotice }: Props) {
  const t = stepsOf(store, sandbox)
  const sb = store.sandboxes.get(sandbox)
  return (
    <aside class="details" aria-label="Details">
      <h2>
        Timeline of <span class="mono">{sandbox}</span>
      </h2>
      <p>
        {t.steps.length} checkpoints, {bytes(t.bytes)} stored; {retentionText(t.retention)}.
      </p>
      <div class="actions" role="group" aria-label="Actions">
        {sb && <TimeTravelActions sandbox={sb} onNotice={onNotice} />}
      </div>
      <table class="steps-table" data-testid="timeline-table">
        <caption class="visually-hidden">Checkpoints of {sandbox}, newest first</caption>
        <thead>
          <tr>
            <th scope="col">Step</th>
            <th scope="col">Tag</th>
            <th scope="col">Stored</th>
            <th scope="col">Pause</th>
            <th scope="col">Taken</th>
          </tr>
        </thead>
        <tbody>
          {[...t.steps].reverse().map((s) => (
            <tr key={s.id} class={s.head ? 'head' : ''}>
              <td>
                <a href={`#/tree/${s.id}`} onClick={(e) => (e.preventDefault(), onSelect(s.id))}>
                  {stepName(s)}
                </a>
                {s.head && ' (head)'}
              </td>
              <td>{s.tag ?? ''}</td>
              <td>{bytes(s.bytes)}</td>
              <td>{ms(s.pause_ms)}</td>
              <td>{ago(s.created_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </aside>
  )
}
