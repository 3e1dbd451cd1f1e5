"""Background processes and directory watches: the events of their streams.

An attach (``GET .../processes/{process}/output``), and a start with
``stream``, answer ``application/x-ndjson``, one event per line::

    {"type": "start", "pid": 812}
    {"type": "stdout", "data": "<base64>"}
    {"type": "stderr", "data": "<base64>", "lost": 4096}
    {"type": "keepalive"}
    {"type": "end", "exit_code": -1, "exited": false, "signal": 2, "status": "signal: interrupt"}

:class:`~forkvm.ProcessStream` (and :class:`~forkvm.AsyncProcessStream`)
iterate over :class:`ProcessStart`, :class:`ProcessOutput` and
:class:`ProcessEnd`: ``data`` is decoded to bytes, keepalives are skipped,
and an ``error`` line is raised as its :class:`~forkvm.ForkvmError`.

A watch (``GET .../fs/watch``) answers ``start`` once it is in place, then
batches of changes; :class:`~forkvm.WatchStream` yields each
:class:`~forkvm.models.FsEvent` (``name``, ``op``) and counts the
``dropped`` ones.
"""

from __future__ import annotations

import base64
import binascii
import json
import signal as _signal
from dataclasses import dataclass
from typing import List, Optional, Union

from . import models
from .errors import ProtocolError, error_from_detail

__all__ = [
    "ProcessStart",
    "ProcessOutput",
    "ProcessEnd",
    "ProcessStreamEvent",
    "SignalSpec",
    "parse_process_event",
    "parse_watch_event",
    "signal_number",
]


@dataclass(frozen=True)
class ProcessStart:
    """The first event: the stream follows process ``pid``."""

    pid: int

    @property
    def type(self) -> str:
        return "start"


@dataclass(frozen=True)
class ProcessOutput:
    """A chunk of output: ``stream`` is ``"stdout"``, ``"stderr"`` or ``"pty"``.

    ``lost`` bytes were dropped just before it (older than the kept 1 MiB,
    or produced faster than the client read them).
    """

    stream: str
    data: bytes
    lost: int = 0

    @property
    def type(self) -> str:
        return self.stream

    @property
    def text(self) -> str:
        """The chunk as text (a multi-byte character may be split between chunks)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ProcessEnd:
    """The last event: how the process ended.

    ``exit_code`` is -1 when a signal killed it (then ``exited`` is false
    and ``signal`` says which); ``status`` reads like ``exit status 3`` or
    ``signal: killed``; ``error`` says why the sandbox lost track of it, if
    it did.
    """

    exit_code: int
    exited: bool
    status: str
    signal: Optional[int] = None
    error: Optional[str] = None

    @property
    def type(self) -> str:
        return "end"

    @property
    def ok(self) -> bool:
        """It exited by itself with status 0."""
        return self.exited and self.exit_code == 0


ProcessStreamEvent = Union[ProcessStart, ProcessOutput, ProcessEnd]

#: A signal: its number (``15``), its name (``"TERM"``, ``"SIGTERM"``,
#: case-insensitive) or a :class:`signal.Signals`.
SignalSpec = Union[int, str, _signal.Signals]


def signal_number(sig: SignalSpec) -> int:
    """The number of a :data:`SignalSpec` (``"INT"`` -> 2)."""
    if isinstance(sig, _signal.Signals):
        return int(sig.value)
    if isinstance(sig, bool):
        raise TypeError(f"not a signal: {sig!r}")
    if isinstance(sig, int):
        return sig
    if isinstance(sig, str):
        name = sig.strip().upper()
        if name.isdigit():
            return int(name)
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            return int(_signal.Signals[name].value)
        except KeyError:
            raise ValueError(f"unknown signal {sig!r}: give a number or a name such as 'TERM' or 'SIGINT'") from None
    raise TypeError(f"a signal is a number or a name such as 'TERM', not {sig!r}")


def _loads(line: Union[str, bytes], what: str) -> Optional[dict]:
    if isinstance(line, bytes):
        line = line.decode("utf-8")
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"bad {what} stream line {line[:200]!r}", code="bad_response") from e
    if not isinstance(data, dict):
        raise ProtocolError(f"bad {what} stream line {line[:200]!r}", code="bad_response")
    return data


def _raise_error(detail: object, what: str) -> None:
    if isinstance(detail, dict):
        code, message = str(detail.get("code", "error")), str(detail.get("message", f"the {what} stream failed"))
    elif isinstance(detail, models.ErrorDetail):
        code, message = detail.code, detail.message
    else:
        code, message = "error", f"the {what} stream failed"
    raise error_from_detail(code, message)


def parse_process_event(line: Union[str, bytes]) -> Optional[ProcessStreamEvent]:
    """Parse one line of a process stream; ``None`` for blank lines, keepalives and unknown types.

    An ``error`` line is raised as a :class:`~forkvm.ForkvmError`.
    """
    data = _loads(line, "process")
    if data is None:
        return None
    try:
        event = models.ProcessEvent.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"bad process stream event {data!r:.200}", code="bad_response") from e
    if event.type in ("stdout", "stderr", "pty"):
        try:
            chunk = base64.b64decode(event.data or "", validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"bad base64 in a process stream {event.type} event", code="bad_response") from e
        return ProcessOutput(event.type, chunk, event.lost or 0)
    if event.type == "start":
        return ProcessStart(int(event.pid or 0))
    if event.type == "end":
        return ProcessEnd(
            exit_code=event.exit_code if event.exit_code is not None else -1,
            exited=bool(event.exited),
            status=event.status or "",
            signal=event.signal,
            error=event.error if isinstance(event.error, str) else None,
        )
    if event.type == "error":
        _raise_error(event.error, "process")
    return None


def parse_watch_event(line: Union[str, bytes]) -> Optional[models.WatchEvent]:
    """Parse one line of a watch stream; ``None`` for blank lines and keepalives.

    An ``error`` line (the directory went away, the guest stopped) is raised
    as a :class:`~forkvm.ForkvmError`.
    """
    data = _loads(line, "watch")
    if data is None:
        return None
    try:
        event = models.WatchEvent.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"bad watch stream event {data!r:.200}", code="bad_response") from e
    if event.type == "error":
        _raise_error(event.error, "watch")
    if event.type in ("start", "events"):
        return event
    return None


def watch_changes(event: models.WatchEvent) -> List[models.FsEvent]:
    """The changes of an ``events`` line (none for ``start``)."""
    return list(event.events or [])
