/**
 * Images against a real daemon: list, get and delete; importing a root
 * filesystem tarball (a file, streamed) and an OCI image layout (a
 * directory, packed by the SDK), then spawning sandboxes of them and running
 * commands with the image's defaults.
 *
 * The images are made here from the host's statically linked busybox: a
 * tar with `bin/busybox` and `bin/sh` linked to it is a complete image.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { after, before, describe, test } from "node:test";
import { ConflictError, NotFoundError, Sandbox, TarWriter, type api, type Client } from "forkvm";
import { rejectsWith, testClient, VM_TIMEOUT } from "./helpers.js";

const BUSYBOX = "/bin/busybox";
const skip = existsSync(BUSYBOX) ? false : "needs a statically linked /bin/busybox";

let client: Client;
const scratch = mkdtempSync(join(tmpdir(), "forkvm-images-test-"));
const names: string[] = [];

function imageName(): string {
  const name = `ts-img-${randomBytes(4).toString("hex")}`;
  names.push(name);
  return name;
}

before(() => {
  client = testClient();
});

after(async () => {
  for (const name of names) {
    const image = await client.getImage(name).catch(() => undefined);
    if (!image) continue;
    await Promise.allSettled((image.sandboxes ?? []).map((id) => client.deleteSandbox(id)));
    await client.deleteImage(name).catch(() => {});
  }
  client.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** A root filesystem tar at `path`: /bin/busybox and /bin/sh -> busybox. */
async function writeRootfsTar(path: string): Promise<void> {
  const out = await open(path, "w");
  try {
    const tar = new TarWriter(out);
    const busybox = readFileSync(BUSYBOX);
    await tar.add({ name: "bin", type: "directory", mode: 0o755 });
    await tar.add({ name: "bin/busybox", type: "file", mode: 0o755, size: busybox.length }, busybox);
    await tar.add({ name: "bin/sh", type: "symlink", mode: 0o777, linkname: "busybox" });
    await tar.finish();
  } finally {
    await out.close();
  }
}

/** An OCI image layout in `dir`: one gzip'd busybox layer, with `config` as its image config. */
async function writeOciLayout(dir: string, config: object): Promise<void> {
  mkdirSync(join(dir, "blobs", "sha256"), { recursive: true });
  const blob = (data: Buffer): string => {
    const digest = createHash("sha256").update(data).digest("hex");
    writeFileSync(join(dir, "blobs", "sha256", digest), data);
    return `sha256:${digest}`;
  };
  const layerTar = join(scratch, `layer-${randomBytes(4).toString("hex")}.tar`);
  await writeRootfsTar(layerTar);
  const layer = readFileSync(layerTar);
  rmSync(layerTar);
  const layerGz = gzipSync(layer);
  const imageConfig = Buffer.from(
    JSON.stringify({
      architecture: "amd64",
      os: "linux",
      config,
      rootfs: { type: "layers", diff_ids: [`sha256:${createHash("sha256").update(layer).digest("hex")}`] },
    }),
  );
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: blob(imageConfig), size: imageConfig.length },
      layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: blob(layerGz), size: layerGz.length }],
    }),
  );
  const index = {
    schemaVersion: 2,
    manifests: [
      {
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        digest: blob(manifest),
        size: manifest.length,
        platform: { architecture: "amd64", os: "linux" },
      },
    ],
  };
  writeFileSync(join(dir, "index.json"), JSON.stringify(index));
  writeFileSync(join(dir, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}');
}

describe("images", { timeout: VM_TIMEOUT }, () => {
  test("list and get the built-in image", async () => {
    const { images } = await client.listImages();
    assert.ok(images.some((i) => i.name === "default"));
    const image = await client.getImage("default");
    assert.equal(image.format, "ext4");
    assert.ok(image.size_bytes > 0 && image.source.length > 0);
    assert.equal(typeof image.config, "object");
  });

  test("unknown images are 404s", async () => {
    await rejectsWith(client.getImage("ts-no-such-image"), { class: NotFoundError, status: 404 });
    await rejectsWith(client.deleteImage("ts-no-such-image"), { class: NotFoundError, status: 404 });
  });

  test("import a rootfs tarball, spawn it, exec, and delete it (409 while in use)", { skip }, async () => {
    const name = imageName();
    const archive = join(scratch, "busybox-rootfs.tar");
    await writeRootfsTar(archive);
    const events: api.ImageEvent[] = [];
    const image = await client.importImage(archive, { name }, { onEvent: (e) => void events.push(e) });
    assert.equal(image.name, name);
    assert.equal(image.source, "import");
    assert.equal(events.at(-1)?.type, "done");
    assert.ok((await client.listImages()).images.some((i) => i.name === name));

    // A second import under the name is refused (before the upload) unless it replaces.
    await rejectsWith(client.importImage(archive, { name }), { class: ConflictError, status: 409 });

    const sb = await Sandbox.create({ client, image: name });
    try {
      assert.equal(sb.info.image, name);
      const hi = await sb.exec(["/bin/busybox", "echo", "hi"]);
      assert.equal(hi.exitCode, 0);
      assert.equal(hi.stdout, "hi\n");
      assert.ok((await client.getImage(name)).sandboxes?.includes(sb.id));
      await rejectsWith(client.deleteImage(name), { class: ConflictError, status: 409, message: new RegExp(sb.id) });
    } finally {
      await sb.close();
    }
    await client.deleteImage(name);
    await rejectsWith(client.getImage(name), { class: NotFoundError, status: 404 });
  });

  test("import an OCI layout directory; execs get its defaults", { skip }, async () => {
    const name = imageName();
    const layout = join(scratch, "layout");
    await writeOciLayout(layout, {
      Cmd: ["/bin/busybox", "echo", "from-cmd"],
      Env: ["PATH=/bin", "GREETING=hello"],
      WorkingDir: "/bin",
    });
    const image = await client.importImage(layout, { name });
    assert.deepEqual(image.config.cmd, ["/bin/busybox", "echo", "from-cmd"]);
    assert.ok(image.config.env?.includes("GREETING=hello"));
    assert.equal(image.config.working_dir, "/bin");
    assert.equal(image.layers?.length, 1);

    const sb = await Sandbox.create({ client, image: name });
    try {
      assert.equal((await sb.exec([])).stdout, "from-cmd\n");
      const out = await sb.exec(["/bin/busybox", "sh", "-c", "echo $GREETING $EXTRA; pwd"], { env: { EXTRA: "x" } });
      assert.equal(out.stdout, "hello x\n/bin\n");
      assert.equal((await sb.exec(["/bin/busybox", "id", "-u"], { user: "1000" })).stdout.trim(), "1000");
      assert.equal((await sb.exec(["/bin/busybox", "id", "-u"])).stdout.trim(), "0");
    } finally {
      await sb.close();
    }
    await client.deleteImage(name);
  });
});
