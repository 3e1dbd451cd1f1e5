// The unmodified npm `e2b` SDK against a forkvm daemon: create, list, connect,
// fork and kill. The daemon comes from ./daemon.mjs (one per test file).
import { test, after, before } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { startDaemon } from './daemon.mjs'

let daemon
before(async () => {
  daemon = await startDaemon()
})
after(async () => {
  await daemon?.stop()
})

test('create with metadata and envs, list, connect, kill', async () => {
  const sbx = await Sandbox.create({ metadata: { suite: 'npm' }, envs: { GREETING: 'hi' }, timeoutMs: 600_000 })
  try {
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.deepEqual(info.metadata, { suite: 'npm' })
    const listed = await Sandbox.list({ query: { metadata: { suite: 'npm' } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal(await sbx.isRunning(), true)
  } finally {
    assert.equal(await sbx.kill(), true)
  }
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  assert.equal(await sbx.isRunning(), false)
})

test('fork into two children', async () => {
  const parent = await Sandbox.create({ timeoutMs: 600_000 })
  let children = []
  try {
    children = await parent.fork({ count: 2, timeoutMs: 600_000 })
    assert.equal(children.length, 2)
    for (const c of children) {
      assert.ok(c instanceof Sandbox, String(c))
      assert.notEqual(c.sandboxId, parent.sandboxId)
      assert.equal(await c.isRunning(), true)
    }
  } finally {
    for (const c of children) if (c instanceof Sandbox) await c.kill()
    await parent.kill()
  }
})
