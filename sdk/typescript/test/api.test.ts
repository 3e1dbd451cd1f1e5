/**
 * The low-level Client against a real daemon: every operation, its success
 * and its errors (400, 404, 409, 413). Sandboxes are shared between tests.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PayloadTooLargeError,
  Snapshot,
  type api,
  type Client,
} from "forkvm";
import { eventually, rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

const NO_SANDBOX = "sb-000000000000";
const NO_SNAPSHOT = "sn-000000000000";

let client: Client;
/** The shared sandbox most tests run in. */
let sb: api.Sandbox;
/** Everything to remove at the end. */
const sandboxes = new Set<string>();
const snapshots: string[] = [];

async function spawnShared(): Promise<api.Sandbox> {
  const created = await client.createSandbox();
  sandboxes.add(created.id);
  return created;
}

before(async () => {
  client = testClient();
  sb = await spawnShared();
});

after(async () => {
  await Promise.allSettled([...sandboxes].map((id) => client.deleteSandbox(id)));
  for (const id of snapshots.reverse()) await client.deleteSnapshot(id, { force: true }).catch(() => {});
  client.close();
});

describe("daemon", () => {
  test("health", async () => {
    const health = await client.health();
    assert.equal(health.status, "ok");
    assert.match(health.version, /^\d+\.\d+\.\d+/);
  });

  test("info: accelerator, QEMU, limits, images", async () => {
    const info = await client.info();
    assert.ok(["kvm", "tcg"].includes(info.accel.kind));
    assert.ok(info.accel.reason.length > 0);
    assert.ok(info.qemu.version.includes("QEMU"));
    assert.ok(info.images.includes("default"));
    assert.equal(info.limits.max_sandboxes, 1000);
    assert.ok(info.limits.max_file_bytes > 0);
    assert.ok(info.sandboxes >= 1);
    assert.ok(Array.isArray(info.pools));
  });

  test("a wrong method is a 405 invalid_request", async () => {
    const res = await client.transport.request({ method: "PATCH", path: "/v1/sandboxes" });
    await res.bytes();
    assert.equal(res.status, 405);
  });

  test("an unknown route is a 404", async () => {
    const res = await client.transport.request({ method: "GET", path: "/v1/nope" });
    assert.equal(res.status, 404);
    const body = JSON.parse(new TextDecoder().decode(await res.bytes())) as api.ErrorBody;
    assert.equal(body.error.code, "not_found");
  });
});

