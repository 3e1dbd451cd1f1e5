"""Processes by PID: a PID together with its start time names one process
(a PID alone may have been reused), children that die with their parent,
and stopping by PID with a grace period. Linux only, like forkvm."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

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


def spawn_detached(argv: List[str], env: Dict[str, str], log_path: str) -> int:
    """Start ``argv`` in a session of its own, not as our child (its parent exits at once); its PID.

    Output is appended to ``log_path``. The process outlives us and is not
    killed with our children.
    """
    script = 'log=$1; shift\nexec "$@" </dev/null >>"$log" 2>&1 &\necho $!'
    out = subprocess.run(
        ["/bin/sh", "-c", script, "sh", log_path, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        check=True,
        close_fds=True,
    )
    return int(out.stdout.decode().strip())


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


def group_members(pgid: int) -> List[int]:
    """The live processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def stop_group(pgid: int, grace: float = 10.0) -> List[int]:
    """Stop every process left in group ``pgid`` (one we made with ``start_new_session``): SIGTERM, then SIGKILL.

    A process group's id stays taken while any member lives, so the members
    found are ours. Returns the PIDs that were signalled.
    """
    found = group_members(pgid)
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    if not poll_until(lambda: not group_members(pgid), grace, 0.1):
        for pid in group_members(pgid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        poll_until(lambda: not group_members(pgid), 10.0, 0.1)
    return found


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


def lock_holders(path: str) -> List[int]:
    """The PIDs holding a ``flock`` on ``path``, from ``/proc/locks``.

    A daemon holds ``daemon.lock`` in its home for as long as it runs, so this
    finds the daemon that manages a home even when no record names it.
    """
    try:
        st = os.stat(path)
    except OSError:
        return []
    # /proc/locks names a file as MAJOR:MINOR:INODE, the device numbers in hex.
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; "->" marks a waiter.
                if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
                    continue
                if parts[5] == want and parts[4].isdigit():
                    pids.append(int(parts[4]))
    except OSError:
        return []
    return sorted(set(pids))


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
