/**
 * Time travel against a real daemon and a real microVM: checkpoints (one
 * tagged), rewind with `checkpointFirst` and its undo, the timeline, and
 * retention pruning what it no longer keeps. Bad input is refused with the
 * SDK's typed errors and changes nothing.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, InvalidRequestError, NotFoundError, Sandbox } from "forkvm";
import { rejectsWith, testClient, uniqueTag, VM_TIMEOUT } from "./helpers.js";

let client: Client;
let sb: Sandbox;

before(async () => {
  client = testClient();
  sb = await Sandbox.create({ client, timeout: 900 });
});

after(async () => {
  await sb?.close();
  client.close();
});

async function sh(cmd: string): Promise<string> {
  const r = await sb.exec(cmd);
  assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
}

/** Its disk (a file under /root) and its memory (a file in tmpfs, which lives in RAM only). */
const state = (): Promise<string> => sh("cat /root/notes.txt /dev/shm/counter; ls /root");

describe("time travel", { timeout: VM_TIMEOUT }, () => {
  test("checkpoint, rewind with an undo point, undo, retention, bad input", async () => {
    const tag = uniqueTag("ts-tt");
    const network = sb.info.network;
    await sh("echo draft-1 > /root/notes.txt && echo 1 > /dev/shm/counter");
    const then = await state();
    const cp = await sb.checkpoint({ tag });
    assert.deepEqual([cp.sandbox, cp.seq, cp.tag, cp.head], [sb.id, 1, tag, true]);
    assert.ok(cp.id.startsWith("sn-") && cp.bytes > 0 && (cp.pause_ms ?? 0) > 0, JSON.stringify(cp));
    assert.equal((await client.getSnapshot(tag)).id, cp.id);

    await sh("echo draft-2 > /root/notes.txt && touch /root/mistake && echo 2 > /dev/shm/counter");
    const now = await state();
    assert.notEqual(now, then);

    const r = await sb.rewind(tag, { checkpointFirst: true });
    assert.equal(r.to, cp.id);
    assert.ok(r.rewind_ms > 0);
    assert.equal(sb.id, r.sandbox.id);
    assert.equal(sb.state, "running");
    assert.deepEqual(sb.info.network, network, "a rewind keeps the network identity");
    assert.equal(await state(), then);
    const undo = r.undo;
    assert.ok(undo && undo.seq === 2 && undo.sandbox === sb.id, JSON.stringify(r));
    const timeline = await sb.timeline();
    assert.deepEqual(timeline.checkpoints.map((c) => c.id), [cp.id, undo.id]);
    assert.ok(timeline.bytes >= cp.bytes);

    // Undone by rewinding to the checkpoint it took first.
    await sb.rewind(undo);
    assert.equal(await state(), now);

    // Bad input is refused and changes nothing.
    await rejectsWith(sb.rewind("sn-nosuch"), { class: NotFoundError, status: 404 });
    await rejectsWith(client.rewind("sb-nosuch", { to: cp.id }), { class: NotFoundError, status: 404 });
    await rejectsWith(sb.setRetention({ keepLast: 0 }), { class: InvalidRequestError, status: 400 });
    assert.equal(await state(), now);

    // Keep the last one: the tagged one stays, the newest, and the undo
    // point the sandbox runs from since the rewind; the others are pruned.
    assert.equal(sb.info.snapshot, undo.id);
    const steps = [];
    for (const n of [3, 4, 5]) {
      await sh(`echo ${n} > /dev/shm/counter`);
      steps.push(await sb.checkpoint());
    }
    assert.deepEqual(steps.map((c) => c.seq), [3, 4, 5]);
    const pruned = await sb.setRetention({ keepLast: 1 });
    assert.deepEqual(pruned.retention, { keep_last: 1 });
    assert.deepEqual(pruned.checkpoints.map((c) => c.id), [cp.id, undo.id, steps[2]!.id]);
    for (const gone of [steps[0]!.id, steps[1]!.id]) {
      await rejectsWith(client.getSnapshot(gone), { class: NotFoundError, status: 404 });
    }
    // Once it no longer runs from the undo point, that is pruned too; what
    // is kept still restores exactly.
    await sb.rewind(cp);
    assert.equal(await state(), then);
    const kept = await sb.setRetention({ keepLast: 1 });
    assert.deepEqual(kept.checkpoints.map((c) => c.id), [cp.id, steps[2]!.id]);
    await sb.rewind(steps[2]!);
    assert.equal((await sh("cat /dev/shm/counter")).trim(), "5");
  });
});
