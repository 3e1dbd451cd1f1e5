/**
 * A small tar writer: packs a directory tree into a file, for the uploads of
 * the image operations (an OCI image layout to import, a build context).
 *
 * Format: POSIX ustar (512-byte headers, contents padded to 512 bytes, two
 * zero blocks at the end). A value that ustar cannot hold (a path or link
 * target longer than its fields, a size of 8 GiB or more, a large uid or
 * gid) goes into a PAX extended header (`x`) before its entry, as GNU tar
 * and the daemon's reader understand. Entries are named relative to the
 * directory, with `/` separators (directories end in `/`), in sorted order,
 * parents before their contents. Regular files, directories and symbolic
 * links (kept as links, never followed) are packed; sockets, FIFOs and
 * devices are skipped. Hard links are packed as separate files.
 *
 * @module
 */
import { randomBytes } from "node:crypto";
import { open, type FileHandle, lstat, readdir, readlink, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const BLOCK = 512;
/** File contents are copied in pieces of this size. */
const CHUNK = 1 << 20;
/** The largest value of an octal field of `width` bytes (width - 1 digits and a NUL). */
const maxOctal = (width: number): number => 8 ** (width - 1) - 1;

/** One entry of a tar, as {@link TarWriter.add} takes it. */
export interface TarEntry {
  /** Relative path, `/`-separated; a directory's may end in `/`. */
  name: string;
  type: "file" | "directory" | "symlink";
  /** Permission bits (e.g. `0o644`). */
  mode: number;
  uid?: number;
  gid?: number;
  /** Seconds since the epoch. */
  mtime?: number;
  /** A file's size in bytes (its content must be exactly this long). */
  size?: number;
  /** A symlink's target. */
  linkname?: string;
}

/** Writes a tar to a file handle, entry by entry (see the module documentation). */
export class TarWriter {
  readonly #out: FileHandle;
  #position = 0;

  constructor(out: FileHandle) {
    this.#out = out;
  }

  /** Bytes written so far. */
  get size(): number {
    return this.#position;
  }

  /** Add an entry; a file's content comes from `content` (exactly `entry.size` bytes). */
  async add(entry: TarEntry, content?: AsyncIterable<Uint8Array> | Uint8Array): Promise<void> {
    const size = entry.type === "file" ? (entry.size ?? 0) : 0;
    for (const block of headerBlocks(entry, size)) await this.#write(block);
    if (entry.type !== "file") return;
    let written = 0;
    const pieces = content instanceof Uint8Array ? [content] : (content ?? []);
    for await (const piece of pieces) {
      written += piece.byteLength;
      if (written > size) break;
      await this.#write(piece);
    }
    if (written !== size) {
      throw new Error(`${entry.name} changed while it was being packed (${written} bytes, not ${size}); try again`);
    }
    await this.#pad();
  }

  /** Write the end-of-archive marker (two zero blocks). */
  async finish(): Promise<void> {
    await this.#write(new Uint8Array(2 * BLOCK));
  }

  async #write(data: Uint8Array): Promise<void> {
    let offset = 0;
    while (offset < data.byteLength) {
      const { bytesWritten } = await this.#out.write(data, offset, data.byteLength - offset, this.#position);
      offset += bytesWritten;
      this.#position += bytesWritten;
    }
  }

  async #pad(): Promise<void> {
    const rest = this.#position % BLOCK;
    if (rest) await this.#write(new Uint8Array(BLOCK - rest));
  }
}

/** The header block(s) of an entry: a PAX extended header first when ustar's fields are too small. */
export function headerBlocks(entry: TarEntry, size: number): Uint8Array[] {
  let name = entry.name.replace(/^\.?\/+/, "");
  if (!name) throw new Error(`a tar entry needs a relative name, not ${JSON.stringify(entry.name)}`);
  if (entry.type === "directory" && !name.endsWith("/")) name += "/";
  const linkname = entry.linkname ?? "";
  const uid = entry.uid ?? 0;
  const gid = entry.gid ?? 0;
  const pax: [string, string][] = [];
  const split = splitName(name);
  if (!split) pax.push(["path", name]);
  if (utf8(linkname).byteLength > 100) pax.push(["linkpath", linkname]);
  if (size > maxOctal(12)) pax.push(["size", String(size)]);
  if (uid > maxOctal(8)) pax.push(["uid", String(uid)]);
  if (gid > maxOctal(8)) pax.push(["gid", String(gid)]);

  const blocks: Uint8Array[] = [];
  if (pax.length) {
    const records = utf8(pax.map(([k, v]) => paxRecord(k, v)).join(""));
    const shortName = `PaxHeader/${asciiTail(name, 80)}`;
    blocks.push(ustarHeader({ name: shortName, prefix: "", type: "x", mode: 0o644, size: records.byteLength }));
    blocks.push(padded(records));
  }
  const [prefix, rest] = split ?? ["", asciiTail(name, 100)];
  blocks.push(
    ustarHeader({
      name: rest,
      prefix,
      type: entry.type === "file" ? "0" : entry.type === "directory" ? "5" : "2",
      mode: entry.mode & 0o7777,
      uid: Math.min(uid, maxOctal(8)),
      gid: Math.min(gid, maxOctal(8)),
      size: Math.min(size, maxOctal(12)),
      mtime: Math.max(0, Math.min(Math.floor(entry.mtime ?? 0), maxOctal(12))),
      linkname: utf8(linkname).byteLength > 100 ? asciiTail(linkname, 100) : linkname,
    }),
  );
  return blocks;
}

