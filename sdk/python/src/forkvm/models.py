"""Typed models of the forkvm REST API.

There is one class per schema in the daemon's OpenAPI document
(``docs/openapi.json``), with the same name and the same fields.

* Response models are built with :meth:`Model.from_dict`. Fields the SDK does
  not know yet are kept in :attr:`Model.extra` rather than rejected, because
  the daemon may add fields to its responses.
* Request models are turned into JSON bodies with :meth:`Model.to_dict`,
  which leaves out the fields that are ``None`` so the daemon applies its
  defaults.
* Enum values the SDK does not know are kept as plain strings.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import sys
import typing
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar, Union

__all__ = [
    "Model",
    "AccelInfo",
    "BranchMode",
    "BranchRequest",
    "BranchResult",
    "BuildQuery",
    "Capacity",
    "CreateSandbox",
    "CreateSnapshot",
    "DiskChain",
    "EgressRule",
    "ErrorBody",
    "ErrorDetail",
    "ErrorHint",
    "HintAction",
    "ExecEvent",
    "ExecRequest",
    "ExecResult",
    "FileWritten",
    "FlattenRequest",
    "GcInfo",
    "Health",
    "Image",
    "ImageConfig",
    "ImageEvent",
    "ImageList",
    "ImportQuery",
    "Info",
    "Lifetime",
    "Limits",
    "MemoryUsage",
    "NetInfo",
    "NetworkInfo",
    "NetworkMode",
    "OnTimeout",
    "OutputEncoding",
    "PauseInfo",
    "PauseRequest",
    "PoolConfig",
    "PoolInfo",
    "PortForward",
    "PruneFailure",
    "PruneRequest",
    "PruneResult",
    "PrunedSnapshot",
    "PullImage",
    "QemuInfo",
    "ResumeRequest",
    "Sandbox",
    "SandboxBatch",
    "SandboxLimits",
    "SandboxList",
    "SandboxState",
    "SetNetwork",
    "SetTimeout",
    "Snapshot",
    "SnapshotList",
    "SnapshotSizes",
    "SnapshotTimings",
    "SpawnTimings",
    "StartCommand",
    "Usage",
]

M = TypeVar("M", bound="Model")

_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        module = sys.modules[cls.__module__]
        hints = typing.get_type_hints(cls, vars(module))
        _HINTS[cls] = hints
    return hints


def _convert(tp: Any, value: Any) -> Any:
    """Convert a decoded JSON value to the annotated type ``tp``."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if origin in (list, List):
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v) for v in value]
    if origin in (dict, Dict):
        key_and_item = typing.get_args(tp)
        item = key_and_item[1] if len(key_and_item) == 2 else Any
        return {k: _convert(item, v) for k, v in value.items()}
    if isinstance(tp, type):
        if issubclass(tp, Model) and isinstance(value, Mapping):
            return tp.from_dict(value)
        if issubclass(tp, enum.Enum):
            try:
                return tp(value)
            except ValueError:
                return value  # a value this SDK does not know yet
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
    return value


def _serialize(value: Any) -> Any:
    if isinstance(value, Model):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_serialize(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _serialize(v) for k, v in value.items()}
    return value


class Model:
    """Base of every model: conversion from and to JSON-shaped dicts."""

    @classmethod
    def from_dict(cls: Type[M], data: Mapping[str, Any]) -> M:
        """Build the model from a decoded JSON object.

        Unknown keys end up in :attr:`extra`; nested objects become models.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"{cls.__name__}.from_dict expects an object, got {type(data).__name__}")
        hints = _hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs: Dict[str, Any] = {}
        extra: Dict[str, Any] = {}
        for key, value in data.items():
            if key in names:
                kwargs[key] = _convert(hints[key], value)
            else:
                extra[key] = value
        missing = [
            f.name
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        ]
        if missing:
            raise ValueError(f"{cls.__name__}: missing required field(s) {', '.join(missing)}")
        obj = cls(**kwargs)
        obj.__dict__["_extra"] = extra
        return obj

    def to_dict(self) -> Dict[str, Any]:
        """The model as a JSON-shaped dict, without the fields that are ``None``."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = _serialize(value)
        return out

    @property
    def extra(self) -> Dict[str, Any]:
        """Fields of the response that this version of the SDK does not model."""
        return self.__dict__.get("_extra") or {}


# --------------------------------------------------------------------------
# Enums


class _StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)


class BranchMode(_StrEnum):
    """How a branch copies memory."""

    LIVE = "live"
    DIFF = "diff"
    FULL = "full"


