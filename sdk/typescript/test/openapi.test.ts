/**
 * The SDK against docs/openapi.json, without a daemon: every operation has a
 * Client method that sends the right verb, path, query and body fields, and
 * every schema has a wire type in src/types.ts with the same properties.
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import ts from "typescript";
import { Client, ForkvmError, NetworkUnavailableError, ServerError } from "forkvm";
import { RecordingTransport } from "./helpers.js";
import { OPENAPI_PATH, SDK_ROOT } from "./paths.js";

/** Operations whose octet-stream body is a file streamed from disk. */
const STREAMED_UPLOADS = new Set(["import_image", "build_image"]);

interface Parameter {
  name: string;
  in: string;
}
interface Operation {
  operationId: string;
  responses: Record<string, unknown>;
  parameters?: Parameter[];
  requestBody?: { content: Record<string, { schema: { $ref?: string } }> };
}
interface Schema {
  type?: string | string[];
  enum?: string[];
  properties?: Record<string, Schema>;
  required?: string[];
  oneOf?: Schema[];
  /** `#[serde(flatten)]` of another schema: `[{ $ref }, { properties }]`. */
  allOf?: Schema[];
  $ref?: string;
}
interface OpenApi {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema> };
}

const doc = JSON.parse(readFileSync(OPENAPI_PATH, "utf8")) as OpenApi;
const HTTP_METHODS = ["get", "put", "post", "delete", "patch", "head", "options"];

const operations = Object.entries(doc.paths).flatMap(([path, item]) =>
  Object.entries(item)
    .filter(([method]) => HTTP_METHODS.includes(method))
    .map(([method, op]) => ({ path, method: method.toUpperCase(), op })),
);

/** `list_sandboxes` → `listSandboxes`. */
const methodName = (operationId: string): string => operationId.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

/** Files for the upload operations to send (the transport records, nothing is sent). */
const scratch = mkdtempSync(join(tmpdir(), "forkvm-openapi-test-"));
const archive = join(scratch, "rootfs.tar");
writeFileSync(archive, new Uint8Array(1024));
const context = join(scratch, "context");
mkdirSync(context);
writeFileSync(join(context, "Dockerfile"), "FROM default\n");
after(() => rmSync(scratch, { recursive: true, force: true }));

/**
 * How to call each operation's methods, so that together they send every
 * parameter and body field. A new operation in docs/openapi.json fails the
 * tests below until it is added here and to the Client.
 */
