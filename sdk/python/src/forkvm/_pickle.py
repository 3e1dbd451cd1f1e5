"""Unpickling of sandbox handles, for both flavours (hand-written).

:class:`~forkvm.Sandbox` and :class:`~forkvm.AsyncSandbox` pickle (their
``__reduce__``) as their daemon's URL and token, their id and the state last
seen, never a connection, so a handle can be passed to another process (a
Ray task). The copy connects on its first request.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, TypeVar

from . import models

T = TypeVar("T")


def restore_sandbox(
    cls: "type[T]", url: str, token: Optional[str], id: str, info: Mapping[str, Any], closed: bool
) -> T:
    """A handle of class ``cls`` for sandbox ``id`` at ``url``; no request is made."""
    sandbox: Any = cls.__new__(cls)
    sandbox._spec = None
    sandbox._client = None
    sandbox._remote = (url, token)
    sandbox._info = models.Sandbox.from_dict(info)
    if sandbox._info.id != id:
        raise ValueError(f"a pickled sandbox handle names {id} but holds the state of {sandbox._info.id}")
    sandbox._closed = closed
    return sandbox
