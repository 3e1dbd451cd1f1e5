"""The low-level synchronous client: one method per API operation.

Each method of :class:`Client` is named after an ``operationId`` of the
daemon's OpenAPI document, takes the path parameters positionally and the
body fields as keyword arguments, and returns the typed model of the answer::

    from forkvm import Client

    with Client() as api:                       # FORKVM_URL, or the local socket
        sb = api.create_sandbox(memory_mib=256)
        print(api.exec(sb.id, ["uname", "-a"]).stdout)
        api.delete_sandbox(sb.id)

Errors are raised as :class:`~forkvm.ForkvmError` subclasses. For the
object-oriented interface, see :class:`forkvm.Sandbox`.
"""

from __future__ import annotations

import atexit
import json
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import httpx

from . import _ops, models
from ._config import DEFAULT_TIMEOUT, Endpoint, resolve_endpoint
from ._ops import EgressSpec, PortSpec
from .errors import (
    ClientTimeout,
    DaemonUnreachable,
    ForkvmError,
    InvalidRequest,
    StreamingUnsupported,
    error_from_response,
)
from .streaming import ExecStream

__all__ = ["Client", "default_client"]

TimeoutTypes = Union[None, float, httpx.Timeout]

# Request bodies larger than this are sent in chunks of this size.
_CHUNK = 1 << 20


def _streaming_refused(error: ForkvmError) -> ForkvmError:
    if isinstance(error, InvalidRequest) and "stream" in error.message and "unknown field" in error.message:
        return StreamingUnsupported(
            f"this forkvm daemon does not support streaming exec yet: {error.message}",
            code=error.code,
            status=error.status,
        )
    return error


class _BaseClient:
    """What the sync and async clients share: the endpoint and request building."""

    endpoint: Endpoint

    def _httpx_kwargs(self, url: Optional[str], token: Optional[str], timeout: TimeoutTypes) -> Dict[str, Any]:
        self.endpoint = resolve_endpoint(url, token)
        return {
            "base_url": self.endpoint.base_url,
            "headers": self.endpoint.headers(),
            "timeout": DEFAULT_TIMEOUT if timeout is None else timeout,
        }

    def _request_kwargs(self, request: _ops.Request) -> Dict[str, Any]:
        headers = dict(request.headers)
        body = request.content
        if request.json is not None:
            body = json.dumps(request.json, separators=(",", ":")).encode("utf-8")
            headers.setdefault("Content-Type", "application/json")
        kwargs: Dict[str, Any] = {"params": request.params, "headers": headers}
        if body is not None:
            if len(body) > _CHUNK:
                # httpcore re-slices the rest of a body after every send(), which is
                # quadratic: a 64 MiB body takes tens of seconds. Send it in chunks.
                headers["Content-Length"] = str(len(body))
                kwargs["content"] = self._chunks(body)
            else:
                kwargs["content"] = body
        return kwargs

    def _chunks(self, body: bytes) -> Any:
        raise NotImplementedError

    def _transport_error(self, request: _ops.Request, exc: httpx.TransportError) -> ForkvmError:
        what = f"{request.method} {request.path}"
        if isinstance(exc, httpx.TimeoutException):
            return ClientTimeout(f"{what} timed out on the client side ({type(exc).__name__})", code="client_timeout")
        if isinstance(exc, httpx.ConnectError):
            return DaemonUnreachable(
                f"cannot reach the forkvm daemon at {self.endpoint.display}: {exc}; "
                "start it with `forkvm serve`, or set FORKVM_URL",
                code="unreachable",
            )
        return DaemonUnreachable(
            f"{what}: the connection to the daemon at {self.endpoint.display} failed: {exc}",
            code="connection_failed",
        )

    @staticmethod
    def _finish(request: _ops.Request, response: httpx.Response) -> Any:
        if response.is_error:
            raise error_from_response(response)
        return request.parse(response)

    @staticmethod
    def _parse_stream_fallback(response: httpx.Response) -> models.ExecResult:
        return _ops._model(models.ExecResult)(response)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint.display!r})"


