// Dashboard render benchmark (issue 17): how long the branch tree takes to
// show N nodes in headless Chromium, against the time the same page takes to
// fetch and parse the three raw lists it is built from.
//
// 1. A real daemon (FORKVM_BIN) serving ui/dist; a tree of --nodes nodes made
//    through the API. Sandboxes are real VMs (~27 MiB and some CPU each), so
//    most nodes are branch points: a few sources, each branched many times
//    with `count: 0` (a branch point without children), some snapshotted
//    (`POST .../snapshot`), a few children, two flattened snapshots.
// 2. --runs times: a fresh browser context (cold cache, new login), open
//    /ui/, wait for the app's `forkvm:tree-laid-out` mark with every node in
//    the DOM. tree_ms = that mark's time from navigation start. Then, in the
//    same page, the baseline: fetch + JSON.parse of /v1/images, /v1/snapshots
//    and /v1/sandboxes (baseline_ms).
// Writes ui.csv (one row per run) and meta.json (machine-independent facts
// the report needs) into --out; report_ui.py makes RESULTS.md and ui.png.
import { mkdirSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { launch } from '../../tests/ui/browser.mjs'
import { REPO, startDaemon } from '../../tests/ui/daemon.mjs'

const { values: opt } = parseArgs({
  options: {
    nodes: { type: 'string', default: '500' },
    runs: { type: 'string', default: '10' },
    sources: { type: 'string', default: '4' },
    children: { type: 'string', default: '2' },
    out: { type: 'string', default: join(REPO, 'bench', 'ui', 'results') },
    smoke: { type: 'boolean', default: false },
  },
})
const NODES = Number(opt.nodes)
const RUNS = Number(opt.runs)
const SOURCES = Number(opt.sources)
const CHILDREN = Number(opt.children)
if (!opt.smoke && (RUNS < 10 || NODES < 500)) {
  console.error('bench_ui: --runs below 10 or --nodes below 500 needs --smoke (not a valid result)')
  process.exit(2)
}
const OUT = resolve(opt.out)
mkdirSync(OUT, { recursive: true })
// Ceiling for one page to show the tree: far above any expected time, so a
// hang fails the run instead of stalling it.
const RENDER_TIMEOUT_MS = 120_000

const log = (m) => console.log(`[bench-ui] ${m}`)

async function countNodes(api) {
  const [i, sn, sb] = await Promise.all([api('GET', '/v1/images'), api('GET', '/v1/snapshots'), api('GET', '/v1/sandboxes')])
  return { images: i.images.length, snapshots: sn.snapshots, sandboxes: sb.sandboxes }
}

/** Make the tree: sources, their children, then branch points until NODES. */
async function buildTree(api) {
  const t0 = Date.now()
  const batch = await api('POST', '/v1/sandboxes', { image: 'default', count: SOURCES, network: 'none' })
  const sources = batch.sandboxes.map((s) => s.id)
  log(`${sources.length} sources spawned in ${Date.now() - t0} ms`)
  const running = [...sources]
  for (const s of sources) {
    const r = await api('POST', `/v1/sandboxes/${s}/branch`, { mode: 'diff', count: CHILDREN })
    running.push(...r.children.map((c) => c.id))
  }
  log(`${running.length} sandboxes running`)
  const modes = ['diff', 'live', 'full']
  const diffs = []
  let flattened = 0
  // Each call below adds exactly one snapshot; the count is checked against
  // the daemon's lists at the end.
  const start = await countNodes(api)
  let total = start.images + start.snapshots.length + start.sandboxes.length
  for (let i = 0; total < NODES; i++) {
    const sb = running[i % running.length]
    // Two flattened snapshots, once there are diff snapshots to flatten;
    // each holds a whole guest's RAM, so no more than that.
    if (flattened < 2 && diffs.length > 10 && i % 50 === 25) {
      await api('POST', `/v1/snapshots/${diffs[flattened * 5]}/flatten`, {})
      flattened++
      total++
      continue
    }
    if (i % 5 === 4) {
      const s = await api('POST', `/v1/sandboxes/${sb}/snapshot`, {})
      if (s.kind === 'diff') diffs.push(s.id)
    } else {
      // `live` needs a sandbox that owns its RAM; a clone's `live` and
      // `full` are diff saves too, which is what the tree then shows.
      const r = await api('POST', `/v1/sandboxes/${sb}/branch`, { mode: modes[i % 3], count: 0 })
      if (r.snapshot.kind === 'diff') diffs.push(r.snapshot.id)
    }
    total++
    if (total % 50 === 0) log(`${total} nodes…`)
  }
  const { images, snapshots, sandboxes } = await countNodes(api)
  if (images + snapshots.length + sandboxes.length !== total) {
    throw new Error(`the daemon lists ${images + snapshots.length + sandboxes.length} nodes, the bench made ${total}`)
  }
  const kinds = {}
  for (const s of snapshots) kinds[s.kind] = (kinds[s.kind] ?? 0) + 1
  return {
    build_s: (Date.now() - t0) / 1000,
    images,
    snapshots: snapshots.length,
    sandboxes: sandboxes.length,
    total: images + snapshots.length + sandboxes.length,
    kinds,
    flattened,
    branch_points: snapshots.filter((s) => s.origin === 'branch').length,
  }
}

/** One measured page load. */
async function measure(browser, daemon, expected) {
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 } })
  try {
    const login = await context.request.post(`${daemon.url}/ui/login`, { form: { token: daemon.token }, maxRedirects: 0 })
    if (login.status() !== 303) throw new Error(`login answered ${login.status()}`)
    const page = await context.newPage()
    await page.goto(`${daemon.url}/ui/`)
    await page.waitForFunction(
      (n) => performance.getEntriesByName('forkvm:tree-laid-out').some((e) => e.detail?.nodes === n),
      expected,
      { timeout: RENDER_TIMEOUT_MS, polling: 50 },
    )
    return await page.evaluate(async (n) => {
      const mark = performance.getEntriesByName('forkvm:tree-laid-out').find((e) => e.detail?.nodes === n)
      const lists = performance.getEntriesByName('forkvm:lists-loaded')[0]
      const ready = performance.getEntriesByName('forkvm:stream-ready')[0]
      const layout = performance.getEntriesByName('forkvm:layout').filter((e) => e.detail?.nodes === n).pop()
      const nav = performance.getEntriesByType('navigation')[0]
      const dom = document.querySelectorAll('[role=treeitem]').length
      // The baseline: the same three lists, fetched and parsed by this page.
      const t0 = performance.now()
      const bodies = await Promise.all(
        ['/v1/images', '/v1/snapshots', '/v1/sandboxes'].map((p) => fetch(p, { credentials: 'same-origin' }).then((r) => r.text())),
      )
      const parsed = bodies.map((b) => JSON.parse(b))
      const baseline = performance.now() - t0
      return {
        tree_ms: mark.startTime,
        lists_ms: lists ? lists.startTime : NaN,
        render_ms: lists ? mark.startTime - lists.startTime : NaN,
        ready_ms: ready ? ready.startTime : NaN,
        layout_ms: layout ? layout.duration : NaN,
        dom_loaded_ms: nav ? nav.domContentLoadedEventEnd : NaN,
        baseline_ms: baseline,
        list_bytes: bodies.reduce((a, b) => a + b.length, 0),
        dom_nodes: dom,
        parsed_items: parsed[0].images.length + parsed[1].snapshots.length + parsed[2].sandboxes.length,
      }
    }, expected)
  } finally {
    await context.close()
  }
}

