// Start a test daemon with the one launcher, `forkvm serve --ephemeral`
// (docs/testing.md, "The test launcher"), for the Node.js harnesses
// (tests/ui, tests/compat/npm). The launcher makes a temporary home linking
// the installed artefacts, a network pool and jail uids of its own, a token
// and a free loopback port, and prints one JSON line when ready (or exits
// within its own readiness timeout). It ends when its stdin reaches end of
// file, which the kernel causes however this process ends, and then removes
// every sandbox and its home: so the pipe stays open until stop().
import { spawn } from 'node:child_process'

/** Longest stop() waits for the teardown (the launcher's own wait is 120 s). */
export const STOP_WAIT_MS = 180_000

/**
 * Start `binary serve --ephemeral --print-json ...args`; resolves with the
 * JSON line's fields (url, token, home, socket, pid, port, net_pool,
 * jail_uids) plus log() and stop(). opts.env is added to the environment
 * (FORKVM_URL and FORKVM_TOKEN are never passed on); opts.artifacts is where
 * the guest and images are linked from.
 */
export async function launch(binary, opts = {}) {
  const env = { ...process.env, ...(opts.env ?? {}) }
  delete env.FORKVM_URL
  delete env.FORKVM_TOKEN
  const args = ['serve', '--ephemeral', '--print-json']
  if (opts.artifacts) args.push('--artifacts', opts.artifacts)
  args.push(...(opts.args ?? []))
  const child = spawn(binary, args, { env, stdio: ['pipe', 'pipe', 'pipe'] })
  const exited = new Promise((resolve) => child.once('exit', resolve))
  // Its stderr, kept in memory: no file is left if this process is killed
  // (the daemon ignores a broken pipe).
  let logBuf = ''
  child.stderr.on('data', (d) => {
    logBuf = (logBuf + d).slice(-1_000_000)
  })
  const logText = (limit = 4000) => logBuf.slice(-limit)
  const line = await new Promise((resolve) => {
    let buf = ''
    child.stdout.on('data', (d) => {
      buf += d
      if (buf.includes('\n')) resolve(buf.slice(0, buf.indexOf('\n')))
    })
    child.stdout.on('close', () => resolve(buf))
  })
  child.stdout.destroy()
  let info
  try {
    info = JSON.parse(line)
  } catch {
    await exited
    const text = logText()
    throw new Error(`forkvm serve --ephemeral exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${text}`)
  }
  // Neither the child nor its stdin keeps this process alive; when it
  // exits, the kernel closes the pipe and the daemon cleans up.
  child.unref()
  child.stdin.unref?.()
  child.stderr.unref?.()
  let stopped = false
  async function stop() {
    if (stopped) return
    stopped = true
    if (child.exitCode === null && child.signalCode === null) {
      // Waited for: it was unref()ed so as not to hold this process alive.
      child.ref()
      child.stdin.end()
      let timer
      const late = new Promise((resolve) => {
        timer = setTimeout(() => resolve('late'), STOP_WAIT_MS)
      })
      if ((await Promise.race([exited, late])) === 'late') {
        // Its reaper removes what it leaves.
        console.error(`forkvm serve --ephemeral did not end within ${STOP_WAIT_MS / 1000} s; killing it`)
        child.kill('SIGKILL')
        await exited
      }
      clearTimeout(timer)
    }
  }
  return { ...info, process: child, log: logText, stop }
}
