/**
 * Background processes of a sandbox (`sb.processes`): start them, list them,
 * attach to their output (replayed, then live), write their stdin, signal,
 * kill and resize them. See docs/processes.md.
 *
 * ```ts
 * const web = await sb.processes.start("python3 -m http.server 8000", { tag: "web" });
 * for await (const event of sb.processes.attach("web")) {
 *   if (event.type === "stdout") process.stdout.write(event.text);
 *   if (event.type === "end") console.log(event.status);
 * }
 * ```
 *
 * @module
 */
import type { ProcessRef, ProcessStreamFrame, SignalSpec, StartProcessParams } from "./client-procs.js";
import { argvOf, type Command } from "./exec.js";
import type { Sandbox } from "./sandbox.js";
import type { Process, PtySize } from "./types.js";

/** Options of `sb.processes.start` and `sb.processes.run`. */
export interface StartProcessOptions {
  /** A name to address it by (1–64 letters, digits, `.`, `_`, `-`, not all digits; unique among running processes). */
  tag?: string | undefined;
  /** Extra environment variables. */
  env?: Record<string, string> | undefined;
  /** Working directory (default: the image's `WorkingDir`, else `/`). */
  cwd?: string | undefined;
  /** Run as `name`, `uid`, `name:group` or `uid:gid`. */
  user?: string | undefined;
  /** Give it a stdin pipe to write (else `/dev/null`). */
  stdin?: boolean | undefined;
  /** Run it on a terminal of this size; its output arrives as `pty` events. */
  pty?: PtySize | undefined;
  /** Abort the request. */
  signal?: AbortSignal | undefined;
}

/** How a process ended. */
export interface ProcessExit {
  /** The exit code, or -1 when a signal killed it. */
  exitCode: number;
  /** It exited by itself (false: a signal killed it). */
  exited: boolean;
  signal: number | null;
  /** `exit status 3`, `signal: killed`… */
  status: string;
  /** Why the sandbox lost track of it, if it did. */
  error: string | null;
}

/**
 * An event of a process stream: its pid first, output chunks (`data` decoded
 * from base64; `lost` bytes were dropped just before), then its end.
 */
export type ProcessStreamEvent =
  | { type: "start"; pid: number }
  | { type: "stdout" | "stderr" | "pty"; data: Uint8Array; text: string; lost: number }
  | ({ type: "end" } & ProcessExit);

/** The wire request of a process. */
export function startParams(cmd: Command | undefined, opts: StartProcessOptions = {}): StartProcessParams {
  const req: StartProcessParams = {};
  if (cmd !== undefined) req.argv = argvOf(cmd);
  if (opts.tag !== undefined) req.tag = opts.tag;
  if (opts.env !== undefined) req.env = opts.env;
  if (opts.cwd !== undefined) req.cwd = opts.cwd;
  if (opts.user !== undefined) req.user = opts.user;
  if (opts.stdin) req.stdin = true;
  if (opts.pty !== undefined) req.pty = { cols: opts.pty.cols, rows: opts.pty.rows };
  return req;
}

/**
 * The events of a background process. Iterate it once with `for await`, or
 * call `wait()`; the request is sent when reading starts. `stdout`,
 * `stderr` and `pty` hold the bytes read so far. Breaking out of the loop or
 * `cancel()` closes the connection; the process runs on.
 */
export class ProcessStream implements AsyncIterable<ProcessStreamEvent>, AsyncDisposable {
  readonly #frames: AsyncGenerator<ProcessStreamFrame, void>;
  readonly #abort = new AbortController();
  readonly #decoders = { stdout: new TextDecoder(), stderr: new TextDecoder(), pty: new TextDecoder() };
  readonly #output: Record<"stdout" | "stderr" | "pty", Buffer[]> = { stdout: [], stderr: [], pty: [] };
  #started = false;
  #pid: number | undefined;
  #end: ProcessExit | undefined;
  /** Bytes the daemon dropped (older than its 1 MiB, or produced faster than read). */
  lost = 0;

  /** `open` makes the request with the signal it is given (see `Client.attachProcess`). */
  constructor(open: (signal: AbortSignal) => AsyncGenerator<ProcessStreamFrame, void>, signal?: AbortSignal) {
    this.#frames = open(signal ? AbortSignal.any([signal, this.#abort.signal]) : this.#abort.signal);
  }

  /** The process's pid, once the `start` event was read. */
  get pid(): number | undefined {
    return this.#pid;
  }

  /** How it ended, once the `end` event was read. */
  get end(): ProcessExit | undefined {
    return this.#end;
  }

