/**
 * Diff and merge without a daemon: the requests `Sandbox.diff` and
 * `Sandbox.mergeInto` send (a transport that answers from a table here), and
 * a refused merge as a `ConflictError` with the daemon's message, naming the
 * paths. test/treediff.test.ts runs them on VMs.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Client, ConflictError, Sandbox, type api, type MergeConflict, type Transport, type TransportRequest, type TransportResponse } from "forkvm";
import { rejectsWith } from "./helpers.js";

const SANDBOX = (id: string): api.Sandbox => ({
  id,
  state: "running",
  image: "default",
  memory_mib: 512,
  cpus: 1,
  accel: "tcg",
  created_at: "2026-11-26T03:00:00Z",
});
const FILE: api.PathState = { kind: "file", size: 6, mode: 0o644 };
const CHANGE: api.PathChange = { path: "/root/a.txt", change: "modified", a: FILE, b: { ...FILE, size: 9 } };
const DIFF: api.Diff = {
  a: "sb-1",
  b: "sb-2",
  path: "/",
  changes: [CHANGE],
  stats: { added: 0, deleted: 0, modified: 1, other: 0 },
  entries: 40,
  contents_read: 1,
  diff_ms: 12.5,
};
const CONFLICT: MergeConflict = { path: "/root/a.txt", base: FILE, ours: FILE, theirs: FILE, reason: "both changed its content" };
const REFUSED = "1 conflict(s), nothing was changed: /root/a.txt (both changed its content); settle them with a strategy";

/** Answers diffs and merges (a merge without a strategy or a dry run conflicts), and records each request. */
class TableTransport implements Transport {
  readonly url = "table://";
  requests: TransportRequest[] = [];
  async request(req: TransportRequest): Promise<TransportResponse> {
    this.requests.push(req);
    const { status, body } = this.#reply(req);
    const bytes = new TextEncoder().encode(body);
    return {
      status,
      header: (name) => (name.toLowerCase() === "content-type" ? "application/json" : null),
      body: async function* () {
        yield bytes;
      },
      bytes: async () => bytes,
      cancel: () => {},
    };
  }
  close(): void {}
  sent(): [string, string, unknown][] {
    return this.requests.map((r) => [r.method, r.path, r.body === undefined ? undefined : JSON.parse(String(r.body))]);
  }

  #reply(req: TransportRequest): { status: number; body: string } {
    if (req.path.startsWith("/v1/diff/")) return { status: 200, body: JSON.stringify(DIFF) };
    const body = JSON.parse(String(req.body)) as api.MergeRequest;
    if (!body.strategy && !body.dry_run) {
      return { status: 409, body: JSON.stringify({ error: { code: "conflict", message: REFUSED } }) };
    }
    const merged: api.Merged = {
      child: "sb-2",
      into: body.into,
      base: "sn-0",
      applied: [CHANGE],
      settled: body.strategy ? [CONFLICT] : [],
      conflicts: body.dry_run ? [CONFLICT] : [],
      dry_run: body.dry_run ?? false,
      merge_ms: 20,
    };
    return { status: 200, body: JSON.stringify(merged) };
  }
}

describe("diff and merge requests", () => {
  test("Sandbox.diff and Sandbox.mergeInto send what they are given, and only that", async () => {
    const transport = new TableTransport();
    const client = new Client({ transport });
    const sb = new Sandbox(client, SANDBOX("sb-1"));
    const child = new Sandbox(client, SANDBOX("sb-2"));
    const d = await sb.diff(child);
    assert.deepEqual(d, DIFF);
    await sb.diff("good one", { path: "/root", text: true });
    await client.diff("sn-1", { b: "sb-1" });
    const refused = await rejectsWith(child.mergeInto(sb), { class: ConflictError, status: 409, code: "conflict" });
    assert.match(refused.message, /\/root\/a\.txt \(both changed its content\)/);
    const plan = await child.mergeInto("sb-1", { path: "/root", dryRun: true });
    assert.ok(plan.dry_run);
    assert.deepEqual(plan.conflicts, [CONFLICT]);
    const theirs = await child.mergeInto(sb, { strategy: "theirs" });
    assert.deepEqual(theirs.settled.map((c) => c.path), ["/root/a.txt"]);
    await client.merge("sb-2", { into: "sb-1", strategy: "text" });
    assert.deepEqual(transport.sent(), [
      ["POST", "/v1/diff/sb-1", { b: "sb-2" }],
      ["POST", "/v1/diff/sb-1", { b: "good one", path: "/root", text: true }],
      ["POST", "/v1/diff/sn-1", { b: "sb-1" }],
      ["POST", "/v1/sandboxes/sb-2/merge", { into: "sb-1" }],
      ["POST", "/v1/sandboxes/sb-2/merge", { into: "sb-1", path: "/root", dry_run: true }],
      ["POST", "/v1/sandboxes/sb-2/merge", { into: "sb-1", strategy: "theirs" }],
      ["POST", "/v1/sandboxes/sb-2/merge", { into: "sb-1", strategy: "text" }],
    ]);
  });
});
