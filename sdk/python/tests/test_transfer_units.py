"""Snapshot push and pull without a daemon: the NDJSON progress stream (every
kind of :class:`~forkvm.models.TransferEvent`), the error classes of its
codes, and what the clients send and read. The clients talk over real HTTP
to a small server on a loopback port that answers canned responses."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List, Optional, Tuple

import pytest

import forkvm
from forkvm import AsyncClient, AsyncSnapshot, Client, Snapshot, _transfer, models
from forkvm.errors import error_from_detail

SNAPSHOT = {
    "id": "sn-25d84cc44af8",
    "tag": "warm",
    "parent": "sn-9bfc2260fb64",
    "source": "sb-cfb6b07f3c9e",
    "image": "default",
    "memory_mib": 512,
    "cpus": 1,
    "created_at": "2026-11-26T15:46:00.528Z",
    "kind": "diff",
    "depth": 1,
    "state": "ready",
    "template": False,
    "qemu_version": "QEMU emulator version 10.0.2",
    "sizes": {"memory_bytes": 0, "memory_allocated_bytes": 0, "device_state_bytes": 17156, "disk_bytes": 196640},
    "pool_size": 0,
    "pool_default": True,
    "sandboxes": [],
    "children": [],
    "origin": "snapshot",
    "pinned": False,
}

PUSH_RESULT = {
    "reference": "127.0.0.1:5000/team/warm:v1",
    "digest": "sha256:" + "0e" * 32,
    "snapshot": "sn-25d84cc44af8",
    "links": 2,
    "links_skipped": 0,
    "image_sent": True,
    "blobs_sent": 103,
    "bytes_sent": 93120408,
    "blobs_skipped": 0,
    "bytes_skipped": 0,
    "manifests_sent": 4,
    "total_ms": 16330,
}

PULL_RESULT = {
    "snapshot": SNAPSHOT,
    "digest": "sha256:" + "0e" * 32,
    "links": 2,
    "links_cached": 1,
    "image": "default",
    "image_created": False,
    "blobs_fetched": 3,
    "bytes_fetched": 4894720,
    "total_ms": 5012,
    "a_future_field": "kept",
}

PROGRESS = [
    {"type": "phase", "phase": "pushing to 127.0.0.1:5000/team/warm:v1"},
    {"type": "progress", "item": "chunking sn-25d84cc44af8/memory.diff", "done": 4194304, "total": 5132288},
    {"type": "progress", "item": "uploading", "done": 10},
    {"type": "cached", "item": "image default"},
    {"type": "log", "line": "hello"},
]


def ndjson(*events: dict) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def parse(event: dict) -> models.TransferEvent:
    parsed = _transfer.parse_transfer_event(json.dumps(event))
    assert parsed is not None
    return parsed


# --------------------------------------------------------------------------
# Every kind of event.


def test_phase_event() -> None:
    event = parse({"type": "phase", "phase": "resolving"})
    assert (event.type, event.phase) == ("phase", "resolving")
    assert _transfer.transfer_outcome(event, models.PushResult) is None


def test_progress_events_with_and_without_a_total() -> None:
    event = _transfer.parse_transfer_event(json.dumps(PROGRESS[1]).encode())  # bytes too
    assert event is not None
    assert (event.type, event.item, event.done, event.total) == (
        "progress",
        "chunking sn-25d84cc44af8/memory.diff",
        4194304,
        5132288,
    )
    unknown_total = parse(PROGRESS[2])
    assert (unknown_total.done, unknown_total.total) == (10, None)
    assert _transfer.transfer_outcome(unknown_total, models.PullResult) is None


def test_cached_event() -> None:
    event = parse({"type": "cached", "item": "link sn-9bfc2260fb64"})
    assert (event.type, event.item) == ("cached", "link sn-9bfc2260fb64")
    assert _transfer.transfer_outcome(event, models.PullResult) is None


def test_log_event() -> None:
    event = parse({"type": "log", "line": "retrying blob upload"})
    assert (event.type, event.line) == ("log", "retrying blob upload")
    assert _transfer.transfer_outcome(event, models.PushResult) is None


def test_pushed_event_carries_a_push_result() -> None:
    event = parse({"type": "pushed", "result": PUSH_RESULT})
    assert isinstance(event.result, models.PushResult)
    result = _transfer.transfer_outcome(event, models.PushResult)
    assert result is event.result
    assert (result.links, result.blobs_sent, result.image_sent) == (2, 103, True)
    assert result.digest.startswith("sha256:")


def test_pulled_event_carries_a_pull_result_with_its_snapshot() -> None:
    event = parse({"type": "pulled", "result": PULL_RESULT})
    result = _transfer.transfer_outcome(event, models.PullResult)
    assert isinstance(result, models.PullResult)
    assert isinstance(result.snapshot, models.Snapshot) and result.snapshot.tag == "warm"
    assert isinstance(result.snapshot.sizes, models.SnapshotSizes)
    assert (result.links, result.links_cached, result.image_created) == (2, 1, False)
    assert result.extra == {"a_future_field": "kept"}


@pytest.mark.parametrize(
    "code, cls",
    [
        ("image_not_found", forkvm.ImageNotFound),
        ("conflict", forkvm.Conflict),
        ("incompatible_snapshot", forkvm.IncompatibleSnapshot),
        ("invalid_image", forkvm.InvalidImage),
        ("registry_auth_failed", forkvm.RegistryAuthFailed),
        ("registry_unreachable", forkvm.RegistryUnreachable),
        ("no_space", forkvm.NoSpace),
        ("not_found", forkvm.NotFound),
        ("something_new", forkvm.ForkvmError),
    ],
)
def test_error_event_raises_the_class_of_its_code(code: str, cls: type) -> None:
    event = parse({"type": "error", "error": {"code": code, "message": "it broke"}})
    assert isinstance(event.error, models.ErrorDetail)
    for result_type in (models.PushResult, models.PullResult):
        with pytest.raises(cls) as info:
            _transfer.transfer_outcome(event, result_type)
        assert type(info.value) is cls
        assert (info.value.code, info.value.message, info.value.status) == (code, "it broke", None)


def test_an_event_type_this_sdk_does_not_know_is_passed_on() -> None:
    event = parse({"type": "warp", "speed": 9})
    assert event.type == "warp" and event.extra == {"speed": 9}
    assert _transfer.transfer_outcome(event, models.PushResult) is None


def test_blank_lines() -> None:
    assert _transfer.parse_transfer_event("") is None
    assert _transfer.parse_transfer_event(b"  \r\n") is None


@pytest.mark.parametrize("line", ["{not json", "[1, 2]", '"pushed"', '{"phase": "x"}', '{"type": 3}'])
def test_bad_lines(line: str) -> None:
    with pytest.raises(forkvm.ProtocolError, match="bad line"):
        _transfer.parse_transfer_event(line)


def test_a_result_of_the_wrong_operation_is_a_protocol_error() -> None:
    with pytest.raises(forkvm.ProtocolError, match="progress stream of a push"):
        _transfer.transfer_outcome(parse({"type": "pulled", "result": PULL_RESULT}), models.PushResult)
    with pytest.raises(forkvm.ProtocolError, match="progress stream of a pull"):
        _transfer.transfer_outcome(parse({"type": "pushed", "result": PUSH_RESULT}), models.PullResult)
    with pytest.raises(forkvm.ProtocolError, match="without its PushResult"):
        _transfer.transfer_outcome(models.TransferEvent(type="pushed"), models.PushResult)


@pytest.mark.parametrize(
    "status, code, cls",
    [
        (422, "incompatible_snapshot", forkvm.IncompatibleSnapshot),
        (422, "invalid_image", forkvm.InvalidImage),
        (404, "image_not_found", forkvm.ImageNotFound),
        (409, "conflict", forkvm.Conflict),
        (403, "registry_auth_failed", forkvm.RegistryAuthFailed),
        (502, "registry_unreachable", forkvm.RegistryUnreachable),
    ],
)
def test_http_error_classes(status: int, code: str, cls: type) -> None:
    err = error_from_detail(code, "m", status)
    assert type(err) is cls and err.status == status
    assert issubclass(forkvm.IncompatibleSnapshot, forkvm.Unprocessable)


# --------------------------------------------------------------------------
# The clients, over HTTP to a loopback server of canned answers.


class Canned:
    """A loopback HTTP server: each request is recorded (method, path, JSON
    body) and answered with the ``(status, content type, body)`` set in
    :attr:`reply`."""

    def __init__(self) -> None:
        self.requests: List[Tuple[str, str, Optional[dict], str]] = []
        self.reply: Tuple[int, str, bytes] = (200, "application/x-ndjson", b"")
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server hook's name)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                canned.requests.append((self.command, self.path, body, self.headers.get("accept", "")))
                status, ctype, content = canned.reply
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stream(self, *events: dict) -> None:
        self.reply = (200, "application/x-ndjson", ndjson(*events))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def canned() -> Iterator[Canned]:
    server = Canned()
    try:
        yield server
    finally:
        server.close()


def test_push_streams_every_event_to_the_callback_and_returns_the_result(canned: Canned) -> None:
    canned.stream(*PROGRESS, {"type": "pushed", "result": PUSH_RESULT})
    seen: List[models.TransferEvent] = []
    with Client(canned.url) as c:
        result = c.push_snapshot(
            "sn a/b", "127.0.0.1:5000/team/warm:v1", username="u", password="p", insecure=True, on_event=seen.append
        )
    assert isinstance(result, models.PushResult) and result.bytes_sent == 93120408
    assert [e.type for e in seen] == ["phase", "progress", "progress", "cached", "log", "pushed"]
    assert seen[-1].result == result
    ((method, path, body, accept),) = canned.requests
    assert (method, path, accept) == ("POST", "/v1/snapshots/sn%20a%2Fb/push", "application/x-ndjson")
    assert body == {
        "reference": "127.0.0.1:5000/team/warm:v1",
        "username": "u",
        "password": "p",
        "insecure": True,
        "stream": True,
    }


def test_pull_sends_only_what_is_given_and_returns_the_result(canned: Canned) -> None:
    canned.stream({"type": "phase", "phase": "resolving"}, {"type": "pulled", "result": PULL_RESULT})
    with Client(canned.url) as c:
        result = c.pull_snapshot("127.0.0.1:5000/team/warm:v1", tag="warm")
    assert isinstance(result, models.PullResult) and result.snapshot.id == "sn-25d84cc44af8"
    ((method, path, body, _),) = canned.requests
    assert (method, path) == ("POST", "/v1/snapshots/pull")
    assert body == {"reference": "127.0.0.1:5000/team/warm:v1", "tag": "warm", "stream": True}


def test_an_error_line_is_raised_after_the_callback_saw_it(canned: Canned) -> None:
    error = {"type": "error", "error": {"code": "image_not_found", "message": "no tag nope"}}
    canned.stream({"type": "phase", "phase": "resolving"}, error)
    seen: List[str] = []
    with Client(canned.url) as c, pytest.raises(forkvm.ImageNotFound, match="no tag nope") as info:
        c.pull_snapshot("127.0.0.1:5000/team/warm:nope", on_event=lambda e: seen.append(e.type))
    assert seen == ["phase", "error"] and info.value.status is None


def test_a_stream_that_ends_early_is_a_protocol_error(canned: Canned) -> None:
    with Client(canned.url) as c:
        for events in (PROGRESS, ()):
            canned.stream(*events)
            with pytest.raises(forkvm.ProtocolError, match="push progress stream ended"):
                c.push_snapshot("s", "r")
            with pytest.raises(forkvm.ProtocolError, match="pull progress stream ended"):
                c.pull_snapshot("r")


def test_nothing_after_the_result_is_read(canned: Canned) -> None:
    canned.reply = (200, "application/x-ndjson", ndjson({"type": "pushed", "result": PUSH_RESULT}) + b"garbage\n")
    with Client(canned.url) as c:
        assert c.push_snapshot("s", "r").links == 2


def test_an_http_error_before_the_stream_is_raised_with_its_status(canned: Canned) -> None:
    body = json.dumps({"error": {"code": "conflict", "message": 'tag "warm" is already used'}}).encode()
    canned.reply = (409, "application/json", body)
    with Client(canned.url) as c, pytest.raises(forkvm.Conflict, match="already used") as info:
        c.pull_snapshot("r", tag="warm")
    assert info.value.status == 409


def test_an_unstreamed_answer_is_the_result(canned: Canned) -> None:
    canned.reply = (201, "application/json", json.dumps(PULL_RESULT).encode())
    with Client(canned.url) as c:
        assert c.pull_snapshot("r").links_cached == 1
        canned.reply = (200, "application/json", json.dumps(PUSH_RESULT).encode())
        assert c.push_snapshot("s", "r").manifests_sent == 4


def test_snapshot_objects_push_and_pull(canned: Canned) -> None:
    with Client(canned.url) as c:
        snap = Snapshot._wrap(c, models.Snapshot.from_dict(SNAPSHOT))
        canned.stream({"type": "pushed", "result": PUSH_RESULT})
        assert snap.push("127.0.0.1:5000/team/warm:v1").snapshot == snap.id
        canned.stream({"type": "pulled", "result": PULL_RESULT})
        events: List[str] = []
        pulled = Snapshot.pull(
            "127.0.0.1:5000/team/warm:v1", tag="warm", client=c, on_event=lambda e: events.append(e.type)
        )
    assert isinstance(pulled, Snapshot) and pulled.id == "sn-25d84cc44af8" and pulled.tag == "warm"
    assert events == ["pulled"]
    assert [(p, b["reference"]) for _, p, b, _ in canned.requests] == [
        ("/v1/snapshots/sn-25d84cc44af8/push", "127.0.0.1:5000/team/warm:v1"),
        ("/v1/snapshots/pull", "127.0.0.1:5000/team/warm:v1"),
    ]


@pytest.mark.asyncio
async def test_async_flavour(canned: Canned) -> None:
    seen: List[str] = []

    async def on_event(event: models.TransferEvent) -> None:  # a coroutine callback is awaited
        seen.append(event.type)

    async with AsyncClient(canned.url) as c:
        canned.stream(*PROGRESS, {"type": "pushed", "result": PUSH_RESULT})
        assert (await c.push_snapshot("s", "r", on_event=on_event)).blobs_sent == 103
        canned.stream({"type": "pulled", "result": PULL_RESULT})
        pulled = await AsyncSnapshot.pull("r", client=c, on_event=on_event)
        assert isinstance(pulled, AsyncSnapshot) and pulled.id == "sn-25d84cc44af8"
        canned.stream({"type": "error", "error": {"code": "registry_auth_failed", "message": "denied"}})
        with pytest.raises(forkvm.RegistryAuthFailed, match="denied"):
            await pulled.push("r")
    assert seen == ["phase", "progress", "progress", "cached", "log", "pushed", "pulled"]
