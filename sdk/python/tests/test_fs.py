"""Filesystem operations (``sb.fs``, ``Client.stat_file``...) against a real daemon, in
the session's shared sandbox: stat, exists, list with depth, mkdir, move, remove, a
streamed watch that sees a create and a delete, a polled watcher, and archives of
several paths downloaded and uploaded. See docs/processes.md."""

from __future__ import annotations

import io
import secrets
import tarfile
import threading
import time

import pytest

import forkvm
from forkvm import AsyncClient, AsyncSandbox, Sandbox, models


@pytest.fixture
def root(sandbox: Sandbox):
    """A directory of the test's own in the shared sandbox, removed at the end."""
    path = f"/tmp/pyfs-{secrets.token_hex(4)}"
    yield path
    try:
        sandbox.fs.remove(path)
    except forkvm.NotFound:
        pass


def test_stat_exists_list_mkdir_move_remove(sandbox: Sandbox, root: str) -> None:
    made = sandbox.fs.mkdir(f"{root}/a/b")
    assert not made.existed and made.entry.is_dir and made.entry.path == f"{root}/a/b"
    assert sandbox.fs.mkdir(f"{root}/a/b").existed
    sandbox.fs.write(f"{root}/a/b/f.txt", "12345", mode=0o640)
    sandbox.exec(f"ln -s b/f.txt {root}/a/link && chmod u+s {root}/a/b/f.txt", check=True)

    st = sandbox.fs.stat(f"{root}/a/b/f.txt")
    assert isinstance(st, models.EntryInfo) and st.is_file and st.kind == models.FileKind.FILE
    assert (st.name, st.size, st.mode & 0o7777) == ("f.txt", 5, 0o4640)
    assert st.permissions.endswith("rw-r-----")  # with a setuid mark the daemon's format chooses
    assert sandbox.fs.stat(f"{root}/a").permissions == "drwxr-xr-x"
    assert (st.owner, st.group) == ("root", "root") and st.modified_ns > 1_600_000_000 * 10**9
    link = sandbox.fs.stat(f"{root}/a/link")
    assert link.is_symlink and link.symlink_target == "b/f.txt"

    assert sandbox.fs.exists(f"{root}/a/link") and not sandbox.fs.exists(f"{root}/none")
    assert [e.name for e in sandbox.fs.list(root)] == ["a"]
    deep = {e.path: e.kind for e in sandbox.fs.list(root, depth=3)}
    assert deep == {
        f"{root}/a": "dir",
        f"{root}/a/b": "dir",
        f"{root}/a/link": "symlink",
        f"{root}/a/b/f.txt": "file",
    }

    moved = sandbox.fs.move(f"{root}/a/b/f.txt", f"{root}/g.txt")
    assert moved.path == f"{root}/g.txt" and moved.size == 5
    assert not sandbox.fs.exists(f"{root}/a/b/f.txt") and sandbox.fs.read(f"{root}/g.txt") == b"12345"
    sandbox.fs.remove(f"{root}/a")
    assert [e.name for e in sandbox.fs.list(root)] == ["g.txt"]

    with pytest.raises(forkvm.NotFound):
        sandbox.fs.stat(f"{root}/none")
    with pytest.raises(forkvm.NotFound):
        sandbox.fs.remove(f"{root}/none")
    with pytest.raises(forkvm.InvalidRequest):
        sandbox.fs.stat("relative/path")
    with pytest.raises(forkvm.InvalidRequest):
        sandbox.fs.remove("/")


def test_watch_sees_a_create_and_a_delete(sandbox: Sandbox, root: str) -> None:
    sandbox.fs.mkdir(root)
    seen = []
    with sandbox.fs.watch(root) as changes:  # returns once the watch is in place
        # The changes happen while the loop below reads them.
        timer = threading.Timer(0.2, lambda: sandbox.exec(f"touch {root}/new && rm {root}/new", check=True))
        timer.start()
        deadline = time.monotonic() + 60
        for change in changes:
            assert isinstance(change, models.FsEvent)
            seen.append((change.op, change.name))
            if (models.FsOp.REMOVE, "new") in seen:
                break
            assert time.monotonic() < deadline, seen
        timer.join()
    assert (models.FsOp.CREATE, "new") in seen and (models.FsOp.REMOVE, "new") in seen
    assert seen.index(("create", "new")) < seen.index(("remove", "new"))
    assert changes.dropped == 0