class NetworkMode(_StrEnum):
    """A sandbox's network.

    ``NAT``: a network namespace of its own, with NAT to the host's network
    (the daemon's default where the host supports it). ``NONE``: no route
    out; the guest sees only its own link.
    """

    NONE = "none"
    NAT = "nat"


class OutputEncoding(_StrEnum):
    """How ``stdout``/``stderr`` are encoded in an :class:`ExecResult`."""

    UTF8 = "utf8"
    BASE64 = "base64"


class SandboxState(_StrEnum):
    """Lifecycle state of a sandbox."""

    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    #: Saved to disk with no QEMU running; :meth:`~forkvm.Client.resume` brings it back.
    PAUSED = "paused"
    #: Only from a cluster endpoint: its node was declared dead (``failure`` says why).
    LOST = "lost"


# --------------------------------------------------------------------------
# Daemon


@dataclass
class Health(Model):
    """``GET /v1/health``."""

    status: str
    version: str


@dataclass
class AccelInfo(Model):
    """The accelerator in use (``kvm`` or ``tcg``) and why it was chosen."""

    kind: str
    reason: str


@dataclass
class QemuInfo(Model):
    """The QEMU in use."""

    path: str
    version: str


@dataclass
class Limits(Model):
    """Limits the daemon enforces."""

    max_memory_mib: int
    max_cpus: int
    max_sandboxes: int
    max_exec_output_bytes: int
    max_exec_timeout_ms: int
    max_file_bytes: int
    max_request_bytes: int
    max_concurrent_requests: Optional[int] = None
    request_body_timeout_ms: Optional[int] = None


@dataclass
class PoolInfo(Model):
    """A warm pool as ``GET /v1/info`` shows it."""

    snapshot: str
    size: int
    ready: int


@dataclass
class NetInfo(Model):
    """Networking as ``GET /v1/info`` shows it.

    ``available`` says whether sandboxes can get ``nat`` networks on this
    host (``reason`` says why not); ``pool`` is the uplink address pool and
    ``default_mode`` the mode of a spawn that names none.
    """

    available: bool
    pool: str
    default_mode: NetworkMode
    reason: Optional[str] = None


@dataclass
class GcInfo(Model):
    """Garbage collection of branch points, as ``GET /v1/info`` shows it.

    ``enabled`` says whether the daemon collects in the background (every
    ``interval_secs``); a branch point younger than ``grace_secs`` is never
    collected unless a prune asks for ``all``.
    """

    enabled: bool
    grace_secs: int
    interval_secs: int


@dataclass
class Info(Model):
    """``GET /v1/info``."""

    version: str
    accel: AccelInfo
    qemu: QemuInfo
    limits: Limits
    home: str
    images: List[str]
    sandboxes: int
    snapshots: int
    default_pool_size: int
    pools: List[PoolInfo]
    network: NetInfo
    gc: GcInfo
    #: Memory and disk capacity as admission control counts them.
    capacity: Optional[Capacity] = None
    #: The daemon's node name in a cluster (``serve --node``); new sandbox
    #: and snapshot ids carry it. None for a daemon of its own.
    node: Optional[str] = None


@dataclass
class ErrorDetail(Model):
    """A machine-readable code and a message saying what to do (the hint in words)."""

    code: str
    message: str
    hint: Optional[ErrorHint] = None


@dataclass
class ErrorBody(Model):
    """The body of every error response."""

    error: ErrorDetail


# --------------------------------------------------------------------------
# Networking


@dataclass
class PortForward(Model):
    """A published guest port: TCP ``guest`` in the sandbox, reached at ``127.0.0.1:host``.

    In a request, ``host`` ``None`` or 0 lets the daemon pick a free port; a
    response always has the port in use.
    """

    guest: int
    host: Optional[int] = None


@dataclass
class EgressRule(Model):
    """One egress allow-list entry: an IPv4 address or network (``A.B.C.D`` or
    ``A.B.C.D/N``) and, optionally, the TCP and UDP ``ports`` allowed to it
    (none: every port)."""

    cidr: str
    ports: Optional[List[int]] = None


@dataclass
class NetworkInfo(Model):
    """A sandbox's network as the API shows it.

    ``guest_ip`` and ``gateway`` are the same in every sandbox (each has a
    namespace of its own). For ``nat``, ``host_ip`` is the host end of the
    sandbox's uplink and ``uplink_ip`` the sandbox end (the source address of
    its egress before the host's NAT). ``egress`` is the allow-list, if any;
    ``allow_host`` says whether its entries reach the host itself too.
    """

    mode: NetworkMode
    guest_ip: str
    gateway: str
    ports: List[PortForward]
    host_ip: Optional[str] = None
    uplink_ip: Optional[str] = None
    egress: Optional[List[EgressRule]] = None
    allow_host: bool = False


