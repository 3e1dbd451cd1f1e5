// The unmodified npm `e2b` SDK against forkvm (issue 31): snapshots listed,
// filtered and deleted (points 1), a run's `timeoutMs` honoured by the server
// with the process killed (point 2), and a command cut off by a kill
// reported as the sandbox being gone (point 5). One daemon (./daemon.mjs).
import { test, after, before } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, TimeoutError } from 'e2b'
import { startDaemon } from './daemon.mjs'

let daemon
let sbx
before(async () => {
  daemon = await startDaemon()
  sbx = await Sandbox.create({ timeoutMs: 1_800_000 })
})
after(async () => {
  await sbx?.kill().catch(() => {})
  await daemon?.stop()
})

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function all(pager) {
  const out = []
  while (pager.hasNext) out.push(...(await pager.nextItems()).map((s) => s.snapshotId))
  return out
}

test('snapshots are listed, filtered and deleted', async () => {
  const name = `npm-snap-${Date.now()}`
  const snap = await sbx.createSnapshot({ name })
  try {
    assert.deepEqual(snap.names, [name])
    assert.ok((await all(Sandbox.listSnapshots())).includes(snap.snapshotId))
    assert.ok((await all(sbx.listSnapshots())).includes(snap.snapshotId))
    assert.deepEqual(await all(Sandbox.listSnapshots({ name })), [snap.snapshotId])
    assert.deepEqual(await all(Sandbox.listSnapshots({ name: `${name}-absent` })), [])
  } finally {
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  }
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  assert.ok(!(await all(Sandbox.listSnapshots())).includes(snap.snapshotId))
})

test('a run ends at its timeout and its process is killed', async () => {
  const t = Date.now()
  await assert.rejects(sbx.commands.run('sleep 10.75', { timeoutMs: 2000 }), TimeoutError)
  const took = (Date.now() - t) / 1000
  assert.ok(took >= 1.5 && took < 5, `a 2 s timeout ended after ${took} s`)
  let left = true
  for (let i = 0; i < 25 && left; i++) {
    left = (await sbx.commands.list()).some((p) => p.args.join(' ').includes('sleep 10.75'))
    if (left) await sleep(200)
  }
  assert.equal(left, false, 'the timed-out command still runs in the guest')
})

// npm 2.51 has no SandboxNotRunning class: a stream that breaks with
// `unavailable` is its TimeoutError "likely due to sandbox timeout", and a
// dropped connection confirmed by the health probe "killed or reached its end
// of life". Either says the sandbox is gone, not that a request timed out.
test('a command cut off by a kill reports the sandbox gone', async () => {
  const victim = await Sandbox.create({ timeoutMs: 300_000 })
  const cmd = await victim.commands.run('sleep 60', { background: true })
  assert.equal(await victim.kill(), true)
  await assert.rejects(cmd.wait(), (e) => {
    assert.ok(e instanceof TimeoutError, String(e))
    assert.match(e.message, /likely due to sandbox timeout|killed or reached its end of life/)
    return true
  })
})
