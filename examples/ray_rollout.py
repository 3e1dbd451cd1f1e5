#!/usr/bin/env python3
"""RL-style rollouts on a forkvm cluster from Ray: one parent, 64 children, a score each.

The parent sandbox prepares an environment once (here: a task file and a
scoring script). ``branch(count=64)`` through the cluster endpoint gives 64
children that continue from that instant; the endpoint puts them on the
parent's node first and on the other nodes when it is full. Each child is
then handed to a Ray task (sandbox handles pickle as url, token and id), the
task runs a rollout in it (a different "policy" per child) and scores it,
and the driver gathers the scores. The children and the parent are removed
at the end.

Start a cluster first (docs/cluster.md), then::

    python -m forkvm.ray up --nodes 3          # a local trial on 127.0.0.1
    python examples/ray_rollout.py             # --count 64 by default
    python -m forkvm.ray down
"""

from __future__ import annotations

import argparse
import json
import collections
import os
import sys
import time
from pathlib import Path

try:
    import forkvm.ray
except ImportError:  # running from a checkout without the SDK installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk" / "python" / "src"))
    import forkvm.ray

import forkvm

SCORE = """\
import json, sys
task = json.load(open("/root/env/task.json"))
policy = int(sys.argv[1])
# A stand-in for a rollout: the policy's guess against the hidden target.
guess = (policy * 37) % 101
print(json.dumps({"policy": policy, "score": -abs(guess - task["target"])}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=64, help="children to branch (default 64)")
    parser.add_argument("--dir", help="the cluster directory (default: $FORKVM_CLUSTER_DIR or /var/lib/forkvm-cluster)")
    parser.add_argument("--memory-mib", type=int, default=256)
    args = parser.parse_args()

    cluster = json.load(open(os.path.join(args.dir or forkvm.ray.default_dir(), "cluster.json")))
    if cluster["ray_address"].startswith("127.0.0.1:"):
        # A local trial cluster is on loopback: Ray must be told before it is imported.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    ray.init(address=cluster["ray_address"], logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=0)
    def rollout(child: forkvm.Sandbox, policy: int) -> dict:
        # Runs in a Ray worker: the handle came pickled; it connects to the endpoint on first use.
        result = child.exec(["python3", "/root/env/score.py", str(policy)], check=True)
        return {"id": child.id, **json.loads(result.stdout)}

    t0 = time.monotonic()
    parent = forkvm.ray.spawn(memory_mib=args.memory_mib, network="none", dir=args.dir)
    children = []
    try:
        parent.files.write("/root/env/task.json", json.dumps({"target": 42}))
        parent.files.write("/root/env/score.py", SCORE)
        print(f"parent {parent.id} ready in {time.monotonic() - t0:.1f} s")

        t1 = time.monotonic()
        branch = parent.branch(count=args.count)
        children = list(branch.children)
        nodes = collections.Counter(c.id.split("-")[1] if c.id.count("-") == 2 else "?" for c in children)
        print(f"{len(children)} children in {time.monotonic() - t1:.1f} s, by node: {dict(sorted(nodes.items()))}")

        t2 = time.monotonic()
        results = ray.get([rollout.remote(child, i) for i, child in enumerate(children)])
        best = max(results, key=lambda r: r["score"])
        print(f"{len(results)} rollouts scored in {time.monotonic() - t2:.1f} s; "
              f"best: policy {best['policy']} in {best['id']} (score {best['score']})")
        for r in sorted(results, key=lambda r: -r["score"])[:5]:
            print(f"  {r['id']}  policy {r['policy']:3d}  score {r['score']}")
    finally:
        for child in children:
            child.close()
        parent.close()
        print(f"removed {len(children)} children and the parent; {time.monotonic() - t0:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