/** `[prefix, name]` fitting ustar's 155- and 100-byte fields, or undefined when no split fits. */
function splitName(name: string): [string, string] | undefined {
  if (utf8(name).byteLength <= 100) return ["", name];
  // Split at a slash (not a directory's trailing one) so that both parts fit.
  for (let i = name.length - 2; i > 0; i--) {
    if (name[i] !== "/") continue;
    const prefix = name.slice(0, i);
    const rest = name.slice(i + 1);
    if (utf8(prefix).byteLength <= 155 && utf8(rest).byteLength <= 100 && rest) return [prefix, rest];
    if (utf8(prefix).byteLength <= 155) break; // a shorter prefix only lengthens the rest
  }
  return undefined;
}

/** A PAX record, `"<length> <key>=<value>\n"`, whose length counts itself. */
export function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bytes = utf8(body).byteLength;
  const digits = String(bytes).length;
  let length = bytes + digits;
  // Adding the digits may have added a digit (98 bytes: "101 ...", not "100 ...").
  if (String(length).length !== digits) length = bytes + String(length).length;
  return `${length}${body}`;
}

interface HeaderFields {
  name: string;
  prefix: string;
  type: string;
  mode: number;
  uid?: number;
  gid?: number;
  size: number;
  mtime?: number;
  linkname?: string;
}

function ustarHeader(h: HeaderFields): Uint8Array {
  const block = new Uint8Array(BLOCK);
  const put = (offset: number, width: number, text: string): void => {
    const bytes = utf8(text);
    if (bytes.byteLength > width) throw new Error(`tar header field too long: ${text}`);
    block.set(bytes, offset);
  };
  const octal = (offset: number, width: number, value: number): void =>
    put(offset, width, value.toString(8).padStart(width - 1, "0"));
  put(0, 100, h.name);
  octal(100, 8, h.mode);
  octal(108, 8, h.uid ?? 0);
  octal(116, 8, h.gid ?? 0);
  octal(124, 12, h.size);
  octal(136, 12, h.mtime ?? 0);
  block.fill(0x20, 148, 156); // the checksum counts its own field as spaces
  put(156, 1, h.type);
  put(157, 100, h.linkname ?? "");
  put(257, 6, "ustar");
  put(263, 2, "00");
  put(345, 155, h.prefix);
  const sum = block.reduce((acc, byte) => acc + byte, 0);
  put(148, 8, `${sum.toString(8).padStart(6, "0")}\0 `);
  return block;
}

function padded(data: Uint8Array): Uint8Array {
  const out = new Uint8Array(Math.ceil(data.byteLength / BLOCK) * BLOCK);
  out.set(data);
  return out;
}

function utf8(text: string): Uint8Array {
  return Buffer.from(text, "utf8");
}

/** The end of `text`, at most `max` bytes of ASCII (for the ustar fields of an entry that has a PAX header). */
function asciiTail(text: string, max: number): string {
  const ascii = text.replace(/[^\x20-\x7e]/g, "_");
  return ascii.length <= max ? ascii : ascii.slice(ascii.length - max);
}

/** Add `dir`'s contents (recursively) under `base` (`""` for the top). */
async function addTree(tar: TarWriter, dir: string, base: string, skip: (name: string) => boolean): Promise<void> {
  const names = (await readdir(dir)).sort();
  for (const name of names) {
    const rel = base + name;
    if (skip(rel)) continue;
    const path = join(dir, name);
    const st = await lstat(path);
    const common = { name: rel, mode: st.mode, uid: st.uid, gid: st.gid, mtime: st.mtimeMs / 1000 };
    if (st.isDirectory()) {
      await tar.add({ ...common, type: "directory" });
      await addTree(tar, path, `${rel}/`, skip);
    } else if (st.isSymbolicLink()) {
      await tar.add({ ...common, type: "symlink", linkname: await readlink(path) });
    } else if (st.isFile()) {
      const file = await open(path, "r");
      try {
        await tar.add({ ...common, type: "file", size: st.size }, readChunks(file));
      } finally {
        await file.close();
      }
    }
    // Sockets, FIFOs and devices have no place in an upload: skipped.
  }
}

async function* readChunks(file: FileHandle): AsyncGenerator<Uint8Array> {
  for (;;) {
    const buffer = new Uint8Array(CHUNK);
    const { bytesRead } = await file.read(buffer, 0, CHUNK, null);
    if (bytesRead === 0) return;
    yield buffer.subarray(0, bytesRead);
  }
}

/** A file added to a packed directory, from memory. */
export interface ExtraFile {
  name: string;
  data: Uint8Array;
  /** Default `0o644`. */
  mode?: number;
}

/**
 * Pack the contents of `dir` into a new temporary tar file (under the
 * system's temporary directory) and return its path; the caller removes it.
 * `extra` files are added at the end, replacing any entry of the same name
 * in `dir`.
 */
export async function packDirectory(dir: string, extra: ExtraFile[] = []): Promise<string> {
  if (!(await lstat(dir).catch(() => undefined))?.isDirectory()) throw new Error(`${dir} is not a directory`);
  const path = join(tmpdir(), `forkvm-upload-${randomBytes(8).toString("hex")}.tar`);
  const out = await open(path, "wx", 0o600);
  const replaced = new Set(extra.map((e) => e.name));
  try {
    const tar = new TarWriter(out);
    // The temporary file may lie inside the directory packed: never pack it.
    const root = resolve(dir);
    const inside = path.startsWith(`${root}/`) ? path.slice(root.length + 1) : "";
    await addTree(tar, dir, "", (rel) => replaced.has(rel) || rel === inside);
    const now = Math.floor(Date.now() / 1000);
    for (const e of extra) {
      await tar.add({ name: e.name, type: "file", mode: e.mode ?? 0o644, size: e.data.byteLength, mtime: now }, e.data);
    }
    await tar.finish();
    await out.close();
  } catch (err) {
    await out.close().catch(() => {});
    await rm(path, { force: true });
    throw err;
  }
  return path;
}
