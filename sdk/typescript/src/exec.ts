/**
 * Commands in a sandbox: options, results, and the streamed form.
 *
 * @module
 */
import type { Client, ExecParams, ExecStreamFrame, ExecStreamParams } from "./client.js";
import type { ExecResult } from "./types.js";

/**
 * A command: a shell line (run with `/bin/sh -c`) or an argv array (run
 * directly); an empty array runs the image's default command (its
 * `Entrypoint` and `Cmd`).
 */
export type Command = string | readonly string[];

/** Options of `Sandbox.exec` and `Sandbox.execStream`. */
export interface ExecOptions {
  /** Standard input: text, or bytes. */
  stdin?: string | Uint8Array | undefined;
  /** Extra environment variables. */
  env?: Record<string, string> | undefined;
  /** Working directory (default: the image's `WorkingDir`, else `/`). */
  cwd?: string | undefined;
  /** Run as this user: `name`, `uid`, `name:group` or `uid:gid` (default: the image's `User`, else root). */
  user?: string | undefined;
  /** Kill the command (its whole process group) after this many milliseconds. */
  timeoutMs?: number | undefined;
  /** Keep at most this many bytes of each of stdout and stderr. */
  maxOutputBytes?: number | undefined;
  /** Abort the request. */
  signal?: AbortSignal | undefined;
  /**
   * Called with each chunk of stdout as the command writes it. Given this or
   * `onStderr`, `exec` streams the output (`"stream": true`).
   */
  onStdout?: ((text: string, data: Uint8Array) => void) | undefined;
  /** Called with each chunk of stderr as the command writes it. */
  onStderr?: ((text: string, data: Uint8Array) => void) | undefined;
}

/** Options of `Sandbox.exec` that return the output as bytes. */
export interface BinaryExecOptions extends ExecOptions {
  /** Return stdout and stderr as exact bytes instead of UTF-8 text. */
  binary: true;
}

/** A finished command. */
export interface CommandResult<T extends string | Uint8Array = string> {
  stdout: T;
  stderr: T;
  /** Exit status, or null when the command was killed by a signal. */
  exitCode: number | null;
  /** The signal that ended the command, if one did. */
  signal: number | null;
  /** The command ran past `timeoutMs` and was killed. */
  timedOut: boolean;
  /** Run time inside the guest. */
  durationMs: number;
  /** Total bytes written, including any past `maxOutputBytes`. */
  stdoutBytes: number;
  stderrBytes: number;
  /** Output past `maxOutputBytes` was dropped. */
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
}

/** How a streamed command ended. */
export interface ExecExit {
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  durationMs: number;
  /** Total bytes the command wrote to each stream. */
  stdoutBytes: number;
  stderrBytes: number;
}

/** An event of a streamed command. `text` is `data` decoded as UTF-8 (a character split across chunks comes whole with the later one). */
export type ExecEvent =
  | { type: "stdout"; data: Uint8Array; text: string }
  | { type: "stderr"; data: Uint8Array; text: string }
  | ({ type: "exit" } & ExecExit);

/** Options of `Sandbox.execStream`. */
export type ExecStreamOptions = Omit<ExecOptions, "maxOutputBytes">;

/** The wire request of a streamed command. */
export function execStreamParams(cmd: Command, opts: ExecStreamOptions = {}): ExecStreamParams {
  const { max_output_bytes: _cap, encoding: _encoding, ...params } = execParams(cmd, opts);
  return params;
}

/** The argv of a command (empty: the image's default command). */
export function argvOf(cmd: Command): string[] {
  if (typeof cmd === "string") return ["/bin/sh", "-c", cmd];
  if (!Array.isArray(cmd)) throw new TypeError(`a command is a shell line or an argv array, not ${JSON.stringify(cmd)}`);
  return [...cmd];
}

/** The wire request of a command. */
export function execParams(cmd: Command, opts: ExecOptions = {}, binary = false): ExecParams {
  const params: ExecParams = { argv: argvOf(cmd) };
  if (typeof opts.stdin === "string") params.stdin = opts.stdin;
  else if (opts.stdin !== undefined) params.stdin_base64 = Buffer.from(opts.stdin).toString("base64");
  if (opts.env !== undefined) params.env = opts.env;
  if (opts.cwd !== undefined) params.cwd = opts.cwd;
  if (opts.user !== undefined) params.user = opts.user;
  if (opts.timeoutMs !== undefined) params.timeout_ms = opts.timeoutMs;
  if (opts.maxOutputBytes !== undefined) params.max_output_bytes = opts.maxOutputBytes;
  if (binary) params.encoding = "base64";
  return params;
}

