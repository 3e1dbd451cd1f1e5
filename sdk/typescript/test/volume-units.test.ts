/**
 * Volumes without a daemon: the `SOURCE:GUEST_PATH[:OPTIONS]` parser (the
 * rules of the Rust `VolumeMount::parse`), volume specs, `volumes` in spawn
 * requests, and the named-volume operations (a transport that answers from a
 * table here).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  Client,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  parseVolume,
  Sandbox,
  Snapshot,
  volumeMount,
  volumeMounts,
  type api,
  type Transport,
  type TransportRequest,
  type TransportResponse,
} from "forkvm";
import { rejectsWith } from "./helpers.js";

const VOLUME: api.Volume = { name: "scratch", path: "/var/lib/forkvm/volumes/scratch", created_at: "2026-11-26T03:00:00Z" };

const SANDBOX: api.Sandbox = {
  id: "sb-1",
  state: "running",
  image: "default",
  memory_mib: 512,
  cpus: 1,
  accel: "tcg",
  created_at: "2026-11-26T03:00:00Z",
  volumes: [
    { source: "/srv/repo", path: "/work", read_only: true, mode: "shared", host_path: "/srv/repo" },
    { source: "scratch", path: "/scratch", read_only: false, mode: "copy", uid: 1000, host_path: "/h/volume-data/sb-1/1" },
  ],
};

const SNAPSHOT = { id: "snap-1" } as api.Snapshot;

/** Answers each request from a table of volume and sandbox replies, and records it. */
class TableTransport implements Transport {
  readonly url = "table://";
  requests: TransportRequest[] = [];
  async request(req: TransportRequest): Promise<TransportResponse> {
    this.requests.push(req);
    const { status, body } = this.#reply(req);
    const bytes = new TextEncoder().encode(body);
    return {
      status,
      header: (name) => (name.toLowerCase() === "content-type" && body ? "application/json" : null),
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
    const error = (status: number, code: string, message: string) => ({
      status,
      body: JSON.stringify({ error: { code, message } }),
    });
    if (req.path === "/v1/volumes" && req.method === "GET") {
      return { status: 200, body: JSON.stringify({ volumes: [{ ...VOLUME, used_by: ["sb-1"] }] }) };
    }
    if (req.path === "/v1/volumes") {
      const { name } = JSON.parse(String(req.body)) as api.CreateVolume;
      if (name === "taken") return error(409, "conflict", "volume taken exists");
      return { status: 201, body: JSON.stringify({ ...VOLUME, name }) };
    }
    if (req.path.endsWith("/busy")) return error(409, "conflict", "mounted by sb-1");
    if (req.path.endsWith("/nope")) return error(404, "not_found", "there is no volume nope");
    if (req.path.startsWith("/v1/volumes/")) return { status: 204, body: "" };
    if (String(req.body).includes('"/proc"')) return error(403, "invalid_request", "refused");
    if (String(req.body).includes('"count"')) return { status: 200, body: JSON.stringify({ sandboxes: [SANDBOX], total_ms: 1 }) };
    return { status: 200, body: JSON.stringify(SANDBOX) };
  }
}

describe("parseVolume", () => {
  test("reads the CLI form", () => {
    assert.deepEqual(parseVolume("/srv/repo:/work"), { source: "/srv/repo", path: "/work", read_only: false, mode: "shared" });
    assert.deepEqual(parseVolume("data:/data:ro,copy,uid=1000,gid=100"), {
      source: "data",
      path: "/data",
      read_only: true,
      mode: "copy",
      uid: 1000,
      gid: 100,
    });
  });

  test("later options win; empty ones are skipped; numbers fit a u32", () => {
    assert.deepEqual(parseVolume("/a:/b:ro,rw,copy,shared,,uid=1,uid=+2"), {
      source: "/a",
      path: "/b",
      read_only: false,
      mode: "shared",
      uid: 2,
    });
    assert.deepEqual(parseVolume("/a:/b:"), { source: "/a", path: "/b", read_only: false, mode: "shared" });
    assert.equal(parseVolume("/a:/b:gid=4294967295").gid, 4294967295);
    // Only two colons split: the rest is options (as Rust's splitn(3, ':')).
    assert.throws(() => parseVolume("/a:/b:c:ro"), /unknown volume option "c:ro"/);
  });

  test("refuses bad forms", () => {
    const bad = ["", "/a", ":/b", "/a:", "/a:/b:rx", "/a:/b:uid=x", "/a:/b:uid=", "/a:/b:gid=-1", "/a:/b:uid=4294967296"];
    for (const spec of [...bad, "/a:/b:uid= 1", "/a:/b:uid=1_000", "/a:/b:uid=1e3", "/a:/b:uid=0x10", "/a:/b:RO", "/a:/b:uid"]) {
      assert.throws(() => parseVolume(spec), /SOURCE:GUEST_PATH\[:OPTIONS\]/, spec);
    }
    assert.throws(() => parseVolume("/a"), /^TypeError: bad volume "\/a"/);
    assert.throws(() => parseVolume("/a:/b:rx"), /unknown volume option "rx" in "\/a:\/b:rx"/);
    assert.throws(() => parseVolume("/a:/b:uid=x"), /bad volume option "uid=x" in "\/a:\/b:uid=x"/);
    assert.throws(() => parseVolume(undefined as unknown as string), TypeError);
  });
});

describe("volume specs", () => {
  test("strings, objects and a sandbox's mounted volumes", () => {
    const want = { source: "/srv/repo", path: "/work", read_only: true, mode: "shared" };
    assert.deepEqual(volumeMount("/srv/repo:/work:ro"), want);
    assert.deepEqual(volumeMount({ source: "/srv/repo", path: "/work", read_only: true }), { source: "/srv/repo", path: "/work", read_only: true });
    assert.deepEqual(volumeMount(SANDBOX.volumes![0]!), want, "host_path is not part of a request");
    assert.deepEqual(volumeMounts(["/a:/b", { source: "/c", path: "/d" }]), [
      { source: "/a", path: "/b", read_only: false, mode: "shared" },
      { source: "/c", path: "/d" },
    ]);
    assert.throws(() => volumeMount({ source: "/a" } as api.VolumeMount), TypeError);
    assert.throws(() => volumeMount(42 as unknown as string), TypeError);
    assert.throws(() => volumeMounts("/a:/b" as unknown as string[]), /must be an array/);
  });

  test("a sandbox's volumes", () => {
    const sb = new Sandbox(new Client({ transport: new TableTransport() }), SANDBOX);
    assert.deepEqual(sb.volumes.map((v) => [v.path, v.mode, v.host_path]), [
      ["/work", "shared", "/srv/repo"],
      ["/scratch", "copy", "/h/volume-data/sb-1/1"],
    ]);
    assert.deepEqual(new Sandbox(sb.client, { ...SANDBOX, volumes: undefined }).volumes, []);
  });
});

describe("volumes in requests", () => {
  test("the low-level createSandbox takes the strings too", async () => {
    const transport = new TableTransport();
    const client = new Client({ transport });
    await client.createSandbox({ volumes: ["/a:/b:ro", { source: "v", path: "/v", uid: 1 }] });
    await client.createSandbox({ volumes: null, image: "default" });
    await assert.rejects(client.createSandbox({ volumes: ["/a:/b:bad"] }), /unknown volume option "bad"/);
    assert.deepEqual(transport.sent(), [
      ["POST", "/v1/sandboxes", { volumes: [{ source: "/a", path: "/b", read_only: true, mode: "shared" }, { source: "v", path: "/v", uid: 1 }] }],
      ["POST", "/v1/sandboxes", { volumes: null, image: "default" }],
    ]);
  });

  test("create, spawn and the named-volume operations", async () => {
    const transport = new TableTransport();
    const client = new Client({ transport });
    const { volumes } = await client.listVolumes();
    assert.deepEqual(volumes.map((v) => [v.name, v.used_by]), [["scratch", ["sb-1"]]]);
    assert.equal((await client.createVolume("scratch")).name, "scratch");
    await rejectsWith(client.createVolume("taken"), { class: ConflictError, status: 409, code: "conflict" });
    assert.equal(await client.deleteVolume("a b"), undefined);
    await rejectsWith(client.deleteVolume("busy"), { class: ConflictError, status: 409, message: /mounted by sb-1/ });
    await rejectsWith(client.deleteVolume("nope"), { class: NotFoundError, status: 404 });
    const sb = await Sandbox.create({ client, volumes: ["/srv/repo:/work:ro", { source: "scratch", path: "/s", mode: "copy" }] });
    assert.equal(sb.volumes.length, 2);
    await new Snapshot(client, SNAPSHOT).spawn({ count: 1, volumes: ["scratch:/s:uid=7"] });
    // The class follows the code (invalid_request), the status stays the daemon's.
    await rejectsWith(Sandbox.create({ client, volumes: ["/proc:/p"] }), { class: InvalidRequestError, status: 403 });
    await assert.rejects(Sandbox.create({ client, volumes: ["/a"] }), TypeError, "refused before any request");
    await Sandbox.create({ client });
    assert.deepEqual(transport.sent(), [
      ["GET", "/v1/volumes", undefined],
      ["POST", "/v1/volumes", { name: "scratch" }],
      ["POST", "/v1/volumes", { name: "taken" }],
      ["DELETE", "/v1/volumes/a%20b", undefined],
      ["DELETE", "/v1/volumes/busy", undefined],
      ["DELETE", "/v1/volumes/nope", undefined],
      [
        "POST",
        "/v1/sandboxes",
        {
          volumes: [
            { source: "/srv/repo", path: "/work", read_only: true, mode: "shared" },
            { source: "scratch", path: "/s", mode: "copy" },
          ],
        },
      ],
      [
        "POST",
        "/v1/sandboxes",
        { snapshot: "snap-1", count: 1, volumes: [{ source: "scratch", path: "/s", read_only: false, mode: "shared", uid: 7 }] },
      ],
      ["POST", "/v1/sandboxes", { volumes: [{ source: "/proc", path: "/p", read_only: false, mode: "shared" }] }],
      ["POST", "/v1/sandboxes", {}],
    ]);
  });
});
