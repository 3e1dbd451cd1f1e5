/**
 * What the Client's modules share about the wire: JSON bodies, parsing
 * answers, turning error answers and `error` lines into {@link ForkvmError}s,
 * and splitting NDJSON streams into lines.
 *
 * @module
 */
import { ForkvmError, ProtocolError } from "./errors.js";
import type { TransportRequest, TransportResponse } from "./transport.js";
import type { ErrorDetail } from "./types.js";

/** A JSON request body and its content type. */
export function jsonBody(value: object): Pick<TransportRequest, "body" | "headers"> {
  return { body: JSON.stringify(value), headers: { "content-type": "application/json" } };
}

/** The body of an answer, as JSON. */
export async function parseJson<T>(res: TransportResponse): Promise<T> {
  const text = new TextDecoder().decode(await res.bytes());
  try {
    return JSON.parse(text) as T;
  } catch (cause) {
    throw new ProtocolError(`the daemon sent invalid JSON (HTTP ${res.status}): ${text.slice(0, 200)}`, res.status, {
      cause,
    });
  }
}

/** The error an answer of status 400 or more stands for. */
export async function errorFrom(res: TransportResponse): Promise<ForkvmError> {
  const text = new TextDecoder().decode(await res.bytes());
  let detail: Partial<ErrorDetail> | undefined;
  try {
    detail = (JSON.parse(text) as { error?: Partial<ErrorDetail> }).error;
  } catch {
    // not JSON: fall through with the raw text
  }
  return errorFromDetail(
    {
      code: detail?.code ?? `http_${res.status}`,
      message: detail?.message ?? (text.trim() || `HTTP ${res.status}`),
      ...(detail?.hint ? { hint: detail.hint } : {}),
    },
    res.status,
  );
}

/** The error of an `error` detail (an error answer's, or a stream's last line). */
export function errorFromDetail(detail: ErrorDetail, status: number): ForkvmError {
  return ForkvmError.fromResponse(status, detail.code, detail.message, detail.hint);
}

/** Split a byte stream into its non-empty lines (NDJSON). */
export async function* ndjsonLines(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<string, void> {
  const decoder = new TextDecoder();
  let pending = "";
  for await (const chunk of chunks) {
    pending += decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline).trim();
      pending = pending.slice(newline + 1);
      if (line) yield line;
    }
  }
  const rest = (pending + decoder.decode()).trim();
  if (rest) yield rest;
}
