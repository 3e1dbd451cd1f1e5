"""forkvm on Ray: the cluster's supervision and the API for Ray users (docs/cluster.md).

Install with ``pip install forkvm[ray]``. Start a cluster with
``python -m forkvm.ray up --nodes 3`` (a local trial) or, after ``ray start``
on every host, ``python -m forkvm.ray start``. Then, in a driver or inside
any Ray task::

    import forkvm.ray

    sb = forkvm.ray.spawn(memory_mib=512)          # placed by the cluster endpoint
    print(sb.exec("hostname").stdout)

``forkvm.ray.client()`` is a :class:`forkvm.Client` for the cluster
endpoint. :class:`forkvm.Sandbox` handles pickle as (url, token, id), so
they pass between tasks and actors.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

from ..client import Client
from ..sandbox import Sandbox
from ._plan import NAMESPACE, SUPERVISOR, read_json

__all__ = ["client", "spawn", "endpoint", "default_dir"]

#: The cluster directory when none is given: ``$FORKVM_CLUSTER_DIR``, else this.
DEFAULT_DIR = "/var/lib/forkvm-cluster"

_clients: Dict[Tuple[str, str], Client] = {}
_lock = threading.Lock()


def default_dir() -> str:
    """``$FORKVM_CLUSTER_DIR``, else ``/var/lib/forkvm-cluster``."""
    return os.environ.get("FORKVM_CLUSTER_DIR") or DEFAULT_DIR


def endpoint(dir: Optional[str] = None) -> Dict[str, str]:
    """The cluster endpoint ``{"url", "token"}``.

    Inside a Ray job (``ray.is_initialized()``, as in every task and actor)
    it is asked of the ``forkvm-gateway`` actor; elsewhere, or when a
    ``dir`` is given, read from ``DIR/cluster.json``.
    """
    if dir is None:
        try:
            import ray

            if ray.is_initialized():
                actor = ray.get_actor(SUPERVISOR, namespace=NAMESPACE)
                return dict(ray.get(actor.endpoint.remote(), timeout=60))
        except ValueError:
            pass  # no supervisor in this Ray cluster: try the file
    path = os.path.join(dir or default_dir(), "cluster.json")
    data = read_json(path)
    if data is None:
        raise FileNotFoundError(
            f"no forkvm cluster: {path} does not exist and no {SUPERVISOR!r} actor runs in namespace "
            f"{NAMESPACE!r}; start one with `python -m forkvm.ray up --nodes 3` or `python -m forkvm.ray start`"
        )
    return {"url": data["url"], "token": data["token"]}


def client(dir: Optional[str] = None) -> Client:
    """A :class:`forkvm.Client` for the cluster endpoint (one per process and endpoint)."""
    ep = endpoint(dir)
    key = (ep["url"], ep["token"])
    with _lock:
        c = _clients.get(key)
        if c is None or c.is_closed:
            c = _clients[key] = Client(ep["url"], ep["token"])
        return c


def spawn(*args: Any, dir: Optional[str] = None, **kwargs: Any) -> Sandbox:
    """Spawn a sandbox through the cluster endpoint: :class:`forkvm.Sandbox` with ``client=client(dir)``.

    Takes the arguments of :class:`forkvm.Sandbox` (``image``, ``snapshot``,
    ``memory_mib``...). The handle can be returned from the task or passed to others.
    """
    return Sandbox(*args, client=client(dir), **kwargs)
