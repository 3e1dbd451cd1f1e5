/**
 * examples/quickstart.ts end to end: compiled, run with `forkvm` resolved to
 * this package (as an installed user would have it), against the daemon
 * under test. It must leave nothing behind.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { promisify } from "node:util";
import { compileExample } from "./example.js";
import { testClient, VM_TIMEOUT } from "./helpers.js";

const run = promisify(execFile);

test("examples/quickstart.ts runs end to end", { timeout: VM_TIMEOUT }, async () => {
  const script = compileExample("quickstart");

  const client = testClient();
  const before = new Set((await client.listSandboxes()).sandboxes.map((s) => s.id));
  const snapshotsBefore = new Set((await client.listSnapshots()).snapshots.map((s) => s.id));

  const { stdout, stderr } = await run(process.execPath, [script], {
    env: process.env,
    timeout: VM_TIMEOUT,
  });
  assert.equal(stderr, "");
  const lines = stdout.trim().split("\n");
  assert.match(lines[0]!, /^sandbox sb-\w+ is running$/);
  assert.match(stdout, /sandbox: Python 3\.\d+/);
  assert.match(stdout, /sandbox: setup\n/);
  assert.match(stdout, /branched into 2 children/);
  assert.match(stdout, /child sb-\w+: setup -> try-plan-a\n/);
  assert.match(stdout, /child sb-\w+: setup -> try-plan-b\n/);
  assert.match(stdout, /sandbox: setup -> source-goes-on\n/);
  assert.equal(lines.at(-1), "done");

  // Cleaned up: no sandbox or snapshot of its own is left.
  const left = (await client.listSandboxes()).sandboxes.filter((s) => !before.has(s.id));
  assert.deepEqual(left, []);
  const leftSnapshots = (await client.listSnapshots()).snapshots.filter((s) => !snapshotsBefore.has(s.id) && !s.template);
  assert.deepEqual(leftSnapshots, []);
  client.close();
});
