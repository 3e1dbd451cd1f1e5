// The branch tree, drawn as boxes placed by layout.ts with elbow edges under
// them, and navigable as a WAI-ARIA tree: the boxes are `treeitem`s owned by
// one `tree` (flat, with aria-level / aria-posinset / aria-setsize, because
// the boxes are positioned freely rather than nested), with a roving
// tabindex. Keys: Up/Down move through the drawn order, Right opens or goes
// to the first child, Left closes or goes to the parent, Home/End jump to the
// first/last node, Enter opens a sandbox's page (or opens/closes other nodes),
// `*` opens all siblings.
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'preact/hooks'
import { layoutTree, NODE_H, nodeWidth, type LayoutMode } from './layout'
import type { Store } from './store'
import { badges, nodeClass, nodeName, NodeBox } from './tree-node'
import { TimelineStrip } from './timeline-strip'
import { innerNodes, visibleNodes, type Tree, type VisibleNode } from './tree-model'

/** DOM ids from node keys (`image:default` has a colon). */
export const domId = (key: string) => `node-${key.replace(/[^A-Za-z0-9_-]/g, '_')}`

interface Props {
  store: Store
  tree: Tree
  selected: string | null
  onSelect: (key: string) => void
  onOpen: (key: string) => void
}

export function TreeView({ store, tree, selected, onSelect, onOpen }: Props) {
  const [collapsed, setCollapsed] = useState<Set<string>>(() => new Set())
  const [query, setQuery] = useState('')
  const [focusKey, setFocusKey] = useState<string | null>(null)
  const [mode, setMode] = useState<LayoutMode>(() => (localStorage.getItem('forkvm.layout') === 'tidy' ? 'tidy' : 'outline'))
  const treeRef = useRef<HTMLDivElement>(null)
  const scrollRef = useRef<HTMLDivElement>(null)
  const scrolled = useRef(false)
  // Move DOM focus only after a key press or click inside the tree, never
  // because data changed (that would steal focus from other controls). It
  // holds the key asked for, not a flag: an effect of an earlier render can
  // still run after the next key press (Preact flushes pending effects when
  // the component renders again), and it must focus what that press asked
  // for, not the node its own render had (the dashboard test lost key
  // presses that way).
  const wantFocus = useRef<string | null>(null)

  const rows: VisibleNode[] = useMemo(() => visibleNodes(tree, collapsed, query), [tree, collapsed, query])
  const layout = useMemo(() => {
    const t0 = performance.now()
    const l = layoutTree(rows, mode)
    // bench/ui reports the layout's share of the render.
    performance.measure('forkvm:layout', { start: t0, detail: { nodes: rows.length } })
    return l
  }, [rows, mode])
  const index = useMemo(() => new Map(rows.map((r, i) => [r.node.key, i])), [rows])

  // A checkpoint drawn as a step stands for its timeline row.
  const selRow = selected && tree.nodes.get(selected)?.hidden ? tree.nodes.get(selected)!.parent : selected
  // The focusable node: the focused one if still drawn, else the selection, else the first.
  const current =
    focusKey && index.has(focusKey) ? focusKey : selRow && index.has(selRow) ? selRow : rows[0]?.node.key ?? null

  // Mark the moment the drawn tree is in the DOM and laid out (bench/ui reads it).
  useLayoutEffect(() => {
    if (!store.loaded) return
    void treeRef.current?.offsetHeight
    performance.mark('forkvm:tree-laid-out', { detail: { nodes: rows.length, total: tree.nodes.size } })
    // A tidy tree centres each parent on its children, so with a big fan-out
    // the first root sits far down: bring it into view once, on first load.
    const first = rows[0] && layout.nodes.get(rows[0].node.key)
    if (!scrolled.current && first && scrollRef.current) {
      scrolled.current = true
      scrollRef.current.scrollTo(0, Math.max(0, first.y - scrollRef.current.clientHeight / 3))
    }
  }, [layout])

  useEffect(() => {
    const want = wantFocus.current
    if (!want) return
    const key = index.has(want) ? want : current
    if (!key) return
    wantFocus.current = null
    const el = document.getElementById(domId(key))
    if (el && document.activeElement !== el) el.focus({ preventScroll: true })
    el?.scrollIntoView({ block: 'nearest', inline: 'nearest' })
  }, [current, rows])

  const setOpen = (key: string, open: boolean) => {
    setCollapsed((c) => {
      if (open === !c.has(key)) return c
      const n = new Set(c)
      if (open) n.delete(key)
      else n.add(key)
      return n
    })
  }
  const moveTo = (key: string | undefined) => {
    if (!key) return
    // Focus at once when the box is drawn already (not after the re-render),
    // so fast key presses never act on the node focus just left.
    const el = document.getElementById(domId(key))
    if (el) {
      el.focus({ preventScroll: true })
      el.scrollIntoView({ block: 'nearest', inline: 'nearest' })
    }
    wantFocus.current = key
    setFocusKey(key)
    onSelect(key)
  }

  const onKeyDown = (e: KeyboardEvent) => {
    if (!current || e.altKey || e.ctrlKey || e.metaKey) return
    const i = index.get(current)!
    const row = rows[i]
    let handled = true
    switch (e.key) {
      case 'ArrowDown':
        moveTo(rows[i + 1]?.node.key)
        break
      case 'ArrowUp':
        moveTo(rows[i - 1]?.node.key)
        break
      case 'Home':
        moveTo(rows[0]?.node.key)
        break
      case 'End':
        moveTo(rows[rows.length - 1]?.node.key)
        break
      case 'ArrowRight':
        if (row.expandable && !row.expanded) setOpen(current, true)
        else if (row.expanded) moveTo(rows[i + 1]?.node.key)
        break
      case 'ArrowLeft':
        if (row.expanded && !query) setOpen(current, false)
        else if (row.node.parent && index.has(row.node.parent)) moveTo(row.node.parent)
        break
      case 'Enter':
        if (row.node.type === 'sandbox') onOpen(current)
        else if (row.expandable && !query) setOpen(current, !row.expanded)
        break
      case '*': {
        const parent = row.node.parent
        const sibs = rows.filter((r) => r.node.parent === parent && r.expandable)
        setCollapsed((c) => {
          const n = new Set(c)
          for (const s of sibs) n.delete(s.node.key)
          return n
        })
        break
      }
      default:
        handled = false
    }
    if (handled) {
      e.preventDefault()
      e.stopPropagation()
    }
  }

  const shown = rows.length
  // Checkpoints drawn as steps of a timeline row are not counted as boxes.
  const total = useMemo(() => [...tree.nodes.values()].filter((n) => !n.hidden).length, [tree])
  return (
    <section class="tree-pane" aria-labelledby="tree-title">
      <h1 id="tree-title" class="visually-hidden">Branch tree</h1>
      <div class="tree-toolbar">
        <input
          type="search"
          placeholder="Search id, tag, metadata (key=value)…"
          aria-label="Search the tree by id, tag or metadata"
          value={query}
          onInput={(e) => setQuery(e.currentTarget.value)}
        />
        <button type="button" onClick={() => setCollapsed(new Set())}>
          Expand all
        </button>
        <button type="button" onClick={() => setCollapsed(new Set(innerNodes(tree)))}>
          Collapse all
        </button>
        <label class="layout-choice">
          Layout{' '}
          <select
            value={mode}
            onChange={(e) => {
              const m = e.currentTarget.value as LayoutMode
              localStorage.setItem('forkvm.layout', m)
              setMode(m)
            }}
          >
            <option value="outline">outline</option>
            <option value="tidy">tidy tree</option>
          </select>
        </label>
        <span class="muted" role="status" aria-live="polite" data-testid="tree-count">
          {query ? `${rows.filter((r) => r.match).length} match · ` : ''}
          {shown} of {total} nodes shown
        </span>
      </div>
      <div class="tree-scroll" ref={scrollRef}>
        <div class="tree-canvas" style={{ width: `${layout.width}px`, height: `${layout.height}px` }}>
          <svg class="tree-edges" width={layout.width} height={layout.height} aria-hidden="true" focusable="false">
            {layout.edges.map((e) => (
              <path key={`${e.from}>${e.to}`} d={e.d} class={`edge edge-${e.link}`} />
            ))}
          </svg>
          <div
            ref={treeRef}
            role="tree"
            aria-label="Images, snapshots and sandboxes"
            class="tree"
            data-nodes={shown}
            onKeyDown={onKeyDown}
          >
            {rows.map((r) => {
              const key = r.node.key
              const p = layout.nodes.get(key)!
              const name = nodeName(r.node)
              return (
                <div
                  key={key}
                  id={domId(key)}
                  role="treeitem"
                  aria-level={r.level}
                  aria-posinset={r.posinset}
                  aria-setsize={r.setsize}
                  aria-expanded={r.expandable ? r.expanded : undefined}
                  aria-selected={key === selRow}
                  tabIndex={key === current ? 0 : -1}
                  data-key={key}
                  data-parent={r.node.parent ?? undefined}
                  class={`${nodeClass(r.node)}${r.match ? ' match' : ''}`}
                  style={{ left: `${p.x}px`, top: `${p.y}px`, width: `${nodeWidth(r.node, mode)}px`, height: `${NODE_H}px` }}
                  onClick={() => {
                    wantFocus.current = key
                    setFocusKey(key)
                    onSelect(key)
                  }}
                  onDblClick={() => (r.node.type === 'sandbox' ? onOpen(key) : undefined)}
                >
                  {r.expandable && (
                    <span
                      class="caret"
                      aria-hidden="true"
                      onClick={(e) => {
                        e.stopPropagation()
                        if (!query) setOpen(key, !r.expanded)
                      }}
                    >
                      {r.expanded ? '▾' : '▸'}
                      {!r.expanded && <span class="hidden-count">{r.node.children.length}</span>}
                    </span>
                  )}
                  {r.node.timeline ? (
                    <TimelineStrip
                      store={store}
                      sandbox={r.node.timeline.sandbox}
                      width={nodeWidth(r.node, mode)}
                      selected={selected}
                      onPick={(k) => {
                        wantFocus.current = key
                        setFocusKey(key)
                        onSelect(k)
                      }}
                    />
                  ) : (
                    <NodeBox node={r.node} name={name} badges={badges(r.node, store)} cls={nodeClass(r.node)} />
                  )}
                </div>
              )
            })}
          </div>
        </div>
        {store.loaded && total === 0 && <p class="empty">No images, snapshots or sandboxes yet.</p>}
      </div>
    </section>
  )
}
