"""A server that answers before it has read the request body, and closes.

The client must raise that answer (its status and error body), not the
broken pipe its writes of the rest of the body then get. httpcore does this
already (it reads the response after a failed write); these tests keep it so,
with a real server on a unix socket playing the daemon."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest

import forkvm
from forkvm import AsyncClient, Client

MIB = 1 << 20


def _answer_early(listener: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        except OSError:
            return
        conn.settimeout(None)
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    break
                head += data
            status, code = (413, "payload_too_large") if b"/files" in head.split(b"\r\n", 1)[0] else (409, "conflict")
            body = json.dumps({"error": {"code": code, "message": f"answered early with {status}"}}).encode()
            conn.sendall(
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n".encode()
                + body
            )
            # Closed with the body unread (most of it never sent).


@pytest.fixture
def early(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "early.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(0.1)  # so that the thread sees `stop`
    stop = threading.Event()
    thread = threading.Thread(target=_answer_early, args=(listener, stop), daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        stop.set()
        listener.close()
        thread.join(5)


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "rootfs.tar"
    path.write_bytes(bytes(48 * MIB))
    return path


def test_an_upload_answered_early_raises_the_answer(early: str, archive: Path) -> None:
    with Client(early) as c:
        for _ in range(5):
            with pytest.raises(forkvm.Conflict) as exc:
                c.import_image(archive, name="x")
            assert exc.value.status == 409 and exc.value.message == "answered early with 409"
        with pytest.raises(forkvm.PayloadTooLarge):
            c.write_file("sb-1", "/tmp/f", bytes(32 * MIB))


@pytest.mark.asyncio
async def test_an_async_upload_answered_early_raises_the_answer(early: str, archive: Path) -> None:
    async with AsyncClient(early) as c:
        for _ in range(5):
            with pytest.raises(forkvm.Conflict):
                await c.import_image(archive, name="x")
        with pytest.raises(forkvm.PayloadTooLarge):
            await c.write_file("sb-1", "/tmp/f", bytes(32 * MIB))
