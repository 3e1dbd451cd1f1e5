"""The API operations as transport-free request descriptions.

Each function here builds a :class:`Request` for one ``operationId`` of the
OpenAPI document: method, path, query, body, and how to parse the answer.
:class:`~forkvm.Client` and :class:`~forkvm.AsyncClient` only send them, so
both clients build identical requests.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union
from urllib.parse import quote

import httpx

from . import models
from ._config import EXEC_GRACE_SECONDS
from ._resource_models import sandbox_limits
from ._volume_models import VolumeSpec, volume_mounts
from .errors import ProtocolError

Parser = Callable[[httpx.Response], Any]


def _none(response: httpx.Response) -> None:
    return None


@dataclass
class Request:
    """One HTTP request to the daemon, and how to read its answer."""

    method: str
    path: str
    parse: Parser = _none
    params: Optional[Dict[str, str]] = None
    json: Any = None
    content: Optional[bytes] = None
    #: A file sent as the body, streamed from disk (never read whole).
    upload: Optional[str] = None
    headers: Dict[str, str] = field(default_factory=dict)
    #: ``None`` means the client's default timeout; otherwise an httpx timeout.
    timeout: Optional[httpx.Timeout] = None


def _json(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError as e:
        raise ProtocolError(
            f"the daemon answered {response.request.method} {response.request.url.path} "
            f"with a body that is not JSON: {response.text[:200]!r}",
            code="bad_response",
            status=response.status_code,
        ) from e


def _model(cls: Type[models.Model]) -> Parser:
    def parse(response: httpx.Response) -> Any:
        data = _json(response)
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"unexpected {cls.__name__} from the daemon: {e}", code="bad_response") from e

    return parse


def _model_list(cls: Type[models.Model]) -> Parser:
    def parse(response: httpx.Response) -> Any:
        data = _json(response)
        if not isinstance(data, list):
            raise ProtocolError(
                f"expected a list of {cls.__name__} from the daemon, got {data!r:.200}", code="bad_response"
            )
        try:
            return [cls.from_dict(item) for item in data]
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"unexpected {cls.__name__} from the daemon: {e}", code="bad_response") from e

    return parse


def _created(response: httpx.Response) -> Union[models.Sandbox, models.SandboxBatch]:
    data = _json(response)
    cls = models.SandboxBatch if isinstance(data, dict) and "sandboxes" in data else models.Sandbox
    return cls.from_dict(data)


def _seg(value: str) -> str:
    """A path segment (ids and tags), percent-encoded."""
    if not value:
        raise ValueError("an id or tag must not be empty")
    return quote(str(value), safe="")


def _file_mode(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, int):
        return format(mode, "o")
    return mode


#: The HTTP timeout of the image operations and of snapshot push and pull: they
#: take as long as a transfer, an upload or a build does (the daemon reports
#: progress meanwhile).
IMAGE_TIMEOUT = httpx.Timeout(None, connect=10.0)

#: How the NDJSON progress streams are asked for.
_NDJSON = {"Accept": "application/x-ndjson"}


def query_params(query: models.Model) -> Dict[str, str]:
    """A query model as query-string parameters: unset fields left out, booleans as ``true``/``false``."""
    out: Dict[str, str] = {}
    for key, value in query.to_dict().items():
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def exec_timeout(timeout_ms: Optional[int], default_read: Optional[float] = None) -> httpx.Timeout:
    """An HTTP timeout for an exec: its own timeout plus a grace, else none."""
    read = timeout_ms / 1000.0 + EXEC_GRACE_SECONDS if timeout_ms is not None else default_read
    return httpx.Timeout(read, connect=10.0)


# --------------------------------------------------------------------------
# One builder per operationId.


def health() -> Request:
    return Request("GET", "/v1/health", _model(models.Health))


def info() -> Request:
    return Request("GET", "/v1/info", _model(models.Info))


def metrics() -> Request:
    return Request("GET", "/metrics", lambda r: r.text, headers={"Accept": "text/plain"})


#: The query parameters of a metadata filter are ``metadata.KEY=VALUE``.
METADATA_QUERY_PREFIX = "metadata."


def metadata_query(metadata: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """A metadata filter as query parameters (``{"team": "a"}`` -> ``{"metadata.team": "a"}``)."""
    if not metadata:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata is a mapping of strings, e.g. {{'team': 'a'}}, not {metadata!r}")
    return {METADATA_QUERY_PREFIX + str(k): str(v) for k, v in metadata.items()}


def list_sandboxes(metadata: Optional[Mapping[str, str]] = None) -> Request:
    return Request("GET", "/v1/sandboxes", _model(models.SandboxList), params=metadata_query(metadata))


def create_sandbox(body: models.CreateSandbox) -> Request:
    return Request("POST", "/v1/sandboxes", _created, json=body.to_dict())


def get_sandbox(id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{_seg(id)}", _model(models.Sandbox))


def delete_sandbox(id: str) -> Request:
    return Request("DELETE", f"/v1/sandboxes/{_seg(id)}")


def branch_sandbox(id: str, body: models.BranchRequest) -> Request:
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/branch", _model(models.BranchResult), json=body.to_dict())


def set_timeout(id: str, body: models.SetTimeout) -> Request:
    return Request("PUT", f"/v1/sandboxes/{_seg(id)}/timeout", _model(models.Sandbox), json=body.to_dict())


def set_network(id: str, body: models.SetNetwork) -> Request:
    return Request("PUT", f"/v1/sandboxes/{_seg(id)}/network", _model(models.NetworkInfo), json=body.to_dict())


def pause(id: str, body: Optional[models.PauseRequest] = None) -> Request:
    return Request(
        "POST",
        f"/v1/sandboxes/{_seg(id)}/pause",
        _model(models.Sandbox),
        json=body.to_dict() if body is not None else None,
    )


def resume(id: str, body: models.ResumeRequest) -> Request:
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/resume", _model(models.Sandbox), json=body.to_dict())


def checkpoint(id: str, body: models.CheckpointRequest) -> Request:
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/checkpoints", _model(models.Checkpoint), json=body.to_dict())


def get_timeline(id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{_seg(id)}/timeline", _model(models.Timeline))


def set_retention(id: str, body: models.Retention) -> Request:
    return Request(
        "PUT", f"/v1/sandboxes/{_seg(id)}/timeline/retention", _model(models.Timeline), json=body.to_dict()
    )


def rewind(id: str, body: models.RewindRequest) -> Request:
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/rewind", _model(models.Rewound), json=body.to_dict())


def diff(a: str, body: models.DiffRequest) -> Request:
    return Request("POST", f"/v1/diff/{_seg(a)}", _model(models.Diff), json=body.to_dict())


def merge(id: str, body: models.MergeRequest) -> Request:
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/merge", _model(models.Merged), json=body.to_dict())


def exec_(id: str, body: models.ExecRequest) -> Request:
    return Request(
        "POST",
        f"/v1/sandboxes/{_seg(id)}/exec",
        _model(models.ExecResult),
        json=body.to_dict(),
        timeout=exec_timeout(body.timeout_ms),
    )


def exec_stream(id: str, body: models.ExecRequest) -> Request:
    body.stream = True
    return Request(
        "POST",
        f"/v1/sandboxes/{_seg(id)}/exec",
        json=body.to_dict(),
        headers={"Accept": "application/x-ndjson"},
        timeout=exec_timeout(body.timeout_ms),
    )


def read_file(id: str, path: str) -> Request:
    return Request(
        "GET",
        f"/v1/sandboxes/{_seg(id)}/files",
        lambda r: r.content,
        params={"path": path},
        headers={"Accept": "application/octet-stream"},
    )


def write_file(id: str, path: str, data: Union[bytes, str], mode: Union[int, str, None] = None) -> Request:
    params = {"path": path}
    mode_str = _file_mode(mode)
    if mode_str is not None:
        params["mode"] = mode_str
    content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return Request(
        "PUT",
        f"/v1/sandboxes/{_seg(id)}/files",
        _model(models.FileWritten),
        params=params,
        content=content,
        headers={"Content-Type": "application/octet-stream"},
    )


def logs(id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{_seg(id)}/logs", lambda r: r.text, headers={"Accept": "text/plain"})


def ports(id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{_seg(id)}/ports", _model_list(models.PortForward))


def snapshot_sandbox(id: str, body: models.CreateSnapshot) -> Request:
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/snapshot", _model(models.Snapshot), json=body.to_dict())


def list_snapshots() -> Request:
    return Request("GET", "/v1/snapshots", _model(models.SnapshotList))


def get_snapshot(id: str) -> Request:
    return Request("GET", f"/v1/snapshots/{_seg(id)}", _model(models.Snapshot))


def delete_snapshot(id: str, force: bool = False) -> Request:
    return Request("DELETE", f"/v1/snapshots/{_seg(id)}", params={"force": "true"} if force else None)


def flatten_snapshot(id: str, body: models.FlattenRequest) -> Request:
    return Request("POST", f"/v1/snapshots/{_seg(id)}/flatten", _model(models.Snapshot), json=body.to_dict())


def set_pool(id: str, body: models.PoolConfig) -> Request:
    return Request("PUT", f"/v1/snapshots/{_seg(id)}/pool", _model(models.Snapshot), json=body.to_dict())


def pin_snapshot(id: str) -> Request:
    return Request("PUT", f"/v1/snapshots/{_seg(id)}/pin", _model(models.Snapshot))


def unpin_snapshot(id: str) -> Request:
    return Request("DELETE", f"/v1/snapshots/{_seg(id)}/pin", _model(models.Snapshot))


def prune_snapshots(body: models.PruneRequest) -> Request:
    return Request("POST", "/v1/snapshots/prune", _model(models.PruneResult), json=body.to_dict())


def push_snapshot(id: str, body: models.PushSnapshot) -> Request:
    """A push, streamed (the answer is read by the client's transfer stream, see ``_transfer.py``)."""
    body.stream = True
    return Request(
        "POST", f"/v1/snapshots/{_seg(id)}/push", json=body.to_dict(), headers=dict(_NDJSON), timeout=IMAGE_TIMEOUT
    )


def pull_snapshot(body: models.PullSnapshot) -> Request:
    """A pull, streamed (as :func:`push_snapshot`)."""
    body.stream = True
    return Request("POST", "/v1/snapshots/pull", json=body.to_dict(), headers=dict(_NDJSON), timeout=IMAGE_TIMEOUT)


def list_images() -> Request:
    return Request("GET", "/v1/images", _model(models.ImageList))


def get_image(name: str) -> Request:
    return Request("GET", f"/v1/images/{_seg(name)}", _model(models.Image))


def delete_image(name: str) -> Request:
    return Request("DELETE", f"/v1/images/{_seg(name)}")


def pull_image(body: models.PullImage) -> Request:
    body.stream = True
    return Request("POST", "/v1/images", json=body.to_dict(), headers=dict(_NDJSON), timeout=IMAGE_TIMEOUT)


def _upload(path: str, query: models.Model, tar: str) -> Request:
    return Request(
        "POST",
        path,
        params=query_params(query),
        upload=tar,
        headers={"Content-Type": "application/octet-stream", **_NDJSON},
        timeout=IMAGE_TIMEOUT,
    )


def import_image(query: models.ImportQuery, archive: str) -> Request:
    """Import the archive file ``archive`` (streamed as the body)."""
    return _upload("/v1/images/import", query, archive)


def build_image(query: models.BuildQuery, context_tar: str) -> Request:
    """Build from the context tar file ``context_tar`` (streamed as the body)."""
    return _upload("/v1/images/build", query, context_tar)


def list_volumes() -> Request:
    return Request("GET", "/v1/volumes", _model(models.VolumeList))


def create_volume(body: models.CreateVolume) -> Request:
    return Request("POST", "/v1/volumes", _model(models.Volume), json=body.to_dict())


def delete_volume(name: str) -> Request:
    return Request("DELETE", f"/v1/volumes/{_seg(name)}")


#: The event stream lasts as long as its reader; the daemon sends a keep-alive
#: every 15 s, so a minute of silence means the connection is dead.
EVENTS_TIMEOUT = httpx.Timeout(10.0, read=60.0)


def events(last_event_id: Optional[int] = None) -> Request:
    """``GET /v1/events``; ``Last-Event-ID`` resumes after that seq (the daemon replays what it kept)."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        if isinstance(last_event_id, bool) or not isinstance(last_event_id, int) or last_event_id < 0:
            raise TypeError(f"last_event_id is an event's seq (an int >= 0), not {last_event_id!r}")
        headers["Last-Event-ID"] = str(last_event_id)
    return Request("GET", "/v1/events", headers=headers, timeout=EVENTS_TIMEOUT)


# --------------------------------------------------------------------------
# Helpers for building network fields from friendly arguments.

#: A port to publish: a guest port (the host port is allocated), a
#: ``(guest, host)`` pair, a ``{"guest": ..., "host": ...}`` mapping (``host``
#: optional) or a :class:`~forkvm.models.PortForward`. Host port 0 means
#: "allocate one".
PortSpec = Union[int, Tuple[int, int], Mapping[str, int], models.PortForward]

#: ``limits``: a :class:`~forkvm.models.SandboxLimits`, or a mapping of its fields
#: (``{"disk_iops": 100, "net_kbps": 10000}``).
LimitsSpec = Union[models.SandboxLimits, Mapping[str, Any]]

#: An egress allow-list entry: an address or network as a string
#: (``"10.0.0.0/8"``: every port), a ``{"cidr": ..., "ports": [...]}``
#: mapping or a :class:`~forkvm.models.EgressRule`.
EgressSpec = Union[str, Mapping[str, Any], models.EgressRule]


def port_forward(spec: PortSpec) -> models.PortForward:
    """One :data:`PortSpec` as a :class:`~forkvm.models.PortForward`."""
    if isinstance(spec, models.PortForward):
        return spec
    if isinstance(spec, bool):
        raise TypeError(f"not a port: {spec!r}")
    if isinstance(spec, int):
        return models.PortForward(guest=spec)
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"guest", "host"}
        if unknown or "guest" not in spec:
            raise ValueError(f"a port is {{'guest': N, 'host': M}} (host optional), not {dict(spec)!r}")
        host = spec.get("host")
        return models.PortForward(guest=int(spec["guest"]), host=None if host is None else int(host))
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return models.PortForward(guest=int(spec[0]), host=int(spec[1]))
    raise TypeError(f"a port is a guest port, a (guest, host) pair or {{'guest': N, 'host': M}}, not {spec!r}")


def egress_rule(spec: EgressSpec) -> models.EgressRule:
    """One :data:`EgressSpec` as an :class:`~forkvm.models.EgressRule`."""
    if isinstance(spec, models.EgressRule):
        return spec
    if isinstance(spec, str):
        return models.EgressRule(cidr=spec)
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"cidr", "ports"}
        if unknown or "cidr" not in spec:
            raise ValueError(
                f"an egress rule is {{'cidr': 'A.B.C.D/N', 'ports': [...]}} (ports optional), not {dict(spec)!r}"
            )
        rule_ports = spec.get("ports")
        return models.EgressRule(
            cidr=str(spec["cidr"]), ports=None if rule_ports is None else [int(p) for p in rule_ports]
        )
    raise TypeError(f"an egress rule is a CIDR string or {{'cidr': ..., 'ports': [...]}}, not {spec!r}")


def port_forwards(specs: Optional[Iterable[PortSpec]]) -> Optional[List[models.PortForward]]:
    if specs is None:
        return None
    if isinstance(specs, (int, str, Mapping, models.PortForward)):
        raise TypeError("ports is a list of ports, e.g. ports=[8000] or ports=[{'guest': 8000}]")
    return [port_forward(p) for p in specs]


def egress_rules(specs: Optional[Iterable[EgressSpec]]) -> Optional[List[models.EgressRule]]:
    if specs is None:
        return None
    if isinstance(specs, (str, Mapping, models.EgressRule)):
        raise TypeError("egress is a list of rules, e.g. egress=['10.0.0.0/8']")
    return [egress_rule(e) for e in specs]


def network_mode(mode: Union[models.NetworkMode, str, None]) -> Optional[models.NetworkMode]:
    return models.NetworkMode(mode) if mode is not None else None


def on_timeout_mode(mode: Union[models.OnTimeout, str, None]) -> Optional[models.OnTimeout]:
    return models.OnTimeout(mode) if mode is not None else None


def string_map(name: str, value: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """``metadata`` or ``env`` as a dict of strings (``None`` stays ``None``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} is a mapping of strings, e.g. {{'KEY': 'value'}}, not {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def create_request(
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
    allow_host: Optional[bool] = None,
    wait_for_network: Optional[bool] = None,
    disk_size: Optional[int] = None,
    metadata: Optional[Mapping[str, str]] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[int] = None,
    on_timeout: Union[models.OnTimeout, str, None] = None,
    limits: Optional[LimitsSpec] = None,
    volumes: Optional[Iterable[VolumeSpec]] = None,
) -> models.CreateSandbox:
    """Build a :class:`~forkvm.models.CreateSandbox` from friendly arguments."""
    return models.CreateSandbox(
        image=image,
        memory_mib=memory_mib,
        cpus=cpus,
        snapshot=snapshot,
        count=count,
        use_template=use_template,
        network=network_mode(network),
        ports=port_forwards(ports),
        egress=egress_rules(egress),
        allow_host=allow_host,
        wait_for_network=wait_for_network,
        disk_size=disk_size,
        metadata=string_map("metadata", metadata),
        env=string_map("env", env),
        timeout=timeout,
        on_timeout=on_timeout_mode(on_timeout),
        limits=sandbox_limits(limits),
        volumes=volume_mounts(volumes),
    )


def branch_request(
    *,
    mode: Union[models.BranchMode, str, None] = None,
    count: Optional[int] = None,
    tag: Optional[str] = None,
    wait: Optional[bool] = None,
    ports: Optional[Iterable[PortSpec]] = None,
    wait_for_network: Optional[bool] = None,
    limits: Optional[LimitsSpec] = None,
    timeout: Optional[int] = None,
) -> models.BranchRequest:
    """Build a :class:`~forkvm.models.BranchRequest` from friendly arguments."""
    return models.BranchRequest(
        mode=models.BranchMode(mode) if mode is not None else None,
        count=count,
        tag=tag,
        wait=wait,
        ports=port_forwards(ports),
        wait_for_network=wait_for_network,
        limits=sandbox_limits(limits),
        timeout=timeout,
    )


# --------------------------------------------------------------------------
# Helpers for building exec requests from friendly arguments.


def exec_request(
    argv: Union[str, Sequence[str], None],
    *,
    cmd: Optional[Sequence[str]] = None,
    entrypoint: Optional[Sequence[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    stdin: Union[str, bytes, None] = None,
    stdin_base64: Optional[str] = None,
    timeout_ms: Optional[int] = None,
    max_output_bytes: Optional[int] = None,
    encoding: Union[models.OutputEncoding, str, None] = None,
) -> models.ExecRequest:
    """Build an :class:`~forkvm.models.ExecRequest`.

    A string command runs through ``sh -c``; an empty list runs the image's
    default command; ``cmd`` and ``entrypoint`` go instead of ``argv`` (the
    daemon refuses both); bytes ``stdin`` is sent as base64.
    """
    docker = cmd is not None or entrypoint is not None
    args: Optional[List[str]]
    if isinstance(argv, str):
        args = ["sh", "-c", argv]
    elif argv is None:
        args = None if docker else []
    else:
        args = [str(a) for a in argv]
    if docker and args:
        raise ValueError("give argv, or cmd and entrypoint, not both")
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        if stdin_base64 is not None:
            raise ValueError("give stdin or stdin_base64, not both")
        stdin_base64 = base64.b64encode(bytes(stdin)).decode("ascii")
        stdin = None
    return models.ExecRequest(
        argv=(args or None) if docker else args,
        cmd=[str(a) for a in cmd] if cmd is not None else None,
        entrypoint=[str(a) for a in entrypoint] if entrypoint is not None else None,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        user=user,
        stdin=stdin,
        stdin_base64=stdin_base64,
        timeout_ms=timeout_ms,
        max_output_bytes=max_output_bytes,
        encoding=models.OutputEncoding(encoding) if encoding is not None else None,
    )


def seconds_to_ms(timeout: Optional[float]) -> Optional[int]:
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("timeout must not be negative")
    return int(round(timeout * 1000))