describe("sandboxes", { timeout: VM_TIMEOUT }, () => {
  test("create_sandbox: the default image, running, with timings", () => {
    assert.match(sb.id, /^sb-/);
    assert.equal(sb.state, "running");
    assert.equal(sb.image, "default");
    assert.equal(sb.memory_mib, 512);
    assert.equal(sb.cpus, 1);
    assert.ok(sb.timings && sb.timings.total_ms > 0);
  });

  test("create_sandbox: bad input is refused and creates nothing", async () => {
    const before = (await client.listSandboxes()).sandboxes.length;
    await rejectsWith(client.createSandbox({ memory_mib: 1 }), {
      class: InvalidRequestError,
      status: 400,
      code: "invalid_request",
      message: /memory_mib/,
    });
    await rejectsWith(client.createSandbox({ cpus: 100_000 }), { status: 400, code: "invalid_request" });
    await rejectsWith(client.createSandbox({ count: 0 }), { status: 400, code: "invalid_request", message: /count/ });
    await rejectsWith(client.createSandbox({ bogus: 1 } as api.CreateSandbox), {
      status: 400,
      code: "invalid_request",
      message: /unknown field `bogus`/,
    });
    await rejectsWith(client.createSandbox({ image: "no-such-image" }), {
      class: NotFoundError,
      status: 404,
      code: "image_not_found",
    });
    await rejectsWith(client.createSandbox({ snapshot: NO_SNAPSHOT }), { status: 404, code: "not_found" });
    assert.equal((await client.listSandboxes()).sandboxes.length, before);
  });

  test("list_sandboxes", async () => {
    const { sandboxes: all } = await client.listSandboxes();
    const mine = all.find((s) => s.id === sb.id);
    assert.ok(mine, "the shared sandbox is listed");
    assert.equal(mine.state, "running");
  });

  test("get_sandbox: with the memory use of its QEMU; 404 for an unknown id", async () => {
    const got = await client.getSandbox(sb.id);
    assert.equal(got.id, sb.id);
    assert.ok(got.memory && got.memory.rss_kib > 0 && got.memory.pss_kib > 0);
    assert.ok(got.pid && got.pid > 0);
    await rejectsWith(client.getSandbox(NO_SANDBOX), { class: NotFoundError, status: 404, code: "not_found" });
  });

  test("exec: output, exit code, stdin, env, cwd", async () => {
    const res = await client.exec(sb.id, {
      argv: ["python3", "-c", "import os,sys; print(sys.stdin.read().upper(), os.environ['MODE'], os.getcwd()); sys.exit(3)"],
      stdin: "hello",
      env: { MODE: "test" },
      cwd: "/tmp",
    });
    assert.equal(res.stdout, "HELLO test /tmp\n");
    assert.equal(res.exit_code, 3);
    assert.equal(res.timed_out, false);
    assert.equal(res.encoding, "utf8");
    assert.equal(res.stdout_bytes, res.stdout.length);
    assert.ok(res.duration_ms >= 0);
  });

  test("exec: bytes in (stdin_base64) and out (encoding base64)", async () => {
    const bytes = Buffer.from([0, 1, 2, 250, 255]);
    const res = await client.exec(sb.id, { argv: ["cat"], stdin_base64: bytes.toString("base64"), encoding: "base64" });
    assert.equal(res.encoding, "base64");
    assert.deepEqual(Buffer.from(res.stdout, "base64"), bytes);
  });

  test("exec: a timeout kills the command", async () => {
    const res = await client.exec(sb.id, { argv: ["sleep", "30"], timeout_ms: 300 });
    assert.equal(res.timed_out, true);
    assert.equal(res.signal, 9);
    assert.equal(res.exit_code ?? null, null);
  });

  test("exec: output past max_output_bytes is counted, not kept", async () => {
    const res = await client.exec(sb.id, { argv: ["head", "-c", "10000", "/dev/zero"], max_output_bytes: 100 });
    assert.equal(res.stdout.length, 100);
    assert.equal(res.stdout_bytes, 10000);
    assert.equal(res.stdout_truncated, true);
    assert.equal(res.stderr_truncated, false);
  });

  test("exec: errors", async () => {
    await rejectsWith(client.exec(NO_SANDBOX, { argv: ["true"] }), { class: NotFoundError, status: 404 });
    await rejectsWith(client.exec(sb.id, { argv: ["no-such-program"] }), {
      status: 404,
      code: "not_found",
      message: /no-such-program/,
    });
    await rejectsWith(client.exec(sb.id, { argv: [] }), { class: InvalidRequestError, status: 400 });
    await rejectsWith(client.exec(sb.id, { argv: ["true"], stdin: "a", stdin_base64: "YQ==" }), {
      status: 400,
      message: /not both/,
    });
    await rejectsWith(client.exec(sb.id, { argv: ["true"], timeout_ms: 0 }), { status: 400, message: /timeout_ms/ });
  });

  test("write_file and read_file: bytes and mode round-trip", async () => {
    const data = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7) % 256));
    const written = await client.writeFile(sb.id, "/tmp/api-test.bin", data, { mode: 0o750 });
    assert.deepEqual(written, { path: "/tmp/api-test.bin", size: data.length });
    assert.deepEqual(Buffer.from(await client.readFile(sb.id, "/tmp/api-test.bin")), data);
    const stat = await client.exec(sb.id, { argv: ["stat", "-c", "%a", "/tmp/api-test.bin"] });
    assert.equal(stat.stdout.trim(), "750");
    await client.writeFile(sb.id, "/tmp/api-test.txt", "text ✓", { mode: "600" });
    assert.equal(new TextDecoder().decode(await client.readFile(sb.id, "/tmp/api-test.txt")), "text ✓");
  });

  test("write_file and read_file: errors", async () => {
    await rejectsWith(client.readFile(sb.id, "/no/such/file"), { class: NotFoundError, status: 404 });
    await rejectsWith(client.readFile(sb.id, "relative/path"), { status: 400, message: /absolute/ });
    await rejectsWith(client.readFile(NO_SANDBOX, "/etc/hostname"), { status: 404 });
    await rejectsWith(client.writeFile(sb.id, "relative", "x"), { status: 400, message: /absolute/ });
    await rejectsWith(client.writeFile(sb.id, "/tmp/x", "x", { mode: "abc" }), { status: 400, message: /octal/ });
    await rejectsWith(client.writeFile(NO_SANDBOX, "/tmp/x", "x"), { status: 404 });
    const { limits } = await client.info();
    await rejectsWith(client.writeFile(sb.id, "/tmp/too-big", new Uint8Array(limits.max_file_bytes + 1)), {
      class: PayloadTooLargeError,
      status: 413,
      code: "payload_too_large",
    });
  });

  test("logs: the serial console; 404 for an unknown id", async () => {
    // A clone of the boot template did not boot: its console shows only what is written to it since.
    await client.exec(sb.id, { argv: ["sh", "-c", "echo api-console-marker > /dev/console"] });
    assert.match(await eventually(() => client.logs(sb.id), (logs) => logs.includes("api-console-marker")), /api-console-marker/);
    await rejectsWith(client.logs(NO_SANDBOX), { status: 404 });
  });
});

