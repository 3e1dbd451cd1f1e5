"""Snapshots and branches: :class:`AsyncSnapshot` and :class:`AsyncBranch`,
what :meth:`AsyncSandbox.snapshot` and :meth:`AsyncSandbox.branch` return.

::

    snap = await sb.snapshot(tag="warm")        # sb keeps running
    children = await snap.spawn(3)              # three sandboxes from that instant
    branch = await sb.branch(count=2, wait=False)
    await branch.wait()                          # the snapshot written, the children up

Split from ``aio.py`` (which re-exports both names) to keep each module to one
concern and under the project's size limit; the blocking twin, ``_snapshot.py``,
is written by ``sdk/python/scripts/unasync.py``.
"""

from __future__ import annotations

import asyncio  # async-only
import time
from dataclasses import dataclass
from typing import (  # async-only
    TYPE_CHECKING,  # async-only
    Any,  # async-only
    Generator,  # async-only
    Iterable,  # async-only
    List,  # async-only
    Mapping,  # async-only
    Optional,  # async-only
    Sequence,  # async-only
    Type,  # async-only
    Union,  # async-only
)  # async-only
# sync-only: from typing import TYPE_CHECKING, Iterable, List, Mapping, Optional, Sequence, Type, Union

from . import models
from ._ops import EgressSpec, LimitsSpec, PortSpec
from ._transfer import TransferEventCallback
from ._volume_models import VolumeSpec
from .async_client import AsyncClient, default_async_client
from .errors import ClientTimeout, ForkvmError, NotFound

if TYPE_CHECKING:
    from .aio import AsyncSandbox

__all__ = ["AsyncSnapshot", "AsyncBranch"]


def _sandbox_class() -> Type["AsyncSandbox"]:
    # aio imports this module (AsyncSandbox.snapshot and .branch return these
    # classes), so the sandbox class is looked up when first needed, not at import.
    from .aio import AsyncSandbox

    return AsyncSandbox


