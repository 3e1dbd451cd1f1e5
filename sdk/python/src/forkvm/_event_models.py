"""Typed models of the daemon's event stream (``GET /v1/events``,
docs/events.md), re-exported by :mod:`forkvm.models` (see there for how
models convert from and to JSON), and :func:`parse_event`, which turns one
Server-Sent Events message of the stream into them.

The stream opens with ``ready`` (:class:`EventsReady`: the seq of the last
event before it); every other message is an :class:`Event`, numbered by
``seq``, carrying the object that changed whole, as ``GET`` of it returns
it. ``reset`` says events were lost: re-read the lists.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import List, Optional, Union

from ._image_models import Image
from ._sse import SseMessage
from .errors import ProtocolError
from .models import Model, Sandbox, Snapshot, _StrEnum

# The models (re-exported by forkvm.models); parse_event is imported by name.
__all__ = ["BranchEvent", "Event", "EventKind", "EventsReady", "PoolEvent"]


class EventKind(_StrEnum):
    """The kinds of :class:`Event` (its ``kind``, the SSE ``event:`` field).

    ``kind`` itself is a plain string, so that a kind a later daemon adds
    reaches the caller rather than failing the stream; compare it with
    these (``event.kind == EventKind.BRANCH``).
    """

    SANDBOX_CREATED = "sandbox.created"
    SANDBOX_UPDATED = "sandbox.updated"
    SANDBOX_DELETED = "sandbox.deleted"
    SNAPSHOT_CREATED = "snapshot.created"
    SNAPSHOT_UPDATED = "snapshot.updated"
    SNAPSHOT_DELETED = "snapshot.deleted"
    BRANCH = "branch"
    POOL = "pool"
    IMAGE_CREATED = "image.created"
    IMAGE_DELETED = "image.deleted"
    #: Not a change: the stream lost events (the client reconnected after
    #: more than the daemon keeps, or read too slowly). Re-read the lists.
    RESET = "reset"


@dataclass
class BranchEvent(Model):
    """A completed branch (``kind == "branch"``): its source, branch point and children."""

    source: str
    #: The branch point's snapshot id.
    snapshot: str
    #: ``live``, ``diff`` or ``full``.
    mode: str
    children: List[str]
    #: How long the source was paused.
    pause_ms: float
    #: From the request until every child ran.
    total_ms: float


@dataclass
class PoolEvent(Model):
    """A warm pool's size or fill changed (``kind == "pool"``)."""

    snapshot: str
    #: QEMUs the pool keeps waiting.
    size: int
    #: QEMUs waiting now.
    ready: int


@dataclass
class EventsReady(Model):
    """The data of the stream's first message, ``ready``: the seq of the last
    event before the stream opened (list what you need after it)."""

    seq: int


@dataclass
class Event(Model):
    """One change. ``id`` is the sandbox or snapshot id or the image name
    (for ``branch``, the source sandbox; for ``pool``, the snapshot); the
    object that changed is in ``sandbox``, ``snapshot`` or ``image``, absent on
    ``*.deleted``. A ``reset`` is an Event too (see :attr:`is_reset`)."""

    #: One more than the event before (from 1 at daemon start).
    seq: int
    #: When the daemon saw the change (Unix time, ms).
    at_unix_ms: int
    #: One of :class:`EventKind` (or a kind newer than this SDK).
    kind: str
    id: str
    sandbox: Optional[Sandbox] = None
    snapshot: Optional[Snapshot] = None
    image: Optional[Image] = None
    branch: Optional[BranchEvent] = None
    pool: Optional[PoolEvent] = None

    @property
    def is_reset(self) -> bool:
        """The stream lost events before this point: re-read the lists (``GET
        /v1/sandboxes``...) and go on applying the events that follow.

        A reset is yielded in line with the changes, as an Event whose
        ``kind`` is ``reset``, ``seq`` what the daemon gave (0 when the reader
        fell behind), ``at_unix_ms`` the client's clock and ``id`` empty, so
        that one ``for`` loop sees it where it happened.
        """
        return self.kind == EventKind.RESET


def parse_event(message: SseMessage) -> Union[EventsReady, Event]:
    """The model of one message of the stream: :class:`EventsReady` for
    ``ready``, an :class:`Event` for ``reset`` and for every change.

    Raises :class:`~forkvm.ProtocolError` for data that is not the JSON the
    message's kind calls for.
    """
    try:
        data = json.loads(message.data)
    except ValueError as e:
        raise ProtocolError(
            f"bad data in the event stream ({message.event}): {message.data[:200]!r}", code="bad_response"
        ) from e
    try:
        if message.event == "ready":
            return EventsReady.from_dict(data)
        if message.event == EventKind.RESET:
            seq = EventsReady.from_dict(data).seq
            return Event(seq=seq, at_unix_ms=int(time.time() * 1000), kind=EventKind.RESET.value, id="")
        return Event.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"unexpected {message.event} message in the event stream: {e}", code="bad_response") from e
