// The REST client of the page. Every call goes to the daemon that served the
// page (same origin), with the login cookie (credentials: 'same-origin'); the
// page never holds the token itself. A 401 means the cookie is missing or no
// longer valid, so the user is sent to the daemon's login page.
import type {
  BranchMode,
  BranchResult,
  Checkpoint,
  Diff,
  EntryInfo,
  Image,
  Info,
  Merged,
  MergeStrategy,
  Retention,
  Rewound,
  Sandbox,
  Snapshot,
  Timeline,
} from './types'

export const LOGIN_PATH = '/ui/login'

/** An error answer of the daemon: its machine-readable code and message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message)
  }
}

/** Leave for the login page (the cookie is gone or the token changed). */
export function toLogin(): never {
  window.location.assign(LOGIN_PATH)
  throw new ApiError(401, 'unauthorized', 'not logged in')
}

/** Raw request: returns the Response of a 2xx answer, throws ApiError otherwise. */
export async function request(method: string, path: string, init: RequestInit = {}): Promise<Response> {
  const r = await fetch(path, { ...init, method, credentials: 'same-origin' })
  if (r.status === 401) toLogin()
  if (!r.ok) {
    let code = `http_${r.status}`
    let message = `${method} ${path}: ${r.status} ${r.statusText}`
    try {
      const body = await r.json()
      if (body?.error) {
        code = body.error.code ?? code
        message = body.error.message ?? message
      }
    } catch {
      // Not a JSON error body; keep the status line.
    }
    throw new ApiError(r.status, code, message)
  }
  return r
}

async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = {}
  if (body !== undefined) {
    init.body = JSON.stringify(body)
    init.headers = { 'content-type': 'application/json' }
  }
  const r = await request(method, path, init)
  if (r.status === 204) return undefined as T
  const text = await r.text()
  return (text ? JSON.parse(text) : undefined) as T
}

const enc = encodeURIComponent

export const api = {
  info: () => json<Info>('GET', '/v1/info'),
  images: async () => (await json<{ images: Image[] }>('GET', '/v1/images')).images,
  snapshots: async () => (await json<{ snapshots: Snapshot[] }>('GET', '/v1/snapshots')).snapshots,
  sandboxes: async () => (await json<{ sandboxes: Sandbox[] }>('GET', '/v1/sandboxes')).sandboxes,
  /** One sandbox; while QEMU runs it carries `memory` (RSS/PSS) and `usage`. */
  sandbox: (id: string) => json<Sandbox>('GET', `/v1/sandboxes/${enc(id)}`),
  snapshot: (id: string) => json<Snapshot>('GET', `/v1/snapshots/${enc(id)}`),

  /** Spawn `count` sandboxes from an image (its boot template) or a snapshot. */
  spawn: async (from: { image?: string; snapshot?: string }, count: number) => {
    const batch = await json<{ sandboxes: Sandbox[]; total_ms: number }>('POST', '/v1/sandboxes', {
      ...from,
      count,
    })
    return batch.sandboxes
  },
  branch: (id: string, mode: BranchMode, count: number, tag?: string) =>
    json<BranchResult>('POST', `/v1/sandboxes/${enc(id)}/branch`, { mode, count, ...(tag ? { tag } : {}) }),
  snapshotOf: (id: string, tag?: string) =>
    json<Snapshot>('POST', `/v1/sandboxes/${enc(id)}/snapshot`, tag ? { tag } : {}),
  flatten: (id: string, tag?: string) =>
    json<Snapshot>('POST', `/v1/snapshots/${enc(id)}/flatten`, tag ? { tag } : {}),
  setPool: (id: string, size: number | null) => json<unknown>('PUT', `/v1/snapshots/${enc(id)}/pool`, { size }),
  pause: (id: string) => json<Sandbox>('POST', `/v1/sandboxes/${enc(id)}/pause`, {}),
  resume: (id: string) => json<Sandbox>('POST', `/v1/sandboxes/${enc(id)}/resume`, {}),
  /** Time travel: a checkpoint of a running sandbox, its timeline, retention, rewind. */
  checkpoint: (id: string, tag?: string) =>
    json<Checkpoint>('POST', `/v1/sandboxes/${enc(id)}/checkpoints`, tag ? { tag } : {}),
  timeline: (id: string) => json<Timeline>('GET', `/v1/sandboxes/${enc(id)}/timeline`),
  setRetention: (id: string, r: Retention) =>
    json<Timeline>('PUT', `/v1/sandboxes/${enc(id)}/timeline/retention`, {
      ...(r.keep_last != null ? { keep_last: r.keep_last } : {}),
      ...(r.keep_every != null ? { keep_every: r.keep_every } : {}),
    }),
  rewind: (id: string, to: string, checkpointFirst: boolean) =>
    json<Rewound>('POST', `/v1/sandboxes/${enc(id)}/rewind`, { to, checkpoint_first: checkpointFirst }),
  /** Filesystem differences from `a` to `b` (sandboxes, snapshots or checkpoints), under `path`. */
  diff: (a: string, b: string, path: string, text: boolean) =>
    json<Diff>('POST', `/v1/diff/${enc(a)}`, { b, path, ...(text ? { text } : {}) }),
  /** Apply `child`'s changes since its branch point to `into` (or, dry, report what would be). */
  merge: (child: string, into: string, path: string, strategy: MergeStrategy | null, dryRun: boolean) =>
    json<Merged>('POST', `/v1/sandboxes/${enc(child)}/merge`, {
      into,
      path,
      ...(strategy ? { strategy } : {}),
      dry_run: dryRun,
    }),
  removeSandbox: (id: string) => json<void>('DELETE', `/v1/sandboxes/${enc(id)}`),
  removeSnapshot: (id: string) => json<void>('DELETE', `/v1/snapshots/${enc(id)}`),

  /** The serial console (its last 1 MiB), as text. */
  logs: async (id: string) => (await request('GET', `/v1/sandboxes/${enc(id)}/logs`)).text(),

  listDir: async (id: string, path: string) =>
    (await json<{ entries: EntryInfo[] }>('GET', `/v1/sandboxes/${enc(id)}/fs/list?path=${enc(path)}&depth=1`))
      .entries,
  fileUrl: (id: string, path: string) => `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`,
  upload: async (id: string, path: string, body: Blob) =>
    (await request('PUT', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`, {
      body,
      headers: { 'content-type': 'application/octet-stream' },
    }).then((r) => r.json())) as { path: string; size: number },

  /** Start a shell on a PTY; answers its pid at once (it runs in the background). */
  startPty: (id: string, cols: number, rows: number, argv: string[]) =>
    json<{ pid: number }>('POST', `/v1/sandboxes/${enc(id)}/processes`, { argv, pty: { cols, rows } }),
  /** Attach to a process's output: an NDJSON body of ProcessEvent lines. */
  attach: (id: string, pid: number, signal: AbortSignal) =>
    request('GET', `/v1/sandboxes/${enc(id)}/processes/${pid}/output`, { signal }),
  stdin: (id: string, pid: number, data: Uint8Array) =>
    request('POST', `/v1/sandboxes/${enc(id)}/processes/${pid}/stdin`, {
      body: data as BodyInit,
      headers: { 'content-type': 'application/octet-stream' },
    }),
  resizePty: (id: string, pid: number, cols: number, rows: number) =>
    json<void>('PUT', `/v1/sandboxes/${enc(id)}/processes/${pid}/pty`, { cols, rows }),
  kill: (id: string, pid: number) => json<void>('DELETE', `/v1/sandboxes/${enc(id)}/processes/${pid}`),
}
