/**
 * Snapshot push and pull without a daemon: the NDJSON progress stream (every
 * kind of TransferEvent), the error classes of its codes, and what the Client
 * and the Snapshot object send and read, over real HTTP to a small server on
 * a loopback port that answers canned responses.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import {
  Client,
  ConflictError,
  ForkvmError,
  IncompatibleSnapshotError,
  InvalidImageError,
  NotFoundError,
  parseTransferEvent,
  ProtocolError,
  readTransferEvents,
  RegistryAuthFailedError,
  RegistryUnreachableError,
  Snapshot,
  UnprocessableError,
  type api,
  type TransferEvent,
} from "forkvm";

const SNAPSHOT: api.Snapshot = {
  id: "sn-25d84cc44af8",
  tag: "warm",
  parent: "sn-9bfc2260fb64",
  source: "sb-cfb6b07f3c9e",
  image: "default",
  memory_mib: 512,
  cpus: 1,
  created_at: "2026-11-26T15:46:00.528Z",
  kind: "diff",
  depth: 1,
  state: "ready",
  template: false,
  qemu_version: "QEMU emulator version 10.0.2",
  sizes: { memory_bytes: 0, memory_allocated_bytes: 0, device_state_bytes: 17156, disk_bytes: 196640 },
  pool_size: 0,
  pool_default: true,
  sandboxes: [],
  children: [],
  origin: "snapshot",
  pinned: false,
};

const PUSH_RESULT: api.PushResult = {
  reference: "127.0.0.1:5000/team/warm:v1",
  digest: `sha256:${"0e".repeat(32)}`,
  snapshot: "sn-25d84cc44af8",
  links: 2,
  links_skipped: 0,
  image_sent: true,
  blobs_sent: 103,
  bytes_sent: 93120408,
  blobs_skipped: 0,
  bytes_skipped: 0,
  manifests_sent: 4,
  total_ms: 16330,
};

const PULL_RESULT: api.PullResult = {
  snapshot: SNAPSHOT,
  digest: `sha256:${"0e".repeat(32)}`,
  links: 2,
  links_cached: 1,
  image: "default",
  image_created: false,
  blobs_fetched: 3,
  bytes_fetched: 4894720,
  total_ms: 5012,
};

const PROGRESS: TransferEvent[] = [
  { type: "phase", phase: "pushing to 127.0.0.1:5000/team/warm:v1" },
  { type: "progress", item: "chunking sn-25d84cc44af8/memory.diff", done: 4194304, total: 5132288 },
  { type: "progress", item: "uploading", done: 10 },
  { type: "cached", item: "image default" },
  { type: "log", line: "hello" },
];

const ndjson = (...events: object[]): string => events.map((e) => `${JSON.stringify(e)}\n`).join("");

async function* linesOf(...events: object[]): AsyncGenerator<string> {
  for (const e of events) yield JSON.stringify(e);
}

describe("every kind of transfer event", () => {
  test("phase, progress (with and without a total), cached and log are passed on", async () => {
    const seen: TransferEvent[] = [];
    const result = await readTransferEvents("push", linesOf(...PROGRESS, { type: "pushed", result: PUSH_RESULT }), 200, async (e) => {
      await new Promise((resolve) => setTimeout(resolve, 1)); // awaited before the next
      seen.push(e);
    });
    assert.deepEqual(result, PUSH_RESULT);
    assert.deepEqual(seen.slice(0, -1), PROGRESS);
    const [phase, progress, partial, cached, log] = seen;
    assert.ok(phase?.type === "phase" && phase.phase.startsWith("pushing"));
    assert.ok(progress?.type === "progress" && progress.done === 4194304 && progress.total === 5132288);
    assert.ok(partial?.type === "progress" && partial.total === undefined);
    assert.ok(cached?.type === "cached" && cached.item === "image default");
    assert.ok(log?.type === "log" && log.line === "hello");
  });

  test("pushed ends a push with its PushResult", async () => {
    const event = parseTransferEvent(JSON.stringify({ type: "pushed", result: PUSH_RESULT }), 200);
    assert.ok(event.type === "pushed" && event.result.blobs_sent === 103);
    assert.deepEqual(await readTransferEvents("push", linesOf(event), 200), PUSH_RESULT);
  });

  test("pulled ends a pull with its PullResult and snapshot", async () => {
    const result = await readTransferEvents("pull", linesOf({ type: "phase", phase: "resolving" }, { type: "pulled", result: PULL_RESULT }), 200);
    assert.equal(result.snapshot.id, "sn-25d84cc44af8");
    assert.equal(result.links_cached, 1);
  });

  const errors: [string, new (...args: never[]) => ForkvmError, number][] = [
    ["image_not_found", NotFoundError, 404],
    ["conflict", ConflictError, 409],
    ["incompatible_snapshot", IncompatibleSnapshotError, 422],
    ["invalid_image", InvalidImageError, 422],
    ["registry_auth_failed", RegistryAuthFailedError, 403],
    ["registry_unreachable", RegistryUnreachableError, 502],
  ];
  for (const [code, cls, status] of errors) {
    test(`an error line with ${code} is a ${cls.name} (${status}), after the callback saw it`, async () => {
      for (const what of ["push", "pull"] as const) {
        const seen: string[] = [];
        const error = { type: "error", error: { code, message: "it broke" } };
        await assert.rejects(
          readTransferEvents(what, linesOf(PROGRESS[0]!, error), 200, (e) => {
            seen.push(e.type);
          }),
          (err: unknown) => err instanceof cls && err.code === code && err.status === status && err.message === "it broke",
        );
        assert.deepEqual(seen, ["phase", "error"]);
      }
    });
  }

  test("an unknown code keeps the response's status", async () => {
    const error = { type: "error", error: { code: "something_new", message: "m" } };
    await assert.rejects(readTransferEvents("pull", linesOf(error), 200), (err: unknown) => {
      return err instanceof ForkvmError && err.constructor === ForkvmError && err.status === 200;
    });
  });

  test("unknown event types are passed on; bad lines, missing or foreign results are ProtocolErrors", async () => {
    const seen: string[] = [];
    await readTransferEvents("push", linesOf({ type: "warp", speed: 9 }, { type: "pushed", result: PUSH_RESULT }), 200, (e) => {
      seen.push(e.type);
    });
    assert.deepEqual(seen, ["warp", "pushed"]);
    for (const line of ["{not json", "[1]", '"pushed"', '{"phase":"x"}', '{"type":3}', "null"]) {
      assert.throws(() => parseTransferEvent(line, 200), ProtocolError, line);
    }
    await assert.rejects(readTransferEvents("push", linesOf({ type: "pushed" }), 200), /without its result/);
    await assert.rejects(readTransferEvents("push", linesOf({ type: "pulled", result: PULL_RESULT }), 200), /progress stream of a push/);
    await assert.rejects(readTransferEvents("pull", linesOf({ type: "pushed", result: PUSH_RESULT }), 200), /progress stream of a pull/);
  });

  test("a stream that ends early is a ProtocolError", async () => {
    await assert.rejects(readTransferEvents("push", linesOf(...PROGRESS), 200), /push progress stream ended before its result/);
    await assert.rejects(readTransferEvents("pull", linesOf(), 200), ProtocolError);
  });

  test("incompatible_snapshot is its own 422 class", () => {
    const err = ForkvmError.fromResponse(422, "incompatible_snapshot", "m");
    assert.ok(err instanceof IncompatibleSnapshotError && err instanceof UnprocessableError);
    assert.equal(ForkvmError.statusOf("incompatible_snapshot"), 422);
  });
});

// ---------------------------------------------------------------------------
// The Client and Snapshot over HTTP, to a loopback server of canned answers.

interface Recorded {
  method: string;
  path: string;
  accept: string;
  body: unknown;
}

let server: Server;
let client: Client;
let reply: { status: number; contentType: string; body: string } = { status: 200, contentType: "application/x-ndjson", body: "" };
const recorded: Recorded[] = [];

function stream(...events: object[]): void {
  reply = { status: 200, contentType: "application/x-ndjson", body: ndjson(...events) };
}

before(async () => {
  server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (chunk: Buffer) => parts.push(chunk));
    req.on("end", () => {
      const text = Buffer.concat(parts).toString();
      recorded.push({ method: req.method ?? "", path: req.url ?? "", accept: String(req.headers.accept), body: text ? JSON.parse(text) : undefined });
      res.writeHead(reply.status, { "content-type": reply.contentType });
      // In two writes, splitting a line, as a network may.
      res.write(reply.body.slice(0, 9));
      res.end(reply.body.slice(9));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  client = new Client({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
});

after(async () => {
  client.close();
  await new Promise((resolve) => server.close(resolve));
});

describe("Client.pushSnapshot and Client.pullSnapshot", () => {
  test("a push sends its fields with stream, streams every event to onEvent and returns the result", async () => {
    recorded.length = 0;
    stream(...PROGRESS, { type: "pushed", result: PUSH_RESULT });
    const seen: string[] = [];
    const result = await client.pushSnapshot(
      "sn a/b",
      { reference: "127.0.0.1:5000/team/warm:v1", username: "u", password: "p", insecure: true },
      { onEvent: (e) => void seen.push(e.type) },
    );
    assert.deepEqual(result, PUSH_RESULT);
    assert.deepEqual(seen, ["phase", "progress", "progress", "cached", "log", "pushed"]);
    assert.deepEqual(recorded, [
      {
        method: "POST",
        path: "/v1/snapshots/sn%20a%2Fb/push",
        accept: "application/x-ndjson",
        body: { reference: "127.0.0.1:5000/team/warm:v1", username: "u", password: "p", insecure: true, stream: true },
      },
    ]);
  });

  test("a pull sends only what is given and returns the result", async () => {
    recorded.length = 0;
    stream({ type: "phase", phase: "resolving" }, { type: "pulled", result: PULL_RESULT });
    const result = await client.pullSnapshot({ reference: "127.0.0.1:5000/team/warm:v1", tag: "warm" });
    assert.equal(result.snapshot.tag, "warm");
    assert.deepEqual(recorded.map((r) => [r.path, r.body]), [["/v1/snapshots/pull", { reference: "127.0.0.1:5000/team/warm:v1", tag: "warm", stream: true }]]);
  });

  test("an error line rejects with its class; an HTTP error before the stream with its status", async () => {
    stream({ type: "phase", phase: "resolving" }, { type: "error", error: { code: "image_not_found", message: "no tag nope" } });
    await assert.rejects(client.pullSnapshot({ reference: "r:nope" }), (err: unknown) => {
      return err instanceof NotFoundError && err.code === "image_not_found" && err.status === 404;
    });
    reply = { status: 409, contentType: "application/json", body: JSON.stringify({ error: { code: "conflict", message: 'tag "warm" is already used' } }) };
    await assert.rejects(client.pullSnapshot({ reference: "r", tag: "warm" }), (err: unknown) => {
      return err instanceof ConflictError && err.status === 409 && /already used/.test(err.message);
    });
  });

  test("a stream that ends early rejects; an unstreamed answer is the result", async () => {
    stream(...PROGRESS);
    await assert.rejects(client.pushSnapshot("s", { reference: "r" }), /push progress stream ended/);
    reply = { status: 201, contentType: "application/json", body: JSON.stringify(PULL_RESULT) };
    assert.deepEqual(await client.pullSnapshot({ reference: "r" }), PULL_RESULT);
  });
});

describe("Snapshot.push and Snapshot.pull", () => {
  test("push the snapshot by id; pull returns a Snapshot", async () => {
    recorded.length = 0;
    const snap = new Snapshot(client, SNAPSHOT);
    stream({ type: "pushed", result: PUSH_RESULT });
    assert.equal((await snap.push("127.0.0.1:5000/team/warm:v1", { insecure: true })).snapshot, snap.id);
    stream({ type: "pulled", result: PULL_RESULT });
    const seen: string[] = [];
    const pulled = await Snapshot.pull("127.0.0.1:5000/team/warm:v1", { tag: "warm", client, onEvent: (e) => void seen.push(e.type) });
    assert.ok(pulled instanceof Snapshot);
    assert.equal(pulled.id, "sn-25d84cc44af8");
    assert.equal(pulled.tag, "warm");
    assert.deepEqual(seen, ["pulled"]);
    assert.deepEqual(recorded.map((r) => [r.path, r.body]), [
      ["/v1/snapshots/sn-25d84cc44af8/push", { reference: "127.0.0.1:5000/team/warm:v1", insecure: true, stream: true }],
      ["/v1/snapshots/pull", { reference: "127.0.0.1:5000/team/warm:v1", tag: "warm", stream: true }],
    ]);
  });
});
