"""Typed models of the image operations (``/v1/images...``), re-exported by
:mod:`forkvm.models` (see there for how models convert from and to JSON).

Pulls, imports and builds are long: their progress arrives as NDJSON
:class:`ImageEvent` lines, the last one ``done`` (with the :class:`Image`)
or ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from .models import ErrorDetail, Model

__all__ = [
    "BuildQuery",
    "Image",
    "ImageConfig",
    "ImageEvent",
    "ImageList",
    "ImportQuery",
    "PullImage",
    "StartCommand",
]


@dataclass
class ImageConfig(Model):
    """The defaults of every exec in a sandbox of the image, from its OCI config.

    ``env`` holds ``KEY=value`` strings; ``user`` is ``name``, ``uid``,
    ``name:group`` or ``uid:gid``; ``exposed_ports`` look like ``8080/tcp``.
    An exec with an empty ``argv`` runs ``entrypoint`` + ``cmd``.
    """

    env: Optional[List[str]] = None
    working_dir: Optional[str] = None
    user: Optional[str] = None
    entrypoint: Optional[List[str]] = None
    cmd: Optional[List[str]] = None
    exposed_ports: Optional[List[str]] = None
    labels: Optional[Dict[str, str]] = None


@dataclass
class StartCommand(Model):
    """A process the image's boot template starts, so that every spawn resumes with it running.

    It is ready when ``ready_port`` (a guest TCP port) accepts connections,
    or when ``ready_command`` exits 0, within ``ready_timeout_secs``
    (default 60).
    """

    command: List[str]
    ready_port: Optional[int] = None
    ready_command: Optional[List[str]] = None
    ready_timeout_secs: Optional[int] = None


@dataclass
class Image(Model):
    """An installed image.

    ``source`` is ``builtin``, ``registry``, ``import`` or ``build``;
    ``reference`` the registry reference, archive name or base image it came
    from. ``sandboxes`` and ``snapshots`` (on ``GET /v1/images/{name}``) are
    what uses it: while any exist, it cannot be deleted.
    """

    name: str
    #: ``ext4``.
    format: str
    #: Size of its root filesystem (a sandbox may ask for a larger ``disk_size``).
    size_bytes: int
    created_at: str
    source: str
    config: ImageConfig
    reference: Optional[str] = None
    #: The manifest digest, when it came with one.
    digest: Optional[str] = None
    #: Layer digests, bottom first.
    layers: Optional[List[str]] = None
    start: Optional[StartCommand] = None
    sandboxes: Optional[List[str]] = None
    snapshots: Optional[List[str]] = None


@dataclass
class ImageList(Model):
    """``GET /v1/images``."""

    images: List[Image]


@dataclass
class PullImage(Model):
    """``POST /v1/images``: pull an image from an OCI Distribution registry.

    ``reference`` is e.g. ``registry.example:5000/team/py:3.12`` or
    ``ubuntu@sha256:...``; ``name`` the local name (default: the
    repository's last part and the tag, e.g. ``py-3.12``). Without
    ``username``/``password`` the daemon uses its host's
    ``~/.docker/config.json``, else pulls anonymously. ``insecure`` speaks
    plain HTTP to the registry; ``disk_size`` is the root filesystem size in
    bytes; ``replace`` replaces an image of the same name.
    """

    reference: str
    name: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = None
    insecure: Optional[bool] = None
    disk_size: Optional[int] = None
    replace: Optional[bool] = None
    start: Optional[StartCommand] = None
    stream: Optional[bool] = None


@dataclass
class ImportQuery(Model):
    """The query of ``POST /v1/images/import`` (the body is the archive).

    ``file`` is the archive's file name, for the record and error messages.
    """

    name: str
    file: Optional[str] = None
    disk_size: Optional[int] = None
    replace: Optional[bool] = None


@dataclass
class BuildQuery(Model):
    """The query of ``POST /v1/images/build`` (the body is the build context as a tar).

    ``dockerfile`` is the Dockerfile's path inside the context (default
    ``Dockerfile``); ``build_args`` the ``--build-arg`` values as a JSON
    object string; ``no_cache`` runs every step again; ``target`` builds that
    stage of a multi-stage Dockerfile (``docker build --target``);
    ``memory_mib`` is the guest RAM of the build sandbox.
    """

    tag: str
    dockerfile: Optional[str] = None
    build_args: Optional[str] = None
    no_cache: Optional[bool] = None
    target: Optional[str] = None
    disk_size: Optional[int] = None
    memory_mib: Optional[int] = None


@dataclass
class ImageEvent(Model):
    """One line of an image operation's NDJSON progress stream (pull, import, build).

    The schema is a union tagged by ``type``:

    * ``phase``: a phase starts (``phase``: ``resolving``, ``fetching``,
      ``unpacking``, ``mkfs``...);
    * ``progress``: ``done`` of ``total`` (if known) bytes of ``item`` (a
      blob, a layer);
    * ``cached``: ``item`` needed no work (a blob already present, a cached
      build step);
    * ``step``: build step ``index`` of ``total`` starts (``text``,
      ``cached``);
    * ``log``: a ``line`` of output or a note;
    * ``done``: the operation finished: ``image`` is installed (the last line);
    * ``error``: it failed, nothing was installed (the last line).

    The client methods call ``on_event`` with each and raise an ``error`` as
    the matching :class:`~forkvm.ForkvmError`.
    """

    type: str
    phase: Optional[str] = None
    item: Optional[str] = None
    done: Optional[int] = None
    total: Optional[int] = None
    index: Optional[int] = None
    text: Optional[str] = None
    cached: Optional[bool] = None
    line: Optional[str] = None
    image: Optional[Image] = None
    error: Optional[ErrorDetail] = None
