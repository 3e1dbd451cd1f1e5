/**
 * A sandbox's filesystem (`sb.fs`): describe, list, make, move and remove
 * entries, watch directories, and move several paths at once as a tar. See
 * docs/processes.md.
 *
 * ```ts
 * await sb.fs.mkdir("/work/src");
 * for (const entry of await sb.fs.list("/work", { depth: 2 })) console.log(entry.permissions, entry.path);
 * await using changes = await sb.fs.watch("/work", { recursive: true });
 * for await (const change of changes) console.log(change.op, change.name);
 * ```
 *
 * @module
 */
import { changesOf, type WatchStreamFrame } from "./client-procs.js";
import { ProtocolError } from "./errors.js";
import type { Sandbox } from "./sandbox.js";
import type { ArchiveWritten, DirMade, EntryInfo, FileWritten, FsEvent, WatcherEvents } from "./types.js";

/** Options of every request. */
interface RequestOptions {
  signal?: AbortSignal | undefined;
}

/**
 * The changes in a watched directory, one {@link FsEvent} at a time, from
 * the moment {@link SandboxFs.watch} resolved until the loop is left or
 * `close()` is called; it throws when the directory goes away. `dropped`
 * counts the changes the guest lost.
 */
export class WatchStream implements AsyncIterable<FsEvent>, AsyncDisposable {
  readonly #frames: AsyncGenerator<WatchStreamFrame, void>;
  readonly #abort = new AbortController();
  #started = false;
  dropped = 0;

  /** `open` makes the request with the signal it is given (see `Client.watchDir`). */
  constructor(open: (signal: AbortSignal) => AsyncGenerator<WatchStreamFrame, void>, signal?: AbortSignal) {
    this.#frames = open(signal ? AbortSignal.any([signal, this.#abort.signal]) : this.#abort.signal);
  }

  /** Send the request and wait until the watch is in place (its `start` line). */
  async ready(): Promise<this> {
    const first = await this.#frames.next();
    if (first.done || first.value.type !== "start") {
      await this.#frames.return();
      throw new ProtocolError(
        first.done ? "the watch stream ended before the watch was in place" : `the watch stream began with ${first.value.type}`,
        200,
      );
    }
    return this;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<FsEvent, void> {
    if (this.#started) throw new Error("a WatchStream can be read only once");
    this.#started = true;
    try {
      for await (const frame of this.#frames) {
        if (frame.type === "events") this.dropped += frame.dropped ?? 0;
        yield* changesOf(frame);
      }
    } catch (err) {
      if (!this.#abort.signal.aborted) throw err;
    } finally {
      await this.#frames.return();
    }
  }

  /** Stop the watch and close the connection. */
  async close(): Promise<void> {
    this.#abort.abort();
    if (!this.#started) {
      this.#started = true;
      await this.#frames.return();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** A polled watcher ({@link SandboxFs.watcher}): it keeps the changes (at most 4096) until polled. */
export class FsWatcher implements AsyncDisposable {
  readonly #sandbox: Sandbox;
  readonly id: string;

  constructor(sandbox: Sandbox, id: string) {
    this.#sandbox = sandbox;
    this.id = id;
  }

  /** The changes since the last poll, and how many were `dropped`. */
  poll(opts?: RequestOptions): Promise<WatcherEvents> {
    return this.#sandbox.client.pollWatcher(this.#sandbox.id, this.id, opts);
  }

  /** Stop and remove the watcher. */
  close(opts?: RequestOptions): Promise<void> {
    return this.#sandbox.client.removeWatcher(this.#sandbox.id, this.id, opts);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** `sb.fs`: the guest's filesystem. Paths are absolute; entries are described as `lstat` sees them. */
export class SandboxFs {
  readonly #sandbox: Sandbox;

  constructor(sandbox: Sandbox) {
    this.#sandbox = sandbox;
  }

  /** The bytes of a file (as `sb.files.read`). */
  read(path: string, opts?: RequestOptions): Promise<Uint8Array> {
    return this.#sandbox.client.readFile(this.#sandbox.id, path, opts);
  }

  /** Write a file atomically (as `sb.files.write`). */
  write(path: string, data: string | Uint8Array, opts?: { mode?: number | string | undefined } & RequestOptions): Promise<FileWritten> {
    return this.#sandbox.client.writeFile(this.#sandbox.id, path, data, opts);
  }

  /** The entry at `path` (a NotFoundError if there is none). */
  stat(path: string, opts?: RequestOptions): Promise<EntryInfo> {
    return this.#sandbox.client.statFile(this.#sandbox.id, path, opts);
  }

  /** Whether `path` exists (a dangling symlink does). */
  exists(path: string, opts?: RequestOptions): Promise<boolean> {
    return this.#sandbox.client.fileExists(this.#sandbox.id, path, opts);
  }

  /** The entries under a directory, `depth` levels down (1–64, default 1); symlinks are not followed. */
  async list(path: string, opts?: RequestOptions & { depth?: number | undefined }): Promise<EntryInfo[]> {
    return (await this.#sandbox.client.listDir(this.#sandbox.id, path, opts)).entries;
  }

  /** `mkdir -p`: the directory, and whether it `existed`. */
  mkdir(path: string, opts?: RequestOptions): Promise<DirMade> {
    return this.#sandbox.client.makeDir(this.#sandbox.id, path, opts);
  }

  /** Rename `source` to `destination`; resolves with the moved entry. */
  move(source: string, destination: string, opts?: RequestOptions): Promise<EntryInfo> {
    return this.#sandbox.client.moveFile(this.#sandbox.id, source, destination, opts);
  }

  /** Remove a file, a symlink or a directory with all it holds (never following a symlink). */
  remove(path: string, opts?: RequestOptions): Promise<void> {
    return this.#sandbox.client.removeFile(this.#sandbox.id, path, opts);
  }

  /** Watch a directory: resolves once the watch is in place, with the stream of its changes. */
  async watch(path: string, opts?: RequestOptions & { recursive?: boolean | undefined }): Promise<WatchStream> {
    const { client, id } = this.#sandbox;
    const stream = new WatchStream((signal) => client.watchDir(id, path, { recursive: opts?.recursive, signal }), opts?.signal);
    return stream.ready();
  }

  /** A watcher to poll (a sandbox has at most 64); close it when done (or `await using`). */
  async watcher(path: string, opts?: RequestOptions & { recursive?: boolean | undefined }): Promise<FsWatcher> {
    const created = await this.#sandbox.client.createWatcher(this.#sandbox.id, path, opts);
    return new FsWatcher(this.#sandbox, created.watcher_id);
  }

  /**
   * A tar of these paths (directories with all they hold, symlinks as
   * symlinks, modes, owners and mtimes kept), each entry named by its
   * absolute path without the leading `/`: uploaded to `/` it restores them.
   */
  downloadArchive(paths: string | readonly string[], opts?: RequestOptions): Promise<Uint8Array> {
    return this.#sandbox.client.downloadArchive(this.#sandbox.id, paths, opts);
  }

  /** Unpack a tar under the directory `path` (created if missing); no entry can leave it. */
  uploadArchive(path: string, tar: Uint8Array, opts?: RequestOptions): Promise<ArchiveWritten> {
    return this.#sandbox.client.uploadArchive(this.#sandbox.id, path, tar, opts);
  }
}
