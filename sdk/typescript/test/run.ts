/**
 * Global setup of the test suite: start a private `forkvm serve` (unix
 * socket and TCP with a token), run the test files with `node --test`
 * against it, then remove what is left on it and stop it by PID.
 *
 *   FORKVM_URL            use this daemon instead of starting one
 *   FORKVM_BIN            the daemon binary (default <repo>/target/debug/forkvm)
 *   FORKVM_IMAGES_HOME    where guest/ and images/ are (default /var/lib/forkvm); the
 *                         daemon's home links guest/ and each image (in an images/ of its own)
 *   FORKVM_TEST_KEEP=1    keep the temporary FORKVM_HOME
 *
 * Arguments are passed to `node --test` (e.g. a test file, or --test-name-pattern).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
} from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Client } from "forkvm";
import { REPO_ROOT, SDK_ROOT } from "./paths.js";

const TEST_FILES = [
  "openapi.test.js",
  "image-units.test.js",
  "resources.test.js",
  "volume-units.test.js",
  "event-units.test.js",
  "transport.test.js",
  "early-response.test.js",
  "api.test.js",
  "sandbox.test.js",
  "lifecycle.test.js",
  "events.test.js",
  "stream.test.js",
  "processes.test.js",
  "fs.test.js",
  "network.test.js",
  "volumes.test.js",
  "quickstart.test.js",
  "images.test.js",
];

interface Daemon {
  process: ChildProcess;
  home: string;
  env: Record<string, string>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

function fail(message: string): never {
  console.error(`forkvm tests: ${message}`);
  process.exit(2);
}

async function startDaemon(): Promise<Daemon> {
  const bin = process.env.FORKVM_BIN || join(REPO_ROOT, "target/debug/forkvm");
  const artefacts = process.env.FORKVM_IMAGES_HOME || "/var/lib/forkvm";
  if (!existsSync(bin)) fail(`no forkvm binary at ${bin}: build it (cargo build -p forkvm-cli) or set FORKVM_BIN`);
  for (const dir of ["guest", "images"]) {
    if (!existsSync(join(artefacts, dir))) {
      fail(`no ${dir}/ under ${artefacts}: run scripts/setup.sh, or set FORKVM_IMAGES_HOME`);
    }
  }
  const home = mkdtempSync(join(tmpdir(), "forkvm-ts-"));
  symlinkSync(join(artefacts, "guest"), join(home, "guest"));
  // Images: a directory of this daemon's own with the built ones linked in,
  // so that the images the tests import stay in its home.
  mkdirSync(join(home, "images"));
  for (const image of readdirSync(join(artefacts, "images")).sort()) {
    if (!image.startsWith(".")) symlinkSync(join(artefacts, "images", image), join(home, "images", image));
  }
  const port = await freePort();
  const token = randomBytes(16).toString("hex");
  const log = openSync(join(home, "serve.log"), "a");
  const child = spawn(bin, ["serve", "--listen", `127.0.0.1:${port}`], {
    env: { ...process.env, FORKVM_HOME: home, FORKVM_TOKEN: token },
    stdio: ["ignore", log, log],
    // Its own process group: a Ctrl-C reaches only us, and we clean up in order.
    detached: true,
  });
  closeSync(log);
  const socket = join(home, "forkvm.sock");
  const env = {
    FORKVM_URL: `unix://${socket}`,
    FORKVM_TOKEN: token,
    FORKVM_TEST_SOCKET: socket,
    FORKVM_TEST_TCP_URL: `http://127.0.0.1:${port}`,
    FORKVM_TEST_HOME: home,
  };
  const daemon = { process: child, home, env };
  const client = new Client({ url: env.FORKVM_URL });
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      fail(`forkvm serve exited at start:\n${readFileSync(join(home, "serve.log"), "utf8")}`);
    }
    try {
      await client.health();
      break;
    } catch (err) {
      if (Date.now() > deadline) {
        await stopDaemon(daemon);
        fail(`forkvm serve did not answer /v1/health in 30 s: ${String(err)}`);
      }
      await sleep(100);
    }
  }
  client.close();
  console.log(`forkvm tests: daemon ${bin} (pid ${child.pid}) in ${home}, tcp port ${port}`);
  return daemon;
}

/** Remove every sandbox and snapshot left on our daemon, then stop it by PID. */
async function stopDaemon(daemon: Daemon): Promise<void> {
  const client = new Client({ url: daemon.env.FORKVM_URL });
  try {
    const { sandboxes } = await client.listSandboxes();
    await Promise.allSettled(sandboxes.map((s) => client.deleteSandbox(s.id)));
    const { snapshots } = await client.listSnapshots();
    for (const s of snapshots) await client.deleteSnapshot(s.id, { force: true }).catch(() => {});
    if (sandboxes.length) console.log(`forkvm tests: removed ${sandboxes.length} sandboxes left by the tests`);
  } catch (err) {
    console.error(`forkvm tests: cleanup through the API failed: ${String(err)}`);
  } finally {
    client.close();
  }
  const { process: child } = daemon;
  if (child.exitCode === null && child.signalCode === null && child.pid) {
    const exited = new Promise((resolve) => child.once("exit", resolve));
    process.kill(child.pid, "SIGTERM");
    const stopped = await Promise.race([exited.then(() => true), sleep(10_000).then(() => false)]);
    if (!stopped) {
      process.kill(child.pid, "SIGKILL");
      await exited;
    }
  }
  killLeftoverQemu(daemon.home);
  if (process.env.FORKVM_TEST_KEEP) console.log(`forkvm tests: kept ${daemon.home}`);
  else rmSync(daemon.home, { recursive: true, force: true });
}

