"""Typed models of time travel: checkpoints, a sandbox's timeline and its
retention, and rewind. Re-exported by :mod:`forkvm.models` (see there for
how models convert from and to JSON).

A checkpoint is a snapshot (origin ``checkpoint``) of a running sandbox whose
parent is the sandbox's previous checkpoint, so it stores only what changed
since then; the guest stops only for the final copy pass. The checkpoints
of a sandbox form its timeline, pruned by its retention policy after every
checkpoint. A rewind brings the sandbox back to one of its checkpoints (or
any snapshot of its lineage) as the same sandbox: same id, metadata,
network and published ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .models import Model, Sandbox

__all__ = ["Checkpoint", "CheckpointRequest", "Retention", "RewindRequest", "Rewound", "Timeline"]


@dataclass
class CheckpointRequest(Model):
    """``POST /v1/sandboxes/{id}/checkpoints``: ``tag`` names the checkpoint (unique); tagged ones are kept."""

    tag: Optional[str] = None


@dataclass
class Checkpoint(Model):
    """One checkpoint of a sandbox's timeline.

    ``id`` is the snapshot holding it (``sn-…``): rewind to it, or spawn and
    branch from it. ``seq`` is its step number, from 1; ``parent`` the
    snapshot it builds on; ``pause_ms`` how long the guest was stopped for
    it; ``bytes`` what it stores alone (the memory pages changed since its
    parent, the device state and its disk layer); ``head`` whether the
    sandbox runs from it (or from something built on it) now.
    """

    id: str
    sandbox: str
    seq: int
    created_at: str
    bytes: int
    head: bool
    tag: Optional[str] = None
    parent: Optional[str] = None
    pause_ms: Optional[float] = None


@dataclass
class Retention(Model):
    """How many checkpoints a sandbox keeps (``PUT /v1/sandboxes/{id}/timeline/retention``).

    ``keep_last`` N (1 or more; ``None``: keep all) and also every
    ``keep_every``-th by step number. Tagged and pinned checkpoints are
    always kept, and so is the newest; one something else builds on stays
    until nothing does.
    """

    keep_last: Optional[int] = None
    keep_every: Optional[int] = None


@dataclass
class Timeline(Model):
    """``GET /v1/sandboxes/{id}/timeline``: a sandbox's kept checkpoints, oldest first.

    ``head`` is the checkpoint its next one builds on; ``bytes`` what the
    kept checkpoints store together.
    """

    sandbox: str
    retention: Retention
    checkpoints: List[Checkpoint]
    bytes: int
    head: Optional[str] = None

    def find(self, ref: str) -> Optional[Checkpoint]:
        """The kept checkpoint whose id or tag is ``ref``, else ``None``."""
        return next((c for c in self.checkpoints if ref in (c.id, c.tag)), None)


@dataclass
class RewindRequest(Model):
    """``POST /v1/sandboxes/{id}/rewind``.

    ``to``: the checkpoint or snapshot (id or tag) to go back to, one of the
    sandbox's own checkpoints or a snapshot of its lineage.
    ``checkpoint_first``: checkpoint the present first, so the rewind can be
    undone by rewinding to that checkpoint.
    """

    to: str
    checkpoint_first: Optional[bool] = None


@dataclass
class Rewound(Model):
    """What a rewind did: the same ``sandbox``, now running from ``to``.

    ``undo`` is the checkpoint of the present taken first
    (``checkpoint_first``); ``rewind_ms`` the time from the request to the
    sandbox answering again.
    """

    sandbox: Sandbox
    to: str
    rewind_ms: float
    undo: Optional[Checkpoint] = None
