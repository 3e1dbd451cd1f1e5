/**
 * The event stream (`GET /v1/events`) against a real daemon: a cold boot, a
 * diff branch and a delete seen as events, in order; a reconnect with
 * `lastEventId` replays them; a seq the daemon never gave is a `reset`; TCP
 * needs the token. Three VMs in all (one cold boot, two children).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, EventStream, NotFoundError, UnauthorizedError, type api } from "forkvm";
import { env, rejectsWith, testClient, VM_TIMEOUT } from "./helpers.js";

/** A cold boot takes 7-10 s under TCG; on a shared 2-core host, give each step a wide margin. */
const STEP_TIMEOUT_MS = 180_000;

let client: Client;

before(() => {
  client = testClient();
});

after(() => client.close());

/** The first event in `events` (filled by the reader) that `match` accepts, waiting for it. */
async function until(events: api.Event[], match: (e: api.Event) => boolean, what: string): Promise<api.Event> {
  const deadline = Date.now() + STEP_TIMEOUT_MS;
  for (;;) {
    const found = events.find(match);
    if (found) return found;
    if (Date.now() > deadline) {
      assert.fail(`no ${what} within ${STEP_TIMEOUT_MS / 1000} s; the stream had ${JSON.stringify(brief(events))}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const brief = (events: api.Event[]): [number, string, string][] => events.map((e) => [e.seq, e.kind, e.id]);

describe("the event stream", { timeout: VM_TIMEOUT * 2 }, () => {
  test("a cold boot, a diff branch and a delete, as events in order; a reconnect replays them", async () => {
    const stream = await client.events();
    assert.ok(stream instanceof EventStream);
    assert.ok(Number.isInteger(stream.readySeq) && stream.readySeq >= 0);
    const events: api.Event[] = [];
    // Read all the time, so the daemon never finds this reader slow.
    const reader = (async () => {
      for await (const event of stream) events.push(event);
    })();
    const created: string[] = [];
    let snapshotId: string | undefined;
    let point!: api.Event;
    let gone!: api.Event;
    try {
      const sb = (await client.createSandbox({ use_template: false })) as api.Sandbox; // a cold boot
      created.push(sb.id);
      const first = await until(events, (e) => e.id === sb.id, `an event of ${sb.id}`);
      assert.equal(first.kind, "sandbox.created");
      assert.equal(first.sandbox?.id, sb.id);
      assert.ok(first.seq > stream.readySeq);
      const running = await until(
        events,
        (e) => e.kind === "sandbox.updated" && e.id === sb.id && e.sandbox?.state === "running",
        `sandbox.updated of ${sb.id} with state running`,
      );
      assert.ok(running.seq > first.seq && running.sandbox?.timings);

      const branch = await client.branchSandbox(sb.id, { mode: "diff", count: 2 });
      const children = branch.children.map((c) => c.id);
      created.push(...children);
      snapshotId = branch.snapshot.id;
      assert.equal(children.length, 2);
      const done = await until(events, (e) => e.kind === "branch" && e.id === sb.id, `the branch event of ${sb.id}`);
      assert.deepEqual([done.branch?.source, done.branch?.snapshot, done.branch?.mode], [sb.id, snapshotId, "diff"]);
      assert.deepEqual([...(done.branch?.children ?? [])].sort(), [...children].sort());
      assert.ok(done.branch!.pause_ms >= 0 && done.branch!.total_ms >= done.branch!.pause_ms);
      point = await until(events, (e) => e.kind === "snapshot.created" && e.id === snapshotId, `snapshot.created of ${snapshotId}`);
      assert.equal(point.snapshot?.mode, "diff");
      assert.ok(typeof point.snapshot?.pause_ms === "number" && point.snapshot.pause_ms >= 0);
      assert.equal(point.snapshot?.source, sb.id);
      const born = await Promise.all(
        children.map((c) => until(events, (e) => e.kind === "sandbox.created" && e.id === c, `sandbox.created of ${c}`)),
      );
      // The branch point, then its children, then the branch.
      for (const b of born) assert.ok(point.seq < b.seq && b.seq < done.seq, JSON.stringify(brief(events)));

      await client.deleteSandbox(children[0]!);
      gone = await until(events, (e) => e.kind === "sandbox.deleted" && e.id === children[0], `sandbox.deleted of ${children[0]}`);
      assert.ok(gone.seq > done.seq);
      assert.equal(gone.sandbox, undefined);
      assert.ok(stream.lastSeq >= gone.seq);
    } finally {
      await stream.close();
      await reader; // the loop ends quietly on close()
      for (const id of created.reverse()) await client.deleteSandbox(id).catch((err: unknown) => assert.ok(err instanceof NotFoundError));
      if (snapshotId) await client.deleteSnapshot(snapshotId, { force: true }).catch(() => {});
    }

    // Seqs increase by one per event, with nothing missed.
    assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => stream.readySeq + 1 + i));

    // A reconnect after the branch point's event gets the later ones again, the same and in order.
    const later = events.filter((e) => e.seq > point.seq && e.seq <= gone.seq);
    await using again = await client.events({ lastEventId: point.seq });
    assert.ok(again.readySeq >= gone.seq);
    assert.equal(again.lastSeq, point.seq);
    const replayed: api.Event[] = [];
    for await (const event of again) {
      assert.notEqual(event.kind, "reset");
      replayed.push(event);
      if (event.seq >= gone.seq) break;
    }
    assert.deepEqual(brief(replayed), brief(later));
    assert.deepEqual(replayed.at(-1), gone);
  });

  test("a seq the daemon never gave is a reset", async () => {
    let future: number;
    {
      await using first = await client.events();
      future = first.readySeq + 1_000_000;
    }
    await using stream = await client.events({ lastEventId: future });
    assert.equal(stream.lastSeq, future);
    for await (const event of stream) {
      assert.deepEqual([event.kind, event.id], ["reset", ""]);
      break;
    }
    await assert.rejects(stream[Symbol.asyncIterator]().next(), /only once/);
  });

  test("over TCP the stream needs the token", async (t) => {
    if (!env.tcpUrl || !env.token) return t.skip("this daemon serves no TCP with a token");
    const tcp = new Client({ url: env.tcpUrl, token: env.token });
    const stranger = new Client({ url: env.tcpUrl, token: "not-the-token" });
    try {
      // Over fetch: the reset arrives, then the stream idles, and close() ends the loop waiting on it.
      const stream = await tcp.events({ lastEventId: 1_000_000_000 });
      assert.ok(stream.readySeq >= 0);
      const seen: api.Event[] = [];
      const loop = (async () => {
        for await (const event of stream) seen.push(event);
      })();
      await until(seen, (e) => e.kind === "reset", "reset over TCP");
      await stream.close();
      await loop;
      assert.deepEqual(brief(seen), [[stream.readySeq, "reset", ""]]);
      await rejectsWith(stranger.events(), { class: UnauthorizedError, status: 401 });
    } finally {
      tcp.close();
      stranger.close();
    }
  });
});
