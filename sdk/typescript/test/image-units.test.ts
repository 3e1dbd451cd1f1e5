/**
 * The image operations without a daemon: the tar writer (read back by a
 * reader here, and by GNU tar when the host has it), the NDJSON progress
 * stream and its error classes, query strings, what the uploads send, and
 * streamed request bodies over both transports.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, before, describe, test } from "node:test";
import {
  BuildFailedError,
  Client,
  ConflictError,
  DOCKERFILE_IN_CONTEXT,
  FetchTransport,
  ForbiddenError,
  headerBlocks,
  ForkvmError,
  GuestError,
  InvalidImageError,
  NoSpaceError,
  packDirectory,
  parseImageEvent,
  paxRecord,
  ProtocolError,
  readImageEvents,
  RegistryAuthFailedError,
  RegistryUnreachableError,
  Sandbox,
  ServerError,
  SnapshotCorruptError,
  UnixSocketTransport,
  UnprocessableError,
  type api,
  type Transport,
  type TransportRequest,
  type TransportResponse,
} from "forkvm";

// ---------------------------------------------------------------------------
// Scratch space: the temporary tars go to a directory of the tests' own, so
// that they can check none is left behind.

const scratch = mkdtempSync(join(tmpdir(), "forkvm-image-units-"));
const uploadsTmp = join(scratch, "tmp");
mkdirSync(uploadsTmp);
const savedTmp = process.env.TMPDIR;
before(() => {
  process.env.TMPDIR = uploadsTmp;
});
after(() => {
  if (savedTmp === undefined) delete process.env.TMPDIR;
  else process.env.TMPDIR = savedTmp;
  rmSync(scratch, { recursive: true, force: true });
});
afterEach(() => {
  assert.deepEqual(readdirSync(uploadsTmp), [], "a temporary tar was left behind");
});

let dirs = 0;
function freshDir(): string {
  const dir = join(scratch, `d${dirs++}`);
  mkdirSync(dir);
  return dir;
}

// ---------------------------------------------------------------------------
// A tar reader, to read back what the writer wrote.

interface ReadEntry {
  name: string;
  type: string;
  mode: number;
  size: number;
  linkname: string;
  data: Buffer;
}

function readTar(tar: Buffer): ReadEntry[] {
  const entries: ReadEntry[] = [];
  let offset = 0;
  let pax: Record<string, string> = {};
  const field = (block: Buffer, start: number, width: number): string => {
    const raw = block.subarray(start, start + width);
    const nul = raw.indexOf(0);
    return raw.subarray(0, nul < 0 ? width : nul).toString("utf8");
  };
  for (;;) {
    assert.ok(offset + 512 <= tar.length, "the archive ends without its two zero blocks");
    const block = tar.subarray(offset, offset + 512);
    if (block.every((b) => b === 0)) {
      assert.ok(tar.subarray(offset, offset + 1024).every((b) => b === 0) && tar.length === offset + 1024);
      return entries;
    }
    let sum = 0;
    for (let i = 0; i < 512; i++) sum += i >= 148 && i < 156 ? 0x20 : block[i]!;
    assert.equal(parseInt(field(block, 148, 8).trim(), 8), sum, "header checksum");
    assert.equal(field(block, 257, 6), "ustar");
    const type = field(block, 156, 1);
    let size = parseInt(field(block, 124, 12), 8);
    if (pax.size) size = Number(pax.size);
    const data = tar.subarray(offset + 512, offset + 512 + size);
    offset += 512 + Math.ceil(size / 512) * 512;
    if (type === "x") {
      pax = {};
      let rest = data.toString("utf8");
      while (rest) {
        const space = rest.indexOf(" ");
        const length = Number(rest.slice(0, space));
        assert.equal(Buffer.byteLength(rest.slice(0, length)) >= length, true);
        const record = Buffer.from(rest).subarray(0, length).toString("utf8");
        assert.ok(record.endsWith("\n"), `PAX record ${JSON.stringify(record)} has the length it says`);
        const [key, ...value] = record.slice(space + 1, -1).split("=");
        pax[key!] = value.join("=");
        rest = Buffer.from(rest).subarray(length).toString("utf8");
      }
      continue;
    }
    const prefix = field(block, 345, 155);
    const name = pax.path ?? (prefix ? `${prefix}/${field(block, 0, 100)}` : field(block, 0, 100));
    const linkname = pax.linkpath ?? field(block, 157, 100);
    entries.push({ name, type, mode: parseInt(field(block, 100, 8), 8), size, linkname, data: Buffer.from(data) });
    pax = {};
  }
}

function hasGnuTar(): boolean {
  return spawnSync("tar", ["--version"], { encoding: "utf8" }).stdout?.includes("GNU tar") ?? false;
}

// ---------------------------------------------------------------------------

describe("the tar writer", () => {
  test("packs a tree: files, directories, symlinks, long and non-ASCII names", async () => {
    const dir = freshDir();
    mkdirSync(join(dir, "bin"));
    const big = Buffer.alloc((1 << 20) * 2 + 7, 7); // more than one read
    writeFileSync(join(dir, "bin", "big"), big, { mode: 0o755 });
    writeFileSync(join(dir, "empty"), "");
    symlinkSync("big", join(dir, "bin", "sh"));
    const longTarget = `/${"t".repeat(150)}`;
    symlinkSync(longTarget, join(dir, "long-link"));
    const deep = join(dir, "a".repeat(90), "b".repeat(90));
    mkdirSync(deep, { recursive: true });
    writeFileSync(join(deep, "c".repeat(60)), "deep"); // 90+90+60: a ustar prefix split
    const deeper = join(deep, "d".repeat(99), "e".repeat(99));
    mkdirSync(deeper, { recursive: true });
    writeFileSync(join(deeper, "f"), "deeper"); // over 255 bytes: a PAX path
    writeFileSync(join(dir, "grüße.txt"), "hallo");
    spawnSync("mkfifo", [join(dir, "fifo")]); // skipped (when mkfifo exists)

    const path = await packDirectory(dir, [{ name: DOCKERFILE_IN_CONTEXT, data: Buffer.from("FROM x\n") }]);
    try {
      const tar = readFileSync(path);
      assert.equal(tar.length % 512, 0);
      const entries = readTar(tar);
      const byName = new Map(entries.map((e) => [e.name, e]));
      const a = "a".repeat(90);
      const ab = `${a}/${"b".repeat(90)}`;
      const abd = `${ab}/${"d".repeat(99)}`;
      assert.deepEqual(
        entries.map((e) => e.name),
        [
          `${a}/`,
          `${ab}/`,
          `${ab}/${"c".repeat(60)}`,
          `${abd}/`,
          `${abd}/${"e".repeat(99)}/`,
          `${abd}/${"e".repeat(99)}/f`,
          "bin/",
          "bin/big",
          "bin/sh",
          "empty",
          "grüße.txt",
          "long-link",
          DOCKERFILE_IN_CONTEXT,
        ],
      );
      assert.ok(byName.get("bin/big")!.data.equals(big));
      assert.equal(byName.get("bin/big")!.mode, 0o755);
      assert.equal(byName.get("bin/")!.type, "5");
      assert.deepEqual([byName.get("bin/sh")!.type, byName.get("bin/sh")!.linkname], ["2", "big"]);
      assert.equal(byName.get("long-link")!.linkname, longTarget);
      assert.equal(byName.get(`${abd}/${"e".repeat(99)}/f`)!.data.toString(), "deeper");
      assert.equal(byName.get("empty")!.size, 0);
      assert.equal(byName.get("grüße.txt")!.data.toString(), "hallo");
      assert.equal(byName.get(DOCKERFILE_IN_CONTEXT)!.data.toString(), "FROM x\n");
      assert.equal(byName.get(DOCKERFILE_IN_CONTEXT)!.mode, 0o644);

      if (hasGnuTar()) {
        // The host's tar reads it the same way.
        const listed = spawnSync("tar", ["-tf", path], { encoding: "utf8" });
        assert.equal(listed.status, 0, listed.stderr);
        assert.deepEqual(listed.stdout.trimEnd().split("\n"), entries.map((e) => e.name));
        const out = freshDir();
        const extracted = spawnSync("tar", ["-xf", path, "-C", out], { encoding: "utf8" });
        assert.equal(extracted.status, 0, extracted.stderr);
        assert.ok(readFileSync(join(out, "bin", "big")).equals(big));
        assert.equal(statSync(join(out, "bin", "big")).mode & 0o777, 0o755);
      }
    } finally {
      rmSync(path, { force: true });
    }
  });

  test("an extra file replaces the directory's own of that name", async () => {
    const dir = freshDir();
    writeFileSync(join(dir, DOCKERFILE_IN_CONTEXT), "stale");
    writeFileSync(join(dir, "Dockerfile"), "FROM y\n");
    const path = await packDirectory(dir, [{ name: DOCKERFILE_IN_CONTEXT, data: Buffer.from("FROM y\n") }]);
    try {
      const entries = readTar(readFileSync(path));
      assert.deepEqual(entries.map((e) => e.name), ["Dockerfile", DOCKERFILE_IN_CONTEXT]);
      assert.equal(entries[1]!.data.toString(), "FROM y\n");
    } finally {
      rmSync(path, { force: true });
    }
  });

  test("the tar never packs itself when the temporary directory is inside the one packed", async () => {
    const dir = freshDir();
    writeFileSync(join(dir, "a"), "a");
    mkdirSync(join(dir, "tmp"));
    process.env.TMPDIR = join(dir, "tmp");
    try {
      const path = await packDirectory(dir);
      assert.deepEqual(readTar(readFileSync(path)).map((e) => e.name), ["a", "tmp/"]);
      rmSync(path);
    } finally {
      process.env.TMPDIR = uploadsTmp;
    }
  });

  test("refuses what is not a directory", async () => {
    const dir = freshDir();
    writeFileSync(join(dir, "f"), "x");
    await assert.rejects(packDirectory(join(dir, "f")), /not a directory/);
    await assert.rejects(packDirectory(join(dir, "missing")), /not a directory/);
  });

  test("PAX records count their own length", () => {
    for (const n of [1, 80, 88, 89, 90, 95, 96, 97, 98, 990, 995, 996, 997]) {
      const record = paxRecord("path", "x".repeat(n));
      assert.equal(Number(record.split(" ")[0]), Buffer.byteLength(record), `value of ${n} bytes`);
    }
    assert.equal(paxRecord("path", "ü"), "11 path=ü\n"); // ü is two bytes
  });

  test("sizes and ids past the ustar fields go into a PAX header", () => {
    const blocks = headerBlocks({ name: "huge", type: "file", mode: 0o644, uid: 1 << 22, gid: 5 }, 9 * 2 ** 30);
    assert.equal(blocks.length, 3); // PAX header, its records, the ustar header
    const records = Buffer.from(blocks[1]!).toString("utf8").replace(/\0+$/, "");
    assert.match(records, new RegExp(`size=${9 * 2 ** 30}\n`));
    assert.match(records, new RegExp(`uid=${1 << 22}\n`));
    assert.doesNotMatch(records, /gid=/);
    assert.throws(() => headerBlocks({ name: "/", type: "directory", mode: 0o755 }, 0), /relative name/);
  });
});

// ---------------------------------------------------------------------------

const IMAGE: api.Image = {
  name: "tiny",
  format: "ext4",
  size_bytes: 4096,
  created_at: "2026-11-25T09:00:00Z",
  source: "import",
  config: { cmd: ["/bin/sh"] },
};

const PROGRESS: api.ImageEvent[] = [
  { type: "phase", phase: "unpacking" },
  { type: "progress", item: "layer 1/1", done: 10, total: 20 },
  { type: "cached", item: "sha256:abc" },
  { type: "step", index: 1, total: 2, text: "RUN true", cached: false },
  { type: "log", line: "hello" },
];

const ndjson = (...events: object[]): string => events.map((e) => `${JSON.stringify(e)}\n`).join("");

async function* linesOf(...lines: string[]): AsyncGenerator<string> {
  yield* lines;
}

describe("the progress stream", () => {
  test("events go to the callback, in order, and the image comes back", async () => {
    const seen: string[] = [];
    const image = await readImageEvents(
      linesOf(...[...PROGRESS, { type: "done", image: IMAGE }].map((e) => JSON.stringify(e))),
      200,
      async (event) => {
        await new Promise((resolve) => setTimeout(resolve, 1)); // awaited before the next
        seen.push(event.type);
      },
    );
    assert.deepEqual(image, IMAGE);
    assert.deepEqual(seen, ["phase", "progress", "cached", "step", "log", "done"]);
  });

  const errors: [string, new (...args: never[]) => ForkvmError, number][] = [
    ["invalid_image", InvalidImageError, 422],
    ["build_failed", BuildFailedError, 422],
    ["registry_auth_failed", RegistryAuthFailedError, 403],
    ["registry_unreachable", RegistryUnreachableError, 502],
    ["no_space", NoSpaceError, 507],
    ["conflict", ConflictError, 409],
  ];
  for (const [code, cls, status] of errors) {
    test(`an error line with ${code} is a ${cls.name} (${status})`, async () => {
      const seen: string[] = [];
      const error = { type: "error", error: { code, message: "it broke" } };
      await assert.rejects(
        readImageEvents(linesOf(JSON.stringify(PROGRESS[0]), JSON.stringify(error)), 200, (e) => {
          seen.push(e.type);
        }),
        (err: unknown) => err instanceof cls && err.code === code && err.status === status && err.message === "it broke",
      );
      assert.deepEqual(seen, ["phase", "error"]);
    });
  }

  test("an unknown code keeps the response's status", async () => {
    const error = { type: "error", error: { code: "something_new", message: "m" } };
    await assert.rejects(readImageEvents(linesOf(JSON.stringify(error)), 200), (err: unknown) => {
      return err instanceof ForkvmError && err.code === "something_new" && err.status === 200;
    });
  });

  test("a stream that ends early is a ProtocolError", async () => {
    await assert.rejects(readImageEvents(linesOf(JSON.stringify(PROGRESS[0])), 200), ProtocolError);
    await assert.rejects(readImageEvents(linesOf(), 200), /ended before its result/);
  });

  test("bad lines are ProtocolErrors; unknown event types are passed on", async () => {
    for (const line of ["{not json", "[1]", '"done"', '{"phase":"x"}', '{"type":3}', "null"]) {
      assert.throws(() => parseImageEvent(line, 200), ProtocolError, line);
    }
    await assert.rejects(readImageEvents(linesOf('{"type":"done"}'), 200), ProtocolError);
    const seen: string[] = [];
    await readImageEvents(linesOf('{"type":"warp"}', JSON.stringify({ type: "done", image: IMAGE })), 200, (e) => {
      seen.push(e.type);
    });
    assert.deepEqual(seen, ["warp", "done"]);
  });
});

describe("error classes of the image codes", () => {
  test("by code, then by status", () => {
    const cases: [number, string, new (...args: never[]) => ForkvmError][] = [
      [403, "registry_auth_failed", RegistryAuthFailedError],
      [403, "x", ForbiddenError],
      [422, "invalid_image", InvalidImageError],
      [422, "build_failed", BuildFailedError],
      [422, "snapshot_corrupt", SnapshotCorruptError],
      [422, "x", UnprocessableError],
      [502, "registry_unreachable", RegistryUnreachableError],
      [502, "x", GuestError],
      [507, "no_space", NoSpaceError],
      [507, "x", NoSpaceError],
    ];
    for (const [status, code, cls] of cases) {
      const err = ForkvmError.fromResponse(status, code, "m");
      assert.equal(err.constructor, cls, `${status} ${code}`);
      assert.equal(err.status, status);
    }
    assert.ok(ForkvmError.fromResponse(422, "invalid_image", "m") instanceof UnprocessableError);
    assert.ok(ForkvmError.fromResponse(502, "registry_unreachable", "m") instanceof ServerError);
    assert.ok(ForkvmError.fromResponse(507, "no_space", "m") instanceof ServerError);
    assert.equal(ForkvmError.statusOf("registry_auth_failed"), 403);
    assert.equal(ForkvmError.statusOf("no_space"), 507);
  });
});

// ---------------------------------------------------------------------------
// The Client over a transport that answers from a script.

interface Scripted {
  status?: number;
  contentType?: string;
  body: string;
}

/** Records each request, reading a streamed body whole, and answers `reply`. */
class ScriptedTransport implements Transport {
  readonly url = "scripted://";
  requests: TransportRequest[] = [];
  bodies: Buffer[] = [];
  constructor(readonly reply: Scripted) {}
  async request(req: TransportRequest): Promise<TransportResponse> {
    this.requests.push(req);
    const body = req.body;
    if (body === undefined) this.bodies.push(Buffer.alloc(0));
    else if (typeof body === "string" || body instanceof Uint8Array) this.bodies.push(Buffer.from(body));
    else {
      const parts: Buffer[] = [];
      for await (const chunk of body) parts.push(Buffer.from(chunk));
      this.bodies.push(Buffer.concat(parts));
    }
    const bytes = Buffer.from(this.reply.body);
    return {
      status: this.reply.status ?? 200,
      header: (name) => (name.toLowerCase() === "content-type" ? (this.reply.contentType ?? "application/x-ndjson") : null),
      body: async function* () {
        // In two pieces, splitting a line, as a network may.
        yield bytes.subarray(0, 7);
        yield bytes.subarray(7);
      },
      bytes: async () => bytes,
      cancel: () => {},
    };
  }
  close(): void {}
  query(): Record<string, string | readonly string[] | undefined> {
    return this.requests.at(-1)?.query ?? {};
  }
}

