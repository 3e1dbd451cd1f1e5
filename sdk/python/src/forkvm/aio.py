"""The object interface: :class:`AsyncSandbox`, :class:`AsyncSnapshot` and :class:`AsyncBranch`
(the last two live in ``_async_snapshot.py`` and are re-exported here).

::

    from forkvm import AsyncSandbox

    async with AsyncSandbox() as sb:                       # spawns the default image
        await sb.files.write("/tmp/x.py", "print(6 * 7)")
        print((await sb.exec("python3 /tmp/x.py")).stdout)   # 42

        branch = await sb.branch(count=3)             # three children, from this instant
        for child in branch.children:
            print(child.id, (await child.exec("hostname")).stdout)
            await child.close()

Every object talks to the daemon through a :class:`~forkvm.AsyncClient`: the
one passed as ``client=``, else the default built from
``FORKVM_URL``/``FORKVM_TOKEN`` (or the local socket). The blocking and the
asyncio flavours are one code: ``sdk/python/scripts/unasync.py`` writes the
blocking module from the asyncio one. In the asyncio flavour a sandbox is
spawned when it is awaited or entered, and output callbacks may be
coroutines.
"""

from __future__ import annotations

import inspect  # async-only
from typing import (  # async-only
    TYPE_CHECKING,  # async-only
    Any,  # async-only
    Awaitable,  # async-only
    Callable,  # async-only
    Generator,  # async-only
    Iterable,  # async-only
    List,  # async-only
    Mapping,  # async-only
    Optional,  # async-only
    Sequence,  # async-only
    Tuple,  # async-only
    Union,  # async-only
)  # async-only
# sync-only: from typing import TYPE_CHECKING, Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _ops, models
from ._async_snapshot import AsyncBranch, AsyncSnapshot
from ._async_timetravel import AsyncTimeTravel
from ._ops import EgressSpec, LimitsSpec, PortSpec
from ._volume_models import VolumeSpec
from ._default import async_client_for
from ._pickle import restore_sandbox
from .async_client import AsyncClient, default_async_client
from .errors import NotFound, StreamingUnsupported
from .streaming import AsyncExecStream  # async-only
# sync-only: from .streaming import ExecStream, OutputCallback

if TYPE_CHECKING:
    from ._async_proc_sandbox import AsyncSandboxFs, AsyncSandboxProcesses

__all__ = ["AsyncSandbox", "AsyncSnapshot", "AsyncBranch", "AsyncSandboxFiles"]

Command = Union[str, Sequence[str]]
# A callback of the asyncio flavour may be a coroutine function.  # async-only
AsyncOutputCallback = Callable[[str], Union[Any, Awaitable[Any]]]  # async-only


async def _call(callback: AsyncOutputCallback, text: str) -> None:
    outcome = callback(text)
    if inspect.isawaitable(outcome):  # async-only
        await outcome  # async-only


class AsyncSandboxFiles:
    """Files in a sandbox's guest: ``sb.files.read(path)``, ``sb.files.write(path, data)``."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def read(self, path: str) -> bytes:
        """The bytes of the guest file at the absolute ``path``."""
        return await self._sandbox.client.read_file(self._sandbox.id, path)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The guest file at ``path``, decoded."""
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: Union[bytes, str], mode: Union[int, str, None] = None) -> models.FileWritten:
        """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically.

        ``mode`` is an int such as ``0o755`` or an octal string; default 644.
        """
        return await self._sandbox.client.write_file(self._sandbox.id, path, data, mode=mode)


