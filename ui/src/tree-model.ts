// forkvm's branch tree, built from the store's flat lists.
//
// The tree reads as the history of a machine: an image, its boot template,
// the sandboxes spawned from it, the branch points taken of each sandbox,
// and the children spawned from each branch point, and so on down. So:
//   image            -> its boot template and snapshots with nothing above them,
//                       and sandboxes booted cold (no snapshot)
//   snapshot         -> the sandboxes spawned from it, and its flattened copies
//   sandbox          -> its timeline (one row of step markers, when it has
//                       checkpoints), the snapshots (branch points) taken
//                       of it, and the ones its pauses saved
// A sandbox that runs from a snapshot of its own (its pause's saved state, or
// a checkpoint it rewound to) hangs from where that snapshot came from, so
// it never hangs below itself.
// A checkpoint (origin `checkpoint`) of a sandbox that exists is drawn as a
// step of that sandbox's timeline row, not as a box of its own, so fifty
// checkpoints take one row; one that something hangs from (a sandbox spawned
// from it, a flattened copy) is a box under its sandbox as well.
// A snapshot whose source sandbox is gone hangs from the snapshot that sandbox
// came from (its `parent`), else from its image; a flattened snapshot hangs
// from the diff snapshot it was flattened from while that one exists.
import type { Store } from './store'
import type { Image, Sandbox, Snapshot } from './types'

export type NodeType = 'image' | 'snapshot' | 'sandbox' | 'timeline'

export interface TreeNode {
  key: string
  type: NodeType
  parent: string | null
  children: string[]
  /** How it hangs from its parent, for the edge's style. */
  link: 'root' | 'template' | 'spawn' | 'branch' | 'chain' | 'flatten' | 'orphan' | 'timeline'
  image?: Image
  snapshot?: Snapshot
  sandbox?: Sandbox
  /** A timeline row: the sandbox whose checkpoints it draws. */
  timeline?: { sandbox: string }
  /** A checkpoint drawn only as a step of its timeline row (its parent);
   * it is in `nodes` (for details and search) but in no `children`. */
  hidden?: boolean
  /** Sort key: creation time. */
  at: number
}

export interface Tree {
  nodes: Map<string, TreeNode>
  roots: string[]
}

export const imageKey = (name: string) => `image:${name}`
export const timelineKey = (sandbox: string) => `timeline:${sandbox}`

function ensureImage(nodes: Map<string, TreeNode>, name: string): string {
  const key = imageKey(name)
  if (!nodes.has(key)) nodes.set(key, { key, type: 'image', parent: null, children: [], link: 'root', at: 0 })
  return key
}

export function buildTree(store: Store): Tree {
  const nodes = new Map<string, TreeNode>()
  for (const img of store.images.values()) {
    nodes.set(imageKey(img.name), {
      key: imageKey(img.name),
      type: 'image',
      parent: null,
      children: [],
      link: 'root',
      image: img,
      at: Date.parse(img.created_at) || 0,
    })
  }
  for (const s of store.snapshots.values()) {
    nodes.set(s.id, { key: s.id, type: 'snapshot', parent: null, children: [], link: 'orphan', snapshot: s, at: Date.parse(s.created_at) })
  }
  for (const s of store.sandboxes.values()) {
    nodes.set(s.id, { key: s.id, type: 'sandbox', parent: null, children: [], link: 'orphan', sandbox: s, at: Date.parse(s.created_at) })
  }

  // First choice of parent for each node, by the rules at the top.
  for (const n of [...nodes.values()]) {
    if (n.snapshot) {
      const s = n.snapshot
      if (s.template) {
        n.parent = ensureImage(nodes, s.image)
        n.link = 'template'
      } else if (s.flattened_from && nodes.has(s.flattened_from)) {
        n.parent = s.flattened_from
        n.link = 'flatten'
      } else if (nodes.get(s.source)?.type === 'sandbox') {
        n.parent = s.source
        n.link = 'branch'
      } else if (s.parent && nodes.has(s.parent)) {
        n.parent = s.parent
        n.link = 'chain'
      } else {
        n.parent = ensureImage(nodes, s.image)
        n.link = 'orphan'
      }
    } else if (n.sandbox) {
      const sb = n.sandbox
      // A paused (or once paused) sandbox runs from its own pause snapshot,
      // and a rewound one from its own checkpoint; those hang from it, so it
      // hangs from where they came from.
      let from = sb.snapshot ?? null
      for (let s = from ? nodes.get(from)?.snapshot : undefined; s && s.source === sb.id; s = from ? nodes.get(from)?.snapshot : undefined) {
        from = s.parent ?? null
      }
      if (from && nodes.has(from)) {
        n.parent = from
        n.link = 'spawn'
      } else {
        n.parent = ensureImage(nodes, sb.image)
        n.link = 'root'
      }
    }
  }

  // The rules cannot loop with consistent data; a loop in inconsistent data
  // (a daemon bug) must still draw, so its node moves under its image.
  for (const n of nodes.values()) {
    const seen = new Set<string>([n.key])
    let p = n.parent
    while (p) {
      if (seen.has(p)) {
        const img = n.snapshot?.image ?? n.sandbox?.image
        n.parent = img ? ensureImage(nodes, img) : null
        n.link = 'orphan'
        break
      }
      seen.add(p)
      p = nodes.get(p)?.parent ?? null
    }
  }

  // Timelines: a row under each sandbox with checkpoints; the checkpoints
  // nothing hangs from become its steps.
  const hasKids = new Set<string>()
  for (const n of nodes.values()) if (n.parent) hasKids.add(n.parent)
  const checkpointsOf = new Map<string, Snapshot[]>()
  for (const s of store.snapshots.values()) {
    if (s.origin !== 'checkpoint' || !store.sandboxes.has(s.source)) continue
    const l = checkpointsOf.get(s.source)
    if (l) l.push(s)
    else checkpointsOf.set(s.source, [s])
  }
  for (const sb of store.sandboxes.values()) {
    const cps = checkpointsOf.get(sb.id) ?? []
    if (cps.length === 0 && !store.timelines.get(sb.id)?.checkpoints.length) continue
    const key = timelineKey(sb.id)
    nodes.set(key, { key, type: 'timeline', parent: sb.id, children: [], link: 'timeline', timeline: { sandbox: sb.id }, at: -Infinity })
    for (const c of cps) {
      const n = nodes.get(c.id)!
      if (n.parent === sb.id && !hasKids.has(c.id)) {
        n.parent = key
        n.hidden = true
      }
    }
  }

  const roots: string[] = []
  for (const n of nodes.values()) {
    if (n.hidden) continue
    if (n.parent) nodes.get(n.parent)!.children.push(n.key)
    else roots.push(n.key)
  }
  const byTime = (a: string, b: string) => {
    const na = nodes.get(a)!
    const nb = nodes.get(b)!
    return na.at - nb.at || (a < b ? -1 : a > b ? 1 : 0)
  }
  for (const n of nodes.values()) n.children.sort(byTime)
  roots.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
  return { nodes, roots }
}

