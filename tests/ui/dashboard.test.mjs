// End-to-end test of the dashboard: a real daemon (FORKVM_BIN) serving the
// freshly built ui/dist, real QEMU sandboxes, Debian's Chromium. One browser
// session walks through what a person would do, in order; each step needs
// the previous one, so the first failure stops the rest.
//
// Run it with scripts/test-ui.sh (it checks the tools first).
import assert from 'node:assert/strict'
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { axeScan, launch, recordForeignRequests } from './browser.mjs'
import { REPO, startDaemon } from './daemon.mjs'

// Under TCG a cold boot takes ~10 s and a branch of 3 a few seconds; these
// are ceilings for a slow, shared host, not expected times.
const BOOT_MS = 180_000
const BRANCH_MS = 120_000
const UI_MS = 20_000

const UI_DIR = join(REPO, 'ui', 'dist')
const IMG_DIR = join(REPO, 'docs', 'img')

let daemon
let browser
let context
let page
let requests
const cspErrors = []
const state = {}

async function cleanup() {
  await browser?.close().catch(() => undefined)
  await daemon?.stop()
}
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, () => {
    cleanup().finally(() => process.exit(130))
  })
}

before(async () => {
  daemon = await startDaemon({ uiDir: UI_DIR })
  browser = await launch()
  context = await browser.newContext({ viewport: { width: 1680, height: 1000 } })
  requests = recordForeignRequests(context, daemon.url)
  page = await context.newPage()
  page.setDefaultTimeout(UI_MS)
  page.on('pageerror', (e) => console.log(`# page error: ${e.message}`))
  // The daemon sends a Content Security Policy; anything it blocks is a bug.
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy/i.test(m.text())) cspErrors.push(m.text())
  })
})

