"""Files through the unmodified ``e2b`` SDK: envd's ``/files`` and its
``filesystem.Filesystem`` service as forkvm serves them."""

from __future__ import annotations

import time
import uuid

import pytest
from e2b import FileNotFoundException, FileType, FilesystemEventType
from e2b.sandbox.filesystem.filesystem import WriteEntry


@pytest.fixture
def d(sandbox) -> str:
    """A fresh directory for one test."""
    path = f"/tmp/files-{uuid.uuid4().hex[:8]}"
    assert sandbox.files.make_dir(path) is True
    return path


def test_write_and_read_text_and_bytes(sandbox, d):
    info = sandbox.files.write(f"{d}/a/b/hello.txt", "hello\nworld\n")
    assert (info.name, info.path, info.type) == ("hello.txt", f"{d}/a/b/hello.txt", FileType.FILE)
    assert sandbox.files.read(f"{d}/a/b/hello.txt") == "hello\nworld\n"

    blob = bytes(range(256)) * 3
    sandbox.files.write(f"{d}/blob.bin", blob)
    assert sandbox.files.read(f"{d}/blob.bin", format="bytes") == bytearray(blob)

    # The octet-stream upload (envd 0.5.7), plain and gzipped.
    sandbox.files.write(f"{d}/raw.bin", b"raw bytes", use_octet_stream=True)
    assert sandbox.files.read(f"{d}/raw.bin", format="bytes") == bytearray(b"raw bytes")
    sandbox.files.write(f"{d}/gz.txt", "squeezed " * 100, gzip=True)
    assert sandbox.files.read(f"{d}/gz.txt") == "squeezed " * 100


def test_files_belong_to_the_user(sandbox):
    # A relative path is under the user's home, and the file is theirs.
    name = f"rel-{uuid.uuid4().hex[:8]}.txt"
    info = sandbox.files.write(name, "mine")
    assert info.path == f"/home/user/{name}"
    assert sandbox.files.get_info(name).owner == "user"
    root_file = f"/tmp/root-{uuid.uuid4().hex[:8]}"
    sandbox.files.write(root_file, "x", user="root")
    assert sandbox.files.get_info(root_file).owner == "root"


def test_write_multiple_files(sandbox, d):
    infos = sandbox.files.write_files(
        [
            WriteEntry(path=f"{d}/one.txt", data="1"),
            WriteEntry(path=f"{d}/sub/two.bin", data=b"\x00\x02"),
        ]
    )
    assert [i.path for i in infos] == [f"{d}/one.txt", f"{d}/sub/two.bin"]
    assert sandbox.files.read(f"{d}/one.txt") == "1"
    assert sandbox.files.read(f"{d}/sub/two.bin", format="bytes") == bytearray(b"\x00\x02")


def test_list_exists_and_get_info(sandbox, d):
    sandbox.files.write(f"{d}/f.txt", "12345")
    sandbox.files.make_dir(f"{d}/sub/deeper")
    entries = sandbox.files.list(d)
    assert sorted((e.name, e.type) for e in entries) == [
        ("f.txt", FileType.FILE),
        ("sub", FileType.DIR),
    ]
    deep = sandbox.files.list(d, depth=3)
    assert f"{d}/sub/deeper" in [e.path for e in deep]

    assert sandbox.files.exists(f"{d}/f.txt") is True
    assert sandbox.files.exists(f"{d}/nope") is False

    info = sandbox.files.get_info(f"{d}/f.txt")
    assert (info.name, info.type, info.size, info.path) == ("f.txt", FileType.FILE, 5, f"{d}/f.txt")
    assert info.permissions == "-rw-r--r--"
    assert info.modified_time.year >= 2024
    assert sandbox.files.get_info(d).type == FileType.DIR

    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{d}/nope")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{d}/nope")


def test_rename_remove_and_make_dir(sandbox, d):
    sandbox.files.write(f"{d}/old.txt", "moving")
    moved = sandbox.files.rename(f"{d}/old.txt", f"{d}/new.txt")
    assert (moved.name, moved.path) == ("new.txt", f"{d}/new.txt")
    assert sandbox.files.exists(f"{d}/old.txt") is False
    assert sandbox.files.read(f"{d}/new.txt") == "moving"

    sandbox.files.remove(f"{d}/new.txt")
    assert sandbox.files.exists(f"{d}/new.txt") is False

    assert sandbox.files.make_dir(f"{d}/m/n") is True
    assert sandbox.files.make_dir(f"{d}/m/n") is False
    sandbox.files.remove(f"{d}/m")
    assert sandbox.files.exists(f"{d}/m") is False


def test_watch_dir_sees_a_create_and_a_delete(sandbox, d):
    handle = sandbox.files.watch_dir(d)
    try:
        sandbox.files.write(f"{d}/watched.txt", "x")
        sandbox.files.remove(f"{d}/watched.txt")
        seen: set = set()
        deadline = time.monotonic() + 30
        while not {FilesystemEventType.CREATE, FilesystemEventType.REMOVE} <= seen:
            assert time.monotonic() < deadline, f"only saw {seen}"
            for e in handle.get_new_events():
                if e.name == "watched.txt":
                    seen.add(e.type)
            time.sleep(0.3)
    finally:
        handle.stop()


NEW_DIRS = 12
# Each directory is made and a file written in it at once, in the guest, so
# the write lands before any watcher can have read the directory's creation.
MKDIR_WRITE = "; ".join(f"mkdir {{d}}/n{i} && echo data > {{d}}/n{i}/f.txt" for i in range(NEW_DIRS))


def writes_seen(events) -> set:
    return {e.name for e in events if e.type == FilesystemEventType.WRITE and e.name.endswith("/f.txt")}


def test_recursive_polled_watch_sees_writes_in_new_directories(sandbox, d):
    # The sync SDK polls (CreateWatcher / GetWatcherEvents): the directories
    # appear between two polls.
    handle = sandbox.files.watch_dir(d, recursive=True)
    try:
        sandbox.commands.run(MKDIR_WRITE.format(d=d))
        want = {f"n{i}/f.txt" for i in range(NEW_DIRS)}
        seen: set = set()
        deadline = time.monotonic() + 30
        while not want <= seen:
            assert time.monotonic() < deadline, f"writes missed: {sorted(want - seen)}"
            seen |= writes_seen(handle.get_new_events())
            time.sleep(0.3)
    finally:
        handle.stop()


def test_recursive_streamed_watch_sees_writes_in_new_directories(sandbox, d):
    # The async SDK streams (WatchDir).
    import asyncio

    from e2b import AsyncSandbox

    async def run() -> set:
        sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        events: list = []
        handle = await sbx.files.watch_dir(d, events.append, recursive=True)
        try:
            await sbx.commands.run(MKDIR_WRITE.format(d=d))
            want = {f"n{i}/f.txt" for i in range(NEW_DIRS)}
            deadline = time.monotonic() + 30
            while not want <= writes_seen(events) and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
            return want - writes_seen(events)
        finally:
            await handle.stop()

    missed = asyncio.run(run())
    assert not missed, f"writes missed: {sorted(missed)}"