@dataclass
class SetNetwork(Model):
    """``PUT /v1/sandboxes/{id}/network``: a running sandbox's new allow-list.

    ``egress`` ``None`` lets it reach anything (but the host and other
    sandboxes); ``allow_host`` applies the entries to the host too.
    Established connections are kept.
    """

    egress: Optional[List[EgressRule]] = None
    allow_host: Optional[bool] = None


# --------------------------------------------------------------------------
# Sandboxes


@dataclass
class SpawnTimings(Model):
    """Where the time of a spawn went, in milliseconds."""

    prepare_ms: float
    qemu_start_ms: float
    boot_ms: float
    total_ms: float
    restore_ms: Optional[float] = None
    identity_ms: Optional[float] = None
    from_pool: Optional[bool] = None
    template_ms: Optional[float] = None
    #: Setting up the host side of the network (namespace, uplink, rules, ports).
    network_ms: Optional[float] = None
    #: From the guest's resume (or the end of its boot) until its network path worked.
    network_ready_ms: Optional[float] = None
    #: When the guest resumed (restores only), in host Unix time (milliseconds).
    resumed_unix_ms: Optional[float] = None


@dataclass
class MemoryUsage(Model):
    """Memory use of a sandbox's QEMU process, in KiB."""

    rss_kib: int
    pss_kib: int
    private_dirty_kib: int


@dataclass
class DiskChain(Model):
    """The qcow2 layers a running sandbox's disk reads through above its base
    image. A snapshot or branch adds one; a background stream folds them back
    into the top (``streaming`` while it copies)."""

    layers: int
    streaming: bool


@dataclass
class Sandbox(Model):
    """A sandbox as the API shows it."""

    id: str
    state: SandboxState
    image: str
    memory_mib: int
    cpus: int
    accel: str
    created_at: str
    pid: Optional[int] = None
    failure: Optional[str] = None
    #: Why a ``running`` sandbox is suspended by disk pressure; calls into it get 507 until it resumes.
    suspended: Optional[str] = None
    timings: Optional[SpawnTimings] = None
    memory: Optional[MemoryUsage] = None
    #: Its disk chain (``GET`` of one running sandbox).
    disk: Optional[DiskChain] = None
    snapshot: Optional[str] = None
    #: Its network; ``None`` for a sandbox without a NIC.
    network: Optional[NetworkInfo] = None
    #: Its labels (see ``GET /v1/sandboxes?metadata.KEY=VALUE``) and the default env of its execs.
    metadata: Dict[str, str] = dataclasses.field(default_factory=dict)
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: Its timeout, when it has one; its saved state while ``paused``.
    lifetime: Optional[Lifetime] = None
    paused: Optional[PauseInfo] = None
    #: Its resource limits (``None`` without any); what it has used (``GET`` of a running one).
    limits: Optional[SandboxLimits] = None
    usage: Optional[Usage] = None
    #: Its volumes (docs/volumes.md), each with the ``host_path`` its guest reads and writes.
    volumes: List[MountedVolume] = dataclasses.field(default_factory=list)


@dataclass
class SandboxBatch(Model):
    """The response to ``POST /v1/sandboxes`` with ``count``."""

    sandboxes: List[Sandbox]
    total_ms: float


@dataclass
class SandboxList(Model):
    """``GET /v1/sandboxes``."""

    sandboxes: List[Sandbox]


@dataclass
class CreateSandbox(Model):
    """``POST /v1/sandboxes``: start a sandbox (every field is optional).

    ``network`` is ``nat`` (the default where available) or ``none``;
    ``ports`` publishes guest TCP ports on host loopback ports and ``egress``
    restricts where the guest may connect (both need ``nat``); the host
    itself is reachable through ``egress`` only with ``allow_host``.
    ``wait_for_network=False`` answers before the guest's network path is
    proven to work. ``metadata`` labels it, ``env`` is the default
    environment of its execs (a branch's children inherit both);
    ``timeout`` (seconds) removes it, or pauses it with ``on_timeout=pause``.
    ``limits`` bounds its resources (children inherit them). ``volumes``
    mounts host directories and named volumes (a snapshot fixes them).
    """

    image: Optional[str] = None
    memory_mib: Optional[int] = None
    cpus: Optional[int] = None
    snapshot: Optional[str] = None
    count: Optional[int] = None
    use_template: Optional[bool] = None
    network: Optional[NetworkMode] = None
    ports: Optional[List[PortForward]] = None
    egress: Optional[List[EgressRule]] = None
    #: Let the ``egress`` entries reach the host itself (needs ``egress``).
    allow_host: Optional[bool] = None
    wait_for_network: Optional[bool] = None
    #: Root disk size in bytes (default: the image's); a larger one grows the guest's root filesystem.
    disk_size: Optional[int] = None
    metadata: Optional[Dict[str, str]] = None
    env: Optional[Dict[str, str]] = None
    timeout: Optional[int] = None
    on_timeout: Optional[OnTimeout] = None
    limits: Optional[SandboxLimits] = None
    volumes: Optional[List[VolumeMount]] = None


