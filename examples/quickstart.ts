/**
 * forkvm quickstart (TypeScript): start a sandbox, run Python in it, branch
 * it into two children that continue from the same instant, and show what
 * each child does from there.
 *
 * With `forkvm serve` running (FORKVM_URL or $FORKVM_HOME/forkvm.sock):
 *   cd sdk/typescript && npm ci && npm run example
 * or, in a project that depends on `forkvm`: npx tsx quickstart.ts
 */
import { Sandbox } from "forkvm";

// A small "agent" whose state lives in the guest: each run appends a step.
const AGENT = `
import json, pathlib, sys
state = pathlib.Path("/tmp/state.json")
steps = json.loads(state.read_text()) if state.exists() else []
steps.append(sys.argv[1])
state.write_text(json.dumps(steps))
print(" -> ".join(steps))
`;

async function main(): Promise<void> {
  // `await using` removes the sandbox when main() returns, even on error.
  await using sb = await Sandbox.create();
  console.log(`sandbox ${sb.id} is running`);

  const hello = await sb.exec(["python3", "-c", "import platform; print('Python', platform.python_version())"]);
  console.log(`sandbox: ${hello.stdout.trim()}`);

  await sb.files.write("/tmp/agent.py", AGENT);
  const setup = await sb.exec(["python3", "/tmp/agent.py", "setup"]);
  console.log(`sandbox: ${setup.stdout.trim()}`);

  // Snapshot the running sandbox and start two children from that instant.
  const plans = ["try-plan-a", "try-plan-b"];
  const branch = await sb.branch({ count: plans.length });
  console.log(`branched into ${branch.children.length} children (source paused ${branch.pauseMs.toFixed(1)} ms)`);
  try {
    const results = await Promise.all(
      branch.children.map((child, i) => child.exec(["python3", "/tmp/agent.py", plans[i]!])),
    );
    results.forEach((result, i) => console.log(`child ${branch.children[i]!.id}: ${result.stdout.trim()}`));

    const source = await sb.exec(["python3", "/tmp/agent.py", "source-goes-on"]);
    console.log(`sandbox: ${source.stdout.trim()}`);
  } finally {
    // Removing the branch point with force removes its children too.
    await branch.snapshot.delete({ force: true });
  }
  console.log("done");
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
