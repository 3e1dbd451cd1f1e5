"""The event stream (``GET /v1/events``) against a real daemon: a cold boot,
a diff branch and a delete seen as events, in order; a reconnect with
``last_event_id`` replays them; a seq the daemon never gave is a ``reset``;
TCP needs the token. Three VMs in all (one cold boot, two children)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, List

import pytest

import forkvm
from forkvm import AsyncClient, Client, models

#: A cold boot takes 7-10 s under TCG, a branch of two a few seconds more; on a
#: shared 2-core host, give each step a wide margin.
STEP_TIMEOUT = 180.0


async def _until(events: List[models.Event], match: Callable[[models.Event], bool], what: str) -> models.Event:
    """The first event in ``events`` (filled by the reader task) that ``match`` accepts, waiting for it."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while True:
        for e in events:
            if match(e):
                return e
        if time.monotonic() > deadline:
            kinds = [(e.seq, e.kind, e.id) for e in events]
            pytest.fail(f"no {what} within {STEP_TIMEOUT} s; the stream had {kinds}")
        await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_cold_boot_a_branch_and_a_delete_as_events(daemon) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        stream = await api.events()
        assert isinstance(stream, forkvm.AsyncEventStream)
        assert stream.ready_seq is not None and stream.ready_seq >= 0
        events: List[models.Event] = []

        async def read() -> None:
            async for event in stream:
                events.append(event)

        # Read all the time, so the daemon never finds this reader slow.
        reader = asyncio.create_task(read())
        created: List[str] = []
        snapshot_id = None
        try:
            sb = await api.create_sandbox(use_template=False)  # a cold boot
            assert isinstance(sb, models.Sandbox)
            created.append(sb.id)
            first = await _until(events, lambda e: e.id == sb.id, f"event of {sb.id}")
            assert first.kind == "sandbox.created" and first.sandbox is not None and first.sandbox.id == sb.id
            assert first.seq > stream.ready_seq
            running = await _until(
                events,
                lambda e: e.kind == "sandbox.updated" and e.id == sb.id and e.sandbox.state == "running",
                f"sandbox.updated of {sb.id} with state running",
            )
            assert running.seq > first.seq and running.sandbox.timings is not None

            branch = await api.branch_sandbox(sb.id, mode="diff", count=2)
            children = [c.id for c in branch.children]
            created += children
            snapshot_id = branch.snapshot.id
            assert len(children) == 2
            done = await _until(events, lambda e: e.kind == "branch" and e.id == sb.id, f"branch event of {sb.id}")
            assert done.branch is not None
            assert (done.branch.source, done.branch.snapshot, done.branch.mode) == (sb.id, snapshot_id, "diff")
            assert sorted(done.branch.children) == sorted(children)
            assert done.branch.pause_ms >= 0 and done.branch.total_ms >= done.branch.pause_ms
            point = await _until(
                events, lambda e: e.kind == "snapshot.created" and e.id == snapshot_id, f"created of {snapshot_id}"
            )
            assert point.snapshot is not None and point.snapshot.mode == "diff"
            assert point.snapshot.pause_ms is not None and point.snapshot.pause_ms >= 0
            assert point.snapshot.source == sb.id
            born = [
                await _until(events, lambda e, c=c: e.kind == "sandbox.created" and e.id == c, f"created of {c}")
                for c in children
            ]
            # The branch point, then its children, then the branch.
            assert all(point.seq < b.seq < done.seq for b in born), [(e.seq, e.kind, e.id) for e in events]

            await api.delete_sandbox(children[0])
            gone = await _until(
                events, lambda e: e.kind == "sandbox.deleted" and e.id == children[0], f"deleted of {children[0]}"
            )
            assert gone.seq > done.seq and gone.sandbox is None and gone.snapshot is None
            assert stream.last_seq is not None and stream.last_seq >= gone.seq
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await stream.aclose()
            for id in reversed(created):
                try:
                    await api.delete_sandbox(id)
                except forkvm.NotFound:
                    pass
            if snapshot_id is not None:
                try:
                    await api.delete_snapshot(snapshot_id, force=True)
                except forkvm.NotFound:
                    pass

        # Seqs increase by one per event, with nothing missed.
        seqs = [e.seq for e in events]
        assert seqs == list(range(stream.ready_seq + 1, stream.ready_seq + 1 + len(seqs)))

        # A reconnect after the branch point's event gets the later ones again, the same and in order.
        after = [e for e in events if e.seq > point.seq and e.seq <= gone.seq]
        async with await api.events(last_event_id=point.seq) as again:
            assert again.ready_seq >= gone.seq and again.last_seq == point.seq
            replayed: List[models.Event] = []
            async for event in again:
                assert not event.is_reset
                replayed.append(event)
                if event.seq >= gone.seq:
                    break
        assert [(e.seq, e.kind, e.id) for e in replayed] == [(e.seq, e.kind, e.id) for e in after]
        assert replayed[-1].at_unix_ms == gone.at_unix_ms


def test_a_seq_the_daemon_never_gave_is_a_reset(client: Client) -> None:
    """Resuming after a seq from the future (another daemon process) cannot replay: the stream says reset."""
    with client.events() as first:
        assert isinstance(first, forkvm.EventStream) and first.ready_seq is not None
        future = first.ready_seq + 1_000_000
    with client.events(last_event_id=future) as stream:
        assert stream.last_seq == future
        event = next(iter(stream))
        assert event.is_reset and event.kind == models.EventKind.RESET and event.id == ""
    with pytest.raises(RuntimeError):
        iter(stream).__next__()  # a stream is read once


def test_events_over_tcp_need_the_token(daemon) -> None:
    if daemon.tcp_url is None or not daemon.token:
        pytest.skip("this daemon serves no TCP with a token")
    with Client(daemon.tcp_url, daemon.token) as api:
        with api.events(last_event_id=10**9) as stream:
            assert stream.ready_seq is not None
            event = next(iter(stream))
            assert event.is_reset and event.seq == stream.ready_seq
    with Client(daemon.tcp_url, "not-the-token") as api:
        with pytest.raises(forkvm.Unauthorized):
            api.events()
