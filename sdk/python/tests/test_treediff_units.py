"""Diff and merge without a daemon: the models of diffs, merges and
conflicts, and the requests the clients and the sandbox objects send (to an
``httpx.MockTransport`` here; tests/test_treediff.py runs them on VMs). A
refused merge is the SDK's :class:`forkvm.Conflict` with the daemon's
message, naming the paths."""

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
FILE = {"kind": "file", "size": 6, "mode": 0o644}
CHANGE = {"path": "/root/a.txt", "change": "modified", "a": FILE, "b": dict(FILE, size=9), "patch": "@@ -1 +1 @@\n"}
DIFF = {
    "a": "sb-1",
    "b": "sb-2",
    "path": "/root",
    "changes": [
        {"path": "/root/new", "change": "added", "b": {"kind": "symlink", "size": 1, "mode": 0o777, "symlink_target": "a"}},
        CHANGE,
        {"path": "/root/x", "change": "weird_future_kind", "a": FILE, "b": FILE},
    ],
    "stats": {"added": 1, "deleted": 0, "modified": 1, "other": 1},
    "entries": 12,
    "contents_read": 1,
    "diff_ms": 14.5,
}
CONFLICT = {"path": "/root/a.txt", "base": FILE, "ours": FILE, "theirs": FILE, "reason": "both changed its content"}
MERGED = {
    "child": "sb-2",
    "into": "sb-1",
    "base": "sn-0",
    "applied": [CHANGE],
    "settled": [],
    "conflicts": [CONFLICT],
    "dry_run": True,
    "merge_ms": 30,
}
REFUSED = (
    "1 conflict(s), nothing was changed: /root/a.txt (both changed its content); settle them with a strategy "
    "(ours, theirs or text), or list them all with a dry run"
)


def test_the_models_parse() -> None:
    d = models.Diff.from_dict(DIFF)
    assert isinstance(d, forkvm.Diff) and len(d) == 3 and d.paths() == ["/root/new", "/root/a.txt", "/root/x"]
    new = d.find("/root/new")
    assert new is not None and new.change == forkvm.ChangeKind.ADDED and new.a is None
    assert new.b == models.PathState(kind="symlink", size=1, mode=0o777, symlink_target="a")
    mod = d.find("/root/a.txt")
    assert isinstance(mod, forkvm.PathChange) and mod.change == "modified" and mod.patch == "@@ -1 +1 @@\n"
    assert mod.a is not None and mod.b is not None and (mod.a.size, mod.b.size) == (6, 9)
    assert d.find("/root/x").change == "weird_future_kind"  # a kind this SDK does not know stays a string
    assert d.stats == models.DiffStats(added=1, deleted=0, modified=1, other=1) and d.find("/nope") is None
    m = models.Merged.from_dict(MERGED)
    assert isinstance(m, forkvm.Merged) and m.dry_run and m.merge_ms == 30.0 and m.applied[0] == mod
    c = m.conflicts[0]
    assert isinstance(c, forkvm.MergeConflict) and c.reason == "both changed its content" and c.base == mod.a
    assert forkvm.MergeConflict is models.Conflict and not issubclass(forkvm.Conflict, models.Model)
    with pytest.raises(ValueError, match="missing required field"):
        models.PathChange.from_dict({"path": "/x"})


def test_request_bodies() -> None:
    assert models.DiffRequest(b="sb-2").to_dict() == {"b": "sb-2"}
    assert models.MergeRequest(into="sb-1").to_dict() == {"into": "sb-1"}
    req = models.MergeRequest(into="sb-1", path="/root", strategy=models.MergeStrategy.TEXT, dry_run=True)
    assert json.loads(json.dumps(req.to_dict())) == {"into": "sb-1", "path": "/root", "strategy": "text", "dry_run": True}


def _recording(requests: List[httpx.Request]):
    def reply(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        path = request.url.path
        if path.startswith("/v1/diff/"):
            return httpx.Response(200, json=DIFF)
        if path.endswith("/merge"):
            body = json.loads(request.content)
            if "strategy" not in body and not body.get("dry_run"):
                return httpx.Response(409, json={"error": {"code": "conflict", "message": REFUSED}})
            return httpx.Response(200, json=dict(MERGED, dry_run=bool(body.get("dry_run"))))
        return httpx.Response(200, json=dict(RUNNING, id=path.rsplit("/", 1)[1]))

    return reply


def _sent(requests: List[httpx.Request]):
    return [(r.method, r.url.raw_path.decode(), json.loads(r.content) if r.content else None) for r in requests]


EXPECTED = [
    ("POST", "/v1/diff/sb-1", {"b": "sb-2"}),
    ("POST", "/v1/diff/sb-1", {"b": "sn-9", "path": "/root", "text": True}),
    ("POST", "/v1/diff/good%20one", {"b": "sb-1"}),
    ("POST", "/v1/sandboxes/sb-2/merge", {"into": "sb-1"}),
    ("POST", "/v1/sandboxes/sb-2/merge", {"into": "sb-1", "path": "/root", "dry_run": True}),
    ("POST", "/v1/sandboxes/sb-2/merge", {"into": "sb-1", "strategy": "theirs"}),
    ("POST", "/v1/sandboxes/sb-2/merge", {"into": "sb-1", "strategy": "text"}),
]


def test_client_and_sandbox_requests() -> None:
    requests: List[httpx.Request] = []
    c = Client("http://127.0.0.1:9")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(_recording(requests)))
    with c:
        sb = Sandbox.get("sb-1", client=c)
        child = Sandbox.get("sb-2", client=c)
        requests.clear()
        assert sb.diff(child).stats.added == 1
        cp = models.Checkpoint(id="sn-9", sandbox="sb-1", seq=1, created_at="t", bytes=1, head=True)
        assert sb.diff(cp, path="/root", text=True).find("/root/a.txt") is not None
        c.diff("good one", b="sb-1")
        with pytest.raises(forkvm.Conflict, match=r"/root/a.txt \(both changed its content\)") as refused:
            child.merge_into(sb)
        assert refused.value.status == 409 and refused.value.code == "conflict"
        plan = child.merge_into("sb-1", path="/root", dry_run=True)
        assert plan.dry_run and [x.path for x in plan.conflicts] == ["/root/a.txt"]
        assert not child.merge_into(sb, strategy="theirs").dry_run
        c.merge("sb-2", into="sb-1", strategy=forkvm.MergeStrategy.TEXT)
        with pytest.raises(ValueError, match="MergeStrategy"):
            child.merge_into(sb, strategy="mine")  # refused before anything is sent
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
        child = await AsyncSandbox.get("sb-2", client=c)
        requests.clear()
        assert (await sb.diff(child)).entries == 12
        await sb.diff("sn-9", path="/root", text=True)
        await c.diff("good one", b="sb-1")
        with pytest.raises(forkvm.Conflict, match="nothing was changed"):
            await child.merge_into(sb)
        assert (await child.merge_into(sb, path="/root", dry_run=True)).conflicts[0].path == "/root/a.txt"
        await child.merge_into(sb, strategy=models.MergeStrategy.THEIRS)
        await c.merge("sb-2", into="sb-1", strategy="text")
    assert _sent(requests) == EXPECTED
