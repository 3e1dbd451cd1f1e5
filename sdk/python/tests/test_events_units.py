"""The event stream's pure parts, without a daemon: the Server-Sent Events
framing (:mod:`forkvm._sse`), messages to models (:func:`parse_event`), and
the request (``Last-Event-ID``). The stream itself is tested against a real
daemon in ``test_events.py``."""

from __future__ import annotations

import json
from typing import List

import pytest

import forkvm
from forkvm import _ops, models
from forkvm._event_models import parse_event
from forkvm._sse import SseMessage, SseParser

READY = b'event: ready\ndata: {"seq": 41}\n\n'
SANDBOX = {
    "id": "sb-1",
    "state": "running",
    "image": "default",
    "memory_mib": 256,
    "cpus": 1,
    "accel": "tcg",
    "created_at": "2026-01-01T00:00:00Z",
}
CREATED = {"seq": 42, "at_unix_ms": 1795690000123, "kind": "sandbox.created", "id": "sb-1", "sandbox": SANDBOX}


def frame(kind: str, data: dict, id=None) -> bytes:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def feed_all(chunks) -> List[SseMessage]:
    parser = SseParser()
    out: List[SseMessage] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out


# -- framing ---------------------------------------------------------------


def test_ready() -> None:
    (m,) = feed_all([READY])
    assert (m.event, m.data, m.id) == ("ready", '{"seq": 41}', None)


def test_an_event_with_its_id() -> None:
    (m,) = feed_all([frame("sandbox.created", CREATED, id=42)])
    assert m.event == "sandbox.created" and m.id == "42"
    assert json.loads(m.data) == CREATED


