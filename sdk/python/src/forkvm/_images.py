"""The client side of the image operations that both clients share (written
by hand, like ``_base.py``): reading the NDJSON progress stream, and packing
what an upload sends.

Progress protocol: ``POST /v1/images`` with ``"stream": true``, and always
``POST /v1/images/import`` and ``POST /v1/images/build``, answer with
``application/x-ndjson``, one :class:`~forkvm.models.ImageEvent` per line::

    {"type": "phase", "phase": "fetching"}
    {"type": "progress", "item": "sha256:...", "done": 1048576, "total": 3145728}
    {"type": "cached", "item": "sha256:..."}
    {"type": "step", "index": 2, "total": 5, "text": "RUN make", "cached": false}
    {"type": "log", "line": "..."}
    {"type": "done", "image": {...}}                       (the last line), or
    {"type": "error", "error": {"code": "...", "message": "..."}}

A stream that ends without ``done`` or ``error`` is a
:class:`~forkvm.ProtocolError` (the connection broke, or the daemon died).

Uploads: the body of an import is the archive file, streamed from disk; a
directory (an OCI image layout) is first packed into a temporary tar. The
body of a build is its context directory packed into a temporary tar, with
the Dockerfile's text added as :data:`DOCKERFILE_IN_CONTEXT` (the name the
build's ``dockerfile`` parameter then gives), so a Dockerfile from outside
the context works too. Symbolic links are packed as links, never followed.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, Union

from . import models
from .errors import ProtocolError, error_from_detail

__all__ = [
    "DOCKERFILE_IN_CONTEXT",
    "ImageEventCallback",
    "build_query",
    "image_outcome",
    "import_query",
    "pack_directory",
    "parse_image_event",
    "prepare_build",
    "prepare_import",
    "remove_temporary",
    "start_command",
    "stream_ended",
]

#: The name the Dockerfile travels under in a build context tar (as the CLI sends it).
DOCKERFILE_IN_CONTEXT = ".forkvm-dockerfile"

#: Called with each progress event (in the asyncio flavour it may be a coroutine function).
ImageEventCallback = Callable[[models.ImageEvent], Any]

PathLike = Union[str, "os.PathLike[str]"]


def parse_image_event(line: Union[str, bytes]) -> Optional[models.ImageEvent]:
    """One NDJSON line as an event; ``None`` for a blank line.

    Raises :class:`~forkvm.ProtocolError` for a line that is not an event object.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise ValueError("not an object with a type")
        return models.ImageEvent.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ProtocolError(f"bad line in an image progress stream: {line[:200]!r} ({e})", code="bad_response") from e


def image_outcome(event: models.ImageEvent) -> Optional[models.Image]:
    """The image of a ``done`` event; raise the error of an ``error`` event; ``None`` for the others.

    The error is the :class:`~forkvm.ForkvmError` subclass of its code
    (e.g. :class:`~forkvm.InvalidImage`), with ``status`` ``None`` as for an
    error inside an exec stream: the HTTP status of the response was 200.
    """
    if event.type == "done":
        if event.image is None:
            raise ProtocolError("a `done` line without its image in an image progress stream", code="bad_response")
        return event.image
    if event.type == "error":
        detail = event.error or models.ErrorDetail("error", "the image operation failed")
        raise error_from_detail(detail.code, detail.message)
    return None


def stream_ended() -> ProtocolError:
    """The error for a progress stream that ended before its ``done`` or ``error`` line."""
    return ProtocolError(
        "the image progress stream ended before its result (the connection broke, or the daemon stopped); "
        "list the images to see whether it was installed",
        code="bad_response",
    )


# --------------------------------------------------------------------------
# Query strings.


def import_query(
    path: PathLike, name: str, *, disk_size: Optional[int] = None, replace: bool = False
) -> models.ImportQuery:
    """The query of an import of ``path`` (its file name goes along for the record)."""
    if not name:
        raise ValueError("an imported image needs a name")
    file = os.path.basename(os.path.normpath(os.fspath(path))) or None
    return models.ImportQuery(name=name, file=file, disk_size=disk_size, replace=True if replace else None)


