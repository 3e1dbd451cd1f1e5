"""Typed models of background processes and of the filesystem operations
(``docs/processes.md``). Re-exported by :mod:`forkvm.models` (see there for
how models convert from and to JSON).

A background process outlives the request that started it; it is named by
its pid or its tag. Its output (stdout and stderr, or a PTY's) is kept, the
last 1 MiB, and every attach replays it before following the process live.
The filesystem operations describe entries as ``lstat`` sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .models import ErrorDetail, Model, _StrEnum

__all__ = [
    "ArchiveWritten",
    "CreateWatcher",
    "DirMade",
    "EntryInfo",
    "EntryList",
    "Exists",
    "FileKind",
    "FsEvent",
    "FsOp",
    "MakeDir",
    "MoveFile",
    "Process",
    "ProcessEvent",
    "ProcessList",
    "ProcessStarted",
    "PtySize",
    "SignalProcess",
    "StartProcess",
    "WatchEvent",
    "Watcher",
    "WatcherEvents",
]

# --------------------------------------------------------------------------
# Processes


@dataclass
class PtySize(Model):
    """A terminal size: ``cols`` and ``rows``, each 1-1000."""

    cols: int
    rows: int


@dataclass
class StartProcess(Model):
    """``POST /v1/sandboxes/{id}/processes``: start a background process.

    An empty ``argv`` runs the image's default command. ``tag`` names it
    (1-64 letters, digits, ``.``, ``_``, ``-``, not all digits). ``pty``
    runs it on a terminal of that size; ``stdin`` gives it a pipe to write
    (else ``/dev/null``). ``stream`` makes the start stream its events.
    """

    argv: Optional[List[str]] = None
    env: Optional[Dict[str, str]] = None
    cwd: Optional[str] = None
    user: Optional[str] = None
    tag: Optional[str] = None
    pty: Optional[PtySize] = None
    stdin: Optional[bool] = None
    stream: Optional[bool] = None


@dataclass
class ProcessStarted(Model):
    """The answer to a start: the process's pid, and its tag if it has one."""

    pid: int
    tag: Optional[str] = None


@dataclass
class Process(Model):
    """A running background process."""

    pid: int
    argv: List[str]
    tag: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    #: Its PTY's size, if it has one.
    pty: Optional[PtySize] = None


@dataclass
class ProcessList(Model):
    """``GET /v1/sandboxes/{id}/processes``: the running processes."""

    processes: List[Process]


@dataclass
class SignalProcess(Model):
    """``POST .../processes/{process}/signal``: a signal number (1-64), sent to the process's group."""

    signal: int


@dataclass
class ProcessEvent(Model):
    """One line of a process stream (an attach, or a start with ``stream``).

    A union tagged by ``type``: ``start`` (``pid``); ``stdout``, ``stderr``
    and ``pty`` (base64 ``data``, and the bytes ``lost`` just before it);
    ``keepalive``; ``end`` (``exit_code``, ``exited``, ``signal``,
    ``status``, ``error``); ``error`` (an :class:`ErrorDetail`).
    :mod:`forkvm.processes` turns these into :class:`~forkvm.ProcessStart`,
    :class:`~forkvm.ProcessOutput` and :class:`~forkvm.ProcessEnd`.
    """

    type: str
    pid: Optional[int] = None
    data: Optional[str] = None
    lost: Optional[int] = None
    exit_code: Optional[int] = None
    exited: Optional[bool] = None
    signal: Optional[int] = None
    status: Optional[str] = None
    #: An ``end``'s reason (a string), or an ``error``'s detail (an object).
    error: Optional[object] = None


# --------------------------------------------------------------------------
# Filesystem


class FileKind(_StrEnum):
    """What an entry is (as ``lstat`` sees it: a symlink is never followed)."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"


class FsOp(_StrEnum):
    """What happened to a watched entry (a move within the watched tree is
    ``rename`` for the old name and ``create`` for the new)."""

    CREATE = "create"
    WRITE = "write"
    REMOVE = "remove"
    RENAME = "rename"
    CHMOD = "chmod"


@dataclass
class EntryInfo(Model):
    """A filesystem entry, as ``lstat`` describes it.

    ``mode`` has the permission bits with setuid, setgid and sticky;
    ``permissions`` is what ``ls -l`` shows (``-rw-r--r--``); ``owner``
    and ``group`` are names, else ids; ``modified_ns`` is nanoseconds since
    the epoch.
    """

    name: str
    kind: FileKind
    path: str
    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    modified_ns: int
    symlink_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.kind == FileKind.DIR

    @property
    def is_file(self) -> bool:
        return self.kind == FileKind.FILE

    @property
    def is_symlink(self) -> bool:
        return self.kind == FileKind.SYMLINK


@dataclass
class EntryList(Model):
    """``GET /v1/sandboxes/{id}/fs/list``."""

    entries: List[EntryInfo]


@dataclass
class Exists(Model):
    """``GET /v1/sandboxes/{id}/fs/exists`` (a dangling symlink exists)."""

    exists: bool


@dataclass
class MakeDir(Model):
    """``POST /v1/sandboxes/{id}/fs/mkdir``: ``mkdir -p``."""

    path: str


@dataclass
class DirMade(Model):
    """The answer to a mkdir: the directory, and whether it ``existed`` already."""

    entry: EntryInfo
    existed: bool


@dataclass
class MoveFile(Model):
    """``POST /v1/sandboxes/{id}/fs/move``: rename(2)."""

    source: str
    destination: str


@dataclass
class FsEvent(Model):
    """One change in a watched directory: ``name`` relative to it, and ``op``."""

    name: str
    op: FsOp


@dataclass
class WatchEvent(Model):
    """One line of a watch stream: ``start`` (the watch is in place),
    ``events`` (with ``dropped``), ``keepalive`` or ``error``."""

    type: str
    events: Optional[List[FsEvent]] = None
    dropped: Optional[int] = None
    error: Optional[ErrorDetail] = None


@dataclass
class CreateWatcher(Model):
    """``POST /v1/sandboxes/{id}/fs/watchers``: a watcher to poll."""

    path: str
    recursive: Optional[bool] = None


@dataclass
class Watcher(Model):
    """A polled watcher."""

    watcher_id: str


@dataclass
class WatcherEvents(Model):
    """The changes since the last poll; ``dropped`` were lost (at most 4096 are kept)."""

    events: List[FsEvent]
    dropped: int


@dataclass
class ArchiveWritten(Model):
    """``PUT /v1/sandboxes/{id}/archive``: the entries and file bytes written."""

    entries: int
    bytes: int