const done = ndjson(...PROGRESS, { type: "done", image: IMAGE });

describe("Client image methods", () => {
  test("pullImage streams, with stream: true and the progress to onEvent", async () => {
    const transport = new ScriptedTransport({ body: done });
    const seen: string[] = [];
    const image = await new Client({ transport }).pullImage(
      { reference: "127.0.0.1:5000/x:1", name: "x", insecure: true },
      { onEvent: (e) => void seen.push(e.type) },
    );
    assert.deepEqual(image, IMAGE);
    assert.deepEqual(seen, ["phase", "progress", "cached", "step", "log", "done"]);
    const req = transport.requests[0]!;
    assert.equal(req.headers?.accept, "application/x-ndjson");
    assert.deepEqual(JSON.parse(transport.bodies[0]!.toString()), {
      reference: "127.0.0.1:5000/x:1",
      name: "x",
      insecure: true,
      stream: true,
    });
  });

  test("an error before the stream is thrown with its status; an unstreamed answer is the image", async () => {
    const conflict = { error: { code: "conflict", message: "image x exists; pass replace" } };
    const refused = new Client({
      transport: new ScriptedTransport({ status: 409, contentType: "application/json", body: JSON.stringify(conflict) }),
    });
    await assert.rejects(refused.pullImage({ reference: "x" }), (e: unknown) => e instanceof ConflictError && e.status === 409);
    const plain = new Client({
      transport: new ScriptedTransport({ status: 201, contentType: "application/json", body: JSON.stringify(IMAGE) }),
    });
    assert.deepEqual(await plain.pullImage({ reference: "x" }), IMAGE);
  });

  test("importImage streams a file as it is", async () => {
    const dir = freshDir();
    const archive = join(dir, "rootfs.tar");
    const bytes = Buffer.alloc(3 * (1 << 20) + 3, 1);
    writeFileSync(archive, bytes);
    const transport = new ScriptedTransport({ body: done });
    await new Client({ transport }).importImage(archive, { name: "tiny", replace: true });
    const req = transport.requests[0]!;
    assert.equal(req.path, "/v1/images/import");
    assert.deepEqual(transport.query(), { name: "tiny", file: "rootfs.tar", replace: "true" });
    assert.equal(req.headers?.["content-type"], "application/octet-stream");
    assert.equal(req.headers?.["content-length"], String(bytes.length));
    assert.ok(transport.bodies[0]!.equals(bytes));
  });

  test("importImage packs a directory, and removes the tar after an error", async () => {
    const layout = freshDir();
    mkdirSync(join(layout, "blobs", "sha256"), { recursive: true });
    writeFileSync(join(layout, "index.json"), "{}");
    writeFileSync(join(layout, "oci-layout"), "{}");
    writeFileSync(join(layout, "blobs", "sha256", "ab"), "blob");
    const error = ndjson({ type: "error", error: { code: "invalid_image", message: "no manifest" } });
    const transport = new ScriptedTransport({ body: error });
    await assert.rejects(new Client({ transport }).importImage(layout, { name: "oci" }), InvalidImageError);
    const entries = readTar(transport.bodies[0]!);
    assert.deepEqual(entries.map((e) => e.name), ["blobs/", "blobs/sha256/", "blobs/sha256/ab", "index.json", "oci-layout"]);
    assert.equal(transport.requests[0]!.headers?.["content-length"], String(transport.bodies[0]!.length));
    await assert.rejects(new Client({ transport }).importImage(join(layout, "nope"), { name: "x" }), /no such file/);
  });

  test("buildImage packs the context with the Dockerfile", async () => {
    const context = freshDir();
    mkdirSync(join(context, "src"));
    writeFileSync(join(context, "src", "app.py"), "print(1)\n");
    writeFileSync(join(context, "Dockerfile"), "FROM default\nCOPY src /app\n");
    const transport = new ScriptedTransport({ body: ndjson({ type: "done", image: { ...IMAGE, source: "build" } }) });
    const client = new Client({ transport });
    const image = await client.buildImage(context, { tag: "app", build_args: { V: "1" }, no_cache: true });
    assert.equal(image.source, "build");
    assert.equal(transport.requests[0]!.path, "/v1/images/build");
    assert.deepEqual(transport.query(), {
      tag: "app",
      dockerfile: DOCKERFILE_IN_CONTEXT,
      build_args: '{"V":"1"}',
      no_cache: "true",
    });
    const entries = readTar(transport.bodies[0]!);
    assert.deepEqual(entries.map((e) => e.name), ["Dockerfile", "src/", "src/app.py", DOCKERFILE_IN_CONTEXT]);
    assert.equal(entries.at(-1)!.data.toString(), "FROM default\nCOPY src /app\n");

    const elsewhere = join(freshDir(), "Containerfile");
    writeFileSync(elsewhere, "FROM tiny\n");
    await client.buildImage(context, { tag: "app", dockerfile: elsewhere });
    assert.equal(readTar(transport.bodies[1]!).at(-1)!.data.toString(), "FROM tiny\n");
    await assert.rejects(client.buildImage(freshDir(), { tag: "app" }), /no Dockerfile/);
    await assert.rejects(client.buildImage(elsewhere, { tag: "app" }), /not a directory/);
  });

  test("query strings: what is unset or false is left out", async () => {
    const dir = freshDir();
    const archive = join(dir, "a.tar");
    writeFileSync(archive, "x");
    writeFileSync(join(dir, "Dockerfile"), "FROM x\n");
    const transport = new ScriptedTransport({ body: done });
    const client = new Client({ transport });
    await client.importImage(archive, { name: "t", file: "b.tar", disk_size: 1 << 30, replace: false });
    assert.deepEqual(transport.query(), { name: "t", file: "b.tar", disk_size: String(1 << 30) });
    await client.importImage(`${dir}/`, { name: "t" });
    assert.deepEqual(transport.query(), { name: "t", file: dir.split("/").at(-1) });
    await client.buildImage(dir, { tag: "app", build_args: { V: "1", B: "x y" }, disk_size: 5, memory_mib: 1024 });
    assert.deepEqual(transport.query(), {
      tag: "app",
      dockerfile: DOCKERFILE_IN_CONTEXT,
      build_args: '{"B":"x y","V":"1"}',
      disk_size: "5",
      memory_mib: "1024",
    });
    await client.buildImage(dir, { tag: "app", build_args: {}, no_cache: false });
    assert.deepEqual(transport.query(), { tag: "app", dockerfile: DOCKERFILE_IN_CONTEXT });
    await assert.rejects(client.importImage(archive, { name: "" }), TypeError);
    await assert.rejects(client.buildImage(dir, { tag: "" }), TypeError);
    await assert.rejects(client.buildImage(dir, { tag: "a", build_args: ["V=1"] as never }), TypeError);
  });

  test("exec: user, and an empty argv for the image's default command; create: diskSize", async () => {
    const transport = new ScriptedTransport({ contentType: "application/json", body: "{}" });
    const client = new Client({ transport });
    const sb = new Sandbox(client, { id: "sb-1" } as api.Sandbox);
    await sb.exec([], { user: "1000:1000" }).catch(() => {});
    assert.deepEqual(JSON.parse(transport.bodies[0]!.toString()), { argv: [], user: "1000:1000" });
    await Sandbox.create({ client, image: "tiny", diskSize: 2 ** 31 }).catch(() => {});
    assert.deepEqual(JSON.parse(transport.bodies[1]!.toString()), { image: "tiny", disk_size: 2 ** 31 });
  });

  test("list, get and delete", async () => {
    const transport = new ScriptedTransport({ contentType: "application/json", body: JSON.stringify({ images: [IMAGE] }) });
    const client = new Client({ transport });
    assert.equal((await client.listImages()).images[0]!.name, "tiny");
    await client.getImage("a b/c").catch(() => {});
    await client.deleteImage("tiny");
    assert.deepEqual(
      transport.requests.map((r) => `${r.method} ${r.path}`),
      ["GET /v1/images", "GET /v1/images/a%20b%2Fc", "DELETE /v1/images/tiny"],
    );
  });
});