describe("snapshots", { timeout: VM_TIMEOUT }, () => {
  let snap: api.Snapshot;
  const tag = uniqueTag("api");

  before(async () => {
    await client.writeFile(sb.id, "/tmp/marker", "before the snapshot");
    snap = await client.snapshotSandbox(sb.id, { tag });
    snapshots.push(snap.id);
  });

  test("snapshot_sandbox: 201 with its timings; the source keeps running", async () => {
    assert.match(snap.id, /^sn-/);
    assert.equal(snap.tag, tag);
    assert.equal(snap.source, sb.id);
    assert.equal(snap.state, "ready");
    assert.ok(snap.timings && snap.timings.pause_ms > 0);
    assert.equal((await client.exec(sb.id, { argv: ["true"] })).exit_code, 0);
  });

  test("snapshot_sandbox: errors", async () => {
    await rejectsWith(client.snapshotSandbox(sb.id, { tag }), {
      class: ConflictError,
      status: 409,
      code: "conflict",
      message: /already used/,
    });
    await rejectsWith(client.snapshotSandbox(NO_SANDBOX), { status: 404 });
    await rejectsWith(client.snapshotSandbox(sb.id, { bogus: 1 } as api.CreateSnapshot), { status: 400 });
  });

  test("snapshot_sandbox: two at once on one sandbox, the second gets 409", async () => {
    const results = await Promise.allSettled([client.snapshotSandbox(sb.id), client.snapshotSandbox(sb.id)]);
    for (const r of results) if (r.status === "fulfilled") snapshots.push(r.value.id);
    const refused = results.filter((r) => r.status === "rejected");
    assert.equal(refused.length, 1, "exactly one of two concurrent snapshots is refused");
    await rejectsWith(Promise.reject((refused[0] as PromiseRejectedResult).reason), { class: ConflictError, status: 409 });
  });

  test("list_snapshots and get_snapshot, by id and by tag; 404", async () => {
    const { snapshots: all } = await client.listSnapshots();
    assert.ok(all.some((s) => s.id === snap.id));
    assert.ok(all.some((s) => s.template), "the boot template is listed");
    const byId = await client.getSnapshot(snap.id);
    const byTag = await client.getSnapshot(tag);
    assert.equal(byTag.id, snap.id);
    assert.equal(byId.kind, snap.kind);
    assert.ok(byId.sizes.device_state_bytes > 0);
    await rejectsWith(client.getSnapshot(NO_SNAPSHOT), { class: NotFoundError, status: 404 });
  });

  test("create_sandbox from a snapshot with count: a batch of children that see its files", async () => {
    const batch = await client.createSandbox({ snapshot: tag, count: 2 });
    for (const child of batch.sandboxes) sandboxes.add(child.id);
    assert.equal(batch.sandboxes.length, 2);
    assert.ok(batch.total_ms > 0);
    for (const child of batch.sandboxes) {
      assert.equal(child.snapshot, snap.id);
      const marker = await client.readFile(child.id, "/tmp/marker");
      assert.equal(new TextDecoder().decode(marker), "before the snapshot");
    }
    assert.deepEqual((await client.getSnapshot(snap.id)).sandboxes.sort(), batch.sandboxes.map((s) => s.id).sort());
  });

  test("delete_snapshot: 409 while in use, force removes its dependents; 404", async () => {
    const other = await client.snapshotSandbox(sb.id);
    snapshots.push(other.id);
    const child = await client.createSandbox({ snapshot: other.id });
    sandboxes.add(child.id);
    await rejectsWith(client.deleteSnapshot(other.id), { class: ConflictError, status: 409, message: /in use/ });
    await client.deleteSnapshot(other.id, { force: true });
    await rejectsWith(client.getSandbox(child.id), { status: 404 });
    await rejectsWith(client.deleteSnapshot(other.id), { class: NotFoundError, status: 404 });
  });

  test("set_pool: the pool fills and info lists it; 400 over the limit; 404", async () => {
    const pooled = await client.setPool(snap.id, 1);
    assert.equal(pooled.pool_size, 1);
    const pool = (await client.info()).pools.find((p) => p.snapshot === snap.id);
    assert.ok(pool);
    assert.equal(pool.size, 1);
    await rejectsWith(client.setPool(snap.id, 100_000), { status: 400, code: "invalid_request" });
    await rejectsWith(client.setPool(NO_SNAPSHOT, 1), { status: 404 });
    const off = await client.setPool(tag, 0);
    assert.deepEqual([off.pool_size, off.pool_default], [0, false]);
    // null drops the snapshot's own size: it follows the daemon's default.
    const { default_pool_size } = await client.info();
    const back = await client.setPool(tag, null);
    assert.deepEqual([back.pool_size, back.pool_default], [default_pool_size, true]);
  });
});

