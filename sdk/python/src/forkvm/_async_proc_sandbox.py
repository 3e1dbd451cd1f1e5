"""``sb.processes`` and ``sb.fs`` of an :class:`~forkvm.AsyncSandbox`: background
processes and filesystem operations (``docs/processes.md``). The blocking
twin, ``_proc_sandbox.py``, is written by ``sdk/python/scripts/unasync.py``.

::

    async with AsyncSandbox() as sb:
        web = await sb.processes.start("python3 -m http.server 8000", tag="web")
        print([p.tag for p in await sb.processes.list()])
        await web.signal("INT")
        print((await web.wait()).status)

        await sb.fs.mkdir("/work/src")
        for entry in await sb.fs.list("/work", depth=2):
            print(entry.permissions, entry.path)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, Mapping, Optional, Sequence, Union

from . import _proc_ops, models
from ._async_proc_streams import AsyncProcessStream, AsyncWatchStream
from .processes import ProcessEnd, SignalSpec

if TYPE_CHECKING:
    from .aio import AsyncSandbox

__all__ = ["AsyncSandboxProcesses", "AsyncSandboxProcess", "AsyncSandboxFs", "AsyncFsWatcher"]


class AsyncSandboxProcess:
    """A background process of a sandbox, by pid (see :meth:`AsyncSandboxProcesses.start`).

    A handle only: it holds no connection, and the process runs on when it
    is dropped.
    """

    def __init__(self, sandbox: "AsyncSandbox", pid: int, tag: Optional[str] = None) -> None:
        self._sandbox = sandbox
        self.pid = pid
        self.tag = tag

    def __repr__(self) -> str:
        tag = f" tag={self.tag!r}" if self.tag else ""
        return f"<AsyncSandboxProcess {self.pid}{tag} in {self._sandbox.id}>"

    def attach(self) -> AsyncProcessStream:
        """Its kept output, then live events until it ends (see :meth:`AsyncSandboxProcesses.attach`)."""
        return AsyncProcessStream(self._sandbox.client, _proc_ops.attach_process(self._sandbox.id, self.pid))

    async def wait(self) -> ProcessEnd:
        """Wait for it to end (replaying its output meanwhile); return how it ended."""
        return await self.attach().wait()

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        """Write to its stdin pipe (started with ``stdin=True``), or type into its PTY."""
        await self._sandbox.client.write_stdin(self._sandbox.id, self.pid, data)

    async def close_stdin(self) -> None:
        """Close its stdin once what was queued is written (it sees end-of-file)."""
        await self._sandbox.client.close_stdin(self._sandbox.id, self.pid)

    async def signal(self, signal: SignalSpec) -> None:
        """Send a signal (``"INT"``, ``15``, ``signal.SIGTERM``...) to its process group."""
        await self._sandbox.client.signal_process(self._sandbox.id, self.pid, signal)

    async def kill(self) -> None:
        """SIGKILL its process group."""
        await self._sandbox.client.kill_process(self._sandbox.id, self.pid)

    async def resize(self, cols: int, rows: int) -> None:
        """Resize its PTY (it gets SIGWINCH)."""
        await self._sandbox.client.resize_pty(self._sandbox.id, self.pid, cols=cols, rows=rows)


class AsyncSandboxProcesses:
    """Background processes: ``sb.processes.start(...)``, ``.list()``, ``.attach(pid_or_tag)``...

    A process is named by its pid or by the tag it was started with.
    """

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def start(
        self,
        cmd: Union[str, Sequence[str], None] = None,
        *,
        tag: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: bool = False,
        pty: Optional[_proc_ops.PtySpec] = None,
    ) -> AsyncSandboxProcess:
        """Start ``cmd`` (an argv list, or a string run with ``sh -c``; ``None``: the image's
        default command) in the background and return its handle at once.

        ``tag`` names it (unique among running processes); ``stdin=True``
        gives it a pipe (else ``/dev/null``); ``pty=(cols, rows)`` runs it on
        a terminal, whose output comes as ``pty`` events.
        """
        started = await self._sandbox.client.start_process(
            self._sandbox.id, cmd, env=env, cwd=cwd, user=user, tag=tag, pty=pty, stdin=stdin or None
        )
        return AsyncSandboxProcess(self._sandbox, started.pid, started.tag)

    def run(
        self,
        cmd: Union[str, Sequence[str], None] = None,
        *,
        tag: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: bool = False,
        pty: Optional[_proc_ops.PtySpec] = None,
    ) -> AsyncProcessStream:
        """Start ``cmd`` like :meth:`start`, streaming its events until it ends (its pid comes first).

        Leaving the stream early leaves the process running.
        """
        return self._sandbox.client.start_process_stream(
            self._sandbox.id, cmd, env=env, cwd=cwd, user=user, tag=tag, pty=pty, stdin=stdin or None
        )

    async def list(self) -> List[models.Process]:
        """The running background processes (those that ended are not listed)."""
        return (await self._sandbox.client.list_processes(self._sandbox.id)).processes

    def get(self, process: Union[int, str]) -> AsyncSandboxProcess:
        """A handle for the process with this pid (no request is made)."""
        return AsyncSandboxProcess(self._sandbox, int(process))

    def attach(self, process: Union[int, str]) -> AsyncProcessStream:
        """The events of a process (pid or tag): the output it kept (the last 1 MiB), then live
        output, then its end. One of the last 8 that ended can still be attached.

        The request is sent when iteration starts (or on ``async with``)."""
        return AsyncProcessStream(self._sandbox.client, _proc_ops.attach_process(self._sandbox.id, process))

    async def send_stdin(self, process: Union[int, str], data: Union[bytes, str]) -> None:
        """Write to a process's stdin pipe, or type into its PTY."""
        await self._sandbox.client.write_stdin(self._sandbox.id, process, data)

    async def close_stdin(self, process: Union[int, str]) -> None:
        """Close a process's stdin once what was queued is written."""
        await self._sandbox.client.close_stdin(self._sandbox.id, process)

    async def signal(self, process: Union[int, str], signal: SignalSpec) -> None:
        """Send a signal (``"INT"``, ``15``, ``signal.SIGTERM``...) to a process's group."""
        await self._sandbox.client.signal_process(self._sandbox.id, process, signal)

    async def kill(self, process: Union[int, str]) -> None:
        """SIGKILL a process's group."""
        await self._sandbox.client.kill_process(self._sandbox.id, process)

    async def resize(self, process: Union[int, str], cols: int, rows: int) -> None:
        """Resize a process's PTY (it gets SIGWINCH)."""
        await self._sandbox.client.resize_pty(self._sandbox.id, process, cols=cols, rows=rows)


