"""``examples/tree_search.py`` runs end to end against the daemon under test."""

from __future__ import annotations

import re
import subprocess
import sys

from forkvm import Client

from .conftest import REPO

EXAMPLE = REPO / "examples" / "tree_search.py"


def test_tree_search(daemon, client: Client) -> None:
    before = {s.id for s in client.list_sandboxes().sandboxes}
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--cleanup"],
        env=daemon.env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    tried = re.findall(r"^\s+(sb-[0-9a-f]+)\s+LEARNING_RATE = (\S+)\s+score (\S+)$", run.stdout, re.M)
    assert len(tried) == 8, run.stdout
    best = re.search(r"^best: (sb-[0-9a-f]+) score=(\S+)", run.stdout, re.M)
    assert best, run.stdout
    scores = {sb: float(score) for sb, _, score in tried}
    assert best.group(1) in scores and float(best.group(2)) == max(scores.values())
    assert len({rate for _, rate, _ in tried}) == 8, "each branch tried a different edit"
    # --cleanup removed everything it made: the root, the losers, the winner and the snapshot.
    assert {s.id for s in client.list_sandboxes().sandboxes} <= before
