// Headless Debian Chromium through playwright-core (which ships no browser of
// its own), plus the checks every dashboard page gets: axe-core's scan, and a
// record of every request the page makes so that one to any other origin
// than the daemon's fails the test.
import { existsSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium'

export async function launch() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no Chromium at ${CHROMIUM}: run scripts/setup.sh (it installs Debian's chromium)`)
  }
  let chromium
  try {
    ;({ chromium } = await import('playwright-core'))
  } catch {
    throw new Error('playwright-core is not installed in tests/ui/node_modules: run scripts/setup.sh')
  }
  // --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
  return chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] })
}

/** Every request of a context whose origin is not `origin` (data: and blob: are local). */
export function recordForeignRequests(context, origin) {
  const foreign = []
  const all = []
  context.on('request', (r) => {
    const u = new URL(r.url())
    all.push(r.url())
    if (u.protocol === 'data:' || u.protocol === 'blob:') return
    if (u.origin !== origin) foreign.push(r.url())
  })
  return { foreign, all }
}

const require = createRequire(import.meta.url)
let axeSource = null

/**
 * Run axe-core in the page; returns its violations. The script comes from
 * node_modules, so the scan itself loads nothing from anywhere.
 */
export async function axeScan(page) {
  axeSource ??= readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8')
  // Evaluated through the DevTools protocol, which the page's Content
  // Security Policy (script-src 'self') does not apply to; a <script> tag
  // would be refused, as it should be.
  await page.evaluate(axeSource)
  const result = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] })
    return r.violations.map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' ')),
    }))
  })
  return result
}
