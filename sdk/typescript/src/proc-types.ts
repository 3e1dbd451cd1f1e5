/**
 * Wire types of background processes and of the filesystem operations
 * (schemas of docs/openapi.json, described in docs/processes.md;
 * re-exported by `types.ts` so that they are part of `api`).
 *
 * @module
 */
import type { ErrorDetail } from "./types.js";

/** A terminal size: columns and rows, 1–1000 each. */
export interface PtySize {
  cols: number;
  rows: number;
}

/** `POST /v1/sandboxes/{id}/processes`: start a background process. */
export interface StartProcess {
  /** Program and arguments (`argv[0]` looked up on PATH); empty: the image's default command. */
  argv?: string[];
  /** Extra environment variables, on top of the image's, the sandbox's and the agent's. */
  env?: Record<string, string>;
  /** Working directory (default: the image's `WorkingDir`, else `/`). */
  cwd?: string | null;
  /** Run as `name`, `uid`, `name:group` or `uid:gid` (default: the image's `User`, else root). */
  user?: string | null;
  /** A name to address it by instead of its pid: 1–64 letters, digits, `.`, `_`, `-`, not all digits. */
  tag?: string | null;
  /** Run it on a new terminal of this size (output then arrives as `pty` events). */
  pty?: PtySize | null;
  /** Give it a stdin pipe (else `/dev/null`); a PTY always has one. */
  stdin?: boolean;
  /** Stream its events until it ends instead of answering with its pid at once. */
  stream?: boolean;
}

/** A started process. */
export interface ProcessStarted {
  pid: number;
  tag?: string | null;
}

/** A running background process. */
export interface Process {
  pid: number;
  tag?: string | null;
  /** The program and its arguments. */
  argv: string[];
  /** The environment it was given (on top of the agent's). */
  env?: Record<string, string>;
  cwd?: string | null;
  /** Its PTY's size, if it has one. */
  pty?: PtySize | null;
}

/** `GET /v1/sandboxes/{id}/processes`: the running processes. */
export interface ProcessList {
  processes: Process[];
}

/** `POST /v1/sandboxes/{id}/processes/{process}/signal`. */
export interface SignalProcess {
  /** The signal number (1–64); it goes to the process's whole group. */
  signal: number;
}

/**
 * One line of a process stream (an attach, or a start with `stream`),
 * NDJSON: `start`, output chunks (base64, `lost` bytes dropped just
 * before), `keepalive`, then `end` or `error`.
 */
export type ProcessEvent =
  | { type: "start"; pid: number }
  | { type: "stdout"; data: string; lost?: number }
  | { type: "stderr"; data: string; lost?: number }
  | { type: "pty"; data: string; lost?: number }
  | { type: "keepalive" }
  | {
      /** The process ended; the last line of a stream that followed it to its end. */
      type: "end";
      /** The exit code, or -1 when a signal killed it. */
      exit_code: number;
      /** It exited by itself (false: killed by a signal). */
      exited: boolean;
      signal?: number | null;
      /** `exit status 3`, `signal: killed`… */
      status: string;
      /** Why the sandbox lost track of it, if it did. */
      error?: string | null;
    }
  | { type: "error"; error: ErrorDetail };

/** What an entry is, as `lstat` sees it. */
export type FileKind = "file" | "dir" | "symlink" | "other";

/** A filesystem entry. */
export interface EntryInfo {
  /** The last path component. */
  name: string;
  kind: FileKind;
  /** The absolute path. */
  path: string;
  size: number;
  /** Permission bits with setuid, setgid and sticky. */
  mode: number;
  /** As `ls -l` shows them: `-rw-r--r--`, `drwxr-xr-x`… */
  permissions: string;
  /** User and group names (else the numeric ids). */
  owner: string;
  group: string;
  /** Modification time, nanoseconds since the Unix epoch. */
  modified_ns: number;
  /** Where a symlink points. */
  symlink_target?: string | null;
}

/** `GET /v1/sandboxes/{id}/fs/list`. */
export interface EntryList {
  entries: EntryInfo[];
}

/** `GET /v1/sandboxes/{id}/fs/exists` (a dangling symlink exists). */
export interface Exists {
  exists: boolean;
}

/** `POST /v1/sandboxes/{id}/fs/mkdir`: `mkdir -p`. */
export interface MakeDir {
  path: string;
}

/** The answer to a mkdir. */
export interface DirMade {
  entry: EntryInfo;
  /** It was a directory already. */
  existed: boolean;
}

/** `POST /v1/sandboxes/{id}/fs/move`: rename(2). */
export interface MoveFile {
  source: string;
  destination: string;
}

/** What happened to a watched entry (a move within the tree is `rename` then `create`). */
export type FsOp = "create" | "write" | "remove" | "rename" | "chmod";

/** One change in a watched directory. */
export interface FsEvent {
  /** The path relative to the watched directory. */
  name: string;
  op: FsOp;
}

/** One line of a watch stream: `start`, `events` (with `dropped`), `keepalive`, or `error` (the last). */
export type WatchEvent =
  | { type: "start" }
  | { type: "events"; events: FsEvent[]; dropped?: number }
  | { type: "keepalive" }
  | { type: "error"; error: ErrorDetail };

/** `POST /v1/sandboxes/{id}/fs/watchers`: a watcher to poll. */
export interface CreateWatcher {
  path: string;
  /** Watch the subdirectories too. */
  recursive?: boolean;
}

/** A polled watcher. */
export interface Watcher {
  watcher_id: string;
}

/** The changes since the last poll. */
export interface WatcherEvents {
  events: FsEvent[];
  /** Changes lost since the last poll (at most 4096 are kept). */
  dropped: number;
}

/** `PUT /v1/sandboxes/{id}/archive`: what the tar held. */
export interface ArchiveWritten {
  /** Entries written (files, directories, links). */
  entries: number;
  /** Bytes of file data written. */
  bytes: number;
}
