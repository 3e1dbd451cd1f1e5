// The charts page: memory of every running sandbox now (RSS and PSS of its
// QEMU, from GET /v1/sandboxes/{id}), and spawn and branch latencies over
// time (spawn `timings.total_ms` of every sandbox the page has seen; each
// branch's pause and total from the `branch` events, the page's own branches
// and the snapshots' `pause_ms`).
import { useEffect, useState } from 'preact/hooks'
import { api } from './api'
import { BarChart, XYChart, type Series } from './chart'
import { clock, mib, ms } from './format'
import type { Store } from './store'
import type { MemoryUsage } from './types'

/** Sandboxes whose memory the page asks for at once (each is one request). */
const MEMORY_LIMIT = 40
const MEMORY_POLL_MS = 5000

export function ChartsPage({ store }: { store: Store }) {
  const [memory, setMemory] = useState<Map<string, MemoryUsage>>(new Map())
  const [memError, setMemError] = useState<string | null>(null)

  useEffect(() => {
    let stop = false
    let timer = 0
    const poll = async () => {
      const ids = [...store.sandboxes.values()]
        .filter((s) => s.state === 'running')
        .map((s) => s.id)
        .sort()
        .slice(0, MEMORY_LIMIT)
      const next = new Map<string, MemoryUsage>()
      try {
        const got = await Promise.all(ids.map((id) => api.sandbox(id).catch(() => null)))
        for (const s of got) if (s?.memory) next.set(s.id, s.memory)
        if (!stop) {
          setMemory(next)
          setMemError(null)
        }
      } catch (err) {
        if (!stop) setMemError((err as Error).message)
      }
      if (!stop) timer = window.setTimeout(poll, MEMORY_POLL_MS)
    }
    void poll()
    return () => {
      stop = true
      clearTimeout(timer)
    }
  }, [])

  const ids = [...memory.keys()].sort()
  const spawns = [...store.spawns.values()].sort((a, b) => a.at - b.at)
  const spawnSeries: Series[] = [
    { name: 'spawn from a snapshot', cls: 's1', points: spawns.filter((s) => s.restore && !s.from_pool).map((s) => ({ x: s.at, y: s.total_ms, label: s.sandbox })) },
    { name: 'spawn from the warm pool', cls: 's2', points: spawns.filter((s) => s.from_pool).map((s) => ({ x: s.at, y: s.total_ms, label: s.sandbox })) },
    { name: 'cold boot', cls: 's3', points: spawns.filter((s) => !s.restore).map((s) => ({ x: s.at, y: s.total_ms, label: s.sandbox })) },
  ]
  const branches = [...store.branches.values()].sort((a, b) => a.at - b.at)
  const branchSeries: Series[] = (['diff', 'live', 'full', null] as const).map((m, i) => ({
    name: m ? `pause, ${m}` : 'pause, mode unknown',
    cls: `s${i + 1}`,
    points: branches.filter((b) => b.mode === m && b.pause_ms != null).map((b) => ({ x: b.at, y: b.pause_ms!, label: b.snapshot })),
  }))
  const totals: Series[] = [
    { name: 'branch total (snapshot + children)', cls: 's1', points: branches.filter((b) => b.total_ms != null).map((b) => ({ x: b.at, y: b.total_ms!, label: b.snapshot })) },
  ]
  return (
    <div class="charts-page">
      <h1>Charts</h1>
      {memError && <p class="error">{memError}</p>}
      <BarChart
        title={`Memory of running sandboxes (QEMU RSS and PSS${ids.length === MEMORY_LIMIT ? `, first ${MEMORY_LIMIT}` : ''})`}
        categories={ids}
        series={[
          { name: 'RSS', cls: 's1', values: ids.map((id) => memory.get(id)!.rss_kib / 1024) },
          { name: 'PSS (shared pages split among sharers)', cls: 's2', values: ids.map((id) => memory.get(id)!.pss_kib / 1024) },
        ]}
        format={mib}
        empty="No running sandboxes."
      />
      <XYChart title="Spawn latency (total_ms) over time" series={spawnSeries} xFormat={clock} yFormat={ms} empty="No spawns seen yet." />
      <XYChart title="Branch: the source's pause over time" series={branchSeries.filter((s) => s.points.length)} xFormat={clock} yFormat={ms} empty="No branches seen yet." />
      <XYChart title="Branch: total time over time" series={totals} xFormat={clock} yFormat={ms} empty="No branch totals seen yet (they come from branch events and this page's branches)." />
    </div>
  )
}
