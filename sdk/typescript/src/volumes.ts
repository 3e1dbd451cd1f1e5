/**
 * Volumes: host directories and named volumes mounted into sandboxes
 * (docs/volumes.md). The wire types here are schemas of docs/openapi.json,
 * re-exported by `types.ts` so that they are part of `api`; the helpers read
 * the CLI's `--volume SOURCE:GUEST_PATH[:OPTIONS]` form.
 *
 * A spawn's `volumes` lists {@link VolumeMount}s: a `source` (an absolute
 * host directory, or the name of a volume made with `Client.createVolume`),
 * the guest `path` it appears at, `read_only`, and what a branch or a
 * snapshot does with it ({@link VolumeMode}). A sandbox shows them as
 * {@link MountedVolume}s, with the `host_path` its guest reads and writes.
 *
 * @module
 */

/**
 * What children of a branch (and sandboxes spawned from a snapshot) see of a
 * volume: `shared`, the same host directory (a write by one is seen by all,
 * and by the host; the default), or `copy`, each its own copy-on-write copy
 * of the directory as it was at the branch instant.
 */
export type VolumeMode = "shared" | "copy";

/** One volume of a spawn (`CreateSandbox.volumes`). */
export interface VolumeMount {
  /** An absolute host directory, or the name of a named volume. */
  source: string;
  /** Where it appears in the guest (absolute; not `/`). */
  path: string;
  /** Refuse every write (`EROFS` in the guest); default false. */
  read_only?: boolean;
  /** What a branch or snapshot does with it (default `shared`). */
  mode?: VolumeMode;
  /** The uid every entry shows in the guest (default 0). */
  uid?: number | null;
  /** The gid every entry shows in the guest (default: `uid`'s value, or 0). */
  gid?: number | null;
}

/** A volume as a sandbox shows it (`Sandbox.volumes`). */
export interface MountedVolume extends VolumeMount {
  /**
   * The host directory this sandbox's guest reads and writes: the source
   * itself, or, for a `copy` volume of a branch child, its own copy.
   */
  host_path: string;
}

/** `POST /v1/volumes`: create a named volume. */
export interface CreateVolume {
  /** 1 to 64 letters, digits, `.`, `_` or `-`; not starting with `.` or `-`. */
  name: string;
}

/** A named volume: a directory under the daemon's home. */
export interface Volume {
  name: string;
  /** Its host directory. */
  path: string;
  /** RFC 3339 creation time. */
  created_at: string;
  /** The running or paused sandboxes that mount it (while there are any, it cannot be deleted). */
  used_by?: string[];
}

/** `GET /v1/volumes`. */
export interface VolumeList {
  volumes: Volume[];
}

const USAGE =
  "use SOURCE:GUEST_PATH[:OPTIONS], for example /home/me/repo:/work:ro or " +
  "data:/data:copy (OPTIONS: ro, rw, shared, copy, uid=N, gid=N)";

/**
 * Parse `SOURCE:GUEST_PATH[:OPTIONS]`, the CLI's `--volume` form (the rules
 * of the daemon's `VolumeMount::parse`). OPTIONS is a comma-separated list of
 * `ro`, `rw`, `shared`, `copy`, `uid=N` and `gid=N` (later ones win):
 *
 * ```ts
 * parseVolume("/srv/repo:/work:ro");        // { source: "/srv/repo", path: "/work", read_only: true, mode: "shared" }
 * parseVolume("data:/data:copy,uid=1000");  // the named volume `data`, copied into branches
 * ```
 *
 * Throws a `TypeError` for an empty source or path, an unknown option or a
 * bad number. Whether the source exists, and whether the path is allowed,
 * is for the daemon to say (`InvalidRequestError`).
 */
export function parseVolume(spec: string): VolumeMount {
  if (typeof spec !== "string") throw new TypeError(`a volume string is SOURCE:GUEST_PATH[:OPTIONS], not ${String(spec)}`);
  const quoted = JSON.stringify(spec);
  // At most three parts, as Rust's splitn(3, ':'): the options keep any further colon.
  const first = spec.indexOf(":");
  const second = first < 0 ? -1 : spec.indexOf(":", first + 1);
  const source = first < 0 ? spec : spec.slice(0, first);
  const path = first < 0 ? "" : spec.slice(first + 1, second < 0 ? undefined : second);
  const options = second < 0 ? "" : spec.slice(second + 1);
  if (!source || !path) throw new TypeError(`bad volume ${quoted}: ${USAGE}`);
  const mount: VolumeMount = { source, path, read_only: false, mode: "shared" };
  for (const opt of options.split(",")) {
    if (opt === "") continue;
    if (opt === "ro" || opt === "rw") mount.read_only = opt === "ro";
    else if (opt === "shared" || opt === "copy") mount.mode = opt;
    else if (opt.startsWith("uid=") || opt.startsWith("gid=")) {
      const value = opt.slice(4);
      if (!/^\+?[0-9]+$/.test(value) || Number(value) > 0xffff_ffff) {
        throw new TypeError(`bad volume option ${JSON.stringify(opt)} in ${quoted}: ${USAGE}`);
      }
      mount[opt.startsWith("uid=") ? "uid" : "gid"] = Number(value);
    } else {
      throw new TypeError(`unknown volume option ${JSON.stringify(opt)} in ${quoted}: ${USAGE}`);
    }
  }
  return mount;
}

/**
 * A volume of a spawn: the CLI string `"SOURCE:GUEST_PATH[:OPTIONS]"`, or a
 * {@link VolumeMount} (a sandbox's {@link MountedVolume} too: its
 * `host_path` is left out).
 */
export type VolumeSpec = string | VolumeMount;

const MOUNT_FIELDS = new Set(["source", "path", "read_only", "mode", "uid", "gid"]);

/** One {@link VolumeSpec} as a wire {@link VolumeMount}. */
export function volumeMount(spec: VolumeSpec): VolumeMount {
  if (typeof spec === "string") return parseVolume(spec);
  if (spec === null || typeof spec !== "object" || typeof spec.source !== "string" || typeof spec.path !== "string") {
    throw new TypeError(`a volume is "SOURCE:GUEST_PATH[:OPTIONS]" or { source, path, ... }, not ${JSON.stringify(spec)}`);
  }
  // The daemon refuses unknown fields: keep those of a mount (a MountedVolume's host_path goes).
  return Object.fromEntries(Object.entries(spec).filter(([key]) => MOUNT_FIELDS.has(key))) as unknown as VolumeMount;
}

/** `volumes` of a spawn as wire {@link VolumeMount}s. */
export function volumeMounts(specs: readonly VolumeSpec[]): VolumeMount[] {
  if (!Array.isArray(specs)) throw new TypeError('volumes must be an array, e.g. volumes: ["/srv/repo:/work:ro"]');
  return specs.map(volumeMount);
}