/**
 * QEMU processes outlive their daemon. Any still listed in our private
 * home's pid files (after a crash mid-test) belong to us: kill them.
 */
function killLeftoverQemu(home: string): void {
  const dir = join(home, "sandboxes");
  if (!existsSync(dir)) return;
  for (const id of readdirSync(dir)) {
    const pidFile = join(dir, id, "qemu.pid");
    if (!existsSync(pidFile)) continue;
    const pid = Number(readFileSync(pidFile, "utf8").trim());
    if (!Number.isInteger(pid) || pid <= 0) continue;
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      if (cmdline.includes(`forkvm-${id}`)) {
        process.kill(pid, "SIGKILL");
        console.error(`forkvm tests: killed leftover QEMU ${pid} of ${id}`);
      }
    } catch {
      // already gone
    }
  }
}

async function main(): Promise<number> {
  const started = Date.now();
  const external = process.env.FORKVM_URL;
  const daemon = external ? undefined : await startDaemon();
  if (external) console.log(`forkvm tests: using the daemon at ${external}`);

  try {
    const code = await runTests(daemon?.env ?? {});
    console.log(`forkvm tests: ${code === 0 ? "passed" : "FAILED"} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    return code;
  } finally {
    if (daemon) await stopDaemon(daemon);
  }
}

/** `node --test` over the test files, one file at a time (they share 2 cores with the VMs). */
async function runTests(env: Record<string, string>): Promise<number> {
  const args = process.argv.slice(2);
  const files = args.some((a) => a.endsWith(".js")) ? [] : TEST_FILES.map((f) => join(SDK_ROOT, "build/test", f));
  const runner = spawn(process.execPath, ["--test", "--test-concurrency=1", "--test-reporter=spec", ...args, ...files], {
    env: { ...process.env, ...env },
    stdio: "inherit",
  });
  let interrupted = false;
  const forward = (signal: NodeJS.Signals): void => {
    interrupted = true;
    if (runner.exitCode === null) runner.kill(signal);
  };
  process.on("SIGINT", forward);
  process.on("SIGTERM", forward);
  const code = await new Promise<number>((resolve) => runner.once("exit", (c, s) => resolve(c ?? (s ? 1 : 0))));
  return interrupted && code === 0 ? 130 : code;
}

process.exitCode = await main();