const CALLS: Record<string, ((c: Client) => Promise<unknown>)[]> = {
  health: [(c) => c.health()],
  info: [(c) => c.info()],
  metrics: [(c) => c.metrics()],
  // The document names the metadata filter's parameters `metadata.KEY`.
  list_sandboxes: [(c) => c.listSandboxes({ metadata: { KEY: "v" } })],
  create_sandbox: [
    (c) => c.createSandbox({ image: "default", memory_mib: 512, cpus: 1, use_template: false, disk_size: 1 << 31 }),
    (c) => c.createSandbox({ snapshot: "s", count: 2 }),
    (c) =>
      c.createSandbox({
        network: "nat",
        ports: [{ guest: 8000 }, { guest: 8001, host: 18001 }],
        egress: [{ cidr: "10.0.0.0/8" }, { cidr: "1.2.3.4", ports: [443] }],
        allow_host: true,
        wait_for_network: false,
      }),
    (c) => c.createSandbox({ metadata: { team: "a" }, env: { A: "1" }, timeout: 60, on_timeout: "pause" }),
    (c) => c.createSandbox({ limits: { disk_iops: 100, net_kbps: 10000 } }),
    (c) => c.createSandbox({ volumes: [{ source: "/srv", path: "/work", read_only: true, mode: "copy", uid: 1, gid: 2 }] }),
  ],
  set_timeout: [(c) => c.setTimeout("ID", { timeout: 60, on_timeout: "kill" }), (c) => c.setTimeout("ID", { timeout: null })],
  set_network: [
    (c) => c.setNetwork("ID", { egress: [{ cidr: "10.0.0.0/8", ports: [443] }], allow_host: true }),
    (c) => c.setNetwork("ID", {}),
  ],
  pause: [(c) => c.pause("ID"), (c) => c.pause("ID", { memory: false })],
  resume: [(c) => c.resume("ID", { timeout: 60 }), (c) => c.resume("ID"), (c) => c.resume("ID", { memory: false })],
  checkpoint: [(c) => c.checkpoint("ID"), (c) => c.checkpoint("ID", { tag: "t" })],
  get_timeline: [(c) => c.getTimeline("ID")],
  set_retention: [(c) => c.setRetention("ID", { keep_last: 3, keep_every: 10 })],
  rewind: [(c) => c.rewind("ID", { to: "t", checkpoint_first: true }), (c) => c.rewind("ID", { to: "sn-1" })],
  diff: [(c) => c.diff("ID", { b: "sn-1", path: "/root", text: true }), (c) => c.diff("ID", { b: "ID2" })],
  merge: [
    (c) => c.merge("ID", { into: "ID2", path: "/root", strategy: "text", dry_run: true }),
    (c) => c.merge("ID", { into: "ID2" }),
  ],
  get_sandbox: [(c) => c.getSandbox("ID")],
  delete_sandbox: [(c) => c.deleteSandbox("ID")],
  branch_sandbox: [
    (c) => c.branchSandbox("ID", { mode: "live", count: 2, tag: "t", wait: false }),
    (c) => c.branchSandbox("ID", { ports: [{ guest: 8000 }], wait_for_network: false }),
    (c) => c.branchSandbox("ID", { limits: { disk_iops: 50 }, timeout: 600 }),
  ],
  exec: [
    (c) =>
      c.exec("ID", {
        argv: ["true"],
        env: { A: "1" },
        cwd: "/",
        user: "1000:1000",
        stdin: "x",
        timeout_ms: 1,
        max_output_bytes: 1,
        encoding: "base64",
      }),
    (c) => c.exec("ID", { argv: ["true"], stdin_base64: "eA==" }),
    (c) => c.exec("ID", { cmd: ["-v"], entrypoint: ["/bin/tool"] }),
    (c) => c.execStream("ID", { argv: ["true"] }).next(),
  ],
  read_file: [(c) => c.readFile("ID", "/etc/hostname")],
  write_file: [(c) => c.writeFile("ID", "/tmp/f", "data", { mode: 0o600 })],
  logs: [(c) => c.logs("ID")],
  ports: [(c) => c.ports("ID")],
  snapshot_sandbox: [(c) => c.snapshotSandbox("ID", { tag: "t" })],
  list_snapshots: [(c) => c.listSnapshots()],
  get_snapshot: [(c) => c.getSnapshot("ID")],
  delete_snapshot: [(c) => c.deleteSnapshot("ID", { force: true })],
  flatten_snapshot: [(c) => c.flattenSnapshot("ID", { tag: "t" })],
  set_pool: [(c) => c.setPool("ID", 2)],
  pin_snapshot: [(c) => c.pinSnapshot("ID")],
  unpin_snapshot: [(c) => c.unpinSnapshot("ID")],
  prune_snapshots: [(c) => c.pruneSnapshots({ all: true, dry_run: true })],
  push_snapshot: [(c) => c.pushSnapshot("ID", { reference: "127.0.0.1:5000/x:1", username: "u", password: "p", insecure: true })],
  pull_snapshot: [
    (c) => c.pullSnapshot({ reference: "127.0.0.1:5000/x:1", tag: "t", username: "u", password: "p", insecure: true }),
  ],
  events: [(c) => c.events({ lastEventId: 42 })],
  list_volumes: [(c) => c.listVolumes()],
  create_volume: [(c) => c.createVolume("NAME")],
  delete_volume: [(c) => c.deleteVolume("NAME")],
  list_images: [(c) => c.listImages()],
  get_image: [(c) => c.getImage("NAME")],
  delete_image: [(c) => c.deleteImage("NAME")],
  pull_image: [
    (c) =>
      c.pullImage({
        reference: "127.0.0.1:5000/x:1",
        name: "x",
        username: "u",
        password: "p",
        insecure: true,
        disk_size: 1 << 30,
        replace: true,
        start: { command: ["sleep", "1d"], ready_port: 80 },
      }),
  ],
  start_process: [
    (c) =>
      c.startProcess("ID", {
        argv: ["sleep", "1"],
        env: { A: "1" },
        cwd: "/",
        user: "1000",
        tag: "t",
        pty: { cols: 80, rows: 24 },
        stdin: true,
      }),
    (c) => c.startProcessStream("ID", { argv: ["true"] }).next(),
  ],
  list_processes: [(c) => c.listProcesses("ID")],
  kill_process: [(c) => c.killProcess("ID", 812)],
  attach_process: [(c) => c.attachProcess("ID", "web").next()],
  resize_pty: [(c) => c.resizePty("ID", "tty", { cols: 100, rows: 40 })],
  signal_process: [(c) => c.signalProcess("ID", "web", "INT")],
  write_stdin: [(c) => c.writeStdin("ID", 812, "data\n")],
  close_stdin: [(c) => c.closeStdin("ID", 812)],
  stat_file: [(c) => c.statFile("ID", "/etc")],
  file_exists: [(c) => c.fileExists("ID", "/etc")],
  list_dir: [(c) => c.listDir("ID", "/etc", { depth: 2 })],
  make_dir: [(c) => c.makeDir("ID", "/tmp/d")],
  move_file: [(c) => c.moveFile("ID", "/tmp/a", "/tmp/b")],
  remove_file: [(c) => c.removeFile("ID", "/tmp/a")],
  watch_dir: [(c) => c.watchDir("ID", "/tmp", { recursive: true }).next()],
  create_watcher: [(c) => c.createWatcher("ID", "/tmp", { recursive: true })],
  poll_watcher: [(c) => c.pollWatcher("ID", "W")],
  remove_watcher: [(c) => c.removeWatcher("ID", "W")],
  download_archive: [(c) => c.downloadArchive("ID", ["/etc/hostname", "/tmp"])],
  upload_archive: [(c) => c.uploadArchive("ID", "/tmp/up", new Uint8Array(1024))],
  import_image: [(c) => c.importImage(archive, { name: "x", disk_size: 1 << 30, replace: true })],
  build_image: [
    (c) =>
      c.buildImage(context, { tag: "x", build_args: { V: "1" }, no_cache: true, disk_size: 1 << 30, memory_mib: 1024, target: "t" }),
  ],
};

