/**
 * Filesystem operations (`sb.fs`, `Client.statFile`…) against a real daemon:
 * stat, exists, list with depth, mkdir, move, remove, a streamed watch that
 * sees a create and a delete, a polled watcher, and archives of several
 * paths downloaded and uploaded. One sandbox for the file. See docs/processes.md.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { headerBlocks, InvalidRequestError, NotFoundError, Sandbox, type api, type Client } from "forkvm";
import { rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

let client: Client;
let sb: Sandbox;

before(async () => {
  client = testClient();
  sb = await Sandbox.create({ client });
});

after(async () => {
  await sb?.close();
  client.close();
});

/** The names in a tar (ustar; no PAX or long names here). */
function tarNames(tar: Uint8Array): Map<string, { mode: number; size: number; offset: number }> {
  const out = new Map<string, { mode: number; size: number; offset: number }>();
  const buf = Buffer.from(tar);
  for (let at = 0; at + 512 <= buf.length; ) {
    const header = buf.subarray(at, at + 512);
    if (header.every((b) => b === 0)) break;
    const field = (from: number, len: number): string => header.subarray(from, from + len).toString("latin1").replace(/\0.*$/s, "");
    const prefix = field(345, 155);
    const name = (prefix ? `${prefix}/` : "") + field(0, 100);
    const size = parseInt(field(124, 12).trim() || "0", 8);
    out.set(name.replace(/\/$/, ""), { mode: parseInt(field(100, 8).trim(), 8), size, offset: at + 512 });
    at += 512 + Math.ceil(size / 512) * 512;
  }
  return out;
}