# --------------------------------------------------------------------------
# Exec and files


@dataclass
class ExecRequest(Model):
    """``POST /v1/sandboxes/{id}/exec``: run a command.

    An empty ``argv`` runs the image's default command (its ``Entrypoint``
    and ``Cmd``). ``cmd`` and ``entrypoint`` (instead of ``argv``) follow
    ``docker run [--entrypoint E] IMAGE ARGS``: ``cmd`` replaces the image's
    ``Cmd`` after its ``Entrypoint``; ``entrypoint`` replaces the
    ``Entrypoint`` (``[]``: none) and drops the ``Cmd``. ``user`` is ``name``, ``uid``, ``name:group`` or
    ``uid:gid`` (default: the image's ``User``, else root); ``env`` and
    ``cwd`` add to and override the image's ``Env`` and ``WorkingDir``.
    ``stream`` asks for an NDJSON stream of :class:`ExecEvent` lines instead
    of one result (``max_output_bytes`` and ``encoding`` do not apply then).
    """

    argv: Optional[List[str]] = None
    cmd: Optional[List[str]] = None
    entrypoint: Optional[List[str]] = None
    env: Optional[Dict[str, str]] = None
    cwd: Optional[str] = None
    user: Optional[str] = None
    stdin: Optional[str] = None
    stdin_base64: Optional[str] = None
    timeout_ms: Optional[int] = None
    max_output_bytes: Optional[int] = None
    encoding: Optional[OutputEncoding] = None
    stream: Optional[bool] = None


@dataclass
class ExecResult(Model):
    """The result of a finished command.

    ``stdout`` and ``stderr`` are text, or base64 when ``encoding`` is
    ``base64``; :attr:`raw_stdout` and :attr:`raw_stderr` give bytes either way.
    """

    timed_out: bool
    stdout: str
    stderr: str
    encoding: OutputEncoding
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    exit_code: Optional[int] = None
    signal: Optional[int] = None

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.exit_code == 0

    @property
    def duration(self) -> float:
        """Run time inside the guest, in seconds."""
        return self.duration_ms / 1000.0

    @property
    def raw_stdout(self) -> bytes:
        return self._raw(self.stdout)

    @property
    def raw_stderr(self) -> bytes:
        return self._raw(self.stderr)

    def _raw(self, text: str) -> bytes:
        if self.encoding == OutputEncoding.BASE64:
            return base64.b64decode(text)
        return text.encode("utf-8")

    def check(self) -> "ExecResult":
        """Return ``self`` if the command exited with 0, else raise :class:`~forkvm.CommandFailed`."""
        if not self.ok:
            from .errors import CommandFailed

            raise CommandFailed(self)
        return self


@dataclass
class ExecEvent(Model):
    """One line of a streamed exec (``"stream": true``), newline-delimited JSON.

    The schema is a union tagged by ``type``: ``stdout``/``stderr`` carry
    base64 ``data``; ``exit`` carries ``exit_code``, ``signal``,
    ``timed_out``, ``duration_ms`` and the byte counts; ``error`` carries
    ``error``. :mod:`forkvm.streaming` turns these into
    :class:`~forkvm.OutputEvent` and :class:`~forkvm.ExitEvent`.
    """

    type: str
    data: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: Optional[bool] = None
    duration_ms: Optional[int] = None
    stdout_bytes: Optional[int] = None
    stderr_bytes: Optional[int] = None
    error: Optional[ErrorDetail] = None


@dataclass
class FileWritten(Model):
    """``PUT /v1/sandboxes/{id}/files``."""

    path: str
    size: int


# --------------------------------------------------------------------------
# Snapshots


@dataclass
class SnapshotSizes(Model):
    """Sizes of a snapshot's files, in bytes."""

    memory_bytes: int
    memory_allocated_bytes: int
    device_state_bytes: int
    disk_bytes: int
    memory_diff_bytes: Optional[int] = None
    device_state_allocated_bytes: Optional[int] = None
    #: What the snapshot's directory holds on disk, caches and disk layer included.
    on_disk_bytes: Optional[int] = None


