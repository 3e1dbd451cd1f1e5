"""Resources without a daemon: the models of ``limits``, ``usage`` and
``capacity``, the ``capacity_exceeded`` error, and the requests that carry
limits and read the metrics (the client talks to an ``httpx.MockTransport``)."""

from __future__ import annotations

import json
from typing import List

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, Client, _ops, models
from forkvm.errors import error_from_detail

RUNNING = {
    "id": "sb-1",
    "state": "running",
    "image": "default",
    "memory_mib": 512,
    "cpus": 1,
    "accel": "tcg",
    "created_at": "2026-11-25T09:00:00Z",
    "limits": {"disk_iops": 100, "net_kbps": 10000},
    "usage": {"cpu_ms": 1234, "disk_bytes": 1 << 20, "net_rx_bytes": 10, "net_tx_bytes": 20, "later": 1},
}

CAPACITY = {
    "memory_commit_mib": 6000,
    "memory_used_mib": 700,
    "memory_reserved_mib": 512,
    "memory_left_mib": 4788,
    "counted_sandboxes": 2,
    "disk_free_mib": 20000,
    "disk_reserve_mib": 512,
}

METRICS = "# TYPE forkvm_spawns_total counter\nforkvm_spawns_total 3\n"


def test_a_sandbox_with_limits_and_usage_parses() -> None:
    sb = models.Sandbox.from_dict(RUNNING)
    assert sb.limits == models.SandboxLimits(disk_iops=100, net_kbps=10000)
    assert sb.limits.cpu_percent is None and sb.limits.pids is None
    assert isinstance(sb.usage, models.Usage)
    usage = sb.usage
    assert (usage.cpu_ms, usage.disk_bytes, usage.net_rx_bytes, usage.net_tx_bytes) == (1234, 1 << 20, 10, 20)
    assert sb.usage.extra == {"later": 1}


def test_a_sandbox_without_them() -> None:
    bare = {k: v for k, v in RUNNING.items() if k not in ("limits", "usage")}
    sb = models.Sandbox.from_dict(bare)
    assert (sb.limits, sb.usage) == (None, None)
    usage = models.Usage.from_dict({"cpu_ms": 0, "disk_bytes": 0})  # no NIC: no network counters
    assert (usage.net_rx_bytes, usage.net_tx_bytes) == (None, None)
    with pytest.raises(ValueError):
        models.Usage.from_dict({"cpu_ms": 1})


def test_capacity_in_info() -> None:
    cap = models.Capacity.from_dict(CAPACITY)
    assert cap.memory_commit_mib == 6000 and cap.memory_left_mib == 4788 and cap.counted_sandboxes == 2
    with pytest.raises(ValueError):
        models.Capacity.from_dict({k: v for k, v in CAPACITY.items() if k != "disk_free_mib"})
    info = {
        "version": "0.1.0",
        "accel": {"kind": "tcg", "reason": "r"},
        "qemu": {"path": "/q", "version": "9"},
        "limits": {
            "max_memory_mib": 1,
            "max_cpus": 1,
            "max_sandboxes": 1,
            "max_exec_output_bytes": 1,
            "max_exec_timeout_ms": 1,
            "max_file_bytes": 1,
            "max_request_bytes": 1,
        },
        "home": "/h",
        "images": [],
        "sandboxes": 0,
        "snapshots": 0,
        "default_pool_size": 0,
        "pools": [],
        "network": {"available": False, "pool": "10.0.0.0/16", "default_mode": "none"},
        "gc": {"enabled": True, "grace_secs": 1, "interval_secs": 1},
    }
    assert models.Info.from_dict(info).capacity is None  # an older daemon
    assert models.Info.from_dict(dict(info, capacity=CAPACITY)).capacity == cap


