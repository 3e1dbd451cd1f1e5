"""Time travel against a real daemon and a real microVM: checkpoints (one
tagged), rewind with ``checkpoint_first`` and its undo, the timeline, and
retention pruning what it no longer keeps. Bad input is refused with the
SDK's typed errors and changes nothing."""

from __future__ import annotations

from typing import Iterator

import pytest

import forkvm
from forkvm import Client, Sandbox, models


@pytest.fixture
def traveller(client: Client) -> Iterator[Sandbox]:
    """A sandbox of the test's own: rewinding it must not disturb the shared ones."""
    with Sandbox(client=client, timeout=900) as sb:
        yield sb


def _state(sb: Sandbox) -> str:
    """Its disk (a file under /root) and its memory (a file in tmpfs, which lives in RAM only)."""
    return sb.exec("cat /root/notes.txt /dev/shm/counter; ls /root", check=True).stdout


def test_checkpoint_rewind_undo_and_retention(client: Client, traveller: Sandbox, tag: str) -> None:
    sb = traveller
    before = sb.refresh()
    sb.exec("echo draft-1 > /root/notes.txt && echo 1 > /dev/shm/counter", check=True)
    then = _state(sb)
    cp = sb.checkpoint(tag=tag)
    assert isinstance(cp, models.Checkpoint)
    assert (cp.sandbox, cp.seq, cp.tag, cp.head) == (sb.id, 1, tag, True)
    assert cp.id.startswith("sn-") and cp.bytes > 0 and cp.pause_ms is not None and cp.pause_ms > 0
    assert client.get_snapshot(tag).id == cp.id  # a checkpoint is a snapshot, named by its tag

    # The agent goes on: the file changes, another appears, memory changes.
    sb.exec("echo draft-2 > /root/notes.txt && touch /root/mistake && echo 2 > /dev/shm/counter", check=True)
    now = _state(sb)
    assert now != then

    # Back to the tag, keeping the present as an undo point.
    r = sb.rewind(tag, checkpoint_first=True)
    assert isinstance(r, models.Rewound) and r.to == cp.id and r.rewind_ms > 0
    assert r.sandbox.id == sb.id and sb.state == "running" and sb.info is r.sandbox
    assert sb.info.network == before.network, "a rewind keeps the network identity"
    assert _state(sb) == then
    assert r.undo is not None and r.undo.seq == 2 and r.undo.sandbox == sb.id
    timeline = sb.timeline()
    assert [c.id for c in timeline.checkpoints] == [cp.id, r.undo.id]
    assert timeline.find(tag) == timeline.checkpoints[0] and timeline.bytes >= cp.bytes

    # The rewind is undone by rewinding to the checkpoint it took first.
    sb.rewind(r.undo)
    assert _state(sb) == now

    # Bad input: a target that does not exist, and a count of 0. Nothing changes.
    with pytest.raises(forkvm.NotFound):
        sb.rewind("sn-nosuch")
    with pytest.raises(forkvm.NotFound):
        client.rewind("sb-nosuch", cp.id)
    with pytest.raises(forkvm.InvalidRequest):
        sb.set_retention(keep_last=0)
    assert sb.refresh().state == "running" and _state(sb) == now
    assert [c.id for c in sb.timeline().checkpoints] == [cp.id, r.undo.id]

    # Three more steps, then keep only the last. Kept: the tagged one, the
    # newest, and the undo point: the sandbox runs from it since the rewind
    # (its memory is mapped from it), so it stays until it no longer does.
    # The others are pruned: spliced into the next, their snapshots gone.
    assert sb.info.snapshot == r.undo.id
    steps = []
    for n in (3, 4, 5):
        sb.exec(f"echo {n} > /dev/shm/counter", check=True)
        steps.append(sb.checkpoint())
    assert [c.seq for c in steps] == [3, 4, 5]
    pruned = sb.set_retention(keep_last=1)
    assert pruned.retention == models.Retention(keep_last=1)
    assert [c.id for c in pruned.checkpoints] == [cp.id, r.undo.id, steps[-1].id], pruned
    assert pruned.head == steps[-1].id and pruned.checkpoints[-1].parent == r.undo.id
    for gone in (steps[0].id, steps[1].id):
        with pytest.raises(forkvm.NotFound):
            client.get_snapshot(gone)
    # The policy applies after each checkpoint too.
    sb.exec("echo 6 > /dev/shm/counter", check=True)
    sixth_state = _state(sb)
    sixth = sb.checkpoint()
    assert [c.id for c in sb.timeline().checkpoints] == [cp.id, r.undo.id, sixth.id]
    # Once the sandbox no longer runs from the undo point, it is pruned too.
    sb.rewind(cp)
    assert _state(sb) == then
    assert [c.id for c in sb.set_retention(keep_last=1).checkpoints] == [cp.id, sixth.id]
    # What is kept still restores exactly, spliced ones included.
    sb.rewind(sixth)
    assert _state(sb) == sixth_state
    # No policy: keep everything again.
    assert sb.set_retention().retention == models.Retention()
    seventh = sb.checkpoint()
    assert [c.id for c in sb.timeline().checkpoints] == [cp.id, sixth.id, seventh.id]
