// A forkvm daemon for the npm E2B suite, started like tests/compat/conftest.py
// starts the Python suites' one: a private home linked to the built guest and
// images, TCP on a free loopback port with a random token, the E2B-shaped
// image `base` built in it, and the SDK's three variables set. stop() removes
// its sandboxes and stops it by its PID.
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, mkdirSync, readdirSync, symlinkSync, rmSync, openSync, readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { randomBytes } from 'node:crypto'

const REPO = resolve(import.meta.dirname, '..', '..', '..')

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer()
    s.on('error', fail)
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => ok(port))
    })
  })
}

export async function startDaemon() {
  const binary = process.env.FORKVM_BIN ?? join(REPO, 'target', 'debug', 'forkvm')
  const images = process.env.FORKVM_IMAGES_HOME ?? '/var/lib/forkvm'
  const home = mkdtempSync(join(tmpdir(), 'forkvm-npm-'))
  symlinkSync(join(images, 'guest'), join(home, 'guest'))
  mkdirSync(join(home, 'images'))
  for (const name of readdirSync(join(images, 'images'))) {
    if (!name.startsWith('.')) symlinkSync(join(images, 'images', name), join(home, 'images', name))
  }
  const token = randomBytes(16).toString('hex')
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const log = openSync(join(home, 'daemon.log'), 'w')
  const env = { ...process.env, FORKVM_HOME: home, FORKVM_TOKEN: token }
  delete env.FORKVM_URL
  const child = spawn(binary, ['serve', '--listen', `127.0.0.1:${port}`], {
    env,
    stdio: ['ignore', log, log],
    detached: true,
  })
  const logText = () => readFileSync(join(home, 'daemon.log'), 'utf8').slice(-4000)
  const deadline = Date.now() + 60_000
  for (;;) {
    try {
      const r = await fetch(`${url}/v1/health`, { headers: { authorization: `Bearer ${token}` } })
      if (r.status === 200) break
    } catch {}
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`forkvm serve did not come up:\n${logText()}`)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  execFileSync(binary, ['image', 'build', '-t', 'base', join(REPO, 'examples', 'e2b-base')], {
    env: { ...process.env, FORKVM_URL: `unix://${join(home, 'forkvm.sock')}`, FORKVM_HOME: home },
    stdio: ['ignore', 'ignore', 'inherit'],
    timeout: 900_000,
  })
  process.env.E2B_API_URL = url
  process.env.E2B_SANDBOX_URL = url
  process.env.E2B_API_KEY = token
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_DEBUG
  return {
    url,
    token,
    home,
    log: logText,
    async stop() {
      try {
        const auth = { authorization: `Bearer ${token}` }
        const list = await (await fetch(`${url}/v1/sandboxes`, { headers: auth })).json()
        for (const s of list.sandboxes ?? []) {
          await fetch(`${url}/v1/sandboxes/${s.id}`, { method: 'DELETE', headers: auth })
        }
      } catch {}
      if (child.exitCode === null) {
        const done = new Promise((r) => child.once('exit', r))
        process.kill(child.pid, 'SIGTERM')
        await Promise.race([done, new Promise((r) => setTimeout(r, 30_000))])
        if (child.exitCode === null) process.kill(child.pid, 'SIGKILL')
      }
      rmSync(home, { recursive: true, force: true })
    },
  }
}
