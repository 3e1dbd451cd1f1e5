"""Volumes without a daemon: the ``SOURCE:GUEST_PATH[:OPTIONS]`` parser (the
rules of the Rust ``VolumeMount::parse``), the models, ``volumes=`` in spawn
requests, and the named-volume operations (the client talks to an
``httpx.MockTransport``)."""

from __future__ import annotations

import inspect
import json
from typing import List

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, Client, _ops, models, parse_volume
from forkvm._volume_models import volume_mount, volume_mounts
from forkvm.models import MountedVolume, VolumeMode, VolumeMount

VOLUME = {"name": "scratch", "path": "/var/lib/forkvm/volumes/scratch", "created_at": "2026-11-26T03:00:00Z"}

SANDBOX = {
    "id": "sb-1",
    "state": "running",
    "image": "default",
    "memory_mib": 512,
    "cpus": 1,
    "accel": "tcg",
    "created_at": "2026-11-26T03:00:00Z",
    "volumes": [
        {"source": "/srv/repo", "path": "/work", "read_only": True, "mode": "shared", "host_path": "/srv/repo"},
        {
            "source": "scratch",
            "path": "/scratch",
            "read_only": False,
            "mode": "copy",
            "uid": 1000,
            "host_path": "/var/lib/forkvm/volume-data/sb-1/1",
        },
    ],
}


# -- the CLI form ------------------------------------------------------------


def test_parses_the_cli_form() -> None:
    m = parse_volume("/srv/repo:/work")
    assert m == VolumeMount(source="/srv/repo", path="/work")
    assert (m.read_only, m.mode, m.uid, m.gid) == (False, VolumeMode.SHARED, None, None)
    m = VolumeMount.parse("data:/data:ro,copy,uid=1000,gid=100")
    assert m == VolumeMount("data", "/data", read_only=True, mode=VolumeMode.COPY, uid=1000, gid=100)
    want = {"source": "data", "path": "/data", "read_only": True, "mode": "copy", "uid": 1000, "gid": 100}
    assert m.to_dict() == want


def test_later_options_win_and_empty_ones_are_skipped() -> None:
    m = parse_volume("/a:/b:ro,rw,copy,shared,,uid=1,uid=+2")
    assert (m.read_only, m.mode, m.uid) == (False, VolumeMode.SHARED, 2)
    assert parse_volume("/a:/b:") == VolumeMount("/a", "/b")
    assert parse_volume("/a:/b:gid=4294967295").gid == 4294967295
    # Only two colons split: the rest is options (as in Rust's splitn(3, ':')).
    with pytest.raises(ValueError, match="unknown volume option 'c:ro'"):
        parse_volume("/a:/b:c:ro")


@pytest.mark.parametrize(
    "bad",
    ["", "/a", ":/b", "/a:", "/a:/b:rx", "/a:/b:uid=x", "/a:/b:uid=", "/a:/b:gid=-1", "/a:/b:uid=4294967296",
     "/a:/b:uid= 1", "/a:/b:uid=1_000", "/a:/b:uid=١", "/a:/b:RO", "/a:/b:uid"],
)
def test_refuses_bad_forms(bad: str) -> None:
    with pytest.raises(ValueError, match=r"SOURCE:GUEST_PATH\[:OPTIONS\]"):
        parse_volume(bad)


def test_the_error_says_what_was_wrong() -> None:
    with pytest.raises(ValueError, match=r"^bad volume '/a'"):
        parse_volume("/a")
    with pytest.raises(ValueError, match=r"^unknown volume option 'rx' in '/a:/b:rx'"):
        parse_volume("/a:/b:rx")
    with pytest.raises(ValueError, match=r"^bad volume option 'uid=x' in '/a:/b:uid=x'"):
        parse_volume("/a:/b:uid=x")
    with pytest.raises(TypeError):
        parse_volume(None)  # type: ignore[arg-type]


# -- models and friendly arguments -------------------------------------------