describe("branch and flatten", { timeout: VM_TIMEOUT }, () => {
  let clone: api.Sandbox;

  before(async () => {
    // A sandbox spawned from the boot template maps its RAM copy-on-write: diff branches work on it.
    clone = await spawnShared();
  });

  test("branch_sandbox (live): a snapshot and running children", async () => {
    const res = await client.branchSandbox(clone.id, { mode: "live", count: 1 });
    snapshots.push(res.snapshot.id);
    for (const child of res.children) sandboxes.add(child.id);
    assert.equal(res.mode, "live");
    assert.equal(res.children.length, 1);
    assert.equal(res.children[0]!.state, "running");
    assert.ok(res.pause_ms >= 0 && res.total_ms >= res.pause_ms);
    assert.equal((await client.exec(res.children[0]!.id, { argv: ["true"] })).exit_code, 0);
  });

  test("branch_sandbox: errors", async () => {
    await rejectsWith(client.branchSandbox(NO_SANDBOX), { class: NotFoundError, status: 404 });
    await rejectsWith(client.branchSandbox(clone.id, { count: 1001 }), { status: 400, message: /count/ });
    await rejectsWith(client.branchSandbox(clone.id, { mode: "sideways" as api.BranchMode }), { status: 400 });
    const taken = (await client.getSnapshot(snapshots[0]!)).tag;
    assert.ok(taken);
    await rejectsWith(client.branchSandbox(clone.id, { tag: taken, count: 0 }), { class: ConflictError, status: 409 });
  });

  test("branch_sandbox (diff) then flatten_snapshot: a standalone snapshot", async () => {
    const res = await client.branchSandbox(clone.id, { mode: "diff", count: 0 });
    snapshots.push(res.snapshot.id);
    assert.equal(res.snapshot.kind, "diff");
    assert.ok((res.snapshot.depth ?? 0) >= 1);
    assert.ok(res.snapshot.parent);
    const flatTag = uniqueTag("flat");
    const flat = await client.flattenSnapshot(res.snapshot.id, { tag: flatTag });
    snapshots.push(flat.id);
    assert.equal(flat.kind, "shared");
    assert.equal(flat.tag, flatTag);
    assert.ok(!flat.parent);
    await rejectsWith(client.flattenSnapshot(res.snapshot.id, { tag: flatTag }), { class: ConflictError, status: 409 });
  });

  test("flatten_snapshot: errors", async () => {
    const shared = (await client.listSnapshots()).snapshots.find((s) => s.kind === "shared");
    assert.ok(shared);
    await rejectsWith(client.flattenSnapshot(shared.id), { status: 400, message: /only diff snapshots/ });
    await rejectsWith(client.flattenSnapshot(NO_SNAPSHOT), { class: NotFoundError, status: 404 });
  });

  test("pin_snapshot, unpin_snapshot, prune_snapshots: a pin keeps a branch point; a dry run lists it once unpinned", async () => {
    const res = await client.branchSandbox(clone.id, { mode: "diff", count: 0 });
    snapshots.push(res.snapshot.id);
    const id = res.snapshot.id;
    assert.deepEqual([res.snapshot.origin, res.snapshot.pinned], ["branch", false]);
    assert.equal((await client.pinSnapshot(id)).pinned, true);
    let dry = await client.pruneSnapshots({ all: true, dry_run: true });
    assert.equal(dry.dry_run, true);
    assert.equal(dry.grace_secs, 0);
    assert.ok(!dry.snapshots.some((s) => s.id === id), "a pinned snapshot was chosen");
    const snap = await Snapshot.get(id, { client });
    assert.equal(snap.pinned, true);
    assert.equal((await snap.unpin()).pinned, false);
    dry = await Snapshot.prune({ all: true, dryRun: true, client });
    const entry = dry.snapshots.find((s) => s.id === id);
    assert.ok(entry, "an unpinned, unneeded branch point was not chosen");
    assert.equal(entry.kind, "diff");
    assert.ok(entry.bytes > 0 && dry.freed_bytes >= entry.bytes);
    assert.equal((await client.getSnapshot(id)).id, id, "a dry run removed it");
    // Within the daemon's grace period a plain prune leaves it alone.
    const plain = await client.pruneSnapshots();
    assert.equal(plain.grace_secs, (await client.info()).gc.grace_secs);
    assert.ok(!plain.snapshots.some((s) => s.id === id));
    assert.deepEqual(plain.failed, []);
    assert.equal((await snap.pin()).info.pinned, true);
    assert.equal((await client.unpinSnapshot(id)).pinned, false);
    await rejectsWith(client.pinSnapshot(NO_SNAPSHOT), { class: NotFoundError, status: 404 });
    await rejectsWith(client.unpinSnapshot(NO_SNAPSHOT), { class: NotFoundError, status: 404 });
    await rejectsWith(client.pruneSnapshots({ al: true } as api.PruneRequest), { class: InvalidRequestError, status: 400 });
  });

  test("delete_sandbox: 204, then 404", async () => {
    const doomed = await spawnShared();
    await client.deleteSandbox(doomed.id);
    sandboxes.delete(doomed.id);
    await rejectsWith(client.getSandbox(doomed.id), { status: 404 });
    await rejectsWith(client.deleteSandbox(doomed.id), { class: NotFoundError, status: 404 });
  });
});
