/**
 * Reaching the daemon: TCP with fetch and a bearer token (right, wrong,
 * missing), the unix socket (URL forms and FORKVM_HOME), unreachable
 * daemons and aborted requests.
 */
import assert from "node:assert/strict";
import { dirname } from "node:path";
import { after, describe, test } from "node:test";
import {
  Client,
  ConnectionError,
  defaultClient,
  FetchTransport,
  parseEndpoint,
  Sandbox,
  setDefaultClient,
  UnauthorizedError,
  UnixSocketTransport,
} from "forkvm";
import { env, rejectsWith, VM_TIMEOUT } from "./helpers.js";

const clients: Client[] = [];
function track(client: Client): Client {
  clients.push(client);
  return client;
}
after(() => clients.forEach((c) => c.close()));

/** Run `fn` with some environment variables replaced. */
async function withEnv<T>(vars: Record<string, string | undefined>, fn: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const apply = (values: Record<string, string | undefined>): void => {
    for (const [k, v] of Object.entries(values)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
  apply(vars);
  try {
    return await fn();
  } finally {
    apply(saved);
  }
}

describe("parseEndpoint", () => {
  test("the URL forms the CLI accepts", () => {
    assert.deepEqual(parseEndpoint("unix:///run/f.sock"), { kind: "unix", socketPath: "/run/f.sock" });
    assert.deepEqual(parseEndpoint("unix:/run/f.sock"), { kind: "unix", socketPath: "/run/f.sock" });
    assert.deepEqual(parseEndpoint("/run/f.sock"), { kind: "unix", socketPath: "/run/f.sock" });
    assert.deepEqual(parseEndpoint("http://127.0.0.1:7070"), { kind: "http", baseUrl: "http://127.0.0.1:7070" });
    assert.deepEqual(parseEndpoint("https://forkvm.example"), { kind: "http", baseUrl: "https://forkvm.example" });
  });

  test("bad URLs are refused with a hint", () => {
    assert.throws(() => parseEndpoint("unix://relative.sock"), /unix:\/\/\/absolute/);
    assert.throws(() => parseEndpoint("ftp://x"), TypeError);
    assert.throws(() => new Client({ url: "localhost:7070" }), /http:\/\/HOST:PORT/);
  });

  test("the default socket is $FORKVM_HOME/forkvm.sock, else /var/lib/forkvm/forkvm.sock", async () => {
    await withEnv({ FORKVM_URL: undefined, FORKVM_HOME: "/srv/fvm" }, async () => {
      assert.equal(new Client().url, "unix:///srv/fvm/forkvm.sock");
    });
    await withEnv({ FORKVM_URL: undefined, FORKVM_HOME: undefined }, async () => {
      assert.equal(new Client().url, "unix:///var/lib/forkvm/forkvm.sock");
      assert.equal(new Client({ home: "/h" }).url, "unix:///h/forkvm.sock");
    });
    await withEnv({ FORKVM_URL: "http://10.0.0.1:1" }, async () => {
      assert.ok(new Client().transport instanceof FetchTransport);
      assert.equal(new Client({ url: "/x.sock" }).url, "unix:///x.sock");
    });
  });
});

describe("TCP (fetch) with a bearer token", { skip: env.tcpUrl ? false : "no TCP endpoint (FORKVM_TEST_TCP_URL)" }, () => {
  test("the right token: health, info and a sandbox round trip", { timeout: VM_TIMEOUT }, async () => {
    const client = track(new Client({ url: env.tcpUrl, token: env.token }));
    assert.ok(client.transport instanceof FetchTransport);
    assert.equal((await client.health()).status, "ok");
    assert.ok((await client.info()).images.length > 0);
    await using sb = await Sandbox.create({ client });
    assert.equal((await sb.exec("echo over tcp")).stdout, "over tcp\n");
    await sb.files.write("/tmp/tcp", new Uint8Array([1, 2, 3]));
    assert.deepEqual([...(await sb.files.read("/tmp/tcp"))], [1, 2, 3]);
    let streamed = "";
    try {
      await sb.execStream("echo streamed", { onStdout: (s) => (streamed += s) }).wait();
      assert.equal(streamed, "streamed\n");
    } catch (err) {
      // A daemon without streaming exec: covered by stream.test.ts.
      assert.equal((err as Error).name, "StreamingUnsupportedError");
    }
  });

  test("the token comes from FORKVM_TOKEN", async () => {
    await withEnv({ FORKVM_URL: env.tcpUrl, FORKVM_TOKEN: env.token }, async () => {
      assert.equal((await track(new Client()).health()).status, "ok");
    });
  });

  test("a wrong token is a 401 UnauthorizedError", async () => {
    const client = track(new Client({ url: env.tcpUrl, token: "not-the-token" }));
    await rejectsWith(client.info(), { class: UnauthorizedError, status: 401, code: "unauthorized", message: /token/ });
    await rejectsWith(client.listSandboxes(), { class: UnauthorizedError, status: 401 });
  });

  test("no token is a 401 too", async () => {
    await withEnv({ FORKVM_TOKEN: undefined }, async () => {
      const client = track(new Client({ url: env.tcpUrl }));
      await rejectsWith(client.health(), { class: UnauthorizedError, status: 401, code: "unauthorized" });
    });
  });
});

describe("unix socket (node:http)", { skip: env.socket ? false : "no unix socket (FORKVM_TEST_SOCKET)" }, () => {
  test("unix:// URL, bare path, home and FORKVM_HOME all reach the daemon", async () => {
    const socket = env.socket!;
    for (const client of [
      new Client({ url: `unix://${socket}` }),
      new Client({ url: socket }),
    ]) {
      track(client);
      assert.ok(client.transport instanceof UnixSocketTransport);
      assert.equal((await client.health()).status, "ok");
    }
    await withEnv({ FORKVM_URL: undefined, FORKVM_HOME: dirname(socket) }, async () => {
      const byHome = track(new Client({ home: dirname(socket) }));
      assert.equal((await byHome.health()).status, "ok");
      setDefaultClient(undefined);
      try {
        assert.equal(defaultClient().url, `unix://${socket}`);
        assert.equal((await defaultClient().health()).status, "ok");
      } finally {
        defaultClient().close();
        setDefaultClient(undefined);
      }
    });
  });

  test("a token is harmless on the socket", async () => {
    const client = track(new Client({ url: `unix://${env.socket}`, token: "ignored" }));
    assert.equal((await client.health()).status, "ok");
  });
});

describe("unreachable daemons and aborts", () => {
  test("a missing socket is a ConnectionError (status 0) that says what to do", async () => {
    const client = track(new Client({ url: "unix:///nonexistent/forkvm.sock" }));
    await rejectsWith(client.health(), { class: ConnectionError, status: 0, code: "connection_failed", message: /forkvm serve/ });
  });

  test("a closed TCP port is a ConnectionError", async () => {
    const client = track(new Client({ url: "http://127.0.0.1:1", token: "x" }));
    await rejectsWith(client.health(), { class: ConnectionError, status: 0 });
  });

  test("an aborted request rejects with an AbortError", async () => {
    const url = env.socket ? `unix://${env.socket}` : env.url;
    const client = track(new Client({ url, token: env.token }));
    await assert.rejects(client.health({ signal: AbortSignal.abort() }), { name: "AbortError" });
    if (env.tcpUrl) {
      const tcp = track(new Client({ url: env.tcpUrl, token: env.token }));
      await assert.rejects(tcp.health({ signal: AbortSignal.abort() }), { name: "AbortError" });
    }
  });
});
