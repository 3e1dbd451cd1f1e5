"""Parts of the process and filesystem support that need no daemon: stream parsing,
signal names, terminal sizes and the requests built."""

from __future__ import annotations

import signal

import httpx
import pytest

import forkvm
from forkvm import ProcessEnd, ProcessOutput, ProcessStart, _proc_ops, models
from forkvm.processes import parse_process_event, parse_watch_event, signal_number


def test_process_events_decode_and_skip_keepalives() -> None:
    assert parse_process_event('{"type":"start","pid":812}') == ProcessStart(812)
    out = parse_process_event('{"type":"stderr","data":"AP8=","lost":4096}')
    assert out == ProcessOutput("stderr", b"\x00\xff", 4096) and out.type == "stderr"
    assert parse_process_event(b'{"type":"pty","data":"aGk="}') == ProcessOutput("pty", b"hi", 0)
    assert parse_process_event('{"type":"keepalive"}') is None
    assert parse_process_event("  ") is None
    assert parse_process_event('{"type":"from-the-future"}') is None
    end = parse_process_event('{"type":"end","exit_code":-1,"exited":false,"signal":2,"status":"signal: interrupt"}')
    assert end == ProcessEnd(-1, False, "signal: interrupt", 2) and not end.ok
    assert parse_process_event('{"type":"end","exit_code":0,"exited":true,"status":"exit status 0"}').ok


def test_stream_errors_raise_their_class() -> None:
    with pytest.raises(forkvm.GuestError):
        parse_process_event('{"type":"error","error":{"code":"guest_error","message":"the guest went away"}}')
    with pytest.raises(forkvm.NotFound):
        parse_watch_event('{"type":"error","error":{"code":"not_found","message":"gone"}}')
    with pytest.raises(forkvm.ProtocolError):
        parse_process_event('{"type":"stdout","data":"not base64!"}')
    with pytest.raises(forkvm.ProtocolError):
        parse_process_event("[1]")


def test_watch_events() -> None:
    assert parse_watch_event('{"type":"start"}').type == "start"
    assert parse_watch_event('{"type":"keepalive"}') is None
    batch = parse_watch_event('{"type":"events","events":[{"name":"a/b","op":"create"}],"dropped":3}')
    assert batch.events == [models.FsEvent("a/b", models.FsOp.CREATE)] and batch.dropped == 3


def test_signal_names() -> None:
    assert signal_number("INT") == signal_number("sigint") == signal_number(signal.SIGINT) == 2
    assert signal_number(9) == signal_number("9") == 9
    with pytest.raises(ValueError, match="unknown signal"):
        signal_number("NOPE")
    with pytest.raises(TypeError):
        signal_number(True)


def test_requests() -> None:
    body = _proc_ops.start_request("sleep 1", tag="t", pty=(80, 24), stdin=True)
    want = {"argv": ["sh", "-c", "sleep 1"], "tag": "t", "pty": {"cols": 80, "rows": 24}, "stdin": True}
    assert body.to_dict() == want
    assert _proc_ops.start_request(None).to_dict() == {}
    assert _proc_ops.pty_size({"cols": 1, "rows": 2}) == models.PtySize(1, 2)
    with pytest.raises(ValueError):
        _proc_ops.pty_size({"cols": 1})
    assert _proc_ops.start_process_stream("sb-1", body).json["stream"] is True
    r = _proc_ops.signal_process("sb-1", "web", "TERM")
    assert (r.method, r.path, r.json) == ("POST", "/v1/sandboxes/sb-1/processes/web/signal", {"signal": 15})
    archive = _proc_ops.download_archive("sb-1", ["/a", "/b c"])
    url = httpx.Request("GET", "http://x" + archive.path, params=archive.params).url
    assert url.query == b"path=%2Fa&path=%2Fb+c"
    with pytest.raises(ValueError):
        _proc_ops.download_archive("sb-1", [])
    up = _proc_ops.upload_archive("sb-1", "/dest", "/tmp/some.tar")
    assert up.upload == "/tmp/some.tar" and up.content is None
    assert _proc_ops.list_dir("sb-1", "/", 3).params == {"path": "/", "depth": "3"}
    assert _proc_ops.watch_dir("sb-1", "/", True).params["recursive"] == "true"
