// A terminal into a sandbox: xterm.js drawing a shell that runs on a PTY in
// the guest, through the process API (docs/processes.md):
//   start   POST /v1/sandboxes/{id}/processes  {argv, pty: {cols, rows}} -> {pid}
//   output  GET  .../processes/{pid}/output    NDJSON ProcessEvent lines; `pty`
//           carries base64 terminal output; the kept output is replayed first,
//           so nothing printed before the attach is lost
//   input   POST .../processes/{pid}/stdin     raw bytes typed into the PTY
//   resize  PUT  .../processes/{pid}/pty       {cols, rows}
// Leaving the page kills the shell (it would otherwise outlive the tab).
// This module (with xterm.js, most of the page's script) loads only when a
// terminal is first opened: the tree page does not pay for it.
import '@xterm/xterm/css/xterm.css'
import { FitAddon } from '@xterm/addon-fit'
import { Terminal } from '@xterm/xterm'
import { useEffect, useRef, useState } from 'preact/hooks'
import { api } from './api'

// bash when the image has it, else sh; -l for the image's profile (PATH, prompt).
const SHELL = ['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi']

function fromBase64(s: string): Uint8Array {
  const bin = atob(s)
  const out = new Uint8Array(bin.length)
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i)
  return out
}

/** Read an NDJSON body line by line until it ends or `signal` aborts. */
async function eachLine(body: ReadableStream<Uint8Array>, onLine: (line: string) => void) {
  const reader = body.getReader()
  const dec = new TextDecoder()
  let buf = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    buf += dec.decode(value, { stream: true })
    let nl: number
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim()
      buf = buf.slice(nl + 1)
      if (line) onLine(line)
    }
  }
  if (buf.trim()) onLine(buf.trim())
}

export function SandboxTerminal({ id }: { id: string }) {
  const host = useRef<HTMLDivElement>(null)
  const [status, setStatus] = useState('starting a shell…')

  useEffect(() => {
    const term = new Terminal({
      cursorBlink: true,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: { background: '#10141b' },
    })
    const fit = new FitAddon()
    term.loadAddon(fit)
    term.open(host.current!)
    fit.fit()
    const abort = new AbortController()
    let pid: number | null = null
    let closed = false
    // stdin writes are chained so keys arrive in the order they were typed.
    let inputChain: Promise<unknown> = Promise.resolve()
    const enc = new TextEncoder()

    const start = async () => {
      const started = await api.startPty(id, term.cols, term.rows, SHELL)
      pid = started.pid
      if (closed) {
        void api.kill(id, pid).catch(() => undefined)
        return
      }
      setStatus(`shell pid ${pid}`)
      term.focus()
      const r = await api.attach(id, pid, abort.signal)
      await eachLine(r.body!, (line) => {
        const ev = JSON.parse(line)
        if (ev.type === 'pty' || ev.type === 'stdout' || ev.type === 'stderr') term.write(fromBase64(ev.data))
        else if (ev.type === 'end') setStatus(`shell ended: ${ev.status}`)
        else if (ev.type === 'error') setStatus(`stream failed: ${ev.error?.message ?? 'unknown error'}`)
      })
    }
    start().catch((err) => {
      if (!abort.signal.aborted) setStatus(`terminal failed: ${(err as Error).message}`)
    })

    const onData = term.onData((d) => {
      if (pid == null) return
      const p = pid
      inputChain = inputChain.then(() => api.stdin(id, p, enc.encode(d))).catch((err) => setStatus(`input failed: ${err.message}`))
    })
    const onResize = term.onResize(({ cols, rows }) => {
      if (pid != null) void api.resizePty(id, pid, cols, rows).catch(() => undefined)
    })
    const observer = new ResizeObserver(() => fit.fit())
    observer.observe(host.current!)

    return () => {
      closed = true
      observer.disconnect()
      onData.dispose()
      onResize.dispose()
      abort.abort()
      if (pid != null) void api.kill(id, pid).catch(() => undefined)
      term.dispose()
    }
  }, [id])

  return (
    <div class="terminal-wrap">
      <div class="terminal" ref={host} data-testid="terminal" />
      <p class="muted" role="status">
        {status}
      </p>
    </div>
  )
}
