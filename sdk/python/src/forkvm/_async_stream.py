"""The events of one streamed exec: :class:`AsyncExecStream` here, and
:class:`~forkvm.ExecStream` in ``_stream.py``, its blocking rewrite by
``sdk/python/scripts/unasync.py``. The protocol and the events are in
:mod:`forkvm.streaming`."""

from __future__ import annotations

import inspect  # async-only
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from . import models
from .streaming import ExecEvent, ExitEvent, OutputCallback, _Collector, _is_json, events_from_result, parse_event

if TYPE_CHECKING:
    import httpx

    from ._ops import Request
    from .async_client import AsyncClient

__all__ = ["AsyncExecStream"]


async def _settle(outcome: Any) -> None:
    """What a callback returned: awaited when it is awaitable (asyncio callbacks), else dropped."""
    if inspect.isawaitable(outcome):  # async-only
        await outcome  # async-only


class AsyncExecStream:
    """The events of one streamed command (see :mod:`forkvm.streaming`).

    The request is sent when iteration starts (or on ``async with``). After
    the iteration, :attr:`exit` holds the :class:`~forkvm.ExitEvent`.
    """

    def __init__(self, client: "AsyncClient", request: "Request") -> None:
        self._client = client
        self._request = request
        self._response: Optional["httpx.Response"] = None
        self._started = False
        self.exit: Optional[ExitEvent] = None

    async def __aenter__(self) -> "AsyncExecStream":
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _open(self) -> "httpx.Response":
        if self._response is None:
            if self._started:
                raise RuntimeError("an AsyncExecStream can be iterated only once")
            self._started = True
            self._response = await self._client._open_stream(self._request)
        return self._response

    async def aclose(self) -> None:
        """Close the connection (the command is not killed by this)."""
        if self._response is not None:
            await self._response.aclose()

    def __aiter__(self) -> AsyncIterator[ExecEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ExecEvent]:
        response = await self._open()
        try:
            if _is_json(response):  # a daemon that answered with one result
                await response.aread()
                for event in events_from_result(self._client._parse_stream_fallback(response)):
                    if isinstance(event, ExitEvent):
                        self.exit = event
                    yield event
                return
            async for line in response.aiter_lines():
                parsed = parse_event(line)
                if parsed is None:
                    continue
                if isinstance(parsed, ExitEvent):
                    self.exit = parsed
                yield parsed
        finally:
            await self.aclose()

    async def collect(
        self, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None
    ) -> models.ExecResult:
        """Run to the end, calling the callbacks with text as it arrives (in the asyncio
        flavour they may be coroutine functions); return the whole result."""
        collector = _Collector(on_stdout, on_stderr)
        async for event in self:
            await _settle(collector.feed(event))
        for outcome in collector.flush():
            await _settle(outcome)
        return collector.result()