/** The SDK form of a wire {@link ExecResult}. */
export function commandResult(result: ExecResult, binary: boolean): CommandResult<string | Uint8Array> {
  const decode = (text: string): string | Uint8Array => {
    if (result.encoding !== "base64") return binary ? Buffer.from(text, "utf8") : text;
    const bytes = Buffer.from(text, "base64");
    return binary ? bytes : bytes.toString("utf8");
  };
  return {
    stdout: decode(result.stdout),
    stderr: decode(result.stderr),
    exitCode: result.exit_code ?? null,
    signal: result.signal ?? null,
    timedOut: result.timed_out,
    durationMs: result.duration_ms,
    stdoutBytes: result.stdout_bytes,
    stderrBytes: result.stderr_bytes,
    stdoutTruncated: result.stdout_truncated,
    stderrTruncated: result.stderr_truncated,
  };
}

/**
 * A command whose output arrives as it is written. Iterate it (once) with
 * `for await`, or call `wait()`; either way `onStdout`/`onStderr` see every
 * chunk. The request is sent when reading starts. Breaking out of the loop
 * or calling `cancel()` closes the connection, but the command runs on in
 * the guest: bound it with `timeoutMs`.
 */
export class ExecStream implements AsyncIterable<ExecEvent> {
  readonly #frames: AsyncGenerator<ExecStreamFrame, void>;
  readonly #opts: ExecStreamOptions;
  readonly #decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  readonly #abort = new AbortController();
  #started = false;
  #exit: ExecExit | undefined;

  constructor(client: Client, sandboxId: string, cmd: Command, opts: ExecStreamOptions = {}) {
    this.#opts = opts;
    const signal = opts.signal ? AbortSignal.any([opts.signal, this.#abort.signal]) : this.#abort.signal;
    this.#frames = client.execStream(sandboxId, execStreamParams(cmd, opts), { signal });
  }

  /** How the command ended, once the `exit` event was read. */
  get exit(): ExecExit | undefined {
    return this.#exit;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ExecEvent, void> {
    if (this.#started) throw new Error("an ExecStream can be read only once");
    this.#started = true;
    try {
      for await (const frame of this.#frames) {
        const event = this.#event(frame);
        if (event.type === "stdout") this.#opts.onStdout?.(event.text, event.data);
        else if (event.type === "stderr") this.#opts.onStderr?.(event.text, event.data);
        else {
          const { type: _, ...exit } = event;
          this.#exit = exit;
        }
        yield event;
      }
    } catch (err) {
      // cancel() ends the loop quietly; any other abort or failure is thrown.
      if (!this.#abort.signal.aborted) throw err;
    } finally {
      await this.#frames.return();
    }
  }

  /** Read the rest of the stream (calling the callbacks) and resolve with how the command ended. */
  async wait(): Promise<ExecExit> {
    if (!this.#started) {
      for await (const _ of this) {
        // the callbacks see each chunk
      }
    }
    if (!this.#exit) throw new Error("the stream was cancelled, or read elsewhere, before the command exited");
    return this.#exit;
  }

  /** Stop reading and close the connection. */
  async cancel(): Promise<void> {
    this.#abort.abort();
    if (!this.#started) {
      this.#started = true;
      await this.#frames.return();
    }
  }

  #event(frame: ExecStreamFrame): ExecEvent {
    if (frame.type === "exit") {
      return {
        type: "exit",
        exitCode: frame.exit_code ?? null,
        signal: frame.signal ?? null,
        timedOut: frame.timed_out,
        durationMs: frame.duration_ms,
        stdoutBytes: frame.stdout_bytes,
        stderrBytes: frame.stderr_bytes,
      };
    }
    const data = Buffer.from(frame.data, "base64");
    return { type: frame.type, data, text: this.#decoders[frame.type].decode(data, { stream: true }) };
  }
}
