/**
 * Networking against a real daemon: a published guest port reached from
 * here (a stock `python3 -m http.server` in the guest), `network: "none"`,
 * egress rules, and the errors of bad network options. Also, without a
 * daemon, how the high-level options become request fields.
 */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, InvalidRequestError, NotFoundError, Sandbox, Snapshot, type api } from "forkvm";
import { RecordingTransport, rejectsWith, testClient, VM_TIMEOUT } from "./helpers.js";

const GUEST_PORT = 8000;
const NO_SANDBOX = "sb-000000000000";

let client: Client;
let net: api.NetInfo;
const cleanup: Sandbox[] = [];

before(async () => {
  client = testClient();
  net = (await client.info()).network;
});

after(async () => {
  await Promise.allSettled(cleanup.map((s) => s.close()));
  client.close();
});

/** Skip a test that needs `nat` networks on a host that cannot give them. */
function needsNat(t: TestContext): boolean {
  if (net.available) return true;
  t.skip(`this host cannot give sandboxes a network: ${net.reason ?? "no reason given"}`);
  return false;
}

/**
 * One GET of http://127.0.0.1:<port><path> with node:http: status and body.
 * (Not fetch: its timeout timer does not keep the event loop alive, and
 * node:test gives up on a test whose event loop drains.)
 */
function getOnce(port: number, path: string, timeoutMs: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }));
      res.on("error", reject);
    });
    const timer = setTimeout(() => req.destroy(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs);
    req.on("close", () => clearTimeout(timer));
    req.on("error", reject);
  });
}

/** GET http://127.0.0.1:<port><path>, retrying while the guest's server starts. */
async function httpGet(port: number, path: string, timeoutMs = 30_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const res = await getOnce(port, path, 10_000);
      if (res.status === 200) return res.body;
      last = new Error(`HTTP ${res.status}: ${res.body.slice(0, 200)}`);
    } catch (err) {
      last = err;
    }
    await sleep(250);
  }
  throw new Error(`nothing answered on 127.0.0.1:${port}${path} within ${timeoutMs} ms: ${String(last)}`);
}

/** The host port that reaches `guest`. */
function hostPort(ports: api.PortForward[], guest = GUEST_PORT): number {
  const found = ports.filter((p) => p.guest === guest);
  assert.equal(found.length, 1, JSON.stringify(ports));
  const host = found[0]!.host;
  assert.ok(host && host > 0, JSON.stringify(ports));
  return host;
}

