// A real forkvm daemon for the dashboard test and bench: a private home whose
// `guest` and `images` link to the installed artefacts (so nothing is built
// here), TCP on a free loopback port with a random token. stop() removes its
// sandboxes, stops it by its PID and deletes the home, whatever happened.
import { spawn } from 'node:child_process'
import { mkdtempSync, mkdirSync, readdirSync, symlinkSync, rmSync, openSync, readFileSync, existsSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { randomBytes } from 'node:crypto'

export const REPO = resolve(import.meta.dirname, '..', '..')

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

/**
 * Start `forkvm serve` and wait until /v1/health answers.
 * opts.uiDir: the built dashboard to serve (FORKVM_UI_DIR).
 * opts.extraArgs: more `serve` flags.
 */
export async function startDaemon(opts = {}) {
  const binary = resolve(REPO, process.env.FORKVM_BIN ?? join('target', 'debug', 'forkvm'))
  if (!existsSync(binary)) {
    throw new Error(`no forkvm binary at ${binary}: build it (make build) or set FORKVM_BIN`)
  }
  const installed = process.env.FORKVM_IMAGES_HOME ?? '/var/lib/forkvm'
  if (!existsSync(join(installed, 'guest')) || !existsSync(join(installed, 'images'))) {
    throw new Error(`no guest artefacts under ${installed}: run scripts/setup.sh`)
  }
  const home = mkdtempSync(join(tmpdir(), 'forkvm-ui-'))
  symlinkSync(join(installed, 'guest'), join(home, 'guest'))
  mkdirSync(join(home, 'images'))
  for (const name of readdirSync(join(installed, 'images'))) {
    if (!name.startsWith('.')) symlinkSync(join(installed, 'images', name), join(home, 'images', name))
  }
  const token = randomBytes(16).toString('hex')
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logPath = join(home, 'daemon.log')
  const log = openSync(logPath, 'w')
  const env = { ...process.env, FORKVM_HOME: home, FORKVM_TOKEN: token }
  delete env.FORKVM_URL
  if (opts.uiDir) env.FORKVM_UI_DIR = opts.uiDir
  // Branch points must outlive the run: background collection would remove
  // the childless ones the bench makes while it measures.
  const args = ['serve', '--listen', `127.0.0.1:${port}`, '--gc-interval', '0', ...(opts.extraArgs ?? [])]
  const child = spawn(binary, args, { env, stdio: ['ignore', log, log], detached: true })
  const logText = () => {
    try {
      return readFileSync(logPath, 'utf8').slice(-4000)
    } catch {
      return '(no log)'
    }
  }
  const auth = { authorization: `Bearer ${token}` }
  let stopped = false
  const stop = async () => {
    if (stopped) return
    stopped = true
    try {
      const list = await (await fetch(`${url}/v1/sandboxes`, { headers: auth })).json()
      for (const s of list.sandboxes ?? []) {
        await fetch(`${url}/v1/sandboxes/${s.id}`, { method: 'DELETE', headers: auth })
      }
    } catch {
      // The daemon may already be gone; its QEMUs die with it.
    }
    if (child.exitCode === null && child.signalCode === null) {
      const done = new Promise((r) => child.once('exit', r))
      process.kill(child.pid, 'SIGTERM')
      await Promise.race([done, new Promise((r) => setTimeout(r, 30_000))])
      if (child.exitCode === null && child.signalCode === null) process.kill(child.pid, 'SIGKILL')
    }
    rmSync(home, { recursive: true, force: true })
  }
  const deadline = Date.now() + 60_000
  for (;;) {
    try {
      const r = await fetch(`${url}/v1/health`, { headers: auth })
      if (r.status === 200) break
    } catch {
      // Not listening yet.
    }
    if (child.exitCode !== null || Date.now() > deadline) {
      const text = logText()
      await stop()
      throw new Error(`forkvm serve did not come up:\n${text}`)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  /** A JSON call to the daemon with the bearer token; throws on an error status. */
  async function api(method, path, body) {
    const r = await fetch(url + path, {
      method,
      headers: { ...auth, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    const text = await r.text()
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`)
    return text ? JSON.parse(text) : null
  }
  return { url, token, home, pid: child.pid, log: logText, api, stop }
}
