"""The process and filesystem operations of :class:`~forkvm.AsyncClient`
(``docs/processes.md``), one method per ``operationId``, in a class that the
client inherits. ``sdk/python/scripts/unasync.py`` writes the blocking twin,
``_proc_client.py``, that :class:`~forkvm.Client` inherits."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Union

from . import _proc_ops, models
from ._async_proc_streams import AsyncProcessStream, AsyncWatchStream
from .processes import SignalSpec

if TYPE_CHECKING:
    import httpx

    from ._ops import Request

__all__ = ["AsyncProcessOps"]

#: A process: its pid, or the tag it was started with.
ProcessRef = Union[int, str]


class AsyncProcessOps:
    """Background processes and filesystem operations; mixed into :class:`~forkvm.AsyncClient`."""

    async def _send(self, request: "Request") -> Any:  # provided by the client
        raise NotImplementedError

    async def _open_stream(self, request: "Request") -> "httpx.Response":  # provided by the client
        raise NotImplementedError

    # -- processes ---------------------------------------------------------

    async def start_process(
        self,
        id: str,
        argv: Union[str, Sequence[str], None] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        tag: Optional[str] = None,
        pty: Optional[_proc_ops.PtySpec] = None,
        stdin: Optional[bool] = None,
    ) -> models.ProcessStarted:
        """``POST /v1/sandboxes/{id}/processes``: start a background process; answers with its pid.

        ``argv`` is a list, or a string run with ``sh -c``; ``None`` runs the
        image's default command. ``tag`` names it; ``pty`` (``(cols, rows)``)
        runs it on a terminal; ``stdin=True`` gives it a pipe to write with
        :meth:`write_stdin`. The process outlives the request and the client.
        """
        body = _proc_ops.start_request(argv, env=env, cwd=cwd, user=user, tag=tag, pty=pty, stdin=stdin)
        return await self._send(_proc_ops.start_process(id, body))

    def start_process_stream(
        self,
        id: str,
        argv: Union[str, Sequence[str], None] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        tag: Optional[str] = None,
        pty: Optional[_proc_ops.PtySpec] = None,
        stdin: Optional[bool] = None,
    ) -> AsyncProcessStream:
        """``POST /v1/sandboxes/{id}/processes`` with ``"stream": true``: start it and iterate over its events.

        Closing the stream early leaves the process running.
        """
        body = _proc_ops.start_request(argv, env=env, cwd=cwd, user=user, tag=tag, pty=pty, stdin=stdin)
        return AsyncProcessStream(self, _proc_ops.start_process_stream(id, body))

    async def list_processes(self, id: str) -> models.ProcessList:
        """``GET /v1/sandboxes/{id}/processes``: the running background processes."""
        return await self._send(_proc_ops.list_processes(id))

    async def attach_process(self, id: str, process: ProcessRef) -> AsyncProcessStream:
        """``GET /v1/sandboxes/{id}/processes/{process}/output``: its kept output, then live events to its end.

        ``process`` is a pid or a tag. The request is sent at once (a
        missing process raises :class:`~forkvm.NotFound` here); iterate the
        stream returned. Closing it leaves the process running.
        """
        return await AsyncProcessStream(self, _proc_ops.attach_process(id, process)).open()

    async def write_stdin(self, id: str, process: ProcessRef, data: Union[bytes, str]) -> None:
        """``POST /v1/sandboxes/{id}/processes/{process}/stdin``: queue bytes (text as UTF-8) for its
        stdin pipe, or type them into its PTY."""
        await self._send(_proc_ops.write_stdin(id, process, data))

    async def close_stdin(self, id: str, process: ProcessRef) -> None:
        """``DELETE /v1/sandboxes/{id}/processes/{process}/stdin``: close its stdin once what was queued
        is written (it sees end-of-file). A PTY has none: write ``"\\x04"`` instead."""
        await self._send(_proc_ops.close_stdin(id, process))

    async def signal_process(self, id: str, process: ProcessRef, signal: SignalSpec) -> None:
        """``POST /v1/sandboxes/{id}/processes/{process}/signal``: send ``signal`` (``15``, ``"TERM"``,
        ``signal.SIGINT``...) to its whole process group."""
        await self._send(_proc_ops.signal_process(id, process, signal))

    async def kill_process(self, id: str, process: ProcessRef) -> None:
        """``DELETE /v1/sandboxes/{id}/processes/{process}``: SIGKILL its process group."""
        await self._send(_proc_ops.kill_process(id, process))

    async def resize_pty(self, id: str, process: ProcessRef, *, cols: int, rows: int) -> None:
        """``PUT /v1/sandboxes/{id}/processes/{process}/pty``: resize its terminal (it gets SIGWINCH)."""
        await self._send(_proc_ops.resize_pty(id, process, models.PtySize(cols=cols, rows=rows)))

    # -- files -------------------------------------------------------------

    async def stat_file(self, id: str, path: str) -> models.EntryInfo:
        """``GET /v1/sandboxes/{id}/fs/stat?path=``: the entry at ``path``, as ``lstat`` sees it."""
        return await self._send(_proc_ops.stat_file(id, path))

    async def file_exists(self, id: str, path: str) -> bool:
        """``GET /v1/sandboxes/{id}/fs/exists?path=``: whether ``path`` exists (a dangling symlink does)."""
        return (await self._send(_proc_ops.file_exists(id, path))).exists

    async def list_dir(self, id: str, path: str, *, depth: Optional[int] = None) -> List[models.EntryInfo]:
        """``GET /v1/sandboxes/{id}/fs/list?path=&depth=``: the entries under a directory, ``depth``
        levels down (1-64, default 1); symlinks are not followed."""
        return (await self._send(_proc_ops.list_dir(id, path, depth))).entries

    async def make_dir(self, id: str, *, path: str) -> models.DirMade:
        """``POST /v1/sandboxes/{id}/fs/mkdir``: ``mkdir -p path``; ``existed`` says it was there already."""
        return await self._send(_proc_ops.make_dir(id, models.MakeDir(path=path)))

    async def move_file(self, id: str, *, source: str, destination: str) -> models.EntryInfo:
        """``POST /v1/sandboxes/{id}/fs/move``: rename ``source`` to ``destination``; answers the moved entry."""
        return await self._send(_proc_ops.move_file(id, models.MoveFile(source=source, destination=destination)))

    async def remove_file(self, id: str, path: str) -> None:
        """``DELETE /v1/sandboxes/{id}/files?path=``: remove a file, a symlink or a whole directory
        (never following a symlink; ``/`` is refused)."""
        await self._send(_proc_ops.remove_file(id, path))

    async def watch_dir(self, id: str, path: str, *, recursive: bool = False) -> AsyncWatchStream:
        """``GET /v1/sandboxes/{id}/fs/watch?path=&recursive=``: watch a directory's changes.

        Returns once the watch is in place, with a stream that yields
        :class:`~forkvm.models.FsEvent` until closed (use it as a context manager).
        """
        return await AsyncWatchStream(self, _proc_ops.watch_dir(id, path, recursive)).open()

    async def create_watcher(self, id: str, *, path: str, recursive: Optional[bool] = None) -> models.Watcher:
        """``POST /v1/sandboxes/{id}/fs/watchers``: a watcher that keeps the changes until polled."""
        return await self._send(_proc_ops.create_watcher(id, models.CreateWatcher(path=path, recursive=recursive)))

    async def poll_watcher(self, id: str, watcher: str) -> models.WatcherEvents:
        """``GET /v1/sandboxes/{id}/fs/watchers/{watcher}``: the changes since the last poll."""
        return await self._send(_proc_ops.poll_watcher(id, watcher))

    async def remove_watcher(self, id: str, watcher: str) -> None:
        """``DELETE /v1/sandboxes/{id}/fs/watchers/{watcher}``: stop and forget a watcher."""
        await self._send(_proc_ops.remove_watcher(id, watcher))

    async def download_archive(self, id: str, path: Union[str, Sequence[str]]) -> bytes:
        """``GET /v1/sandboxes/{id}/archive?path=..``: a tar of one or several paths (directories with
        all they hold), each entry named by its absolute path without the leading ``/``."""
        return await self._send(_proc_ops.download_archive(id, [path] if isinstance(path, str) else list(path)))

    async def upload_archive(
        self, id: str, path: str, tar: Union[bytes, str, "os.PathLike[str]"]
    ) -> models.ArchiveWritten:
        """``PUT /v1/sandboxes/{id}/archive?path=``: unpack a tar under the directory ``path`` (created
        if missing). ``tar`` is its bytes, or the path of a local tar file (streamed from disk)."""
        return await self._send(_proc_ops.upload_archive(id, path, tar))
