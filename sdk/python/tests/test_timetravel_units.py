"""Time travel without a daemon: the models of checkpoints, timelines and
rewinds, and the requests the clients and the sandbox objects send (to an
``httpx.MockTransport`` here; tests/test_timetravel.py runs them on VMs)."""

from __future__ import annotations

import json
from typing import List

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, AsyncSandbox, Client, Sandbox, models

RUNNING = {
    "id": "sb-1",
    "state": "running",
    "image": "default",
    "memory_mib": 512,
    "cpus": 1,
    "accel": "tcg",
    "created_at": "2026-11-25T09:00:00Z",
}
CP = {
    "id": "sn-2",
    "tag": "good",
    "sandbox": "sb-1",
    "seq": 2,
    "created_at": "2026-11-25T09:01:00Z",
    "parent": "sn-1",
    "pause_ms": 41,
    "bytes": 3 << 20,
    "head": True,
}
TIMELINE = {
    "sandbox": "sb-1",
    "head": "sn-2",
    "retention": {"keep_last": 2},
    "checkpoints": [dict(CP, id="sn-1", tag=None, seq=1, parent="sn-0", head=False), CP],
    "bytes": 6 << 20,
}
REWOUND = {"sandbox": RUNNING, "to": "sn-2", "undo": dict(CP, id="sn-3", tag=None, seq=3), "rewind_ms": 900}


def test_the_models_parse() -> None:
    t = models.Timeline.from_dict(TIMELINE)
    assert t.retention == models.Retention(keep_last=2)
    assert [c.seq for c in t.checkpoints] == [1, 2]
    assert isinstance(t.checkpoints[1], forkvm.Checkpoint) and t.checkpoints[1].pause_ms == 41.0
    assert t.checkpoints[0].tag is None and t.head == "sn-2"
    assert t.find("good") is t.checkpoints[1] and t.find("sn-1") is t.checkpoints[0] and t.find("x") is None
    r = models.Rewound.from_dict(REWOUND)
    assert isinstance(r.sandbox, models.Sandbox) and r.sandbox.id == "sb-1"
    assert r.undo is not None and r.undo.id == "sn-3" and isinstance(r.rewind_ms, float)
    assert models.Rewound.from_dict(dict(REWOUND, undo=None)).undo is None
    with pytest.raises(ValueError, match="missing required field"):
        models.Checkpoint.from_dict({"id": "sn-1"})


def test_request_bodies() -> None:
    assert models.CheckpointRequest().to_dict() == {}
    assert models.Retention(keep_last=3).to_dict() == {"keep_last": 3}
    assert models.RewindRequest(to="t").to_dict() == {"to": "t"}


def _recording(requests: List[httpx.Request]):
    def reply(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        path = request.url.path
        if path.endswith("/checkpoints"):
            return httpx.Response(200, json=CP)
        if "/timeline" in path:
            return httpx.Response(200, json=TIMELINE)
        if path.endswith("/rewind"):
            if json.loads(request.content)["to"] == "sn-nosuch":
                return httpx.Response(404, json={"error": {"code": "not_found", "message": "no snapshot sn-nosuch"}})
            return httpx.Response(200, json=REWOUND)
        return httpx.Response(200, json=RUNNING)

    return reply


def _sent(requests: List[httpx.Request]):
    return [(r.method, r.url.raw_path.decode(), json.loads(r.content) if r.content else None) for r in requests]


EXPECTED = [
    ("POST", "/v1/sandboxes/sb-1/checkpoints", {}),
    ("POST", "/v1/sandboxes/sb-1/checkpoints", {"tag": "good"}),
    ("GET", "/v1/sandboxes/sb-1/timeline", None),
    ("PUT", "/v1/sandboxes/sb-1/timeline/retention", {"keep_last": 2, "keep_every": 5}),
    ("POST", "/v1/sandboxes/sb-1/rewind", {"to": "good"}),
    ("POST", "/v1/sandboxes/sb-1/rewind", {"to": "sn-2", "checkpoint_first": True}),
    ("POST", "/v1/sandboxes/sb-1/rewind", {"to": "sn-nosuch"}),
]


def test_client_and_sandbox_requests() -> None:
    requests: List[httpx.Request] = []
    c = Client("http://127.0.0.1:9")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(_recording(requests)))
    with c:
        assert c.checkpoint("sb-1").id == "sn-2"
        sb = Sandbox.get("sb-1", client=c)
        requests.clear()
        c.checkpoint("sb-1")
        cp = sb.checkpoint(tag="good")
        assert sb.timeline().checkpoints[-1] == cp
        assert sb.set_retention(keep_last=2, keep_every=5).retention.keep_last == 2
        assert c.rewind("sb-1", "good").to == "sn-2"
        r = sb.rewind(cp, checkpoint_first=True)
        assert r.undo is not None and sb.info is r.sandbox
        with pytest.raises(forkvm.NotFound, match="sn-nosuch"):
            sb.rewind("sn-nosuch")
    assert _sent(requests) == EXPECTED


@pytest.mark.asyncio
async def test_async_client_and_sandbox_requests() -> None:
    requests: List[httpx.Request] = []
    reply = _recording(requests)

    async def handle(request: httpx.Request) -> httpx.Response:
        await request.aread()
        return reply(request)

    c = AsyncClient("http://127.0.0.1:9")
    c._http = httpx.AsyncClient(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handle))
    async with c:
        sb = await AsyncSandbox.get("sb-1", client=c)
        requests.clear()
        await c.checkpoint("sb-1")
        cp = await sb.checkpoint(tag="good")
        assert (await sb.timeline()).find("good") == cp
        await sb.set_retention(keep_last=2, keep_every=5)
        await c.rewind("sb-1", "good")
        assert (await sb.rewind(cp, checkpoint_first=True)).rewind_ms == 900.0
        with pytest.raises(forkvm.NotFound):
            await sb.rewind("sn-nosuch")
    assert _sent(requests) == EXPECTED