def test_polled_watcher(client: forkvm.Client, sandbox: Sandbox, root: str) -> None:
    sandbox.fs.mkdir(f"{root}/sub")
    with sandbox.fs.watcher(root, recursive=True) as watcher:
        sandbox.exec(f"echo x > {root}/sub/f && mv {root}/sub/f {root}/g", check=True)
        events = []
        deadline = time.monotonic() + 30
        while ("g", "create") not in events:
            batch = watcher.poll()
            assert batch.dropped == 0
            events += [(e.name, e.op) for e in batch.events]
            assert time.monotonic() < deadline, events
            time.sleep(0.1)
        assert ("sub/f", "create") in events
    with pytest.raises(forkvm.NotFound):
        client.poll_watcher(sandbox.id, watcher.id)


def test_archives_of_several_paths_down_and_up(sandbox: Sandbox, root: str) -> None:
    sandbox.fs.mkdir(f"{root}/d/e")
    sandbox.fs.write(f"{root}/d/e/x", "x-data", mode=0o600)
    sandbox.fs.write(f"{root}/two.bin", bytes(range(256)))
    tar = sandbox.fs.download_archive(f"{root}/d", f"{root}/two.bin")
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        names = {m.name.rstrip("/"): m for m in t.getmembers()}
        r = root.lstrip("/")
        assert {f"{r}/d", f"{r}/d/e", f"{r}/d/e/x", f"{r}/two.bin"} <= set(names)
        assert names[f"{r}/d/e/x"].mode & 0o777 == 0o600
        assert t.extractfile(names[f"{r}/two.bin"]).read() == bytes(range(256))

    # Uploaded to another place, it puts the same tree there.
    written = sandbox.fs.upload_archive(f"{root}/copy", tar)
    assert isinstance(written, models.ArchiveWritten) and written.bytes == 6 + 256 and written.entries >= 4
    assert sandbox.fs.read(f"{root}/copy{root}/d/e/x") == b"x-data"
    assert sandbox.fs.stat(f"{root}/copy{root}/d/e/x").mode & 0o777 == 0o600

    # A tar made here, from a file on disk, unpacks under its destination.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"from the host\n"
        info = tarfile.TarInfo("up/hello.txt")
        info.size, info.mode = len(data), 0o644
        t.addfile(info, io.BytesIO(data))
    assert sandbox.fs.upload_archive(f"{root}/in", buf.getvalue()).bytes == len(data)
    assert sandbox.fs.read(f"{root}/in/up/hello.txt") == data

    with pytest.raises(forkvm.NotFound):
        sandbox.fs.download_archive(f"{root}/none")


def test_archive_upload_from_a_file(client: forkvm.Client, sandbox: Sandbox, root: str, tmp_path) -> None:
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as t:
        data = b"on disk\n"
        info = tarfile.TarInfo("f")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    assert client.upload_archive(sandbox.id, root, str(path)).bytes == len(data)
    assert client.download_archive(sandbox.id, f"{root}/f")[:512].startswith(root.lstrip("/").encode() + b"/f")


@pytest.mark.asyncio
async def test_async_fs(daemon, sandbox: Sandbox, root: str) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        sb = await AsyncSandbox.get(sandbox.id, client=api)
        assert not (await sb.fs.mkdir(root)).existed
        async with sb.fs.watch(root) as changes:
            await sb.fs.write(f"{root}/f", "x")
            async for change in changes:
                if change.name == "f":
                    break
        assert await sb.fs.exists(f"{root}/f")
        assert [e.name for e in await sb.fs.list(root, depth=2)] == ["f"]
        assert (await sb.fs.move(f"{root}/f", f"{root}/g")).name == "g"
        assert (await sb.fs.stat(f"{root}/g")).size == 1
        tar = await sb.fs.download_archive(f"{root}/g")
        assert (await sb.fs.upload_archive(f"{root}/up", tar)).bytes == 1
        await sb.fs.remove(f"{root}/g")
        assert not await api.file_exists(sb.id, f"{root}/g")
