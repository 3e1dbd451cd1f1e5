"""Filesystem-only pauses through the unmodified ``e2b`` SDK:
``pause(keep_memory=False)`` / ``pause(mode="filesystem")``, ``lifecycle={"on_timeout":
{"action": "pause", "mode": "filesystem"}}`` (``autoPauseMemory: false``), and
``connect(on_resume="reboot")`` of a sandbox paused with its memory. Each keeps
the disk and not the memory: the resume cold-boots with the same id, metadata
and envs, files on disk kept, ``/tmp`` (guest RAM) and processes gone."""

from __future__ import annotations

import asyncio
import time
import warnings

import pytest
from e2b import AsyncSandbox, Sandbox


def _marks(sbx) -> None:
    sbx.files.write("/home/user/disk.txt", "on disk")
    sbx.files.write("/tmp/mem.txt", "in memory")  # /tmp is tmpfs: guest RAM


def _check_cold(back, sandbox_id: str, bg_pid: int) -> None:
    assert back.sandbox_id == sandbox_id
    info = Sandbox.get_info(sandbox_id)
    assert info.state.value == "running"
    assert info.metadata == {"suite": "fs-pause"}
    assert back.files.read("/home/user/disk.txt") == "on disk"
    assert not back.files.exists("/tmp/mem.txt"), "a cold boot has a fresh /tmp"
    assert bg_pid not in [p.pid for p in back.commands.list()]
    assert back.commands.run("echo $MODE; hostname").stdout.split() == ["eval", sandbox_id]
    # The guest booted again: its uptime is that of the new boot.
    assert float(back.commands.run("cut -d' ' -f1 /proc/uptime").stdout) < 600


def test_pause_keep_memory_false_then_connect_cold_boots(e2b_env):
    sbx = Sandbox.create(timeout=600, metadata={"suite": "fs-pause"}, envs={"MODE": "eval"})
    try:
        _marks(sbx)
        bg = sbx.commands.run("sleep 3600", background=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert sbx.pause(keep_memory=False) is True
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        _check_cold(back, sbx.sandbox_id, bg.pid)
    finally:
        sbx.kill()


def test_on_timeout_pause_filesystem_pauses_without_memory(e2b_env):
    sbx = Sandbox.create(
        timeout=600,
        metadata={"suite": "fs-pause"},
        envs={"MODE": "eval"},
        lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}},
    )
    try:
        assert Sandbox.get_info(sbx.sandbox_id).lifecycle["on_timeout"] == "pause"
        _marks(sbx)
        bg = sbx.commands.run("sleep 3600", background=True)
        sbx.set_timeout(2)
        deadline = time.monotonic() + 120
        while Sandbox.get_info(sbx.sandbox_id).state.value != "paused":
            assert time.monotonic() < deadline, "the timeout did not pause the sandbox"
            time.sleep(0.5)
        # forkvm's own view says what was kept.
        with e2b_env.http() as http:
            paused = http.get(f"/v1/sandboxes/{sbx.sandbox_id}").json()["paused"]
        assert paused["memory"] is False and "snapshot" not in paused, paused
        assert paused["reason"] == "timeout"
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        _check_cold(back, sbx.sandbox_id, bg.pid)
    finally:
        sbx.kill()


def test_async_full_pause_resumed_with_reboot(e2b_env):
    async def run() -> None:
        sbx = await AsyncSandbox.create(timeout=600, metadata={"suite": "fs-pause"}, envs={"MODE": "eval"})
        try:
            await sbx.files.write("/home/user/disk.txt", "on disk")
            await sbx.files.write("/tmp/mem.txt", "in memory")
            bg = await sbx.commands.run("sleep 3600", background=True)
            # A pause with memory saves the page cache in RAM: a reboot sees
            # the disk as the guest wrote it out (E2B: crash-recovery
            # semantics), so write it out first.
            await sbx.commands.run("sync")
            assert await sbx.pause() is True  # memory and disk
            back = await AsyncSandbox.connect(sbx.sandbox_id, timeout=600, on_resume="reboot")
            assert await back.files.read("/home/user/disk.txt") == "on disk"
            assert not await back.files.exists("/tmp/mem.txt")
            assert bg.pid not in [p.pid for p in await back.commands.list()]
            # A filesystem-only pause of the rebooted sandbox, resumed again.
            assert await back.pause(mode="filesystem") is True
            again = await AsyncSandbox.connect(sbx.sandbox_id, timeout=600)
            assert await again.files.read("/home/user/disk.txt") == "on disk"
        finally:
            await sbx.kill()

    asyncio.run(run())


def test_filesystem_pause_of_a_paused_sandbox_is_refused_like_any_pause(e2b_env):
    sbx = Sandbox.create(timeout=600)
    try:
        assert sbx.pause(mode="filesystem") is True
        assert sbx.pause(mode="filesystem") is False  # already paused: 409
    finally:
        sbx.kill()


@pytest.fixture(autouse=True)
def _no_leftovers(e2b_env):
    yield
    with e2b_env.http() as http:
        left = [s["id"] for s in http.get("/v1/sandboxes", params={"metadata.suite": "fs-pause"}).json()["sandboxes"]]
    assert left == [], f"sandboxes left behind: {left}"
