// What one box of the tree says. Two lines fit in a box: the name (id or tag)
// and badges for what kind of thing it is. The conventions (docs/dashboard.md):
//   diff snapshot      "Δ n": a link n deep in a diff chain (dashed border)
//   flattened snapshot "flat": a standalone copy of a chain (double border)
//   branch point       its mode and the source's pause ("diff · 8.7 ms")
//   template           an image's boot template
//   sandbox            its state, coloured
import { memo } from 'preact/compat'
import { ms } from './format'
import type { Store } from './store'
import type { TreeNode } from './tree-model'

export interface Badge {
  text: string
  title: string
  cls?: string
}

export function nodeName(n: TreeNode): string {
  if (n.timeline) return `timeline of ${n.timeline.sandbox}`
  if (n.image) return n.image.name
  if (n.type === 'image') return n.key.slice('image:'.length)
  return n.snapshot?.tag ? `${n.snapshot.tag}` : n.key
}

export function badges(n: TreeNode, store: Store): Badge[] {
  const out: Badge[] = []
  if (n.type === 'image') {
    out.push({ text: 'image', title: 'An installed image', cls: 'b-image' })
    if (n.image) out.push({ text: n.image.source, title: 'Where it came from' })
    else out.push({ text: 'removed', title: 'Not installed any more; things made from it remain', cls: 'b-warn' })
  } else if (n.snapshot) {
    const s = n.snapshot
    if (s.template) out.push({ text: 'template', title: "The image's boot template", cls: 'b-template' })
    if (s.tag) out.push({ text: n.key, title: 'Its id (the name shown is its tag)' })
    if (s.kind === 'diff') out.push({ text: `Δ ${s.depth ?? '?'}`, title: `A diff snapshot, ${s.depth ?? '?'} links deep in its chain`, cls: 'b-diff' })
    else if (s.flattened_from || s.origin === 'flatten') out.push({ text: 'flat', title: `Flattened from ${s.flattened_from ?? 'a diff chain'}`, cls: 'b-flat' })
    else out.push({ text: s.kind, title: 'Kind of snapshot' })
    const b = store.branchOf(s.id)
    const mode = s.mode ?? b?.mode
    const pause = s.pause_ms ?? b?.pause_ms ?? s.timings?.pause_ms
    if (mode || s.origin === 'branch') {
      out.push({ text: `${mode ?? 'branch'} · ${ms(pause)}`, title: `Branch point: mode ${mode ?? 'unknown'}, the source paused ${ms(pause)}`, cls: 'b-branch' })
    } else if (s.origin === 'pause') {
      out.push({ text: 'paused state', title: 'Holds a paused sandbox' })
    } else if (s.origin === 'checkpoint') {
      out.push({ text: 'checkpoint', title: `A step of ${s.source}'s timeline`, cls: 'b-checkpoint' })
    }
    if (s.pool_size > 0) {
      const p = store.pools.get(s.id)
      out.push({ text: `pool ${p ? `${p.ready}/` : ''}${s.pool_size}`, title: 'Warm pool: ready / size' })
    }
    if (s.pinned) out.push({ text: 'pinned', title: 'Kept from garbage collection' })
    if (s.state !== 'ready') out.push({ text: s.state, title: s.failure ?? 'Snapshot state', cls: s.state === 'failed' ? 'b-bad' : 'b-warn' })
  } else if (n.sandbox) {
    const sb = n.sandbox
    out.push({ text: sb.state, title: sb.failure ?? 'Sandbox state', cls: `b-${sb.state}` })
    if (sb.timings) out.push({ text: ms(sb.timings.total_ms), title: 'Spawn time' })
    const meta = Object.entries(sb.metadata ?? {})
    if (meta.length) out.push({ text: `${meta[0][0]}=${meta[0][1]}`, title: meta.map(([k, v]) => `${k}=${v}`).join('\n') })
  }
  return out
}

export function nodeClass(n: TreeNode): string {
  const c = ['node', `node-${n.type}`]
  if (n.snapshot?.kind === 'diff') c.push('node-diff')
  if (n.snapshot?.flattened_from || n.snapshot?.origin === 'flatten') c.push('node-flat')
  if (n.snapshot?.template) c.push('node-template')
  if (n.sandbox) c.push(`state-${n.sandbox.state}`)
  if (n.timeline) c.push('node-wide')
  return c.join(' ')
}

const TYPE_WORD = { image: 'Image', snapshot: 'Snapshot', sandbox: 'Sandbox', timeline: 'Timeline' }

interface BoxProps {
  node: TreeNode
  name: string
  badges: Badge[]
  cls: string
}

/** The inside of a box; memoised on its text so moving focus redraws two boxes, not 500. */
export const NodeBox = memo(
  function NodeBox({ node, name, badges: bs }: BoxProps) {
    // The box's text is its accessible name (a screen reader hears what is
    // shown), with the node's type said first but not shown.
    return (
      <>
        <span class="node-name">
          <span class="visually-hidden">{TYPE_WORD[node.type]} </span>
          {name}
        </span>
        <span class="node-badges">
          {bs.map((b) => (
            <span class={`badge ${b.cls ?? ''}`} title={b.title}>
              {b.text}
              <span class="visually-hidden">,</span>
            </span>
          ))}
        </span>
      </>
    )
  },
  (a, b) =>
    a.node.type === b.node.type &&
    a.name === b.name &&
    a.cls === b.cls &&
    a.badges.length === b.badges.length &&
    a.badges.every((x, i) => x.text === b.badges[i].text && x.title === b.badges[i].title && x.cls === b.badges[i].cls),
)
