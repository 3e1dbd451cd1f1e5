"""Typed models of snapshot upkeep: flattening, warm pools and pruning
(docs/snapshots.md). Re-exported by :mod:`forkvm.models` (see there for how
models convert from and to JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .models import Model


@dataclass
class FlattenRequest(Model):
    """``POST /v1/snapshots/{id}/flatten``."""

    tag: Optional[str] = None


@dataclass
class PoolConfig(Model):
    """``PUT /v1/snapshots/{id}/pool``. ``size`` ``None`` follows the daemon's default."""

    size: Optional[int] = None


@dataclass
class PruneRequest(Model):
    """``POST /v1/snapshots/prune``. ``all`` ignores the grace period; ``dry_run`` removes nothing."""

    all: Optional[bool] = None
    dry_run: Optional[bool] = None


@dataclass
class PrunedSnapshot(Model):
    """A snapshot a prune removed (or in a dry run, would remove), with the bytes it freed."""

    id: str
    kind: str
    created_at: str
    bytes: int
    parent: Optional[str] = None


@dataclass
class PruneFailure(Model):
    """A snapshot a prune chose but could not remove."""

    id: str
    message: str


@dataclass
class PruneResult(Model):
    """The result of ``POST /v1/snapshots/prune``: the snapshots removed, children first."""

    dry_run: bool
    grace_secs: int
    snapshots: List[PrunedSnapshot]
    freed_bytes: int
    failed: List[PruneFailure]
