"""Typed models of snapshot transfer: pushing a snapshot to an OCI registry
(``POST /v1/snapshots/{id}/push``) and pulling one from it
(``POST /v1/snapshots/pull``). Re-exported by :mod:`forkvm.models` (see
there for how models convert from and to JSON).

A pushed snapshot travels with its whole chain (the snapshot and every
ancestor, each a "link") and the root disk of its base image; what the
registry already has is not sent again, and what the pulling host already
has is not fetched again. Both operations are long: their progress arrives
as NDJSON :class:`TransferEvent` lines, the last one ``pushed``, ``pulled``
or ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Type, Union

from .models import ErrorDetail, M, Model, Snapshot

__all__ = ["PullResult", "PullSnapshot", "PushResult", "PushSnapshot", "TransferEvent"]


@dataclass
class PushSnapshot(Model):
    """``POST /v1/snapshots/{id}/push``: where to push a snapshot.

    ``reference`` is ``host[:port]/repo[:tag]`` (the tag defaults to
    ``latest``), e.g. ``127.0.0.1:5000/team/warm:v1``. ``username`` and
    ``password`` (given together) log in to the registry; without them the
    daemon uses its host's ``~/.docker/config.json``, else pushes
    anonymously. ``insecure`` speaks plain HTTP to a registry that is not
    on loopback (loopback registries always may). ``stream`` asks for the
    NDJSON progress stream (the client methods set it).
    """

    reference: str
    username: Optional[str] = None
    password: Optional[str] = None
    insecure: Optional[bool] = None
    stream: Optional[bool] = None


@dataclass
class PullSnapshot(Model):
    """``POST /v1/snapshots/pull``: which pushed snapshot to pull.

    ``reference`` is ``host[:port]/repo[:tag]`` or ``host[:port]/repo@sha256:<digest>``
    (the ``digest`` of a :class:`PushResult` names exactly one push).
    ``tag`` tags the pulled snapshot on this host (its ancestors get none);
    the credentials, ``insecure`` and ``stream`` are those of
    :class:`PushSnapshot`.
    """

    reference: str
    tag: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = None
    insecure: Optional[bool] = None
    stream: Optional[bool] = None


@dataclass
class PushResult(Model):
    """What a push did.

    Blobs and bytes count what went over the wire (compressed chunks,
    configs and manifests); ``skipped`` ones were in the registry already.
    A push of what the registry has in full sends only the index manifest:
    ``links_skipped == links`` and ``blobs_sent == 0``.
    """

    #: The reference, normalised (``127.0.0.1:5000/team/warm:latest``).
    reference: str
    #: The digest of the index the tag now names: pull ``REPO@DIGEST`` to get exactly this snapshot.
    digest: str
    #: The snapshot pushed (its id).
    snapshot: str
    #: How many snapshots its chain holds (itself and every ancestor).
    links: int
    #: Chain links whose manifest the registry already had: nothing of theirs was sent.
    links_skipped: int
    #: Whether the base image's root disk was sent (false: the registry had it).
    image_sent: bool
    blobs_sent: int
    bytes_sent: int
    blobs_skipped: int
    bytes_skipped: int
    #: Manifests written (links, image, and the index).
    manifests_sent: int
    total_ms: int


@dataclass
class PullResult(Model):
    """What a pull did: the snapshot, published on this host and ready to spawn from."""

    #: The pulled snapshot as ``GET /v1/snapshots/{id}`` shows it (same id as on the pushing host).
    snapshot: Snapshot
    #: The index digest pulled.
    digest: str
    #: How many snapshots its chain holds.
    links: int
    #: Links this host already had (same snapshot, same content): not fetched.
    links_cached: int
    #: The image the chain's disk ends in on this host ...
    image: str
    #: ... and whether this pull created it (false: this host had it).
    image_created: bool
    blobs_fetched: int
    bytes_fetched: int
    total_ms: int


@dataclass
class TransferEvent(Model):
    """One line of a push's or a pull's NDJSON progress stream.

    The schema is a union tagged by ``type``:

    * ``phase``: a phase starts (``phase``: ``resolving``, ``chunking``,
      ``uploading``, ``fetching``, ``checking``, ``publishing``...);
    * ``progress``: ``done`` of ``total`` (if known) bytes of ``item`` (a
      file, a chain link) so far;
    * ``cached``: ``item`` needed no work (the registry, or this host, had it);
    * ``log``: a ``line`` of text;
    * ``pushed``: the push finished; ``result`` is its :class:`PushResult` (the last line);
    * ``pulled``: the pull finished and the snapshot is published; ``result``
      is its :class:`PullResult` (the last line);
    * ``error``: the operation failed and nothing was published (the last line).

    The client methods call ``on_event`` with each, and raise an ``error``
    as the matching :class:`~forkvm.ForkvmError`.
    """

    type: str
    phase: Optional[str] = None
    item: Optional[str] = None
    done: Optional[int] = None
    total: Optional[int] = None
    line: Optional[str] = None
    #: A :class:`PushResult` on ``pushed``, a :class:`PullResult` on ``pulled``.
    result: Union[PushResult, PullResult, None] = None
    error: Optional[ErrorDetail] = None

    @classmethod
    def from_dict(cls: Type[M], data: Mapping[str, Any]) -> M:
        """Build the event; ``result`` becomes the model its ``type`` says."""
        event = super().from_dict(data)  # type: ignore[misc]
        result_cls = _RESULT_OF.get(event.type)
        if result_cls is not None and isinstance(event.result, Mapping):
            event.result = result_cls.from_dict(event.result)
        return event


_RESULT_OF = {"pushed": PushResult, "pulled": PullResult}