def test_a_sandbox_with_volumes_parses() -> None:
    sb = models.Sandbox.from_dict(SANDBOX)
    repo, scratch = sb.volumes
    assert isinstance(repo, MountedVolume) and repo.read_only and repo.mode is VolumeMode.SHARED
    assert (scratch.mode, scratch.uid, scratch.gid) == (VolumeMode.COPY, 1000, None)
    assert scratch.host_path.endswith("/sb-1/1")
    assert scratch.mount == VolumeMount("scratch", "/scratch", mode=VolumeMode.COPY, uid=1000)
    bare = models.Sandbox.from_dict({k: v for k, v in SANDBOX.items() if k != "volumes"})
    assert bare.volumes == []  # the daemon leaves the field out when there are none
    # A mode this SDK does not know yet stays a string; unknown fields go to `extra`.
    later = MountedVolume.from_dict({"source": "/a", "path": "/b", "host_path": "/a", "mode": "overlay", "x": 1})
    assert (later.mode, later.read_only, later.extra) == ("overlay", False, {"x": 1})


def test_named_volume_models() -> None:
    vol = models.Volume.from_dict(dict(VOLUME, used_by=["sb-1"]))
    assert (vol.name, vol.used_by) == ("scratch", ["sb-1"])
    assert models.Volume.from_dict(VOLUME).used_by == []
    listed = models.VolumeList.from_dict({"volumes": [VOLUME]})
    assert [v.name for v in listed.volumes] == ["scratch"]
    assert models.CreateVolume("x").to_dict() == {"name": "x"}
    with pytest.raises(ValueError):
        models.Volume.from_dict({"name": "x"})
    # Exported at the top too.
    assert (forkvm.VolumeMount, forkvm.VolumeMode, forkvm.Volume) == (VolumeMount, VolumeMode, models.Volume)


