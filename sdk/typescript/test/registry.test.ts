/**
 * Snapshot push and pull against a real daemon and a real OCI registry.
 *
 * The registry is Debian's `docker-registry` (the CNCF distribution
 * registry), started here on a free loopback port with its storage in a
 * temporary directory, and stopped by its PID at the end. A sandbox of the
 * runner's daemon writes a file and is snapshotted; the snapshot is pushed
 * (with its chain and base image), pushed again (nothing but the index
 * goes), pulled back onto the same daemon (everything is cached), and pulled
 * with a tag into a second daemon started here, where a sandbox spawned from
 * it reads the file back. Error paths: a missing tag, a taken tag, an
 * unreachable registry, an unknown snapshot.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readlinkSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";
import {
  Client,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  RegistryUnreachableError,
  Sandbox,
  Snapshot,
  type api,
  type TransferEvent,
} from "forkvm";
import { freePort, startDaemon, stopDaemon, type Daemon } from "./daemon.js";
import { rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

const REGISTRY_BIN = process.env.FORKVM_TEST_REGISTRY || "/usr/bin/docker-registry";
const skip = existsSync(REGISTRY_BIN) ? false : `needs an OCI registry at ${REGISTRY_BIN} (apt-get install docker-registry)`;
const MARKER = "/root/registry-marker";

/** A registry on a loopback port. */
class Registry {
  private constructor(
    readonly host: string,
    readonly process: ChildProcess,
    readonly root: string,
  ) {}

  static async start(): Promise<Registry> {
    const root = mkdtempSync(join(tmpdir(), "forkvm-ts-registry-"));
    const port = await freePort();
    const config = join(root, "config.yml");
    writeFileSync(
      config,
      "version: 0.1\n" +
        "log: {level: warn}\n" +
        `storage: {filesystem: {rootdirectory: ${join(root, "data")}}}\n` +
        `http: {addr: 127.0.0.1:${port}, secret: forkvm-test}\n`,
    );
    const log = openSync(join(root, "registry.log"), "a");
    const child = spawn(REGISTRY_BIN, ["serve", config], { stdio: ["ignore", log, log], detached: true });
    closeSync(log);
    const registry = new Registry(`127.0.0.1:${port}`, child, root);
    const deadline = Date.now() + 30_000;
    for (;;) {
      if (child.exitCode !== null) {
        const text = readFileSync(join(root, "registry.log"), "utf8");
        await registry.stop();
        throw new Error(`the registry exited with ${child.exitCode}: ${text}`);
      }
      const ok = await fetch(`http://${registry.host}/v2/`).then(
        (r) => r.status === 200,
        () => false,
      );
      if (ok) return registry;
      if (Date.now() > deadline) {
        await registry.stop();
        throw new Error(`the registry did not answer on ${registry.host} within 30 s`);
      }
      await sleep(100);
    }
  }

  reference(repo: string, tag: string): string {
    return `${this.host}/${repo}:${tag}`;
  }

  /** Stop it by its PID and remove its storage. */
  async stop(): Promise<void> {
    const child = this.process;
    if (child.exitCode === null && child.signalCode === null && child.pid) {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      process.kill(child.pid, "SIGTERM");
      if (!(await Promise.race([exited.then(() => true), sleep(10_000).then(() => false)]))) {
        process.kill(child.pid, "SIGKILL");
        await exited;
      }
    }
    rmSync(this.root, { recursive: true, force: true });
  }
}

/**
 * Every thread of the daemon `pid` is in the daemon's own network namespace.
 *
 * A regression check: the daemon once enabled IP forwarding in a new
 * sandbox's namespace by `setns` on a tokio blocking-pool thread, which
 * stayed there and could later serve as an async worker, so registry
 * connections failed with "connection refused" (the loopback was the
 * sandbox's). Only possible for the runner's daemon (its PID is known).
 */
function assertThreadsInOwnNamespace(pid: string | undefined): void {
  if (!pid) return;
  const own = readlinkSync(`/proc/${pid}/ns/net`);
  const stray = readdirSync(`/proc/${pid}/task`).filter((tid) => {
    try {
      return readlinkSync(`/proc/${pid}/task/${tid}/ns/net`) !== own;
    } catch {
      return false; // the thread ended meanwhile
    }
  });
  if (stray.length > 0) {
    throw new Error(`threads ${stray.join(", ")} of the daemon (pid ${pid}) are in a sandbox's network namespace`);
  }
}