/** The words a search matches: id, tag, image, state, kind, mode, metadata. */
export function searchText(n: TreeNode): string {
  const parts: string[] = [n.key]
  if (n.image) parts.push(n.image.name, n.image.source, n.image.reference ?? '')
  if (n.snapshot) {
    const s = n.snapshot
    parts.push(s.tag ?? '', s.kind, s.origin, s.mode ?? '', s.image, s.template ? 'template' : '')
  }
  if (n.timeline) parts.push('timeline checkpoints', n.timeline.sandbox)
  if (n.sandbox) {
    const s = n.sandbox
    parts.push(s.state, s.image)
    for (const [k, v] of Object.entries(s.metadata ?? {})) parts.push(`${k}=${v}`)
  }
  return parts.join(' ').toLowerCase()
}

/** One row of the drawn tree: a node, where it sits, whether it can open. */
export interface VisibleNode {
  node: TreeNode
  level: number
  posinset: number
  setsize: number
  expandable: boolean
  expanded: boolean
  match: boolean
}

/**
 * The nodes to draw, in reading order (depth first): children of collapsed
 * nodes are left out; with a query, only matches and their ancestors are
 * kept, and the ancestors are drawn open whatever their collapsed state.
 */
export function visibleNodes(tree: Tree, collapsed: Set<string>, query: string): VisibleNode[] {
  const q = query.trim().toLowerCase()
  let keep: Set<string> | null = null
  const matches = new Set<string>()
  if (q) {
    keep = new Set()
    const terms = q.split(/\s+/)
    for (const n of tree.nodes.values()) {
      const text = searchText(n)
      if (terms.every((t) => text.includes(t))) {
        // A checkpoint drawn as a step matches as its timeline row.
        matches.add(n.hidden && n.parent ? n.parent : n.key)
        for (let k: string | null = n.key; k && !keep.has(k); k = tree.nodes.get(k)?.parent ?? null) keep.add(k)
      }
    }
  }
  const out: VisibleNode[] = []
  const walk = (keys: string[], level: number) => {
    const shown = keep ? keys.filter((k) => keep!.has(k)) : keys
    shown.forEach((key, i) => {
      const node = tree.nodes.get(key)!
      const kids = keep ? node.children.filter((k) => keep!.has(k)) : node.children
      const expandable = kids.length > 0
      const expanded = expandable && (keep ? true : !collapsed.has(key))
      out.push({ node, level, posinset: i + 1, setsize: shown.length, expandable, expanded, match: matches.has(key) })
      if (expanded) walk(node.children, level + 1)
    })
  }
  walk(tree.roots, 1)
  return out
}

/** Every node with children below `key` (for "collapse all"). */
export function innerNodes(tree: Tree): string[] {
  return [...tree.nodes.values()].filter((n) => n.children.length > 0 && n.parent !== null).map((n) => n.key)
}
