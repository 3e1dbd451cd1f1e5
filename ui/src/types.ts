// The daemon's JSON, as far as the dashboard reads it. The full schemas are in
// docs/openapi.json (generated from the server); fields the page does not use
// are left out, and optional ones are optional because older daemons omit them.

export type SandboxState = 'starting' | 'running' | 'failed' | 'paused'
export type BranchMode = 'live' | 'diff' | 'full'

export interface SpawnTimings {
  prepare_ms: number
  qemu_start_ms: number
  boot_ms: number
  restore_ms?: number | null
  identity_ms?: number | null
  from_pool?: boolean | null
  template_ms?: number | null
  network_ms?: number | null
  network_ready_ms?: number | null
  total_ms: number
}

export interface MemoryUsage {
  rss_kib: number
  pss_kib: number
  private_dirty_kib: number
}

export interface Usage {
  cpu_ms: number
  disk_bytes: number
  net_rx_bytes?: number | null
  net_tx_bytes?: number | null
}

export interface PortForward {
  guest: number
  host?: number
}

export interface NetworkInfo {
  mode: string
  guest_ip: string
  gateway: string
  host_ip?: string | null
  uplink_ip?: string | null
  ports: PortForward[]
  egress?: unknown[] | null
}

export interface Sandbox {
  id: string
  state: SandboxState
  image: string
  memory_mib: number
  cpus: number
  accel: string
  pid?: number | null
  created_at: string
  failure?: string | null
  timings?: SpawnTimings | null
  memory?: MemoryUsage | null
  disk?: { layers: number; streaming: boolean } | null
  snapshot?: string | null
  network?: NetworkInfo | null
  metadata?: Record<string, string>
  lifetime?: { timeout: number; on_timeout: string; expires_at?: string | null; remaining_s: number } | null
  paused?: { snapshot: string; paused_at: string; reason: string; pause_ms: number } | null
  limits?: Record<string, number | null> | null
  usage?: Usage | null
}

export interface SnapshotTimings {
  pause_ms: number
  total_ms: number
}

export interface Snapshot {
  id: string
  tag?: string | null
  parent?: string | null
  source: string
  image: string
  memory_mib: number
  cpus: number
  created_at: string
  kind: string
  depth?: number
  state: string
  failure?: string | null
  template: boolean
  sizes: {
    memory_bytes: number
    memory_allocated_bytes: number
    device_state_bytes: number
    disk_bytes: number
    memory_diff_bytes?: number
  }
  pool_size: number
  pool_default: boolean
  sandboxes: string[]
  children: string[]
  origin: string
  pinned: boolean
  timings?: SnapshotTimings | null
  // Added with the event stream (issue 17); absent on older daemons.
  mode?: BranchMode | null
  pause_ms?: number | null
  flattened_from?: string | null
}

export interface Image {
  name: string
  format: string
  size_bytes: number
  created_at: string
  source: string
  reference?: string | null
}

export interface Info {
  version: string
  accel: { kind: string; reason: string }
  qemu: { path: string; version: string }
  images: string[]
  sandboxes: number
  snapshots: number
  default_pool_size: number
  pools: PoolInfo[]
}

export interface PoolInfo {
  snapshot: string
  size: number
  ready: number
}

export interface BranchInfo {
  source: string
  snapshot: string
  mode: BranchMode
  count: number
  children: string[]
  pause_ms: number
  total_ms: number
}

export interface BranchResult {
  mode: BranchMode
  snapshot: Snapshot
  children: Sandbox[]
  pause_ms: number
  total_ms: number
}

/** One message of GET /v1/events (the SSE `data:` field). */
export interface DaemonEvent {
  seq: number
  at_unix_ms: number
  kind: string
  id: string
  sandbox?: Sandbox
  snapshot?: Snapshot
  image?: Image
  branch?: BranchInfo
  pool?: PoolInfo
}

export interface EntryInfo {
  name: string
  kind: 'file' | 'dir' | 'symlink' | 'other'
  path: string
  size: number
  permissions: string
  owner: string
  group: string
  modified_ns: number
  symlink_target?: string | null
}

// Time travel (issue 34): a sandbox's checkpoints and rewind.

/** One step of a sandbox's timeline (a snapshot with origin `checkpoint`). */
export interface Checkpoint {
  id: string
  tag?: string | null
  sandbox: string
  seq: number
  created_at: string
  parent?: string | null
  pause_ms?: number | null
  /** Bytes stored for it alone. */
  bytes: number
  head: boolean
}

export interface Retention {
  keep_last?: number | null
  keep_every?: number | null
}

/** GET /v1/sandboxes/{id}/timeline. */
export interface Timeline {
  sandbox: string
  head?: string | null
  retention: Retention
  /** Oldest first. */
  checkpoints: Checkpoint[]
  bytes: number
}

export interface Rewound {
  sandbox: Sandbox
  to: string
  undo?: Checkpoint | null
  rewind_ms: number
}

// Filesystem diff and merge (issue 34; crates/forkvm-api/src/treediff.rs).

export type ChangeKind = 'added' | 'deleted' | 'modified' | 'mode' | 'type'

/** What one side has at a path. */
export interface PathState {
  kind: 'file' | 'dir' | 'symlink' | 'other' | string
  size: number
  /** Permission bits (mode & 0o7777). */
  mode: number
  symlink_target?: string | null
}

export interface PathChange {
  path: string
  change: ChangeKind
  a?: PathState | null
  b?: PathState | null
  /** A unified diff, when asked with `text: true` and the file is text. */
  patch?: string | null
}

/** POST /v1/diff/{a}. */
export interface Diff {
  a: string
  b: string
  path: string
  /** Sorted by path. */
  changes: PathChange[]
  stats: { added: number; deleted: number; modified: number; other: number }
  entries: number
  contents_read: number
  diff_ms: number
}

export type MergeStrategy = 'ours' | 'theirs' | 'text'

export interface Conflict {
  path: string
  base?: PathState | null
  ours?: PathState | null
  theirs?: PathState | null
  reason: string
}

/** POST /v1/sandboxes/{id}/merge. */
export interface Merged {
  child: string
  into: string
  base: string
  applied: PathChange[]
  settled: Conflict[]
  conflicts: Conflict[]
  dry_run: boolean
  merge_ms: number
}
