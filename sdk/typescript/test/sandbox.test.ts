/**
 * The high-level API (Sandbox, Snapshot) against a real daemon.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  ConflictError,
  NotFoundError,
  Sandbox,
  setDefaultClient,
  Snapshot,
  type Client,
} from "forkvm";
import { eventually, rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

let client: Client;
let sb: Sandbox;
const cleanup: (Sandbox | Snapshot)[] = [];

before(async () => {
  client = testClient();
  sb = await Sandbox.create({ client });
  cleanup.push(sb);
});

after(async () => {
  // Sandboxes first, then snapshots newest first (children before parents).
  await Promise.allSettled(cleanup.filter((x) => x instanceof Sandbox).map((s) => s.close()));
  for (const s of cleanup.filter((x) => x instanceof Snapshot).reverse()) await s.delete({ force: true }).catch(() => {});
  client.close();
});

describe("Sandbox", { timeout: VM_TIMEOUT }, () => {
  test("create() with no options: the default image, running", () => {
    assert.match(sb.id, /^sb-/);
    assert.equal(sb.state, "running");
    assert.equal(sb.info.image, "default");
    assert.equal(sb.info.memory_mib, 512);
  });

  test("create() uses the default client (FORKVM_URL, FORKVM_HOME) when given none", async () => {
    setDefaultClient(undefined);
    const other = await Sandbox.create({ memoryMib: 512, cpus: 1, image: "default" });
    cleanup.push(other);
    assert.equal(other.client.url, client.url);
    assert.equal((await other.exec("echo ok")).stdout, "ok\n");
    await other.close();
  });

  test("create() with bad options throws a typed error", async () => {
    await rejectsWith(Sandbox.create({ client, image: "no-such-image" }), { class: NotFoundError, status: 404, code: "image_not_found" });
    await rejectsWith(Sandbox.create({ client, memoryMib: 1 }), { status: 400, code: "invalid_request" });
  });

  test("exec(string) runs a shell line: stdout, stderr, exit code, duration", async () => {
    const res = await sb.exec("echo out; echo err >&2; exit 7");
    assert.equal(res.stdout, "out\n");
    assert.equal(res.stderr, "err\n");
    assert.equal(res.exitCode, 7);
    assert.equal(res.timedOut, false);
    assert.ok(res.durationMs >= 0);
  });

  test("exec(argv) with stdin, env, cwd", async () => {
    const res = await sb.exec(["python3", "-c", "import os,sys; print(sys.stdin.read()[::-1], os.environ['K'], os.getcwd())"], {
      stdin: "abc",
      env: { K: "v" },
      cwd: "/tmp",
    });
    assert.equal(res.stdout, "cba v /tmp\n");
    assert.equal(res.exitCode, 0);
  });

  test("exec with bytes: stdin as Uint8Array, binary output", async () => {
    const bytes = new Uint8Array([0, 255, 10, 128, 7]);
    const res = await sb.exec(["cat"], { stdin: bytes, binary: true });
    assert.ok(res.stdout instanceof Uint8Array);
    assert.deepEqual([...res.stdout], [...bytes]);
  });

  test("exec with timeoutMs and maxOutputBytes", async () => {
    const slow = await sb.exec("sleep 30", { timeoutMs: 300 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.exitCode, null);
    const big = await sb.exec("head -c 5000 /dev/zero | tr '\\0' x", { maxOutputBytes: 10 });
    assert.equal(big.stdout, "x".repeat(10));
    assert.equal(big.stdoutBytes, 5000);
    assert.equal(big.stdoutTruncated, true);
  });

  test("exec of an unknown program is a NotFoundError", async () => {
    await rejectsWith(sb.exec(["no-such-program"]), { class: NotFoundError, status: 404 });
  });

  test("files.write and files.read, with a mode", async () => {
    await sb.files.write("/tmp/run.sh", "#!/bin/sh\necho from-script\n", { mode: 0o755 });
    assert.equal((await sb.exec("/tmp/run.sh")).stdout, "from-script\n");
    const bytes = new Uint8Array(256).map((_, i) => i);
    const written = await sb.files.write("/tmp/bytes", bytes);
    assert.equal(written.size, 256);
    assert.deepEqual([...(await sb.files.read("/tmp/bytes"))], [...bytes]);
    assert.equal(await sb.files.readText("/tmp/run.sh"), "#!/bin/sh\necho from-script\n");
    await rejectsWith(sb.files.read("/tmp/nope"), { class: NotFoundError, status: 404 });
  });

  test("logs() returns the serial console", async () => {
    await sb.exec("echo sdk-console-marker > /dev/console");
    const logs = await eventually(() => sb.logs(), (text) => text.includes("sdk-console-marker"));
    assert.match(logs, /sdk-console-marker/);
  });

  test("refresh(), get() and list()", async () => {
    const info = await sb.refresh();
    assert.ok(info.memory && info.memory.rss_kib > 0);
    const again = await Sandbox.get(sb.id, { client });
    assert.equal(again.id, sb.id);
    assert.ok((await Sandbox.list({ client })).some((s) => s.id === sb.id));
    await rejectsWith(Sandbox.get("sb-000000000000", { client }), { class: NotFoundError, status: 404 });
  });

  test("close() is idempotent and ignores a sandbox already gone", async () => {
    const doomed = await Sandbox.create({ client });
    await doomed.close();
    await doomed.close();
    assert.equal(doomed.closed, true);
    await rejectsWith(Sandbox.get(doomed.id, { client }), { status: 404 });
    // Removed behind its back: close() still succeeds.
    const other = await Sandbox.create({ client });
    await client.deleteSandbox(other.id);
    await other.close();
  });

  test("await using closes the sandbox at the end of the block", async () => {
    let id: string;
    {
      await using scoped = await Sandbox.create({ client });
      id = scoped.id;
      assert.equal((await scoped.exec("echo scoped")).stdout, "scoped\n");
    }
    await rejectsWith(Sandbox.get(id, { client }), { status: 404 });
  });
});

describe("branch, snapshot, spawn", { timeout: VM_TIMEOUT }, () => {
  test("branch(): children continue from the branch point, isolated from each other", async () => {
    await sb.exec("echo 1 > /tmp/counter");
    const branch = await sb.branch({ count: 2 });
    cleanup.push(branch.snapshot, ...branch.children);
    assert.equal(branch.mode, "live");
    assert.equal(branch.children.length, 2);
    assert.ok(branch.pauseMs >= 0 && branch.totalMs >= branch.pauseMs);
    assert.ok(branch.snapshot instanceof Snapshot);
    const [a, b] = branch.children as [Sandbox, Sandbox];
    await a.exec("echo a >> /tmp/counter");
    await b.exec("echo b >> /tmp/counter");
    await sb.exec("echo source >> /tmp/counter");
    assert.equal(await a.files.readText("/tmp/counter"), "1\na\n");
    assert.equal(await b.files.readText("/tmp/counter"), "1\nb\n");
    assert.equal(await sb.files.readText("/tmp/counter"), "1\nsource\n");
    assert.notEqual((await a.exec("hostname")).stdout, (await b.exec("hostname")).stdout);
  });

  test("branch({mode: 'full', tag}) and a taken tag (409)", async () => {
    const tag = uniqueTag("full");
    const branch = await sb.branch({ mode: "full", count: 1, tag });
    cleanup.push(branch.snapshot, ...branch.children);
    assert.equal(branch.mode, "full");
    assert.equal(branch.snapshot.tag, tag);
    await rejectsWith(sb.branch({ tag, count: 0 }), { class: ConflictError, status: 409 });
  });

  test("branch({wait: false}): the snapshot is writing, then ready with its child", async () => {
    const branch = await sb.branch({ wait: false, count: 1 });
    cleanup.push(branch.snapshot);
    assert.equal(branch.children.length, 0);
    const snap = await branch.snapshot.waitReady({ timeoutMs: 120_000 });
    assert.equal(snap.state, "ready");
    // The child shows up under the snapshot once spawned.
    await eventually(() => snap.refresh(), (info) => info.sandboxes.length > 0);
    assert.equal(snap.info.sandboxes.length, 1);
    const child = await Sandbox.get(snap.info.sandboxes[0]!, { client });
    cleanup.push(child);
    await eventually(() => child.refresh(), (info) => info.state !== "starting");
    assert.equal(child.state, "running");
    assert.equal((await child.exec("echo child")).stdout, "child\n");
  });

  test("branch({mode: 'diff'}) of a clone, then flatten()", async () => {
    const clone = await Sandbox.create({ client });
    cleanup.push(clone);
    await clone.exec("echo diff > /tmp/where");
    const branch = await clone.branch({ mode: "diff", count: 1 });
    cleanup.push(branch.snapshot, ...branch.children);
    assert.equal(branch.snapshot.kind, "diff");
    assert.equal(await branch.children[0]!.files.readText("/tmp/where"), "diff\n");
    const flat = await branch.snapshot.flatten({ tag: uniqueTag("flat") });
    cleanup.push(flat);
    assert.equal(flat.kind, "shared");
    const [child] = await flat.spawn();
    cleanup.push(child!);
    assert.equal(await child!.files.readText("/tmp/where"), "diff\n");
  });

  test("snapshot(), Snapshot.get/list, spawn({count}), setPool, delete({force})", async () => {
    const tag = uniqueTag("snap");
    const snap = await sb.snapshot({ tag });
    cleanup.push(snap);
    assert.equal(snap.tag, tag);
    assert.equal(snap.state, "ready");
    assert.equal((await Snapshot.get(tag, { client })).id, snap.id);
    assert.ok((await Snapshot.list({ client })).some((s) => s.id === snap.id));

    assert.equal((await snap.setPool(1)).info.pool_size, 1);
    const children = await snap.spawn({ count: 2 });
    cleanup.push(...children);
    assert.equal(children.length, 2);
    for (const child of children) assert.equal(child.info.snapshot, snap.id);
    assert.equal((await snap.setPool(0)).info.pool_size, 0);

    await rejectsWith(snap.delete(), { class: ConflictError, status: 409 });
    await snap.delete({ force: true });
    await rejectsWith(Snapshot.get(snap.id, { client }), { class: NotFoundError, status: 404 });
    for (const child of children) await rejectsWith(child.refresh(), { status: 404 });
  });
});
