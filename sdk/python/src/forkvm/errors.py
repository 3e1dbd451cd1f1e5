"""Exceptions raised by the forkvm SDK.

Every error the daemon returns is ``{"error": {"code", "message"}}`` with a
4xx or 5xx status. It is raised as a subclass of :class:`ForkvmError` chosen
from the status (and refined by the code), carrying ``status``, ``code`` and
``message``::

    try:
        client.get_sandbox("sb-nope")
    except forkvm.NotFound as e:
        print(e.status, e.code, e.message)

Failures to reach the daemon at all raise :class:`DaemonUnreachable`, and a
request that outlives the client's timeout raises :class:`ClientTimeout`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, Optional, Type

if TYPE_CHECKING:
    import httpx

    from .models import ExecResult

__all__ = [
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
    "error_from_response",
    "error_from_detail",
]


class ForkvmError(Exception):
    """Base of every SDK error.

    ``status`` is the HTTP status (``None`` when the error did not come from an
    HTTP status, e.g. an error event in an exec stream or a connection
    failure), ``code`` the daemon's machine-readable code and ``message`` its
    explanation. ``hint``, when the daemon gave one, is what to do next as a
    dict ``{"action": ..., "target": ...}`` (the message already says it in
    words).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        status: Optional[int] = None,
        hint: Optional[dict] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.hint = hint

    def __str__(self) -> str:
        where = f"HTTP {self.status}, " if self.status is not None else ""
        return f"{self.message} ({where}{self.code})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class InvalidRequest(ForkvmError):
    """400: malformed JSON, unknown fields, values out of range, relative paths."""


class MethodNotAllowed(InvalidRequest):
    """405: wrong method for the path."""


class StreamingUnsupported(InvalidRequest):
    """The daemon refused ``"stream": true``: it predates streaming exec."""


class Unauthorized(ForkvmError):
    """401: TCP without the right bearer token (set ``FORKVM_TOKEN``)."""


class Forbidden(ForkvmError):
    """403: refused for lack of rights (see :class:`RegistryAuthFailed`)."""


class RegistryAuthFailed(Forbidden):
    """403 ``registry_auth_failed``: a registry refused the credentials of a pull or a push."""


class NotFound(ForkvmError):
    """404: no such sandbox, snapshot, route, guest file or executable."""


class ImageNotFound(NotFound):
    """404 ``image_not_found``: unknown image, or a registry has no such
    repository, tag or digest (an image or snapshot pull)."""


class Conflict(ForkvmError):
    """409: wrong state (failed, still starting), a tag taken, a snapshot in use."""


class RequestTimeout(ForkvmError):
    """408: the request body did not arrive in time (``request_body_timeout_ms``)."""


class PayloadTooLarge(ForkvmError):
    """413: body, stdin or file over the limit."""


class Unprocessable(ForkvmError):
    """422: the request is well-formed but what it names or carries is unusable."""


class SnapshotCorrupt(Unprocessable):
    """422 ``snapshot_corrupt``: a snapshot file fails its size or SHA-256 check."""


class InvalidImage(Unprocessable):
    """422 ``invalid_image``: an image's blobs fail verification, its archive or
    manifest is malformed, or it has no linux/amd64 variant."""


class IncompatibleSnapshot(Unprocessable):
    """422 ``incompatible_snapshot``: a pulled snapshot cannot be restored on
    this host (QEMU release, machine type, accelerator, CPU or guest kernel
    differ; the message says which). Nothing was written."""


class BuildFailed(Unprocessable):
    """422 ``build_failed``: a Dockerfile is invalid or one of its steps failed
    (the ``log`` events of the build show its output)."""


class LimitExceeded(ForkvmError):
    """429: the sandbox limit is reached, or too many requests are in flight (retry shortly)."""


class ServerError(ForkvmError):
    """5xx: the daemon or the host failed."""


class QemuFailed(ServerError):
    """500 ``qemu_failed``: QEMU could not start or died while booting."""


class NetworkFailed(ServerError):
    """500 ``network_failed``: the sandbox's network could not be set up (nothing is left of it)."""


class NetworkUnavailable(ServerError):
    """503 ``network_unavailable``: this host cannot give sandboxes a network.

    ``forkvm doctor`` says why; spawn with ``network="none"`` meanwhile.
    """


class CapacityExceeded(ServerError):
    """503 ``capacity_exceeded``: the spawn, branch or resume would pass the host's memory commitment.

    Nothing was started; retry once sandboxes have been removed or paused
    (``Client.info().capacity`` shows what is left). A disk below the
    reserve is :class:`NoSpace` instead.
    """


