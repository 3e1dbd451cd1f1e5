"""Processes by PID: a PID together with its start time names one process
(a PID alone may have been reused), children that die with their parent,
and stopping by PID with a grace period. Linux only, like forkvm."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time
from typing import Any, Callable, Dict, Optional

_PR_SET_PDEATHSIG = 1


def start_time(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None  # a zombie has exited
    return int(fields[19])


def is_running(pid: int, started: Optional[int]) -> bool:
    """The process ``pid`` that started at ``started`` still runs (with ``started=None``: any process ``pid``)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGKILL when the thread that forked it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def stop(pid: int, started: Optional[int], grace: float = 10.0, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to that one process, then SIGKILL after ``grace`` seconds. True if it was running."""
    if not is_running(pid, started):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    _reap(pid)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_running(pid, started):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    wait_gone(pid, started, 10.0)
    return True


def wait_gone(pid: int, started: Optional[int], timeout: float) -> bool:
    """Wait until the process is gone; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_running(pid, started):
            return True
        time.sleep(0.1)
    return False


def _reap(pid: int) -> None:
    # Our own child would stay a zombie (and "running" by PID) until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def record(pid: int) -> Dict[str, Any]:
    """``{"pid", "started"}`` for a state file."""
    return {"pid": pid, "started": start_time(pid)}


def read_record(path: str) -> Optional[Dict[str, Any]]:
    """A record written by :func:`write_record`, None if absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data.get("pid"), int) else None
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def write_record(path: str, rec: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def poll_until(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Call ``check`` until it is true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
