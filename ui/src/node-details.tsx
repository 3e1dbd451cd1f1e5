// The panel beside the tree: what the selected node is, in full, and what can
// be done with it.
import type { ComponentChildren } from 'preact'
import { Actions } from './actions'
import { ago, bytes, ms } from './format'
import type { Store } from './store'
import { stepsOf } from './timeline-model'
import { TimelinePanel } from './timeline-panel'
import type { TreeNode } from './tree-model'
import { nodeName } from './tree-node'

export function Fields({ rows }: { rows: [string, ComponentChildren][] }) {
  return (
    <dl class="fields">
      {rows
        .filter(([, v]) => v !== null && v !== undefined && v !== '')
        .map(([k, v]) => (
          <>
            <dt>{k}</dt>
            <dd>{v}</dd>
          </>
        ))}
    </dl>
  )
}

/** A link to another node of the tree (selects it). */
function Ref({ id, onSelect }: { id: string | null | undefined; onSelect: (k: string) => void }) {
  if (!id) return null
  return (
    <a href={`#/tree/${id}`} onClick={(e) => (e.preventDefault(), onSelect(id))} class="mono">
      {id}
    </a>
  )
}

interface Props {
  node: TreeNode | null
  store: Store
  onSelect: (key: string) => void
  onNotice: (text: string, error?: boolean) => void
}

export function NodeDetails({ node, store, onSelect, onNotice }: Props) {
  if (!node) {
    return (
      <aside class="details" aria-label="Details">
        <p class="muted">Select a node (click it, or focus the tree and use the arrow keys) to see its details and actions.</p>
      </aside>
    )
  }
  if (node.timeline) {
    return <TimelinePanel store={store} sandbox={node.timeline.sandbox} onSelect={onSelect} onNotice={onNotice} />
  }
  let rows: [string, ComponentChildren][] = []
  if (node.type === 'image') {
    const i = node.image
    rows = [
      ['Image', nodeName(node)],
      ['Source', i?.source ?? 'removed'],
      ['Reference', i?.reference],
      ['Root filesystem', i ? bytes(i.size_bytes) : null],
      ['Created', i ? ago(i.created_at) : null],
    ]
  } else if (node.snapshot) {
    const s = node.snapshot
    const b = store.branchOf(s.id)
    const step = s.origin === 'checkpoint' ? stepsOf(store, s.source).steps.find((x) => x.id === s.id) : undefined
    rows = [
      ['Snapshot', <span class="mono">{s.id}</span>],
      ['Tag', s.tag],
      ['Checkpoint', step ? `step ${step.seq ?? '(new)'}${step.head ? ' (head: the next checkpoint builds on it)' : ''}` : null],
      ['Stored for it', step?.bytes != null ? bytes(step.bytes) : null],
      ['Kind', s.kind === 'diff' ? `diff (${s.depth ?? '?'} links deep)` : s.kind],
      ['Made by', s.origin + (s.template ? ' (boot template)' : '')],
      ['State', s.failure ? `${s.state}: ${s.failure}` : s.state],
      ['Branch mode', s.mode ?? b?.mode],
      ['Source paused', s.pause_ms != null || b?.pause_ms != null || s.timings ? ms(s.pause_ms ?? b?.pause_ms ?? s.timings?.pause_ms) : null],
      ['Branch total', b?.total_ms != null ? ms(b.total_ms) : null],
      ['Source', s.source ? <Ref id={s.source} onSelect={onSelect} /> : null],
      ['Parent', s.parent ? <Ref id={s.parent} onSelect={onSelect} /> : null],
      ['Flattened from', s.flattened_from ? <Ref id={s.flattened_from} onSelect={onSelect} /> : null],
      ['Image', s.image],
      ['Guest', `${s.memory_mib} MiB, ${s.cpus} vCPU`],
      ['Memory stored', bytes(s.sizes.memory_diff_bytes ?? s.sizes.memory_allocated_bytes)],
      ['Disk layer', bytes(s.sizes.disk_bytes)],
      ['Warm pool', `${s.pool_size}${s.pool_default ? ' (daemon default)' : ''}`],
      ['Pinned', s.pinned ? 'yes' : 'no'],
      ['Sandboxes', String(s.sandboxes.length)],
      ['Created', ago(s.created_at)],
    ]
  } else if (node.sandbox) {
    const sb = node.sandbox
    rows = [
      ['Sandbox', <span class="mono">{sb.id}</span>],
      ['State', sb.failure ? `${sb.state}: ${sb.failure}` : sb.state],
      ['Image', sb.image],
      ['From', sb.snapshot ? <Ref id={sb.snapshot} onSelect={onSelect} /> : 'a cold boot'],
      ['Guest', `${sb.memory_mib} MiB, ${sb.cpus} vCPU, ${sb.accel}`],
      ['Spawn', sb.timings ? `${ms(sb.timings.total_ms)}${sb.timings.from_pool ? ' (warm pool)' : ''}` : null],
      ['Metadata', Object.entries(sb.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(', ')],
      ['Created', ago(sb.created_at)],
    ]
  }
  return (
    <aside class="details" aria-label="Details">
      <h2 class="mono">{nodeName(node)}</h2>
      {node.sandbox && (
        <p>
          <a href={`#/sandbox/${node.key}`} class="button primary">
            Open sandbox page
          </a>
        </p>
      )}
      <Fields rows={rows} />
      <Actions key={node.key} node={node} onNotice={onNotice} />
    </aside>
  )
}
