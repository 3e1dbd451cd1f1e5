/**
 * Background processes (`sb.processes`, `Client.startProcess`…) against a real
 * daemon: start, list, attach (replayed output, then the end), stdin and its
 * end-of-file, signals, kill, a PTY (output, typing, resize), a streamed
 * start, and the errors. One sandbox for the file. See docs/processes.md.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InvalidRequestError,
  NotFoundError,
  ProcessStream,
  Sandbox,
  SandboxProcess,
  signalNumber,
  type Client,
  type ProcessStreamEvent,
} from "forkvm";
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

/** Read `stream` until its output holds `needle`, then close it; resolve with the output. */
async function until(stream: ProcessStream, needle: string): Promise<string> {
  for await (const event of stream) {
    if (event.type !== "start" && event.type !== "end" && stream.text.includes(needle)) break;
  }
  return stream.text;
}

describe("background processes", { timeout: VM_TIMEOUT }, () => {
  test("start, list, attach: the output replayed, then the end", async () => {
    const tag = uniqueTag("ts");
    const p = await sb.processes.start("echo one; echo two >&2; sleep 1; echo three; exit 3", { tag });
    assert.ok(p instanceof SandboxProcess && p.pid > 0);
    assert.equal(p.tag, tag);
    const listed = (await sb.processes.list()).find((x) => x.pid === p.pid);
    if (listed) assert.deepEqual([listed.tag, listed.argv[0]], [tag, "/bin/sh"]);

    const stream = sb.processes.attach(tag);
    const events: ProcessStreamEvent[] = [];
    for await (const event of stream) events.push(event);
    assert.deepEqual(events[0], { type: "start", pid: p.pid });
    assert.equal(stream.pid, p.pid);
    const end = events.at(-1)!;
    assert.ok(end.type === "end");
    assert.deepEqual([end.exitCode, end.exited, end.status, end.signal], [3, true, "exit status 3", null]);
    assert.equal(Buffer.from(stream.stdout).toString(), "one\nthree\n");
    assert.equal(Buffer.from(stream.stderr).toString(), "two\n");
    // Ended: no longer listed, but a late attach replays it all.
    assert.ok(!(await sb.processes.list()).some((x) => x.pid === p.pid));
    const again = p.attach();
    assert.equal((await again.wait()).exitCode, 3);
    assert.equal(Buffer.from(again.stdout).toString(), "one\nthree\n");
  });

  test("stdin, then closing it: cat sees end-of-file", async () => {
    const tag = uniqueTag("cat");
    const p = await sb.processes.start(["cat"], { tag, stdin: true });
    await sb.processes.sendStdin(tag, "hello ");
    await p.sendStdin(new Uint8Array([0, 0x77, 0x6f, 0x72, 0x6c, 0x64, 0x0a]));
    assert.match(await until(p.attach(), "world"), /world/);
    await p.closeStdin();
    const stream = p.attach();
    const end = await stream.wait();
    assert.equal(end.exitCode, 0);
    assert.deepEqual(Buffer.from(stream.stdout), Buffer.from("hello \0world\n"));
  });

  test("signals by name and number, and kill", async () => {
    const tag = uniqueTag("sleep");
    const p = await sb.processes.start(["sleep", "1000"], { tag });
    await sb.processes.signal(tag, "INT");
    const end = await p.wait();
    assert.deepEqual([end.exited, end.signal, end.exitCode], [false, 2, -1]);
    const q = await sb.processes.start(["sleep", "1000"]);
    assert.equal(q.tag, null);
    await q.signal("SIGTERM");
    assert.equal((await q.wait()).signal, 15);
    const r = await sb.processes.start(["sleep", "1000"]);
    assert.ok((await sb.processes.list()).some((x) => x.pid === r.pid));
    await r.kill();
    assert.equal((await r.wait()).signal, 9);
    assert.equal(signalNumber("term"), 15);
    assert.throws(() => signalNumber("NOPE"), /unknown signal/);
  });

  test("a PTY: output arrives, typing, resize", async () => {
    const tag = uniqueTag("tty");
    const p = await sb.processes.start(["sh"], { tag, pty: { cols: 80, rows: 24 } });
    const listed = (await sb.processes.list()).find((x) => x.pid === p.pid);
    assert.deepEqual(listed?.pty, { cols: 80, rows: 24 });
    await p.sendStdin("stty size\n");
    assert.match(await until(p.attach(), "24 80"), /24 80/);
    await sb.processes.resize(tag, 100, 40);
    await p.sendStdin("stty size\n");
    const stream = p.attach();
    assert.match(await until(stream, "40 100"), /40 100/);
    assert.ok(stream.pty.length > 0 && stream.stdout.length === 0);
    await rejectsWith(p.closeStdin(), { class: InvalidRequestError, status: 400 });
    await rejectsWith(p.resize(0, 40), { class: InvalidRequestError, status: 400 });
    await p.sendStdin("exit 5\n");
    assert.equal((await p.wait()).exitCode, 5);
  });

  test("a streamed start, and the errors", async () => {
    const stream = sb.processes.run("echo streamed; echo oops >&2; exit 3");
    const end = await stream.wait();
    assert.equal(end.exitCode, 3);
    assert.ok(stream.pid !== undefined && stream.pid > 0);
    assert.equal(Buffer.from(stream.stdout).toString(), "streamed\n");
    assert.equal(Buffer.from(stream.stderr).toString(), "oops\n");

    await rejectsWith(sb.processes.attach("no-such-tag").wait(), { class: NotFoundError, status: 404, message: /list the running processes of sandbox/ });
    const missing = await sb.processes.attach("no-such-tag").wait().then(
      () => assert.fail("attached"),
      (err: unknown) => err as NotFoundError,
    );
    assert.deepEqual(missing.hint, { action: "list_processes", target: sb.id });
    await rejectsWith(sb.processes.kill(999999), { class: NotFoundError, status: 404 });
    await rejectsWith(sb.processes.start(["true"], { tag: "bad tag!" }), { class: InvalidRequestError, status: 400 });
    const noExe = await sb.processes.start(["no-such-program-here"]).then(
      () => assert.fail("started"),
      (err: unknown) => err as Error,
    );
    assert.match(noExe.message, /no-such-program-here/);
    const p = await sb.processes.start(["sleep", "100"]);
    try {
      await rejectsWith(p.sendStdin("x"), { class: InvalidRequestError, status: 400 });
    } finally {
      await p.kill();
    }
  });

  test("the Client's operations", async () => {
    const tag = uniqueTag("client");
    const started = await client.startProcess(sb.id, { argv: ["sh", "-c", "cat; echo done"], tag, stdin: true });
    assert.equal(started.tag, tag);
    assert.ok((await client.listProcesses(sb.id)).processes.some((x) => x.tag === tag));
    await client.writeStdin(sb.id, tag, "abc");
    await client.closeStdin(sb.id, started.pid);
    let out = "";
    for await (const frame of client.attachProcess(sb.id, started.pid)) {
      if (frame.type === "stdout") out += Buffer.from(frame.data, "base64").toString();
      if (frame.type === "end") assert.equal(frame.exit_code, 0);
    }
    assert.equal(out, "abcdone\n");
  });
});
