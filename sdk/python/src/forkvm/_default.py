"""The clients objects use when they are given none: one process-wide
:class:`~forkvm.Client`, and one :class:`~forkvm.AsyncClient` per event loop
(an httpx async client belongs to the loop it was made in). Hand-written:
this is where the two flavours genuinely differ."""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from typing import TYPE_CHECKING, Dict, Optional, Tuple

if TYPE_CHECKING:
    from .async_client import AsyncClient
    from .client import Client

_default: Optional["Client"] = None
_default_lock = threading.Lock()
_async_defaults: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]" = weakref.WeakKeyDictionary()
# Clients of unpickled handles, by (url, token): one per process (per event loop for asyncio).
_by_endpoint: Dict[Tuple[str, Optional[str]], "Client"] = {}
_async_by_endpoint: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[Tuple[str, Optional[str]], AsyncClient]]" = (
    weakref.WeakKeyDictionary()
)


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


def client_for(url: str, token: Optional[str]) -> "Client":
    """The process's :class:`~forkvm.Client` for ``url`` and ``token`` (used by unpickled handles)."""
    from .client import Client

    with _default_lock:
        client = _by_endpoint.get((url, token))
        if client is None or client.is_closed:
            client = _by_endpoint[(url, token)] = Client(url, token)
        return client


def async_client_for(url: str, token: Optional[str]) -> "AsyncClient":
    """This event loop's :class:`~forkvm.AsyncClient` for ``url`` and ``token`` (used by unpickled handles)."""
    from .async_client import AsyncClient

    clients = _async_by_endpoint.setdefault(asyncio.get_running_loop(), {})
    client = clients.get((url, token))
    if client is None or client.is_closed:
        client = clients[(url, token)] = AsyncClient(url, token)
    return client


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()
    for client in _by_endpoint.values():
        client.close()
