"""Time travel of an :class:`~forkvm.AsyncSandbox`: checkpoints, its timeline
and retention, rewind, and filesystem diff and merge (``docs/timetravel.md``).
Mixed into the sandbox class; the blocking twin, ``_timetravel.py``, is written by
``sdk/python/scripts/unasync.py``.

::

    async with AsyncSandbox() as sb:
        await sb.files.write("/root/plan.txt", "step 1")
        good = await sb.checkpoint(tag="before-refactor")  # it keeps running
        await sb.exec("rm -rf /root/*")  # a step that went wrong
        # Back: same id and network; the present is saved as r.undo first.
        r = await sb.rewind(good, checkpoint_first=True)
        print(await sb.files.read_text("/root/plan.txt"))  # step 1

        # Try two ideas side by side, keep the one that worked.
        a, b = (await sb.branch(count=2)).children
        ...
        print((await sb.diff(a, path="/root")).paths())
        await a.merge_into(sb, path="/root")  # raises forkvm.Conflict on a conflict
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from . import models

if TYPE_CHECKING:
    from .aio import AsyncSandbox, AsyncSnapshot
    from .async_client import AsyncClient

__all__ = ["AsyncTimeTravel"]

#: A side of a diff or the target of a merge: an id or tag, or an object with an ``id``.
Side = Union[str, models.Checkpoint, "AsyncSandbox", "AsyncSnapshot"]


def _ref(side: Side) -> str:
    return side if isinstance(side, str) else side.id


class AsyncTimeTravel:
    """The time-travel methods of :class:`~forkvm.AsyncSandbox`."""

    if TYPE_CHECKING:
        _info: Optional[models.Sandbox]

        @property
        def id(self) -> str: ...

        @property
        def client(self) -> AsyncClient: ...

    async def checkpoint(self, tag: Optional[str] = None) -> models.Checkpoint:
        """Save it now as the next step of its timeline; it keeps running.

        A checkpoint stores only what changed since the previous one, and the
        guest stops only for the last copy pass (``pause_ms``). ``tag`` names
        it (unique among snapshots); tagged checkpoints are never pruned. See
        :meth:`rewind`, :meth:`timeline` and :meth:`set_retention`.
        """
        return await self.client.checkpoint(self.id, tag=tag)

    async def timeline(self) -> models.Timeline:
        """Its kept checkpoints, oldest first, with its retention policy and what they store."""
        return await self.client.get_timeline(self.id)

    async def set_retention(self, keep_last: Optional[int] = None, keep_every: Optional[int] = None) -> models.Timeline:
        """Keep only the last ``keep_last`` checkpoints, and every ``keep_every``-th; prune now.

        Tagged checkpoints and the newest are always kept. The policy
        replaces the previous one (``keep_last=None``: keep all) and applies
        after every checkpoint. The answer is the pruned timeline.
        """
        return await self.client.set_retention(self.id, keep_last=keep_last, keep_every=keep_every)

    async def rewind(
        self, to: Union[str, models.Checkpoint, "AsyncSnapshot"], *, checkpoint_first: bool = False
    ) -> models.Rewound:
        """Bring it back to ``to``: one of its checkpoints, or a snapshot of its lineage.

        ``to`` is an id, a tag, a :class:`~forkvm.models.Checkpoint` or a
        snapshot. It stays the same sandbox (id, metadata, network, ports)
        with the memory, processes and files of ``to``; what happened since
        is lost unless ``checkpoint_first=True`` saves it first, as the
        answer's ``undo`` (rewind to it to undo this). Raises
        :class:`~forkvm.NotFound` for a ``to`` that does not exist.
        """
        ref = to if isinstance(to, str) else to.id
        result = await self.client.rewind(self.id, ref, checkpoint_first=checkpoint_first or None)
        self._info = result.sandbox
        return result

    async def diff(self, other: Side, *, path: Optional[str] = None, text: bool = False) -> models.Diff:
        """The filesystem differences from this sandbox to ``other``.

        ``other`` is a sandbox, a snapshot or a checkpoint (an object or an
        id or tag), usually of its lineage: a branch child, its branch
        point, one of its checkpoints. ``change`` says what ``other`` has
        compared to this one (``added``: only ``other`` has it). ``path``
        limits it to an absolute directory; ``text=True`` adds a unified
        diff of each text file (``patch``).
        """
        return await self.client.diff(self.id, b=_ref(other), path=path, text=text or None)

    async def merge_into(
        self,
        target: Side,
        *,
        path: Optional[str] = None,
        strategy: Optional[Union[str, models.MergeStrategy]] = None,
        dry_run: bool = False,
    ) -> models.Merged:
        """Apply this sandbox's file changes since its branch point to the running sandbox ``target``.

        This one must have been branched or spawned from a snapshot (its
        branch point); ``target`` is usually the sandbox it was branched
        from. Three-way: a path ``target`` changed too, differently, is a
        conflict, and then nothing is applied and :class:`~forkvm.Conflict`
        is raised, its message listing the paths, unless ``strategy``
        settles them: ``"ours"`` keeps ``target``'s version, ``"theirs"``
        takes this one's, ``"text"`` merges text files line by line.
        ``dry_run=True`` changes nothing and returns the plan with its
        ``conflicts``. Only files merge: ``target``'s processes keep what
        they hold in memory.
        """
        return await self.client.merge(
            self.id, into=_ref(target), path=path, strategy=strategy, dry_run=dry_run or None
        )