def test_limits_in_request_bodies() -> None:
    limits = {"disk_iops": 100, "net_kbps": 10000}
    assert _ops.create_request(limits=limits).to_dict() == {"limits": limits}
    as_model = models.SandboxLimits(cpu_percent=50, pids=64)
    assert _ops.create_request(limits=as_model).to_dict() == {"limits": {"cpu_percent": 50, "pids": 64}}
    assert _ops.branch_request(count=2, limits={"disk_iops": 50}).to_dict() == {"count": 2, "limits": {"disk_iops": 50}}
    assert _ops.create_request().to_dict() == {}
    assert models.SandboxLimits().to_dict() == {}
    with pytest.raises(TypeError):
        _ops.create_request(limits={"cpu": 1})  # not a field: caught before the daemon's 400
    with pytest.raises(TypeError):
        _ops.create_request(limits=[("disk_iops", 1)])  # type: ignore[arg-type]


def test_capacity_exceeded_is_a_server_error_of_its_own() -> None:
    err = error_from_detail("capacity_exceeded", "memory commitment reached", 503)
    assert type(err) is forkvm.CapacityExceeded and isinstance(err, forkvm.ServerError)
    assert (err.status, err.code) == (503, "capacity_exceeded")
    assert type(error_from_detail("capacity_exceeded", "m")) is forkvm.CapacityExceeded  # e.g. in a stream
    assert type(error_from_detail("something_new", "m", 503)) is forkvm.ServerError
    assert type(error_from_detail("network_unavailable", "m", 503)) is forkvm.NetworkUnavailable


def _recording(requests: List[httpx.Request]):
    def reply(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS, headers={"content-type": "text/plain; version=0.0.4"})
        if request.url.path.endswith("/branch"):
            return httpx.Response(503, json={"error": {"code": "capacity_exceeded", "message": "no room"}})
        return httpx.Response(200, json=RUNNING)

    return reply


def _sent(requests: List[httpx.Request]):
    return [(r.method, r.url.raw_path.decode(), json.loads(r.content) if r.content else None) for r in requests]


def test_client_requests() -> None:
    requests: List[httpx.Request] = []
    c = Client("http://127.0.0.1:9")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(_recording(requests)))
    with c:
        assert c.metrics() == METRICS
        sb = c.create_sandbox(limits={"disk_iops": 100})
        assert isinstance(sb, models.Sandbox) and sb.limits is not None and sb.limits.net_kbps == 10000
        with pytest.raises(forkvm.CapacityExceeded) as exc:
            c.branch_sandbox("sb-1", count=3, limits=models.SandboxLimits(net_kbps=500))
        assert exc.value.message == "no room"
        wrapped = forkvm.Sandbox.get("sb-1", client=c)
        assert wrapped.limits == models.SandboxLimits(disk_iops=100, net_kbps=10000)
        assert wrapped.usage is not None and wrapped.usage.cpu_ms == 1234
    assert _sent(requests) == [
        ("GET", "/metrics", None),
        ("POST", "/v1/sandboxes", {"limits": {"disk_iops": 100}}),
        ("POST", "/v1/sandboxes/sb-1/branch", {"count": 3, "limits": {"net_kbps": 500}}),
        ("GET", "/v1/sandboxes/sb-1", None),
    ]
    assert requests[0].headers["accept"] == "text/plain"


@pytest.mark.asyncio
async def test_async_client_requests() -> None:
    requests: List[httpx.Request] = []
    reply = _recording(requests)

    async def handle(request: httpx.Request) -> httpx.Response:
        await request.aread()
        return reply(request)

    c = AsyncClient("http://127.0.0.1:9")
    c._http = httpx.AsyncClient(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handle))
    async with c:
        assert "forkvm_spawns_total 3" in await c.metrics()
        sb = await forkvm.AsyncSandbox.create(limits={"net_kbps": 10000}, client=c)
        assert sb.limits is not None and sb.limits.disk_iops == 100
        with pytest.raises(forkvm.CapacityExceeded):
            await sb.branch(limits={"disk_iops": 10})
    assert _sent(requests)[1:] == [
        ("POST", "/v1/sandboxes", {"limits": {"net_kbps": 10000}}),
        ("POST", "/v1/sandboxes/sb-1/branch", {"limits": {"disk_iops": 10}}),
    ]
