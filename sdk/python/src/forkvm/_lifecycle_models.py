"""Typed models of a sandbox's lifetime: timeouts, pause and resume.
Re-exported by :mod:`forkvm.models` (see there for how models convert from
and to JSON).

A sandbox may carry a timeout in seconds. When it runs out the daemon
removes the sandbox, or pauses it when ``on_timeout`` is ``pause`` (or
``pause_filesystem``). A paused sandbox is saved to disk and holds no RAM and
no QEMU; a resume brings it back with the same id, memory, disk, network and
published ports. A filesystem-only pause keeps the disk and not the memory,
and its resume cold-boots from that disk. Time spent paused does not count
against the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from .models import Model, _StrEnum

__all__ = ["Lifetime", "OnTimeout", "PauseInfo", "PauseRequest", "ResumeRequest", "SetTimeout", "MAX_TIMEOUT_S"]

#: The longest timeout a sandbox may have, in seconds (30 days).
MAX_TIMEOUT_S = 30 * 24 * 3600


class OnTimeout(_StrEnum):
    """What happens when a sandbox's timeout runs out."""

    #: Remove the sandbox and everything it had (the default).
    KILL = "kill"
    #: Pause it: it can be resumed later with its memory and disk.
    PAUSE = "pause"
    #: Pause it keeping only its disk: the resume cold-boots from that disk.
    PAUSE_FILESYSTEM = "pause_filesystem"


@dataclass
class Lifetime(Model):
    """A sandbox's timeout as the API shows it.

    ``timeout`` is the timeout last set (seconds); ``remaining_s`` counts
    down while the sandbox runs and is frozen while it is paused;
    ``expires_at`` (RFC 3339) is absent while paused.
    """

    timeout: int
    on_timeout: OnTimeout
    remaining_s: float
    expires_at: Optional[str] = None


@dataclass
class PauseInfo(Model):
    """A paused sandbox's saved state.

    ``snapshot`` holds it (origin ``pause``; removed with the sandbox;
    ``None`` for a filesystem-only pause, whose disk stays in the sandbox's
    own files); ``memory`` is ``False`` for a filesystem-only pause, whose
    resume cold-boots; ``reason`` is ``request`` or ``timeout``;
    ``memory_bytes`` and ``disk_bytes`` are what the pause stored (for a
    clone only the pages it changed since its snapshot); ``pause_ms`` is how
    long the vCPUs were stopped before QEMU went away.
    """

    paused_at: str
    reason: str
    memory_bytes: int
    disk_bytes: int
    pause_ms: float
    snapshot: Optional[str] = None
    memory: bool = True


@dataclass
class PauseRequest(Model):
    """``POST /v1/sandboxes/{id}/pause`` (the body is optional).

    ``memory`` ``False``: keep only the disk; no memory is saved and the
    resume cold-boots from the disk (same id, metadata, environment, network
    and published ports, none of the processes). Default: memory and disk.
    """

    memory: Optional[bool] = None


@dataclass
class SetTimeout(Model):
    """``PUT /v1/sandboxes/{id}/timeout``: a new timeout in seconds, counted from now.

    ``timeout`` ``None`` removes the timeout (it is sent as ``null``, not
    left out). On a paused sandbox it is the time it will have once resumed.
    ``on_timeout`` also changes what happens on expiry.
    """

    timeout: Optional[int] = None
    on_timeout: Optional[OnTimeout] = None

    def to_dict(self) -> Dict[str, Any]:
        out = super().to_dict()
        out.setdefault("timeout", None)
        return out


@dataclass
class ResumeRequest(Model):
    """``POST /v1/sandboxes/{id}/resume``.

    ``timeout``: a new timeout in seconds from the resume. Omitted: the time
    the sandbox had left when it was paused, or, when its timeout paused it,
    its whole timeout again. ``memory`` ``False``: cold-boot from the saved
    disk even when memory was saved (a filesystem-only pause always resumes
    that way).
    """

    timeout: Optional[int] = None
    memory: Optional[bool] = None
