#!/usr/bin/env python3
"""Tree search with forkvm: branch a sandbox 8 ways, try an edit in each, keep the best.

An "agent" sets up a small project in a sandbox: a data set, and a program
that fits a line to it by gradient descent, with a tunable learning rate.
Preparing the data is the expensive part, so it is done once. Then one
``branch(count=8)`` gives eight children that continue from that exact
instant, files and all. Each child gets a different edit of the learning
rate, runs the program and reports a score. The best child is kept; the
other children and the parent are removed.

Run it against a daemon (``FORKVM_URL``/``FORKVM_TOKEN``, or the local
socket ``$FORKVM_HOME/forkvm.sock``)::

    pip install ./sdk/python
    python3 examples/tree_search.py            # keeps the winner running
    python3 examples/tree_search.py --cleanup  # removes the winner too
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Tuple

try:
    from forkvm import Sandbox
except ImportError:  # running from a checkout without the SDK installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk" / "python" / "src"))
    from forkvm import Sandbox

WORKDIR = "/root/project"

MAKE_DATA = """\
import json, random
rng = random.Random(7)
points = []
for _ in range(200):
    x = rng.uniform(-2.0, 2.0)
    points.append((x, 2.5 * x - 1.0 + rng.gauss(0.0, 0.3)))
with open("data.json", "w") as f:
    json.dump(points, f)
print(len(points), "points")
"""

FIT = """\
import json, math

LEARNING_RATE = 0.01  # the knob the agent tunes
EPOCHS = 12

with open("data.json") as f:
    points = json.load(f)

w = b = 0.0
for _ in range(EPOCHS):
    gw = sum((w * x + b - y) * x for x, y in points) * 2 / len(points)
    gb = sum((w * x + b - y) for x, y in points) * 2 / len(points)
    w -= LEARNING_RATE * gw
    b -= LEARNING_RATE * gb
    if not (math.isfinite(w) and math.isfinite(b)) or abs(w) > 1e12:
        break

mse = sum((w * x + b - y) ** 2 for x, y in points) / len(points)
print(json.dumps({"w": w, "b": b, "mse": mse if math.isfinite(mse) else None}))
"""

#: The edit tried in each of the eight branches.
CANDIDATES = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 0.7, 1.7]


def score_of(output: str) -> float:
    """Higher is better: the negated mean squared error (-inf when it diverged)."""
    mse = json.loads(output.strip().splitlines()[-1])["mse"]
    return -mse if mse is not None and math.isfinite(mse) else -math.inf


def try_edit(child: Sandbox, rate: float) -> Tuple[Sandbox, float, float]:
    """Apply one edit in ``child``, run the program, return its score."""
    source = child.files.read_text(f"{WORKDIR}/fit.py")
    edited = source.replace("LEARNING_RATE = 0.01", f"LEARNING_RATE = {rate}")
    child.files.write(f"{WORKDIR}/fit.py", edited)
    result = child.exec(["python3", "fit.py"], cwd=WORKDIR, timeout=120, check=True)
    return child, rate, score_of(result.stdout)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cleanup", action="store_true", help="also remove the winner and the branch snapshot")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    root = Sandbox()
    print(f"root sandbox {root.id}")
    try:
        root.exec(["mkdir", "-p", WORKDIR], check=True)
        root.files.write(f"{WORKDIR}/make_data.py", MAKE_DATA)
        root.files.write(f"{WORKDIR}/fit.py", FIT)
        print("prepared:", root.exec(["python3", "make_data.py"], cwd=WORKDIR, check=True).stdout.strip())
        baseline = score_of(root.exec(["python3", "fit.py"], cwd=WORKDIR, check=True).stdout)
        print(f"baseline (LEARNING_RATE = 0.01): score {baseline:.6g}")

        branch = root.branch(count=len(CANDIDATES))
        print(
            f"branched {len(branch.children)} ways from {branch.snapshot.id} in {branch.total_ms / 1000:.1f} s"
            f" (the source paused {branch.pause_ms:.0f} ms)"
        )
    finally:
        root.close()  # the children continue on their own

    t1 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=len(branch.children)) as pool:
            outcomes = list(pool.map(try_edit, branch.children, CANDIDATES))
    except BaseException:
        branch.close()
        branch.snapshot.delete(force=True)
        raise

    print(f"ran {len(outcomes)} edits in {time.monotonic() - t1:.1f} s")
    for child, rate, score in outcomes:
        print(f"  {child.id}  LEARNING_RATE = {rate:<6} score {score:.6g}")
    best, best_rate, best_score = max(outcomes, key=lambda o: o[2])
    branch.close(keep=[best])
    print(f"best: {best.id} score={best_score:.6g} (LEARNING_RATE = {best_rate}) in {time.monotonic() - t0:.1f} s")

    if args.cleanup:
        best.close()
        branch.snapshot.delete()
        print("removed the winner and the branch snapshot")
    else:
        print(f"kept {best.id}; remove it with `forkvm rm {best.id}` and `forkvm snapshot rm {branch.snapshot.id}`")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
