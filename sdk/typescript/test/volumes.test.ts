/**
 * Volumes against a real daemon (docs/volumes.md): host directories mounted
 * read-write and read-only, and named volumes made, listed and removed. One
 * sandbox of the file's own has two host directories; the named-volume test
 * spawns one more, from the boot template.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";
import { Client, ConflictError, InvalidRequestError, NotFoundError, Sandbox } from "forkvm";
import { eventually, rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

const GREETING = "hello from the host\n";

let client: Client;
let sb: Sandbox;
let scratch: string;
let rw: string;
let ro: string;

before(async () => {
  client = testClient();
  scratch = mkdtempSync(join(tmpdir(), "forkvm-ts-volumes-"));
  rw = join(scratch, "rw");
  ro = join(scratch, "ro");
  for (const dir of [rw, ro]) mkdirSync(dir);
  writeFileSync(join(rw, "hello.txt"), GREETING);
  writeFileSync(join(ro, "data.txt"), "read me\n");
  // One volume in the CLI's string form, one as an object.
  sb = await Sandbox.create({ client, volumes: [`${rw}:/work`, { source: ro, path: "/data", read_only: true }] });
});

after(async () => {
  await sb?.close();
  client.close();
  rmSync(scratch, { recursive: true, force: true });
});

describe("volumes", { timeout: VM_TIMEOUT }, () => {
  test("the sandbox shows its volumes", async () => {
    await sb.refresh();
    const byPath = new Map(sb.volumes.map((v) => [v.path, v]));
    const work = byPath.get("/work");
    const data = byPath.get("/data");
    assert.ok(work && data, JSON.stringify(sb.volumes));
    assert.deepEqual([work.source, work.read_only, work.mode], [rw, false, "shared"]);
    assert.deepEqual([data.source, data.read_only], [ro, true]);
    assert.equal(work.host_path, realpathSync(rw));
    assert.equal(data.host_path, realpathSync(ro));
  });

  test("the guest reads a host file", async () => {
    assert.equal((await sb.exec("cat /work/hello.txt")).stdout, GREETING);
    assert.equal((await sb.exec("cat /data/data.txt")).stdout, "read me\n");
  });

  test("a guest write appears on the host, and a host edit in the guest", async () => {
    const r = await sb.exec("mkdir -p /work/out && echo written by the guest > /work/out/note.txt && sync");
    assert.equal(r.exitCode, 0, r.stderr);
    const note = join(rw, "out", "note.txt");
    await eventually(async () => existsSync(note), (there) => there, 10_000);
    assert.equal(readFileSync(note, "utf8"), "written by the guest\n");
    writeFileSync(join(rw, "hello.txt"), "edited on the host\n");
    // Attributes are cached for 1 s in the guest.
    const seen = await eventually(async () => (await sb.exec("cat /work/hello.txt")).stdout, (t) => t === "edited on the host\n", 10_000);
    assert.equal(seen, "edited on the host\n");
  });

  test("a read-only volume refuses writes", async () => {
    const r = await sb.exec("echo nope > /data/new.txt");
    assert.notEqual(r.exitCode, 0);
    assert.match(r.stderr, /read-only/i);
    assert.notEqual((await sb.exec("rm /data/data.txt")).exitCode, 0);
    assert.deepEqual(readdirSync(ro), ["data.txt"]);
  });

  test("bad volumes are refused", async () => {
    await assert.rejects(Sandbox.create({ client, volumes: ["/tmp"] }), TypeError); // before any request
    await rejectsWith(client.createSandbox({ volumes: [{ source: join(scratch, "missing"), path: "/work" }] }), {
      class: InvalidRequestError,
      status: 400,
    });
    await rejectsWith(client.createSandbox({ volumes: [{ source: rw, path: "/proc/x" }] }), { class: InvalidRequestError, status: 400 });
    await rejectsWith(Sandbox.create({ client, volumes: [`${uniqueTag("no-such-volume")}:/work`] }), { class: NotFoundError, status: 404 });
    const home = process.env.FORKVM_TEST_HOME;
    if (home) {
      // forkvm's home is never a guest's: 403, with the code invalid_request (which picks the class).
      await rejectsWith(Sandbox.create({ client, volumes: [`${home}:/work`] }), {
        class: InvalidRequestError,
        status: 403,
        code: "invalid_request",
      });
    }
  });

  test("named volumes: create, list, mount, delete", async () => {
    const name = uniqueTag("ts-vol");
    const vol = await client.createVolume(name);
    try {
      assert.equal(vol.name, name);
      assert.ok(vol.path && vol.created_at);
      assert.deepEqual(vol.used_by ?? [], []);
      assert.ok((await client.listVolumes()).volumes.some((v) => v.name === name));
      await rejectsWith(client.createVolume(name), { class: ConflictError, status: 409 });
      await rejectsWith(client.createVolume("-bad name"), { class: InvalidRequestError, status: 400 });
      const user = await Sandbox.create({ client, volumes: [`${name}:/scratch`] });
      try {
        assert.deepEqual(user.volumes.map((v) => [v.source, v.path]), [[name, "/scratch"]]);
        assert.equal((await user.exec("echo kept > /scratch/kept.txt && sync")).exitCode, 0);
        const listed = (await client.listVolumes()).volumes.find((v) => v.name === name);
        assert.deepEqual(listed?.used_by, [user.id]);
        await rejectsWith(client.deleteVolume(name), { class: ConflictError, status: 409 });
      } finally {
        await user.close();
      }
      await client.deleteVolume(name);
    } catch (err) {
      await removeQuietly(name);
      throw err;
    }
    assert.ok(!(await client.listVolumes()).volumes.some((v) => v.name === name));
    await rejectsWith(client.deleteVolume(name), { class: NotFoundError, status: 404 });
  });
});

/** Remove a volume the test made, waiting while a sandbox being removed still holds it. */
async function removeQuietly(name: string): Promise<void> {
  for (let i = 0; i < 50; i++) {
    try {
      await client.deleteVolume(name);
      return;
    } catch (err) {
      if (err instanceof NotFoundError) return;
      if (!(err instanceof ConflictError)) throw err;
      await sleep(200);
    }
  }
}