  get stdout(): Uint8Array {
    return Buffer.concat(this.#output.stdout);
  }

  get stderr(): Uint8Array {
    return Buffer.concat(this.#output.stderr);
  }

  /** What its terminal showed (a process with a PTY). */
  get pty(): Uint8Array {
    return Buffer.concat(this.#output.pty);
  }

  /** All the output read so far (stdout, stderr and pty), as text. */
  get text(): string {
    return Buffer.concat([...this.#output.stdout, ...this.#output.stderr, ...this.#output.pty]).toString("utf8");
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ProcessStreamEvent, void> {
    if (this.#started) throw new Error("a ProcessStream can be read only once");
    this.#started = true;
    try {
      for await (const frame of this.#frames) {
        const event = this.#event(frame);
        yield event;
        if (event.type === "end") return;
      }
    } catch (err) {
      // cancel() ends the loop quietly; any other abort or failure is thrown.
      if (!this.#abort.signal.aborted) throw err;
    } finally {
      await this.#frames.return();
    }
  }

  /** Read to the end; resolve with how the process ended. */
  async wait(): Promise<ProcessExit> {
    if (!this.#started) {
      for await (const _ of this) {
        // the output accumulates
      }
    }
    if (!this.#end) throw new Error("the stream was cancelled, or read elsewhere, before the process ended");
    return this.#end;
  }

  /** Stop reading and close the connection (the process runs on). */
  async cancel(): Promise<void> {
    this.#abort.abort();
    if (!this.#started) {
      this.#started = true;
      await this.#frames.return();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.cancel();
  }

  #event(frame: ProcessStreamFrame): ProcessStreamEvent {
    switch (frame.type) {
      case "start":
        this.#pid = frame.pid;
        return { type: "start", pid: frame.pid };
      case "end":
        this.#end = {
          exitCode: frame.exit_code,
          exited: frame.exited,
          signal: frame.signal ?? null,
          status: frame.status,
          error: frame.error ?? null,
        };
        return { type: "end", ...this.#end };
      default: {
        const data = Buffer.from(frame.data, "base64");
        const lost = frame.lost ?? 0;
        this.#output[frame.type].push(data);
        this.lost += lost;
        return { type: frame.type, data, text: this.#decoders[frame.type].decode(data, { stream: true }), lost };
      }
    }
  }
}

/** A background process of a sandbox, by pid: a handle, holding no connection. */
export class SandboxProcess {
  readonly #sandbox: Sandbox;
  readonly pid: number;
  readonly tag: string | null;

  constructor(sandbox: Sandbox, pid: number, tag: string | null = null) {
    this.#sandbox = sandbox;
    this.pid = pid;
    this.tag = tag;
  }

  /** Its kept output, then live events until it ends. */
  attach(opts?: { signal?: AbortSignal | undefined }): ProcessStream {
    return this.#sandbox.processes.attach(this.pid, opts);
  }

  /** Wait for it to end; resolve with how it ended. */
  wait(): Promise<ProcessExit> {
    return this.attach().wait();
  }

  /** Write to its stdin pipe (started with `stdin: true`), or type into its PTY. */
  sendStdin(data: Uint8Array | string): Promise<void> {
    return this.#sandbox.processes.sendStdin(this.pid, data);
  }

  /** Close its stdin once what was queued is written (it sees end-of-file). */
  closeStdin(): Promise<void> {
    return this.#sandbox.processes.closeStdin(this.pid);
  }

  /** Send a signal (`"INT"`, `15`…) to its process group. */
  signal(signal: SignalSpec): Promise<void> {
    return this.#sandbox.processes.signal(this.pid, signal);
  }

  /** SIGKILL its process group. */
  kill(): Promise<void> {
    return this.#sandbox.processes.kill(this.pid);
  }

  /** Resize its PTY (it gets SIGWINCH). */
  resize(cols: number, rows: number): Promise<void> {
    return this.#sandbox.processes.resize(this.pid, cols, rows);
  }
}

/** `sb.processes`: background processes, named by pid or tag. */
export class SandboxProcesses {
  readonly #sandbox: Sandbox;

  constructor(sandbox: Sandbox) {
    this.#sandbox = sandbox;
  }

  /**
   * Start `cmd` (a shell line, or an argv array; omitted: the image's default
   * command) in the background; resolves with its handle at once.
   */
  async start(cmd?: Command, opts: StartProcessOptions = {}): Promise<SandboxProcess> {
    const started = await this.#sandbox.client.startProcess(this.#sandbox.id, startParams(cmd, opts), { signal: opts.signal });
    return new SandboxProcess(this.#sandbox, started.pid, started.tag ?? null);
  }

  /** Start `cmd` like {@link start}, streaming its events until it ends (its pid first). */
  run(cmd?: Command, opts: StartProcessOptions = {}): ProcessStream {
    const { client, id } = this.#sandbox;
    return new ProcessStream((signal) => client.startProcessStream(id, startParams(cmd, opts), { signal }), opts.signal);
  }

  /** The running background processes. */
  async list(opts?: { signal?: AbortSignal | undefined }): Promise<Process[]> {
    return (await this.#sandbox.client.listProcesses(this.#sandbox.id, opts)).processes;
  }

  /** A handle for the process with this pid (no request is made). */
  get(pid: number): SandboxProcess {
    return new SandboxProcess(this.#sandbox, pid);
  }

  /**
   * The events of a process (pid or tag): the output the sandbox kept (its
   * last 1 MiB), then live output, then its end. One of the last 8 that ended
   * can still be attached.
   */
  attach(process: ProcessRef, opts?: { signal?: AbortSignal | undefined }): ProcessStream {
    const { client, id } = this.#sandbox;
    return new ProcessStream((signal) => client.attachProcess(id, process, { signal }), opts?.signal);
  }

  /** Write to a process's stdin pipe, or type into its PTY. */
  sendStdin(process: ProcessRef, data: Uint8Array | string): Promise<void> {
    return this.#sandbox.client.writeStdin(this.#sandbox.id, process, data);
  }

  /** Close a process's stdin once what was queued is written. */
  closeStdin(process: ProcessRef): Promise<void> {
    return this.#sandbox.client.closeStdin(this.#sandbox.id, process);
  }

  /** Send a signal (`"INT"`, `"SIGTERM"`, `9`…) to a process's group. */
  signal(process: ProcessRef, signal: SignalSpec): Promise<void> {
    return this.#sandbox.client.signalProcess(this.#sandbox.id, process, signal);
  }

  /** SIGKILL a process's group. */
  kill(process: ProcessRef): Promise<void> {
    return this.#sandbox.client.killProcess(this.#sandbox.id, process);
  }

  /** Resize a process's PTY (it gets SIGWINCH). */
  resize(process: ProcessRef, cols: number, rows: number): Promise<void> {
    return this.#sandbox.client.resizePty(this.#sandbox.id, process, { cols, rows });
  }
}
