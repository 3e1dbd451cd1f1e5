"""The process and filesystem operations as transport-free requests (see
:mod:`forkvm._ops` for the others): one builder per ``operationId`` of
``docs/processes.md``, shared by the blocking and the asyncio clients."""

from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence, Tuple, Union

import httpx

from . import models
from ._ops import Request, _model, _seg
from .processes import SignalSpec, signal_number

#: Streams (attach, watch) wait as long as the process or the watch lasts.
STREAM_TIMEOUT = httpx.Timeout(None, connect=10.0)

_NDJSON = {"Accept": "application/x-ndjson"}
_OCTETS = {"Content-Type": "application/octet-stream"}

#: A terminal size: a :class:`~forkvm.models.PtySize`, ``(cols, rows)`` or ``{"cols": .., "rows": ..}``.
PtySpec = Union[models.PtySize, Tuple[int, int], Mapping[str, int]]


def pty_size(spec: Optional[PtySpec]) -> Optional[models.PtySize]:
    if spec is None or isinstance(spec, models.PtySize):
        return spec
    if isinstance(spec, Mapping):
        if set(spec) != {"cols", "rows"}:
            raise ValueError(f"a terminal size is {{'cols': C, 'rows': R}}, not {dict(spec)!r}")
        return models.PtySize(cols=int(spec["cols"]), rows=int(spec["rows"]))
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return models.PtySize(cols=int(spec[0]), rows=int(spec[1]))
    raise TypeError(f"a terminal size is (cols, rows) or {{'cols': C, 'rows': R}}, not {spec!r}")


def start_request(
    argv: Union[str, Sequence[str], None],
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    tag: Optional[str] = None,
    pty: Optional[PtySpec] = None,
    stdin: Optional[bool] = None,
) -> models.StartProcess:
    """A :class:`~forkvm.models.StartProcess`: a string runs with ``sh -c``; ``None`` or ``[]``
    runs the image's default command."""
    if isinstance(argv, str):
        args: Optional[list] = ["sh", "-c", argv]
    else:
        args = [str(a) for a in argv] if argv is not None else None
    return models.StartProcess(
        argv=args,
        env={str(k): str(v) for k, v in env.items()} if env is not None else None,
        cwd=cwd,
        user=user,
        tag=tag,
        pty=pty_size(pty),
        stdin=stdin,
    )


def _proc(id: str, process: Union[int, str]) -> str:
    return f"/v1/sandboxes/{_seg(id)}/processes/{_seg(str(process))}"


def start_process(id: str, body: models.StartProcess) -> Request:
    body.stream = None
    return Request("POST", f"/v1/sandboxes/{_seg(id)}/processes", _model(models.ProcessStarted), json=body.to_dict())


def start_process_stream(id: str, body: models.StartProcess) -> Request:
    body.stream = True
    path = f"/v1/sandboxes/{_seg(id)}/processes"
    return Request("POST", path, json=body.to_dict(), headers=dict(_NDJSON), timeout=STREAM_TIMEOUT)


def list_processes(id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{_seg(id)}/processes", _model(models.ProcessList))


def attach_process(id: str, process: Union[int, str]) -> Request:
    return Request("GET", _proc(id, process) + "/output", headers=dict(_NDJSON), timeout=STREAM_TIMEOUT)


def kill_process(id: str, process: Union[int, str]) -> Request:
    return Request("DELETE", _proc(id, process))


def signal_process(id: str, process: Union[int, str], signal: SignalSpec) -> Request:
    body = models.SignalProcess(signal=signal_number(signal))
    return Request("POST", _proc(id, process) + "/signal", json=body.to_dict())


def write_stdin(id: str, process: Union[int, str], data: Union[bytes, str]) -> Request:
    content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return Request("POST", _proc(id, process) + "/stdin", content=content, headers=dict(_OCTETS))


def close_stdin(id: str, process: Union[int, str]) -> Request:
    return Request("DELETE", _proc(id, process) + "/stdin")


def resize_pty(id: str, process: Union[int, str], size: models.PtySize) -> Request:
    return Request("PUT", _proc(id, process) + "/pty", json=size.to_dict())


# --------------------------------------------------------------------------
# Files


def _fs(id: str, op: str) -> str:
    return f"/v1/sandboxes/{_seg(id)}/fs/{op}"


def stat_file(id: str, path: str) -> Request:
    return Request("GET", _fs(id, "stat"), _model(models.EntryInfo), params={"path": path})


def file_exists(id: str, path: str) -> Request:
    return Request("GET", _fs(id, "exists"), _model(models.Exists), params={"path": path})


def list_dir(id: str, path: str, depth: Optional[int] = None) -> Request:
    params = {"path": path}
    if depth is not None:
        params["depth"] = str(int(depth))
    return Request("GET", _fs(id, "list"), _model(models.EntryList), params=params)


def make_dir(id: str, body: models.MakeDir) -> Request:
    return Request("POST", _fs(id, "mkdir"), _model(models.DirMade), json=body.to_dict())


def move_file(id: str, body: models.MoveFile) -> Request:
    return Request("POST", _fs(id, "move"), _model(models.EntryInfo), json=body.to_dict())


def remove_file(id: str, path: str) -> Request:
    return Request("DELETE", f"/v1/sandboxes/{_seg(id)}/files", params={"path": path})


def watch_dir(id: str, path: str, recursive: bool = False) -> Request:
    params = {"path": path, "recursive": "true" if recursive else "false"}
    return Request("GET", _fs(id, "watch"), params=params, headers=dict(_NDJSON), timeout=STREAM_TIMEOUT)


def create_watcher(id: str, body: models.CreateWatcher) -> Request:
    return Request("POST", _fs(id, "watchers"), _model(models.Watcher), json=body.to_dict())


def poll_watcher(id: str, watcher: str) -> Request:
    return Request("GET", f"{_fs(id, 'watchers')}/{_seg(watcher)}", _model(models.WatcherEvents))


def remove_watcher(id: str, watcher: str) -> Request:
    return Request("DELETE", f"{_fs(id, 'watchers')}/{_seg(watcher)}")


def download_archive(id: str, paths: Sequence[str]) -> Request:
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise ValueError("download_archive needs at least one path")
    return Request(
        "GET",
        f"/v1/sandboxes/{_seg(id)}/archive",
        lambda r: r.content,
        params=[("path", p) for p in paths],  # type: ignore[arg-type]
        headers={"Accept": "application/x-tar"},
        timeout=STREAM_TIMEOUT,
    )


def upload_archive(id: str, path: str, tar: Union[bytes, str, "os.PathLike[str]"]) -> Request:
    """Unpack a tar under ``path``: ``tar`` is its bytes, or the path of a local tar file (streamed)."""
    request = Request(
        "PUT",
        f"/v1/sandboxes/{_seg(id)}/archive",
        _model(models.ArchiveWritten),
        params={"path": path},
        headers=dict(_OCTETS),
        timeout=STREAM_TIMEOUT,
    )
    if isinstance(tar, (bytes, bytearray, memoryview)):
        request.content = bytes(tar)
    else:
        request.upload = os.fspath(tar)
    return request