/** Parameters the document lists that the SDK leaves out on purpose. */
const UNUSED_PARAMETERS: Record<string, string[]> = {
  // The file endpoints share one query struct; `mode` applies to writes only.
  read_file: ["mode"],
};

describe("the Client covers docs/openapi.json", () => {
  test("the document lists operations", () => {
    assert.ok(operations.length >= 17, `only ${operations.length} operations in ${OPENAPI_PATH}`);
  });

  test("every operationId has a Client method", () => {
    const proto = Client.prototype as unknown as Record<string, unknown>;
    const missing = operations
      .map(({ op }) => op.operationId)
      .filter((id) => typeof proto[methodName(id)] !== "function")
      .map((id) => `${id} → Client.${methodName(id)}`);
    assert.deepEqual(missing, [], `the Client lacks methods for: ${missing.join(", ")}`);
  });

  for (const { path, method, op } of operations) {
    test(`${op.operationId}: ${method} ${path}`, async () => {
      const calls = CALLS[op.operationId];
      assert.ok(calls, `no test call for operation ${op.operationId}: add it to CALLS`);
      const transport = new RecordingTransport();
      for (const call of calls) await assert.rejects(call(new Client({ transport })), /recorded/);
      assert.equal(transport.requests.length, calls.length);

      const pattern = new RegExp(`^${path.replace(/\{[^}]+\}/g, "[^/?]+")}$`);
      const inPath = new Set([...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]));
      const content = op.requestBody?.content ?? {};
      const ref = content["application/json"]?.schema.$ref;
      const sentFields = new Set<string>();
      for (const req of transport.requests) {
        assert.equal(req.method, method);
        assert.match(req.path, pattern);
        // Parameters that are not in the path template travel in the query, or as headers (`Last-Event-ID`).
        for (const param of op.parameters ?? []) {
          if (inPath.has(param.name) || UNUSED_PARAMETERS[op.operationId]?.includes(param.name)) continue;
          const sent = param.in === "header" ? req.headers?.[param.name.toLowerCase()] : req.query?.[param.name];
          const what = param.in === "header" ? "header" : "parameter";
          assert.ok(sent !== undefined, `${op.operationId} does not send the ${param.name} ${what}`);
        }
        if (ref) {
          for (const key of Object.keys(JSON.parse(String(req.body)) as object)) sentFields.add(key);
        } else if (content["application/octet-stream"] && STREAMED_UPLOADS.has(op.operationId)) {
          // Archives and build contexts are streamed from disk, never held whole.
          const body = req.body as AsyncIterable<Uint8Array> | undefined;
          assert.ok(body && Symbol.asyncIterator in body, `${op.operationId} streams its upload`);
          assert.equal(req.headers?.["content-type"], "application/octet-stream");
          assert.match(req.headers?.["content-length"] ?? "", /^\d+$/);
        } else if (content["application/octet-stream"]) {
          assert.ok(req.body instanceof Uint8Array, `${op.operationId} sends raw bytes`);
        } else {
          assert.equal(req.body, undefined, `${op.operationId} takes no body`);
        }
      }
      if (ref) {
        // The fields sent are the schema's (the server denies others), and the calls send them all.
        const known = Object.keys(doc.components.schemas[ref.split("/").pop()!]!.properties ?? {});
        assert.deepEqual([...sentFields].filter((k) => !known.includes(k)), [], `${op.operationId} sends fields the schema lacks`);
        assert.deepEqual(known.filter((k) => !sentFields.has(k)), [], `the SDK never sends these fields of ${op.operationId}`);
      }
    });
  }
});