def test_volume_specs() -> None:
    want = VolumeMount("/srv/repo", "/work", read_only=True)
    assert volume_mount("/srv/repo:/work:ro") == want
    assert volume_mount({"source": "/srv/repo", "path": "/work", "read_only": True}) == want
    assert volume_mount(want) is want
    mounted = MountedVolume.from_dict(SANDBOX["volumes"][0])  # type: ignore[arg-type]
    assert volume_mount(mounted) == want  # host_path is not part of a request
    assert volume_mount({"source": "d", "path": "/d", "mode": "copy", "uid": "7", "gid": None}) == VolumeMount(
        "d", "/d", mode=VolumeMode.COPY, uid=7
    )
    assert volume_mounts(None) is None
    mounts = volume_mounts(("/a:/b", {"source": "/c", "path": "/d"}))
    assert mounts == [VolumeMount("/a", "/b"), VolumeMount("/c", "/d")]
    with pytest.raises(ValueError):
        volume_mount({"source": "/a"})  # no path
    with pytest.raises(ValueError):
        volume_mount({"source": "/a", "path": "/b", "host_path": "/a"})  # not a request field
    with pytest.raises(ValueError):
        volume_mount({"source": "/a", "path": "/b", "mode": "overlay"})
    with pytest.raises(TypeError):
        volume_mount(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a list"):
        volume_mounts("/a:/b")  # type: ignore[arg-type]


def test_volumes_in_request_bodies() -> None:
    scratch = {"source": "scratch", "path": "/scratch", "mode": "copy"}
    body = _ops.create_request(volumes=["/srv/repo:/work:ro", scratch])
    assert body.to_dict() == {
        "volumes": [
            {"source": "/srv/repo", "path": "/work", "read_only": True, "mode": "shared"},
            {"source": "scratch", "path": "/scratch", "read_only": False, "mode": "copy"},
        ]
    }
    assert "volumes" not in _ops.create_request().to_dict()
    assert _ops.create_request(volumes=[]).to_dict() == {"volumes": []}
    # Every way of spawning takes them.
    for spawn in (forkvm.Sandbox, forkvm.AsyncSandbox.create, forkvm.Snapshot.spawn, forkvm.AsyncSnapshot.spawn):
        assert "volumes" in inspect.signature(spawn).parameters, spawn
    with pytest.raises(ValueError):
        _ops.create_request(volumes=["/a"])  # caught before the daemon's 400


# -- requests ----------------------------------------------------------------


def _recording(requests: List[httpx.Request]):
    def reply(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        path, method = request.url.path, request.method
        if path == "/v1/volumes" and method == "GET":
            return httpx.Response(200, json={"volumes": [dict(VOLUME, used_by=["sb-1"])]})
        if path == "/v1/volumes" and method == "POST":
            name = json.loads(request.content)["name"]
            if name == "taken":
                return httpx.Response(409, json={"error": {"code": "conflict", "message": "volume taken exists"}})
            return httpx.Response(201, json=dict(VOLUME, name=name))
        if path.startswith("/v1/volumes/"):
            if path.endswith("/busy"):
                return httpx.Response(409, json={"error": {"code": "conflict", "message": "mounted by sb-1"}})
            if path.endswith("/nope"):
                return httpx.Response(404, json={"error": {"code": "not_found", "message": "there is no volume nope"}})
            return httpx.Response(204)
        if path == "/v1/sandboxes" and b"/proc" in request.content:
            return httpx.Response(403, json={"error": {"code": "invalid_request", "message": "refused"}})
        return httpx.Response(200, json=SANDBOX)

    return reply


SHARED = {"mode": "shared"}


def _sent(requests: List[httpx.Request]):
    return [(r.method, r.url.raw_path.decode(), json.loads(r.content) if r.content else None) for r in requests]


def test_client_requests() -> None:
    requests: List[httpx.Request] = []
    c = Client("http://127.0.0.1:9")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(_recording(requests)))
    with c:
        (vol,) = c.list_volumes().volumes
        assert vol.used_by == ["sb-1"]
        assert c.create_volume("scratch").name == "scratch"
        with pytest.raises(forkvm.Conflict):
            c.create_volume("taken")
        assert c.delete_volume("a b") is None
        with pytest.raises(forkvm.Conflict, match="mounted by sb-1"):
            c.delete_volume("busy")
        with pytest.raises(forkvm.NotFound):
            c.delete_volume("nope")
        sb = forkvm.Sandbox(volumes=["/srv/repo:/work:ro"], client=c)
        assert [v.path for v in sb.volumes] == ["/work", "/scratch"]
        with pytest.raises(forkvm.Forbidden):
            c.create_sandbox(volumes=["/proc:/p"])
    assert _sent(requests) == [
        ("GET", "/v1/volumes", None),
        ("POST", "/v1/volumes", {"name": "scratch"}),
        ("POST", "/v1/volumes", {"name": "taken"}),
        ("DELETE", "/v1/volumes/a%20b", None),
        ("DELETE", "/v1/volumes/busy", None),
        ("DELETE", "/v1/volumes/nope", None),
        ("POST", "/v1/sandboxes", {"volumes": [{"source": "/srv/repo", "path": "/work", "read_only": True, **SHARED}]}),
        ("POST", "/v1/sandboxes", {"volumes": [{"source": "/proc", "path": "/p", "read_only": False, **SHARED}]}),
    ]


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
        assert [v.name for v in (await c.list_volumes()).volumes] == ["scratch"]
        assert (await c.create_volume("v1")).name == "v1"
        await c.delete_volume("v1")
        with pytest.raises(forkvm.NotFound):
            await c.delete_volume("nope")
        sb = await forkvm.AsyncSandbox.create(volumes=[{"source": "v1", "path": "/v", "uid": 1000}], client=c)
        assert sb.volumes[1].mode is VolumeMode.COPY
    assert _sent(requests)[3:] == [
        ("DELETE", "/v1/volumes/nope", None),
        ("POST", "/v1/sandboxes", {"volumes": [dict(source="v1", path="/v", read_only=False, uid=1000, **SHARED)]}),
    ]
