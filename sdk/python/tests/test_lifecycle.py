"""Lifetimes against a real daemon: metadata, env, timeouts, pause and resume.

One sandbox of the module's own (``labelled``) serves most tests; the
timeout-expiry test spawns another, from the boot template."""

from __future__ import annotations

import secrets
import time
from typing import Iterator

import pytest

import forkvm
from forkvm import AsyncClient, Client, Sandbox, models

COUNTER = r"""
import os, time
n = 0
while True:
    n += 1
    with open('/tmp/counter.tmp', 'w') as f:
        f.write(str(n))
    os.rename('/tmp/counter.tmp', '/tmp/counter')
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def run_tag() -> str:
    return f"pytest-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def labelled(client: Client, run_tag: str) -> Iterator[Sandbox]:
    with Sandbox(
        metadata={"suite": run_tag, "role": "labelled"},
        env={"GREETING": "hello", "SHARED": "from-spawn"},
        timeout=600,
        client=client,
    ) as sb:
        yield sb


def test_spawn_with_metadata_env_and_timeout(labelled: Sandbox, run_tag: str) -> None:
    info = labelled.info
    assert info.metadata == {"suite": run_tag, "role": "labelled"} == labelled.metadata
    assert info.env == {"GREETING": "hello", "SHARED": "from-spawn"}
    assert isinstance(info.lifetime, models.Lifetime) and labelled.lifetime is info.lifetime
    assert info.lifetime.timeout == 600 and info.lifetime.on_timeout is forkvm.OnTimeout.KILL
    assert 0 < info.lifetime.remaining_s <= 600 and info.lifetime.expires_at
    assert info.paused is None


def test_list_filters_by_metadata(client: Client, labelled: Sandbox, sandbox: Sandbox, run_tag: str) -> None:
    ids = [s.id for s in client.list_sandboxes(metadata={"suite": run_tag}).sandboxes]
    assert ids == [labelled.id]
    assert Sandbox.list(metadata={"suite": run_tag, "role": "labelled"}, client=client) == [labelled]
    assert client.list_sandboxes(metadata={"suite": run_tag, "role": "other"}).sandboxes == []
    everything = {s.id for s in client.list_sandboxes(metadata={}).sandboxes}
    assert {labelled.id, sandbox.id} <= everything


def test_execs_see_the_spawn_env(labelled: Sandbox) -> None:
    assert labelled.exec('echo "$GREETING $SHARED"').stdout == "hello from-spawn\n"
    assert labelled.exec('echo "$GREETING $SHARED"', env={"SHARED": "mine"}).stdout == "hello mine\n"


def test_set_and_clear_the_timeout(labelled: Sandbox) -> None:
    labelled.set_timeout(300, on_timeout="pause")
    lifetime = labelled.lifetime
    assert lifetime is not None and lifetime.timeout == 300 and lifetime.on_timeout == "pause"
    assert lifetime.remaining_s <= 300
    assert labelled.set_timeout(None).lifetime is None
    assert labelled.refresh().lifetime is None
    labelled.set_timeout(600)
    assert labelled.lifetime is not None and labelled.lifetime.on_timeout == "pause"  # kept


def test_bad_lifetimes_are_invalid_requests(client: Client, labelled: Sandbox) -> None:
    with pytest.raises(forkvm.InvalidRequest) as exc:
        Sandbox(timeout=0, client=client)
    assert exc.value.status == 400 and "timeout" in exc.value.message
    with pytest.raises(forkvm.InvalidRequest):
        client.create_sandbox(on_timeout="pause")  # needs a timeout
    with pytest.raises(forkvm.InvalidRequest):
        client.set_timeout(labelled.id, 0)
    with pytest.raises(forkvm.InvalidRequest):
        client.set_timeout(labelled.id, 30 * 24 * 3600 + 1)  # over 30 days
    with pytest.raises(forkvm.Conflict):
        labelled.resume()  # running, not paused
    with pytest.raises(forkvm.NotFound):
        client.pause("sb-000000000000")


def test_pause_and_resume_keep_a_running_process(labelled: Sandbox) -> None:
    labelled.files.write("/root/counter.py", COUNTER)
    start = "setsid nohup python3 /root/counter.py >/dev/null 2>&1 </dev/null & echo $!"
    pid = labelled.exec(start, check=True).stdout.strip()

    def counter() -> int:
        text = labelled.exec("cat /tmp/counter 2>/dev/null || echo 0").stdout.strip()
        return int(text or 0)

    deadline = time.monotonic() + 30
    while counter() < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    before = counter()
    assert before >= 3

    labelled.pause()
    assert labelled.state == "paused" and labelled.state is models.SandboxState.PAUSED
    paused = labelled.info.paused
    assert isinstance(paused, models.PauseInfo) and paused.reason == "request"
    assert paused.memory_bytes > 0 and paused.pause_ms >= 0 and paused.snapshot
    assert labelled.lifetime is not None and labelled.lifetime.expires_at is None  # frozen while paused
    assert labelled.refresh().state == "paused"
    with pytest.raises(forkvm.Conflict):
        labelled.pause()

    labelled.resume(timeout=900)
    assert labelled.state == "running" and labelled.info.paused is None
    assert labelled.lifetime is not None and labelled.lifetime.timeout == 900
    assert labelled.exec(f"kill -0 {pid} && cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout.startswith("python3")
    after = counter()
    assert after >= before  # the same process, not a restart from 0
    deadline = time.monotonic() + 30
    while counter() <= after and time.monotonic() < deadline:
        time.sleep(0.2)
    assert counter() > after  # and it counts on


def test_a_sandbox_is_removed_when_its_timeout_runs_out(client: Client) -> None:
    sb = Sandbox(timeout=3, client=client)
    try:
        assert sb.lifetime is not None and sb.lifetime.timeout == 3
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sb.refresh()
            except forkvm.NotFound:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"{sb.id} still exists 60 s after a 3 s timeout")
        assert sb.id not in {s.id for s in client.list_sandboxes().sandboxes}
    finally:
        sb.close()


@pytest.mark.asyncio
async def test_async_lifetime_methods(daemon, labelled: Sandbox) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        info = await api.set_timeout(labelled.id, 1200, on_timeout="kill")
        assert info.lifetime is not None and info.lifetime.on_timeout is forkvm.OnTimeout.KILL
        listed = await api.list_sandboxes(metadata={"role": "labelled", "suite": labelled.metadata["suite"]})
        assert [s.id for s in listed.sandboxes] == [labelled.id]
        with pytest.raises(forkvm.InvalidRequest):
            await api.resume(labelled.id, timeout=0)


# -- resources: limits, usage, capacity, metrics ------------------------------


def test_limits_are_kept_and_children_override_them(client: Client) -> None:
    limits = {"disk_iops": 100, "net_kbps": 10000}
    with Sandbox(limits=limits, client=client) as sb:
        assert sb.limits == models.SandboxLimits(**limits)
        assert client.get_sandbox(sb.id).limits == models.SandboxLimits(disk_iops=100, net_kbps=10000)
        assert sb.refresh().limits is not None and sb.limits.disk_iops == 100
        assert sb.exec("echo ok").stdout == "ok\n"  # throttled, not stopped
        branch = sb.branch(limits={"disk_iops": 50})
        try:
            (child,) = branch.children
            # Field by field: its own IOPS, the source's network rate.
            assert child.refresh().limits == models.SandboxLimits(disk_iops=50, net_kbps=10000)
        finally:
            branch.close()


def test_usage_of_a_running_sandbox(sandbox: Sandbox) -> None:
    sandbox.exec("true")
    usage = sandbox.refresh().usage
    assert isinstance(usage, models.Usage) and sandbox.usage is usage
    assert usage.cpu_ms > 0 and usage.disk_bytes >= 0


def test_capacity_and_metrics(client: Client) -> None:
    capacity = client.info().capacity
    assert isinstance(capacity, models.Capacity)
    assert capacity.memory_commit_mib > 0 and capacity.memory_left_mib <= capacity.memory_commit_mib
    text = client.metrics()
    assert "forkvm_spawns_total" in text and "# TYPE" in text


@pytest.mark.asyncio
async def test_async_capacity_and_metrics(daemon) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        assert (await api.info()).capacity is not None
        assert "forkvm_spawns_total" in await api.metrics()
