"""Background processes (``sb.processes``, ``Client.start_process``...) against a real
daemon, in the session's shared sandbox: start, list, attach (replayed output, then the
end), stdin and its end-of-file, signals, kill, a PTY (output, typing, resize), a
streamed start, and the errors. See docs/processes.md."""

from __future__ import annotations

import secrets
import signal
import time
from typing import Iterator

import pytest

import forkvm
from forkvm import AsyncClient, AsyncSandbox, ProcessEnd, ProcessOutput, ProcessStart, Sandbox, SandboxProcess


@pytest.fixture
def ptag() -> str:
    """A tag unique among the shared sandbox's processes."""
    return f"py-{secrets.token_hex(4)}"


@pytest.fixture
def procs(sandbox: Sandbox) -> Iterator[list]:
    """Processes a test started; killed at its end if still running."""
    started: list = []
    yield started
    for p in started:
        try:
            p.kill()
        except forkvm.NotFound:
            pass


def _until(stream, needle: bytes, timeout: float = 60.0) -> bytes:
    """Read ``stream`` until its output holds ``needle``; close it; return what it held."""
    deadline = time.monotonic() + timeout
    with stream:
        for event in stream:
            if isinstance(event, ProcessOutput):
                seen = stream.stdout + stream.stderr + stream.pty
                if needle in seen:
                    return seen
            assert time.monotonic() < deadline, f"{needle!r} never came"
    return stream.stdout + stream.stderr + stream.pty


def test_start_list_attach_replays_output_then_end(sandbox: Sandbox, ptag: str, procs: list) -> None:
    p = sandbox.processes.start("echo one; echo two >&2; read x < /dev/null; sleep 1; echo three; exit 3", tag=ptag)
    procs.append(p)
    assert isinstance(p, SandboxProcess) and p.pid > 0 and p.tag == ptag
    listed = {q.pid: q for q in sandbox.processes.list()}
    if p.pid in listed:  # it may be gone already under a fast guest
        assert listed[p.pid].tag == ptag and listed[p.pid].argv[:2] == ["sh", "-c"]
    stream = sandbox.processes.attach(ptag)
    events = list(stream)
    assert isinstance(events[0], ProcessStart) and events[0].pid == p.pid == stream.pid
    end = events[-1]
    assert isinstance(end, ProcessEnd) and stream.end == end
    assert (end.exit_code, end.exited, end.ok, end.status) == (3, True, False, "exit status 3")
    assert stream.stdout == b"one\nthree\n" and stream.stderr == b"two\n"
    # Once ended it is no longer listed, but a late attach still replays it all.
    assert p.pid not in {q.pid for q in sandbox.processes.list()}
    again = p.attach()
    assert again.wait().exit_code == 3 and again.stdout == b"one\nthree\n"


def test_stdin_then_close_gives_cat_end_of_file(sandbox: Sandbox, ptag: str, procs: list) -> None:
    p = sandbox.processes.start(["cat"], tag=ptag, stdin=True)
    procs.append(p)
    sandbox.processes.send_stdin(ptag, "hello ")
    p.send_stdin(b"\x00world\n")
    assert b"\x00world" in _until(sandbox.processes.attach(p.pid), b"world")
    p.close_stdin()
    stream = p.attach()
    end = stream.wait()
    assert end.ok, end
    assert stream.stdout == b"hello \x00world\n"


def test_signal_by_name_and_number_and_kill(sandbox: Sandbox, ptag: str, procs: list) -> None:
    p = sandbox.processes.start(["sleep", "1000"], tag=ptag)
    procs.append(p)
    sandbox.processes.signal(ptag, "INT")
    end = p.wait()
    assert (end.exited, end.signal, end.exit_code) == (False, signal.SIGINT, -1)
    q = sandbox.processes.start(["sleep", "1000"], tag=ptag)  # the tag is free again
    procs.append(q)
    q.signal(signal.SIGTERM)
    assert q.wait().signal == 15
    r = sandbox.processes.start(["sleep", "1000"])
    procs.append(r)
    assert r.tag is None and r.pid in {x.pid for x in sandbox.processes.list()}
    sandbox.processes.kill(r.pid)
    assert r.wait().signal == 9
    with pytest.raises(ValueError):
        r.signal("NOPE")