let daemon
let browser
const stop = async () => {
  await browser?.close().catch(() => undefined)
  await daemon?.stop()
}
for (const sig of ['SIGINT', 'SIGTERM']) process.once(sig, () => stop().finally(() => process.exit(130)))

try {
  const started = new Date()
  daemon = await startDaemon({ uiDir: join(REPO, 'ui', 'dist') })
  log(`daemon at ${daemon.url}; building a tree of ${NODES} nodes`)
  const tree = await buildTree(daemon.api)
  log(`tree: ${JSON.stringify(tree)}`)
  const info = await daemon.api('GET', '/v1/info')
  browser = await launch()
  const rows = []
  for (let run = 1; run <= RUNS; run++) {
    const r = await measure(browser, daemon, tree.total)
    if (r.dom_nodes !== tree.total) throw new Error(`run ${run}: ${r.dom_nodes} tree items in the DOM, expected ${tree.total}`)
    rows.push({ run, nodes: tree.total, ...r, ratio: r.tree_ms / r.baseline_ms })
    log(
      `run ${run}: tree ${r.tree_ms.toFixed(0)} ms (DOM ready ${r.dom_loaded_ms.toFixed(0)}, stream ready ${r.ready_ms.toFixed(0)}, ` +
        `lists ${r.lists_ms.toFixed(0)}, render ${r.render_ms.toFixed(0)} of which layout ${r.layout_ms.toFixed(0)}), baseline ${r.baseline_ms.toFixed(1)} ms`,
    )
  }
  const fields = ['run', 'nodes', 'tree_ms', 'dom_loaded_ms', 'ready_ms', 'lists_ms', 'render_ms', 'layout_ms', 'baseline_ms', 'ratio', 'list_bytes', 'dom_nodes']
  const csv = [fields.join(','), ...rows.map((r) => fields.map((f) => (typeof r[f] === 'number' && !Number.isInteger(r[f]) ? r[f].toFixed(3) : r[f])).join(','))]
  writeFileSync(join(OUT, 'ui.csv'), csv.join('\n') + '\n')
  writeFileSync(
    join(OUT, 'meta.json'),
    JSON.stringify(
      {
        started: started.toISOString(),
        elapsed_s: (Date.now() - started.getTime()) / 1000,
        smoke: opt.smoke,
        runs: RUNS,
        nodes_asked: NODES,
        sources: SOURCES,
        children_per_source: CHILDREN,
        tree,
        chromium: browser.version(),
        info: { version: info.version, accel: info.accel, qemu: info.qemu },
      },
      null,
      2,
    ) + '\n',
  )
  log(`wrote ${join(OUT, 'ui.csv')} and meta.json`)
} finally {
  await stop()
}
