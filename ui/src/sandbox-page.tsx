// One sandbox: its state, image, resources and use, network and ports,
// timings and memory over time (Overview); its serial console, live
// (Console); a shell (Terminal); its files (Files). Actions as in the tree.
import { useEffect, useRef, useState } from 'preact/hooks'
import { Actions } from './actions'
import { api, ApiError } from './api'
import { XYChart } from './chart'
import { SandboxFiles } from './files'
import { ago, bytes, clock, kib, mib, ms } from './format'
import { Fields } from './node-details'
import type { Store } from './store'
import type { MemoryUsage, Sandbox } from './types'

const DETAIL_POLL_MS = 2000
const LOG_POLL_MS = 2000
/** Points of memory history kept (10 minutes at one per 2 s). */
const HISTORY = 300
/** The console shows its last part only; the daemon keeps 1 MiB. */
const LOG_TAIL = 200_000

type Tab = 'overview' | 'console' | 'terminal' | 'files'
const TABS: [Tab, string][] = [
  ['overview', 'Overview'],
  ['console', 'Console'],
  ['terminal', 'Terminal'],
  ['files', 'Files'],
]

interface Props {
  id: string
  store: Store
  onNotice: (text: string, error?: boolean) => void
}

// Escape sequences the serial console carries (colours, cursor moves).
// eslint-disable-next-line no-control-regex
const ANSI = /\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\r/g

/** The sandbox as GET /v1/sandboxes/{id} shows it, refreshed every 2 s, and its memory history. */
function useSandboxDetail(id: string) {
  const [detail, setDetail] = useState<Sandbox | null>(null)
  const [gone, setGone] = useState(false)
  const [history, setHistory] = useState<{ at: number; m: MemoryUsage }[]>([])
  useEffect(() => {
    let stop = false
    let timer = 0
    setHistory([])
    setGone(false)
    const poll = async () => {
      try {
        const s = await api.sandbox(id)
        if (stop) return
        setDetail(s)
        if (s.memory) setHistory((h) => [...h.slice(-(HISTORY - 1)), { at: Date.now(), m: s.memory! }])
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) {
          if (!stop) setGone(true)
          return
        }
      }
      if (!stop) timer = window.setTimeout(poll, DETAIL_POLL_MS)
    }
    void poll()
    return () => {
      stop = true
      clearTimeout(timer)
    }
  }, [id])
  return { detail, gone, history }
}

/** The terminal, loaded on first use (see terminal.tsx). */
function LazyTerminal({ id }: { id: string }) {
  const [mod, setMod] = useState<typeof import('./terminal') | null>(null)
  const [error, setError] = useState<string | null>(null)
  useEffect(() => {
    import('./terminal').then(setMod, (err) => setError(`could not load the terminal: ${(err as Error).message}`))
  }, [])
  if (error) return <p class="error">{error}</p>
  return mod ? <mod.SandboxTerminal id={id} /> : <p class="muted">Loading the terminal…</p>
}

function Console({ id }: { id: string }) {
  const [text, setText] = useState('')
  const [error, setError] = useState<string | null>(null)
  const pre = useRef<HTMLPreElement>(null)
  useEffect(() => {
    let stop = false
    let timer = 0
    const poll = async () => {
      try {
        const t = await api.logs(id)
        if (stop) return
        const el = pre.current
        const atEnd = !el || el.scrollTop + el.clientHeight >= el.scrollHeight - 8
        setText(t.slice(-LOG_TAIL).replace(ANSI, ''))
        setError(null)
        // Follow the end unless the reader scrolled up.
        if (atEnd) requestAnimationFrame(() => el && (el.scrollTop = el.scrollHeight))
      } catch (err) {
        if (!stop) setError((err as Error).message)
      }
      if (!stop) timer = window.setTimeout(poll, LOG_POLL_MS)
    }
    void poll()
    return () => {
      stop = true
      clearTimeout(timer)
    }
  }, [id])
  return (
    <div>
      {error && <p class="error">{error}</p>}
      <pre class="console" ref={pre} tabIndex={0} aria-label="Serial console" data-testid="console">
        {text || '(empty)'}
      </pre>
    </div>
  )
}

