"""Lifetimes without a daemon: the models of ``lifetime`` and ``paused``, and
the requests of the metadata filter, timeouts, pause and resume (the client
talks to an ``httpx.MockTransport`` here)."""

from __future__ import annotations

import json
from typing import List

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, Client, _ops, models

PAUSED = {
    "id": "sb-1",
    "state": "paused",
    "image": "default",
    "memory_mib": 512,
    "cpus": 1,
    "accel": "tcg",
    "created_at": "2026-11-25T09:00:00Z",
    "metadata": {"team": "a"},
    "env": {"A": "1"},
    "lifetime": {"timeout": 60, "on_timeout": "pause", "remaining_s": 12.5},
    "paused": {
        "snapshot": "sn-1",
        "paused_at": "2026-11-25T09:01:00Z",
        "reason": "timeout",
        "memory_bytes": 1 << 20,
        "disk_bytes": 4096,
        "pause_ms": 30,
        "new_field": True,
    },
}


def test_a_paused_sandbox_parses() -> None:
    sb = models.Sandbox.from_dict(PAUSED)
    assert sb.state is models.SandboxState.PAUSED
    assert (sb.metadata, sb.env) == ({"team": "a"}, {"A": "1"})
    assert sb.lifetime == models.Lifetime(timeout=60, on_timeout=forkvm.OnTimeout.PAUSE, remaining_s=12.5)
    assert sb.lifetime.expires_at is None
    assert isinstance(sb.paused, models.PauseInfo) and sb.paused.memory_bytes == 1 << 20
    assert isinstance(sb.paused.pause_ms, float) and sb.paused.extra == {"new_field": True}


def test_a_sandbox_without_lifetime_fields() -> None:
    bare = {k: v for k, v in PAUSED.items() if k not in ("metadata", "env", "lifetime", "paused")}
    sb = models.Sandbox.from_dict(dict(bare, state="running"))
    assert (sb.metadata, sb.env, sb.lifetime, sb.paused) == ({}, {}, None, None)
    unknown = models.Lifetime.from_dict({"timeout": 1, "on_timeout": "hibernate", "remaining_s": 1})
    assert unknown.on_timeout == "hibernate"  # a value this SDK does not know yet


def test_request_bodies() -> None:
    env: dict = {"A": 1}  # values become strings
    body = _ops.create_request(metadata={"team": "a"}, env=env, timeout=30, on_timeout="pause")
    assert body.to_dict() == {"metadata": {"team": "a"}, "env": {"A": "1"}, "timeout": 30, "on_timeout": "pause"}
    assert models.SetTimeout().to_dict() == {"timeout": None}  # null clears, it is not left out
    assert models.SetTimeout(5, models.OnTimeout.KILL).to_dict() == {"timeout": 5, "on_timeout": "kill"}
    assert models.ResumeRequest().to_dict() == {}
    query = _ops.metadata_query({"team": "a", "run": 7})  # type: ignore[dict-item]
    assert query == {"metadata.team": "a", "metadata.run": "7"}
    assert _ops.metadata_query({}) is None
    with pytest.raises(TypeError):
        _ops.create_request(env=["A=1"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _ops.create_request(on_timeout="stop")


def _recording(requests: List[httpx.Request]):
    def reply(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.url.path == "/v1/sandboxes":
            return httpx.Response(200, json={"sandboxes": [PAUSED]})
        return httpx.Response(200, json=PAUSED)

    return reply


def _sent(requests: List[httpx.Request]):
    return [(r.method, r.url.raw_path.decode(), json.loads(r.content) if r.content else None) for r in requests]


def test_client_requests() -> None:
    requests: List[httpx.Request] = []
    c = Client("http://127.0.0.1:9")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(_recording(requests)))
    with c:
        assert c.list_sandboxes(metadata={"team": "a b", "run": "7"}).sandboxes[0].paused is not None
        c.set_timeout("sb-1", None)
        c.set_timeout("sb-1", 60, on_timeout="pause")
        assert c.pause("sb-1").state == "paused"
        c.pause("sb-1", memory=False)
        c.resume("sb-1")
        c.resume("sb-1", timeout=30)
        c.resume("sb-1", memory=False)
        c.set_timeout("sb-1", 60, on_timeout="pause_filesystem")
    assert _sent(requests) == [
        ("GET", "/v1/sandboxes?metadata.team=a+b&metadata.run=7", None),
        ("PUT", "/v1/sandboxes/sb-1/timeout", {"timeout": None}),
        ("PUT", "/v1/sandboxes/sb-1/timeout", {"timeout": 60, "on_timeout": "pause"}),
        ("POST", "/v1/sandboxes/sb-1/pause", None),
        ("POST", "/v1/sandboxes/sb-1/pause", {"memory": False}),
        ("POST", "/v1/sandboxes/sb-1/resume", {}),
        ("POST", "/v1/sandboxes/sb-1/resume", {"timeout": 30}),
        ("POST", "/v1/sandboxes/sb-1/resume", {"memory": False}),
        ("PUT", "/v1/sandboxes/sb-1/timeout", {"timeout": 60, "on_timeout": "pause_filesystem"}),
    ]


def test_a_filesystem_only_pause_parses() -> None:
    paused = {k: v for k, v in PAUSED["paused"].items() if k != "snapshot"}
    info = models.PauseInfo.from_dict(dict(paused, memory=False, memory_bytes=0))
    assert (info.snapshot, info.memory, info.memory_bytes) == (None, False, 0)
    # A record from before filesystem-only pauses: memory was kept.
    assert models.PauseInfo.from_dict(PAUSED["paused"]).memory is True


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
        await c.list_sandboxes(metadata={"team": "a"})
        await c.set_timeout("sb-1", 10)
        await c.pause("sb-1")
        await c.resume("sb-1", timeout=5)
    assert _sent(requests) == [
        ("GET", "/v1/sandboxes?metadata.team=a", None),
        ("PUT", "/v1/sandboxes/sb-1/timeout", {"timeout": 10}),
        ("POST", "/v1/sandboxes/sb-1/pause", None),
        ("POST", "/v1/sandboxes/sb-1/resume", {"timeout": 5}),
    ]
