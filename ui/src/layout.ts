// Positions of the drawn tree's boxes and edges, in one of two layouts:
//
// - outline (the default): one box per row in reading order, indented by
//   depth, like a file tree, with guide lines from each parent down to its
//   children. A parent sits at the top of its subtree, so Down moves focus
//   visually down, and forkvm's typical shape (a sandbox with a hundred
//   branch points) stays compact: 500 nodes are 500 rows, a few columns wide.
// - tidy: a tidy tree (Reingold-Tilford, as d3-hierarchy implements it), left
//   to right, each parent centred on its children: the classic picture,
//   best for small trees; with a big fan-out a parent ends up far from the
//   top of its children.
//
// Why not a general graph layout: forkvm's picture is a tree (a forest, one
// root per image), and both layouts here are linear in the nodes. For 500
// nodes on the 2-core test host, measured in Node: dagre 450-960 ms (any
// ranker), elkjs 1.0-2.2 s (mrtree or layered, and 1.6 MB of script),
// d3-hierarchy's tree 1-9 ms. The page draws its own DOM boxes, so they stay
// real, focusable tree items.
import { hierarchy, tree as tidyTree, type HierarchyPointNode } from 'd3-hierarchy'
import type { VisibleNode } from './tree-model'

export const NODE_W = 200
/** A timeline row's width in the outline: it holds a chain of step markers. */
export const TIMELINE_W = 440

/** A box's width. A timeline row (a leaf) is wider in the outline, where a
 * row holds one box; in the tidy tree it keeps its column's width, since the
 * next column may hold other boxes level with it. */
export const nodeWidth = (n: VisibleNode['node'], mode: LayoutMode) => (n.type === 'timeline' && mode === 'outline' ? TIMELINE_W : NODE_W)
export const NODE_H = 46
/** Between a parent's column and its children's (tidy). */
const RANK_GAP = 36
/** How far each level is indented (outline). */
const INDENT = 36
/** Where a parent's guide line runs down, from its box's left edge (outline). */
const GUIDE = 14
/** Between neighbouring boxes of one column. */
const ROW_GAP = 6
const MARGIN = 16

export interface Placed {
  key: string
  x: number
  y: number
}

export interface EdgePath {
  from: string
  to: string
  d: string
  link: string
}

export interface Layout {
  width: number
  height: number
  nodes: Map<string, Placed>
  edges: EdgePath[]
}

interface Item {
  key: string
  children: Item[]
}

export type LayoutMode = 'outline' | 'tidy'

export function layoutTree(rows: VisibleNode[], mode: LayoutMode): Layout {
  return mode === 'tidy' ? layoutTidy(rows) : layoutOutline(rows)
}

function layoutOutline(rows: VisibleNode[]): Layout {
  const nodes = new Map<string, Placed>()
  const edges: EdgePath[] = []
  let right = MARGIN + NODE_W
  rows.forEach((r, i) => {
    const key = r.node.key
    const x = MARGIN + (r.level - 1) * INDENT
    const y = MARGIN + i * (NODE_H + ROW_GAP)
    nodes.set(key, { key, x, y })
    right = Math.max(right, x + nodeWidth(r.node, 'outline'))
    // Rows come parent first, so the parent is placed already.
    const p = r.node.parent ? nodes.get(r.node.parent) : undefined
    if (p) {
      const gx = p.x + GUIDE
      edges.push({ from: p.key, to: key, d: `M${gx},${p.y + NODE_H}V${y + NODE_H / 2}H${x}`, link: r.node.link })
    }
  })
  return {
    width: right + MARGIN,
    height: 2 * MARGIN + Math.max(1, rows.length) * (NODE_H + ROW_GAP) - ROW_GAP,
    nodes,
    edges,
  }
}

function layoutTidy(rows: VisibleNode[]): Layout {
  // The drawn rows are in depth-first order with their levels, which is
  // enough to rebuild the drawn tree: a row's parent is the last row one
  // level up. One hidden root holds the forest together.
  const root: Item = { key: '', children: [] }
  const stack: Item[] = [root]
  for (const r of rows) {
    const item: Item = { key: r.node.key, children: [] }
    stack.length = r.level
    stack[r.level - 1].children.push(item)
    stack[r.level] = item
  }
  const laid = tidyTree<Item>()
    .nodeSize([NODE_H + ROW_GAP, NODE_W + RANK_GAP])
    // Cousins a little further apart than siblings, so families read as groups.
    .separation((a, b) => (a.parent === b.parent ? 1 : 1.25))(hierarchy(root))

  let minX = Infinity
  let maxX = -Infinity
  let maxDepth = 0
  laid.each((n) => {
    if (!n.data.key) return
    minX = Math.min(minX, n.x)
    maxX = Math.max(maxX, n.x)
    maxDepth = Math.max(maxDepth, n.depth)
  })
  // d3's x runs across (here: down), its depth along (here: right); the
  // hidden root is depth 0, so real nodes start at depth 1.
  const left = (n: HierarchyPointNode<Item>) => MARGIN + (n.depth - 1) * (NODE_W + RANK_GAP)
  const top = (n: HierarchyPointNode<Item>) => MARGIN + n.x - minX
  const nodes = new Map<string, Placed>()
  const edges: EdgePath[] = []
  const linkOf = new Map(rows.map((r) => [r.node.key, r.node.link]))
  laid.each((n) => {
    if (!n.data.key) return
    const x = left(n)
    const y = top(n)
    nodes.set(n.data.key, { key: n.data.key, x, y })
    const p = n.parent
    if (p && p.data.key) {
      // An elbow from the parent's right side to the child's left side.
      const x1 = left(p) + NODE_W
      const y1 = top(p) + NODE_H / 2
      const y2 = y + NODE_H / 2
      const mx = x1 + RANK_GAP / 2
      edges.push({ from: p.data.key, to: n.data.key, d: `M${x1},${y1}H${mx}V${y2}H${x}`, link: linkOf.get(n.data.key) ?? '' })
    }
  })
  const empty = rows.length === 0
  return {
    width: empty ? NODE_W + 2 * MARGIN : 2 * MARGIN + maxDepth * (NODE_W + RANK_GAP) - RANK_GAP,
    height: empty ? NODE_H + 2 * MARGIN : 2 * MARGIN + maxX - minX + NODE_H,
    nodes,
    edges,
  }
}
