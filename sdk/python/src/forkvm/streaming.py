"""Streaming exec: output events as the command produces them.

``POST /v1/sandboxes/{id}/exec`` with ``"stream": true`` answers with
``application/x-ndjson``, one JSON object per line::

    {"type": "stdout", "data": "<base64>"}
    {"type": "stderr", "data": "<base64>"}
    {"type": "exit", "exit_code": 0, "signal": null, "timed_out": false,
     "duration_ms": 12, "stdout_bytes": 6, "stderr_bytes": 0}
    {"type": "error", "error": {"code": "...", "message": "..."}}

:class:`ExecStream` (and :class:`AsyncExecStream`, of which ``_stream.py``
is the generated blocking rewrite) iterate over
:class:`OutputEvent` and :class:`ExitEvent` objects; an ``error`` event is
raised as the matching :class:`~forkvm.ForkvmError`. Event types this SDK
does not know are skipped.

Use them as context managers to release the connection when you stop early::

    with sb.exec_stream("make test") as stream:
        for event in stream:
            if event.type == "stdout":
                print(event.text, end="")
    print(stream.exit.exit_code)
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Union

from . import models
from .errors import ProtocolError, error_from_detail

if TYPE_CHECKING:
    import httpx

__all__ = [
    "OutputEvent",
    "ExitEvent",
    "ExecEvent",
    "ExecStream",
    "AsyncExecStream",
    "parse_event",
]


@dataclass(frozen=True)
class OutputEvent:
    """A chunk of the command's ``stdout`` or ``stderr``."""

    stream: str
    data: bytes

    @property
    def type(self) -> str:
        """``"stdout"`` or ``"stderr"``."""
        return self.stream

    @property
    def text(self) -> str:
        """The chunk as text (a multi-byte character may be split between chunks)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExitEvent:
    """The last event: how the command ended."""

    exit_code: Optional[int]
    duration_ms: int
    timed_out: bool = False
    signal: Optional[int] = None
    stdout_bytes: Optional[int] = None
    stderr_bytes: Optional[int] = None

    @property
    def type(self) -> str:
        return "exit"

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.exit_code == 0

    @property
    def duration(self) -> float:
        """Run time inside the guest, in seconds."""
        return self.duration_ms / 1000.0


ExecEvent = Union[OutputEvent, ExitEvent]

#: A callback for output: receives text, decoded incrementally as UTF-8.
OutputCallback = Callable[[str], Any]


def parse_event(line: Union[str, bytes]) -> Optional[ExecEvent]:
    """Parse one NDJSON line; ``None`` for blank lines and unknown types.

    An ``error`` event is raised as a :class:`~forkvm.ForkvmError`.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8")
    line = line.strip()
    if not line:
        return None
    try:
        event = models.ExecEvent.from_dict(json.loads(line))
    except (ValueError, TypeError) as e:
        raise ProtocolError(f"bad exec stream line {line[:200]!r}", code="bad_response") from e
    if event.type in ("stdout", "stderr"):
        try:
            data = base64.b64decode(event.data or "", validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"bad base64 in exec stream {event.type} event", code="bad_response") from e
        return OutputEvent(event.type, data)
    if event.type == "exit":
        return ExitEvent(
            exit_code=event.exit_code,
            duration_ms=event.duration_ms or 0,
            timed_out=bool(event.timed_out),
            signal=event.signal,
            stdout_bytes=event.stdout_bytes,
            stderr_bytes=event.stderr_bytes,
        )
    if event.type == "error":
        detail = event.error or models.ErrorDetail("error", "the exec stream failed")
        raise error_from_detail(detail.code, detail.message)
    return None


def events_from_result(result: models.ExecResult) -> List[ExecEvent]:
    """The events an (unstreamed) :class:`~forkvm.models.ExecResult` amounts to."""
    events: List[ExecEvent] = []
    if result.raw_stdout:
        events.append(OutputEvent("stdout", result.raw_stdout))
    if result.raw_stderr:
        events.append(OutputEvent("stderr", result.raw_stderr))
    events.append(
        ExitEvent(
            result.exit_code,
            result.duration_ms,
            result.timed_out,
            result.signal,
            result.stdout_bytes,
            result.stderr_bytes,
        )
    )
    return events


class _Collector:
    """Accumulates events into an :class:`~forkvm.models.ExecResult`, feeding callbacks."""

    def __init__(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]) -> None:
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self._chunks: dict = {"stdout": [], "stderr": []}
        self.exit: Optional[ExitEvent] = None

    def feed(self, event: ExecEvent) -> Any:
        """Record ``event``; return what the callback returned (maybe an awaitable)."""
        if isinstance(event, ExitEvent):
            self.exit = event
            return None
        self._chunks[event.stream].append(event.data)
        callback = self._callbacks.get(event.stream)
        if callback is None:
            return None
        text = self._decoders[event.stream].decode(event.data)
        return callback(text) if text else None

    def flush(self) -> List[Any]:
        """Hand the callbacks what their decoders still hold."""
        out = []
        for name, callback in self._callbacks.items():
            tail = self._decoders[name].decode(b"", final=True)
            if callback is not None and tail:
                out.append(callback(tail))
        return out

    def result(self) -> models.ExecResult:
        if self.exit is None:
            raise ProtocolError("the exec stream ended without an exit event", code="bad_response")
        stdout = b"".join(self._chunks["stdout"])
        stderr = b"".join(self._chunks["stderr"])
        return models.ExecResult(
            timed_out=self.exit.timed_out,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            encoding=models.OutputEncoding.UTF8,
            stdout_bytes=self.exit.stdout_bytes if self.exit.stdout_bytes is not None else len(stdout),
            stderr_bytes=self.exit.stderr_bytes if self.exit.stderr_bytes is not None else len(stderr),
            stdout_truncated=False,
            stderr_truncated=False,
            duration_ms=self.exit.duration_ms,
            exit_code=self.exit.exit_code,
            signal=self.exit.signal,
        )


def _is_json(response: "httpx.Response") -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip() == "application/json"


# The stream classes, after what they use (they import this module).
from ._async_stream import AsyncExecStream  # noqa: E402
from ._stream import ExecStream  # noqa: E402
