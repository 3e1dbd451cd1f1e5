"""The async twins (:class:`forkvm.AsyncClient`, :class:`forkvm.AsyncSandbox`...) against a real daemon."""

from __future__ import annotations

import asyncio
import time

import pytest

import forkvm
from forkvm import AsyncBranch, AsyncClient, AsyncSandbox, AsyncSnapshot, models

pytestmark = pytest.mark.asyncio


async def test_async_client_operations(daemon, tag: str) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        assert (await api.health()).status == "ok"
        assert "default" in (await api.info()).images
        sb = await api.create_sandbox()
        assert isinstance(sb, models.Sandbox)
        try:
            assert sb.id in {s.id for s in (await api.list_sandboxes()).sandboxes}
            assert (await api.get_sandbox(sb.id)).memory is not None
            result = await api.exec(sb.id, ["sh", "-c", "cat; exit 5"], stdin="x")
            assert (result.stdout, result.exit_code) == ("x", 5)
            stream = api.exec_stream(sb.id, "echo streamed")
            assert (await stream.collect()).stdout == "streamed\n"
            assert (await api.write_file(sb.id, "/tmp/f", b"\x00\xff", mode="600")).size == 2
            assert await api.read_file(sb.id, "/tmp/f") == b"\x00\xff"
            await api.exec(sb.id, "echo async-console > /dev/console")
            deadline = time.monotonic() + 10
            while "async-console" not in await api.logs(sb.id):
                assert time.monotonic() < deadline, "the console line never reached the logs"
                await asyncio.sleep(0.1)
            snap = await api.snapshot_sandbox(sb.id, tag=tag)
            assert (await api.get_snapshot(tag)).id == snap.id
            assert snap.id in {s.id for s in (await api.list_snapshots()).snapshots}
            batch = await api.create_sandbox(snapshot=snap.id, count=1)
            assert isinstance(batch, models.SandboxBatch) and len(batch.sandboxes) == 1
            with pytest.raises(forkvm.Conflict):
                await api.delete_snapshot(snap.id)
            assert (await api.set_pool(snap.id, 0)).pool_size == 0
            template = next(s for s in (await api.list_snapshots()).snapshots if s.template)
            with pytest.raises(forkvm.InvalidRequest):
                await api.flatten_snapshot(template.id)  # not a diff: nothing to flatten
            branch = await api.branch_sandbox(batch.sandboxes[0].id, mode="diff", count=0)
            assert (await api.pin_snapshot(branch.snapshot.id)).pinned
            dry = await api.prune_snapshots(all=True, dry_run=True)
            assert dry.dry_run and branch.snapshot.id not in {s.id for s in dry.snapshots}
            link = await AsyncSnapshot.get(branch.snapshot.id, client=api)
            assert not (await link.unpin()).pinned and (await link.pin()).pinned
            assert not (await api.unpin_snapshot(branch.snapshot.id)).pinned
            dry = await AsyncSnapshot.prune(all=True, dry_run=True, client=api)
            assert branch.snapshot.id in {s.id for s in dry.snapshots}
            flat = await api.flatten_snapshot(branch.snapshot.id)
            assert flat.kind == "shared"
            await api.delete_snapshot(flat.id)
            await api.delete_snapshot(snap.id, force=True)
            with pytest.raises(forkvm.NotFound):
                await api.get_sandbox(batch.sandboxes[0].id)
        finally:
            await api.delete_sandbox(sb.id)
        with pytest.raises(forkvm.NotFound):
            await api.delete_sandbox(sb.id)
        with pytest.raises(forkvm.ImageNotFound):
            await api.create_sandbox(image="no-such-image")
        with pytest.raises(forkvm.NotFound):
            await api.exec("sb-000000000000", ["true"])
        with pytest.raises(forkvm.NotFound):
            async for _ in api.exec_stream("sb-000000000000", ["true"]):
                pass


