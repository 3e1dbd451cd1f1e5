/**
 * The event stream's pure parts, without a daemon: the Server-Sent Events
 * framing (`SseParser`), messages to models (`parseEvent`), and the request
 * `client.events()` sends. The stream itself is tested against a real daemon
 * in events.test.ts.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Client, parseEvent, ProtocolError, SseParser, type api, type SseMessage } from "forkvm";
import { RecordingTransport } from "./helpers.js";

const enc = (text: string): Uint8Array => new TextEncoder().encode(text);
const READY = 'event: ready\ndata: {"seq": 41}\n\n';
const SANDBOX: api.Sandbox = {
  id: "sb-1",
  state: "running",
  image: "default",
  memory_mib: 256,
  cpus: 1,
  accel: "tcg",
  created_at: "2026-01-01T00:00:00Z",
};
const CREATED: api.Event = { seq: 42, at_unix_ms: 1795690000123, kind: "sandbox.created", id: "sb-1", sandbox: SANDBOX };

function frame(kind: string, data: unknown, id?: number): string {
  return `${id === undefined ? "" : `id: ${id}\n`}event: ${kind}\ndata: ${JSON.stringify(data)}\n\n`;
}

/** The messages of these chunks, fed in turn to one parser. */
function feedAll(chunks: (string | Uint8Array)[]): SseMessage[] {
  const parser = new SseParser();
  return chunks.flatMap((c) => parser.feed(typeof c === "string" ? enc(c) : c));
}

const brief = (ms: SseMessage[]): [string, string, string | undefined][] => ms.map((m) => [m.event, m.data, m.id]);

describe("SSE framing", () => {
  test("ready", () => {
    assert.deepEqual(brief(feedAll([READY])), [["ready", '{"seq": 41}', undefined]]);
  });

  test("an event with its id", () => {
    const [m, ...rest] = feedAll([frame("sandbox.created", CREATED, 42)]);
    assert.equal(rest.length, 0);
    assert.equal(m?.event, "sandbox.created");
    assert.equal(m?.id, "42");
    assert.deepEqual(JSON.parse(m!.data), CREATED);
  });

  test("the last id holds for later messages; an empty id clears it", () => {
    const ms = feedAll(["id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n"]);
    assert.deepEqual(ms.map((m) => [m.data, m.id]), [["a", "7"], ["b", "7"], ["c", ""]]);
  });

  test("multi-line data is joined with newlines; one space after the colon goes, no more", () => {
    const [m] = feedAll(["event: x\ndata: one\ndata:two\ndata\ndata:  four\n\n"]);
    assert.equal(m?.data, "one\ntwo\n\n four");
  });

  test("comments are keep-alives, skipped", () => {
    assert.deepEqual(feedAll([": keep-alive\n\n:keep-alive\n\n", READY, ": keep-alive\n\n"]).map((m) => m.event), ["ready"]);
  });

  test("reset", () => {
    assert.deepEqual(brief(feedAll(['event: reset\ndata: {"seq":0}\n\n'])), [["reset", '{"seq":0}', undefined]]);
  });

  for (const [name, end] of [["CRLF", "\r\n"], ["CR", "\r"], ["LF", "\n"]] as const) {
    test(`${name} line ends`, () => {
      const text = (READY + frame("branch", { a: 1 }, 3)).replaceAll("\n", end);
      assert.deepEqual(brief(feedAll([text])), [["ready", '{"seq": 41}', undefined], ["branch", '{"a":1}', "3"]]);
    });
  }

  test("a frame split anywhere: in a field, in a UTF-8 sequence, between CR and LF", () => {
    const text = enc((READY + ": keep-alive\n\n" + frame("sandbox.created", { ...CREATED, id: "sb-é" }, 42)).replaceAll("\n", "\r\n"));
    const whole = feedAll([text]);
    assert.equal(whole.length, 2);
    assert.equal((JSON.parse(whole[1]!.data) as api.Event).id, "sb-é");
    for (let cut = 1; cut < text.length; cut++) {
      assert.deepEqual(feedAll([text.slice(0, cut), text.slice(cut)]), whole, `split at ${cut}`);
    }
    assert.deepEqual(feedAll([...text].map((b) => Uint8Array.of(b))), whole);
    // Empty chunks change nothing, even between a CR and its LF.
    const empty = new Uint8Array();
    assert.deepEqual(brief(feedAll(["data: x\r", empty, "\ndata: y\n", empty, "\n"])), [["message", "x\ny", undefined]]);
  });

  test("the parser keeps its own copy of a partial line", () => {
    const parser = new SseParser();
    const chunk = enc("data: ab");
    assert.deepEqual(parser.feed(chunk), []);
    chunk.fill(0x7a); // the caller reuses its buffer
    assert.equal(parser.feed(enc("c\n\n"))[0]?.data, "abc");
  });

  test("unknown fields are ignored; retry takes digits only", () => {
    const [m] = feedAll(["event: pool\nfoo: bar\nretry: 3000\nretry: soon\nnocolon\ndata: {}\n\n"]);
    assert.deepEqual([m?.event, m?.data, m?.retry], ["pool", "{}", 3000]);
  });

  test("a message without data is not dispatched; one cut short is not either", () => {
    assert.deepEqual(feedAll(["event: ready\n\nid: 5\n\n"]), []);
    const parser = new SseParser();
    assert.deepEqual(parser.feed(enc("event: ready\ndata: {}\n")), []);
    assert.deepEqual(brief(parser.feed(enc("\n"))), [["ready", "{}", undefined]]);
  });

  test("a byte order mark opens the stream; the default event name is message", () => {
    assert.equal(feedAll([Uint8Array.of(0xef, 0xbb), Uint8Array.of(0xbf, ...enc(READY))])[0]?.event, "ready");
    assert.equal(feedAll(["data: x\n\n"])[0]?.event, "message");
  });
});

