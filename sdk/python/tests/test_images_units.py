"""The image operations without a daemon: the NDJSON progress stream, the
error classes of its codes, query strings, and what the uploads send (a
file as it is; a directory, or a build context with its Dockerfile, packed
into a tar). The client talks to an ``httpx.MockTransport`` here."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Callable, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, Client, _images, _ops, models
from forkvm.errors import error_from_detail

IMAGE = {
    "name": "tiny",
    "format": "ext4",
    "size_bytes": 4096,
    "created_at": "2026-11-25T09:00:00Z",
    "source": "import",
    "reference": "tiny.tar",
    "config": {"env": ["PATH=/bin"], "cmd": ["/bin/sh"]},
    "some_future_field": 1,
}


def ndjson(*events: dict) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


PROGRESS = [
    {"type": "phase", "phase": "unpacking"},
    {"type": "progress", "item": "layer 1/1", "done": 10, "total": 20},
    {"type": "cached", "item": "sha256:abc"},
    {"type": "step", "index": 1, "total": 2, "text": "RUN true", "cached": False},
    {"type": "log", "line": "hello"},
]


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch) -> Path:
    """Temporary tars go to a directory of the test's own, to check they are removed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    return tmp


class Recorder:
    """An httpx handler that records each request (with its body) and answers ``reply``."""

    def __init__(self, reply: Callable[[httpx.Request], httpx.Response]) -> None:
        self.reply = reply
        self.requests: List[httpx.Request] = []
        self.bodies: List[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.read())
        self.requests.append(request)
        return self.reply(request)

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(await request.aread())
        self.requests.append(request)
        return self.reply(request)

    @property
    def query(self) -> Dict[str, List[str]]:
        return parse_qs(urlsplit(str(self.requests[-1].url)).query)


def stream_of(*events: dict, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _: httpx.Response(status, content=ndjson(*events), headers={"content-type": "application/x-ndjson"})


def client_for(recorder: Recorder) -> Client:
    c = Client("http://127.0.0.1:9")
    c._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(recorder))
    return c


def async_client_for(recorder: Recorder) -> AsyncClient:
    c = AsyncClient("http://127.0.0.1:9")
    c._http = httpx.AsyncClient(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(recorder.handle_async))
    return c