class AsyncFsWatcher:
    """A polled watcher (:meth:`AsyncSandboxFs.watcher`): it keeps the changes (at most 4096)
    until :meth:`poll` takes them. Remove it with :meth:`close` (or ``async with``)."""

    def __init__(self, sandbox: "AsyncSandbox", watcher_id: str) -> None:
        self._sandbox = sandbox
        self.id = watcher_id

    async def poll(self) -> models.WatcherEvents:
        """The changes since the last poll, and how many were ``dropped``."""
        return await self._sandbox.client.poll_watcher(self._sandbox.id, self.id)

    async def close(self) -> None:
        """Stop and remove the watcher."""
        await self._sandbox.client.remove_watcher(self._sandbox.id, self.id)

    async def __aenter__(self) -> "AsyncFsWatcher":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSandboxFs:
    """The guest's filesystem: ``sb.fs.stat(path)``, ``.exists``, ``.list``, ``.mkdir``, ``.move``,
    ``.remove``, ``.watch``, ``.download_archive``, ``.upload_archive``... Paths are absolute."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def read(self, path: str) -> bytes:
        """The bytes of a file (as ``sb.files.read``)."""
        return await self._sandbox.client.read_file(self._sandbox.id, path)

    async def write(self, path: str, data: Union[bytes, str], mode: Union[int, str, None] = None) -> models.FileWritten:
        """Write a file atomically (as ``sb.files.write``)."""
        return await self._sandbox.client.write_file(self._sandbox.id, path, data, mode=mode)

    async def stat(self, path: str) -> models.EntryInfo:
        """The entry at ``path`` as ``lstat`` sees it (raises :class:`~forkvm.NotFound`)."""
        return await self._sandbox.client.stat_file(self._sandbox.id, path)

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink does)."""
        return await self._sandbox.client.file_exists(self._sandbox.id, path)

    async def list(self, path: str, depth: Optional[int] = None) -> List[models.EntryInfo]:
        """The entries under a directory, ``depth`` levels down (1-64, default 1)."""
        return await self._sandbox.client.list_dir(self._sandbox.id, path, depth=depth)

    async def mkdir(self, path: str) -> models.DirMade:
        """``mkdir -p``: the directory, and whether it ``existed``."""
        return await self._sandbox.client.make_dir(self._sandbox.id, path=path)

    async def move(self, source: str, destination: str) -> models.EntryInfo:
        """Rename ``source`` to ``destination``; return the moved entry."""
        return await self._sandbox.client.move_file(self._sandbox.id, source=source, destination=destination)

    async def remove(self, path: str) -> None:
        """Remove a file, a symlink or a directory with all it holds (never following a symlink)."""
        await self._sandbox.client.remove_file(self._sandbox.id, path)

    def watch(self, path: str, recursive: bool = False) -> AsyncWatchStream:
        """The changes in a directory as they happen: enter it (``async with``), or call its
        ``open()``, to start the watch, then iterate (see :class:`~forkvm.AsyncWatchStream`)."""
        return AsyncWatchStream(self._sandbox.client, _proc_ops.watch_dir(self._sandbox.id, path, recursive))

    async def watcher(self, path: str, recursive: bool = False) -> AsyncFsWatcher:
        """A watcher to poll (a sandbox has at most 64)."""
        created = await self._sandbox.client.create_watcher(self._sandbox.id, path=path, recursive=recursive or None)
        return AsyncFsWatcher(self._sandbox, created.watcher_id)

    async def download_archive(self, *paths: str) -> bytes:
        """A tar of these paths (directories with all they hold, symlinks as symlinks), each entry
        named by its absolute path without the leading ``/``: uploaded to ``/`` it restores them."""
        return await self._sandbox.client.download_archive(self._sandbox.id, list(paths))

    async def upload_archive(
        self, path: str, tar: Union[bytes, str, "os.PathLike[str]"]
    ) -> models.ArchiveWritten:
        """Unpack a tar (its bytes, or a local tar file's path) under the directory ``path``."""
        return await self._sandbox.client.upload_archive(self._sandbox.id, path, tar)