describe("messages to models", () => {
  test("ready is EventsReady", () => {
    assert.deepEqual(parseEvent({ event: "ready", data: '{"seq": 41}' }), { seq: 41 });
  });

  test("a change is an Event with its object", () => {
    const [m] = feedAll([frame("sandbox.created", CREATED, 42)]);
    const e = parseEvent(m!) as api.Event;
    assert.deepEqual(e, CREATED);
    const branch: api.BranchEvent = {
      source: "sb-1",
      snapshot: "sn-1",
      mode: "diff",
      children: ["sb-2", "sb-3"],
      pause_ms: 5.8,
      total_ms: 912.4,
    };
    const data = JSON.stringify({ seq: 9, at_unix_ms: 1, kind: "branch", id: "sb-1", branch });
    const b = parseEvent({ event: "branch", data }) as api.Event;
    assert.deepEqual(b.branch, branch);
    const pool: api.PoolEvent = { snapshot: "sn-1", size: 2, ready: 1 };
    const p = parseEvent({ event: "pool", data: JSON.stringify({ seq: 10, at_unix_ms: 1, kind: "pool", id: "sn-1", pool }) }) as api.Event;
    assert.deepEqual(p.pool, pool);
    const d = parseEvent({ event: "sandbox.deleted", data: '{"seq":11,"at_unix_ms":1,"kind":"sandbox.deleted","id":"sb-2"}' }) as api.Event;
    assert.deepEqual([d.kind, d.id, d.sandbox], ["sandbox.deleted", "sb-2", undefined]);
  });

  test("reset is an Event of kind reset", () => {
    const e = parseEvent({ event: "reset", data: '{"seq": 17}' }) as api.Event;
    assert.deepEqual([e.kind, e.seq, e.id], ["reset", 17, ""]);
    assert.ok(e.at_unix_ms > 0);
  });

  test("bad data is a ProtocolError", () => {
    for (const m of [
      { event: "sandbox.created", data: "{not json" },
      { event: "sandbox.created", data: '{"seq": 1}' },
      { event: "ready", data: "[]" },
      { event: "reset", data: "null" },
    ]) {
      assert.throws(() => parseEvent(m), ProtocolError, m.data);
    }
  });
});

describe("client.events()", () => {
  test("sends GET /v1/events, with Last-Event-ID when resuming", async () => {
    const transport = new RecordingTransport();
    const client = new Client({ transport });
    await assert.rejects(client.events(), /recorded/);
    await assert.rejects(client.events({ lastEventId: 0 }), /recorded/);
    const [fresh, resumed] = transport.requests;
    assert.deepEqual([fresh?.method, fresh?.path], ["GET", "/v1/events"]);
    assert.equal(fresh?.headers?.accept, "text/event-stream");
    assert.equal(fresh?.headers?.["last-event-id"], undefined);
    assert.equal(resumed?.headers?.["last-event-id"], "0");
    assert.ok(fresh?.signal, "the request can be cut (close())");
    for (const bad of [-1, 1.5, Number.NaN]) await assert.rejects(client.events({ lastEventId: bad }), TypeError);
  });
});
