/**
 * Resources without a daemon: limits, usage and capacity as the SDK reads
 * and sends them, `capacity_exceeded` as its own error class, and metrics()
 * as text (a transport that answers from a table here).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  CapacityExceededError,
  Client,
  ForkvmError,
  NoSpaceError,
  Sandbox,
  ServerError,
  type api,
  type Transport,
  type TransportRequest,
  type TransportResponse,
} from "forkvm";

const RUNNING: api.Sandbox = {
  id: "sb-1",
  state: "running",
  image: "default",
  memory_mib: 512,
  cpus: 1,
  accel: "tcg",
  created_at: "2026-11-25T09:00:00Z",
  limits: { disk_iops: 100, net_kbps: 10000 },
  usage: { cpu_ms: 1234, disk_bytes: 1 << 20, net_rx_bytes: 10, net_tx_bytes: 20 },
};

const METRICS = "# TYPE forkvm_spawns_total counter\nforkvm_spawns_total{result=\"ok\"} 3\n";

/** Answers each request with `reply(req)` and records it. */
class TableTransport implements Transport {
  readonly url = "table://";
  requests: TransportRequest[] = [];
  constructor(readonly reply: (req: TransportRequest) => { status: number; body: string; type?: string }) {}
  async request(req: TransportRequest): Promise<TransportResponse> {
    this.requests.push(req);
    const { status, body, type } = this.reply(req);
    const bytes = new TextEncoder().encode(body);
    return {
      status,
      header: (name) => (name.toLowerCase() === "content-type" ? (type ?? "application/json") : null),
      body: async function* () {
        yield bytes;
      },
      bytes: async () => bytes,
      cancel: () => {},
    };
  }
  close(): void {}
  bodies(): unknown[] {
    return this.requests.map((r) => (r.body === undefined ? undefined : JSON.parse(String(r.body))));
  }
}

function daemon(): TableTransport {
  return new TableTransport((req) => {
    if (req.path === "/metrics") return { status: 200, body: METRICS, type: "text/plain; version=0.0.4" };
    if (req.path.endsWith("/branch")) {
      return { status: 503, body: JSON.stringify({ error: { code: "capacity_exceeded", message: "no room" } }) };
    }
    return { status: 200, body: JSON.stringify(RUNNING) };
  });
}

describe("resources without a daemon", () => {
  test("a sandbox's limits and usage, and their getters", () => {
    const sb = new Sandbox(new Client({ transport: daemon() }), RUNNING);
    assert.deepEqual(sb.limits, { disk_iops: 100, net_kbps: 10000 });
    assert.equal(sb.usage?.cpu_ms, 1234);
    assert.equal(sb.usage?.net_tx_bytes, 20);
    const bare = new Sandbox(sb.client, { ...RUNNING, limits: undefined, usage: null });
    assert.equal(bare.limits, undefined);
    assert.equal(bare.usage, undefined);
  });

  test("limits travel in create, branch and spawn; metrics() is text", async () => {
    const transport = daemon();
    const client = new Client({ transport });
    assert.equal(await client.metrics(), METRICS);
    assert.equal(transport.requests[0]?.headers?.accept, "text/plain");
    const sb = await Sandbox.create({ client, limits: { disk_iops: 100, net_kbps: 10000 } });
    assert.deepEqual(sb.limits, RUNNING.limits);
    const err = await sb.branch({ count: 2, limits: { disk_iops: 50 } }).catch((e: unknown) => e);
    assert.ok(err instanceof CapacityExceededError, String(err));
    assert.ok(err instanceof ServerError);
    assert.equal(err.status, 503);
    assert.equal(err.code, "capacity_exceeded");
    assert.equal(err.message, "no room");
    assert.deepEqual(transport.bodies().slice(1), [
      { limits: { disk_iops: 100, net_kbps: 10000 } },
      { count: 2, limits: { disk_iops: 50 } },
    ]);
    await Sandbox.create({ client }).catch(() => {});
    assert.deepEqual(transport.bodies().at(-1), {}, "no limits: none sent");
  });

  test("capacity_exceeded is a 503 ServerError of its own", () => {
    const err = ForkvmError.fromResponse(503, "capacity_exceeded", "m");
    assert.equal(err.name, "CapacityExceededError");
    assert.ok(err instanceof CapacityExceededError && err instanceof ServerError);
    assert.equal(ForkvmError.statusOf("capacity_exceeded"), 503);
    assert.equal(ForkvmError.fromResponse(507, "no_space", "m").constructor, NoSpaceError);
    assert.equal(ForkvmError.fromResponse(503, "some_new_code", "m").name, "ServerError");
  });
});
