// Checks with the official MCP TypeScript SDK (pinned in package-lock.json),
// driven by test_sdk.py: what a TypeScript host does with a long call.
//
//   node sdk_checks.mjs progress URL TOKEN SANDBOX SECONDS
//     run_command `sleep SECONDS` over streamable HTTP with the SDK's default
//     60 s request timeout and resetTimeoutOnProgress: it succeeds only if
//     progress notifications keep arriving.
//   node sdk_checks.mjs cancel FORKVM_BIN SANDBOX
//     over stdio (`forkvm mcp`), start `sleep 313` under a shell, list the
//     guest's processes that are that sleep or its shell after 2.5 s, abort
//     the call after 6 s (the SDK sends notifications/cancelled), and list
//     them again.
//
// Prints one JSON object on stdout.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [mode, ...args] = process.argv.slice(2);
const client = new Client({ name: "forkvm-compat", version: "1.0.0" });

if (mode === "progress") {
  const [url, token, sandbox, seconds] = args;
  await client.connect(
    new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    }),
  );
  let progress = 0;
  const t0 = Date.now();
  const r = await client.callTool(
    { name: "run_command", arguments: { sandbox_id: sandbox, command: `sleep ${seconds}; echo slept` } },
    undefined,
    { onprogress: () => { progress += 1; }, resetTimeoutOnProgress: true },
  );
  console.log(JSON.stringify({
    protocol: client.getNegotiatedProtocolVersion?.() ?? null,
    progress, elapsed_s: (Date.now() - t0) / 1000,
    is_error: r.isError ?? false, stdout: r.structuredContent?.stdout ?? null,
  }));
} else if (mode === "cancel") {
  const [bin, sandbox] = args;
  await client.connect(new StdioClientTransport({ command: bin, args: ["mcp"], env: process.env, stderr: "inherit" }));
  // The number is put together at run time, so this scan does not find itself.
  const scan = async () => {
    const r = await client.callTool({
      name: "run_command",
      arguments: {
        sandbox_id: sandbox,
        command: 'n=31; n="${n}3"; for d in /proc/[0-9]*; do grep -qF sleep "$d/cmdline" 2>/dev/null && grep -qF "$n" "$d/cmdline" 2>/dev/null && echo "${d#/proc/}"; done; true',
      },
    });
    return (r.structuredContent?.stdout ?? "").trim();
  };
  const ac = new AbortController();
  setTimeout(() => ac.abort("the test gave up"), 6000);
  let before = null;
  setTimeout(async () => { before = await scan(); }, 2500);
  let aborted = null;
  try {
    await client.callTool(
      { name: "run_command", arguments: { sandbox_id: sandbox, command: "sleep 313; echo never" } },
      undefined,
      { signal: ac.signal, timeout: 600000 },
    );
  } catch (e) {
    aborted = String(e);
  }
  // The kill happens on the server when the notification arrives; give it a moment.
  await new Promise((ok) => setTimeout(ok, 3000));
  const left = await scan();
  console.log(JSON.stringify({ aborted, before, left }));
}
await client.close();
