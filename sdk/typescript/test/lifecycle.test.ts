/**
 * Lifetimes against a real daemon: metadata, env, timeouts, pause and
 * resume. One sandbox of the file's own serves most tests; the expiry test
 * spawns another from the boot template.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, ConflictError, InvalidRequestError, MAX_TIMEOUT_S, NotFoundError, Sandbox } from "forkvm";
import { eventually, RecordingTransport, rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

const COUNTER = `
import os, time
n = 0
while True:
    n += 1
    with open('/tmp/counter.tmp', 'w') as f:
        f.write(str(n))
    os.rename('/tmp/counter.tmp', '/tmp/counter')
    time.sleep(0.1)
`;

let client: Client;
let sb: Sandbox;
const suite = uniqueTag("ts-life");

before(async () => {
  client = testClient();
  sb = await Sandbox.create({
    client,
    metadata: { suite, role: "labelled" },
    env: { GREETING: "hello", SHARED: "from-spawn" },
    timeout: 600,
  });
});

after(async () => {
  await sb?.close();
  client.close();
});

describe("lifetimes", { timeout: VM_TIMEOUT }, () => {
  test("create() with metadata, env and a timeout", () => {
    assert.deepEqual(sb.metadata, { suite, role: "labelled" });
    assert.deepEqual(sb.info.env, { GREETING: "hello", SHARED: "from-spawn" });
    const lifetime = sb.lifetime;
    assert.ok(lifetime);
    assert.equal(lifetime.timeout, 600);
    assert.equal(lifetime.on_timeout, "kill");
    assert.ok(lifetime.remaining_s > 0 && lifetime.remaining_s <= 600 && lifetime.expires_at);
    assert.equal(sb.info.paused ?? undefined, undefined);
  });

  test("list() filters by metadata", async () => {
    assert.deepEqual((await client.listSandboxes({ metadata: { suite } })).sandboxes.map((s) => s.id), [sb.id]);
    const both = await Sandbox.list({ client, metadata: { suite, role: "labelled" } });
    assert.deepEqual(both.map((s) => s.id), [sb.id]);
    assert.deepEqual((await client.listSandboxes({ metadata: { suite, role: "other" } })).sandboxes, []);
  });

  test("execs start with the spawn's env; an exec's own env wins", async () => {
    assert.equal((await sb.exec('echo "$GREETING $SHARED"')).stdout, "hello from-spawn\n");
    assert.equal((await sb.exec('echo "$GREETING $SHARED"', { env: { SHARED: "mine" } })).stdout, "hello mine\n");
  });

  test("setTimeout() sets and clears the timeout", async () => {
    await sb.setTimeout(300, { onTimeout: "pause" });
    assert.equal(sb.lifetime?.timeout, 300);
    assert.equal(sb.lifetime?.on_timeout, "pause");
    const cleared = (await sb.setTimeout(null)).lifetime;
    assert.equal(cleared, undefined);
    assert.equal((await sb.refresh()).lifetime ?? undefined, undefined);
    await sb.setTimeout(600);
    assert.equal(sb.lifetime?.on_timeout, "pause"); // kept from before
  });

  test("bad lifetimes are InvalidRequestErrors (400)", async () => {
    await rejectsWith(Sandbox.create({ client, timeout: 0 }), { class: InvalidRequestError, status: 400, message: /timeout/ });
    await rejectsWith(client.createSandbox({ on_timeout: "pause" }), { class: InvalidRequestError, status: 400 });
    await rejectsWith(sb.setTimeout(0), { class: InvalidRequestError, status: 400 });
    await rejectsWith(sb.setTimeout(MAX_TIMEOUT_S + 1), { class: InvalidRequestError, status: 400 });
    await rejectsWith(sb.resume(), { class: ConflictError, status: 409 }); // running, not paused
    await rejectsWith(client.pause("sb-000000000000"), { class: NotFoundError, status: 404 });
  });

  test("pause() and resume() keep a running process: same pid, its counter goes on", async () => {
    await sb.files.write("/root/counter.py", COUNTER);
    const started = await sb.exec("setsid nohup python3 /root/counter.py >/dev/null 2>&1 </dev/null & echo $!");
    const pid = started.stdout.trim();
    assert.match(pid, /^\d+$/);
    const counter = async (): Promise<number> => Number((await sb.exec("cat /tmp/counter 2>/dev/null || echo 0")).stdout.trim() || 0);
    const before = await eventually(counter, (n) => n >= 3, 30_000);
    assert.ok(before >= 3);

    await sb.pause();
    assert.equal(sb.state, "paused");
    const paused = sb.info.paused;
    assert.ok(paused);
    assert.equal(paused.reason, "request");
    assert.ok(paused.memory_bytes > 0 && paused.pause_ms >= 0 && paused.snapshot);
    assert.equal(sb.lifetime?.expires_at ?? undefined, undefined); // frozen while paused
    await rejectsWith(sb.pause(), { class: ConflictError, status: 409 });

    await sb.resume({ timeout: 900 });
    assert.equal(sb.state, "running");
    assert.equal(sb.lifetime?.timeout, 900);
    const cmdline = await sb.exec(`kill -0 ${pid} && tr '\\0' ' ' < /proc/${pid}/cmdline`);
    assert.match(cmdline.stdout, /^python3 /);
    const afterResume = await counter();
    assert.ok(afterResume >= before, `counter ${afterResume} after resume, ${before} before pause`);
    const later = await eventually(counter, (n) => n > afterResume, 30_000);
    assert.ok(later > afterResume, "the counter goes on after resume");
  });

  test("pause({ memory: false }) keeps the disk only; resume() cold-boots from it", async () => {
    const fs = await Sandbox.create({ client, metadata: { suite, role: "fs-pause" }, timeout: 600 });
    try {
      await fs.exec("echo kept > /root/kept.txt; echo lost > /tmp/lost.txt");
      const bootId = (await fs.exec("cat /proc/sys/kernel/random/boot_id")).stdout;
      await fs.pause({ memory: false });
      assert.equal(fs.state, "paused");
      assert.equal(fs.info.paused?.memory, false);
      assert.equal(fs.info.paused?.snapshot ?? undefined, undefined);
      await fs.resume();
      assert.equal(fs.state, "running");
      assert.equal((await fs.exec("cat /root/kept.txt")).stdout, "kept\n");
      assert.notEqual((await fs.exec("cat /tmp/lost.txt")).exitCode, 0);
      assert.notEqual((await fs.exec("cat /proc/sys/kernel/random/boot_id")).stdout, bootId);
      assert.equal(fs.info.metadata?.role, "fs-pause");
    } finally {
      await fs.close();
    }
  });

  test("a sandbox is removed when its timeout runs out", async () => {
    const doomed = await Sandbox.create({ client, timeout: 3 });
    try {
      assert.equal(doomed.lifetime?.timeout, 3);
      const gone = await eventually(
        () => doomed.refresh().then(() => false, (err: unknown) => err instanceof NotFoundError),
        (g) => g,
        60_000,
      );
      assert.ok(gone, `${doomed.id} still exists 60 s after a 3 s timeout`);
    } finally {
      await doomed.close();
    }
  });
});

describe("resources", { timeout: VM_TIMEOUT }, () => {
  test("create() with limits: kept on get; a branch overrides them field by field", async () => {
    await using limited = await Sandbox.create({ client, limits: { disk_iops: 100, net_kbps: 10000 } });
    assert.deepEqual(limited.limits, { disk_iops: 100, net_kbps: 10000 });
    assert.deepEqual((await client.getSandbox(limited.id)).limits, { disk_iops: 100, net_kbps: 10000 });
    assert.equal((await limited.exec("echo ok")).stdout, "ok\n"); // throttled, not stopped
    const branch = await limited.branch({ limits: { disk_iops: 50 } });
    try {
      assert.equal(branch.children.length, 1);
      const child = branch.children[0]!;
      await child.refresh();
      assert.deepEqual(child.limits, { disk_iops: 50, net_kbps: 10000 });
    } finally {
      await Promise.all(branch.children.map((c) => c.close()));
    }
  });

  test("a running sandbox shows its usage", async () => {
    await sb.exec("true");
    await sb.refresh();
    const usage = sb.usage;
    assert.ok(usage, "usage on GET of a running sandbox");
    assert.ok(usage.cpu_ms > 0, `cpu_ms ${usage.cpu_ms}`);
    assert.ok(usage.disk_bytes >= 0);
  });

  test("info() shows capacity; metrics() the Prometheus text", async () => {
    const capacity = (await client.info()).capacity;
    assert.ok(capacity, "capacity in /v1/info");
    assert.ok(capacity.memory_commit_mib > 0);
    assert.ok(capacity.memory_left_mib <= capacity.memory_commit_mib);
    const text = await client.metrics();
    assert.match(text, /forkvm_spawns_total/);
    assert.match(text, /# TYPE /);
  });
});

describe("lifetime requests", () => {
  test("setTimeout(null) sends null; resume() sends {}; the metadata filter is metadata.KEY", async () => {
    const transport = new RecordingTransport();
    const c = new Client({ transport });
    const s = new Sandbox(c, {
      id: "sb-x",
      state: "running",
      image: "default",
      memory_mib: 512,
      cpus: 1,
      accel: "tcg",
      created_at: "2026-11-25T09:00:00Z",
    });
    await assert.rejects(s.setTimeout(null), /recorded/);
    assert.deepEqual(transport.lastBody(), { timeout: null });
    await assert.rejects(s.setTimeout(5, { onTimeout: "pause" }), /recorded/);
    assert.deepEqual(transport.lastBody(), { timeout: 5, on_timeout: "pause" });
    await assert.rejects(s.resume(), /recorded/);
    assert.deepEqual(transport.lastBody(), {});
    await assert.rejects(s.pause(), /recorded/);
    assert.equal(transport.requests.at(-1)?.path, "/v1/sandboxes/sb-x/pause");
    await assert.rejects(Sandbox.list({ client: c, metadata: { team: "a", run: "7" } }), /recorded/);
    assert.deepEqual(transport.requests.at(-1)?.query, { "metadata.team": "a", "metadata.run": "7" });
    await assert.rejects(Sandbox.create({ client: c, metadata: { a: "b" }, env: { E: "1" }, timeout: 9, onTimeout: "pause" }), /recorded/);
    assert.deepEqual(transport.lastBody(), { metadata: { a: "b" }, env: { E: "1" }, timeout: 9, on_timeout: "pause" });
  });
});