describe("filesystem operations", { timeout: VM_TIMEOUT }, () => {
  test("stat, exists, list with depth, mkdir, move, remove", async () => {
    const root = `/tmp/${uniqueTag("tsfs")}`;
    const made = await sb.fs.mkdir(`${root}/a/b`);
    assert.equal(made.existed, false);
    assert.deepEqual([made.entry.kind, made.entry.path], ["dir", `${root}/a/b`]);
    assert.equal((await sb.fs.mkdir(`${root}/a/b`)).existed, true);
    await sb.fs.write(`${root}/a/b/f.txt`, "12345", { mode: 0o640 });
    await sb.exec(`ln -s b/f.txt ${root}/a/link`);

    const st = await sb.fs.stat(`${root}/a/b/f.txt`);
    assert.deepEqual([st.name, st.kind, st.size, st.mode & 0o7777, st.permissions], ["f.txt", "file", 5, 0o640, "-rw-r-----"]);
    assert.deepEqual([st.owner, st.group], ["root", "root"]);
    assert.ok(st.modified_ns > 1_600_000_000 * 1e9);
    const link = await sb.fs.stat(`${root}/a/link`);
    assert.deepEqual([link.kind, link.symlink_target], ["symlink", "b/f.txt"]);

    assert.equal(await sb.fs.exists(`${root}/a/link`), true);
    assert.equal(await sb.fs.exists(`${root}/none`), false);
    assert.deepEqual((await sb.fs.list(root)).map((e) => e.name), ["a"]);
    const deep = Object.fromEntries((await sb.fs.list(root, { depth: 3 })).map((e: api.EntryInfo) => [e.path, e.kind]));
    assert.deepEqual(deep, {
      [`${root}/a`]: "dir",
      [`${root}/a/b`]: "dir",
      [`${root}/a/link`]: "symlink",
      [`${root}/a/b/f.txt`]: "file",
    });

    const moved = await sb.fs.move(`${root}/a/b/f.txt`, `${root}/g.txt`);
    assert.deepEqual([moved.path, moved.size], [`${root}/g.txt`, 5]);
    assert.equal(await sb.fs.exists(`${root}/a/b/f.txt`), false);
    await sb.fs.remove(`${root}/a`);
    assert.deepEqual((await sb.fs.list(root)).map((e) => e.name), ["g.txt"]);

    await rejectsWith(sb.fs.stat(`${root}/none`), { class: NotFoundError, status: 404 });
    await rejectsWith(sb.fs.remove(`${root}/none`), { class: NotFoundError, status: 404 });
    await rejectsWith(sb.fs.stat("relative/path"), { class: InvalidRequestError, status: 400 });
    await rejectsWith(sb.fs.remove("/"), { class: InvalidRequestError, status: 400 });
    await sb.fs.remove(root);
  });

  test("a watch sees a create and a delete", async () => {
    const root = `/tmp/${uniqueTag("tswatch")}`;
    await sb.fs.mkdir(root);
    const seen: string[] = [];
    {
      await using changes = await sb.fs.watch(root); // resolves once the watch is in place
      await sb.exec(`touch ${root}/new && rm ${root}/new`);
      for await (const change of changes) {
        seen.push(`${change.op} ${change.name}`);
        if (seen.includes("remove new")) break;
      }
      assert.equal(changes.dropped, 0);
    }
    assert.ok(seen.indexOf("create new") >= 0 && seen.indexOf("create new") < seen.indexOf("remove new"), seen.join(", "));
    await rejectsWith(sb.fs.watch(`${root}/none`), { class: NotFoundError, status: 404 });
  });

  test("a polled watcher", async () => {
    const root = `/tmp/${uniqueTag("tswatcher")}`;
    await sb.fs.mkdir(`${root}/sub`);
    const watcher = await sb.fs.watcher(root, { recursive: true });
    await sb.exec(`echo x > ${root}/sub/f && mv ${root}/sub/f ${root}/g`);
    const events: string[] = [];
    const deadline = Date.now() + 30_000;
    while (!events.includes("create g") && Date.now() < deadline) {
      const batch = await watcher.poll();
      assert.equal(batch.dropped, 0);
      events.push(...batch.events.map((e) => `${e.op} ${e.name}`));
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.ok(events.includes("create sub/f") && events.includes("create g"), events.join(", "));
    await watcher.close();
    await rejectsWith(client.pollWatcher(sb.id, watcher.id), { class: NotFoundError, status: 404 });
  });

  test("an archive of several paths, downloaded and uploaded", async () => {
    const root = `/tmp/${uniqueTag("tsarc")}`;
    await sb.fs.mkdir(`${root}/d/e`);
    await sb.fs.write(`${root}/d/e/x`, "x-data", { mode: 0o600 });
    await sb.fs.write(`${root}/two.bin`, new Uint8Array(256).map((_, i) => i));
    const tar = await sb.fs.downloadArchive([`${root}/d`, `${root}/two.bin`]);
    const names = tarNames(tar);
    const r = root.slice(1);
    for (const name of [`${r}/d`, `${r}/d/e`, `${r}/d/e/x`, `${r}/two.bin`]) assert.ok(names.has(name), `${name} in ${[...names.keys()]}`);
    assert.equal(names.get(`${r}/d/e/x`)!.mode & 0o777, 0o600);
    const two = names.get(`${r}/two.bin`)!;
    assert.deepEqual([...tar.subarray(two.offset, two.offset + two.size)], [...new Uint8Array(256).map((_, i) => i)]);

    const written = await sb.fs.uploadArchive(`${root}/copy`, tar);
    assert.equal(written.bytes, 6 + 256);
    assert.ok(written.entries >= 4);
    assert.equal(Buffer.from(await sb.fs.read(`${root}/copy${root}/d/e/x`)).toString(), "x-data");
    assert.equal((await sb.fs.stat(`${root}/copy${root}/d/e/x`)).mode & 0o777, 0o600);

    // A tar made here unpacks under its destination.
    const content = Buffer.from("from the host\n");
    const own = Buffer.concat([
      ...headerBlocks({ name: "up/hello.txt", type: "file", mode: 0o644, size: content.length }, content.length),
      content,
      new Uint8Array(512 - content.length + 1024),
    ]);
    assert.equal((await sb.fs.uploadArchive(`${root}/in`, own)).bytes, 14);
    assert.equal(Buffer.from(await sb.fs.read(`${root}/in/up/hello.txt`)).toString(), "from the host\n");

    await rejectsWith(sb.fs.downloadArchive(`${root}/none`), { class: NotFoundError, status: 404 });
    await sb.fs.remove(root);
  });
});
