"""The daemon's event stream (``GET /v1/events``, docs/events.md) as typed
events: :class:`AsyncEventStream` here, and its blocking rewrite
``EventStream`` in ``_events.py`` (by ``sdk/python/scripts/unasync.py``).
The framing is :mod:`forkvm._sse`'s, the models :mod:`forkvm._event_models`'s."""

from __future__ import annotations

import typing  # async-only
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Optional

import httpx

from ._event_models import Event, EventsReady, parse_event
from ._sse import SseMessage, SseParser
from .errors import ProtocolError

if TYPE_CHECKING:
    from ._ops import Request

__all__ = ["AsyncEventStream"]


class AsyncEventStream:
    """The daemon's changes, one :class:`~forkvm.models.Event` at a time, in
    the order it saw them.

    :meth:`~forkvm.AsyncClient.events` returns it open: the ``ready`` message
    has come, and :attr:`ready_seq` is the seq of the last event before it.
    List what you need after that, then apply the events (each carries the
    object whole, so one the list already shows does no harm)::

        async with await api.events() as stream:
            sandboxes = {s.id: s for s in (await api.list_sandboxes()).sandboxes}
            async for event in stream:
                if event.is_reset:  # events were lost: list again
                    sandboxes = {s.id: s for s in (await api.list_sandboxes()).sandboxes}
                elif event.kind == "sandbox.deleted":
                    sandboxes.pop(event.id, None)
                elif event.sandbox is not None:
                    sandboxes[event.id] = event.sandbox

    A ``reset`` comes in line, as an Event with ``is_reset`` true, because
    what follows it is still good: only what was before it is in doubt.
    The iteration ends when the daemon closes the stream (it stops); a new
    stream opened with ``last_event_id=stream.last_seq`` gets the events
    missed meanwhile, or a ``reset`` when the daemon no longer has them.
    """

    def __init__(self, client: Any, request: "Request") -> None:
        self._client = client
        self._request = request
        self._response: Optional[httpx.Response] = None
        self._messages: Optional[AsyncIterator[SseMessage]] = None
        self._iterated = False
        #: The seq of the last event before the stream opened (its ``ready`` message).
        self.ready_seq: Optional[int] = None
        #: The seq to resume after (``last_event_id`` of a new stream): that of
        #: the last event yielded, else the one the stream was opened after.
        self.last_seq: Optional[int] = None

    async def __aenter__(self) -> "AsyncEventStream":
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __await__(self) -> typing.Generator[Any, None, "AsyncEventStream"]:  # async-only
        return self.open().__await__()  # async-only

    async def open(self) -> "AsyncEventStream":
        """Send the request and wait for the ``ready`` message (an error such as
        :class:`~forkvm.Unauthorized` is raised here)."""
        if self.ready_seq is not None:
            return self
        if self._response is not None:
            raise RuntimeError("this event stream was closed; open a new one with last_event_id=stream.last_seq")
        self._response = await self._client._open_stream(self._request)
        try:
            kind = self._response.headers.get("content-type", "")
            if not kind.startswith("text/event-stream"):
                raise ProtocolError(f"GET /v1/events answered {kind or 'no content type'}, not text/event-stream",
                                    code="bad_response", status=self._response.status_code)
            self._messages = self._read(self._response)
            async for message in self._messages:
                ready = parse_event(message)
                if not isinstance(ready, EventsReady):
                    what = f"the event stream began with {message.event!r}, not ready"
                    raise ProtocolError(what, code="bad_response")
                self.ready_seq = ready.seq
                resume = self._request.headers.get("Last-Event-ID")
                self.last_seq = int(resume) if resume is not None else ready.seq
                return self
            raise ProtocolError("the event stream ended before its ready message", code="bad_response")
        except BaseException:
            await self.aclose()
            raise

    async def _read(self, response: httpx.Response) -> AsyncIterator[SseMessage]:
        parser = SseParser()
        try:
            async for chunk in response.aiter_bytes():
                for message in parser.feed(chunk):
                    yield message
        except httpx.TransportError as e:
            # Cut off, or silent past the keep-alives (read timeout): the caller
            # reconnects with last_event_id=stream.last_seq.
            raise self._client._transport_error(self._request, e) from e

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        if self._iterated:
            raise RuntimeError("an event stream can be iterated only once")
        self._iterated = True
        await self.open()
        messages = self._messages
        if messages is None:
            return  # closed already
        try:
            async for message in messages:
                event = parse_event(message)
                if isinstance(event, EventsReady):
                    continue  # only ever first, where open() took it
                if not event.is_reset:
                    self.last_seq = event.seq
                yield event
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (the daemon forgets this reader)."""
        messages, self._messages = self._messages, None
        if messages is not None:
            try:
                await messages.aclose()  # type: ignore[attr-defined]
            except (RuntimeError, ValueError):
                # Closed while another task (or thread) reads it: the response's close ends that read.
                pass
        if self._response is not None:
            await self._response.aclose()
