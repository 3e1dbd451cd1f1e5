"""The client side of snapshot push and pull that both clients share
(written by hand, like ``_images.py``): reading the NDJSON progress stream.

Protocol: ``POST /v1/snapshots/{id}/push`` and ``POST /v1/snapshots/pull``
with ``"stream": true`` answer ``200 application/x-ndjson``, one
:class:`~forkvm.models.TransferEvent` per line::

    {"type": "phase", "phase": "resolving 127.0.0.1:5000/team/warm:v1"}
    {"type": "progress", "item": "chunking sn-.../memory.img", "done": 4194304, "total": 536870912}
    {"type": "cached", "item": "link sn-..."}
    {"type": "log", "line": "..."}
    {"type": "pushed", "result": {...PushResult...}}        (the last line of a push), or
    {"type": "pulled", "result": {...PullResult...}}        (the last line of a pull), or
    {"type": "error", "error": {"code": "...", "message": "..."}}

Errors found before the work starts (a bad reference, a tag taken, no such
snapshot) are ordinary HTTP errors instead. A stream that ends without its
result or an ``error`` is a :class:`~forkvm.ProtocolError`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Type, TypeVar, Union

from . import models
from .errors import ProtocolError, error_from_detail

__all__ = ["TransferEventCallback", "parse_transfer_event", "stream_ended", "transfer_outcome"]

#: Called with each progress event (in the asyncio flavour it may be a coroutine function).
TransferEventCallback = Callable[[models.TransferEvent], Any]

R = TypeVar("R", models.PushResult, models.PullResult)

#: The operation, and the type of the last event when it succeeds, by the type of its result.
_FINAL = {models.PushResult: ("push", "pushed"), models.PullResult: ("pull", "pulled")}


def parse_transfer_event(line: Union[str, bytes]) -> Optional[models.TransferEvent]:
    """One NDJSON line as an event; ``None`` for a blank line.

    Event types this SDK does not know are returned too (their fields in
    ``extra``). Raises :class:`~forkvm.ProtocolError` for a line that is not
    an event object.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise ValueError("not an object with a type")
        return models.TransferEvent.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ProtocolError(f"bad line in a transfer progress stream: {line[:200]!r} ({e})", code="bad_response") from e


def transfer_outcome(event: models.TransferEvent, result_type: Type[R]) -> Optional[R]:
    """The result of the last event of a push or pull, or ``None`` for a progress event.

    ``result_type`` is :class:`~forkvm.models.PushResult` (the stream must
    end with ``pushed``) or :class:`~forkvm.models.PullResult` (``pulled``).
    An ``error`` event is raised as the :class:`~forkvm.ForkvmError`
    subclass of its code (e.g. :class:`~forkvm.ImageNotFound`), with
    ``status`` ``None`` as for an error inside an image stream: the HTTP
    status of the response was 200.
    """
    if event.type == "error":
        detail = event.error or models.ErrorDetail("error", "the transfer failed")
        raise error_from_detail(detail.code, detail.message)
    what, final = _FINAL[result_type]
    if event.type == final:
        if not isinstance(event.result, result_type):
            raise ProtocolError(
                f"a `{final}` line without its {result_type.__name__} in a transfer progress stream",
                code="bad_response",
            )
        return event.result
    if event.type in ("pushed", "pulled"):
        raise ProtocolError(f"a `{event.type}` line in the progress stream of a {what}", code="bad_response")
    return None


def stream_ended(result_type: type) -> ProtocolError:
    """The error for a progress stream that ended before its result or ``error`` line."""
    what, _ = _FINAL[result_type]
    check = "the registry" if what == "push" else "the snapshots"
    return ProtocolError(
        f"the {what} progress stream ended before its result (the connection broke, or the daemon stopped); "
        f"look at {check} to see whether it happened",
        code="bad_response",
    )