class AsyncSnapshot:
    """A snapshot: a frozen sandbox (memory, devices, disk) to spawn children from."""

    def __init__(self, ref: str, *, client: Optional[AsyncClient] = None) -> None:
        """The existing snapshot ``ref`` (an id or a tag); the asyncio flavour fetches it when awaited."""
        self._ref = ref
        self._client = client
        self._info: Optional[models.Snapshot] = None
        # sync-only: self._info = self.client.get_snapshot(ref)

    def __await__(self) -> Generator[Any, None, "AsyncSnapshot"]:  # async-only
        return self._fetch().__await__()  # async-only

    async def _fetch(self) -> "AsyncSnapshot":  # async-only
        self._info = await self.client.get_snapshot(self._ref)  # async-only
        return self  # async-only

    @classmethod
    def _wrap(cls, client: AsyncClient, info: models.Snapshot) -> "AsyncSnapshot":
        # Not through __init__, which fetches in the blocking flavour.
        snapshot = cls.__new__(cls)
        snapshot._ref = info.id
        snapshot._client = client
        snapshot._info = info
        return snapshot

    @classmethod
    async def get(cls, ref: str, *, client: Optional[AsyncClient] = None) -> "AsyncSnapshot":
        """The existing snapshot ``ref`` (an id or a tag)."""
        client = client or default_async_client()
        return cls._wrap(client, await client.get_snapshot(ref))

    @classmethod
    async def list(cls, *, client: Optional[AsyncClient] = None) -> List["AsyncSnapshot"]:
        """Every snapshot."""
        client = client or default_async_client()
        return [cls._wrap(client, info) for info in (await client.list_snapshots()).snapshots]

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def tag(self) -> Optional[str]:
        return self.info.tag

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = default_async_client()
        return self._client

    @property
    def info(self) -> models.Snapshot:
        """The snapshot as last seen (see :meth:`refresh`)."""
        if self._info is None:
            raise RuntimeError("the snapshot is not fetched: `await AsyncSnapshot(ref)`")
        return self._info

    async def refresh(self) -> models.Snapshot:
        self._info = await self.client.get_snapshot(self.id)
        return self._info

    def __repr__(self) -> str:
        tag = f" tag={self.tag!r}" if self.tag else ""
        return f"<AsyncSnapshot {self.id}{tag} {self._info.kind} {self._info.state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncSnapshot) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def spawn(
        self,
        count: int = 1,
        *,
        network: Union[models.NetworkMode, str, None] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        egress: Optional[Iterable[EgressSpec]] = None,
        allow_host: Optional[bool] = None,
        wait_for_network: Optional[bool] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[int] = None,
        on_timeout: Union[models.OnTimeout, str, None] = None,
        limits: Optional[LimitsSpec] = None,
        volumes: Optional[Iterable[VolumeSpec]] = None,
    ) -> List[AsyncSandbox]:
        """Spawn ``count`` sandboxes from this snapshot (all or nothing).

        The network, lifetime, ``limits`` and ``volumes`` arguments are those of
        :class:`AsyncSandbox`; with ``count`` above 1, published ports need
        host port 0 (one allocated for each). A snapshot taken with volumes
        gives its clones the same ones (``volumes`` is then refused).
        """
        batch = await self.client.create_sandbox(
            snapshot=self.id,
            count=count,
            network=network,
            ports=ports,
            egress=egress,
            allow_host=allow_host,
            wait_for_network=wait_for_network,
            metadata=metadata,
            env=env,
            timeout=timeout,
            on_timeout=on_timeout,
            limits=limits,
            volumes=volumes,
        )
        assert isinstance(batch, models.SandboxBatch)
        return [_sandbox_class()._wrap(self.client, info) for info in batch.sandboxes]

    async def sandboxes(self) -> List[AsyncSandbox]:
        """The sandboxes spawned from this snapshot that still exist."""
        out = []
        for id in (await self.refresh()).sandboxes:
            try:
                out.append(await _sandbox_class().get(id, client=self.client))
            except NotFound:
                pass
        return out

    async def flatten(self, tag: Optional[str] = None) -> "AsyncSnapshot":
        """Merge this diff snapshot's chain into a new standalone snapshot."""
        return AsyncSnapshot._wrap(self.client, await self.client.flatten_snapshot(self.id, tag=tag))

    async def set_pool(self, size: Optional[int]) -> "AsyncSnapshot":
        """Keep ``size`` QEMU processes waiting for this snapshot (0 turns the pool off,
        ``None`` follows the daemon's default)."""
        self._info = await self.client.set_pool(self.id, size)
        return self

    async def pin(self) -> "AsyncSnapshot":
        """Keep it (and what it builds on) from garbage collection."""
        self._info = await self.client.pin_snapshot(self.id)
        return self

    async def unpin(self) -> "AsyncSnapshot":
        """Let garbage collection take it once nothing needs it."""
        self._info = await self.client.unpin_snapshot(self.id)
        return self

    @property
    def pinned(self) -> bool:
        return self._info.pinned

    @classmethod
    async def prune(
        cls, *, all: bool = False, dry_run: bool = False, client: Optional[AsyncClient] = None
    ) -> models.PruneResult:
        """Remove the branch points nothing needs (see :meth:`forkvm.AsyncClient.prune_snapshots`)."""
        client = client or default_async_client()
        return await client.prune_snapshots(all=all, dry_run=dry_run)

    async def wait(self, timeout: float = 300.0, interval: float = 0.2) -> "AsyncSnapshot":
        """Wait until the snapshot is no longer ``writing`` (after ``branch(wait=False)``).

        Raises :class:`~forkvm.ForkvmError` if it ``failed``.
        """
        deadline = time.monotonic() + timeout
        while (await self.refresh()).state == "writing":
            if time.monotonic() > deadline:
                raise ClientTimeout(f"snapshot {self.id} still writing after {timeout:g} s", code="client_timeout")
            await asyncio.sleep(interval)
        if self._info.state == "failed":
            raise ForkvmError(f"snapshot {self.id} failed: {self._info.failure}", code="snapshot_failed")
        return self

    async def delete(self, force: bool = False) -> None:
        """Remove the snapshot; with ``force``, also what depends on it (else 409)."""
        await self.client.delete_snapshot(self.id, force=force)

    async def push(
        self,
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        insecure: Optional[bool] = None,
        on_event: Optional[TransferEventCallback] = None,
    ) -> models.PushResult:
        """Push it, with its chain and base image, to the OCI registry ``reference``
        (``host[:port]/repo[:tag]``); what the registry has is not sent again.

        ``username``/``password`` log in (default: the daemon host's docker
        config, else anonymous), ``insecure`` allows plain HTTP to a registry
        off loopback, and ``on_event`` sees each progress event (see
        :meth:`forkvm.AsyncClient.push_snapshot`). Pull it anywhere with
        :meth:`AsyncSnapshot.pull`.
        """
        return await self.client.push_snapshot(
            self.id, reference, username=username, password=password, insecure=insecure, on_event=on_event
        )

    @classmethod
    async def pull(
        cls,
        reference: str,
        *,
        tag: Optional[str] = None,
        username: Optional[str] = None,
        password: Optional[str] = None,
        insecure: Optional[bool] = None,
        on_event: Optional[TransferEventCallback] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AsyncSnapshot":
        """Pull the snapshot pushed to ``reference`` (``host[:port]/repo[:tag]`` or
        ``…@sha256:<digest>``) onto the daemon, and return it, ready to :meth:`spawn` from.

        ``tag`` tags it on this daemon; the other arguments are those of
        :meth:`push`. The last event given to ``on_event`` (``pulled``) carries
        the whole :class:`~forkvm.models.PullResult` (what was fetched, what
        was there already); :meth:`forkvm.AsyncClient.pull_snapshot` returns it.
        """
        client = client or default_async_client()
        result = await client.pull_snapshot(
            reference, tag=tag, username=username, password=password, insecure=insecure, on_event=on_event
        )
        return cls._wrap(client, result.snapshot)


@dataclass
class AsyncBranch:
    """What :meth:`AsyncSandbox.branch` returns: the snapshot of the branch point and the children."""

    snapshot: AsyncSnapshot
    children: List[AsyncSandbox]
    result: models.BranchResult
    requested: Optional[int] = None

    @classmethod
    def _from_result(cls, client: AsyncClient, result: models.BranchResult, requested: Optional[int]) -> "AsyncBranch":
        return cls(
            snapshot=AsyncSnapshot._wrap(client, result.snapshot),
            children=[_sandbox_class()._wrap(client, info) for info in result.children],
            result=result,
            requested=requested,
        )

    @property
    def mode(self) -> Union[models.BranchMode, str]:
        return self.result.mode

    @property
    def pause_ms(self) -> float:
        """How long the source's vCPUs were stopped."""
        return self.result.pause_ms

    @property
    def total_ms(self) -> float:
        return self.result.total_ms

    async def wait(self, timeout: float = 300.0, interval: float = 0.2) -> "AsyncBranch":
        """After ``branch(wait=False)``: wait for the snapshot and its children, then fill :attr:`children`."""
        deadline = time.monotonic() + timeout
        await self.snapshot.wait(timeout=timeout, interval=interval)
        want = 1 if self.requested is None else self.requested
        while len(self.snapshot.info.sandboxes) < want:
            if time.monotonic() > deadline:
                raise ClientTimeout(
                    f"{len(self.snapshot.info.sandboxes)} of {want} children of {self.snapshot.id} after {timeout:g} s",
                    code="client_timeout",
                )
            await asyncio.sleep(interval)
            await self.snapshot.refresh()
        children = await self.snapshot.sandboxes()
        for child in children:  # listed from the start of their spawn
            while child.state == "starting":
                if time.monotonic() > deadline:
                    raise ClientTimeout(f"child {child.id} still starting after {timeout:g} s", code="client_timeout")
                await asyncio.sleep(interval)
                try:
                    await child.refresh()
                except NotFound as e:
                    raise ForkvmError(
                        f"child {child.id} of {self.snapshot.id} failed to spawn", code="spawn_failed"
                    ) from e
        self.children = children
        return self

    async def close(self, keep: Sequence[AsyncSandbox] = ()) -> None:
        """Remove the children, except those in ``keep``."""
        kept = {sb.id for sb in keep}
        await asyncio.gather(*(c.close() for c in self.children if c.id not in kept))  # async-only
        # sync-only: for child in [c for c in self.children if c.id not in kept]: child.close()
