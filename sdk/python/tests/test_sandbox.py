"""The object interface (``Sandbox``, ``Snapshot``, ``Branch``) against a real daemon."""

from __future__ import annotations

import time

import pytest

import forkvm
from forkvm import Branch, Client, Sandbox, Snapshot


@pytest.fixture
def env_daemon(daemon, monkeypatch):
    """Point the environment (and so the default client) at the daemon under test."""
    monkeypatch.setenv("FORKVM_URL", daemon.url)
    if daemon.token:
        monkeypatch.setenv("FORKVM_TOKEN", daemon.token)
    monkeypatch.setattr(forkvm._default, "_default", None)
    yield daemon
    if forkvm._default._default is not None:
        forkvm._default._default.close()


def test_sandbox_without_arguments(env_daemon) -> None:
    with Sandbox() as sb:
        assert sb.client is forkvm.default_client()
        assert sb.state == "running" and sb.info.image == "default"
        assert sb.id.startswith("sb-") and repr(sb) == f"<Sandbox {sb.id} running>"
        assert sb.exec("hostname").stdout.strip() == sb.id
        assert Sandbox.get(sb.id) == sb
        assert sb in Sandbox.list()
        info = sb.refresh()
        assert info is sb.info and info.memory is not None and info.memory.rss_kib > 0
    assert sb.closed
    with pytest.raises(forkvm.NotFound):
        Sandbox.get(sb.id)
    sb.close()  # idempotent


def test_close_ignores_a_sandbox_already_gone(client: Client) -> None:
    sb = Sandbox(client=client)
    client.delete_sandbox(sb.id)
    sb.close()
    assert sb.closed


def test_spawn_errors(client: Client) -> None:
    with pytest.raises(forkvm.ImageNotFound):
        Sandbox("no-such-image", client=client)
    with pytest.raises(forkvm.InvalidRequest):
        Sandbox(memory_mib=1, client=client)
    with pytest.raises(forkvm.NotFound):
        Sandbox(snapshot="no-such-snapshot", client=client)
    with pytest.raises(forkvm.NotFound):
        Sandbox.get("sb-000000000000", client=client)
    with pytest.raises(forkvm.NotFound):
        Snapshot.get("no-such-snapshot", client=client)


def test_exec(sandbox: Sandbox) -> None:
    result = sandbox.exec("echo $((1 + 1))")
    assert result.stdout == "2\n" and result.ok and result.duration >= 0
    result = sandbox.exec(["sh", "-c", 'cat; echo "$A" >&2; pwd'], stdin=b"in\n", env={"A": "b"}, cwd="/root")
    assert (result.stdout, result.stderr) == ("in\n/root\n", "b\n")
    result = sandbox.exec(["sleep", "5"], timeout=0.3)
    assert result.timed_out and not result.ok
    assert sandbox.exec("exit 7").exit_code == 7
    with pytest.raises(forkvm.CommandFailed) as exc:
        sandbox.exec("echo broken >&2; exit 2", check=True)
    assert exc.value.result.exit_code == 2 and "broken" in str(exc.value)
    assert sandbox.exec(["printf", "\\001"], encoding="base64").raw_stdout == b"\x01"


def test_exec_with_callbacks(sandbox: Sandbox) -> None:
    lines = []
    stamps = []

    def on_stdout(text: str) -> None:
        lines.append(text)
        stamps.append(time.monotonic())

    errors = []
    result = sandbox.exec(
        "for i in 1 2 3; do echo $i; sleep 0.4; done; echo done >&2",
        on_stdout=on_stdout,
        on_stderr=errors.append,
    )
    assert "".join(lines) == "1\n2\n3\n" == result.stdout
    assert "".join(errors) == "done\n" == result.stderr
    assert result.exit_code == 0 and result.duration_ms >= 1200
    assert stamps[-1] - stamps[0] >= 0.6, "output arrived while the command ran"
    with pytest.raises(ValueError):
        sandbox.exec("true", on_stdout=print, encoding="base64")


def test_exec_stream(sandbox: Sandbox) -> None:
    stream = sandbox.exec_stream(["sh", "-c", "echo a; echo b >&2; exit 1"])
    events = list(stream)
    assert [e.type for e in events][-1] == "exit"
    assert b"".join(e.data for e in events if e.type == "stdout") == b"a\n"
    assert b"".join(e.data for e in events if e.type == "stderr") == b"b\n"
    assert stream.exit is not None and stream.exit.exit_code == 1 and not stream.exit.ok
    with pytest.raises(RuntimeError):
        list(stream)  # a stream is iterated once
    # Leaving early closes the connection.
    with sandbox.exec_stream("echo x; sleep 0.5; echo y") as s:
        first = next(iter(s))
        assert first.type == "stdout"
    assert sandbox.exec("echo still fine").stdout == "still fine\n"


