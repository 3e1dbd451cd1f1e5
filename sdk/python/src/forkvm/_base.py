"""What the synchronous and asynchronous clients share: the endpoint, request
building, and turning transport failures and error answers into
:class:`~forkvm.ForkvmError` subclasses. Written by hand (the clients
themselves are one async source and its generated sync rewrite)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Union

import httpx

from . import _ops, models
from ._config import DEFAULT_TIMEOUT, Endpoint, resolve_endpoint
from .errors import (
    ClientTimeout,
    DaemonUnreachable,
    ForkvmError,
    InvalidRequest,
    StreamingUnsupported,
    error_from_response,
)

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
        elif request.upload is not None:
            # Streamed from disk with its length known up front, so an archive of
            # gigabytes never sits in memory and the daemon can tell a cut-off upload.
            headers["Content-Length"] = str(os.path.getsize(request.upload))
            kwargs["content"] = self._file_chunks(request.upload)
        return kwargs

    def _chunks(self, body: bytes) -> Any:
        raise NotImplementedError

    def _file_chunks(self, path: str) -> Any:
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