class GuestError(ServerError):
    """502: the guest agent went away (the VM died)."""


class GuestTimeout(ServerError):
    """504: the guest did not boot, or did not answer."""


class RegistryUnreachable(ServerError):
    """502 ``registry_unreachable``: a registry could not be reached or answered nonsense."""


class NoSpace(ServerError):
    """507 ``no_space``: the filesystem holding the daemon's home is full."""


class NodeLost(ForkvmError):
    """410 ``node_lost`` (cluster endpoint): the sandbox was on a node the cluster declared dead."""


class NodeUnreachable(ServerError):
    """503 ``node_unreachable`` (cluster endpoint): the node holding it does not answer; retry."""


class DaemonUnreachable(ForkvmError):
    """The daemon could not be reached (no socket, connection refused...)."""


class ClientTimeout(ForkvmError):
    """The request took longer than the client's timeout."""


class ProtocolError(ForkvmError):
    """The daemon's answer could not be understood."""


class CommandFailed(ForkvmError):
    """Raised by :meth:`ExecResult.check` when a command exited non-zero."""

    def __init__(self, result: "ExecResult") -> None:
        if result.timed_out:
            what = "timed out"
        elif result.exit_code is None:
            what = f"was killed by signal {result.signal}"
        else:
            what = f"exited with status {result.exit_code}"
        tail = result.stderr.strip()[-500:] if result.encoding == "utf8" else ""
        message = f"command {what}" + (f": {tail}" if tail else "")
        super().__init__(message, code="command_failed")
        self.result = result


_BY_STATUS: Dict[int, Type[ForkvmError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    410: NodeLost,
    413: PayloadTooLarge,
    422: Unprocessable,
    429: LimitExceeded,
    500: ServerError,
    502: GuestError,
    503: ServerError,
    504: GuestTimeout,
    507: NoSpace,
}

_BY_CODE: Dict[str, Type[ForkvmError]] = {
    "invalid_request": InvalidRequest,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "image_not_found": ImageNotFound,
    "conflict": Conflict,
    "request_timeout": RequestTimeout,
    "payload_too_large": PayloadTooLarge,
    "snapshot_corrupt": SnapshotCorrupt,
    "limit_exceeded": LimitExceeded,
    "qemu_failed": QemuFailed,
    "network_failed": NetworkFailed,
    "network_unavailable": NetworkUnavailable,
    "capacity_exceeded": CapacityExceeded,
    "node_lost": NodeLost,
    "node_unreachable": NodeUnreachable,
    "internal": ServerError,
    "guest_error": GuestError,
    "guest_timeout": GuestTimeout,
    "registry_auth_failed": RegistryAuthFailed,
    "invalid_image": InvalidImage,
    "incompatible_snapshot": IncompatibleSnapshot,
    "build_failed": BuildFailed,
    "registry_unreachable": RegistryUnreachable,
    "no_space": NoSpace,
}

# The status the daemon sends each code with (crates/forkvm-api/src/codes.rs),
# for the codes that share a status with a class they are not a subclass of
# (502 is GuestError's, but registry_unreachable is no guest's fault).
_STATUS_OF_CODE: Dict[str, int] = {
    "registry_unreachable": 502,
}


def _error_class(status: Optional[int], code: str) -> Type[ForkvmError]:
    by_code = _BY_CODE.get(code)
    if status is None:
        return by_code or ForkvmError
    by_status = _BY_STATUS.get(status)
    if by_status is None:
        by_status = ServerError if status >= 500 else ForkvmError
    # The code may name a more precise class than the status (404 + image_not_found),
    # or a sibling of the status's class that the daemon sends with that status.
    if by_code is not None and (issubclass(by_code, by_status) or _STATUS_OF_CODE.get(code) == status):
        return by_code
    return by_status


def error_from_detail(
    code: str, message: str, status: Optional[int] = None, hint: Optional[dict] = None
) -> ForkvmError:
    """The exception for an error ``code`` and ``message`` (and HTTP ``status``)."""
    return _error_class(status, code)(message, code=code, status=status, hint=hint)


def error_from_response(response: "httpx.Response") -> ForkvmError:
    """The exception for an error response (its body must have been read)."""
    status = response.status_code
    code, message, hint = f"http_{status}", "", None
    try:
        body = json.loads(response.content)
        detail = body["error"]
        code, message = str(detail["code"]), str(detail["message"])
        hint = detail.get("hint") if isinstance(detail.get("hint"), dict) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        message = response.text.strip() or response.reason_phrase or f"HTTP {status}"
    return error_from_detail(code, message, status, hint)
