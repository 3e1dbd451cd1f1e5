/**
 * Starting and stopping a private `forkvm serve`: the runner's (test/run.ts),
 * and a second one for the tests that need two hosts (registry.test.ts).
 *
 * Its home is a temporary directory that links `guest/` and each image of
 * `$FORKVM_IMAGES_HOME` (default /var/lib/forkvm), so that what the tests
 * import or pull stays in the home; it serves its unix socket and, with a
 * random token, TCP on a free loopback port. It is stopped by its PID.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Client } from "forkvm";
import { REPO_ROOT } from "./paths.js";

export interface Daemon {
  process: ChildProcess;
  home: string;
  /** FORKVM_URL (its socket), FORKVM_TOKEN, and FORKVM_TEST_* for the test files. */
  env: Record<string, string>;
  /** The TCP port it also listens on. */
  port: number;
}

/** A TCP port free on 127.0.0.1 right now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/**
 * Start a daemon in a new temporary home; resolves once it answers
 * `/v1/health`. `extraEnv` is added to its environment (e.g.
 * `FORKVM_NET_POOL` for a second daemon, whose sandbox networks must not
 * overlap the first's). Throws, with the reason, when it cannot start.
 */
export async function startDaemon(extraEnv: Record<string, string> = {}): Promise<Daemon> {
  const bin = process.env.FORKVM_BIN || join(REPO_ROOT, "target/debug/forkvm");
  const artefacts = process.env.FORKVM_IMAGES_HOME || "/var/lib/forkvm";
  if (!existsSync(bin)) throw new Error(`no forkvm binary at ${bin}: build it (cargo build -p forkvm-cli) or set FORKVM_BIN`);
  for (const dir of ["guest", "images"]) {
    if (!existsSync(join(artefacts, dir))) {
      throw new Error(`no ${dir}/ under ${artefacts}: run scripts/setup.sh, or set FORKVM_IMAGES_HOME`);
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
  const daemonEnv: Record<string, string | undefined> = { ...process.env, FORKVM_HOME: home, FORKVM_TOKEN: token, ...extraEnv };
  delete daemonEnv.FORKVM_URL;
  const child = spawn(bin, ["serve", "--listen", `127.0.0.1:${port}`], {
    env: daemonEnv,
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
    FORKVM_TEST_DAEMON_PID: String(child.pid),
  };
  const daemon = { process: child, home, env, port };
  const client = new Client({ url: env.FORKVM_URL });
  const deadline = Date.now() + 30_000;
  try {
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        const text = readFileSync(join(home, "serve.log"), "utf8");
        await stopDaemon(daemon, { quiet: true });
        throw new Error(`forkvm serve exited at start:\n${text}`);
      }
      try {
        await client.health();
        break;
      } catch (err) {
        if (Date.now() > deadline) {
          await stopDaemon(daemon, { quiet: true });
          throw new Error(`forkvm serve did not answer /v1/health in 30 s: ${String(err)}`);
        }
        await sleep(100);
      }
    }
  } finally {
    client.close();
  }
  return daemon;
}

/** Remove every sandbox and snapshot left on the daemon, then stop it by PID and remove its home. */
export async function stopDaemon(daemon: Daemon, opts: { quiet?: boolean } = {}): Promise<void> {
  const { process: child } = daemon;
  const running = (): boolean => child.exitCode === null && child.signalCode === null;
  if (running()) {
    const client = new Client({ url: daemon.env.FORKVM_URL });
    try {
      const { sandboxes } = await client.listSandboxes();
      await Promise.allSettled(sandboxes.map((s) => client.deleteSandbox(s.id)));
      const { snapshots } = await client.listSnapshots();
      for (const s of snapshots) await client.deleteSnapshot(s.id, { force: true }).catch(() => {});
      if (sandboxes.length && !opts.quiet) console.log(`forkvm tests: removed ${sandboxes.length} sandboxes left by the tests`);
    } catch (err) {
      if (!opts.quiet) console.error(`forkvm tests: cleanup through the API failed: ${String(err)}`);
    } finally {
      client.close();
    }
  }
  if (running() && child.pid) {
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