def build_query(
    tag: str,
    *,
    build_args: Optional[Mapping[str, str]] = None,
    no_cache: bool = False,
    target: Optional[str] = None,
    disk_size: Optional[int] = None,
    memory_mib: Optional[int] = None,
) -> models.BuildQuery:
    """The query of a build whose context tar holds the Dockerfile as :data:`DOCKERFILE_IN_CONTEXT`."""
    if not tag:
        raise ValueError("a build needs a tag (the image's name)")
    args = None
    if build_args:
        if isinstance(build_args, (str, bytes)) or not isinstance(build_args, Mapping):
            raise TypeError(f"build_args is a mapping of names to values, not {build_args!r:.100}")
        args = json.dumps({str(k): str(v) for k, v in build_args.items()}, separators=(",", ":"), sort_keys=True)
    return models.BuildQuery(
        tag=tag,
        dockerfile=DOCKERFILE_IN_CONTEXT,
        build_args=args,
        no_cache=True if no_cache else None,
        target=target or None,
        disk_size=disk_size,
        memory_mib=memory_mib,
    )


# --------------------------------------------------------------------------
# Packing.


def pack_directory(directory: PathLike, dockerfile: Optional[bytes] = None) -> str:
    """Pack ``directory``'s contents into a new temporary tar and return its path.

    Entries are named relative to the directory (``index.json``,
    ``blobs/sha256/...``); symbolic links stay links. With ``dockerfile``,
    its text is added as :data:`DOCKERFILE_IN_CONTEXT` (replacing a file of
    that name in the directory). The caller removes the file
    (:func:`remove_temporary`).
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory} is not a directory")
    fd, tmp = tempfile.mkstemp(prefix="forkvm-upload-", suffix=".tar")

    def not_the_tar_itself(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        # The temporary directory may lie inside the directory packed.
        return None if os.path.abspath(os.path.join(directory, info.name)) == os.path.abspath(tmp) else info

    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(os.listdir(directory)):
                if dockerfile is not None and name == DOCKERFILE_IN_CONTEXT:
                    continue
                # tarfile recurses in sorted order and does not follow links.
                tar.add(os.path.join(directory, name), arcname=name, recursive=True, filter=not_the_tar_itself)
            if dockerfile is not None:
                info = tarfile.TarInfo(DOCKERFILE_IN_CONTEXT)
                info.size = len(dockerfile)
                info.mode = 0o644
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(dockerfile))
    except BaseException:
        remove_temporary(tmp)
        raise
    return tmp


def remove_temporary(path: Optional[str]) -> None:
    """Remove a temporary tar made here (nothing for ``None``, or one already gone)."""
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def prepare_import(path: PathLike) -> Tuple[str, Optional[str]]:
    """What an import of ``path`` sends: ``(file to stream, temporary to remove afterwards)``.

    A file is sent as it is; a directory (an OCI image layout) is packed first.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        tmp = pack_directory(path)
        return tmp, tmp
    if os.path.isfile(path):
        return path, None
    raise FileNotFoundError(f"{path}: no such file or directory to import")


def prepare_build(context: PathLike, dockerfile: Optional[PathLike] = None) -> str:
    """Pack the build context ``context`` with the Dockerfile ``dockerfile``
    (default ``context/Dockerfile``) into a temporary tar; return its path."""
    context = os.fspath(context)
    if not os.path.isdir(context):
        raise NotADirectoryError(f"the build context {context} is not a directory")
    dockerfile = os.fspath(dockerfile) if dockerfile is not None else os.path.join(context, "Dockerfile")
    try:
        with open(dockerfile, "rb") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no Dockerfile at {dockerfile}; pass dockerfile=PATH") from e
    return pack_directory(context, text)


def start_command(
    start: Union[models.StartCommand, Mapping[str, Any], Sequence[str], None],
) -> Optional[models.StartCommand]:
    """A pull's ``start``: a :class:`~forkvm.models.StartCommand`, its fields as a mapping, or an argv."""
    if start is None or isinstance(start, models.StartCommand):
        return start
    if isinstance(start, Mapping):
        return models.StartCommand.from_dict(start)
    if isinstance(start, (str, bytes)):
        raise TypeError("start is an argv list (or a StartCommand), not a string")
    return models.StartCommand(command=[str(a) for a in start])