describe("snapshot push and pull through a registry", { skip, timeout: VM_TIMEOUT * 2 }, () => {
  let client: Client;
  let registry: Registry;
  let snapshot: Snapshot;
  let reference: string;
  let content: string;
  let pushed: api.PushResult;
  const events: TransferEvent[] = [];

  before(async () => {
    client = testClient();
    registry = await Registry.start();
    content = `pushed ${randomBytes(8).toString("hex")}\n`;
    const sb = await Sandbox.create({ client });
    try {
      await sb.files.write(MARKER, content);
      snapshot = await sb.snapshot({ tag: uniqueTag("ts-reg") });
    } finally {
      await sb.close();
    }
    reference = registry.reference("ts/warm", "v1");
    assertThreadsInOwnNamespace(process.env.FORKVM_TEST_DAEMON_PID);
    pushed = await snapshot.push(reference, { onEvent: (e) => void events.push(e) });
  });

  after(async () => {
    await snapshot?.delete({ force: true }).catch(() => {});
    await registry?.stop();
    client?.close();
  });

  test("a push reports its progress and what it sent", () => {
    assert.equal(pushed.snapshot, snapshot.id);
    assert.equal(pushed.reference, reference);
    assert.match(pushed.digest, /^sha256:[0-9a-f]{64}$/);
    // The snapshot and its ancestors (at least the boot template it was spawned from).
    assert.ok(pushed.links >= 2, `links ${pushed.links}`);
    assert.equal(pushed.links_skipped, 0);
    assert.ok(pushed.image_sent);
    assert.ok(pushed.blobs_sent > 0 && pushed.bytes_sent > 0);
    assert.ok(pushed.manifests_sent >= pushed.links + 2, "the links, the image, the index");
    const last = events.at(-1);
    assert.ok(last?.type === "pushed");
    assert.deepEqual(last.result, pushed);
    assert.ok(events.some((e) => e.type === "phase"));
    const progress = events.filter((e): e is Extract<TransferEvent, { type: "progress" }> => e.type === "progress");
    assert.ok(progress.length > 0, "progress events arrived");
    assert.ok(progress.every((e) => e.item.length > 0 && e.done >= 0));
    assert.ok(progress.some((e) => e.total != null && e.done === e.total), "some item was reported complete");
  });

  test("a second push sends only the index", async () => {
    const cached: string[] = [];
    const again = await client.pushSnapshot(snapshot.id, { reference }, { onEvent: (e) => void (e.type === "cached" && cached.push(e.item)) });
    assert.equal(again.digest, pushed.digest);
    assert.equal(again.links_skipped, again.links);
    assert.equal(again.image_sent, false);
    assert.equal(again.blobs_sent, 0);
    assert.equal(again.manifests_sent, 1);
    assert.ok(again.bytes_sent > 0 && again.bytes_sent < 64 * 1024, `bytes_sent ${again.bytes_sent}`);
    assert.equal(cached.length, again.links + 1, `every link and the image: ${cached.join(", ")}`);
  });

  test("a pull onto the pushing daemon finds everything cached", async () => {
    const seen: TransferEvent[] = [];
    const result = await client.pullSnapshot({ reference }, { onEvent: (e) => void seen.push(e) });
    assert.equal(result.snapshot.id, snapshot.id);
    assert.equal(result.snapshot.tag, snapshot.tag);
    assert.equal(result.digest, pushed.digest);
    assert.equal(result.links, pushed.links);
    assert.equal(result.links_cached, result.links);
    assert.equal(result.blobs_fetched, 0);
    assert.equal(result.image_created, false);
    assert.equal(seen.at(-1)?.type, "pulled");
    assert.equal(seen.filter((e) => e.type === "cached").length, result.links + 1);

    // By digest, through the Snapshot class: the same snapshot.
    const repo = reference.slice(0, reference.lastIndexOf(":"));
    const same = await Snapshot.pull(`${repo}@${pushed.digest}`, { client });
    assert.equal(same.id, snapshot.id);
    assert.equal(same.state, "ready");
  });

  test("a pull of a missing tag or repository is a NotFoundError (image_not_found)", async () => {
    const seen: string[] = [];
    await rejectsWith(client.pullSnapshot({ reference: registry.reference("ts/warm", "no-such-tag") }, { onEvent: (e) => void seen.push(e.type) }), {
      class: NotFoundError,
      status: 404,
      code: "image_not_found",
      message: /no-such-tag/,
    });
    assert.equal(seen.at(-1), "error");
    await rejectsWith(client.pullSnapshot({ reference: registry.reference("ts/no-such-repo", "v1") }), { class: NotFoundError, status: 404 });
  });

  test("a pull into a taken tag is a ConflictError", async () => {
    await rejectsWith(client.pullSnapshot({ reference, tag: snapshot.tag! }), { class: ConflictError, status: 409, code: "conflict" });
  });

  test("push errors: an unreachable registry, an unknown snapshot, an empty reference", async () => {
    const closed = await freePort(); // nothing listens there
    await rejectsWith(snapshot.push(`127.0.0.1:${closed}/ts/warm:v1`), {
      class: RegistryUnreachableError,
      status: 502,
      code: "registry_unreachable",
    });
    await rejectsWith(client.pushSnapshot("ts-no-such-snapshot", { reference }), { class: NotFoundError, status: 404 });
    await rejectsWith(client.pushSnapshot(snapshot.id, { reference: "" }), { class: InvalidRequestError, status: 400 });
  });

  test("a pull with a tag into another daemon spawns a sandbox that has the file", async () => {
    let other: Daemon | undefined;
    let otherClient: Client | undefined;
    try {
      other = await startDaemon(); // the launcher gives it a network pool of its own
      otherClient = new Client({ url: other.env.FORKVM_URL });
      const tag = uniqueTag("ts-pulled");
      const seen: TransferEvent[] = [];
      const result = await otherClient.pullSnapshot({ reference, tag }, { onEvent: (e) => void seen.push(e) });
      assert.equal(result.snapshot.id, snapshot.id);
      assert.equal(result.snapshot.tag, tag);
      assert.equal(result.snapshot.state, "ready");
      assert.equal(result.links, pushed.links);
      assert.equal(result.links_cached, 0);
      assert.ok(result.blobs_fetched > 0 && result.bytes_fetched > 0);
      // Its image is the same one (both homes link the built images): matched, not fetched.
      assert.equal(result.image, "default");
      assert.equal(result.image_created, false);
      assert.equal(seen.at(-1)?.type, "pulled");

      const [child] = await (await Snapshot.get(tag, { client: otherClient })).spawn();
      try {
        assert.equal(await child!.files.readText(MARKER), content);
      } finally {
        await child?.close();
      }

      // Again: everything is here now.
      const again = await otherClient.pullSnapshot({ reference });
      assert.equal(again.links_cached, again.links);
      assert.equal(again.blobs_fetched, 0);
      assert.equal(again.snapshot.tag, tag);
    } finally {
      otherClient?.close();
      if (other) await stopDaemon(other, { quiet: true });
    }
  });
});
