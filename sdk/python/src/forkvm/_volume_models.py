"""Typed models of volumes: host directories and named volumes mounted into
sandboxes (docs/volumes.md). Re-exported by :mod:`forkvm.models` (see there
for how models convert from and to JSON).

A spawn's ``volumes`` lists :class:`VolumeMount`\\ s: a ``source`` (an
absolute host directory, or the name of a volume made with
``POST /v1/volumes``), the guest ``path`` it appears at, ``read_only``, and
what a branch or a snapshot does with it (:class:`VolumeMode`). A sandbox
shows them as :class:`MountedVolume`\\ s, with the ``host_path`` its guest
reads and writes. The CLI's ``--volume SOURCE:GUEST_PATH[:OPTIONS]`` form is
parsed by :func:`parse_volume` (the same rules as the daemon's Rust
``VolumeMount::parse``), and the SDK accepts it wherever it takes a volume.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional, Union

from .models import Model, _StrEnum

# The models (re-exported by forkvm.models); the helpers below are imported by name.
__all__ = ["CreateVolume", "MountedVolume", "Volume", "VolumeList", "VolumeMode", "VolumeMount"]


class VolumeMode(_StrEnum):
    """What children of a branch (and sandboxes spawned from a snapshot) see of a volume."""

    #: Every child serves the same host directory: a write by one is seen by all, and by the host.
    SHARED = "shared"
    #: Each child gets its own copy-on-write copy of the directory as it was at the branch instant.
    COPY = "copy"


@dataclass
class VolumeMount(Model):
    """One volume of a spawn (``CreateSandbox.volumes``).

    ``source`` is an absolute host directory or a named volume's name;
    ``path`` the absolute guest path it appears at (not ``/``);
    ``read_only`` refuses every write (``EROFS`` in the guest); ``uid`` and
    ``gid`` are the owner every entry shows in the guest (default 0, and
    ``gid`` defaults to ``uid``). ``VolumeMount.parse("/srv/repo:/work:ro")``
    reads the CLI form.
    """

    source: str
    path: str
    read_only: bool = False
    mode: VolumeMode = VolumeMode.SHARED
    uid: Optional[int] = None
    gid: Optional[int] = None

    @classmethod
    def parse(cls, spec: str) -> "VolumeMount":
        """``SOURCE:GUEST_PATH[:OPTIONS]`` as a :class:`VolumeMount` (see :func:`parse_volume`)."""
        return parse_volume(spec)


@dataclass
class MountedVolume(Model):
    """A volume as a sandbox shows it: its :class:`VolumeMount` fields and ``host_path``.

    ``host_path`` is the host directory this sandbox's guest reads and
    writes: the source itself, or, for a ``copy`` volume of a branch child,
    its own copy.
    """

    source: str
    path: str
    host_path: str
    read_only: bool = False
    mode: VolumeMode = VolumeMode.SHARED
    uid: Optional[int] = None
    gid: Optional[int] = None

    @property
    def mount(self) -> VolumeMount:
        """The volume as a spawn asks for it (without ``host_path``)."""
        return VolumeMount(self.source, self.path, self.read_only, self.mode, self.uid, self.gid)


@dataclass
class CreateVolume(Model):
    """``POST /v1/volumes``: a named volume. ``name``: 1 to 64 letters, digits,
    ``.``, ``_`` or ``-``, not starting with ``.`` or ``-``."""

    name: str


@dataclass
class Volume(Model):
    """A named volume: a directory under the daemon's home.

    ``path`` is that directory; ``created_at`` RFC 3339; ``used_by`` the ids
    of the running or paused sandboxes that mount it (while there are any,
    it cannot be deleted).
    """

    name: str
    path: str
    created_at: str
    used_by: List[str] = dataclasses.field(default_factory=list)


@dataclass
class VolumeList(Model):
    """``GET /v1/volumes``."""

    volumes: List[Volume]


# --------------------------------------------------------------------------
# The CLI form, and volumes from friendly arguments.

_USAGE = (
    "use SOURCE:GUEST_PATH[:OPTIONS], for example /home/me/repo:/work:ro or "
    "data:/data:copy (OPTIONS: ro, rw, shared, copy, uid=N, gid=N)"
)
_U32 = re.compile(r"\+?[0-9]+")


def parse_volume(spec: str) -> VolumeMount:
    """Parse ``SOURCE:GUEST_PATH[:OPTIONS]``, the CLI's ``--volume`` form.

    OPTIONS is a comma-separated list of ``ro``, ``rw``, ``shared``,
    ``copy``, ``uid=N`` and ``gid=N`` (later ones win)::

        parse_volume("/srv/repo:/work:ro")         # VolumeMount("/srv/repo", "/work", read_only=True)
        parse_volume("data:/data:copy,uid=1000")   # the named volume "data", copied into branches

    An empty source or path, an unknown option or a bad number raises
    :class:`ValueError`. Whether the source exists, and whether the path is
    allowed, is for the daemon to say (:class:`~forkvm.InvalidRequest`).
    """
    if not isinstance(spec, str):
        raise TypeError(f"a volume string is SOURCE:GUEST_PATH[:OPTIONS], not {spec!r}")
    parts = spec.split(":", 2)
    source = parts[0]
    path = parts[1] if len(parts) > 1 else ""
    if not source or not path:
        raise ValueError(f"bad volume {spec!r}: {_USAGE}")
    mount = VolumeMount(source=source, path=path)
    for opt in (parts[2] if len(parts) > 2 else "").split(","):
        if opt == "":
            continue
        elif opt in ("ro", "rw"):
            mount.read_only = opt == "ro"
        elif opt in ("shared", "copy"):
            mount.mode = VolumeMode(opt)
        elif opt.startswith(("uid=", "gid=")):
            value = opt[4:]
            if not _U32.fullmatch(value) or int(value) > 0xFFFF_FFFF:
                raise ValueError(f"bad volume option {opt!r} in {spec!r}: {_USAGE}")
            setattr(mount, opt[:3], int(value))
        else:
            raise ValueError(f"unknown volume option {opt!r} in {spec!r}: {_USAGE}")
    return mount


#: A volume of a spawn: a :class:`VolumeMount`, the CLI string
#: ``"SOURCE:GUEST_PATH[:OPTIONS]"``, a mapping of :class:`VolumeMount`'s
#: fields (``{"source": "/srv/repo", "path": "/work", "read_only": True}``),
#: or a sandbox's :class:`MountedVolume` (its ``host_path`` is left out).
VolumeSpec = Union[str, Mapping[str, Any], VolumeMount, MountedVolume]

_FIELDS = {f.name for f in dataclasses.fields(VolumeMount)}


def volume_mount(spec: VolumeSpec) -> VolumeMount:
    """One :data:`VolumeSpec` as a :class:`VolumeMount`."""
    if isinstance(spec, VolumeMount):
        return spec
    if isinstance(spec, MountedVolume):
        return spec.mount
    if isinstance(spec, str):
        return parse_volume(spec)
    if isinstance(spec, Mapping):
        unknown = set(spec) - _FIELDS
        if unknown or "source" not in spec or "path" not in spec:
            raise ValueError(
                "a volume is {'source': ..., 'path': ..., 'read_only': ..., 'mode': ..., 'uid': ..., 'gid': ...}"
                f" (source and path required), not {dict(spec)!r}"
            )
        out = VolumeMount(source=str(spec["source"]), path=str(spec["path"]))
        if spec.get("read_only") is not None:
            out.read_only = bool(spec["read_only"])
        if spec.get("mode") is not None:
            out.mode = VolumeMode(spec["mode"])
        for key in ("uid", "gid"):
            if spec.get(key) is not None:
                setattr(out, key, int(spec[key]))
        return out
    raise TypeError(f"a volume is 'SOURCE:GUEST_PATH[:OPTIONS]', a mapping or a VolumeMount, not {spec!r}")


def volume_mounts(specs: Optional[Iterable[VolumeSpec]]) -> Optional[List[VolumeMount]]:
    """``volumes`` of a spawn as :class:`VolumeMount`\\ s (``None`` stays ``None``)."""
    if specs is None:
        return None
    if isinstance(specs, (str, Mapping, VolumeMount, MountedVolume)):
        raise TypeError("volumes is a list, e.g. volumes=['/srv/repo:/work:ro']")
    return [volume_mount(v) for v in specs]
