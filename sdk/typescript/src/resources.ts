/**
 * Wire types of a sandbox's resources: its limits, what it has used, and the
 * daemon's capacity (schemas of docs/openapi.json, re-exported by
 * `types.ts` so that they are part of `api`).
 *
 * A sandbox may carry {@link SandboxLimits}, set at spawn and inherited by a
 * branch's children unless the branch overrides them field by field (omitted
 * fields are unlimited; docs/limits.md says how each is enforced).
 * `GET /v1/sandboxes/{id}` of a running sandbox shows its {@link Usage}, and
 * `GET /v1/info` the memory and disk {@link Capacity} admission control
 * counts: work that would pass it is refused with 503 `capacity_exceeded`
 * (`CapacityExceededError`).
 *
 * @module
 */

/** Resource limits of one sandbox; omitted fields are unlimited. */
export interface SandboxLimits {
  /**
   * CPU time its QEMU may use, in percent of one host core (50: half a core;
   * 200: two cores), whatever its vCPU count (cgroup `cpu.max`).
   */
  cpu_percent?: number | null;
  /** Memory QEMU may use beyond the guest's RAM, MiB (cgroup `memory.max` = RAM + this). */
  memory_overhead_mib?: number | null;
  /** Disk operations per second, reads and writes together (QEMU block throttling). */
  disk_iops?: number | null;
  /** Disk bytes per second, reads and writes together. */
  disk_bps?: number | null;
  /** Network rate in each direction, kbit/s (tc on its link). */
  net_kbps?: number | null;
  /** Processes and threads its QEMU may have (cgroup `pids.max`). */
  pids?: number | null;
}

/** What a running sandbox has used (`GET /v1/sandboxes/{id}`). */
export interface Usage {
  /** CPU time its QEMU has used (user + system), since it started. */
  cpu_ms: number;
  /**
   * Host disk its own files take (allocated bytes of its disk overlays, logs
   * and sockets; shared snapshot layers not included).
   */
  disk_bytes: number;
  /** Bytes the guest received on its NIC (absent without one). */
  net_rx_bytes?: number | null;
  /** Bytes the guest sent on its NIC (absent without one). */
  net_tx_bytes?: number | null;
}

/** Memory and disk capacity as admission control counts them (`GET /v1/info`). */
export interface Capacity {
  /** The memory sandboxes may use in all (`serve --memory-commit-mib`). */
  memory_commit_mib: number;
  /** What running sandboxes use now: the sum of their QEMUs' PSS. */
  memory_used_mib: number;
  /** Held for spawns, branches and resumes still starting. */
  memory_reserved_mib: number;
  memory_left_mib: number;
  /** Sandboxes whose memory was counted. */
  counted_sandboxes: number;
  /** Free space on the filesystem holding the daemon's home. */
  disk_free_mib: number;
  /** Below this much free space, new work is refused (`--disk-reserve-mib`). */
  disk_reserve_mib: number;
}
