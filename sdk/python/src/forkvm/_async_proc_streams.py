"""The streams of background processes and directory watches:
:class:`AsyncProcessStream` and :class:`AsyncWatchStream` here, and their
blocking rewrites in ``_proc_streams.py`` (by ``sdk/python/scripts/unasync.py``).
The events are in :mod:`forkvm.processes`."""

from __future__ import annotations

import typing  # async-only
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import models
from .errors import ProtocolError
from .processes import (
    ProcessEnd,
    ProcessOutput,
    ProcessStart,
    ProcessStreamEvent,
    parse_process_event,
    parse_watch_event,
)

if TYPE_CHECKING:
    import httpx

    from ._ops import Request

__all__ = ["AsyncProcessStream", "AsyncWatchStream"]


class _AsyncLineStream:
    """An NDJSON response read line by line; opened on first use, closed at the end."""

    def __init__(self, client: Any, request: "Request") -> None:
        self._client = client
        self._request = request
        self._response: Optional["httpx.Response"] = None
        self._lines: Optional[AsyncIterator[str]] = None
        self._started = False

    async def _open(self) -> AsyncIterator[str]:
        if self._lines is None:
            if self._started:
                raise RuntimeError(f"a {type(self).__name__} can be iterated only once")
            self._started = True
            self._response = await self._client._open_stream(self._request)
            self._lines = self._response.aiter_lines()
        return self._lines

    async def aclose(self) -> None:
        """Close the connection (a process keeps running; a watch stops)."""
        if self._response is not None:
            await self._response.aclose()


class AsyncProcessStream(_AsyncLineStream):
    """The events of a background process: what it printed so far (an attach replays
    the kept output), then live output, then its :class:`~forkvm.ProcessEnd`.

    ::

        async with sb.processes.attach("web") as stream:
            async for event in stream:
                if event.type == "stdout":
                    print(event.text, end="")
        print(stream.end.status)

    :attr:`pid` is set by the first event, :attr:`end` by the last;
    :attr:`stdout`, :attr:`stderr` and :attr:`pty` hold the bytes seen so far.
    """

    def __init__(self, client: Any, request: "Request") -> None:
        super().__init__(client, request)
        self.pid: Optional[int] = None
        self.end: Optional[ProcessEnd] = None
        self._output: Dict[str, List[bytes]] = {"stdout": [], "stderr": [], "pty": []}
        #: Bytes the daemon dropped (older than its 1 MiB, or produced faster than read).
        self.lost = 0

    async def __aenter__(self) -> "AsyncProcessStream":
        return await self.open()

    async def open(self) -> "AsyncProcessStream":
        """Send the request now (an error such as :class:`~forkvm.NotFound` is raised here)."""
        await self._open()
        return self

    def __await__(self) -> typing.Generator[Any, None, "AsyncProcessStream"]:  # async-only
        return self.open().__await__()  # async-only

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def stdout(self) -> bytes:
        return b"".join(self._output["stdout"])

    @property
    def stderr(self) -> bytes:
        return b"".join(self._output["stderr"])

    @property
    def pty(self) -> bytes:
        """What the terminal showed (a process with a PTY)."""
        return b"".join(self._output["pty"])

    def __aiter__(self) -> AsyncIterator[ProcessStreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessStreamEvent]:
        lines = await self._open()
        try:
            async for line in lines:
                event = parse_process_event(line)
                if event is None:
                    continue
                if isinstance(event, ProcessStart):
                    self.pid = event.pid
                elif isinstance(event, ProcessOutput):
                    self._output[event.stream].append(event.data)
                    self.lost += event.lost
                yield event
                if isinstance(event, ProcessEnd):
                    self.end = event
                    return
        finally:
            await self.aclose()

    async def wait(self) -> ProcessEnd:
        """Read to the end; return how the process ended (its output is in :attr:`stdout`...)."""
        async for _ in self:
            pass
        if self.end is None:
            raise ProtocolError("the process stream ended before the process did", code="bad_response")
        return self.end


class AsyncWatchStream(_AsyncLineStream):
    """The changes in a watched directory, one :class:`~forkvm.models.FsEvent` at a time.

    Entering it (``async with``) returns once the watch is in place, so
    that nothing done afterwards is missed; it runs until closed, or raises
    when the directory goes away. :attr:`dropped` counts the changes the
    guest lost.

    ::

        async with sb.fs.watch("/work", recursive=True) as changes:
            async for change in changes:
                print(change.op, change.name)
    """

    def __init__(self, client: Any, request: "Request") -> None:
        super().__init__(client, request)
        self.dropped = 0
        self._ready = False

    async def __aenter__(self) -> "AsyncWatchStream":
        return await self.open()

    async def open(self) -> "AsyncWatchStream":
        """Send the request and wait until the watch is in place."""
        await self.ready()
        return self

    def __await__(self) -> typing.Generator[Any, None, "AsyncWatchStream"]:  # async-only
        return self.open().__await__()  # async-only

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def ready(self) -> None:
        """Wait until the watch is in place (the stream's ``start`` line)."""
        if self._ready:
            return
        lines = await self._open()
        try:
            async for line in lines:
                event = parse_watch_event(line)
                if event is not None and event.type == "start":
                    self._ready = True
                    return
                if event is not None:
                    raise ProtocolError(f"the watch stream began with {event.type!r}, not start", code="bad_response")
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()
        raise ProtocolError("the watch stream ended before the watch was in place", code="bad_response")

    def __aiter__(self) -> AsyncIterator[models.FsEvent]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[models.FsEvent]:
        await self.ready()
        lines = await self._open()
        try:
            async for line in lines:
                event = parse_watch_event(line)
                if event is None or event.type != "events":
                    continue
                self.dropped += event.dropped or 0
                for change in event.events or []:
                    yield change
        finally:
            await self.aclose()