def test_the_last_id_holds_for_later_messages() -> None:
    ms = feed_all([b"id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n"])
    assert [(m.data, m.id) for m in ms] == [("a", "7"), ("b", "7"), ("c", "")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    (m,) = feed_all([b"event: x\ndata: one\ndata:two\ndata\ndata:  four\n\n"])
    # One space after the colon goes, no more; `data` alone is an empty line.
    assert m.data == "one\ntwo\n\n four"


def test_comments_are_keep_alives_and_skipped() -> None:
    ms = feed_all([b": keep-alive\n\n:keep-alive\n\n", READY, b": keep-alive\n\n"])
    assert [m.event for m in ms] == ["ready"]


def test_reset() -> None:
    (m,) = feed_all([b'event: reset\ndata: {"seq":0}\n\n'])
    assert (m.event, json.loads(m.data)) == ("reset", {"seq": 0})


@pytest.mark.parametrize("end", [b"\r\n", b"\r", b"\n"])
def test_every_line_end(end: bytes) -> None:
    text = READY.replace(b"\n", end) + frame("branch", {"a": 1}, id=3).replace(b"\n", end)
    ms = feed_all([text])
    assert [(m.event, m.id) for m in ms] == [("ready", None), ("branch", "3")]
    assert json.loads(ms[1].data) == {"a": 1}


def test_a_frame_split_anywhere() -> None:
    """Every split of the stream in two chunks (in a field, in a UTF-8 sequence,
    between CR and LF) gives the same messages as the whole."""
    changed = frame("sandbox.created", dict(CREATED, id="sb-\u00e9"), id=42)
    text = READY + b": keep-alive\r\n\r\n" + changed.replace(b"\n", b"\r\n")
    whole = feed_all([text])
    assert len(whole) == 2 and json.loads(whole[1].data)["id"] == "sb-\u00e9"
    for cut in range(1, len(text)):
        assert feed_all([text[:cut], text[cut:]]) == whole, f"split at {cut}"
    assert feed_all([text[i : i + 1] for i in range(len(text))]) == whole
    # Empty chunks (a transport may yield them) change nothing, even between a CR and its LF.
    assert feed_all([b"data: x\r", b"", b"\ndata: y\n", b"", b"\n"]) == [SseMessage("message", "x\ny")]


def test_unknown_fields_are_ignored() -> None:
    (m,) = feed_all([b"event: pool\nfoo: bar\nretry: 3000\nretry: soon\nnocolon\ndata: {}\n\n"])
    assert (m.event, m.data, m.retry) == ("pool", "{}", 3000)


def test_a_message_without_data_is_not_dispatched() -> None:
    assert feed_all([b"event: ready\n\nid: 5\n\n"]) == []


def test_a_message_cut_short_is_dropped() -> None:
    parser = SseParser()
    assert parser.feed(b"event: ready\ndata: {}\n") == []  # no blank line yet
    assert parser.feed(b"\n") == [SseMessage("ready", "{}")]


def test_a_byte_order_mark_opens_the_stream() -> None:
    (m,) = feed_all([b"\xef\xbb", b"\xbf" + READY])
    assert m.event == "ready"


def test_default_event_name() -> None:
    (m,) = feed_all([b"data: x\n\n"])
    assert m.event == "message"


# -- messages to models ----------------------------------------------------


def test_ready_is_events_ready() -> None:
    (m,) = feed_all([READY])
    assert parse_event(m) == models.EventsReady(seq=41)


def test_a_change_is_an_event_with_its_object() -> None:
    (m,) = feed_all([frame("sandbox.created", dict(CREATED, later_field=1), id=42)])
    e = parse_event(m)
    assert isinstance(e, models.Event) and not e.is_reset
    assert (e.seq, e.kind, e.id, e.at_unix_ms) == (42, models.EventKind.SANDBOX_CREATED, "sb-1", 1795690000123)
    assert isinstance(e.sandbox, models.Sandbox) and e.sandbox.state == models.SandboxState.RUNNING
    assert e.snapshot is None and e.extra == {"later_field": 1}


def test_branch_pool_and_deleted_events() -> None:
    branch = {"source": "sb-1", "snapshot": "sn-1", "mode": "diff", "children": ["sb-2", "sb-3"],
              "pause_ms": 5, "total_ms": 912.4}
    (m,) = feed_all([frame("branch", {"seq": 9, "at_unix_ms": 1, "kind": "branch", "id": "sb-1", "branch": branch})])
    e = parse_event(m)
    assert e.branch == models.BranchEvent("sb-1", "sn-1", "diff", ["sb-2", "sb-3"], 5.0, 912.4)
    assert isinstance(e.branch.pause_ms, float)
    (m,) = feed_all([frame("pool", {"seq": 10, "at_unix_ms": 1, "kind": "pool", "id": "sn-1",
                                    "pool": {"snapshot": "sn-1", "size": 2, "ready": 1}})])
    assert parse_event(m).pool == models.PoolEvent(snapshot="sn-1", size=2, ready=1)
    (m,) = feed_all([frame("sandbox.deleted", {"seq": 11, "at_unix_ms": 1, "kind": "sandbox.deleted", "id": "sb-2"})])
    e = parse_event(m)
    assert (e.kind, e.id, e.sandbox) == ("sandbox.deleted", "sb-2", None)


def test_snapshot_fields_for_the_tree() -> None:
    snap = {"id": "sn-1", "source": "sb-1", "image": "default", "memory_mib": 256, "cpus": 1,
            "created_at": "x", "kind": "diff", "state": "ready", "template": False, "qemu_version": "9",
            "sizes": {"memory_bytes": 1, "memory_allocated_bytes": 1, "device_state_bytes": 1, "disk_bytes": 1},
            "pool_size": 0, "pool_default": True, "sandboxes": [], "children": [], "origin": "branch",
            "pinned": False, "mode": "diff", "pause_ms": 5.8, "flattened_from": "sn-0"}
    s = models.Snapshot.from_dict(snap)
    assert (s.mode, s.pause_ms, s.flattened_from) == ("diff", 5.8, "sn-0") and s.extra == {}


def test_reset_is_an_event_flagged_reset() -> None:
    (m,) = feed_all([b'event: reset\ndata: {"seq": 17}\n\n'])
    e = parse_event(m)
    assert e.is_reset and e.kind == "reset" and e.seq == 17 and e.id == "" and e.at_unix_ms > 0


def test_bad_data_is_a_protocol_error() -> None:
    with pytest.raises(forkvm.ProtocolError):
        parse_event(SseMessage("sandbox.created", "{not json"))
    with pytest.raises(forkvm.ProtocolError):
        parse_event(SseMessage("sandbox.created", '{"seq": 1}'))  # no kind, id...
    with pytest.raises(forkvm.ProtocolError):
        parse_event(SseMessage("ready", "[]"))


# -- the request -----------------------------------------------------------


def test_the_request() -> None:
    r = _ops.events()
    assert (r.method, r.path, r.headers) == ("GET", "/v1/events", {"Accept": "text/event-stream"})
    assert r.timeout is not None and r.timeout.read and r.timeout.read > 15  # longer than the keep-alive interval
    assert _ops.events(0).headers["Last-Event-ID"] == "0"
    assert _ops.events(42).headers["Last-Event-ID"] == "42"
    for bad in (-1, "42", True, 1.5):
        with pytest.raises(TypeError):
            _ops.events(bad)  # type: ignore[arg-type]
