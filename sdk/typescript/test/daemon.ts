/**
 * Starting and stopping a private daemon: the runner's (test/run.ts), and a
 * second one for the tests that need two hosts (registry.test.ts).
 *
 * Both come from the one test launcher, `forkvm serve --ephemeral`
 * (docs/testing.md, "The test launcher"): a temporary home linking `guest/`
 * and each image of `$FORKVM_IMAGES_HOME` (default /var/lib/forkvm), so that
 * what the tests import or pull stays in the home; its unix socket and, with
 * a random token, TCP on a free loopback port; a network pool and jail uids
 * of its own. It prints one JSON line when ready (or exits within its own
 * readiness timeout). It ends when its stdin reaches end of file, which the
 * kernel causes however this process ends, and then removes every sandbox
 * and its home.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
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
  /** Its log (stderr), kept in memory: a killed run leaves no file. */
  log: () => string;
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
 * Start a daemon with the launcher; resolves once it is ready. `extraEnv` is
 * added to its environment. Throws, with the reason, when it cannot start.
 */
export async function startDaemon(extraEnv: Record<string, string> = {}): Promise<Daemon> {
  const bin = process.env.FORKVM_BIN || join(REPO_ROOT, "target/debug/forkvm");
  const artefacts = process.env.FORKVM_IMAGES_HOME || "/var/lib/forkvm";
  if (!existsSync(bin)) throw new Error(`no forkvm binary at ${bin}: build it (cargo build -p forkvm-cli) or set FORKVM_BIN`);
  const daemonEnv: Record<string, string | undefined> = { ...process.env, ...extraEnv };
  delete daemonEnv.FORKVM_URL;
  delete daemonEnv.FORKVM_TOKEN;
  const child = spawn(bin, ["serve", "--ephemeral", "--print-json", "--artifacts", artefacts], {
    env: daemonEnv,
    stdio: ["pipe", "pipe", "pipe"],
  });
  let logBuf = "";
  child.stderr!.on("data", (d: Buffer) => {
    logBuf = (logBuf + d.toString()).slice(-1_000_000);
  });
  const line = await new Promise<string>((resolve) => {
    let buf = "";
    child.stdout!.on("data", (d: Buffer) => {
      buf += d.toString();
      if (buf.includes("\n")) resolve(buf.slice(0, buf.indexOf("\n")));
    });
    child.stdout!.on("close", () => resolve(buf));
  });
  child.stdout!.destroy();
  let info: { home: string; socket: string; token: string; url: string; port: number; pid: number };
  try {
    info = JSON.parse(line);
  } catch {
    await new Promise((resolve) => (child.exitCode === null && child.signalCode === null ? child.once("exit", resolve) : resolve(null)));
    const text = logBuf;
    throw new Error(`forkvm serve --ephemeral exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${text}`);
  }
  // Neither keeps this process alive; if it exits, the daemon cleans up.
  child.unref();
  (child.stdin as unknown as { unref?: () => void }).unref?.();
  (child.stderr as unknown as { unref?: () => void }).unref?.();
  const env = {
    FORKVM_URL: `unix://${info.socket}`,
    FORKVM_TOKEN: info.token,
    FORKVM_TEST_SOCKET: info.socket,
    FORKVM_TEST_TCP_URL: info.url,
    FORKVM_TEST_HOME: info.home,
    FORKVM_TEST_DAEMON_PID: String(info.pid),
  };
  return { process: child, home: info.home, env, port: info.port, log: () => logBuf };
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
  if (running()) {
    // The end of its stdin: it removes every sandbox and its home.
    const exited = new Promise((resolve) => child.once("exit", resolve));
    // Waited for: it was unref()ed so as not to hold this process alive.
    child.ref();
    child.stdin?.end();
    const stopped = await Promise.race([exited.then(() => true), sleep(180_000, undefined, { ref: false }).then(() => false)]);
    if (!stopped) {
      // Its reaper removes what it leaves.
      console.error("forkvm tests: forkvm serve --ephemeral did not end within 180 s; killing it");
      child.kill("SIGKILL");
      await exited;
    }
  }
  if (process.env.FORKVM_TEST_KEEP) console.log(`forkvm tests: the daemon's log:\n${daemon.log()}`);
}
