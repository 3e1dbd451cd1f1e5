"""Python SDK for forkvm: AI-agent sandboxes as microVMs that fork while they run.

Quick start::

    from forkvm import Sandbox

    with Sandbox() as sb:
        print(sb.exec("echo hello from $(hostname)").stdout)

The package has three layers:

* :class:`Sandbox`, :class:`Snapshot` and :class:`Branch` (and their async
  twins :class:`AsyncSandbox`, :class:`AsyncSnapshot`, :class:`AsyncBranch`):
  objects for everyday use.
* :class:`Client` and :class:`AsyncClient`: one method per REST operation,
  returning the typed models of :mod:`forkvm.models`.
* :mod:`forkvm.errors`: :class:`ForkvmError` and a subclass per kind of
  failure, carrying the daemon's ``status``, ``code`` and ``message``.

The daemon is found through ``FORKVM_URL`` (``unix:///path.sock`` or
``http://host:port``, with ``FORKVM_TOKEN`` as bearer token), else at
``$FORKVM_HOME/forkvm.sock`` (``FORKVM_HOME`` defaults to ``/var/lib/forkvm``).
"""

__version__ = "0.1.0"

from . import models
from ._async_events import AsyncEventStream
from ._async_proc_sandbox import AsyncFsWatcher, AsyncSandboxFs, AsyncSandboxProcess, AsyncSandboxProcesses
from ._async_proc_streams import AsyncProcessStream, AsyncWatchStream
from ._events import EventStream
from ._proc_sandbox import FsWatcher, SandboxFs, SandboxProcess, SandboxProcesses
from ._proc_streams import ProcessStream, WatchStream
from .aio import AsyncBranch, AsyncSandbox, AsyncSandboxFiles, AsyncSnapshot
from .async_client import AsyncClient, default_async_client
from .client import Client, default_client
from .errors import (
    BuildFailed,
    CapacityExceeded,
    ClientTimeout,
    CommandFailed,
    Conflict,
    DaemonUnreachable,
    Forbidden,
    ForkvmError,
    GuestError,
    GuestTimeout,
    ImageNotFound,
    IncompatibleSnapshot,
    InvalidImage,
    InvalidRequest,
    LimitExceeded,
    MethodNotAllowed,
    NetworkFailed,
    NetworkUnavailable,
    NoSpace,
    NodeLost,
    NodeUnreachable,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    QemuFailed,
    RegistryAuthFailed,
    RegistryUnreachable,
    RequestTimeout,
    ServerError,
    SnapshotCorrupt,
    StreamingUnsupported,
    Unauthorized,
    Unprocessable,
)
from . import models as _models
from .models import (
    BranchMode,
    ChangeKind,
    Checkpoint,
    Diff,
    EgressRule,
    ExecResult,
    Merged,
    MergeStrategy,
    NetworkMode,
    OnTimeout,
    OutputEncoding,
    PathChange,
    PortForward,
    PullResult,
    PushResult,
    Retention,
    Rewound,
    SandboxLimits,
    SandboxState,
    Timeline,
    TransferEvent,
    Volume,
    VolumeMode,
    VolumeMount,
)

#: A merge conflict (``models.Conflict``); the exception a refused merge raises is :class:`Conflict`.
MergeConflict = _models.Conflict
from ._volume_models import parse_volume
from .processes import ProcessEnd, ProcessOutput, ProcessStart
from .sandbox import Branch, Sandbox, SandboxFiles, Snapshot
from .streaming import AsyncExecStream, ExecEvent, ExecStream, ExitEvent, OutputEvent

__all__ = [
    "__version__",
    "models",
    # objects
    "Sandbox",
    "Snapshot",
    "Branch",
    "SandboxFiles",
    "AsyncSandbox",
    "AsyncSnapshot",
    "AsyncBranch",
    "AsyncSandboxFiles",
    "SandboxProcesses",
    "SandboxProcess",
    "SandboxFs",
    "FsWatcher",
    "AsyncSandboxProcesses",
    "AsyncSandboxProcess",
    "AsyncSandboxFs",
    "AsyncFsWatcher",
    # clients
    "Client",
    "AsyncClient",
    "default_client",
    "default_async_client",
    # results and events
    "ExecResult",
    "PushResult",
    "PullResult",
    "TransferEvent",
    "BranchMode",
    "NetworkMode",
    "PortForward",
    "EgressRule",
    "OutputEncoding",
    "SandboxState",
    "OnTimeout",
    "SandboxLimits",
    "Checkpoint",
    "Timeline",
    "Retention",
    "Rewound",
    "Diff",
    "PathChange",
    "ChangeKind",
    "Merged",
    "MergeStrategy",
    "MergeConflict",
    "VolumeMount",
    "VolumeMode",
    "Volume",
    "parse_volume",
    "ExecStream",
    "AsyncExecStream",
    "ExecEvent",
    "OutputEvent",
    "ExitEvent",
    "ProcessStream",
    "AsyncProcessStream",
    "WatchStream",
    "AsyncWatchStream",
    "EventStream",
    "AsyncEventStream",
    "ProcessStart",
    "ProcessOutput",
    "ProcessEnd",
    # errors
    "ForkvmError",
    "InvalidRequest",
    "MethodNotAllowed",
    "StreamingUnsupported",
    "Unauthorized",
    "Forbidden",
    "RegistryAuthFailed",
    "NotFound",
    "ImageNotFound",
    "Conflict",
    "RequestTimeout",
    "PayloadTooLarge",
    "Unprocessable",
    "SnapshotCorrupt",
    "InvalidImage",
    "IncompatibleSnapshot",
    "BuildFailed",
    "LimitExceeded",
    "ServerError",
    "QemuFailed",
    "NetworkFailed",
    "NetworkUnavailable",
    "CapacityExceeded",
    "GuestError",
    "GuestTimeout",
    "RegistryUnreachable",
    "NoSpace",
    "NodeLost",
    "NodeUnreachable",
    "DaemonUnreachable",
    "ClientTimeout",
    "ProtocolError",
    "CommandFailed",
]
