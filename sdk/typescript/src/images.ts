/**
 * The client side of the image operations: the NDJSON progress stream, the
 * query strings, and what the uploads send.
 *
 * Progress: `POST /v1/images` with `stream: true`, and always
 * `POST /v1/images/import` and `POST /v1/images/build`, answer with
 * `application/x-ndjson`, one {@link ImageEvent} per line:
 *
 * ```text
 * {"type":"phase","phase":"fetching"}
 * {"type":"progress","item":"sha256:…","done":1048576,"total":3145728}
 * {"type":"step","index":2,"total":5,"text":"RUN make","cached":false}
 * {"type":"log","line":"…"}
 * {"type":"done","image":{…}}            (the last line), or
 * {"type":"error","error":{"code":"…","message":"…"}}
 * ```
 *
 * An `error` line is thrown as the {@link ForkvmError} of its code; a stream
 * that ends without `done` or `error` is a {@link ProtocolError}.
 *
 * Uploads: an import streams its archive file from disk; a directory (an OCI
 * image layout) is packed into a temporary tar first. A build packs its
 * context directory into a temporary tar with the Dockerfile's text added as
 * {@link DOCKERFILE_IN_CONTEXT}, the name its `dockerfile` parameter then
 * gives. Temporary tars are removed when the call ends.
 *
 * @module
 */
import { createReadStream } from "node:fs";
import { readFile, rm, stat } from "node:fs/promises";
import { basename, join, normalize } from "node:path";
import { ForkvmError, ProtocolError } from "./errors.js";
import { packDirectory } from "./tar.js";
import type { BuildQuery, Image, ImageEvent, ImportQuery } from "./types.js";

/** The name the Dockerfile travels under in a build context tar (as the CLI sends it). */
export const DOCKERFILE_IN_CONTEXT = ".forkvm-dockerfile";

/** Called with each progress event; a returned promise is awaited before the next. */
export type ImageEventCallback = (event: ImageEvent) => void | Promise<void>;

/** Parse one NDJSON line of an image progress stream (`status`: the response's, for errors). */
export function parseImageEvent(line: string, status: number): ImageEvent {
  let event: unknown;
  try {
    event = JSON.parse(line);
  } catch (cause) {
    throw new ProtocolError(`bad line in an image progress stream: ${line.slice(0, 200)}`, status, { cause });
  }
  if (event === null || typeof event !== "object" || typeof (event as { type?: unknown }).type !== "string") {
    throw new ProtocolError(`bad line in an image progress stream: ${line.slice(0, 200)}`, status);
  }
  return event as ImageEvent;
}

/**
 * Read a progress stream to its end: each event goes to `onEvent` (events
 * of types this SDK does not know too); resolves with the image of the
 * `done` line, or throws the error of the `error` line (with the status its
 * code has outside a stream).
 */
export async function readImageEvents(
  lines: AsyncIterable<string>,
  status: number,
  onEvent?: ImageEventCallback,
): Promise<Image> {
  for await (const line of lines) {
    const event = parseImageEvent(line, status);
    await onEvent?.(event);
    if (event.type === "done") {
      if (!event.image || typeof event.image !== "object") {
        throw new ProtocolError("a `done` line without its image in an image progress stream", status);
      }
      return event.image;
    }
    if (event.type === "error") {
      const code = event.error?.code ?? "error";
      const message = event.error?.message ?? "the image operation failed";
      throw ForkvmError.fromResponse(ForkvmError.statusOf(code) ?? status, code, message);
    }
  }
  throw new ProtocolError(
    "the image progress stream ended before its result (the connection broke, or the daemon stopped); " +
      "list the images to see whether it was installed",
    status,
  );
}

/** A query model as query-string parameters: unset fields left out, booleans `true`/`false`. */
export function queryParams(query: object): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null) out[key] = String(value);
  }
  return out;
}

/** `Client.importImage`'s parameters: the query, whose `file` defaults to the archive's file name. */
export type ImportImageParams = ImportQuery;

/** `Client.buildImage`'s parameters. */
export interface BuildImageParams extends Omit<BuildQuery, "dockerfile" | "build_args"> {
  /** The Dockerfile, a path on this machine (default `<context>/Dockerfile`). */
  dockerfile?: string | undefined;
  /** `ARG` values. */
  build_args?: Record<string, string> | undefined;
}

/** The query of an import of `path`. */
export function importQuery(path: string, params: ImportImageParams): ImportQuery {
  if (!params.name) throw new TypeError("an imported image needs a name");
  const query: ImportQuery = { name: params.name, file: params.file ?? (basename(normalize(path)) || undefined) };
  if (params.disk_size != null) query.disk_size = params.disk_size;
  if (params.replace) query.replace = true;
  return query;
}

/** The query of a build whose context tar holds the Dockerfile as {@link DOCKERFILE_IN_CONTEXT}. */
export function buildQuery(params: BuildImageParams): BuildQuery {
  if (!params.tag) throw new TypeError("a build needs a tag (the image's name)");
  const query: BuildQuery = { tag: params.tag, dockerfile: DOCKERFILE_IN_CONTEXT };
  const args = params.build_args;
  if (args !== undefined && (args === null || typeof args !== "object" || Array.isArray(args))) {
    throw new TypeError(`build_args is an object of names to values, not ${JSON.stringify(args)}`);
  }
  if (args && Object.keys(args).length) {
    const sorted = Object.fromEntries(
      Object.keys(args)
        .sort()
        .map((k) => [k, String(args[k])]),
    );
    query.build_args = JSON.stringify(sorted);
  }
  if (params.no_cache) query.no_cache = true;
  if (params.target) query.target = params.target;
  if (params.disk_size != null) query.disk_size = params.disk_size;
  if (params.memory_mib != null) query.memory_mib = params.memory_mib;
  return query;
}

/** A file to upload: its path and size, and whether it is a temporary tar to remove afterwards. */
export interface Upload {
  path: string;
  size: number;
  temporary: boolean;
}

/** What an import of `path` sends: the file itself, or a directory packed into a temporary tar. */
export async function prepareImport(path: string): Promise<Upload> {
  const st = await stat(path).catch((cause: unknown) => {
    throw new Error(`${path}: no such file or directory to import`, { cause });
  });
  if (st.isDirectory()) return uploadOf(await packDirectory(path), true);
  if (!st.isFile()) throw new Error(`${path} is neither a file nor a directory`);
  return { path, size: st.size, temporary: false };
}

/** Pack a build context with its Dockerfile (default `<context>/Dockerfile`) into a temporary tar. */
export async function prepareBuild(context: string, dockerfile?: string): Promise<Upload> {
  if (!(await stat(context).catch(() => undefined))?.isDirectory()) {
    throw new Error(`the build context ${context} is not a directory`);
  }
  const file = dockerfile ?? join(context, "Dockerfile");
  const text = await readFile(file).catch((cause: unknown) => {
    throw new Error(`no Dockerfile at ${file}; pass dockerfile: PATH`, { cause });
  });
  return uploadOf(await packDirectory(context, [{ name: DOCKERFILE_IN_CONTEXT, data: text }]), true);
}

async function uploadOf(path: string, temporary: boolean): Promise<Upload> {
  return { path, size: (await stat(path)).size, temporary };
}

/** Remove an upload's temporary tar (nothing for a file of the caller's). */
export async function discard(upload: Upload | undefined): Promise<void> {
  if (upload?.temporary) await rm(upload.path, { force: true });
}

/** A file's bytes as they are read from disk, a MiB at a time. */
export async function* fileChunks(path: string): AsyncGenerator<Uint8Array> {
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) yield chunk as Buffer;
}