describe("errors", () => {
  test("every error status in the document has its own ForkvmError subclass", () => {
    const statuses = new Set(operations.flatMap(({ op }) => Object.keys(op.responses).map(Number).filter((s) => s >= 400)));
    const generic = [...statuses].filter((s) => ForkvmError.fromResponse(s, "some_new_code", "m").constructor === ForkvmError);
    assert.deepEqual(generic, [], "statuses that map to no specific error class");
  });

  test("the class follows the code first, then the status", () => {
    const notFound = ForkvmError.fromResponse(404, "image_not_found", "no image");
    assert.equal(notFound.name, "NotFoundError");
    assert.equal(notFound.code, "image_not_found");
    assert.equal(notFound.status, 404);
    assert.equal(notFound.message, "no image");
    assert.equal(ForkvmError.fromResponse(500, "guest_timeout", "m").name, "GuestTimeoutError");
    assert.equal(ForkvmError.fromResponse(429, "x", "m").name, "LimitExceededError");
    assert.equal(ForkvmError.fromResponse(418, "teapot", "m").name, "ForkvmError");
    assert.equal(ForkvmError.statusOf("conflict"), 409);
  });

  test("the network codes: network_failed is a ServerError, network_unavailable its own 503 class", () => {
    const failed = ForkvmError.fromResponse(500, "network_failed", "m");
    assert.ok(failed instanceof ServerError);
    assert.equal(failed.name, "ServerError");
    const unavailable = ForkvmError.fromResponse(503, "network_unavailable", "m");
    assert.ok(unavailable instanceof NetworkUnavailableError && unavailable instanceof ServerError);
    assert.equal(unavailable.status, 503);
    assert.equal(ForkvmError.fromResponse(503, "some_new_code", "m").name, "ServerError");
    assert.equal(ForkvmError.statusOf("network_failed"), 500);
    assert.equal(ForkvmError.statusOf("network_unavailable"), 503);
  });
});

/** The modules of the wire types: src/types.ts and those it re-exports. */
const TYPE_MODULES = [
  "src/types.ts",
  "src/lifecycle.ts",
  "src/timeline.ts",
  "src/treediff.ts",
  "src/resources.ts",
  "src/proc-types.ts",
  "src/volumes.ts",
  "src/events.ts",
  "src/transfer.ts",
  "src/error-types.ts",
];

/** The exported interfaces and type aliases of the wire-type modules. */
function declaredTypes(): Map<string, ts.InterfaceDeclaration | ts.TypeAliasDeclaration> {
  const types = new Map<string, ts.InterfaceDeclaration | ts.TypeAliasDeclaration>();
  for (const module of TYPE_MODULES) {
    const file = join(SDK_ROOT, module);
    const source = ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest, true);
    for (const node of source.statements) {
      if ((ts.isInterfaceDeclaration(node) || ts.isTypeAliasDeclaration(node)) && node.modifiers?.some((m) => m.kind === ts.SyntaxKind.ExportKeyword)) {
        assert.ok(!types.has(node.name.text), `${node.name.text} is declared twice`);
        types.set(node.name.text, node);
      }
    }
  }
  return types;
}

/** The names an interface extends (`interface MountedVolume extends VolumeMount`). */
function extendsOf(node: ts.Node): string[] {
  if (!ts.isInterfaceDeclaration(node)) return [];
  return (node.heritageClauses ?? []).flatMap((c) => c.types.map((t) => t.expression.getText()));
}