def test_files(sandbox: Sandbox) -> None:
    written = sandbox.files.write("/tmp/hello.txt", "héllo\n")
    assert written.size == len("héllo\n".encode())
    assert sandbox.files.read("/tmp/hello.txt") == "héllo\n".encode()
    assert sandbox.files.read_text("/tmp/hello.txt") == "héllo\n"
    sandbox.files.write("/tmp/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sandbox.exec("/tmp/run.sh").stdout == "ran\n"
    with pytest.raises(forkvm.NotFound):
        sandbox.files.read("/tmp/nothing-here")


def test_logs(sandbox: Sandbox) -> None:
    sandbox.exec("echo object-console-line > /dev/console", check=True)
    deadline = time.monotonic() + 10
    while "object-console-line" not in sandbox.logs():
        assert time.monotonic() < deadline, "the console line never reached the logs"
        time.sleep(0.1)


def test_snapshot_spawn_delete(source: Sandbox, tag: str) -> None:
    snap = source.snapshot(tag=tag)
    assert isinstance(snap, Snapshot) and snap.tag == tag and snap.info.source == source.id
    assert Snapshot.get(tag, client=source.client) == snap
    assert snap in Snapshot.list(client=source.client)
    children = snap.spawn(count=2)
    assert len(children) == 2 and all(isinstance(c, Sandbox) for c in children)
    assert {c.id for c in snap.sandboxes()} == {c.id for c in children}
    for child in children:
        assert child.info.snapshot == snap.id
        assert child.exec("cat /root/marker").stdout == "from-the-source\n"
    # The children's writes are their own.
    children[0].exec("echo mine > /root/marker", check=True)
    assert children[1].files.read_text("/root/marker") == "from-the-source\n"
    assert source.files.read_text("/root/marker") == "from-the-source\n"
    with pytest.raises(forkvm.Conflict) as exc:
        snap.delete()
    assert exc.value.status == 409
    snap.delete(force=True)
    for child in children:
        with pytest.raises(forkvm.NotFound):
            child.refresh()
        child.close()  # already gone: no error


def test_branch(source: Sandbox) -> None:
    source.exec("echo before-branch > /tmp/state", check=True)
    branch = source.branch(count=3)
    try:
        assert isinstance(branch, Branch) and branch.mode == "live"
        assert len(branch.children) == 3 and branch.pause_ms >= 0 and branch.total_ms > 0
        assert branch.snapshot.info.sandboxes or True
        hostnames = {c.exec("hostname").stdout.strip() for c in branch.children}
        assert hostnames == {c.id for c in branch.children}
        for child in branch.children:
            assert child.files.read_text("/tmp/state") == "before-branch\n"
        keep = branch.children[0]
        branch.close(keep=[keep])
        assert all(c.closed for c in branch.children[1:]) and not keep.closed
        assert keep.exec("true").ok
    finally:
        branch.snapshot.delete(force=True)


def test_branch_modes_and_no_wait(source: Sandbox) -> None:
    full = source.branch("full", count=0)
    assert full.mode == "full" and full.children == []
    full.snapshot.delete()
    pending = source.branch(count=2, wait=False)
    try:
        assert pending.snapshot.info.state == "writing" and pending.children == []
        pending.wait(timeout=180)
        assert pending.snapshot.info.state == "ready"
        assert len(pending.children) == 2 and all(c.state == "running" for c in pending.children)
        assert pending.children[0].exec("cat /root/marker").stdout == "from-the-source\n"
    finally:
        pending.snapshot.delete(force=True)
    with pytest.raises(forkvm.InvalidRequest):
        source.branch(count=1001)


def test_diff_flatten_and_pool(source: Sandbox, tag: str) -> None:
    first = source.branch("diff", count=1)
    try:
        second = first.children[0].branch("diff", count=0)
        assert second.snapshot.info.kind == "diff" and second.snapshot.info.parent == first.snapshot.id
        flat = second.snapshot.flatten(tag=tag)
        assert flat.tag == tag and flat.info.kind == "shared" and flat.info.parent is None
        assert flat.set_pool(1) is flat and flat.info.pool_size == 1
        (child,) = flat.spawn()
        assert child.exec("cat /root/marker").stdout == "from-the-source\n"
        child.close()
        assert flat.set_pool(0).info.pool_size == 0
        flat.delete()
        with pytest.raises(forkvm.NotFound):
            flat.refresh()
    finally:
        first.snapshot.delete(force=True)
