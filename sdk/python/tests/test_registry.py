"""Snapshot push and pull against a real daemon and a real OCI registry.

The registry is Debian's ``docker-registry`` (the CNCF distribution
registry), started here on a free loopback port with its storage in a
temporary directory, and stopped by its PID at the end. A sandbox of the
session's daemon writes a file and is snapshotted; the snapshot is pushed
(with its chain and base image), pushed again (nothing but the index goes),
pulled back onto the same daemon (everything is cached), and pulled with a
tag into a second daemon of its own, where a sandbox spawned from it reads
the file back. Error paths: a missing tag, a taken tag, an unreachable
registry, an unknown snapshot.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, Client, Sandbox, Snapshot, models

from .conftest import Daemon, _cleanup, _free_port, _start_daemon, _stop

REGISTRY_BIN = Path(os.environ.get("FORKVM_TEST_REGISTRY", "/usr/bin/docker-registry"))

pytestmark = pytest.mark.skipif(
    not REGISTRY_BIN.is_file(), reason=f"needs an OCI registry at {REGISTRY_BIN} (apt-get install docker-registry)"
)


@dataclass
class Registry:
    """A registry on a loopback port: ``host`` is ``127.0.0.1:PORT``."""

    host: str
    process: subprocess.Popen
    root: Path

    def reference(self, repo: str, tag: str) -> str:
        return f"{self.host}/{repo}:{tag}"


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    root = Path(tempfile.mkdtemp(prefix="forkvm-pytest-registry-"))
    port = _free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}, secret: forkvm-test}}\n"
    )
    log = open(root / "registry.log", "wb")
    process = subprocess.Popen(
        [str(REGISTRY_BIN), "serve", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    reg = Registry(host=f"127.0.0.1:{port}", process=process, root=root)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"the registry exited with {process.returncode}: {(root / 'registry.log').read_text()}")
            try:
                if httpx.get(f"http://{reg.host}/v2/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the registry did not answer on {reg.host} within 30 s")
            time.sleep(0.1)
        yield reg
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def assert_threads_in_own_namespace(daemon: Daemon) -> None:
    """Every thread of the daemon is in the daemon's own network namespace.

    A regression check: the daemon once enabled IP forwarding in a new
    sandbox's namespace by ``setns`` on a tokio blocking-pool thread, which
    stayed there and could later serve as an async worker, so registry
    connections failed with "connection refused" (the loopback was the
    sandbox's). Only possible for a daemon this session started.
    """
    if daemon.process is None:
        return
    pid = daemon.process.pid
    own = os.readlink(f"/proc/{pid}/ns/net")
    stray = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if os.readlink(f"/proc/{pid}/task/{tid}/ns/net") != own:
                stray.append(tid)
        except FileNotFoundError:
            pass  # the thread ended meanwhile
    assert not stray, f"threads {stray} of the daemon (pid {pid}) are in a sandbox's network namespace"


@dataclass
class Pushed:
    """The snapshot the module pushes, and what its first push said."""

    snapshot: Snapshot
    reference: str
    #: The text written to MARKER before the snapshot.
    content: str
    result: models.PushResult
    events: List[models.TransferEvent]


MARKER = "/root/registry-marker"


@pytest.fixture(scope="module")
def pushed(daemon: Daemon, client: Client, registry: Registry) -> Pushed:
    content = f"pushed {secrets.token_hex(8)}\n"
    with Sandbox(client=client) as sb:
        sb.files.write(MARKER, content)
        snapshot = sb.snapshot(f"pytest-reg-{secrets.token_hex(4)}")
    reference = registry.reference("pytest/warm", "v1")
    assert_threads_in_own_namespace(daemon)
    events: List[models.TransferEvent] = []
    result = snapshot.push(reference, on_event=events.append)
    return Pushed(snapshot=snapshot, reference=reference, content=content, result=result, events=events)


@pytest.mark.slow
def test_push_reports_progress_and_what_it_sent(pushed: Pushed) -> None:
    result = pushed.result
    assert result.snapshot == pushed.snapshot.id
    assert result.reference == pushed.reference
    assert result.digest.startswith("sha256:")
    # The snapshot and its ancestors (at least the boot template it was spawned from).
    assert result.links >= 2 and result.links_skipped == 0
    assert result.image_sent
    assert result.blobs_sent > 0 and result.bytes_sent > 0
    assert result.manifests_sent >= result.links + 2  # the links, the image, the index
    assert result.total_ms > 0
    kinds = [e.type for e in pushed.events]
    assert kinds[-1] == "pushed" and pushed.events[-1].result == result
    assert "phase" in kinds
    progress = [e for e in pushed.events if e.type == "progress"]
    assert progress, kinds
    assert all(e.item and e.done is not None for e in progress)
    assert any(e.total and e.done == e.total for e in progress), "some item was reported complete"


@pytest.mark.slow
def test_a_second_push_sends_only_the_index(client: Client, pushed: Pushed) -> None:
    cached: List[str] = []
    again = client.push_snapshot(
        pushed.snapshot.id, pushed.reference, on_event=lambda e: cached.append(e.item) if e.type == "cached" else None
    )
    assert again.digest == pushed.result.digest
    assert again.links == pushed.result.links
    assert again.links_skipped == again.links
    assert not again.image_sent
    assert again.blobs_sent == 0 and again.manifests_sent == 1
    assert 0 < again.bytes_sent < 64 * 1024  # the index manifest
    assert len(cached) == again.links + 1, cached  # every link, and the image


@pytest.mark.slow
def test_a_pull_onto_the_pushing_daemon_finds_everything_cached(client: Client, pushed: Pushed) -> None:
    events: List[models.TransferEvent] = []
    result = client.pull_snapshot(pushed.reference, on_event=events.append)
    assert isinstance(result, models.PullResult)
    assert result.snapshot.id == pushed.snapshot.id and result.snapshot.tag == pushed.snapshot.tag
    assert result.digest == pushed.result.digest
    assert result.links == pushed.result.links and result.links_cached == result.links
    assert result.blobs_fetched == 0 and result.bytes_fetched == 0
    assert not result.image_created and result.image == "default"
    assert events[-1].type == "pulled" and events[-1].result == result
    assert sum(e.type == "cached" for e in events) == result.links + 1

    # By digest, through the object interface: the same snapshot.
    repo = pushed.reference.rsplit(":", 1)[0]
    same = Snapshot.pull(f"{repo}@{pushed.result.digest}", client=client)
    assert same.id == pushed.snapshot.id and same.info.state == "ready"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_async_client_pulls_too(daemon: Daemon, pushed: Pushed) -> None:
    seen: List[str] = []

    async def on_event(event: models.TransferEvent) -> None:
        seen.append(event.type)

    async with AsyncClient(daemon.url, daemon.token) as api:
        result = await api.pull_snapshot(pushed.reference, on_event=on_event)
    assert result.snapshot.id == pushed.snapshot.id and result.links_cached == result.links
    assert seen[-1] == "pulled"


@pytest.mark.slow
def test_a_pull_of_a_missing_tag_or_repository_is_not_found(client: Client, registry: Registry, pushed: Pushed) -> None:
    seen: List[str] = []
    with pytest.raises(forkvm.ImageNotFound) as info:
        client.pull_snapshot(registry.reference("pytest/warm", "no-such-tag"), on_event=lambda e: seen.append(e.type))
    assert info.value.code == "image_not_found" and "no-such-tag" in info.value.message
    assert seen[-1] == "error"
    with pytest.raises(forkvm.NotFound):
        client.pull_snapshot(registry.reference("pytest/no-such-repo", "v1"))


@pytest.mark.slow
def test_a_pull_into_a_taken_tag_is_a_conflict(client: Client, pushed: Pushed) -> None:
    with pytest.raises(forkvm.Conflict) as info:
        client.pull_snapshot(pushed.reference, tag=pushed.snapshot.tag)
    assert info.value.status == 409 and pushed.snapshot.tag in info.value.message


@pytest.mark.slow
def test_push_errors(client: Client, pushed: Pushed) -> None:
    closed = _free_port()  # nothing listens there
    with pytest.raises(forkvm.RegistryUnreachable) as info:
        pushed.snapshot.push(f"127.0.0.1:{closed}/pytest/warm:v1")
    assert info.value.code == "registry_unreachable"
    with pytest.raises(forkvm.NotFound) as info:
        client.push_snapshot("pytest-no-such-snapshot", pushed.reference)
    assert info.value.status == 404
    with pytest.raises(forkvm.InvalidRequest):
        client.push_snapshot(pushed.snapshot.id, "")


@pytest.fixture
def second_daemon() -> Iterator[Daemon]:
    """A daemon of the test's own (the launcher gives it a network pool of its own)."""
    d = _start_daemon(abort=pytest.fail)
    try:
        yield d
    finally:
        try:
            with d.client() as c:
                _cleanup(c, set(), set())
        finally:
            _stop(d)


@pytest.mark.slow
def test_a_pull_with_a_tag_into_another_daemon_spawns_with_the_file(
    second_daemon: Daemon, registry: Registry, pushed: Pushed
) -> None:
    tag = f"pytest-pulled-{secrets.token_hex(4)}"
    events: List[models.TransferEvent] = []
    with second_daemon.client() as other:
        result = other.pull_snapshot(pushed.reference, tag=tag, on_event=events.append)
        assert result.snapshot.id == pushed.snapshot.id and result.snapshot.tag == tag
        assert result.snapshot.state == "ready" and result.snapshot.origin
        assert result.links == pushed.result.links and result.links_cached == 0
        assert result.blobs_fetched > 0 and result.bytes_fetched > 0
        # Its image is the same one (both homes link the built images): matched, not fetched.
        assert result.image == "default" and not result.image_created
        assert events[-1].type == "pulled" and any(e.type == "phase" for e in events)

        snapshot = Snapshot.get(tag, client=other)
        (child,) = snapshot.spawn()
        try:
            assert child.files.read_text(MARKER) == pushed.content
        finally:
            child.close()

        # Again: everything is here now.
        again = other.pull_snapshot(pushed.reference)
        assert again.links_cached == again.links and again.blobs_fetched == 0
        assert again.snapshot.tag == tag
