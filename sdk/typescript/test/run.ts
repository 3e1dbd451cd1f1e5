/**
 * Global setup of the test suite: start a private `forkvm serve` (unix
 * socket and TCP with a token; see daemon.ts), run the test files with
 * `node --test` against it, then remove what is left on it and stop it by PID.
 *
 *   FORKVM_URL            use this daemon instead of starting one
 *   FORKVM_BIN            the daemon binary (default <repo>/target/debug/forkvm)
 *   FORKVM_IMAGES_HOME    where guest/ and images/ are (default /var/lib/forkvm); the
 *                         daemon's home links guest/ and each image (in an images/ of its own)
 *   FORKVM_TEST_KEEP=1    print the daemon's log at the end (its home goes with it)
 *
 * Arguments are passed to `node --test` (e.g. a test file, or --test-name-pattern).
 */
import { spawn } from "node:child_process";
import { join } from "node:path";
import { startDaemon, stopDaemon } from "./daemon.js";
import { SDK_ROOT } from "./paths.js";

const TEST_FILES = [
  "openapi.test.js",
  "image-units.test.js",
  "transfer-units.test.js",
  "resources.test.js",
  "volume-units.test.js",
  "treediff-units.test.js",
  "event-units.test.js",
  "transport.test.js",
  "early-response.test.js",
  "api.test.js",
  "sandbox.test.js",
  "lifecycle.test.js",
  "timetravel.test.js",
  "treediff.test.js",
  "events.test.js",
  "stream.test.js",
  "processes.test.js",
  "fs.test.js",
  "network.test.js",
  "volumes.test.js",
  "quickstart.test.js",
  "images.test.js",
  "registry.test.js",
];

function fail(message: string): never {
  console.error(`forkvm tests: ${message}`);
  process.exit(2);
}

async function main(): Promise<number> {
  const started = Date.now();
  const external = process.env.FORKVM_URL;
  const daemon = external
    ? undefined
    : await startDaemon().catch((err: unknown) => fail(err instanceof Error ? err.message : String(err)));
  if (daemon) {
    const bin = daemon.process.spawnfile;
    console.log(`forkvm tests: daemon ${bin} (pid ${daemon.process.pid}) in ${daemon.home}, tcp port ${daemon.port}`);
  }
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
