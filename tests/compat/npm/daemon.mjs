// A forkvm daemon for the npm E2B suite, started by the one test launcher
// (tests/launch/forkvm_launch.mjs, docs/testing.md) like tests/compat/conftest.py
// starts the Python suites' one: a temporary home linking the guest and images
// of $FORKVM_IMAGES_HOME, TCP on a free loopback port with a random token, the
// E2B-shaped image `base` (built here unless the home already links it:
// scripts/test-compat.sh builds it once per run), and the SDK's three
// variables set. stop() ends the daemon, which removes its sandboxes and home.
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { launch } from '../../launch/forkvm_launch.mjs'

const REPO = resolve(import.meta.dirname, '..', '..', '..')

export async function startDaemon() {
  const binary = process.env.FORKVM_BIN ?? join(REPO, 'target', 'debug', 'forkvm')
  const artifacts = process.env.FORKVM_IMAGES_HOME ?? '/var/lib/forkvm'
  const d = await launch(binary, { artifacts })
  if (!existsSync(join(d.home, 'images', 'base'))) {
    try {
      execFileSync(binary, ['image', 'build', '-t', 'base', join(REPO, 'examples', 'e2b-base')], {
        env: { ...process.env, FORKVM_URL: `unix://${d.socket}`, FORKVM_HOME: d.home },
        stdio: ['ignore', 'ignore', 'inherit'],
        timeout: 900_000,
      })
    } catch (e) {
      await d.stop()
      throw e
    }
  }
  process.env.E2B_API_URL = d.url
  process.env.E2B_SANDBOX_URL = d.url
  process.env.E2B_API_KEY = d.token
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_DEBUG
  return { url: d.url, token: d.token, home: d.home, log: d.log, stop: d.stop }
}
