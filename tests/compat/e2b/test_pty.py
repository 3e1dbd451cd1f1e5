"""PTYs through the unmodified ``e2b`` SDK: a terminal is created, its
output arrives, input is typed into it, it is resized and killed."""

from __future__ import annotations

import threading
import time

import pytest
from e2b import CommandExitException, PtySize


class _Screen:
    """What a PTY printed, collected by a thread following its handle."""

    def __init__(self, handle):
        self.data = bytearray()
        self.error: BaseException | None = None
        self.result = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, args=(handle,), daemon=True)
        self._thread.start()

    def _on_pty(self, chunk: bytes) -> None:
        with self._lock:
            self.data.extend(chunk)

    def _follow(self, handle) -> None:
        try:
            self.result = handle.wait(on_pty=self._on_pty)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def text(self) -> str:
        with self._lock:
            return self.data.decode(errors="replace")

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert time.monotonic() < deadline, f"{needle!r} never appeared in {self.text()!r}"
            time.sleep(0.1)

    def join(self, timeout: float = 60) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the PTY did not end"


def test_pty_output_input_resize_and_exit(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    screen = _Screen(h)
    sandbox.pty.send_stdin(h.pid, b"stty size; echo MARK$((40+2))\n")
    screen.wait_for("MARK42")
    assert "24 80" in screen.text()

    sandbox.pty.resize(h.pid, PtySize(rows=40, cols=120))
    # The terminal echoes what is typed: wait for what only the shell's
    # arithmetic prints.
    sandbox.pty.send_stdin(h.pid, b"stty size; echo RESIZED$((1+1))\n")
    screen.wait_for("RESIZED2")
    assert "40 120" in screen.text()

    sandbox.pty.send_stdin(h.pid, b"exit 0\n")
    screen.join()
    assert screen.error is None
    assert screen.result.exit_code == 0


def test_pty_kill(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    screen = _Screen(h)
    sandbox.pty.send_stdin(h.pid, b"echo READY$((2+2))\n")
    screen.wait_for("READY4")
    assert sandbox.pty.kill(h.pid) is True
    screen.join()
    assert isinstance(screen.error, CommandExitException)
    assert sandbox.pty.kill(h.pid) is False
