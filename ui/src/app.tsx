// The page frame: header (links, connection state, logout) and a hash router.
// Routes: #/ (tree), #/tree/ID (tree with ID selected), #/sandbox/ID,
// #/charts. Hash routes need no help from the daemon's file server.
import { useEffect, useMemo, useState } from 'preact/hooks'
import { useNotice } from './actions'
import { api } from './api'
import { ChartsPage } from './charts-page'
import { NodeDetails } from './node-details'
import { SandboxPage } from './sandbox-page'
import { store, useStore, type Link } from './store'
import { buildTree } from './tree-model'
import { TreeView } from './tree-view'
import type { Info } from './types'

function useHash(): string {
  const [hash, setHash] = useState(window.location.hash)
  useEffect(() => {
    const on = () => setHash(window.location.hash)
    window.addEventListener('hashchange', on)
    return () => window.removeEventListener('hashchange', on)
  }, [])
  return hash
}

function LinkState({ link }: { link: Link }) {
  const text =
    link.kind === 'live'
      ? 'live'
      : link.kind === 'connecting'
        ? 'connecting…'
        : link.kind === 'polling'
          ? 'polling'
          : 'offline'
  const title = link.kind === 'polling' || link.kind === 'offline' ? link.why : link.kind === 'live' ? `event ${link.seq}` : ''
  return (
    <span class={`link link-${link.kind}`} title={title} data-testid="link-state">
      <span class="dot" aria-hidden="true" /> {text}
    </span>
  )
}

export function App() {
  const s = useStore()
  const hash = useHash()
  const [info, setInfo] = useState<Info | null>(null)
  const { notice, setNotice } = useNotice()
  useEffect(() => {
    api.info().then(setInfo, () => undefined)
  }, [])

  const parts = hash.replace(/^#\/?/, '').split('/')
  const route = parts[0] || 'tree'
  const arg = parts[1] ? decodeURIComponent(parts[1]) : null
  const onNotice = (text: string, error = false) => setNotice({ text, error })

  let main
  if (route === 'sandbox' && arg) {
    main = <SandboxPage id={arg} store={s} onNotice={onNotice} />
  } else if (route === 'charts') {
    main = <ChartsPage store={s} />
  } else {
    main = <TreePage selected={route === 'tree' ? arg : null} onNotice={onNotice} />
  }
  return (
    <>
      <header class="top">
        <a href="#/" class="brand">
          forkvm
        </a>
        <nav aria-label="Pages">
          <a href="#/" aria-current={route === 'tree' ? 'page' : undefined}>
            Tree
          </a>
          <a href="#/charts" aria-current={route === 'charts' ? 'page' : undefined}>
            Charts
          </a>
        </nav>
        <span class="spacer" />
        {info && (
          <span class="muted" title={info.accel.reason}>
            v{info.version} · {info.accel.kind}
          </span>
        )}
        <LinkState link={s.link} />
        <form method="post" action="/ui/logout" class="logout">
          <button type="submit">Log out</button>
        </form>
      </header>
      <div class={`notice ${notice?.error ? 'error' : ''}`} role="status" aria-live="polite" data-testid="notice">
        {notice?.text}
      </div>
      <main>{main}</main>
    </>
  )
}

function TreePage({ selected, onNotice }: { selected: string | null; onNotice: (t: string, e?: boolean) => void }) {
  const [sel, setSel] = useState<string | null>(selected)
  useEffect(() => setSel(selected), [selected])
  const tree = useMemo(() => buildTree(store), [store.dataVersion])
  const node = sel ? tree.nodes.get(sel) ?? null : null
  const open = (key: string) => {
    window.location.hash = `#/sandbox/${key}`
  }
  return (
    <div class="tree-page">
      <TreeView store={store} tree={tree} selected={sel} onSelect={setSel} onOpen={open} />
      <NodeDetails node={node} store={store} onSelect={setSel} onNotice={onNotice} />
    </div>
  )
}