class Client(_BaseClient):
    """A synchronous connection to a forkvm daemon.

    ``url`` and ``token`` default to ``FORKVM_URL`` and ``FORKVM_TOKEN``; with
    neither, the client uses the unix socket ``$FORKVM_HOME/forkvm.sock``.
    ``timeout`` (seconds or an :class:`httpx.Timeout`) applies to every
    request but exec, which waits as long as the command may run.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: TimeoutTypes = None,
    ) -> None:
        kwargs = self._httpx_kwargs(url, token, timeout)
        transport = httpx.HTTPTransport(uds=self.endpoint.uds) if self.endpoint.uds else None
        self._http = httpx.Client(transport=transport, **kwargs)

    # -- plumbing ----------------------------------------------------------

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    @property
    def is_closed(self) -> bool:
        return self._http.is_closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _chunks(self, body: bytes) -> Iterator[bytes]:
        view = memoryview(body)
        for start in range(0, len(body), _CHUNK):
            yield bytes(view[start : start + _CHUNK])

    def _build(self, request: _ops.Request) -> httpx.Request:
        return self._http.build_request(
            request.method,
            request.path,
            timeout=request.timeout if request.timeout is not None else httpx.USE_CLIENT_DEFAULT,
            **self._request_kwargs(request),
        )

    def _send(self, request: _ops.Request) -> Any:
        try:
            response = self._http.send(self._build(request))
        except httpx.TransportError as e:
            raise self._transport_error(request, e) from e
        return self._finish(request, response)

    def _open_stream(self, request: _ops.Request) -> httpx.Response:
        try:
            response = self._http.send(self._build(request), stream=True)
        except httpx.TransportError as e:
            raise self._transport_error(request, e) from e
        if response.is_error:
            try:
                response.read()
            finally:
                response.close()
            raise _streaming_refused(error_from_response(response))
        return response

    # -- daemon ------------------------------------------------------------

    def health(self) -> models.Health:
        """``GET /v1/health``: liveness."""
        return self._send(_ops.health())

    def info(self) -> models.Info:
        """``GET /v1/info``: version, accelerator, QEMU, limits, images, pools, networking."""
        return self._send(_ops.info())

    # -- sandboxes ---------------------------------------------------------

    def list_sandboxes(self) -> models.SandboxList:
        """``GET /v1/sandboxes``: all sandboxes, in any state."""
        return self._send(_ops.list_sandboxes())

    def create_sandbox(
        self,
        *,
        image: Optional[str] = None,
        memory_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        snapshot: Optional[str] = None,
        count: Optional[int] = None,
        use_template: Optional[bool] = None,
        network: Union[models.NetworkMode, str, None] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        egress: Optional[Iterable[EgressSpec]] = None,
        wait_for_network: Optional[bool] = None,
    ) -> Union[models.Sandbox, models.SandboxBatch]:
        """``POST /v1/sandboxes``: start a sandbox, or ``count`` of them.

        Returns a :class:`~forkvm.models.Sandbox`, or a
        :class:`~forkvm.models.SandboxBatch` when ``count`` is given.

        ``network`` is ``"nat"`` (the daemon's default where the host allows
        it) or ``"none"``. ``ports`` publishes guest TCP ports on host
        loopback ports: ``[8000]``, ``[(8000, 18000)]`` or
        ``[{"guest": 8000, "host": 18000}]`` (host 0 or omitted: allocated;
        see ``network.ports`` of the answer). ``egress`` allows connections
        only to these destinations: ``["10.0.0.0/8", {"cidr": "1.2.3.4",
        "ports": [443]}]``. Both need ``nat``. ``wait_for_network=False``
        answers before the guest's network is proven to work.
        """
        body = _ops.create_request(
            image=image,
            memory_mib=memory_mib,
            cpus=cpus,
            snapshot=snapshot,
            count=count,
            use_template=use_template,
            network=network,
            ports=ports,
            egress=egress,
            wait_for_network=wait_for_network,
        )
        return self._send(_ops.create_sandbox(body))

    def get_sandbox(self, id: str) -> models.Sandbox:
        """``GET /v1/sandboxes/{id}``: one sandbox, with its memory use."""
        return self._send(_ops.get_sandbox(id))

    def delete_sandbox(self, id: str) -> None:
        """``DELETE /v1/sandboxes/{id}``: stop it and delete everything it had."""
        self._send(_ops.delete_sandbox(id))

    def branch_sandbox(
        self,
        id: str,
        *,
        mode: Union[models.BranchMode, str, None] = None,
        count: Optional[int] = None,
        tag: Optional[str] = None,
        wait: Optional[bool] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        wait_for_network: Optional[bool] = None,
    ) -> models.BranchResult:
        """``POST /v1/sandboxes/{id}/branch``: snapshot it now and spawn ``count`` children.

        Each child publishes ``ports`` (as for :meth:`create_sandbox`);
        without them, the source's guest ports on newly allocated host ports.
        Children keep the source's network mode and egress allow-list.
        """
        body = _ops.branch_request(
            mode=mode, count=count, tag=tag, wait=wait, ports=ports, wait_for_network=wait_for_network
        )
        return self._send(_ops.branch_sandbox(id, body))

    def exec(
        self,
        id: str,
        argv: Union[str, Sequence[str]],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        stdin_base64: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        encoding: Union[models.OutputEncoding, str, None] = None,
    ) -> models.ExecResult:
        """``POST /v1/sandboxes/{id}/exec``: run a command and wait for it.

        ``argv`` is a list, or a string run with ``sh -c``. Bytes ``stdin`` is
        sent as ``stdin_base64``.
        """
        body = _ops.exec_request(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdin_base64=stdin_base64,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            encoding=encoding,
        )
        return self._send(_ops.exec_(id, body))

    def exec_stream(
        self,
        id: str,
        argv: Union[str, Sequence[str]],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        stdin_base64: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> ExecStream:
        """``POST /v1/sandboxes/{id}/exec`` with ``"stream": true``: iterate over output events.

        Raises :class:`~forkvm.StreamingUnsupported` (when iterated) against a
        daemon without streaming exec.
        """
        body = _ops.exec_request(argv, env=env, cwd=cwd, stdin=stdin, stdin_base64=stdin_base64, timeout_ms=timeout_ms)
        return ExecStream(self, _ops.exec_stream(id, body))

    def read_file(self, id: str, path: str) -> bytes:
        """``GET /v1/sandboxes/{id}/files?path=``: a guest file's bytes."""
        return self._send(_ops.read_file(id, path))

    def write_file(
        self, id: str, path: str, data: Union[bytes, str], *, mode: Union[int, str, None] = None
    ) -> models.FileWritten:
        """``PUT /v1/sandboxes/{id}/files?path=&mode=``: write a guest file atomically.

        ``mode`` is an int (``0o755``) or an octal string (``"755"``); default 644.
        """
        return self._send(_ops.write_file(id, path, data, mode))

    def logs(self, id: str) -> str:
        """``GET /v1/sandboxes/{id}/logs``: the serial console (the last 1 MiB)."""
        return self._send(_ops.logs(id))

    def ports(self, id: str) -> List[models.PortForward]:
        """``GET /v1/sandboxes/{id}/ports``: its published ports, guest port and host loopback port.

        Empty for a sandbox without a ``nat`` network.
        """
        return self._send(_ops.ports(id))

    def snapshot_sandbox(self, id: str, *, tag: Optional[str] = None) -> models.Snapshot:
        """``POST /v1/sandboxes/{id}/snapshot``: snapshot a running sandbox; it keeps running."""
        return self._send(_ops.snapshot_sandbox(id, models.CreateSnapshot(tag)))

    # -- snapshots ---------------------------------------------------------

    def list_snapshots(self) -> models.SnapshotList:
        """``GET /v1/snapshots``: all snapshots."""
        return self._send(_ops.list_snapshots())

    def get_snapshot(self, id: str) -> models.Snapshot:
        """``GET /v1/snapshots/{id}``: one snapshot, by id or tag."""
        return self._send(_ops.get_snapshot(id))

    def delete_snapshot(self, id: str, *, force: bool = False) -> None:
        """``DELETE /v1/snapshots/{id}``: 409 while others depend on it, unless ``force``."""
        self._send(_ops.delete_snapshot(id, force))

    def flatten_snapshot(self, id: str, *, tag: Optional[str] = None) -> models.Snapshot:
        """``POST /v1/snapshots/{id}/flatten``: merge a diff chain into one standalone snapshot."""
        return self._send(_ops.flatten_snapshot(id, models.FlattenRequest(tag)))

    def set_pool(self, id: str, size: Optional[int]) -> models.Snapshot:
        """``PUT /v1/snapshots/{id}/pool``: keep ``size`` QEMU processes waiting (0: off;
        ``None``: follow the daemon's default, ``serve --pool-size``)."""
        return self._send(_ops.set_pool(id, models.PoolConfig(size)))

    def pin_snapshot(self, id: str) -> models.Snapshot:
        """``PUT /v1/snapshots/{id}/pin``: garbage collection keeps it and what it builds on."""
        return self._send(_ops.pin_snapshot(id))

    def unpin_snapshot(self, id: str) -> models.Snapshot:
        """``DELETE /v1/snapshots/{id}/pin``: garbage collection may take it once nothing needs it."""
        return self._send(_ops.unpin_snapshot(id))

    def prune_snapshots(self, *, all: Optional[bool] = None, dry_run: Optional[bool] = None) -> models.PruneResult:
        """``POST /v1/snapshots/prune``: remove the branch points nothing needs, past the grace
        period (or however young, with ``all``); ``dry_run`` only lists them."""
        return self._send(_ops.prune_snapshots(models.PruneRequest(all=all, dry_run=dry_run)))


_default: Optional[Client] = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide :class:`Client` used when none is given (from the environment)."""
    global _default
    with _default_lock:
        if _default is None or _default.is_closed:
            _default = Client()
        return _default


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()
