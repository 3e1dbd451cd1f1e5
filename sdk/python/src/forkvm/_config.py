"""Where the daemon is and how to reach it.

``FORKVM_URL`` names the daemon: ``unix:///path/to.sock``, a bare socket path,
or ``http://host:port`` (``https://`` too). ``FORKVM_TOKEN`` is the bearer
token for TCP. Without ``FORKVM_URL`` the SDK uses the local socket
``$FORKVM_HOME/forkvm.sock``, with ``FORKVM_HOME`` defaulting to
``/var/lib/forkvm``, as the CLI does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional

import httpx

DEFAULT_HOME = "/var/lib/forkvm"

#: Default timeouts: spawns of many sandboxes can take minutes under TCG.
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=10.0)

#: Extra time given to an exec request on top of its own ``timeout_ms``: the
#: daemon waits the timeout plus 15 s for the guest before giving up.
EXEC_GRACE_SECONDS = 30.0

# The Host header sent over a unix socket.
_UDS_BASE_URL = "http://forkvm"


@dataclass(frozen=True)
class Endpoint:
    """A resolved daemon address."""

    base_url: str
    uds: Optional[str] = None
    token: Optional[str] = None

    @property
    def display(self) -> str:
        return f"unix://{self.uds}" if self.uds else self.base_url

    def headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": f"forkvm-python/{_version()}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


def default_socket() -> str:
    """``$FORKVM_HOME/forkvm.sock``."""
    home = os.environ.get("FORKVM_HOME") or DEFAULT_HOME
    return os.path.join(home, "forkvm.sock")


def resolve_endpoint(url: Optional[str] = None, token: Optional[str] = None) -> Endpoint:
    """Resolve ``url`` and ``token``, falling back to the environment."""
    url = url or os.environ.get("FORKVM_URL") or ""
    if token is None:
        token = os.environ.get("FORKVM_TOKEN") or None
    if not url:
        return Endpoint(_UDS_BASE_URL, uds=default_socket(), token=token)
    if url.startswith("unix:"):
        path = url[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ValueError(
                f"FORKVM_URL {url!r}: a unix socket URL needs an absolute path, like unix:///run/forkvm.sock"
            )
        return Endpoint(_UDS_BASE_URL, uds=path, token=token)
    if url.startswith("/"):
        return Endpoint(_UDS_BASE_URL, uds=url, token=token)
    if url.startswith(("http://", "https://")):
        return Endpoint(url.rstrip("/"), token=token)
    raise ValueError(f"FORKVM_URL {url!r} is not unix:///path/to.sock, a socket path or http://host:port")


def _version() -> str:
    from . import __version__

    return __version__
