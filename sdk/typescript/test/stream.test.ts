/**
 * Streaming exec (`"stream": true`, NDJSON) against a real daemon. A daemon
 * that predates it refuses the field with a 400: then the SDK must say so
 * with a StreamingUnsupportedError, and the rest is skipped.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  ForkvmError,
  NotFoundError,
  Sandbox,
  StreamingUnsupportedError,
  type Client,
  type ExecEvent,
} from "forkvm";
import { rejectsWith, testClient, VM_TIMEOUT } from "./helpers.js";

let client: Client;
let sb: Sandbox;
let supported = true;

before(async () => {
  client = testClient();
  sb = await Sandbox.create({ client });
  try {
    await sb.execStream(["true"]).wait();
  } catch (err) {
    if (!(err instanceof StreamingUnsupportedError)) throw err;
    supported = false;
  }
});

after(async () => {
  await sb?.close();
  client.close();
});

describe("streaming exec", { timeout: VM_TIMEOUT }, () => {
  test("the daemon supports it, or the SDK says it does not", async (t) => {
    if (supported) return;
    await rejectsWith(sb.execStream("echo hi").wait(), { class: StreamingUnsupportedError, status: 400, code: "invalid_request" });
    t.skip("this daemon predates streaming exec");
  });

  test("events arrive in order while the command runs, then exit", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    const events: { at: number; event: ExecEvent }[] = [];
    const start = Date.now();
    const stream = sb.execStream("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.3; done; exit 5");
    for await (const event of stream) events.push({ at: Date.now() - start, event });
    const text = (type: string): string =>
      events.map(({ event }) => (event.type === type && "text" in event ? event.text : "")).join("");
    assert.equal(text("stdout"), "out1\nout2\nout3\n");
    assert.equal(text("stderr"), "err1\nerr2\nerr3\n");
    const last = events.at(-1)!.event;
    assert.equal(last.type, "exit");
    assert.ok(last.type === "exit");
    assert.equal(last.exitCode, 5);
    assert.equal(last.timedOut, false);
    assert.equal(last.stdoutBytes, 15);
    assert.equal(last.stderrBytes, 15);
    assert.deepEqual(stream.exit, { exitCode: 5, signal: null, timedOut: false, durationMs: last.durationMs, stdoutBytes: 15, stderrBytes: 15 });
    // The first chunk came well before the end: it was streamed, not buffered.
    const first = events.find(({ event }) => event.type === "stdout")!;
    assert.ok(first.at + 400 < events.at(-1)!.at, `first output at ${first.at} ms, exit at ${events.at(-1)!.at} ms`);
  });

  test("onStdout/onStderr callbacks with wait()", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    let out = "";
    let err = "";
    const exit = await sb
      .execStream(["python3", "-c", "import sys; print('to out'); print('to err', file=sys.stderr)"], {
        onStdout: (text) => (out += text),
        onStderr: (text) => (err += text),
      })
      .wait();
    assert.equal(out, "to out\n");
    assert.equal(err, "to err\n");
    assert.equal(exit.exitCode, 0);
  });

  test("exec() with callbacks streams and still returns the whole result", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    const chunks: string[] = [];
    const res = await sb.exec("echo one; sleep 0.2; echo two; exit 2", { onStdout: (text) => chunks.push(text) });
    assert.equal(chunks.join(""), "one\ntwo\n");
    assert.equal(res.stdout, "one\ntwo\n");
    assert.equal(res.exitCode, 2);
    assert.equal(res.stdoutTruncated, false);
    const capped = await sb.exec("head -c 1000 /dev/zero", { onStdout: () => {}, maxOutputBytes: 10, binary: true });
    assert.equal(capped.stdout.byteLength, 10);
    assert.equal(capped.stdoutBytes, 1000);
    assert.equal(capped.stdoutTruncated, true);
  });

  test("bytes are exact, and UTF-8 split across chunks decodes whole", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    const data: Uint8Array[] = [];
    let text = "";
    const script = "import sys,time\nfor b in (b'\\xe2', b'\\x9c', b'\\x93\\x00\\xff'):\n  sys.stdout.buffer.write(b); sys.stdout.flush(); time.sleep(0.1)";
    for await (const event of sb.execStream(["python3", "-c", script])) {
      if (event.type === "stdout") {
        data.push(event.data);
        text += event.text;
      }
    }
    assert.deepEqual([...Buffer.concat(data)], [0xe2, 0x9c, 0x93, 0x00, 0xff]);
    assert.ok(text.startsWith("✓\u0000"), JSON.stringify(text));
  });

  test("stdin, env, cwd and timeout apply", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    let out = "";
    const exit = await sb
      .execStream(["sh", "-c", 'cat; echo " $K $(pwd)"'], { stdin: "in", env: { K: "v" }, cwd: "/tmp", onStdout: (s) => (out += s) })
      .wait();
    assert.equal(out, "in v /tmp\n");
    assert.equal(exit.exitCode, 0);
    const slow = await sb.execStream("sleep 30", { timeoutMs: 300 }).wait();
    assert.equal(slow.timedOut, true);
    assert.equal(slow.signal, 9);
  });

  test("breaking out of the loop closes the stream; the sandbox stays usable", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    const stream = sb.execStream("for i in $(seq 1 50); do echo $i; sleep 0.1; done", { timeoutMs: 10_000 });
    for await (const event of stream) {
      if (event.type === "stdout") break;
    }
    assert.equal(stream.exit, undefined);
    assert.equal((await sb.exec("echo still here")).stdout, "still here\n");
  });

  test("cancel() ends the loop quietly", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    const stream = sb.execStream("for i in $(seq 1 50); do echo $i; sleep 0.1; done", { timeoutMs: 10_000 });
    const seen: string[] = [];
    for await (const event of stream) {
      if (event.type === "stdout") {
        seen.push(event.text);
        await stream.cancel();
      }
    }
    assert.ok(seen.length >= 1);
    assert.equal(stream.exit, undefined);
  });

  test("errors before the stream starts are thrown typed", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    await rejectsWith(sb.execStream(["no-such-program"]).wait(), { class: NotFoundError, status: 404 });
    const ghost = new Sandbox(client, { ...sb.info, id: "sb-000000000000" });
    await rejectsWith(ghost.execStream("true").wait(), { class: NotFoundError, status: 404 });
  });

  test("an error line (the sandbox removed mid-command) is thrown as a ForkvmError", async (t) => {
    if (!supported) return t.skip("no streaming in this daemon");
    const doomed = await Sandbox.create({ client });
    try {
      const stream = doomed.execStream("echo started; sleep 60");
      const seen: string[] = [];
      let started!: () => void;
      const output = new Promise<void>((resolve) => (started = resolve));
      const read = (async () => {
        for await (const event of stream) {
          if (event.type === "stdout") {
            seen.push(event.text);
            started();
          }
        }
      })();
      await Promise.race([output, read]);
      assert.deepEqual(seen, ["started\n"]);
      await client.deleteSandbox(doomed.id);
      await assert.rejects(read, (err: unknown) => {
        assert.ok(err instanceof ForkvmError, String(err));
        assert.ok(err.code.length > 0 && err.message.length > 0);
        return true;
      });
    } finally {
      await doomed.close();
    }
  });
});