/** Property name → optional?, of an interface (with those it extends among `types`) or an object type literal. */
function membersOf(node: ts.Node, types?: Map<string, ts.Node>): Map<string, boolean> | undefined {
  const members = ts.isInterfaceDeclaration(node) || ts.isTypeLiteralNode(node) ? node.members : undefined;
  if (!members) return undefined;
  const out = new Map<string, boolean>();
  for (const parent of extendsOf(node)) {
    const inherited = types?.get(parent);
    for (const [key, optional] of (inherited && membersOf(inherited, types)) ?? []) out.set(key, optional);
  }
  for (const member of members) {
    if (ts.isPropertySignature(member) && member.name && ts.isIdentifier(member.name)) {
      out.set(member.name.text, member.questionToken !== undefined);
    }
  }
  return out;
}

/** The string literal type of a `type` member, for tagged unions. */
function tagOf(node: ts.TypeLiteralNode): string | undefined {
  for (const member of node.members) {
    if (ts.isPropertySignature(member) && member.name && ts.isIdentifier(member.name) && member.name.text === "type") {
      const type = member.type;
      if (type && ts.isLiteralTypeNode(type) && ts.isStringLiteral(type.literal)) return type.literal.text;
    }
  }
  return undefined;
}

function assertProperties(name: string, schema: Schema, node: ts.Node, types?: Map<string, ts.Node>): void {
  const members = membersOf(node, types);
  assert.ok(members, `${name} is an interface or object type`);
  const required = new Set(schema.required ?? []);
  for (const prop of Object.keys(schema.properties ?? {})) {
    assert.ok(members.has(prop), `${name} lacks the property ${prop}`);
    assert.equal(members.get(prop), !required.has(prop), `${name}.${prop} should be ${required.has(prop) ? "required" : "optional"}`);
  }
}

describe("src/types.ts (with src/lifecycle.ts, src/timeline.ts, src/treediff.ts, src/resources.ts, src/proc-types.ts, src/volumes.ts, src/events.ts, src/transfer.ts and src/error-types.ts) covers every schema of docs/openapi.json", () => {
  const types = declaredTypes();
  for (const [name, schema] of Object.entries(doc.components.schemas)) {
    test(`schema ${name}`, () => {
      const node = types.get(name);
      assert.ok(node, `${TYPE_MODULES.join(" and ")} export no type ${name}`);
      const body = ts.isTypeAliasDeclaration(node) ? node.type : node;
      if (schema.enum) {
        assert.ok(ts.isUnionTypeNode(body), `${name} is a union of literals`);
        const literals = body.types.map((t) => (ts.isLiteralTypeNode(t) && ts.isStringLiteral(t.literal) ? t.literal.text : "?"));
        assert.deepEqual([...literals].sort(), [...schema.enum].sort(), `the values of ${name}`);
      } else if (schema.oneOf && schema.oneOf.every((v) => v.properties?.type?.enum)) {
        // A tagged union: one object type per variant, told apart by `type`.
        assert.ok(ts.isUnionTypeNode(body), `${name} is a union`);
        const variants = new Map<string, ts.TypeLiteralNode>();
        for (const t of body.types) {
          const tag = ts.isTypeLiteralNode(t) ? tagOf(t) : undefined;
          if (tag && ts.isTypeLiteralNode(t)) variants.set(tag, t);
        }
        for (const variant of schema.oneOf) {
          const tag = variant.properties!.type!.enum![0]!;
          const literal = variants.get(tag);
          assert.ok(literal, `${name} lacks the variant type: "${tag}"`);
          assertProperties(`${name}(${tag})`, variant, literal);
        }
        assert.equal(variants.size, schema.oneOf.length, `${name} has variants the document lacks`);
      } else if (schema.allOf) {
        // A flattened struct: the type extends each referenced schema's type and declares the rest.
        for (const part of schema.allOf) {
          const ref = part.$ref?.split("/").pop();
          if (ref) assert.ok(extendsOf(body).includes(ref), `${name} should extend ${ref}`);
          else assertProperties(name, part, body);
        }
      } else if (schema.properties) {
        assertProperties(name, schema, body, types);
      } else {
        assert.fail(`schema ${name} has a shape this test does not know; extend it`);
      }
    });
  }
});