def test_pty_output_typing_and_resize(sandbox: Sandbox, ptag: str, procs: list) -> None:
    p = sandbox.processes.start(["sh"], tag=ptag, pty=(80, 24))
    procs.append(p)
    listed = next(x for x in sandbox.processes.list() if x.pid == p.pid)
    assert listed.pty is not None and (listed.pty.cols, listed.pty.rows) == (80, 24)
    p.send_stdin("stty size\n")
    assert b"24 80" in _until(p.attach(), b"24 80")
    sandbox.processes.resize(ptag, cols=100, rows=40)
    p.send_stdin("stty size\n")
    assert b"40 100" in _until(p.attach(), b"40 100")
    with pytest.raises(forkvm.InvalidRequest):
        p.close_stdin()  # a PTY has no stdin to close
    with pytest.raises(forkvm.InvalidRequest):
        p.resize(0, 40)
    p.send_stdin("exit 5\n")
    stream = p.attach()
    assert stream.wait().exit_code == 5
    assert b"24 80" in stream.pty


def test_streamed_start_and_errors(client: forkvm.Client, sandbox: Sandbox, ptag: str) -> None:
    stream = sandbox.processes.run("echo streamed; echo oops >&2; exit 3", tag=ptag)
    events = list(stream)
    assert isinstance(events[0], ProcessStart) and stream.pid == events[0].pid
    assert (stream.stdout, stream.stderr, stream.end.exit_code) == (b"streamed\n", b"oops\n", 3)
    with pytest.raises(forkvm.NotFound) as e:
        client.attach_process(sandbox.id, "no-such-tag")
    assert f"list the running processes of sandbox {sandbox.id}" in e.value.message
    assert e.value.hint == {"action": "list_processes", "target": sandbox.id}
    with pytest.raises(forkvm.NotFound):
        sandbox.processes.kill(999999)
    with pytest.raises(forkvm.InvalidRequest):
        sandbox.processes.start(["true"], tag="bad tag!")
    with pytest.raises((forkvm.InvalidRequest, forkvm.NotFound), match="no-such-program-here"):
        sandbox.processes.start(["no-such-program-here"])
    p = sandbox.processes.start(["sleep", "100"])
    try:
        with pytest.raises(forkvm.InvalidRequest):
            p.send_stdin("x")  # started without stdin
    finally:
        p.kill()


def test_client_level_operations(client: forkvm.Client, sandbox: Sandbox, ptag: str) -> None:
    started = client.start_process(sandbox.id, ["sh", "-c", "cat; echo done"], tag=ptag, stdin=True)
    assert started.tag == ptag
    assert ptag in {p.tag for p in client.list_processes(sandbox.id).processes}
    client.write_stdin(sandbox.id, ptag, b"abc")
    client.close_stdin(sandbox.id, ptag)
    stream = client.attach_process(sandbox.id, started.pid)  # already open: iterate it
    assert stream.wait().ok and stream.stdout == b"abcdone\n"


@pytest.mark.asyncio
async def test_async_processes(daemon, sandbox: Sandbox, ptag: str) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        sb = await AsyncSandbox.get(sandbox.id, client=api)
        p = await sb.processes.start("cat", tag=ptag, stdin=True)
        assert ptag in {x.tag for x in await sb.processes.list()}
        await p.send_stdin("async\n")
        await sb.processes.close_stdin(ptag)
        events = [e async for e in sb.processes.attach(ptag)]
        assert isinstance(events[-1], ProcessEnd) and events[-1].ok
        assert b"".join(e.data for e in events if isinstance(e, ProcessOutput)) == b"async\n"
        q = await sb.processes.start(["sleep", "100"])
        async with await api.attach_process(sb.id, q.pid) as stream:
            await q.signal("TERM")
            assert (await stream.wait()).signal == 15
        stream = sb.processes.run(["sh", "-c", "echo hi"])
        assert (await stream.wait()).ok and stream.stdout == b"hi\n"
