"""Typed models of a sandbox's resources: its limits, what it has used, and
the daemon's capacity. Re-exported by :mod:`forkvm.models` (see there for how
models convert from and to JSON).

A sandbox may carry :class:`SandboxLimits`, set at spawn and inherited by a
branch's children unless the branch overrides them field by field (omitted
fields are unlimited; docs/limits.md says how each is enforced).
``GET /v1/sandboxes/{id}`` of a running sandbox shows its :class:`Usage`, and
``GET /v1/info`` the memory and disk :class:`Capacity` that admission control
counts: work that would pass it is refused with 503 ``capacity_exceeded``
(:class:`~forkvm.CapacityExceeded`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from .models import Model

__all__ = ["Capacity", "SandboxLimits", "Usage", "sandbox_limits"]


@dataclass
class SandboxLimits(Model):
    """Resource limits of one sandbox (every field is optional: unlimited).

    ``cpu_percent``: CPU time of its QEMU in percent of one host core (50:
    half a core; 200: two), whatever its vCPU count. ``memory_overhead_mib``:
    memory QEMU may use beyond the guest's RAM. ``disk_iops`` and
    ``disk_bps``: operations and bytes per second on its root disk, reads and
    writes together. ``net_kbps``: its network rate in each direction,
    kbit/s. ``pids``: processes and threads its QEMU may have.
    """

    cpu_percent: Optional[int] = None
    memory_overhead_mib: Optional[int] = None
    disk_iops: Optional[int] = None
    disk_bps: Optional[int] = None
    net_kbps: Optional[int] = None
    pids: Optional[int] = None


@dataclass
class Usage(Model):
    """What a running sandbox has used (``GET /v1/sandboxes/{id}``).

    ``cpu_ms``: CPU time of its QEMU (user + system) since it started;
    ``disk_bytes``: host disk its own files take (shared snapshot layers not
    included); ``net_rx_bytes``/``net_tx_bytes``: bytes its NIC received and
    sent (``None`` without a NIC).
    """

    cpu_ms: int
    disk_bytes: int
    net_rx_bytes: Optional[int] = None
    net_tx_bytes: Optional[int] = None


@dataclass
class Capacity(Model):
    """Memory and disk capacity as admission control counts them (``GET /v1/info``).

    ``memory_commit_mib`` is what sandboxes may use in all; of it,
    ``memory_used_mib`` is used by running sandboxes (the sum of their QEMUs'
    PSS), ``memory_reserved_mib`` held for spawns, branches and resumes still
    starting, and ``memory_left_mib`` left. Below ``disk_reserve_mib`` of
    ``disk_free_mib``, new work is refused.
    """

    memory_commit_mib: int
    memory_used_mib: int
    memory_reserved_mib: int
    memory_left_mib: int
    counted_sandboxes: int
    disk_free_mib: int
    disk_reserve_mib: int


def sandbox_limits(value: Union[SandboxLimits, Mapping[str, Any], None]) -> Optional[SandboxLimits]:
    """``limits`` as a :class:`SandboxLimits`: one already, or a mapping of its fields.

    ``{"disk_iops": 100, "net_kbps": 10000}`` -> ``SandboxLimits(disk_iops=100, net_kbps=10000)``;
    an unknown key is a :class:`TypeError` here rather than a 400 from the daemon.
    """
    if value is None or isinstance(value, SandboxLimits):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"limits is a SandboxLimits or a mapping, e.g. {{'disk_iops': 100}}, not {value!r}")
    return SandboxLimits(**value)
