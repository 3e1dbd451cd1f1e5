"""Snapshot management through the unmodified ``e2b`` SDK:
``create_snapshot``, ``Sandbox.list_snapshots()`` with its sandbox and name
filters and its paging, and ``Sandbox.delete_snapshot()`` (``True``, then
``False`` once it is gone) (issue 31, point 1). A filesystem-only snapshot,
which forkvm does not make, is refused rather than made with memory."""

from __future__ import annotations

import uuid

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException


def ids(pager) -> list[str]:
    out = []
    while pager.has_next:
        out += [s.snapshot_id for s in pager.next_items()]
    return out


def test_list_filter_page_and_delete_snapshots(sandbox):
    name = f"snap-{uuid.uuid4().hex[:8]}"
    named = sandbox.create_snapshot(name=name)
    unnamed = Sandbox.create_snapshot(sandbox.sandbox_id)
    try:
        assert named.names == [name]
        assert unnamed.names == []
        everything = ids(Sandbox.list_snapshots())
        assert {named.snapshot_id, unnamed.snapshot_id} <= set(everything)
        # The sandbox filter keeps the snapshots taken of that sandbox.
        mine = ids(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id))
        assert {named.snapshot_id, unnamed.snapshot_id} <= set(mine)
        assert ids(Sandbox.list_snapshots(sandbox_id="sb-000000000000")) == []
        # The name filter keeps the snapshot named so.
        assert ids(Sandbox.list_snapshots(name=name)) == [named.snapshot_id]
        assert ids(Sandbox.list_snapshots(name=f"{name}-absent")) == []
        # Pages of one, newest first, each snapshot once.
        pager = Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, limit=1)
        first = pager.next_items()
        assert len(first) == 1 and pager.has_next
        paged = [s.snapshot_id for s in first] + ids(pager)
        assert paged == mine and len(set(paged)) == len(paged)
        assert paged.index(unnamed.snapshot_id) < paged.index(named.snapshot_id)
    finally:
        assert Sandbox.delete_snapshot(named.snapshot_id) is True
        assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
    assert Sandbox.delete_snapshot(named.snapshot_id) is False
    assert Sandbox.delete_snapshot(name) is False
    left = set(ids(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id)))
    assert not {named.snapshot_id, unnamed.snapshot_id} & left
    # The sandbox runs on.
    assert sandbox.commands.run("echo still").stdout.strip() == "still"


def test_a_snapshot_spawns_sandboxes_and_deletes_by_name(sandbox):
    name = f"snap-{uuid.uuid4().hex[:8]}"
    sandbox.files.write("/home/user/snap.txt", "from the source")
    snap = sandbox.create_snapshot(name=name)
    try:
        child = Sandbox.create(snap.snapshot_id, timeout=300)
        try:
            assert child.files.read("/home/user/snap.txt") == "from the source"
        finally:
            child.kill()
    finally:
        # The name is enough, as it is for Sandbox.create.
        assert Sandbox.delete_snapshot(name) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False


def test_a_filesystem_only_snapshot_is_refused_not_made_full(sandbox):
    before = set(ids(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id)))
    with pytest.raises(SandboxException, match="filesystem-only"):
        sandbox.create_snapshot(mode="filesystem")
    assert set(ids(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id))) == before
