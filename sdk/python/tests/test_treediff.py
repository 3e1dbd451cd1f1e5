"""Diff and merge against a real daemon and real microVMs: a sandbox
branched into two children that each edit a small project. The first
child's changes are diffed exactly (with a patch) and merged into the
source, after which the two agree; the second conflicts with them, so its
merge is refused whole with :class:`forkvm.Conflict` (the message naming
the path) and the source is unchanged, a dry run lists the conflicts, and
strategies ``text`` and ``theirs`` settle them."""

from __future__ import annotations

from typing import Iterator

import pytest

import forkvm
from forkvm import Client, Sandbox, models

PROJ = "/root/proj"
NOTES = "/root/notes"


@pytest.fixture
def source(client: Client) -> Iterator[Sandbox]:
    """A sandbox of the test's own: merging into it must not disturb the shared ones."""
    with Sandbox(client=client, timeout=900) as sb:
        yield sb


def sh(sb: Sandbox, cmd: str) -> str:
    return sb.exec(cmd, check=True).stdout


def test_diff_merge_conflict_and_strategies(client: Client, source: Sandbox) -> None:
    sh(
        source,
        f"mkdir -p {PROJ} {NOTES} && cd {PROJ} && printf 'one\\ntwo\\nthree\\nfour\\nfive\\n' > a.txt"
        f" && echo bye > b.txt && echo keep > keep.sh && echo base > {NOTES}/c.txt",
    )
    branch = source.branch(count=2)
    try:
        winner, other = branch.children
        # The winner edits a line, adds a file, deletes one and makes one executable.
        sh(winner, f"cd {PROJ} && sed -i s/one/ONE/ a.txt && echo hi > new.txt && rm b.txt && chmod 755 keep.sh")
        # The other edits another line of the same file, and a note the source edits too.
        sh(other, f"sed -i s/five/FIVE/ {PROJ}/a.txt && echo other > {NOTES}/c.txt")
        sh(source, f"echo source > {NOTES}/c.txt")

        d = source.diff(winner, path=PROJ, text=True)
        assert isinstance(d, forkvm.Diff) and (d.a, d.b, d.path) == (source.id, winner.id, PROJ)
        got = {c.path: c.change for c in d.changes}
        assert got == {
            f"{PROJ}/a.txt": "modified",
            f"{PROJ}/b.txt": "deleted",
            f"{PROJ}/keep.sh": "mode",
            f"{PROJ}/new.txt": "added",
        }, d.changes
        assert d.paths() == sorted(got) and d.stats == models.DiffStats(added=1, deleted=1, modified=1, other=1)
        a = d.find(f"{PROJ}/a.txt")
        assert a is not None and a.patch is not None and "-one" in a.patch and "+ONE" in a.patch, a
        keep = d.find(f"{PROJ}/keep.sh")
        assert keep is not None and keep.a is not None and keep.b is not None
        assert (keep.a.mode, keep.b.mode) == (0o644, 0o755)
        assert d.find(f"{PROJ}/new.txt").a is None and d.find(f"{PROJ}/b.txt").b is None
        # Without text, no patches; from the branch point (a snapshot, read through a clone) too.
        assert all(c.patch is None for c in source.diff(winner, path=PROJ).changes)
        assert client.diff(branch.snapshot.id, b=winner.id, path=PROJ).paths() == d.paths()

        # The winner merges cleanly: afterwards the source has its files.
        m = winner.merge_into(source, path=PROJ)
        assert isinstance(m, forkvm.Merged) and not m.dry_run and m.base == branch.snapshot.id
        assert sorted(c.path for c in m.applied) == sorted(got) and m.conflicts == [] and m.settled == []
        assert len(source.diff(winner, path=PROJ)) == 0
        assert sh(source, f"cat {PROJ}/a.txt").splitlines()[0] == "ONE"

        # The other changed a.txt since the branch point, and so did the source
        # now: a conflict. Refused whole; the source keeps its version.
        before = sh(source, f"cat {PROJ}/a.txt {NOTES}/c.txt")
        with pytest.raises(forkvm.Conflict) as refused:
            other.merge_into(source, path="/root")
        assert refused.value.status == 409 and f"{PROJ}/a.txt" in refused.value.message, refused.value
        assert f"{NOTES}/c.txt" in refused.value.message
        assert sh(source, f"cat {PROJ}/a.txt {NOTES}/c.txt") == before
        plan = other.merge_into(source, path="/root", dry_run=True)
        assert plan.dry_run and sorted(c.path for c in plan.conflicts) == [f"{NOTES}/c.txt", f"{PROJ}/a.txt"]
        assert all(isinstance(c, forkvm.MergeConflict) and c.reason for c in plan.conflicts)
        assert sh(source, f"cat {PROJ}/a.txt {NOTES}/c.txt") == before

        # Line by line, both edits of a.txt are kept; the one-line note cannot be.
        with pytest.raises(forkvm.Conflict) as still:
            other.merge_into(source, path="/root", strategy="text")
        assert f"{NOTES}/c.txt" in still.value.message and f"{PROJ}/a.txt" not in still.value.message
        text = other.merge_into(source, path=PROJ, strategy=models.MergeStrategy.TEXT)
        assert [c.path for c in text.settled] == [f"{PROJ}/a.txt"] and text.conflicts == []
        assert sh(source, f"cat {PROJ}/a.txt") == "ONE\ntwo\nthree\nfour\nFIVE\n"
        # The note: take the other's.
        theirs = other.merge_into(source, path=NOTES, strategy="theirs")
        assert [c.path for c in theirs.settled] == [f"{NOTES}/c.txt"]
        assert sh(source, f"cat {NOTES}/c.txt") == "other\n"

        # Bad input: into itself, into one that does not exist, a relative path. Nothing changes.
        with pytest.raises(forkvm.InvalidRequest):
            winner.merge_into(winner)
        with pytest.raises(forkvm.NotFound):
            winner.merge_into("sb-nosuch")
        with pytest.raises(forkvm.InvalidRequest):
            source.diff(winner, path="root")
        assert sh(source, f"cat {PROJ}/a.txt {NOTES}/c.txt") == "ONE\ntwo\nthree\nfour\nFIVE\nother\n"
    finally:
        branch.close()
        branch.snapshot.delete(force=True)
