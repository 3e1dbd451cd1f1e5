/**
 * A Server-Sent Events parser: the bytes of a `text/event-stream` in, its
 * messages out. Pure (no I/O), so that the framing is tested without a
 * daemon (`GET /v1/events`, docs/events.md).
 *
 * It follows the parsing rules of the HTML standard rather than the exact
 * framing forkvm's daemon writes today, so that a proxy in between, or a
 * later daemon, that frames the same messages differently is read the same:
 *
 * - a line ends in LF, CRLF or a lone CR, and a chunk may end anywhere: in
 *   the middle of a line, of a UTF-8 sequence, or between the CR and LF of
 *   one line end (hence the parser keeps that state between chunks);
 * - a blank line dispatches the message; a line that starts with `:` is a
 *   comment (the daemon's keep-alive) and is skipped;
 * - `field: value` loses one space after the colon, no more; a line without
 *   a colon is a field with an empty value;
 * - `data` lines are joined with `\n`; `event` names the message (`message`
 *   when absent); `id` sets the last event id, which holds for later
 *   messages too (the standard's rule, and what a reconnect sends); `retry`
 *   (digits only) is the reconnection delay in ms; other fields are ignored;
 * - a message without `data` is not dispatched, and a message the stream
 *   ends in without its blank line is dropped (it may be cut short).
 *
 * @module
 */

/** One dispatched message. */
export interface SseMessage {
  /** Its `event:` field, `"message"` when it had none. */
  event: string;
  /** Its `data:` lines joined with `\n`. */
  data: string;
  /** The last event id in effect when it was dispatched (undefined before any `id:`). */
  id?: string | undefined;
  /** The last `retry:` (ms) seen so far on the stream. */
  retry?: number | undefined;
}

const CR = 0x0d;
const LF = 0x0a;
const BOM = "\ufeff";

/** Feed it chunks of the stream as they arrive; each `feed` returns the messages those bytes completed. */
export class SseParser {
  /** The bytes of a line not yet ended. */
  #partial: Uint8Array = new Uint8Array(0);
  /** The last chunk ended in CR: a LF first in the next one ends no new line. */
  #afterCr = false;
  /** A byte order mark may open the stream (and only the stream: `ignoreBOM` keeps any other). */
  #firstLine = true;
  readonly #decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  #event = "";
  #data: string[] = [];
  /** The last event id the stream set (`id:`), kept across messages. */
  lastEventId: string | undefined;
  /** The reconnection delay the stream asked for (`retry:`), in ms. */
  retry: number | undefined;

  /** Parse `chunk`; return the messages it completed, in order. */
  feed(chunk: Uint8Array): SseMessage[] {
    if (chunk.length === 0) return []; // changes nothing, not even a pending CR
    const skip = this.#afterCr && chunk[0] === LF ? 1 : 0;
    this.#afterCr = false;
    const rest = chunk.subarray(skip);
    const buf = this.#partial.length ? Buffer.concat([this.#partial, rest]) : rest;
    const out: SseMessage[] = [];
    let start = 0;
    for (let i = 0; i < buf.length; i++) {
      const byte = buf[i];
      if (byte !== CR && byte !== LF) continue;
      const message = this.#line(buf.subarray(start, i));
      if (message) out.push(message);
      if (byte === CR) {
        if (i + 1 === buf.length) this.#afterCr = true; // maybe the first half of a split CRLF
        else if (buf[i + 1] === LF) i++;
      }
      start = i + 1;
    }
    // A copy (a Buffer's slice would be a view): the caller may reuse its chunk's memory.
    this.#partial = new Uint8Array(buf.subarray(start));
    return out;
  }

  #line(raw: Uint8Array): SseMessage | undefined {
    // Splitting bytes before decoding is safe: CR and LF never occur inside a UTF-8 sequence.
    let line = this.#decoder.decode(raw);
    if (this.#firstLine) {
      this.#firstLine = false;
      if (line.startsWith(BOM)) line = line.slice(1);
    }
    if (line === "") return this.#dispatch();
    if (line.startsWith(":")) return undefined; // a comment: the daemon's keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        this.#event = value;
        break;
      case "data":
        this.#data.push(value);
        break;
      case "id":
        if (!value.includes("\0")) this.lastEventId = value;
        break;
      case "retry":
        if (/^[0-9]+$/.test(value)) this.retry = Number(value);
        break;
      default:
      // unknown fields are ignored
    }
    return undefined;
  }

  #dispatch(): SseMessage | undefined {
    const event = this.#event;
    const data = this.#data;
    this.#event = "";
    this.#data = [];
    if (data.length === 0) return undefined;
    return { event: event || "message", data: data.join("\n"), id: this.lastEventId, retry: this.retry };
  }
}

/** The messages of a byte stream (a response body), as they complete. */
export async function* sseMessages(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<SseMessage, void> {
  const parser = new SseParser();
  for await (const chunk of chunks) yield* parser.feed(chunk);
}
