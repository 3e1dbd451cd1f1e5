// The unmodified npm `e2b` SDK's `commands` and `files` against forkvm's envd
// (docs/e2b.md): foreground and background commands, stdin, connect, list,
// kill, env vars, cwd, exit codes; writes, reads, listing, stat, rename,
// remove, mkdir and a streamed directory watch. One daemon (./daemon.mjs)
// and one sandbox for the file.
import { test, after, before } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, FileNotFoundError, FileType, FilesystemEventType } from 'e2b'
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

test('foreground run with callbacks, env vars and cwd', async () => {
  const out = []
  const err = []
  const r = await sbx.commands.run('echo "hi $WHO"; echo oops >&2; pwd', {
    envs: { WHO: 'npm' },
    cwd: '/tmp',
    onStdout: (d) => out.push(d),
    onStderr: (d) => err.push(d),
  })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hi npm\n/tmp\n')
  assert.equal(r.stderr, 'oops\n')
  assert.equal(out.join(''), 'hi npm\n/tmp\n')
  assert.equal(err.join(''), 'oops\n')
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
})

test('a non-zero exit rejects with CommandExitError', async () => {
  await assert.rejects(sbx.commands.run('echo why >&2; exit 4'), (e) => {
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, 4)
    assert.equal(e.stderr, 'why\n')
    return true
  })
})

test('background: stdin, connect, list, kill', async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'abc')
  await cat.closeStdin()
  assert.equal((await cat.wait()).stdout, 'abc')

  const slow = await sbx.commands.run('echo first; sleep 2; echo second', { background: true })
  await slow.disconnect()
  const again = await sbx.commands.connect(slow.pid)
  assert.equal((await again.wait()).stdout, 'first\nsecond\n')

  const sleeper = await sbx.commands.run('sleep 600', { background: true })
  const listed = await sbx.commands.list()
  const mine = listed.find((p) => p.pid === sleeper.pid)
  assert.ok(mine, 'the background command is listed')
  assert.deepEqual(mine.args, ['-l', '-c', 'sleep 600'])
  assert.equal(await sleeper.kill(), true)
  await assert.rejects(sleeper.wait(), CommandExitError)
  for (let i = 0; (await sbx.commands.list()).some((p) => p.pid === sleeper.pid); i++) {
    assert.ok(i < 100, 'the killed command leaves the list')
    await sleep(300)
  }
  assert.equal(await sbx.commands.kill(sleeper.pid), false)
})

test('files: write, read, list, stat, rename, remove, mkdir', async () => {
  const d = `/tmp/npm-${Date.now()}`
  assert.equal(await sbx.files.makeDir(d), true)
  assert.equal(await sbx.files.makeDir(d), false)

  const info = await sbx.files.write(`${d}/a/hello.txt`, 'hello')
  assert.equal(info.path, `${d}/a/hello.txt`)
  assert.equal(await sbx.files.read(`${d}/a/hello.txt`), 'hello')
  const bytes = new Uint8Array([0, 1, 2, 255])
  await sbx.files.write(`${d}/b.bin`, bytes)
  assert.deepEqual(await sbx.files.read(`${d}/b.bin`, { format: 'bytes' }), bytes)

  const many = await sbx.files.write([
    { path: `${d}/m1.txt`, data: 'one' },
    { path: `${d}/m2.txt`, data: 'two' },
  ])
  assert.deepEqual(many.map((w) => w.path), [`${d}/m1.txt`, `${d}/m2.txt`])
  assert.equal(await sbx.files.read(`${d}/m2.txt`), 'two')

  const names = (await sbx.files.list(d)).map((e) => `${e.name}:${e.type}`).sort()
  assert.deepEqual(names, ['a:dir', 'b.bin:file', 'm1.txt:file', 'm2.txt:file'])
  assert.equal(await sbx.files.exists(`${d}/m1.txt`), true)
  assert.equal(await sbx.files.exists(`${d}/nope`), false)
  const st = await sbx.files.getInfo(`${d}/b.bin`)
  assert.equal(st.type, FileType.FILE)
  assert.equal(st.size, 4)
  await assert.rejects(sbx.files.read(`${d}/nope`), FileNotFoundError)

  const moved = await sbx.files.rename(`${d}/m1.txt`, `${d}/moved.txt`)
  assert.equal(moved.path, `${d}/moved.txt`)
  await sbx.files.remove(`${d}/moved.txt`)
  assert.equal(await sbx.files.exists(`${d}/moved.txt`), false)
})

test('files: a streamed watch sees a create and a delete', async () => {
  const d = `/tmp/npm-watch-${Date.now()}`
  await sbx.files.makeDir(d)
  const seen = new Set()
  const handle = await sbx.files.watchDir(d, (e) => {
    if (e.name === 'w.txt') seen.add(e.type)
  })
  try {
    await sbx.files.write(`${d}/w.txt`, 'x')
    await sbx.files.remove(`${d}/w.txt`)
    for (let i = 0; !(seen.has(FilesystemEventType.CREATE) && seen.has(FilesystemEventType.REMOVE)); i++) {
      assert.ok(i < 100, `only saw ${[...seen]}`)
      await sleep(300)
    }
  } finally {
    await handle.stop()
  }
})
