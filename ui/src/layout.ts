// Positions of the drawn tree's nodes and edges, by dagre (a layered graph
// layout). Left to right, because ids are wide and trees here are bushy: a
// branch point with many children grows downwards, where the page scrolls.
//
// dagre was chosen over elkjs because it lays out synchronously in the page
// (no worker, no async) and takes well under a second for 500 nodes on this
// hardware (bench/ui measures it), and over cytoscape because the page draws
// its own DOM nodes, which keeps them real, focusable tree items.
import dagre from '@dagrejs/dagre'
import type { VisibleNode } from './tree-model'

export const NODE_W = 200
export const NODE_H = 54

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

const MARGIN = 16

export function layoutTree(rows: VisibleNode[]): Layout {
  const g = new dagre.graphlib.Graph()
  g.setGraph({ rankdir: 'LR', nodesep: 10, ranksep: 36, marginx: MARGIN, marginy: MARGIN })
  g.setDefaultEdgeLabel(() => ({}))
  const shown = new Set(rows.map((r) => r.node.key))
  for (const r of rows) g.setNode(r.node.key, { width: NODE_W, height: NODE_H })
  for (const r of rows) {
    const p = r.node.parent
    if (p && shown.has(p)) g.setEdge(p, r.node.key)
  }
  dagre.layout(g)

  const nodes = new Map<string, Placed>()
  for (const r of rows) {
    const n = g.node(r.node.key)
    // dagre gives centres; the page places boxes by their top-left corner.
    nodes.set(r.node.key, { key: r.node.key, x: (n.x ?? 0) - NODE_W / 2, y: (n.y ?? 0) - NODE_H / 2 })
  }
  // Edges as elbows from the parent's right side to the child's left side:
  // in a tree that reads better than dagre's splines and costs nothing.
  const edges: EdgePath[] = []
  for (const r of rows) {
    const p = r.node.parent
    const a = p ? nodes.get(p) : undefined
    const b = nodes.get(r.node.key)
    if (!a || !b) continue
    const x1 = a.x + NODE_W
    const y1 = a.y + NODE_H / 2
    const x2 = b.x
    const y2 = b.y + NODE_H / 2
    const mx = x1 + (x2 - x1) / 2
    edges.push({ from: p!, to: r.node.key, d: `M${x1},${y1}H${mx}V${y2}H${x2}`, link: r.node.link })
  }
  const graph = g.graph()
  return {
    width: Math.max(graph.width ?? 0, NODE_W + 2 * MARGIN),
    height: Math.max(graph.height ?? 0, NODE_H + 2 * MARGIN),
    nodes,
    edges,
  }
}
