"""Deadlines and killed sandboxes through the unmodified ``e2b`` SDK
(issue 31, points 2 and 5).

* ``commands.run(cmd, timeout=N)`` sends ``Connect-Timeout-Ms``; the call
  must end at about N seconds with the SDK's ``TimeoutException``, and the
  process in the guest must be gone, with the async SDK (which relies on
  the server's deadline) and the sync one.
* A sandbox killed while a command runs must surface as
  ``SandboxNotRunningException``, not as "unreachable, state unknown".
"""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox, Sandbox, TimeoutException
from e2b.exceptions import SandboxNotRunningException, SandboxUnreachableException


def gone(sbx, marker: str, within: float = 5.0) -> bool:
    """Whether no process whose command line holds ``marker`` is left."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not any(marker in " ".join(p.args) for p in sbx.commands.list()):
            return True
        time.sleep(0.2)
    return False


def test_async_run_ends_at_its_timeout_and_the_process_is_killed(sandbox):
    async def run() -> float:
        sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        t = time.monotonic()
        with pytest.raises(TimeoutException) as e:
            await sbx.commands.run("sleep 10.5", timeout=2)
        assert not isinstance(e.value, SandboxUnreachableException), e.value
        return time.monotonic() - t

    took = asyncio.run(run())
    assert 1.5 <= took < 5, f"a 2 s timeout ended after {took:.1f} s"
    assert gone(sandbox, "sleep 10.5"), "the timed-out command still runs in the guest"


def test_sync_run_ends_at_its_timeout_and_the_process_is_killed(sandbox):
    t = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 10.25", timeout=2)
    took = time.monotonic() - t
    assert 1.5 <= took < 5, f"a 2 s timeout ended after {took:.1f} s"
    assert gone(sandbox, "sleep 10.25"), "the timed-out command still runs in the guest"


def test_a_timeout_of_zero_means_none(sandbox):
    # envd takes Connect-Timeout-Ms 0 as no deadline.
    assert sandbox.commands.run("sleep 1; echo done", timeout=0).stdout.strip() == "done"


def test_a_background_command_of_a_killed_sandbox_is_not_running(e2b_env):
    sbx = Sandbox.create(timeout=300)
    cmd = sbx.commands.run("sleep 60", background=True)
    assert sbx.kill() is True
    with pytest.raises(SandboxNotRunningException) as e:
        cmd.wait()
    assert "killed" in str(e.value)


def test_a_foreground_command_cut_off_by_a_kill_is_not_running(e2b_env):
    async def run():
        sbx = await AsyncSandbox.create(timeout=300)
        task = asyncio.create_task(sbx.commands.run("sleep 60", timeout=120))
        await asyncio.sleep(2)  # the command runs
        assert await AsyncSandbox.kill(sbx.sandbox_id) is True
        with pytest.raises(SandboxNotRunningException):
            await asyncio.wait_for(task, 60)

    asyncio.run(run())


def test_a_disconnected_background_command_ends_at_its_timeout(sandbox):
    # envd runs a started process under its call's deadline, whether or not
    # the client still listens: E2B's background commands end after their
    # timeout (60 s by default; 0 for none).
    # It prints all along, so the daemon notices the client is gone before
    # the deadline.
    ticker = "for i in $(seq 300); do echo tick; sleep 0.1; done # ticker"
    h = sandbox.commands.run(ticker, background=True, timeout=3)
    h.disconnect()
    assert not gone(sandbox, "# ticker", within=1), "the command did not start"
    assert gone(sandbox, "# ticker", within=8), "the command outlived its timeout"
    keep = sandbox.commands.run("sleep 30.75", background=True, timeout=0)
    try:
        keep.disconnect()
        time.sleep(4)
        assert not gone(sandbox, "sleep 30.75", within=0.5), "timeout=0 killed the command"
    finally:
        sandbox.commands.kill(keep.pid)


def test_a_connect_that_times_out_leaves_the_process_running(sandbox):
    h = sandbox.commands.run("sleep 31", background=True, timeout=0)
    h.disconnect()
    try:

        async def attach() -> float:
            sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
            again = await sbx.commands.connect(h.pid, timeout=2)
            t = time.monotonic()
            with pytest.raises(TimeoutException):
                await again.wait()
            return time.monotonic() - t

        took = asyncio.run(attach())
        assert took < 5, f"a 2 s connect ended after {took:.1f} s"
        assert not gone(sandbox, "sleep 31", within=0.5), "Connect's deadline killed the process"
    finally:
        sandbox.commands.kill(h.pid)
