"""Typed models of filesystem diff and merge (``docs/timetravel.md``).
Re-exported by :mod:`forkvm.models` (see there for how models convert from
and to JSON).

A diff lists the filesystem differences between two sandboxes, snapshots or
checkpoints of one lineage: added, deleted and modified paths, mode-only and
type changes, each with what both sides have there, and with ``text`` a
unified diff of each text file. A merge applies a child's changes since its
branch point to a running sandbox (usually the branch source), three-way
against that branch point; paths both changed differently are conflicts.

:class:`Conflict` here is a merge conflict (a model); the exception a
refused merge raises is :class:`forkvm.Conflict` (HTTP 409), whose message
lists the conflicting paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .models import Model, _StrEnum

__all__ = [
    "ChangeKind",
    "Conflict",
    "Diff",
    "DiffRequest",
    "DiffStats",
    "MergeRequest",
    "MergeStrategy",
    "Merged",
    "PathChange",
    "PathState",
]


class ChangeKind(_StrEnum):
    """What happened to a path: ``MODE`` is a change of permission bits only,
    ``TYPE`` of kind (a file became a directory, a symlink a file …)."""

    ADDED = "added"
    DELETED = "deleted"
    MODIFIED = "modified"
    MODE = "mode"
    TYPE = "type"


class MergeStrategy(_StrEnum):
    """How a merge settles conflicts: keep the target's version (``OURS``),
    take the child's (``THEIRS``), or merge text files line by line,
    three-way (``TEXT``; conflicts it cannot settle stay)."""

    OURS = "ours"
    THEIRS = "theirs"
    TEXT = "text"


@dataclass
class DiffRequest(Model):
    """``POST /v1/diff/{a}``: compare ``a`` with ``b`` (a sandbox, snapshot or
    checkpoint, by id or tag), under ``path`` (absolute; default ``/``
    without /proc, /sys, /dev and /run); ``text`` adds unified diffs."""

    b: str
    path: Optional[str] = None
    text: Optional[bool] = None


@dataclass
class PathState(Model):
    """What one side has at a path: ``kind`` (``file``, ``dir``, ``symlink``
    or ``other``), ``size``, permission bits ``mode`` and, for a symlink,
    its target."""

    kind: str
    size: int
    mode: int
    symlink_target: Optional[str] = None


@dataclass
class PathChange(Model):
    """One difference at ``path``: ``a`` and ``b`` are what each side has
    there (``None``: nothing); ``patch`` a unified diff (``text=True``, text
    files only)."""

    path: str
    change: ChangeKind
    a: Optional[PathState] = None
    b: Optional[PathState] = None
    patch: Optional[str] = None


@dataclass
class DiffStats(Model):
    """Counts of a diff; ``other`` counts mode and type changes."""

    added: int
    deleted: int
    modified: int
    other: int


@dataclass
class Diff(Model):
    """What a diff found: ``changes`` sorted by path, their ``stats``, the
    ``entries`` compared (both sides) and the ``contents_read`` (files whose
    metadata alone could not decide). ``len(diff)`` is the number of
    changes, so an empty diff is false."""

    a: str
    b: str
    path: str
    changes: List[PathChange]
    stats: DiffStats
    entries: int
    contents_read: int
    diff_ms: float

    def __len__(self) -> int:
        return len(self.changes)

    def paths(self) -> List[str]:
        """The changed paths, sorted."""
        return [c.path for c in self.changes]

    def find(self, path: str) -> Optional[PathChange]:
        """The change at ``path``, else ``None``."""
        return next((c for c in self.changes if c.path == path), None)


@dataclass
class MergeRequest(Model):
    """``POST /v1/sandboxes/{id}/merge``: apply sandbox ``id``'s changes since
    its branch point to the running sandbox ``into``, under ``path``.
    Without a ``strategy`` a conflict refuses the merge; ``dry_run`` plans
    and reports, changing nothing."""

    into: str
    path: Optional[str] = None
    strategy: Optional[MergeStrategy] = None
    dry_run: Optional[bool] = None


@dataclass
class Conflict(Model):
    """A path both sides changed differently since the branch point: what the
    branch point (``base``), the target (``ours``) and the child
    (``theirs``) have there, and the ``reason`` in words."""

    path: str
    reason: str
    base: Optional[PathState] = None
    ours: Optional[PathState] = None
    theirs: Optional[PathState] = None


@dataclass
class Merged(Model):
    """What a merge did: the changes ``applied`` to ``into`` (in a dry run, to
    be applied), the conflicts ``settled`` by the strategy, and, in a dry run
    only, the ``conflicts`` left (a real merge with any is refused with
    :class:`forkvm.Conflict`). ``base`` is the branch point."""

    child: str
    into: str
    base: str
    applied: List[PathChange]
    settled: List[Conflict]
    conflicts: List[Conflict]
    dry_run: bool
    merge_ms: float
