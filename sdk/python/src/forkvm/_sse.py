"""A Server-Sent Events parser: the bytes of a ``text/event-stream`` in, its
messages out. Pure (no I/O), so that the framing is tested without a daemon
and both clients share it (``GET /v1/events``, docs/events.md).

It follows the parsing rules of the HTML standard rather than the exact
framing forkvm's daemon writes today, so that a proxy in between, or a
later daemon, that frames the same messages differently is read the same:

* a line ends in LF, CRLF or a lone CR, and a chunk may end anywhere: in
  the middle of a line, of a UTF-8 sequence, or between the CR and LF of one
  line end (hence the parser keeps that state between chunks);
* a blank line dispatches the message; a line that starts with ``:`` is a
  comment (the daemon's keep-alive) and is skipped;
* ``field: value`` loses one space after the colon, no more; a line without
  a colon is a field with an empty value;
* ``data`` lines are joined with ``\\n``; ``event`` names the message
  (``message`` when absent); ``id`` sets the last event id, which holds for
  later messages too (the standard's rule, and what a reconnect sends);
  ``retry`` (digits only) is the reconnection delay in ms; any other field
  is ignored;
* a message without ``data`` is not dispatched, and a message the stream
  ends in without its blank line is dropped (it may be cut short).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

__all__ = ["SseMessage", "SseParser"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
_DIGITS = re.compile(r"[0-9]+")
_BOM = "\ufeff"


@dataclass(frozen=True)
class SseMessage:
    """One dispatched message."""

    #: Its ``event:`` field, ``"message"`` when it had none.
    event: str
    #: Its ``data:`` lines joined with ``\\n``.
    data: str
    #: The last event id in effect when it was dispatched (``None`` before any ``id:``).
    id: Optional[str] = None
    #: The last ``retry:`` (ms) seen so far on the stream.
    retry: Optional[int] = None


class SseParser:
    """Feed it chunks of the stream as they arrive; each :meth:`feed` returns
    the messages those bytes completed."""

    def __init__(self) -> None:
        self._partial = b""  # the bytes of a line not yet ended
        self._after_cr = False  # the last chunk ended in CR: a LF first in the next one ends no new line
        self._first_line = True  # a byte order mark may open the stream
        self._event = ""
        self._data: List[str] = []
        #: The last event id the stream set (``id:``), kept across messages.
        self.last_event_id: Optional[str] = None
        #: The reconnection delay the stream asked for (``retry:``), in ms.
        self.retry: Optional[int] = None

    def feed(self, chunk: bytes) -> List[SseMessage]:
        """Parse ``chunk``; return the messages it completed, in order."""
        if not chunk:
            return []  # an empty chunk changes nothing, not even a pending CR
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = False
        buf = self._partial + chunk
        out: List[SseMessage] = []
        start = 0
        for m in _LINE_END.finditer(buf):
            if m.group() == b"\r" and m.end() == len(buf):
                # Maybe the first half of a CRLF split between chunks: the line ends
                # here either way, and a LF opening the next chunk is skipped.
                self._after_cr = True
            message = self._line(buf[start : m.start()])
            if message is not None:
                out.append(message)
            start = m.end()
        self._partial = buf[start:]
        return out

    def _line(self, raw: bytes) -> Optional[SseMessage]:
        # Splitting bytes before decoding is safe: CR and LF never occur inside a UTF-8 sequence.
        line = raw.decode("utf-8", errors="replace")
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: the daemon's keep-alive
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif field == "retry":
            if _DIGITS.fullmatch(value):
                self.retry = int(value)
        return None

    def _dispatch(self) -> Optional[SseMessage]:
        event, data = self._event, self._data
        self._event, self._data = "", []
        if not data:
            return None
        return SseMessage(event=event or "message", data="\n".join(data), id=self.last_event_id, retry=self.retry)
