"""Volumes against a real daemon (docs/volumes.md): host directories mounted
read-write and read-only, and named volumes made, listed and removed.

One sandbox of the module's own (``mounted``) has two host directories; the
named-volume tests spawn one more, from the boot template."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import forkvm
from forkvm import AsyncClient, Client, Sandbox, models

from .conftest import Daemon

GREETING = "hello from the host\n"


def _eventually_text(path: Path, timeout: float = 10.0) -> str:
    """The text of a host file the guest wrote (waiting for it to appear)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared on the host"
        time.sleep(0.1)
    return path.read_text()


@pytest.fixture(scope="module")
def host_dirs(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    """A read-write and a read-only host directory, each with a file in it."""
    rw = tmp_path_factory.mktemp("volume-rw")
    ro = tmp_path_factory.mktemp("volume-ro")
    (rw / "hello.txt").write_text(GREETING)
    (ro / "data.txt").write_text("read me\n")
    return rw, ro


@pytest.fixture(scope="module")
def mounted(client: Client, host_dirs: Tuple[Path, Path]) -> Iterator[Sandbox]:
    rw, ro = host_dirs
    # One volume in the CLI's string form, one as a mapping.
    with Sandbox(
        volumes=[f"{rw}:/work", {"source": str(ro), "path": "/data", "read_only": True}],
        client=client,
    ) as sb:
        yield sb


def test_the_sandbox_shows_its_volumes(mounted: Sandbox, host_dirs: Tuple[Path, Path]) -> None:
    rw, ro = host_dirs
    work, data = sorted(mounted.refresh().volumes, key=lambda v: v.path == "/data")
    assert mounted.volumes == mounted.info.volumes
    assert (work.source, work.path, work.read_only, work.mode) == (str(rw), "/work", False, models.VolumeMode.SHARED)
    assert (data.source, data.path, data.read_only) == (str(ro), "/data", True)
    assert Path(work.host_path) == rw.resolve() and Path(data.host_path) == ro.resolve()
    assert work.mount == forkvm.VolumeMount(str(rw), "/work")


def test_the_guest_reads_a_host_file(mounted: Sandbox) -> None:
    assert mounted.exec("cat /work/hello.txt", check=True).stdout == GREETING
    assert mounted.exec("cat /data/data.txt", check=True).stdout == "read me\n"


def test_a_guest_write_appears_on_the_host(mounted: Sandbox, host_dirs: Tuple[Path, Path]) -> None:
    rw, _ = host_dirs
    mounted.exec("mkdir -p /work/out && echo written by the guest > /work/out/note.txt && sync", check=True)
    assert _eventually_text(rw / "out" / "note.txt") == "written by the guest\n"
    # And the other way: a host edit is seen by the guest (attributes are cached for 1 s).
    (rw / "hello.txt").write_text("edited on the host\n")
    deadline = time.monotonic() + 10
    while mounted.exec("cat /work/hello.txt").stdout != "edited on the host\n":
        assert time.monotonic() < deadline, "the guest never saw the host's edit"
        time.sleep(0.5)


def test_a_read_only_volume_refuses_writes(mounted: Sandbox, host_dirs: Tuple[Path, Path]) -> None:
    _, ro = host_dirs
    result = mounted.exec("echo nope > /data/new.txt")
    assert result.exit_code != 0
    assert "read-only" in result.stderr.lower(), result.stderr
    assert mounted.exec("rm /data/data.txt").exit_code != 0
    assert sorted(os.listdir(ro)) == ["data.txt"]


def test_bad_volumes_are_refused(client: Client, daemon: Daemon, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Sandbox(volumes=["/tmp"], client=client)  # no guest path: refused before any request
    with pytest.raises(forkvm.InvalidRequest):
        client.create_sandbox(volumes=[f"{tmp_path}/missing:/work"])
    with pytest.raises(forkvm.InvalidRequest):
        client.create_sandbox(volumes=[f"{tmp_path}:/proc/x"])  # a kernel filesystem in the guest
    with pytest.raises(forkvm.NotFound):
        client.create_sandbox(volumes=[f"no-such-volume-{secrets.token_hex(4)}:/work"])
    if daemon.home is not None:
        with pytest.raises(forkvm.Forbidden):  # forkvm's home: never a guest's
            client.create_sandbox(volumes=[f"{daemon.home}:/work"])


def test_named_volumes(client: Client) -> None:
    name = f"pytest-{secrets.token_hex(4)}"
    vol = client.create_volume(name)
    try:
        assert isinstance(vol, models.Volume) and vol.name == name and vol.used_by == []
        assert vol.path and vol.created_at
        assert name in {v.name for v in client.list_volumes().volumes}
        with pytest.raises(forkvm.Conflict):
            client.create_volume(name)
        with pytest.raises(forkvm.InvalidRequest):
            client.create_volume("-bad name")
        with Sandbox(volumes=[forkvm.parse_volume(f"{name}:/scratch")], client=client) as sb:
            (mount,) = sb.volumes
            assert (mount.source, mount.path) == (name, "/scratch")
            sb.exec("echo kept > /scratch/kept.txt && sync", check=True)
            (listed,) = [v for v in client.list_volumes().volumes if v.name == name]
            assert listed.used_by == [sb.id]
            with pytest.raises(forkvm.Conflict):
                client.delete_volume(name)  # mounted
        assert client.delete_volume(name) is None
    except BaseException:
        _remove_quietly(client, name)
        raise
    assert name not in {v.name for v in client.list_volumes().volumes}
    with pytest.raises(forkvm.NotFound):
        client.delete_volume(name)


@pytest.mark.asyncio
async def test_named_volumes_async(daemon: Daemon) -> None:
    name = f"pytest-{secrets.token_hex(4)}"
    async with AsyncClient(daemon.url, daemon.token) as api:
        vol = await api.create_volume(name)
        try:
            assert vol.name == name
            assert name in {v.name for v in (await api.list_volumes()).volumes}
            with pytest.raises(forkvm.Conflict):
                await api.create_volume(name)
        finally:
            await api.delete_volume(name)
        with pytest.raises(forkvm.NotFound):
            await api.delete_volume(name)


def _remove_quietly(client: Client, name: str) -> None:
    for _ in range(50):  # a sandbox being removed may still hold it
        try:
            client.delete_volume(name)
            return
        except forkvm.NotFound:
            return
        except forkvm.Conflict:
            time.sleep(0.2)
