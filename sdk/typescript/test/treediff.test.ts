/**
 * Diff and merge against a real daemon and real microVMs: a sandbox branched
 * into two children that each edit a small project. The first child's
 * changes are diffed exactly (with a patch) and merged into the source,
 * after which the two agree; the second conflicts with them, so its merge is
 * refused whole with a `ConflictError` naming the path and the source is
 * unchanged, a dry run lists the conflicts, and strategies `text` and
 * `theirs` settle them.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, ConflictError, InvalidRequestError, NotFoundError, Sandbox, type Snapshot } from "forkvm";
import { rejectsWith, testClient, VM_TIMEOUT } from "./helpers.js";

const PROJ = "/root/proj";
const NOTES = "/root/notes";

let client: Client;
let source: Sandbox;
const cleanup: { children: Sandbox[]; snapshot?: Snapshot } = { children: [] };

before(async () => {
  client = testClient();
  source = await Sandbox.create({ client, timeout: 900 });
});

after(async () => {
  await Promise.allSettled(cleanup.children.map((c) => c.close()));
  await cleanup.snapshot?.delete({ force: true }).catch(() => {});
  await source?.close();
  client.close();
});

async function sh(sb: Sandbox, cmd: string): Promise<string> {
  const r = await sb.exec(cmd);
  assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
}

describe("diff and merge", { timeout: VM_TIMEOUT }, () => {
  test("diff a child, merge it, refuse a conflicting one, settle it with text and theirs", async () => {
    await sh(
      source,
      `mkdir -p ${PROJ} ${NOTES} && cd ${PROJ} && printf 'one\\ntwo\\nthree\\nfour\\nfive\\n' > a.txt` +
        ` && echo bye > b.txt && echo keep > keep.sh && echo base > ${NOTES}/c.txt`,
    );
    const branch = await source.branch({ count: 2 });
    cleanup.children.push(...branch.children);
    cleanup.snapshot = branch.snapshot;
    const [winner, other] = branch.children as [Sandbox, Sandbox];
    await sh(winner, `cd ${PROJ} && sed -i s/one/ONE/ a.txt && echo hi > new.txt && rm b.txt && chmod 755 keep.sh`);
    await sh(other, `sed -i s/five/FIVE/ ${PROJ}/a.txt && echo other > ${NOTES}/c.txt`);
    await sh(source, `echo source > ${NOTES}/c.txt`);

    const d = await source.diff(winner, { path: PROJ, text: true });
    assert.deepEqual([d.a, d.b, d.path], [source.id, winner.id, PROJ]);
    assert.deepEqual(
      d.changes.map((c) => [c.path, c.change]),
      [
        [`${PROJ}/a.txt`, "modified"],
        [`${PROJ}/b.txt`, "deleted"],
        [`${PROJ}/keep.sh`, "mode"],
        [`${PROJ}/new.txt`, "added"],
      ],
    );
    assert.deepEqual(d.stats, { added: 1, deleted: 1, modified: 1, other: 1 });
    const a = d.changes[0]!;
    assert.ok(a.patch?.includes("-one") && a.patch.includes("+ONE"), JSON.stringify(a));
    assert.deepEqual([d.changes[2]!.a?.mode, d.changes[2]!.b?.mode], [0o644, 0o755]);
    assert.ok(!d.changes[3]!.a && !d.changes[1]!.b);
    // Without text, no patches; from the branch point (read through a clone) the same paths.
    assert.ok((await source.diff(winner.id, { path: PROJ })).changes.every((c) => c.patch == null));
    const fromPoint = await client.diff(branch.snapshot.id, { b: winner.id, path: PROJ });
    assert.deepEqual(fromPoint.changes.map((c) => c.path), d.changes.map((c) => c.path));

    // The winner merges cleanly: afterwards the source has its files.
    const m = await winner.mergeInto(source, { path: PROJ });
    assert.equal(m.dry_run, false);
    assert.equal(m.base, branch.snapshot.id);
    assert.deepEqual(m.applied.map((c) => c.path).sort(), d.changes.map((c) => c.path));
    assert.deepEqual([m.settled, m.conflicts], [[], []]);
    assert.deepEqual((await source.diff(winner, { path: PROJ })).changes, []);

    // The other conflicts on a.txt and the note: refused whole, nothing changes.
    const both = `cat ${PROJ}/a.txt ${NOTES}/c.txt`;
    const before = await sh(source, both);
    const refused = await rejectsWith(other.mergeInto(source, { path: "/root" }), { class: ConflictError, status: 409 });
    assert.ok(refused.message.includes(`${PROJ}/a.txt`) && refused.message.includes(`${NOTES}/c.txt`), refused.message);
    assert.equal(await sh(source, both), before);
    const plan = await other.mergeInto(source, { path: "/root", dryRun: true });
    assert.ok(plan.dry_run);
    assert.deepEqual(plan.conflicts.map((c) => c.path), [`${NOTES}/c.txt`, `${PROJ}/a.txt`]);
    assert.ok(plan.conflicts.every((c) => c.reason.length > 0));
    assert.equal(await sh(source, both), before);

    // Line by line both edits of a.txt are kept; the one-line note cannot be.
    const still = await rejectsWith(other.mergeInto(source, { path: "/root", strategy: "text" }), {
      class: ConflictError,
      status: 409,
    });
    assert.ok(still.message.includes(`${NOTES}/c.txt`) && !still.message.includes(`${PROJ}/a.txt`), still.message);
    const text = await other.mergeInto(source, { path: PROJ, strategy: "text" });
    assert.deepEqual(text.settled.map((c) => c.path), [`${PROJ}/a.txt`]);
    assert.equal(await sh(source, `cat ${PROJ}/a.txt`), "ONE\ntwo\nthree\nfour\nFIVE\n");
    const theirs = await other.mergeInto(source, { path: NOTES, strategy: "theirs" });
    assert.deepEqual(theirs.settled.map((c) => c.path), [`${NOTES}/c.txt`]);

    // Bad input: into itself, into one that does not exist, a relative path.
    await rejectsWith(winner.mergeInto(winner), { class: InvalidRequestError, status: 400 });
    await rejectsWith(winner.mergeInto("sb-nosuch"), { class: NotFoundError, status: 404 });
    await rejectsWith(source.diff(winner, { path: "root" }), { class: InvalidRequestError, status: 400 });
    assert.equal(await sh(source, both), "ONE\ntwo\nthree\nfour\nFIVE\nother\n");
  });
});