describe("networking", { timeout: VM_TIMEOUT }, () => {
  test("info.network: nat is available here, and the default", (t) => {
    assert.equal(typeof net.available, "boolean");
    assert.ok(net.pool.includes("/"), net.pool);
    if (!needsNat(t)) return;
    assert.equal(net.default_mode, "nat");
    assert.equal(net.reason ?? undefined, undefined);
  });

  test("ports: [{ guest: 8000 }] publishes the guest's http.server on a host loopback port", async (t) => {
    if (!needsNat(t)) return;
    const sb = await Sandbox.create({ client, ports: [{ guest: GUEST_PORT }] });
    cleanup.push(sb);
    const network = sb.network;
    assert.ok(network);
    assert.equal(network.mode, "nat");
    assert.ok(network.guest_ip && network.gateway && network.host_ip && network.uplink_ip);
    const port = hostPort(network.ports);
    assert.deepEqual(await sb.ports(), [{ guest: GUEST_PORT, host: port }]);
    assert.deepEqual(await client.ports(sb.id), [{ guest: GUEST_PORT, host: port }]);
    assert.ok(sb.info.timings?.network_ms != null && sb.info.timings.network_ready_ms != null, JSON.stringify(sb.info.timings));

    await sb.exec(
      `mkdir -p /tmp/www && echo ${sb.id} > /tmp/www/whoami && cd /tmp/www && ` +
        `(setsid python3 -m http.server ${GUEST_PORT} >/dev/null 2>&1 </dev/null &)`,
    );
    assert.equal(await httpGet(port, "/whoami"), `${sb.id}\n`);
    assert.match(await httpGet(port, "/"), /whoami/); // the directory listing
    assert.deepEqual((await sb.refresh()).network?.ports, network.ports);
  });

  test('network: "none": no uplink and no ports', async () => {
    const sb = await Sandbox.create({ client, network: "none" });
    cleanup.push(sb);
    assert.equal(sb.network?.mode, "none");
    assert.deepEqual(sb.network?.ports, []);
    assert.equal(sb.network?.host_ip ?? undefined, undefined);
    assert.deepEqual(await sb.ports(), []);
    assert.equal((await sb.exec("echo still-runs")).stdout, "still-runs\n");
    await sb.close();
  });

  test("Snapshot.spawn with egress rules and waitForNetwork: false", async (t) => {
    if (!needsNat(t)) return;
    const template = (await Snapshot.list({ client })).find((s) => s.info.template && s.info.image === "default");
    assert.ok(template, "the default image has a boot template");
    const [sb] = await template.spawn({
      egress: ["192.0.2.0/24", { cidr: "198.51.100.7", ports: [443, 8443] }],
      waitForNetwork: false,
    });
    assert.ok(sb);
    cleanup.push(sb);
    assert.equal(sb.network?.mode, "nat");
    assert.deepEqual(sb.network?.egress, [{ cidr: "192.0.2.0/24" }, { cidr: "198.51.100.7", ports: [443, 8443] }]);
    assert.deepEqual(await sb.ports(), []);
    assert.ok(sb.info.timings?.network_ms != null);
    assert.equal(sb.info.timings?.network_ready_ms ?? undefined, undefined, "not waited for");
    await sb.close();
  });

  test("bad network options are refused with an InvalidRequestError and create nothing", async (t) => {
    if (!needsNat(t)) return;
    const before = (await client.listSandboxes()).sandboxes.length;
    const invalid = { class: InvalidRequestError, status: 400, code: "invalid_request" };
    await rejectsWith(Sandbox.create({ client, egress: ["10.0.0.1/24"] }), { ...invalid, message: /host bits/ });
    await rejectsWith(client.createSandbox({ egress: [{ cidr: "10.0.0.1/24" }] }), { ...invalid, message: /host bits/ });
    await rejectsWith(client.createSandbox({ egress: [{ cidr: "not-an-address" }] }), { ...invalid, message: /IPv4/ });
    await rejectsWith(Sandbox.create({ client, allowHost: true }), { ...invalid, message: /allow_host/ });
    await rejectsWith(Sandbox.create({ client, network: "none", ports: [GUEST_PORT] }), {
      ...invalid,
      message: /need network: nat/,
    });
    await rejectsWith(Sandbox.create({ client, ports: [0] }), { ...invalid, message: /guest port 0/ });
    await rejectsWith(client.createSandbox({ ports: [{ guest: GUEST_PORT }, { guest: GUEST_PORT }] }), {
      ...invalid,
      message: /listed twice/,
    });
    await rejectsWith(client.createSandbox({ network: "bridged" as api.NetworkMode }), invalid);
    assert.equal((await client.listSandboxes()).sandboxes.length, before);
    await rejectsWith(client.ports(NO_SANDBOX), { class: NotFoundError, status: 404, code: "not_found" });
  });
});

describe("network options as request fields (no daemon)", () => {
  const info = (id: string): api.Sandbox => ({
    id,
    state: "running",
    image: "default",
    memory_mib: 512,
    cpus: 1,
    accel: "tcg",
    created_at: "2026-01-01T00:00:00Z",
  });

  test("Sandbox.create, Sandbox.branch and Snapshot.spawn", async () => {
    const transport = new RecordingTransport();
    const offline = new Client({ transport });
    await assert.rejects(
      Sandbox.create({
        client: offline,
        network: "nat",
        ports: [8000, { guest: 8001, host: 18001 }],
        egress: ["10.0.0.0/8", { cidr: "1.2.3.4", ports: [443] }],
        waitForNetwork: false,
      }),
      /recorded/,
    );
    assert.deepEqual(transport.lastBody(), {
      network: "nat",
      ports: [{ guest: 8000 }, { guest: 8001, host: 18001 }],
      egress: [{ cidr: "10.0.0.0/8" }, { cidr: "1.2.3.4", ports: [443] }],
      wait_for_network: false,
    });
    await assert.rejects(Sandbox.create({ client: offline }), /recorded/);
    assert.deepEqual(transport.lastBody(), {}, "unset options are left out");

    const sb = new Sandbox(offline, info("sb-1"));
    await assert.rejects(sb.branch({ count: 2, ports: [8000], waitForNetwork: true }), /recorded/);
    assert.deepEqual(transport.lastBody(), { count: 2, ports: [{ guest: 8000 }], wait_for_network: true });
    await assert.rejects(sb.ports(), /recorded/);
    assert.equal(transport.requests.at(-1)?.path, "/v1/sandboxes/sb-1/ports");

    const snap = new Snapshot(offline, { id: "sn-1" } as api.Snapshot);
    await assert.rejects(snap.spawn({ count: 3, network: "none" }), /recorded/);
    assert.deepEqual(transport.lastBody(), { snapshot: "sn-1", count: 3, network: "none" });
  });

  test("ports and egress must be arrays", async () => {
    const offline = new Client({ transport: new RecordingTransport() });
    await assert.rejects(Sandbox.create({ client: offline, ports: 8000 as unknown as number[] }), TypeError);
    await assert.rejects(Sandbox.create({ client: offline, egress: "10.0.0.0/8" as unknown as string[] }), TypeError);
  });
});