def members(data: bytes) -> Dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def read_member(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


# --------------------------------------------------------------------------
# The progress stream.


def test_parse_image_events() -> None:
    assert _images.parse_image_event("") is None
    assert _images.parse_image_event(b"  \n") is None
    phase = _images.parse_image_event(json.dumps(PROGRESS[0]))
    assert phase is not None and (phase.type, phase.phase) == ("phase", "unpacking")
    progress = _images.parse_image_event(json.dumps(PROGRESS[1]).encode())
    assert progress is not None and (progress.item, progress.done, progress.total) == ("layer 1/1", 10, 20)
    step = _images.parse_image_event(json.dumps(PROGRESS[3]))
    assert step is not None and (step.index, step.total, step.text, step.cached) == (1, 2, "RUN true", False)
    # An event type this SDK does not know yet is passed on, not refused.
    future = _images.parse_image_event('{"type": "warp", "speed": 9}')
    assert future is not None and future.type == "warp" and future.extra == {"speed": 9}
    assert _images.image_outcome(future) is None


@pytest.mark.parametrize("line", ["{not json", "[1, 2]", '"done"', '{"phase": "x"}', '{"type": 3}'])
def test_bad_progress_lines(line: str) -> None:
    with pytest.raises(forkvm.ProtocolError, match="bad line"):
        _images.parse_image_event(line)


def test_done_without_image_is_a_protocol_error() -> None:
    with pytest.raises(forkvm.ProtocolError):
        _images.image_outcome(models.ImageEvent(type="done"))


@pytest.mark.parametrize(
    "code, cls",
    [
        ("invalid_image", forkvm.InvalidImage),
        ("build_failed", forkvm.BuildFailed),
        ("registry_auth_failed", forkvm.RegistryAuthFailed),
        ("registry_unreachable", forkvm.RegistryUnreachable),
        ("no_space", forkvm.NoSpace),
        ("conflict", forkvm.Conflict),
        ("image_not_found", forkvm.ImageNotFound),
        ("something_new", forkvm.ForkvmError),
    ],
)
def test_error_line_raises_the_class_of_its_code(code: str, cls: type) -> None:
    event = _images.parse_image_event(json.dumps({"type": "error", "error": {"code": code, "message": "it broke"}}))
    assert event is not None
    with pytest.raises(cls) as info:
        _images.image_outcome(event)
    assert type(info.value) is cls
    assert (info.value.code, info.value.message, info.value.status) == (code, "it broke", None)


@pytest.mark.parametrize(
    "status, code, cls",
    [
        (403, "registry_auth_failed", forkvm.RegistryAuthFailed),
        (403, "x", forkvm.Forbidden),
        (422, "invalid_image", forkvm.InvalidImage),
        (422, "build_failed", forkvm.BuildFailed),
        (422, "snapshot_corrupt", forkvm.SnapshotCorrupt),
        (422, "x", forkvm.Unprocessable),
        (502, "registry_unreachable", forkvm.RegistryUnreachable),
        (502, "guest_error", forkvm.GuestError),
        (502, "x", forkvm.GuestError),
        (507, "no_space", forkvm.NoSpace),
        (507, "x", forkvm.NoSpace),
        # A code sent with a status that is not its own: the status decides.
        (400, "registry_unreachable", forkvm.InvalidRequest),
    ],
)
def test_image_error_classes(status: int, code: str, cls: type) -> None:
    err = error_from_detail(code, "m", status)
    assert type(err) is cls and err.status == status
    assert issubclass(forkvm.SnapshotCorrupt, forkvm.Unprocessable)
    assert issubclass(forkvm.RegistryUnreachable, forkvm.ServerError)
    assert issubclass(forkvm.NoSpace, forkvm.ServerError)


def test_pull_streams_events_to_the_callback_and_returns_the_image() -> None:
    recorder = Recorder(stream_of(*PROGRESS, {"type": "done", "image": IMAGE}))
    seen: List[models.ImageEvent] = []
    with client_for(recorder) as c:
        image = c.pull_image(
            "127.0.0.1:5000/team/tiny:1",
            name="tiny",
            insecure=True,
            replace=True,
            disk_size=1 << 30,
            start={"command": ["/bin/sh", "-c", "sleep 1d"], "ready_port": 80},
            on_event=seen.append,
        )
    assert isinstance(image, models.Image) and image.name == "tiny" and image.config.cmd == ["/bin/sh"]
    assert image.extra == {"some_future_field": 1}
    assert [e.type for e in seen] == ["phase", "progress", "cached", "step", "log", "done"]
    (request,) = recorder.requests
    assert (request.method, request.url.path) == ("POST", "/v1/images")
    assert request.headers["accept"] == "application/x-ndjson"
    assert json.loads(recorder.bodies[0]) == {
        "reference": "127.0.0.1:5000/team/tiny:1",
        "name": "tiny",
        "insecure": True,
        "replace": True,
        "disk_size": 1 << 30,
        "start": {"command": ["/bin/sh", "-c", "sleep 1d"], "ready_port": 80},
        "stream": True,
    }


def test_pull_error_line_raises_after_the_callback_saw_it() -> None:
    error = {"type": "error", "error": {"code": "registry_unreachable", "message": "connection refused"}}
    recorder = Recorder(stream_of(PROGRESS[0], error))
    seen: List[str] = []
    with client_for(recorder) as c, pytest.raises(forkvm.RegistryUnreachable, match="connection refused"):
        c.pull_image("127.0.0.1:1/x", on_event=lambda e: seen.append(e.type))
    assert seen == ["phase", "error"]


def test_a_stream_that_ends_early_is_a_protocol_error() -> None:
    for events in (PROGRESS, ()):
        with client_for(Recorder(stream_of(*events))) as c, pytest.raises(forkvm.ProtocolError, match="ended before"):
            c.pull_image("x")


def test_nothing_after_done_is_read() -> None:
    recorder = Recorder(
        lambda _: httpx.Response(
            200,
            content=ndjson({"type": "done", "image": IMAGE}) + b"garbage\n",
            headers={"content-type": "application/x-ndjson"},
        )
    )
    with client_for(recorder) as c:
        assert c.pull_image("x").name == "tiny"


def test_an_http_error_before_the_stream_is_raised_with_its_status() -> None:
    body = {"error": {"code": "conflict", "message": "image tiny exists; pass replace"}}
    recorder = Recorder(lambda _: httpx.Response(409, json=body))
    with client_for(recorder) as c, pytest.raises(forkvm.Conflict) as info:
        c.pull_image("x", name="tiny")
    assert info.value.status == 409


def test_an_unstreamed_answer_is_the_image() -> None:
    recorder = Recorder(lambda _: httpx.Response(201, json=IMAGE))
    with client_for(recorder) as c:
        assert c.pull_image("x").name == "tiny"


def test_list_get_delete_requests() -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.url.path == "/v1/images":
            return httpx.Response(200, json={"images": [IMAGE]})
        return httpx.Response(200, json=dict(IMAGE, sandboxes=["sb-1"], snapshots=[]))

    recorder = Recorder(reply)
    with client_for(recorder) as c:
        assert [i.name for i in c.list_images().images] == ["tiny"]
        assert c.get_image("a b/c").sandboxes == ["sb-1"]
        assert c.delete_image("tiny") is None
    assert [(r.method, r.url.raw_path) for r in recorder.requests] == [
        ("GET", b"/v1/images"),
        ("GET", b"/v1/images/a%20b%2Fc"),
        ("DELETE", b"/v1/images/tiny"),
    ]


# --------------------------------------------------------------------------
# Query strings.


def test_query_strings() -> None:
    assert _ops.query_params(_images.import_query("/x/rootfs.tar.gz", "tiny")) == {
        "name": "tiny",
        "file": "rootfs.tar.gz",
    }
    assert _ops.query_params(_images.import_query("/x/layout/", "t", disk_size=1 << 30, replace=True)) == {
        "name": "t",
        "file": "layout",
        "disk_size": str(1 << 30),
        "replace": "true",
    }
    assert _ops.query_params(_images.build_query("app")) == {"tag": "app", "dockerfile": ".forkvm-dockerfile"}
    q = _ops.query_params(
        _images.build_query("app", build_args={"V": "1", "B": "x y"}, no_cache=True, disk_size=5, memory_mib=1024)
    )
    assert q == {
        "tag": "app",
        "dockerfile": ".forkvm-dockerfile",
        "build_args": '{"B":"x y","V":"1"}',
        "no_cache": "true",
        "disk_size": "5",
        "memory_mib": "1024",
    }
    with pytest.raises(ValueError):
        _images.import_query("/x/a.tar", "")
    with pytest.raises(ValueError):
        _images.build_query("")
    with pytest.raises(TypeError):
        _images.build_query("app", build_args="V=1")  # type: ignore[arg-type]


def test_start_command_forms() -> None:
    assert _images.start_command(None) is None
    assert _images.start_command(["a", "b"]) == models.StartCommand(command=["a", "b"])
    cmd = models.StartCommand(command=["x"], ready_command=["true"])
    assert _images.start_command(cmd) is cmd
    assert _images.start_command({"command": ["x"], "ready_timeout_secs": 5}).ready_timeout_secs == 5
    with pytest.raises(TypeError):
        _images.start_command("python3 -m http.server")  # type: ignore[arg-type]


def test_exec_user_empty_argv_and_disk_size() -> None:
    body = _ops.exec_request([], user="1000:1000").to_dict()
    assert body == {"argv": [], "user": "1000:1000"}
    assert _ops.create_request(image="tiny", disk_size=2 << 30).to_dict() == {"image": "tiny", "disk_size": 2 << 30}


# --------------------------------------------------------------------------
# Uploads.


def test_import_streams_a_file_as_it_is(tmp_path: Path, private_tmp: Path) -> None:
    archive = tmp_path / "rootfs.tar"
    archive.write_bytes(os.urandom(3 << 20) + b"end")  # more than one chunk
    recorder = Recorder(stream_of({"type": "done", "image": IMAGE}))
    with client_for(recorder) as c:
        assert c.import_image(archive, "tiny", replace=True).name == "tiny"
    request = recorder.requests[0]
    assert (request.method, request.url.path) == ("POST", "/v1/images/import")
    assert recorder.query == {"name": ["tiny"], "file": ["rootfs.tar"], "replace": ["true"]}
    assert request.headers["content-type"] == "application/octet-stream"
    assert request.headers["content-length"] == str(archive.stat().st_size)
    assert recorder.bodies[0] == archive.read_bytes()
    assert list(private_tmp.iterdir()) == []


def test_import_packs_a_directory_and_removes_the_tar(tmp_path: Path, private_tmp: Path) -> None:
    layout = tmp_path / "layout"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text("{}")
    (layout / "blobs" / "sha256" / "ab").write_bytes(b"blob")
    error = {"type": "error", "error": {"code": "invalid_image", "message": "no manifest"}}
    recorder = Recorder(stream_of(error))
    with client_for(recorder) as c, pytest.raises(forkvm.InvalidImage):
        c.import_image(str(layout), "oci")
    assert recorder.query["file"] == ["layout"]
    entries = members(recorder.bodies[0])
    assert set(entries) == {"blobs", "blobs/sha256", "blobs/sha256/ab", "index.json", "oci-layout"}
    assert entries["blobs"].isdir() and entries["index.json"].isfile()
    assert read_member(recorder.bodies[0], "blobs/sha256/ab") == b"blob"
    assert list(private_tmp.iterdir()) == [], "the temporary tar is removed, even after an error"


def test_import_of_nothing(tmp_path: Path) -> None:
    with Client("http://127.0.0.1:9") as c, pytest.raises(FileNotFoundError):
        c.import_image(tmp_path / "missing.tar", "x")


def test_build_packs_the_context_with_the_dockerfile(tmp_path: Path, private_tmp: Path) -> None:
    context = tmp_path / "ctx"
    (context / "src").mkdir(parents=True)
    (context / "src" / "app.py").write_text("print(1)\n")
    (context / "Dockerfile").write_text("FROM default\nCOPY src /app\n")
    (context / "link").symlink_to("src/app.py")
    (context / ".forkvm-dockerfile").write_text("a stale one, replaced")
    recorder = Recorder(
        stream_of(
            {"type": "step", "index": 1, "total": 2, "text": "FROM default", "cached": True},
            {"type": "done", "image": dict(IMAGE, source="build")},
        )
    )
    steps: List[Optional[str]] = []
    with client_for(recorder) as c:
        image = c.build_image(
            context, "app", build_args={"V": "1"}, no_cache=True, on_event=lambda e: steps.append(e.text)
        )
    assert image.source == "build" and steps == ["FROM default", None]
    assert recorder.requests[0].url.path == "/v1/images/build"
    assert recorder.query == {
        "tag": ["app"],
        "dockerfile": [".forkvm-dockerfile"],
        "build_args": ['{"V":"1"}'],
        "no_cache": ["true"],
    }
    body = recorder.bodies[0]
    entries = members(body)
    assert set(entries) == {".forkvm-dockerfile", "Dockerfile", "link", "src", "src/app.py"}
    assert entries["link"].issym() and entries["link"].linkname == "src/app.py"
    assert read_member(body, ".forkvm-dockerfile") == b"FROM default\nCOPY src /app\n"
    assert entries[".forkvm-dockerfile"].mode == 0o644
    assert list(private_tmp.iterdir()) == []


def test_build_with_a_dockerfile_from_elsewhere(tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    other = tmp_path / "Containerfile"
    other.write_text("FROM tiny\n")
    recorder = Recorder(stream_of({"type": "done", "image": IMAGE}))
    with client_for(recorder) as c:
        c.build_image(str(context), "app", dockerfile=other)
    assert read_member(recorder.bodies[0], ".forkvm-dockerfile") == b"FROM tiny\n"
    with Client("http://127.0.0.1:9") as c:
        with pytest.raises(FileNotFoundError, match="no Dockerfile"):
            c.build_image(context, "app")
        with pytest.raises(NotADirectoryError):
            c.build_image(other, "app")


def test_pack_directory_refuses_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        _images.pack_directory(f)


@pytest.mark.asyncio
async def test_async_flavour(tmp_path: Path, private_tmp: Path) -> None:
    layout = tmp_path / "layout"
    layout.mkdir()
    (layout / "index.json").write_text("{}")
    recorder = Recorder(stream_of(*PROGRESS, {"type": "done", "image": IMAGE}))
    seen: List[str] = []

    async def on_event(event: models.ImageEvent) -> None:  # a coroutine callback is awaited
        seen.append(event.type)

    async with async_client_for(recorder) as c:
        image = await c.import_image(layout, "tiny", on_event=on_event)
        assert image.name == "tiny"
        plain: List[str] = []
        await c.pull_image("x", on_event=lambda e: plain.append(e.type))
    assert seen == plain == ["phase", "progress", "cached", "step", "log", "done"]
    assert set(members(recorder.bodies[0])) == {"index.json"}
    assert list(private_tmp.iterdir()) == []
    error = {"type": "error", "error": {"code": "build_failed", "message": "step 2 exited 1"}}
    async with async_client_for(Recorder(stream_of(error))) as c:
        (layout / "Dockerfile").write_text("FROM x\n")
        with pytest.raises(forkvm.BuildFailed):
            await c.build_image(layout, "app")
    async with async_client_for(Recorder(stream_of(PROGRESS[0]))) as c:
        with pytest.raises(forkvm.ProtocolError):
            await c.pull_image("x")


def test_the_tar_never_packs_itself(tmp_path: Path, monkeypatch) -> None:
    context = tmp_path / "ctx"
    (context / "sub").mkdir(parents=True)
    (context / "a").write_text("a")
    monkeypatch.setattr("tempfile.tempdir", str(context / "sub"))
    tar = _images.pack_directory(context)
    try:
        assert set(members(Path(tar).read_bytes())) == {"a", "sub"}
    finally:
        _images.remove_temporary(tar)
    assert list((context / "sub").iterdir()) == []
