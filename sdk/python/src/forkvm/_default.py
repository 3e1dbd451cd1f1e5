"""The clients objects use when they are given none: one process-wide
:class:`~forkvm.Client`, and one :class:`~forkvm.AsyncClient` per event loop
(an httpx async client belongs to the loop it was made in). Hand-written:
this is where the two flavours genuinely differ."""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .async_client import AsyncClient
    from .client import Client

_default: Optional["Client"] = None
_default_lock = threading.Lock()
_async_defaults: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]" = weakref.WeakKeyDictionary()


def default_client() -> "Client":
    """The process-wide :class:`~forkvm.Client` used when none is given (from the environment)."""
    from .client import Client

    global _default
    with _default_lock:
        if _default is None or _default.is_closed:
            _default = Client()
        return _default


def default_async_client() -> "AsyncClient":
    """The :class:`~forkvm.AsyncClient` used when none is given: one per event loop."""
    from .async_client import AsyncClient

    loop = asyncio.get_running_loop()
    client = _async_defaults.get(loop)
    if client is None or client.is_closed:
        client = AsyncClient()
        _async_defaults[loop] = client
    return client


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()
