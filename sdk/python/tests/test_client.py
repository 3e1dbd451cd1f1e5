"""The low-level :class:`forkvm.Client` against a real daemon: every operation, and its errors."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import threading
import time

import pytest

import forkvm
from forkvm import Client, Sandbox, models

# --------------------------------------------------------------------------
# daemon


def test_health(client: Client) -> None:
    health = client.health()
    assert health.status == "ok"
    assert health.version


def test_info(client: Client) -> None:
    info = client.info()
    assert "default" in info.images
    assert info.accel.kind in ("kvm", "tcg") and info.accel.reason
    assert info.qemu.version
    assert info.limits.max_sandboxes > 0 and info.limits.max_file_bytes > 0
    assert isinstance(info.pools, list)
    assert info.sandboxes >= 0 and info.snapshots >= 0


def test_unknown_route_and_wrong_method(client: Client) -> None:
    response = client._http.get("/v1/nope")
    err = forkvm.errors.error_from_response(response)
    assert isinstance(err, forkvm.NotFound) and err.status == 404
    response = client._http.patch("/v1/sandboxes")
    err = forkvm.errors.error_from_response(response)
    assert isinstance(err, forkvm.MethodNotAllowed) and err.status == 405 and err.code == "invalid_request"


# --------------------------------------------------------------------------
# sandboxes


def test_list_and_get_sandbox(client: Client, sandbox: Sandbox) -> None:
    ids = [s.id for s in client.list_sandboxes().sandboxes]
    assert sandbox.id in ids
    info = client.get_sandbox(sandbox.id)
    assert info.state == models.SandboxState.RUNNING
    assert info.image == "default" and info.memory_mib == 512 and info.cpus == 1
    assert info.pid and info.created_at
    assert info.memory is not None and info.memory.rss_kib > 0 and info.memory.pss_kib > 0


def test_get_unknown_sandbox(client: Client) -> None:
    with pytest.raises(forkvm.NotFound) as exc:
        client.get_sandbox("sb-000000000000")
    assert exc.value.status == 404 and exc.value.code == "not_found" and "sb-000000000000" in exc.value.message


def test_create_and_delete_sandbox(client: Client) -> None:
    created = client.create_sandbox(memory_mib=512, cpus=1)
    assert isinstance(created, models.Sandbox)
    assert created.state == "running" and created.timings is not None and created.timings.total_ms > 0
    client.delete_sandbox(created.id)
    with pytest.raises(forkvm.NotFound):
        client.get_sandbox(created.id)
    with pytest.raises(forkvm.NotFound):
        client.delete_sandbox(created.id)


def test_create_batch(client: Client, template: str) -> None:
    batch = client.create_sandbox(snapshot=template, count=2)
    assert isinstance(batch, models.SandboxBatch)
    try:
        assert len(batch.sandboxes) == 2 and batch.total_ms > 0
        assert all(s.snapshot == template for s in batch.sandboxes)
        assert len({s.id for s in batch.sandboxes}) == 2
    finally:
        for s in batch.sandboxes:
            client.delete_sandbox(s.id)


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"memory_mib": 1}, forkvm.InvalidRequest, "memory_mib"),
        ({"cpus": 0}, forkvm.InvalidRequest, "cpus"),
        ({"cpus": 100000}, forkvm.InvalidRequest, "cpus"),
        ({"count": 0}, forkvm.InvalidRequest, "count"),
        ({"count": 1001}, forkvm.InvalidRequest, "count"),
        ({"image": "no-such-image"}, forkvm.ImageNotFound, "no-such-image"),
        ({"snapshot": "no-such-snapshot"}, forkvm.NotFound, "no-such-snapshot"),
    ],
)
def test_create_sandbox_errors(client: Client, kwargs: dict, error: type, needle: str) -> None:
    before = {s.id for s in client.list_sandboxes().sandboxes}
    with pytest.raises(error) as exc:
        client.create_sandbox(**kwargs)
    assert needle in exc.value.message
    assert exc.value.status in (400, 404)
    after = {s.id for s in client.list_sandboxes().sandboxes}
    assert after <= before, "a refused create must not leave a sandbox behind"


def test_malformed_bodies(client: Client) -> None:
    for body in (b"not json", b'{"bogus": 1}', b'{"memory_mib": "lots"}'):
        response = client._http.post("/v1/sandboxes", content=body, headers={"Content-Type": "application/json"})
        err = forkvm.errors.error_from_response(response)
        assert isinstance(err, forkvm.InvalidRequest) and err.status == 400, body
    response = client._http.post("/v1/sandboxes", content=b'{"bogus": 1}')
    assert "bogus" in forkvm.errors.error_from_response(response).message


def test_delete_while_starting_is_a_conflict_and_cold_boot(client: Client) -> None:
    """A cold boot (``use_template=False``) stays ``starting`` for seconds: removing it then is a 409."""
    before = {s.id for s in client.list_sandboxes().sandboxes}
    outcome: dict = {}

    def spawn() -> None:
        try:
            outcome["sandbox"] = client.create_sandbox(use_template=False)
        except Exception as e:  # pragma: no cover - reported below
            outcome["error"] = e

    thread = threading.Thread(target=spawn)
    thread.start()
    try:
        starting = None
        deadline = time.monotonic() + 60
        while starting is None and time.monotonic() < deadline and thread.is_alive():
            for s in client.list_sandboxes().sandboxes:
                # Once QEMU runs (pid set): a remove in the very first milliseconds of the
                # spawn, before QEMU started, is not refused by the daemon today.
                if s.id not in before and s.state == "starting" and s.pid:
                    starting = s
            time.sleep(0.05)
        assert starting is not None, "never saw the sandbox in state starting"
        with pytest.raises(forkvm.Conflict) as exc:
            client.delete_sandbox(starting.id)
        assert exc.value.status == 409
    finally:
        thread.join(timeout=300)
    assert "error" not in outcome, outcome.get("error")
    sb = outcome["sandbox"]
    try:
        assert sb.timings.boot_ms > 0 and sb.snapshot is None  # a real boot, not a restore
    finally:
        client.delete_sandbox(sb.id)


# --------------------------------------------------------------------------
# exec


def test_exec_output_and_exit_code(client: Client, sandbox: Sandbox) -> None:
    result = client.exec(sandbox.id, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert not result.timed_out and result.signal is None
    assert result.stdout_bytes == 4 and not result.stdout_truncated
    assert result.duration_ms >= 0 and result.encoding == models.OutputEncoding.UTF8


def test_exec_string_runs_through_sh(client: Client, sandbox: Sandbox) -> None:
    assert client.exec(sandbox.id, "echo $((6 * 7))").stdout == "42\n"


def test_exec_stdin_env_cwd(client: Client, sandbox: Sandbox) -> None:
    result = client.exec(
        sandbox.id,
        ["sh", "-c", 'cat; echo "$GREETING"; pwd'],
        stdin="from stdin\n",
        env={"GREETING": "hello"},
        cwd="/tmp",
    )
    assert result.stdout == "from stdin\nhello\n/tmp\n"
    raw = bytes(range(256))
    result = client.exec(sandbox.id, ["sha256sum"], stdin=raw)
    assert result.stdout.split()[0] == hashlib.sha256(raw).hexdigest()
    result = client.exec(sandbox.id, ["cat"], stdin_base64=base64.b64encode(b"b64").decode())
    assert result.stdout == "b64"


def test_exec_base64_output(client: Client, sandbox: Sandbox) -> None:
    result = client.exec(sandbox.id, ["printf", "\\377\\000\\376"], encoding="base64")
    assert result.encoding == "base64"
    assert result.raw_stdout == b"\xff\x00\xfe"


def test_exec_timeout(client: Client, sandbox: Sandbox) -> None:
    result = client.exec(sandbox.id, ["sleep", "10"], timeout_ms=300)
    assert result.timed_out and result.exit_code is None and result.signal == 9


def test_exec_output_cap(client: Client, sandbox: Sandbox) -> None:
    result = client.exec(sandbox.id, "head -c 10000 /dev/zero", max_output_bytes=100)
    assert result.stdout_truncated and result.stdout_bytes == 10000 and len(result.stdout) == 100


def test_exec_large_binary_output(client: Client, sandbox: Sandbox) -> None:
    digest = client.exec(sandbox.id, "head -c 4000000 /dev/urandom > /tmp/big; sha256sum < /tmp/big").stdout.split()[0]
    result = client.exec(sandbox.id, ["cat", "/tmp/big"], encoding="base64")
    assert result.stdout_bytes == 4_000_000
    assert hashlib.sha256(result.raw_stdout).hexdigest() == digest


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"argv": []}, forkvm.InvalidRequest, "argv"),
        ({"argv": ["no-such-program"]}, forkvm.NotFound, "no-such-program"),
        ({"argv": ["cat"], "stdin": "a", "stdin_base64": "YQ=="}, forkvm.InvalidRequest, "not both"),
        ({"argv": ["pwd"], "cwd": "/no/such/dir"}, forkvm.InvalidRequest, "/no/such/dir"),
        ({"argv": ["true"], "timeout_ms": 0}, forkvm.InvalidRequest, "timeout_ms"),
        ({"argv": ["true"], "max_output_bytes": 1 << 40}, forkvm.InvalidRequest, "max_output_bytes"),
        ({"argv": ["true"], "stdin_base64": "!!!"}, forkvm.InvalidRequest, "base64"),
    ],
)
def test_exec_errors(client: Client, sandbox: Sandbox, kwargs: dict, error: type, needle: str) -> None:
    argv = kwargs.pop("argv")
    with pytest.raises(error) as exc:
        client.exec(sandbox.id, argv, **kwargs)
    assert needle in exc.value.message


def test_exec_unknown_sandbox(client: Client) -> None:
    with pytest.raises(forkvm.NotFound):
        client.exec("sb-000000000000", ["true"])


# --------------------------------------------------------------------------
# streaming exec


def test_exec_stream_events(client: Client, sandbox: Sandbox) -> None:
    started = time.monotonic()
    arrivals = []
    with client.exec_stream(sandbox.id, ["sh", "-c", "echo one; sleep 1; echo two >&2; exit 4"]) as stream:
        events = []
        for event in stream:
            arrivals.append(time.monotonic() - started)
            events.append(event)
    out = [e for e in events if isinstance(e, forkvm.OutputEvent)]
    assert b"".join(e.data for e in out if e.stream == "stdout") == b"one\n"
    assert b"".join(e.data for e in out if e.stream == "stderr") == b"two\n"
    exit_event = events[-1]
    assert isinstance(exit_event, forkvm.ExitEvent) and exit_event is stream.exit
    assert exit_event.exit_code == 4 and not exit_event.timed_out and exit_event.duration_ms >= 1000
    assert exit_event.stdout_bytes == 4 and exit_event.stderr_bytes == 4
    # "one" arrived while the command was still sleeping.
    assert arrivals[-1] - arrivals[0] >= 0.8


def test_exec_stream_stdin_env_and_timeout(client: Client, sandbox: Sandbox) -> None:
    result = client.exec_stream(sandbox.id, 'cat; echo "$X"', stdin=b"\x01\x02", env={"X": "y"}).collect()
    assert result.raw_stdout == b"\x01\x02y\n" and result.exit_code == 0
    result = client.exec_stream(sandbox.id, ["sleep", "10"], timeout_ms=300).collect()
    assert result.timed_out and result.signal == 9


def test_exec_stream_errors(client: Client, sandbox: Sandbox) -> None:
    with pytest.raises(forkvm.NotFound):
        list(client.exec_stream("sb-000000000000", ["true"]))
    with pytest.raises(forkvm.NotFound):
        list(client.exec_stream(sandbox.id, ["no-such-program"]))
    with pytest.raises(forkvm.InvalidRequest):
        list(client.exec_stream(sandbox.id, []))


def test_exec_stream_collect_with_callbacks(client: Client, sandbox: Sandbox) -> None:
    seen = {"stdout": [], "stderr": []}
    result = client.exec_stream(sandbox.id, "printf 'h\\303'; sleep 0.2; printf '\\251\\n'; echo e >&2").collect(
        on_stdout=seen["stdout"].append, on_stderr=seen["stderr"].append
    )
    # The UTF-8 sequence split across chunks is decoded whole.
    assert "".join(seen["stdout"]) == "hé\n" == result.stdout
    assert "".join(seen["stderr"]) == "e\n"


# --------------------------------------------------------------------------
# files


def test_write_and_read_file(client: Client, sandbox: Sandbox) -> None:
    data = os.urandom(300_000)
    written = client.write_file(sandbox.id, "/tmp/blob.bin", data, mode=0o600)
    assert written.path == "/tmp/blob.bin" and written.size == len(data)
    assert client.read_file(sandbox.id, "/tmp/blob.bin") == data
    assert client.exec(sandbox.id, ["stat", "-c", "%a", "/tmp/blob.bin"]).stdout == "600\n"
    client.write_file(sandbox.id, "/tmp/script.sh", "#!/bin/sh\necho run\n", mode="755")
    assert client.exec(sandbox.id, ["/tmp/script.sh"]).stdout == "run\n"
    client.write_file(sandbox.id, "/tmp/empty", b"")
    assert client.read_file(sandbox.id, "/tmp/empty") == b""


def test_file_errors(client: Client, sandbox: Sandbox) -> None:
    with pytest.raises(forkvm.NotFound):
        client.read_file(sandbox.id, "/no/such/file")
    with pytest.raises(forkvm.InvalidRequest) as exc:
        client.read_file(sandbox.id, "relative/path")
    assert "absolute" in exc.value.message
    with pytest.raises(forkvm.InvalidRequest):
        client.write_file(sandbox.id, "relative", b"x")
    with pytest.raises(forkvm.InvalidRequest) as exc:
        client.write_file(sandbox.id, "/tmp/x", b"x", mode="9z")
    assert "mode" in exc.value.message
    with pytest.raises(forkvm.NotFound):
        client.read_file("sb-000000000000", "/etc/hostname")
    with pytest.raises(forkvm.NotFound):
        client.write_file("sb-000000000000", "/tmp/x", b"x")
    response = client._http.get(f"/v1/sandboxes/{sandbox.id}/files")  # no ?path=
    assert isinstance(forkvm.errors.error_from_response(response), forkvm.InvalidRequest)


def test_file_too_large(client: Client, sandbox: Sandbox) -> None:
    limit = client.info().limits.max_file_bytes
    with pytest.raises(forkvm.PayloadTooLarge) as exc:
        client.write_file(sandbox.id, "/tmp/huge", bytes(limit + 1))
    assert exc.value.status == 413


# --------------------------------------------------------------------------
# logs


def test_logs(client: Client, sandbox: Sandbox) -> None:
    client.exec(sandbox.id, "echo pytest-console-line > /dev/console")
    deadline = time.monotonic() + 10
    while "pytest-console-line" not in client.logs(sandbox.id):
        assert time.monotonic() < deadline, "the console line never reached the logs"
        time.sleep(0.1)
    with pytest.raises(forkvm.NotFound):
        client.logs("sb-000000000000")


# --------------------------------------------------------------------------
# a failed sandbox


@pytest.fixture
def failed(client: Client, daemon) -> models.Sandbox:
    """A sandbox whose QEMU was killed (our own daemon's child), so it is ``failed``."""
    if not daemon.managed:
        pytest.skip("needs the session's own daemon (kills a QEMU process)")
    created = client.create_sandbox()
    os.kill(created.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while client.get_sandbox(created.id).state != "failed":
        assert time.monotonic() < deadline, "the sandbox never became failed"
        time.sleep(0.1)
    yield client.get_sandbox(created.id)
    client.delete_sandbox(created.id)


def test_failed_sandbox(client: Client, failed: models.Sandbox) -> None:
    assert failed.state == models.SandboxState.FAILED and "signal 9" in (failed.failure or "")
    with pytest.raises(forkvm.Conflict) as exc:
        client.exec(failed.id, ["true"])
    assert exc.value.status == 409 and "failed" in exc.value.message
    with pytest.raises(forkvm.Conflict):
        client.read_file(failed.id, "/etc/hostname")
    with pytest.raises(forkvm.Conflict):
        client.write_file(failed.id, "/tmp/x", b"x")
    with pytest.raises(forkvm.Conflict):
        client.snapshot_sandbox(failed.id)
    with pytest.raises(forkvm.Conflict):
        client.branch_sandbox(failed.id)
    assert isinstance(client.logs(failed.id), str)  # the console survives


# --------------------------------------------------------------------------
# snapshots


def test_snapshot_get_list_delete(client: Client, source: Sandbox, tag: str) -> None:
    snap = client.snapshot_sandbox(source.id, tag=tag)
    assert snap.tag == tag and snap.source == source.id and snap.state == "ready"
    assert snap.timings is not None and snap.timings.pause_ms > 0
    assert snap.sizes.device_state_bytes > 0 and snap.sandboxes == [] and not snap.template
    assert client.get_snapshot(tag).id == snap.id
    assert client.get_snapshot(snap.id).tag == tag
    assert snap.id in {s.id for s in client.list_snapshots().snapshots}
    with pytest.raises(forkvm.Conflict) as exc:
        client.snapshot_sandbox(source.id, tag=tag)
    assert "tag" in exc.value.message
    client.delete_snapshot(tag)
    with pytest.raises(forkvm.NotFound):
        client.get_snapshot(snap.id)
    with pytest.raises(forkvm.NotFound):
        client.delete_snapshot(snap.id)


def test_snapshot_errors(client: Client) -> None:
    with pytest.raises(forkvm.NotFound):
        client.snapshot_sandbox("sb-000000000000")
    with pytest.raises(forkvm.NotFound):
        client.get_snapshot("sn-000000000000")
    with pytest.raises(forkvm.NotFound):
        client.get_snapshot("no-such-tag")


def test_spawn_from_snapshot_and_delete_conflict(client: Client, source: Sandbox, tag: str) -> None:
    snap = client.snapshot_sandbox(source.id, tag=tag)
    batch = client.create_sandbox(snapshot=tag, count=2)
    assert isinstance(batch, models.SandboxBatch)
    child = batch.sandboxes[0]
    assert client.exec(child.id, ["cat", "/root/marker"]).stdout == "from-the-source\n"
    assert set(client.get_snapshot(snap.id).sandboxes) == {s.id for s in batch.sandboxes}
    with pytest.raises(forkvm.Conflict) as exc:
        client.delete_snapshot(snap.id)
    assert exc.value.status == 409 and child.id in exc.value.message
    client.delete_snapshot(snap.id, force=True)
    for s in batch.sandboxes:
        with pytest.raises(forkvm.NotFound):
            client.get_sandbox(s.id)


# --------------------------------------------------------------------------
# branch


@pytest.mark.parametrize("mode", ["live", "full", "diff", None])
def test_branch_modes(client: Client, source: Sandbox, mode) -> None:
    result = client.branch_sandbox(source.id, mode=mode, count=1)
    try:
        assert result.mode == (mode or "live")
        assert len(result.children) == 1 and result.children[0].snapshot == result.snapshot.id
        assert result.pause_ms >= 0 and result.total_ms >= result.spawn_ms
        child = result.children[0].id
        assert client.exec(child, ["cat", "/root/marker"]).stdout == "from-the-source\n"
        assert client.get_sandbox(source.id).state == "running"
    finally:
        client.delete_snapshot(result.snapshot.id, force=True)


def test_branch_count_zero_and_tag(client: Client, source: Sandbox, tag: str) -> None:
    result = client.branch_sandbox(source.id, count=0, tag=tag)
    assert result.children == [] and result.snapshot.tag == tag
    with pytest.raises(forkvm.Conflict):
        client.branch_sandbox(source.id, count=0, tag=tag)
    client.delete_snapshot(tag)


def test_pin_unpin_and_prune(client: Client, source: Sandbox) -> None:
    snap = client.branch_sandbox(source.id, count=0).snapshot
    try:
        assert (snap.origin, snap.pinned) == ("branch", False)
        assert client.pin_snapshot(snap.id).pinned is True
        # Pinned, it is kept even by a prune that ignores the grace period.
        dry = client.prune_snapshots(all=True, dry_run=True)
        assert dry.dry_run and dry.grace_secs == 0
        assert snap.id not in {s.id for s in dry.snapshots}
        high = forkvm.Snapshot.get(snap.id, client=client)
        assert high.pinned and not high.unpin().pinned
        dry = forkvm.Snapshot.prune(all=True, dry_run=True, client=client)
        entry = next(s for s in dry.snapshots if s.id == snap.id)
        assert entry.kind == "diff" and entry.bytes > 0 and dry.freed_bytes >= entry.bytes
        assert client.get_snapshot(snap.id).id == snap.id, "a dry run removed it"
        # Within the grace period, a plain prune leaves a young branch point alone.
        plain = client.prune_snapshots()
        assert plain.grace_secs == client.info().gc.grace_secs > 0
        assert snap.id not in {s.id for s in plain.snapshots} and plain.failed == []
        assert high.pin().pinned and client.get_snapshot(snap.id).pinned
    finally:
        client.delete_snapshot(snap.id, force=True)
    with pytest.raises(forkvm.NotFound):
        client.pin_snapshot("sn-000000000000")
    with pytest.raises(forkvm.NotFound):
        client.unpin_snapshot("no-such-tag")
    response = client._http.post("/v1/snapshots/prune", json={"al": True})
    assert isinstance(forkvm.errors.error_from_response(response), forkvm.InvalidRequest)


def test_branch_no_wait(client: Client, source: Sandbox) -> None:
    result = client.branch_sandbox(source.id, count=1, wait=False)
    assert result.snapshot.state == "writing" and result.children == []
    deadline = time.monotonic() + 120
    while True:  # writing -> ready, then the child appears, starting -> running
        snap = client.get_snapshot(result.snapshot.id)
        assert snap.state != "failed", snap.failure
        if snap.state == "ready" and snap.sandboxes and client.get_sandbox(snap.sandboxes[0]).state == "running":
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert client.exec(snap.sandboxes[0], ["cat", "/root/marker"]).stdout == "from-the-source\n"
    client.delete_snapshot(snap.id, force=True)


def test_branch_gives_the_children_their_own_timeout(client: Client, source: Sandbox) -> None:
    before = client.get_sandbox(source.id).lifetime
    result = client.branch_sandbox(source.id, count=2, timeout=600)
    try:
        for child in result.children:
            assert child.lifetime is not None and child.lifetime.timeout == 600
            assert 590 <= child.lifetime.remaining_s <= 600
        after = client.get_sandbox(source.id).lifetime
        assert (before and before.timeout) == (after and after.timeout)  # the source's is its own
        with pytest.raises(forkvm.InvalidRequest):
            client.branch_sandbox(source.id, count=1, timeout=0)
    finally:
        client.delete_snapshot(result.snapshot.id, force=True)


def test_branch_errors(client: Client, source: Sandbox) -> None:
    with pytest.raises(forkvm.InvalidRequest) as exc:
        client.branch_sandbox(source.id, count=1001)
    assert "count" in exc.value.message
    with pytest.raises(forkvm.NotFound):
        client.branch_sandbox("sb-000000000000")
    with pytest.raises(ValueError):
        client.branch_sandbox(source.id, mode="sideways")
    response = client._http.post(f"/v1/sandboxes/{source.id}/branch", json={"mode": "sideways"})
    assert isinstance(forkvm.errors.error_from_response(response), forkvm.InvalidRequest)


def test_flatten(client: Client, source: Sandbox, tag: str) -> None:
    # A diff branch of a sandbox, then a diff branch of its child: a chain of two diffs.
    first = client.branch_sandbox(source.id, mode="diff", count=1)
    try:
        second = client.branch_sandbox(first.children[0].id, mode="diff", count=0)
        assert second.snapshot.kind == "diff" and second.snapshot.parent == first.snapshot.id
        assert (second.snapshot.depth or 0) >= 1
        flat = client.flatten_snapshot(second.snapshot.id, tag=tag)
        assert flat.kind == "shared" and flat.parent is None and flat.tag == tag
        batch = client.create_sandbox(snapshot=flat.id, count=1)
        assert client.exec(batch.sandboxes[0].id, ["cat", "/root/marker"]).stdout == "from-the-source\n"
        with pytest.raises(forkvm.Conflict):  # tag taken
            client.flatten_snapshot(second.snapshot.id, tag=tag)
        client.delete_snapshot(flat.id, force=True)
    finally:
        client.delete_snapshot(first.snapshot.id, force=True)


def test_flatten_errors(client: Client, template: str) -> None:
    with pytest.raises(forkvm.NotFound):
        client.flatten_snapshot("sn-000000000000")
    with pytest.raises(forkvm.InvalidRequest) as exc:
        client.flatten_snapshot(template)  # a shared snapshot has no chain
    assert "diff" in exc.value.message


def test_set_pool(client: Client, template: str) -> None:
    snap = client.set_pool(template, 1)
    try:
        assert snap.pool_size == 1
        deadline = time.monotonic() + 60
        while True:
            pools = {p.snapshot: p for p in client.info().pools}
            if template in pools and pools[template].ready >= 1:
                break
            assert time.monotonic() < deadline, "the warm pool never filled"
            time.sleep(0.2)
        assert pools[template].size == 1
        spawned = client.create_sandbox(snapshot=template)
        assert spawned.timings.from_pool is True
        client.delete_sandbox(spawned.id)
    finally:
        off = client.set_pool(template, 0)
        assert (off.pool_size, off.pool_default) == (0, False)
    # None drops the snapshot's own size: it follows the daemon's default.
    default = client.info().default_pool_size
    back = client.set_pool(template, None)
    assert (back.pool_size, back.pool_default) == (default, True)
    client.set_pool(template, 0)
    with pytest.raises(forkvm.NotFound):
        client.set_pool("sn-000000000000", 1)
    response = client._http.put(f"/v1/snapshots/{template}/pool", json={"size": -1})
    assert isinstance(forkvm.errors.error_from_response(response), forkvm.InvalidRequest)


# --------------------------------------------------------------------------
# transport


def test_tcp_with_token(daemon) -> None:
    if not daemon.tcp_url:
        pytest.skip("the daemon under test serves no TCP (set FORKVM_URL=http://... to test it)")
    with Client(daemon.tcp_url, daemon.token) as tcp:
        assert tcp.endpoint.uds is None
        assert tcp.health().status == "ok"
        assert isinstance(tcp.list_sandboxes(), models.SandboxList)
    for token in ("wrong-token", ""):
        with Client(daemon.tcp_url, token) as bad:
            with pytest.raises(forkvm.Unauthorized) as exc:
                bad.info()
            assert exc.value.status == 401 and exc.value.code == "unauthorized"


def test_tcp_exec_stream(daemon, sandbox: Sandbox) -> None:
    if not daemon.tcp_url:
        pytest.skip("the daemon under test serves no TCP")
    with Client(daemon.tcp_url, daemon.token) as tcp:
        assert tcp.exec_stream(sandbox.id, "echo tcp").collect().stdout == "tcp\n"


def test_unreachable_daemon(tmp_path) -> None:
    with Client(f"unix://{tmp_path}/none.sock") as c:
        with pytest.raises(forkvm.DaemonUnreachable) as exc:
            c.health()
    assert "forkvm serve" in exc.value.message
    with Client("http://127.0.0.1:1") as c:
        with pytest.raises(forkvm.DaemonUnreachable):
            c.health()


def test_env_configuration(daemon, monkeypatch) -> None:
    monkeypatch.setenv("FORKVM_URL", daemon.url)
    if daemon.token:
        monkeypatch.setenv("FORKVM_TOKEN", daemon.token)
    with Client() as c:
        assert c.endpoint.display == daemon.url
        assert c.health().status == "ok"
    if daemon.url.startswith("unix://"):
        # FORKVM_HOME is used when FORKVM_URL is not set.
        home = daemon.url[len("unix://") :].rsplit("/", 1)[0]
        monkeypatch.delenv("FORKVM_URL")
        monkeypatch.setenv("FORKVM_HOME", home)
        with Client() as c:
            assert c.endpoint.uds == f"{home}/forkvm.sock"
            assert c.health().status == "ok"