// ---------------------------------------------------------------------------
// Streamed request bodies over real sockets.

describe("streamed bodies over the transports", () => {
  let server: Server;
  const socket = join(scratch, "echo.sock");
  let port = 0;

  /** Answers 409 at once for /early; else reads the body and answers its length, sha256 and content-length. */
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    if (req.url?.startsWith("/early")) {
      res.writeHead(409, { "content-type": "application/json", connection: "close" });
      res.end(JSON.stringify({ error: { code: "conflict", message: "taken" } }));
      req.resume();
      return;
    }
    const hash = createHash("sha256");
    let bytes = 0;
    req.on("data", (chunk: Buffer) => {
      bytes += chunk.length;
      hash.update(chunk);
    });
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ bytes, sha256: hash.digest("hex"), length: req.headers["content-length"] ?? null }));
    });
  };

  before(async () => {
    server = createServer(handler);
    await new Promise<void>((resolve) => server.listen(socket, resolve));
  });
  after(async () => {
    await new Promise((resolve) => server.close(resolve));
  });

  const payload = Buffer.alloc(5 * (1 << 20) + 11);
  for (let i = 0; i < payload.length; i += 4096) payload[i] = i & 0xff;
  async function* chunks(): AsyncGenerator<Uint8Array> {
    for (let i = 0; i < payload.length; i += 1 << 20) yield payload.subarray(i, i + (1 << 20));
  }
  const expected = { bytes: payload.length, sha256: createHash("sha256").update(payload).digest("hex"), length: String(payload.length) };

  async function roundTrip(transport: Transport): Promise<unknown> {
    const res = await transport.request({
      method: "POST",
      path: "/echo",
      headers: { "content-type": "application/octet-stream", "content-length": String(payload.length) },
      body: chunks(),
    });
    assert.equal(res.status, 200);
    return JSON.parse(Buffer.from(await res.bytes()).toString());
  }

  test("unix socket", async () => {
    const transport = new UnixSocketTransport(socket);
    try {
      assert.deepEqual(await roundTrip(transport), expected);
    } finally {
      transport.close();
    }
  });

  test("TCP (fetch)", async () => {
    const tcp = createServer(handler);
    await new Promise<void>((resolve) => tcp.listen(0, "127.0.0.1", resolve));
    port = (tcp.address() as { port: number }).port;
    const transport = new FetchTransport(`http://127.0.0.1:${port}`);
    try {
      assert.deepEqual(await roundTrip(transport), expected);
    } finally {
      transport.close();
      await new Promise((resolve) => tcp.close(resolve));
    }
  });

  test("an answer before the body is read reaches the caller (unix socket)", async () => {
    const transport = new UnixSocketTransport(socket);
    try {
      const res = await transport.request({
        method: "POST",
        path: "/early",
        headers: { "content-length": String(payload.length) },
        body: chunks(),
      });
      assert.equal(res.status, 409);
    } finally {
      transport.close();
    }
  });

  test("a source that fails is reported as itself, not as an unreachable daemon", async () => {
    const transport = new UnixSocketTransport(socket);
    async function* failing(): AsyncGenerator<Uint8Array> {
      yield payload.subarray(0, 10);
      throw new Error("disk on fire");
    }
    try {
      await assert.rejects(
        transport.request({ method: "POST", path: "/echo", headers: { "content-length": "100" }, body: failing() }),
        /disk on fire/,
      );
    } finally {
      transport.close();
    }
  });
});