@dataclass
class SnapshotTimings(Model):
    """Where the time of a snapshot went, in milliseconds."""

    pause_ms: float
    save_state_ms: float
    freeze_disk_ms: float
    copy_memory_ms: float
    publish_ms: float
    total_ms: float


@dataclass
class Snapshot(Model):
    """A snapshot as the API shows it."""

    id: str
    source: str
    image: str
    memory_mib: int
    cpus: int
    created_at: str
    kind: str
    state: str
    template: bool
    qemu_version: str
    sizes: SnapshotSizes
    pool_size: int
    #: ``pool_size`` is the daemon's default (the snapshot has no size of its own).
    pool_default: bool
    sandboxes: List[str]
    children: List[str]
    #: What made it: ``branch``, ``snapshot``, ``template``, ``flatten`` or ``unknown``.
    #: Garbage collection only ever removes ``branch`` snapshots.
    origin: str
    #: Kept from garbage collection (see :meth:`forkvm.Client.pin_snapshot`).
    pinned: bool
    tag: Optional[str] = None
    parent: Optional[str] = None
    depth: Optional[int] = None
    failure: Optional[str] = None
    timings: Optional[SnapshotTimings] = None
    #: For the tree (docs/events.md): a branch point's ``live``/``diff``/``full``, how long its source was paused,
    #: and the diff snapshot a ``flatten`` made this one from.
    mode: Optional[str] = None
    pause_ms: Optional[float] = None
    flattened_from: Optional[str] = None


@dataclass
class SnapshotList(Model):
    """``GET /v1/snapshots``."""

    snapshots: List[Snapshot]


@dataclass
class CreateSnapshot(Model):
    """``POST /v1/sandboxes/{id}/snapshot``."""

    tag: Optional[str] = None


@dataclass
class BranchRequest(Model):
    """``POST /v1/sandboxes/{id}/branch``.

    ``ports`` are published for each child; omitted, each child publishes the
    source's guest ports on newly allocated host ports. Children keep the
    source's network mode and egress allow-list, and its ``limits`` with the
    fields given here replaced.
    """

    mode: Optional[BranchMode] = None
    count: Optional[int] = None
    tag: Optional[str] = None
    wait: Optional[bool] = None
    ports: Optional[List[PortForward]] = None
    wait_for_network: Optional[bool] = None
    limits: Optional[SandboxLimits] = None
    #: The children's timeout in seconds, from their start (default: the source's).
    timeout: Optional[int] = None


@dataclass
class BranchResult(Model):
    """The result of a branch: the snapshot of the branch point and its children."""

    mode: BranchMode
    snapshot: Snapshot
    children: List[Sandbox]
    pause_ms: float
    snapshot_ms: float
    spawn_ms: float
    total_ms: float


# --------------------------------------------------------------------------
# Snapshot upkeep, images, lifetimes, resources, volumes, processes, events, snapshot transfer, time travel and
# diff/merge: in modules of their own (re-exported here), after the base classes they use. Of processes and
# filesystem operations (docs/processes.md), volumes, events, snapshot push and pull, and diff/merge: every name.
from . import _event_models, _proc_models, _timeline_models, _transfer_models, _treediff_models, _volume_models  # noqa
from ._event_models import *  # noqa: E402, F401, F403
from ._image_models import BuildQuery, Image, ImageConfig, ImageEvent, ImageList, ImportQuery  # noqa: E402
from ._image_models import PullImage, StartCommand  # noqa: E402
from ._error_models import ErrorHint, HintAction  # noqa: E402
from ._lifecycle_models import Lifetime, OnTimeout, PauseInfo, PauseRequest, ResumeRequest, SetTimeout  # noqa: E402
from ._proc_models import *  # noqa: E402, F401, F403
from ._resource_models import Capacity, SandboxLimits, Usage  # noqa: E402
from ._snapshot_admin_models import FlattenRequest, PoolConfig, PruneFailure, PrunedSnapshot  # noqa: E402
from ._snapshot_admin_models import PruneRequest, PruneResult  # noqa: E402
from ._timeline_models import Checkpoint, CheckpointRequest, Retention, RewindRequest, Rewound  # noqa: E402
from ._timeline_models import Timeline  # noqa: E402
from ._transfer_models import *  # noqa: E402, F401, F403
from ._treediff_models import *  # noqa: E402, F401, F403
from ._volume_models import *  # noqa: E402, F401, F403

__all__ += _event_models.__all__ + _proc_models.__all__ + _volume_models.__all__ + _transfer_models.__all__
__all__ += _timeline_models.__all__ + _treediff_models.__all__