function Overview({ s, history }: { s: Sandbox; history: { at: number; m: MemoryUsage }[] }) {
  const t = s.timings
  const net = s.network
  const limits = Object.entries(s.limits ?? {}).filter(([, v]) => v != null)
  return (
    <div class="overview">
      <div class="cols">
        <section aria-labelledby="h-state">
          <h2 id="h-state">State and resources</h2>
          <Fields
            rows={[
              ['State', s.failure ? `${s.state}: ${s.failure}` : s.state],
              ['Image', s.image],
              ['From snapshot', s.snapshot ? <a href={`#/tree/${s.snapshot}`} class="mono">{s.snapshot}</a> : 'none (cold boot)'],
              ['Guest', `${s.memory_mib} MiB RAM, ${s.cpus} vCPU`],
              ['Accelerator', s.accel],
              ['QEMU pid', s.pid != null ? String(s.pid) : null],
              ['Created', `${new Date(s.created_at).toLocaleString()} (${ago(s.created_at)})`],
              ['Timeout', s.lifetime ? `${Math.round(s.lifetime.remaining_s)} s left, then ${s.lifetime.on_timeout}` : 'none'],
              ['Paused', s.paused ? `${ago(s.paused.paused_at)} (${s.paused.reason}), pause ${ms(s.paused.pause_ms)}` : null],
              ['Limits', limits.length ? limits.map(([k, v]) => `${k}=${v}`).join(', ') : 'none'],
              ['Metadata', Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(', ') || 'none'],
            ]}
          />
        </section>
        <section aria-labelledby="h-use">
          <h2 id="h-use">Use</h2>
          <Fields
            rows={[
              ['RSS', s.memory ? kib(s.memory.rss_kib) : null],
              ['PSS', s.memory ? kib(s.memory.pss_kib) : null],
              ['Private dirty', s.memory ? kib(s.memory.private_dirty_kib) : null],
              ['CPU time', s.usage ? ms(s.usage.cpu_ms) : null],
              ['Own disk', s.usage ? bytes(s.usage.disk_bytes) : null],
              ['Disk layers', s.disk ? `${s.disk.layers}${s.disk.streaming ? ' (streaming)' : ''}` : null],
              ['Network in / out', s.usage?.net_rx_bytes != null ? `${bytes(s.usage.net_rx_bytes)} / ${bytes(s.usage.net_tx_bytes)}` : null],
            ]}
          />
          {!s.memory && <p class="muted">Memory and use are shown while QEMU runs.</p>}
        </section>
        <section aria-labelledby="h-net">
          <h2 id="h-net">Network and ports</h2>
          {net ? (
            <Fields
              rows={[
                ['Mode', net.mode],
                ['Guest address', net.guest_ip],
                ['Gateway', net.gateway],
                ['Host end', net.host_ip],
                ['Ports', net.ports.length ? net.ports.map((p) => `guest ${p.guest} → 127.0.0.1:${p.host}`).join(', ') : 'none'],
                ['Egress', net.egress ? `${net.egress.length} rules` : 'any (but the host and other sandboxes)'],
              ]}
            />
          ) : (
            <p class="muted">No network.</p>
          )}
        </section>
        <section aria-labelledby="h-time">
          <h2 id="h-time">Spawn timings</h2>
          {t ? (
            <Fields
              rows={[
                ['Total', ms(t.total_ms)],
                ['Prepare', ms(t.prepare_ms)],
                ['QEMU start', t.from_pool ? `${ms(t.qemu_start_ms)} (warm pool)` : ms(t.qemu_start_ms)],
                ['Boot', t.boot_ms ? ms(t.boot_ms) : null],
                ['Boot template', t.template_ms != null ? ms(t.template_ms) : null],
                ['Restore', t.restore_ms != null ? ms(t.restore_ms) : null],
                ['Identity', t.identity_ms != null ? ms(t.identity_ms) : null],
                ['Network', t.network_ms != null ? ms(t.network_ms) : null],
                ['Network ready', t.network_ready_ms != null ? ms(t.network_ready_ms) : null],
              ]}
            />
          ) : (
            <p class="muted">No timings.</p>
          )}
        </section>
      </div>
      <XYChart
        title="Memory of its QEMU over time"
        line
        series={[
          { name: 'RSS', cls: 's1', points: history.map((h) => ({ x: h.at, y: h.m.rss_kib / 1024 })) },
          { name: 'PSS', cls: 's2', points: history.map((h) => ({ x: h.at, y: h.m.pss_kib / 1024 })) },
        ]}
        xFormat={clock}
        yFormat={mib}
        empty="Sampled every 2 s while it runs."
      />
    </div>
  )
}

