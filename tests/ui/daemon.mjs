// A real forkvm daemon for the dashboard test and bench, started by the one
// test launcher (tests/launch/forkvm_launch.mjs, docs/testing.md): a temporary
// home whose `guest` and `images` link to the installed artefacts (so nothing
// is built here), TCP on a free loopback port with a random token. stop() ends
// it; it removes its sandboxes and its home, and does so too if this process
// is killed.
import { existsSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { launch } from '../launch/forkvm_launch.mjs'

export const REPO = resolve(import.meta.dirname, '..', '..')

/**
 * Start the daemon and wait until it is ready.
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
  const env = {}
  if (opts.uiDir) env.FORKVM_UI_DIR = opts.uiDir
  // Branch points must outlive the run: background collection would remove
  // the childless ones the bench makes while it measures.
  const args = ['--gc-interval', '0', ...(opts.extraArgs ?? [])]
  const d = await launch(binary, { artifacts: installed, env, args })
  const { url, token, home, pid } = d
  const auth = { authorization: `Bearer ${token}` }
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
  return { url, token, home, pid, log: d.log, api, stop: d.stop }
}
