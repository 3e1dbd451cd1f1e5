"""Time travel of an :class:`~forkvm.AsyncSandbox`: checkpoints, its timeline
and retention, and rewind (``docs/timetravel.md``). Mixed into the sandbox
class; the blocking twin, ``_timetravel.py``, is written by
``sdk/python/scripts/unasync.py``.

::

    async with AsyncSandbox() as sb:
        await sb.files.write("/root/plan.txt", "step 1")
        good = await sb.checkpoint(tag="before-refactor")  # it keeps running
        await sb.exec("rm -rf /root/*")  # a step that went wrong
        # Back: same id and network; the present is saved as r.undo first.
        r = await sb.rewind(good, checkpoint_first=True)
        print(await sb.files.read_text("/root/plan.txt"))  # step 1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from . import models

if TYPE_CHECKING:
    from .aio import AsyncSnapshot
    from .async_client import AsyncClient

__all__ = ["AsyncTimeTravel"]


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