async def test_async_sandbox(daemon, tag: str) -> None:
    api = AsyncClient(daemon.url, daemon.token)
    try:
        async with AsyncSandbox(client=api) as sb:
            assert sb.state == "running" and repr(sb).startswith("<AsyncSandbox sb-")
            assert (await sb.exec("echo $((2 * 21))")).stdout == "42\n"
            assert (await sb.exec(["sleep", "5"], timeout=0.2)).timed_out
            with pytest.raises(forkvm.CommandFailed):
                await sb.exec("exit 3", check=True)

            # streaming, as events and with plain and async callbacks
            events = [e async for e in sb.exec_stream("echo a; sleep 0.3; echo b >&2")]
            assert [e.type for e in events] == ["stdout", "stderr", "exit"]
            out, err = [], []

            async def on_stderr(text: str) -> None:
                await asyncio.sleep(0)
                err.append(text)

            result = await sb.exec("echo o; echo e >&2", on_stdout=out.append, on_stderr=on_stderr)
            assert (result.stdout, "".join(out), "".join(err)) == ("o\n", "o\n", "e\n")

            await sb.files.write("/root/marker", "async\n")
            assert await sb.files.read_text("/root/marker") == "async\n"
            assert isinstance(await sb.logs(), str)
            assert (await sb.refresh()).memory is not None
            assert await AsyncSandbox.get(sb.id, client=api) == sb
            assert sb in await AsyncSandbox.list(client=api)

            snap = await sb.snapshot(tag=tag)
            assert isinstance(snap, AsyncSnapshot) and snap.tag == tag
            assert await AsyncSnapshot.get(tag, client=api) == snap
            assert snap in await AsyncSnapshot.list(client=api)
            children = await snap.spawn(count=2)
            texts = await asyncio.gather(*(c.files.read_text("/root/marker") for c in children))
            assert texts == ["async\n", "async\n"]
            assert {c.id for c in await snap.sandboxes()} == {c.id for c in children}
            with pytest.raises(forkvm.Conflict):
                await snap.delete()
            await asyncio.gather(*(c.close() for c in children))
            assert (await snap.set_pool(0)).info.pool_size == 0
            await snap.delete()

            branch = await sb.branch(count=2)
            assert isinstance(branch, AsyncBranch) and len(branch.children) == 2
            hostnames = await asyncio.gather(*(c.exec("hostname") for c in branch.children))
            assert {h.stdout.strip() for h in hostnames} == {c.id for c in branch.children}
            await branch.close(keep=branch.children[:1])
            assert branch.children[1].closed and not branch.children[0].closed
            await branch.snapshot.delete(force=True)

            pending = await sb.branch("diff", count=1, wait=False)
            assert pending.children == []
            await pending.wait(timeout=180)
            assert len(pending.children) == 1 and pending.children[0].state == "running"
            (child,) = pending.children
            second = await child.branch("diff", count=0)
            flat = await second.snapshot.flatten()
            assert flat.info.kind == "shared" and flat.info.parent is None
            await flat.delete()
            await pending.snapshot.delete(force=True)
        assert sb.closed
        await sb.close()  # idempotent
        with pytest.raises(forkvm.NotFound):
            await AsyncSandbox.get(sb.id, client=api)
    finally:
        await api.aclose()


async def test_await_constructor_with_default_client(daemon, monkeypatch) -> None:
    monkeypatch.setenv("FORKVM_URL", daemon.url)
    if daemon.token:
        monkeypatch.setenv("FORKVM_TOKEN", daemon.token)
    with pytest.raises(RuntimeError):
        _ = AsyncSandbox().id  # not started yet
    sb = await AsyncSandbox()
    try:
        assert sb.client is forkvm.default_async_client()
        started = time.monotonic()
        results = await asyncio.gather(*(sb.exec(["sleep", "2"]) for _ in range(3)))
        assert all(r.ok for r in results)
        assert time.monotonic() - started < 5.5, "the execs ran one after the other"
    finally:
        await sb.close()
        await forkvm.default_async_client().aclose()
    sb2 = await AsyncSandbox.create(client=AsyncClient(daemon.url, daemon.token))
    await sb2.close()
    await sb2.client.aclose()


async def test_async_tcp(daemon) -> None:
    if not daemon.tcp_url:
        pytest.skip("the daemon under test serves no TCP")
    async with AsyncClient(daemon.tcp_url, daemon.token) as tcp:
        assert (await tcp.health()).status == "ok"
    async with AsyncClient(daemon.tcp_url, "wrong") as bad:
        with pytest.raises(forkvm.Unauthorized):
            await bad.health()