after(async () => {
  if (daemon) console.log(`# daemon log (tail):\n${daemon.log().split('\n').slice(-15).map((l) => `#   ${l}`).join('\n')}`)
  await cleanup()
})

// Steps build on each other: after a failure the later ones are skipped, so
// the report shows the first failure rather than its knock-on effects.
let broken = null
function step(name, fn, { independent = false } = {}) {
  test(name, async (t) => {
    if (broken && !independent) {
      t.skip(`"${broken}" failed`)
      return
    }
    try {
      await fn(t)
    } catch (err) {
      broken ??= name
      throw err
    }
  })
}

const node = (key) => page.locator(`#node-${key.replace(/[^A-Za-z0-9_-]/g, '_')}`)
const focusedKey = () => page.evaluate(() => document.activeElement?.getAttribute('data-key') ?? null)

/** Wait for the header's notice to match `re` (an action's report); returns the match. */
async function notice(re, timeout) {
  const el = page.getByTestId('notice')
  await page.waitForFunction(
    ([src, flags]) => new RegExp(src, flags).test(document.querySelector('[data-testid=notice]')?.textContent ?? ''),
    [re.source, re.flags],
    { timeout },
  )
  const text = await el.textContent()
  assert.doesNotMatch(text, /failed/i, text)
  return text.match(re)
}

step('1. the dashboard asks for the token and opens with it', async () => {
  const r = await page.goto(`${daemon.url}/ui/`)
  assert.ok(r.ok(), `GET /ui/ (after redirects) answered ${r.status()}`)
  assert.match(new URL(page.url()).pathname, /^\/ui\/login/, 'an unauthenticated /ui/ goes to the login page')
  await page.fill('input[name=token]', daemon.token)
  await Promise.all([page.waitForURL(/\/ui\/(#.*)?$/), page.press('input[name=token]', 'Enter')])
  const cookies = await context.cookies(daemon.url)
  assert.equal(cookies.length, 1, `one login cookie, got ${JSON.stringify(cookies)}`)
  assert.equal(cookies[0].httpOnly, true, 'the cookie is HttpOnly')
  assert.equal(cookies[0].sameSite, 'Strict', 'the cookie is SameSite=Strict')
  state.cookie = cookies[0]
  await node('image:default').waitFor()
  // The header says how the page hears of changes: it must be the event stream.
  await page.waitForFunction(() => document.querySelector('[data-testid=link-state]')?.textContent?.includes('live'))
  // A marker that a reload would wipe: step 4 checks the tree changed live.
  await page.evaluate(() => (window.__noReload = true))
})

step('2. spawn a sandbox from the image', async () => {
  await node('image:default').click()
  await page.getByRole('button', { name: 'Spawn…' }).click()
  const dialog = page.getByRole('dialog')
  await dialog.getByLabel('Count').fill('1')
  await dialog.getByRole('button', { name: 'Spawn', exact: true }).click()
  const m = await notice(/Spawned (sb-[0-9a-f]+)/, BOOT_MS)
  state.sandbox = m[1]
  await node(state.sandbox).waitFor()
  const label = await node(state.sandbox).textContent()
  assert.match(label, /running/, `the new sandbox's node says it runs: ${label}`)
})

step('3. branch it into 3 children', async () => {
  await node(state.sandbox).click()
  await page.getByRole('button', { name: 'Branch…' }).click()
  const dialog = page.getByRole('dialog')
  await dialog.getByLabel('Mode').selectOption('diff')
  await dialog.getByLabel('Children').fill('3')
  await dialog.getByRole('button', { name: 'Branch', exact: true }).click()
  const m = await notice(/Branched (sb-[0-9a-f]+) at (sn-[0-9a-f]+) \(diff\) into 3/, BRANCH_MS)
  state.branch = m[2]
})

step('4. the branch point and its 3 children appear without a reload', async () => {
  const bp = node(state.branch)
  await bp.waitFor()
  assert.equal(await bp.getAttribute('data-parent'), state.sandbox, 'the branch point hangs from its source')
  const label = await bp.textContent()
  assert.match(label, /diff · [0-9.]+ m?s/, `the branch point shows its mode and pause: ${label}`)
  const kids = page.locator(`[role=treeitem][data-parent="${state.branch}"]`)
  await page.waitForFunction((bp) => document.querySelectorAll(`[role=treeitem][data-parent="${bp}"]`).length === 3, state.branch)
  state.children = await kids.evaluateAll((els) => els.map((e) => e.getAttribute('data-key')))
  assert.equal(state.children.length, 3)

  // A change made elsewhere (the API, not this page) arrives through the event stream.
  const snap = await daemon.api('POST', `/v1/sandboxes/${state.children[0]}/snapshot`, { tag: 'from-the-api' })
  await node(snap.id).waitFor({ timeout: BRANCH_MS })
  assert.equal(await node(snap.id).getAttribute('data-parent'), state.children[0])
  state.apiSnapshot = snap.id
  assert.equal(await page.evaluate(() => window.__noReload), true, 'the page was not reloaded')
})

step('keyboard: arrows move focus, Left/Right collapse and expand, Home/End jump', async () => {
  // Each key's effect is awaited (a re-render follows the key press), up to UI_MS.
  const focusIs = (key, why) =>
    page
      .waitForFunction((k) => document.activeElement?.getAttribute('data-key') === k, key, { timeout: UI_MS })
      .catch(async () => assert.fail(`${why}: focus is on ${await focusedKey()}, not ${key}`))
  const expandedIs = (key, value, why) =>
    page
      .waitForFunction(([id, v]) => document.getElementById(id)?.getAttribute('aria-expanded') === v, [`node-${key}`, value], { timeout: UI_MS })
      .catch(() => assert.fail(why))
  await node(state.branch).click()
  await focusIs(state.branch, 'a click focuses the node')
  await page.keyboard.press('ArrowDown')
  await focusIs(state.children[0], 'Down goes to the first child')
  await page.keyboard.press('ArrowUp')
  await focusIs(state.branch, 'Up comes back')
  await page.keyboard.press('ArrowLeft')
  await expandedIs(state.branch, 'false', 'Left collapses')
  await page.waitForFunction((bp) => !document.querySelector(`[data-parent="${bp}"]`), state.branch)
  await page.keyboard.press('ArrowRight')
  await expandedIs(state.branch, 'true', 'Right expands')
  await page.waitForFunction((bp) => document.querySelectorAll(`[data-parent="${bp}"]`).length === 3, state.branch)
  await page.keyboard.press('ArrowRight')
  await focusIs(state.children[0], 'Right on an open node goes to its first child')
  // children[0] has the snapshot step 4 took: Left closes it, then goes up.
  await page.keyboard.press('ArrowLeft')
  await expandedIs(state.children[0], 'false', 'Left closes an open child')
  await page.keyboard.press('ArrowLeft')
  await focusIs(state.branch, 'Left on a closed node goes to its parent')
  await page.keyboard.press('Home')
  await focusIs('image:default', 'Home goes to the first node')
  await page.keyboard.press('End')
  const last = await page.locator('[role=treeitem]').last().getAttribute('data-key')
  await focusIs(last, 'End goes to the last node')
  const tabbable = await page.locator('[role=treeitem][tabindex="0"]').count()
  assert.equal(tabbable, 1, 'one tree item is in the tab order (roving tabindex)')
})

step('axe: no critical violations on the tree page', async () => {
  mkdirSync(IMG_DIR, { recursive: true })
  await node(state.sandbox).click()
  await page.locator('.tree-scroll').evaluate((el) => el.scrollTo(0, 0))
  await page.screenshot({ path: join(IMG_DIR, 'dashboard-tree.png') })
  const v = await axeScan(page)
  for (const x of v) console.log(`# axe (tree): ${x.impact} ${x.id}: ${x.help} ${x.nodes.join(', ')}`)
  assert.deepEqual(v.filter((x) => x.impact === 'critical'), [])
})

step('5. a child\'s terminal runs `echo hi`', async () => {
  const child = state.children[1]
  await node(child).click()
  await page.keyboard.press('Enter')
  await page.waitForURL(new RegExp(`#/sandbox/${child}$`))
  await page.getByRole('tab', { name: 'Terminal' }).click()
  await page.waitForFunction(() => /shell pid \d+/.test(document.querySelector('#panel-terminal [role=status]')?.textContent ?? ''), null, {
    timeout: BRANCH_MS,
  })
  await page.getByTestId('terminal').click()
  await page.keyboard.type('echo hi\n')
  // The command line holds "echo hi"; its output is a row that is just "hi".
  await page.waitForFunction(
    () => [...document.querySelectorAll('.xterm-rows > div')].some((r) => r.textContent.trim() === 'hi'),
    null,
    { timeout: BRANCH_MS },
  )
})

step('axe: no critical violations on the sandbox page', async () => {
  await page.getByRole('tab', { name: 'Overview' }).click()
  // Two memory samples (one per 2 s) make the chart a line.
  await page.waitForFunction(() => document.querySelectorAll('.chart circle').length >= 4, null, { timeout: UI_MS })
  await page.screenshot({ path: join(IMG_DIR, 'dashboard-sandbox.png') })
  const v = await axeScan(page)
  for (const x of v) console.log(`# axe (sandbox): ${x.impact} ${x.id}: ${x.help} ${x.nodes.join(', ')}`)
  assert.deepEqual(v.filter((x) => x.impact === 'critical'), [])
})

step('6. remove a child, confirming first', async () => {
  const child = state.children[2]
  await page.goto(`${daemon.url}/ui/#/tree/${child}`)
  await node(child).click()
  await page.getByRole('button', { name: 'Remove…' }).click()
  const dialog = page.getByRole('dialog', { name: `Remove ${child}?` })
  await dialog.getByRole('button', { name: 'Cancel' }).click()
  await dialog.waitFor({ state: 'detached' })
  assert.equal(await node(child).count(), 1, 'Cancel keeps it')
  await page.getByRole('button', { name: 'Remove…' }).click()
  await dialog.getByRole('button', { name: 'Remove', exact: true }).click()
  await node(child).waitFor({ state: 'detached', timeout: BRANCH_MS })
  const r = await fetch(`${daemon.url}/v1/sandboxes/${child}`, { headers: { authorization: `Bearer ${daemon.token}` } })
  assert.equal(r.status, 404, 'the daemon no longer has it')
})

step('6b. pause a child, then branch it while it stays paused', async () => {
  const child = state.children[0]
  await page.goto(`${daemon.url}/ui/#/tree/${child}`)
  await node(child).click()
  await page.getByRole('button', { name: 'Pause' }).click()
  await notice(/Paused/, BRANCH_MS)
  await page.waitForFunction((k) => /paused/.test(document.getElementById(`node-${k}`)?.textContent ?? ''), child, { timeout: BRANCH_MS })
  await page.getByRole('button', { name: 'Branch…' }).click()
  const dialog = page.getByRole('dialog')
  await dialog.getByLabel('Children').fill('2')
  await dialog.getByRole('button', { name: 'Branch', exact: true }).click()
  const m = await notice(/Branched (sb-[0-9a-f]+) at (sn-[0-9a-f]+) \(\w+\) into 2/, BRANCH_MS)
  // The branch point is the pause's snapshot, hanging from the paused sandbox, with the 2 children.
  await node(m[2]).waitFor({ timeout: BRANCH_MS })
  assert.equal(await node(m[2]).getAttribute('data-parent'), child, 'the pause snapshot hangs from its sandbox')
  await page.waitForFunction((bp) => document.querySelectorAll(`[role=treeitem][data-parent="${bp}"]`).length === 2, m[2], { timeout: BRANCH_MS })
  const sb = await daemon.api('GET', `/v1/sandboxes/${child}`)
  assert.equal(sb.state, 'paused', 'the source stays paused')
})

step('6c. a branch child\'s changes with a patch; a dry run, a refused conflict, then the merge into its source', async () => {
  const child = state.children[1]
  const src = state.sandbox
  const sh = async (id, cmd) => {
    const r = await daemon.api('POST', `/v1/sandboxes/${id}/exec`, { argv: ['sh', '-c', cmd] })
    assert.equal(r.exit_code, 0, `${id}: ${cmd}: ${r.stderr}`)
    return r.stdout
  }
  // A new file, an edit of one the image has (so the source has it too), and
  // a file both write differently: a conflict.
  await sh(child, "printf 'from the child\\n' > /root/ui-merge.txt && echo '# edited by the child' >> /root/.bashrc && echo child > /root/ui-both.txt")
  await sh(src, 'echo source > /root/ui-both.txt')
  await page.goto(`${daemon.url}/ui/#/tree/${child}`)
  await node(child).click()
  await page.getByRole('button', { name: 'Changes…' }).click()
  const dialog = page.getByRole('dialog', { name: `Changes of ${child}` })
  const row = (p) => dialog.getByTestId('changes').locator(`tr[data-path="${p}"]`)
  await row('/root/ui-merge.txt').waitFor({ timeout: BRANCH_MS })
  assert.match(await row('/root/ui-merge.txt').textContent(), /^A added/)
  assert.match(await row('/root/.bashrc').textContent(), /^C changed/)
  // The patch, asked for from the keyboard.
  await row('/root/.bashrc').getByRole('button', { name: /^Patch/ }).focus()
  await page.keyboard.press('Enter')
  const patch = dialog.getByTestId('patch')
  await patch.waitFor({ timeout: BRANCH_MS })
  assert.match(await patch.textContent(), /^\+# edited by the child$/m)
  mkdirSync(IMG_DIR, { recursive: true })
  await page.screenshot({ path: join(IMG_DIR, 'dashboard-changes.png') })

  // Merge into source…: a dry run first; without a strategy the conflict
  // refuses the merge (the 409's message shows); "theirs" settles it.
  await dialog.getByRole('button', { name: 'Merge into source…' }).click()
  const merge = page.getByRole('dialog', { name: `Merge ${child} into ${src}?` })
  const applied = (p) => merge.getByTestId('merge-applied').locator(`tr[data-path="${p}"]`)
  await applied('/root/ui-merge.txt').waitFor({ timeout: BRANCH_MS })
  await applied('/root/.bashrc').waitFor()
  await merge.getByTestId('merge-conflicts').locator('tr[data-path="/root/ui-both.txt"]').waitFor()
  assert.equal(await sh(src, 'test -e /root/ui-merge.txt || echo absent'), 'absent\n', 'a dry run changes nothing')
  await merge.getByRole('button', { name: 'Merge', exact: true }).click()
  const refused = merge.getByRole('alert')
  await refused.waitFor({ timeout: BRANCH_MS })
  assert.match(await refused.textContent(), /conflict.*\/root\/ui-both\.txt/, 'the 409 names the conflict')
  assert.equal(await sh(src, 'cat /root/ui-both.txt'), 'source\n', 'a refused merge changes nothing')
  await merge.getByRole('radio', { name: /theirs:/ }).check()
  await merge.getByTestId('merge-settled').locator('tr[data-path="/root/ui-both.txt"]').waitFor({ timeout: BRANCH_MS })
  await merge.getByRole('button', { name: 'Merge', exact: true }).click()
  await notice(new RegExp(`Merged \\d+ changes? of ${child} into ${src}, 1 conflict settled \\(theirs\\)`), BRANCH_MS)
  const done = page.getByRole('dialog', { name: `Merged ${child} into ${src}` })
  await done.getByTestId('merge-applied').locator('tr[data-path="/root/ui-merge.txt"]').waitFor()
  const v = await axeScan(page)
  for (const x of v) console.log(`# axe (merge): ${x.impact} ${x.id}: ${x.help} ${x.nodes.join(', ')}`)
  assert.deepEqual(v.filter((x) => x.impact === 'critical'), [])
  await done.getByRole('button', { name: 'Done' }).click()
  await done.waitFor({ state: 'detached' })
  for (const f of ['/root/ui-merge.txt', '/root/.bashrc', '/root/ui-both.txt']) {
    assert.equal(await sh(src, `cat ${f}`), await sh(child, `cat ${f}`), `${src} has ${child}'s ${f}`)
  }
})

step('6d. time travel: checkpoint twice, see the timeline, rewind to the first, prune', async () => {
  const sb = state.children[1]
  const sh = async (cmd) => {
    const r = await daemon.api('POST', `/v1/sandboxes/${sb}/exec`, { argv: ['sh', '-c', cmd] })
    assert.equal(r.exit_code, 0, `${cmd}: ${r.stderr}`)
    return r.stdout.trim()
  }
  const marker = (id) => page.locator(`[data-key="timeline:${sb}"] .step[data-id="${id}"]`)
  const headIs = (id) => page.locator(`[data-key="timeline:${sb}"] .step.head[data-id="${id}"]`).waitFor()
  await page.goto(`${daemon.url}/ui/#/tree/${sb}`)
  // A fresh marker a reload would wipe: everything below arrives live.
  await page.evaluate(() => (window.__timeTravel = true))
  // `seq` keeps the notice of the previous checkpoint from matching.
  const checkpoint = async (seq, tag) => {
    await node(sb).click()
    await page.getByRole('button', { name: 'Checkpoint…' }).click()
    const dialog = page.getByRole('dialog', { name: `Checkpoint ${sb}` })
    if (tag) await dialog.getByLabel('Tag (optional)').fill(tag)
    await dialog.getByRole('button', { name: 'Checkpoint', exact: true }).click()
    const m = await notice(new RegExp(`Checkpoint (sn-[0-9a-f]+) \\(step ${seq}\\) of ${sb}`), BRANCH_MS)
    await dialog.waitFor({ state: 'detached' })
    return { id: m[1], seq }
  }
  await sh('echo one > /root/time-travel')
  const one = await checkpoint(1, 'tt-one')
  await sh('echo two > /root/time-travel')
  const two = await checkpoint(2)

  // The timeline row: two step markers under the sandbox, the second the head.
  const row = node(`timeline:${sb}`)
  await row.waitFor()
  assert.equal(await row.getAttribute('data-parent'), sb, 'the timeline hangs from its sandbox')
  await headIs(two.id)
  assert.deepEqual(await row.locator('.step[data-id]').evaluateAll((els) => els.map((e) => e.dataset.step)), ['1', '2'])
  assert.match(await marker(one.id).getAttribute('title'), /step 1 · tag tt-one · stores [0-9.]+ \w+ · paused [0-9.]+ m?s/)
  assert.equal(await node(one.id).count(), 0, 'a checkpoint is a step of the row, not a box of its own')

  // Rewind to the first, with "checkpoint the present first" (on by default).
  await marker(one.id).click()
  await page.getByRole('button', { name: 'Rewind here…' }).click()
  const dialog = page.getByRole('dialog', { name: new RegExp(`^Rewind ${sb} to step 1`) })
  assert.equal(await dialog.getByLabel(/Checkpoint the present first/).isChecked(), true, 'checkpoint first is the default')
  await dialog.getByRole('button', { name: 'Rewind', exact: true }).click()
  const m = await notice(new RegExp(`Rewound ${sb} to ${one.id} in .*saved as (sn-[0-9a-f]+) \\(step 3\\)`), BRANCH_MS)
  const undo = m[1]
  assert.equal(await sh('cat /root/time-travel'), 'one', "the sandbox's state is the first checkpoint's")
  const t = await daemon.api('GET', `/v1/sandboxes/${sb}/timeline`)
  assert.equal(t.head, one.id, `the head is the first checkpoint: ${JSON.stringify(t)}`)
  assert.deepEqual(t.checkpoints.map((c) => c.id), [one.id, two.id, undo])
  assert.equal((await daemon.api('GET', `/v1/sandboxes/${sb}`)).state, 'running')
  // The undo checkpoint shows, and the head moved back to step 1.
  await marker(undo).waitFor()
  await headIs(one.id)
  assert.equal(await row.locator('.step.head').count(), 1, 'one head')

  mkdirSync(IMG_DIR, { recursive: true })
  await row.click({ position: { x: 12, y: 10 } })
  await page.getByTestId('timeline-table').waitFor()
  await row.scrollIntoViewIfNeeded()
  await page.screenshot({ path: join(IMG_DIR, 'dashboard-timeline.png') })
  const v = await axeScan(page)
  for (const x of v) console.log(`# axe (timeline): ${x.impact} ${x.id}: ${x.help} ${x.nodes.join(', ')}`)
  assert.deepEqual(v.filter((x) => x.impact === 'critical'), [])

  // Retention through the page: keep the last 1. Step 1 stays (tagged, and
  // the sandbox runs from it), step 3 is the newest; step 2 goes, live.
  await page.getByRole('button', { name: 'Retention…' }).click()
  const ret = page.getByRole('dialog', { name: `Retention of ${sb}` })
  await ret.getByLabel('Keep last').fill('1')
  await ret.getByRole('button', { name: 'Set', exact: true }).click()
  await notice(new RegExp(`Retention of ${sb}: keeps last 1; 2 checkpoints kept`), BRANCH_MS)
  await marker(two.id).waitFor({ state: 'detached' })
  const after = await daemon.api('GET', `/v1/sandboxes/${sb}/timeline`)
  assert.deepEqual(after.checkpoints.map((c) => c.seq), [1, 3])
  assert.equal(await page.evaluate(() => window.__timeTravel), true, 'the page was not reloaded')
})

step('7. a wrong token is refused', async () => {
  const other = await browser.newContext()
  const foreign = recordForeignRequests(other, daemon.url)
  try {
    const p = await other.newPage()
    await p.goto(`${daemon.url}/ui/login`)
    await p.fill('input[name=token]', 'not-the-token')
    const [resp] = await Promise.all([
      p.waitForResponse((r) => r.request().method() === 'POST' && new URL(r.url()).pathname === '/ui/login'),
      p.press('input[name=token]', 'Enter'),
    ])
    assert.equal(resp.status(), 401)
    await p.waitForLoadState()
    assert.match(await p.textContent('body'), /wrong token/i)
    assert.deepEqual(await other.cookies(daemon.url), [], 'no cookie for a wrong token')
    // A forged cookie (the real name, a wrong value) is refused by the API.
    assert.ok(state.cookie, 'step 1 logged in and got the cookie name')
    const bad = await fetch(`${daemon.url}/v1/info`, { headers: { cookie: `${state.cookie.name}=${'0'.repeat(32)}` } })
    assert.equal(bad.status, 401)
    assert.deepEqual(foreign.foreign, [])
  } finally {
    await other.close()
  }
}, { independent: true })

step('the page requested nothing but the daemon, and broke no CSP rule', () => {
  assert.ok(requests.all.length > 0, 'requests were recorded')
  assert.deepEqual(requests.foreign, [], 'requests to other origins')
  assert.deepEqual(cspErrors, [], 'nothing the Content Security Policy blocked')
}, { independent: true })