export function SandboxPage({ id, store, onNotice }: Props) {
  const [tab, setTab] = useState<Tab>('overview')
  // The terminal stays mounted once opened, so switching tabs keeps the shell.
  const [termOpened, setTermOpened] = useState(false)
  const { detail, gone, history } = useSandboxDetail(id)
  useEffect(() => {
    setTab('overview')
    setTermOpened(false)
  }, [id])
  const s = store.sandboxes.get(id) ?? detail
  const merged = s && detail ? { ...s, ...detail, state: s.state } : s
  const tabs = useRef<HTMLDivElement>(null)

  if (!merged) {
    return (
      <div class="sandbox-page">
        <p>{gone ? `There is no sandbox ${id} (it was removed).` : 'Loading…'}</p>
        <a href="#/">Back to the tree</a>
      </div>
    )
  }
  const choose = (t: Tab) => {
    setTab(t)
    if (t === 'terminal') setTermOpened(true)
  }
  const onTabKey = (e: KeyboardEvent) => {
    const i = TABS.findIndex(([t]) => t === tab)
    const next = e.key === 'ArrowRight' ? (i + 1) % TABS.length : e.key === 'ArrowLeft' ? (i + TABS.length - 1) % TABS.length : -1
    if (next < 0) return
    e.preventDefault()
    choose(TABS[next][0])
    ;(tabs.current?.querySelectorAll('[role=tab]')[next] as HTMLElement | undefined)?.focus()
  }
  const node = { key: id, type: 'sandbox' as const, parent: null, children: [], link: 'root' as const, sandbox: merged, at: 0 }
  return (
    <div class="sandbox-page">
      <p>
        <a href={`#/tree/${id}`}>← Tree</a>
      </p>
      <h1>
        Sandbox <span class="mono">{id}</span> <span class={`badge b-${merged.state}`}>{merged.state}</span>
      </h1>
      {gone && <p class="error">This sandbox was removed.</p>}
      <Actions node={node} onNotice={onNotice} onRemoved={() => (window.location.hash = '#/')} />
      <div role="tablist" aria-label="Sandbox views" class="tabs" ref={tabs} onKeyDown={onTabKey}>
        {TABS.map(([t, label]) => (
          <button
            type="button"
            role="tab"
            id={`tab-${t}`}
            aria-selected={tab === t}
            aria-controls={`panel-${t}`}
            tabIndex={tab === t ? 0 : -1}
            onClick={() => choose(t)}
          >
            {label}
          </button>
        ))}
      </div>
      <div role="tabpanel" id="panel-overview" aria-labelledby="tab-overview" hidden={tab !== 'overview'}>
        {tab === 'overview' && <Overview s={merged} history={history} />}
      </div>
      <div role="tabpanel" id="panel-console" aria-labelledby="tab-console" hidden={tab !== 'console'}>
        {tab === 'console' && <Console id={id} />}
      </div>
      <div role="tabpanel" id="panel-terminal" aria-labelledby="tab-terminal" hidden={tab !== 'terminal'}>
        {termOpened && !gone && <LazyTerminal id={id} />}
        {merged.state !== 'running' && <p class="muted">The sandbox is {merged.state}; a terminal needs it running.</p>}
      </div>
      <div role="tabpanel" id="panel-files" aria-labelledby="tab-files" hidden={tab !== 'files'}>
        {tab === 'files' && <SandboxFiles id={id} />}
      </div>
    </div>
  )
}