class AsyncSandbox(AsyncTimeTravel):
    """A running microVM.

    ``AsyncSandbox()`` spawns one from the default image and waits until its agent
    answers; ``image``, ``memory_mib`` and ``cpus`` choose another shape, and
    ``snapshot`` (an id or tag) spawns from a snapshot instead. Use it as a
    context manager, or call :meth:`close`, to remove it.

    Networking: ``network="none"`` gives the sandbox no way out (the default
    is ``"nat"`` where the host allows it); ``ports=[8000]`` publishes guest
    port 8000 on a free host loopback port (see :meth:`ports`), and
    ``ports=[(8000, 18000)]`` or ``[{"guest": 8000, "host": 18000}]`` on a
    given one; ``egress=["10.0.0.0/8", {"cidr": "1.2.3.4", "ports": [443]}]``
    allows connections only to those destinations, and ``allow_host=True``
    lets those entries reach the host itself (never without it).
    ``wait_for_network=False`` returns before the guest's network is proven
    to work. ``disk_size`` (bytes) gives it a root disk larger than its
    image's.

    Lifetime: ``metadata={"team": "a"}`` labels it (see :meth:`list`);
    ``env`` is the default environment of its execs; ``timeout`` (seconds)
    removes it when it runs out, or with ``on_timeout="pause"`` pauses it
    (see :meth:`pause`, :meth:`resume`, :meth:`set_timeout`).

    Resources: ``limits={"disk_iops": 100, "net_kbps": 10000}`` (or a
    :class:`~forkvm.models.SandboxLimits`) bounds them; see :attr:`limits`
    and :attr:`usage`.

    Volumes: ``volumes=["/srv/repo:/work:ro", "data:/data"]`` mounts host
    directories and named volumes (strings of the CLI form, mappings or
    :class:`~forkvm.models.VolumeMount`; see :attr:`volumes`).

    Time travel: :meth:`checkpoint` saves it as a step of its timeline and
    :meth:`rewind` brings it back to one (see :meth:`timeline`,
    :meth:`set_retention`).

    To wrap a sandbox that already exists, use :meth:`AsyncSandbox.get`.
    """

    def __init__(
        self,
        image: Optional[str] = None,
        *,
        memory_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        snapshot: Optional[str] = None,
        use_template: Optional[bool] = None,
        network: Union[models.NetworkMode, str, None] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        egress: Optional[Iterable[EgressSpec]] = None,
        allow_host: Optional[bool] = None,
        wait_for_network: Optional[bool] = None,
        disk_size: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[int] = None,
        on_timeout: Union[models.OnTimeout, str, None] = None,
        limits: Optional[LimitsSpec] = None,
        volumes: Optional[Iterable[VolumeSpec]] = None,
        client: Optional[AsyncClient] = None,
    ) -> None:
        self._spec = _ops.create_request(
            image=image,
            memory_mib=memory_mib,
            cpus=cpus,
            snapshot=snapshot,
            use_template=use_template,
            network=network,
            ports=ports,
            egress=egress,
            allow_host=allow_host,
            wait_for_network=wait_for_network,
            disk_size=disk_size,
            metadata=metadata,
            env=env,
            timeout=timeout,
            on_timeout=on_timeout,
            limits=limits,
            volumes=volumes,
        )
        self._client = client
        self._remote: Optional[Tuple[str, Optional[str]]] = None
        self._info: Optional[models.Sandbox] = None
        self._closed = False
        # sync-only: self.start()

    @classmethod
    async def create(
        cls,
        image: Optional[str] = None,
        *,
        memory_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        snapshot: Optional[str] = None,
        use_template: Optional[bool] = None,
        network: Union[models.NetworkMode, str, None] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        egress: Optional[Iterable[EgressSpec]] = None,
        allow_host: Optional[bool] = None,
        wait_for_network: Optional[bool] = None,
        disk_size: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[int] = None,
        on_timeout: Union[models.OnTimeout, str, None] = None,
        limits: Optional[LimitsSpec] = None,
        volumes: Optional[Iterable[VolumeSpec]] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AsyncSandbox":
        """Spawn a sandbox and return it."""
        sandbox = cls(
            image,
            memory_mib=memory_mib,
            cpus=cpus,
            snapshot=snapshot,
            use_template=use_template,
            network=network,
            ports=ports,
            egress=egress,
            allow_host=allow_host,
            wait_for_network=wait_for_network,
            disk_size=disk_size,
            metadata=metadata,
            env=env,
            timeout=timeout,
            on_timeout=on_timeout,
            limits=limits,
            volumes=volumes,
            client=client,
        )
        return await sandbox.start()

    async def start(self) -> "AsyncSandbox":
        """Spawn the sandbox (once; later calls return it as it is)."""
        if self._info is None:
            spec = self._spec
            info = await self.client.create_sandbox(
                image=spec.image,
                memory_mib=spec.memory_mib,
                cpus=spec.cpus,
                snapshot=spec.snapshot,
                use_template=spec.use_template,
                network=spec.network,
                ports=spec.ports,
                egress=spec.egress,
                allow_host=spec.allow_host,
                wait_for_network=spec.wait_for_network,
                disk_size=spec.disk_size,
                metadata=spec.metadata,
                env=spec.env,
                timeout=spec.timeout,
                on_timeout=spec.on_timeout,
                limits=spec.limits,
                volumes=spec.volumes,
            )
            assert isinstance(info, models.Sandbox)
            self._info = info
        return self

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:  # async-only
        return self.start().__await__()  # async-only

    @classmethod
    def _wrap(cls, client: AsyncClient, info: models.Sandbox) -> "AsyncSandbox":
        # Not through __init__, which spawns in the blocking flavour.
        sandbox = cls.__new__(cls)
        sandbox._spec = None
        sandbox._client = client
        sandbox._remote = None
        sandbox._info = info
        sandbox._closed = False
        return sandbox

    def __reduce__(self) -> Tuple[Any, ...]:
        # A handle pickles as its daemon's (url, token), its id and the state
        # last seen, never a connection: it can be passed to another process
        # (a Ray task), which connects on first use. The token travels with it.
        if self._client is None and self._remote is not None:
            url, token = self._remote
        else:
            url, token = self.client.endpoint.display, self.client.endpoint.token
        return (restore_sandbox, (type(self), url, token, self.id, self.info.to_dict(), self._closed))

    @classmethod
    async def get(cls, id: str, *, client: Optional[AsyncClient] = None) -> "AsyncSandbox":
        """The existing sandbox ``id`` (raises :class:`~forkvm.NotFound`)."""
        client = client or default_async_client()
        return cls._wrap(client, await client.get_sandbox(id))

    @classmethod
    async def list(
        cls, *, metadata: Optional[Mapping[str, str]] = None, client: Optional[AsyncClient] = None
    ) -> List["AsyncSandbox"]:
        """Every sandbox the daemon knows, in any state; with ``metadata``, those with every given pair."""
        client = client or default_async_client()
        return [cls._wrap(client, info) for info in (await client.list_sandboxes(metadata=metadata)).sandboxes]

    # -- state -------------------------------------------------------------

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = async_client_for(*self._remote) if self._remote else default_async_client()
        return self._client

    @property
    def info(self) -> models.Sandbox:
        """The sandbox as last seen (see :meth:`refresh`)."""
        if self._info is None:
            raise RuntimeError("the sandbox is not started: `await AsyncSandbox(...)` or use `async with`")
        return self._info

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> Union[models.SandboxState, str]:
        return self.info.state

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    @property
    def files(self) -> AsyncSandboxFiles:
        return AsyncSandboxFiles(self)

    @property
    def processes(self) -> AsyncSandboxProcesses:
        """Background processes: ``start``, ``list``, ``attach``, ``send_stdin``, ``signal``, ``kill``..."""
        from ._async_proc_sandbox import AsyncSandboxProcesses  # it imports this module

        return AsyncSandboxProcesses(self)

    @property
    def fs(self) -> AsyncSandboxFs:
        """Filesystem operations: ``stat``, ``exists``, ``list``, ``mkdir``, ``move``, ``remove``, ``watch``..."""
        from ._async_proc_sandbox import AsyncSandboxFs  # it imports this module

        return AsyncSandboxFs(self)

    @property
    def network(self) -> Optional[models.NetworkInfo]:
        """Its network as last seen: mode, addresses, published ports (``None`` without a NIC)."""
        return self.info.network

    @property
    def metadata(self) -> Mapping[str, str]:
        """Its labels, as last seen."""
        return self.info.metadata

    @property
    def lifetime(self) -> Optional[models.Lifetime]:
        """Its timeout as last seen (``None`` without one)."""
        return self.info.lifetime

    @property
    def limits(self) -> Optional[models.SandboxLimits]:
        """Its resource limits as last seen (``None`` without any)."""
        return self.info.limits

    @property
    def volumes(self) -> List[models.MountedVolume]:
        """Its volumes as last seen, each with the ``host_path`` its guest reads and writes."""
        return self.info.volumes

    @property
    def usage(self) -> Optional[models.Usage]:
        """What it had used when last fetched (:meth:`refresh` of a running sandbox; ``None`` otherwise)."""
        return self.info.usage

    async def refresh(self) -> models.Sandbox:
        """Fetch the sandbox again (with its memory use) and return it."""
        self._info = await self.client.get_sandbox(self.id)
        return self._info

    async def ports(self) -> List[models.PortForward]:
        """Its published ports: each ``guest`` port and the ``host`` port on 127.0.0.1 that reaches it.

        ::

            async with AsyncSandbox(ports=[8000]) as sb:
                (port,) = await sb.ports()
                url = f"http://127.0.0.1:{port.host}/"
        """
        return await self.client.ports(self.id)

    def __repr__(self) -> str:
        if self._info is None:
            return "<AsyncSandbox (not started)>"
        return f"<AsyncSandbox {self.id} {self.state}{' closed' if self._closed else ''}>"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, AsyncSandbox)
            and self._info is not None
            and other._info is not None
            and other.id == self.id
        )

    def __hash__(self) -> int:
        return hash(self.info.id if self._info else id(self))

    # -- commands ----------------------------------------------------------

    async def exec(
        self,
        cmd: Command,
        *,
        stdin: Union[str, bytes, None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        encoding: Union[models.OutputEncoding, str, None] = None,
        max_output_bytes: Optional[int] = None,
        on_stdout: Optional[AsyncOutputCallback] = None,
        on_stderr: Optional[AsyncOutputCallback] = None,
        check: bool = False,
    ) -> models.ExecResult:
        """Run ``cmd`` and wait for it.

        ``cmd`` is an argv list, or a string run with ``sh -c``; an empty
        list runs the image's default command (``Entrypoint`` + ``Cmd``).
        ``user`` runs it as another user (``name``, ``uid``, ``name:group``
        or ``uid:gid``; default: the image's). ``stdin`` is
        text or bytes; ``timeout`` is in seconds (the command is killed and
        ``timed_out`` set). With ``on_stdout``/``on_stderr``, output is
        streamed to the callbacks as text while the command runs (against a
        daemon without streaming, they get it all at the end). ``check=True``
        raises :class:`~forkvm.CommandFailed` on a non-zero exit.
        """
        timeout_ms = _ops.seconds_to_ms(timeout)
        if on_stdout is not None or on_stderr is not None:
            if encoding is not None or max_output_bytes is not None:
                raise ValueError("encoding and max_output_bytes cannot be combined with output callbacks")
            try:
                result = await self.exec_stream(
                    cmd, stdin=stdin, env=env, cwd=cwd, user=user, timeout=timeout
                ).collect(on_stdout, on_stderr)
            except StreamingUnsupported:
                result = await self.client.exec(
                    self.id, cmd, stdin=stdin, env=env, cwd=cwd, user=user, timeout_ms=timeout_ms
                )
                if on_stdout is not None and result.stdout:
                    await _call(on_stdout, result.stdout)
                if on_stderr is not None and result.stderr:
                    await _call(on_stderr, result.stderr)
        else:
            result = await self.client.exec(
                self.id,
                cmd,
                stdin=stdin,
                env=env,
                cwd=cwd,
                user=user,
                timeout_ms=timeout_ms,
                encoding=encoding,
                max_output_bytes=max_output_bytes,
            )
        return result.check() if check else result

    def exec_stream(
        self,
        cmd: Command,
        *,
        stdin: Union[str, bytes, None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> AsyncExecStream:
        """Run ``cmd``, yielding :class:`~forkvm.OutputEvent` chunks and a final :class:`~forkvm.ExitEvent`.

        ::

            async for event in sb.exec_stream(["python3", "train.py"]):
                if event.type == "stdout":
                    print(event.text, end="")
        """
        return self.client.exec_stream(
            self.id, cmd, stdin=stdin, env=env, cwd=cwd, user=user, timeout_ms=_ops.seconds_to_ms(timeout)
        )

    async def logs(self) -> str:
        """The serial console (the last 1 MiB)."""
        return await self.client.logs(self.id)

    # -- snapshots and branches -------------------------------------------

    async def snapshot(self, tag: Optional[str] = None) -> "AsyncSnapshot":
        """Snapshot the sandbox now; it keeps running."""
        return AsyncSnapshot._wrap(self.client, await self.client.snapshot_sandbox(self.id, tag=tag))

    async def branch(
        self,
        mode: Union[models.BranchMode, str, None] = None,
        *,
        count: Optional[int] = None,
        tag: Optional[str] = None,
        wait: bool = True,
        ports: Optional[Iterable[PortSpec]] = None,
        wait_for_network: Optional[bool] = None,
        limits: Optional[LimitsSpec] = None,
        timeout: Optional[int] = None,
    ) -> "AsyncBranch":
        """Snapshot the sandbox at this instant and spawn ``count`` children from it.

        ``mode`` is ``"live"`` (the daemon's default: shortest pause),
        ``"diff"`` or ``"full"``; ``count`` defaults to 1. The sandbox keeps
        running. With ``wait=False`` the call returns once the source has
        resumed: the snapshot is still ``writing`` and ``children`` is empty;
        :meth:`AsyncBranch.wait` waits for them.

        Children keep the source's network mode and egress allow-list. Each
        publishes ``ports`` (as for :class:`AsyncSandbox`), by default the
        source's guest ports on host ports of its own. They inherit its
        :attr:`limits`, with the fields given in ``limits`` replaced, and
        its timeout unless ``timeout`` (seconds, from each child's start) is given.
        """
        result = await self.client.branch_sandbox(
            self.id,
            mode=mode,
            count=count,
            tag=tag,
            wait=None if wait else False,
            ports=ports,
            wait_for_network=wait_for_network,
            limits=limits,
            timeout=timeout,
        )
        return AsyncBranch._from_result(self.client, result, count)

    # -- lifetime ----------------------------------------------------------

    async def set_timeout(
        self, timeout: Optional[int], on_timeout: Union[models.OnTimeout, str, None] = None
    ) -> "AsyncSandbox":
        """Remove it (or with ``on_timeout="pause"``, pause it) ``timeout`` seconds from now.

        ``None`` removes the timeout. See :attr:`lifetime`.
        """
        self._info = await self.client.set_timeout(self.id, timeout, on_timeout=on_timeout)
        return self

    async def pause(self, memory: Optional[bool] = None) -> "AsyncSandbox":
        """Save it to disk and free its RAM and QEMU; :attr:`state` becomes ``paused``.

        ``info.paused`` says what was stored. Its timeout stops counting.
        ``memory=False`` keeps only the disk: the resume cold-boots from it.
        """
        self._info = await self.client.pause(self.id, memory=memory)
        return self

    async def resume(self, timeout: Optional[int] = None, memory: Optional[bool] = None) -> "AsyncSandbox":
        """Bring it back from :meth:`pause`, with the same id, memory, processes and network.

        ``timeout`` sets a new timeout in seconds; without it the sandbox
        gets the time it had left. ``memory=False`` cold-boots from the saved
        disk instead (a filesystem-only pause always resumes that way).
        """
        self._info = await self.client.resume(self.id, timeout=timeout, memory=memory)
        return self

    async def close(self) -> None:
        """Remove the sandbox (stop QEMU, delete its files). Safe to call twice."""
        if self._closed or self._info is None:
            return
        try:
            await self.client.delete_sandbox(self.id)
        except NotFound:
            pass
        self._closed = True

    delete = close

    async def __aenter__(self) -> "AsyncSandbox":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
