/**
 * What the test files share: the daemon the runner started (or FORKVM_URL),
 * and assertions on errors.
 */
import assert from "node:assert/strict";
import { Client, ForkvmError, type Transport, type TransportRequest } from "forkvm";

/** The daemon under test (`test/run.ts` sets FORKVM_URL), from the environment. */
export const env = {
  url: process.env.FORKVM_URL,
  token: process.env.FORKVM_TOKEN,
  /** The runner's daemon also listens here, with FORKVM_TOKEN. */
  tcpUrl: process.env.FORKVM_TEST_TCP_URL ?? (process.env.FORKVM_URL?.startsWith("http") ? process.env.FORKVM_URL : undefined),
  /** The runner's daemon's unix socket. */
  socket:
    process.env.FORKVM_TEST_SOCKET ??
    (process.env.FORKVM_URL?.startsWith("unix:") ? process.env.FORKVM_URL.replace(/^unix:(\/\/)?/, "") : undefined),
};

/** A client of the daemon under test. */
export function testClient(): Client {
  return new Client();
}

/** Timeouts for tests that boot or branch VMs (TCG on 2 cores is slow). */
export const VM_TIMEOUT = 180_000;

/** Assert that `promise` rejects with a ForkvmError of this class, status and code. */
export async function rejectsWith(
  promise: Promise<unknown>,
  expected: { class?: abstract new (...args: never[]) => ForkvmError; status: number; code?: string; message?: RegExp },
): Promise<ForkvmError> {
  let caught: unknown;
  try {
    await promise;
  } catch (err) {
    caught = err;
  }
  assert.ok(caught instanceof ForkvmError, `expected a ForkvmError, got ${String(caught)}`);
  assert.equal(caught.status, expected.status, `status of: ${caught.message}`);
  if (expected.class) assert.ok(caught instanceof expected.class, `${caught.name} is not a ${expected.class.name}`);
  if (expected.code) assert.equal(caught.code, expected.code, `code of: ${caught.message}`);
  if (expected.message) assert.match(caught.message, expected.message);
  assert.ok(caught.message.length > 0);
  return caught;
}

/** A unique tag, so reruns against a long-lived daemon (FORKVM_URL) do not collide. */
export function uniqueTag(name: string): string {
  return `${name}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

/** Call `fn` until `ok` accepts its result (every 100 ms, for up to `timeoutMs`); return that result. */
export async function eventually<T>(fn: () => Promise<T>, ok: (value: T) => boolean, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (ok(value) || Date.now() > deadline) return value;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A transport that records each request and goes no further (the call rejects with "recorded"). */
export class RecordingTransport implements Transport {
  readonly url = "record://";
  requests: TransportRequest[] = [];
  request(req: TransportRequest): Promise<never> {
    this.requests.push(req);
    return Promise.reject(new Error("recorded"));
  }
  close(): void {}

  /** The JSON body of the last request. */
  lastBody(): unknown {
    const last = this.requests.at(-1);
    return last?.body === undefined ? undefined : JSON.parse(String(last.body));
  }
}
