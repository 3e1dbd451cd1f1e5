"""The object interface: :class:`Sandbox`, :class:`Snapshot` and :class:`Branch`.

::

    from forkvm import Sandbox

    with Sandbox() as sb:                       # spawns the default image
        sb.files.write("/tmp/x.py", "print(6 * 7)")
        print(sb.exec("python3 /tmp/x.py").stdout)   # 42

        branch = sb.branch(count=3)             # three children, from this instant
        for child in branch.children:
            print(child.id, child.exec("hostname").stdout)
            child.close()

Every object talks to the daemon through a :class:`~forkvm.Client`: the one
passed as ``client=``, else the process-wide default built from
``FORKVM_URL``/``FORKVM_TOKEN`` (or the local socket).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Union

from . import _ops, models
from ._ops import EgressSpec, PortSpec
from .client import Client, default_client
from .errors import ClientTimeout, ForkvmError, NotFound, StreamingUnsupported
from .streaming import ExecStream, OutputCallback

__all__ = ["Sandbox", "Snapshot", "Branch", "SandboxFiles"]

Command = Union[str, Sequence[str]]


class SandboxFiles:
    """Files in a sandbox's guest: ``sb.files.read(path)``, ``sb.files.write(path, data)``."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def read(self, path: str) -> bytes:
        """The bytes of the guest file at the absolute ``path``."""
        return self._sandbox.client.read_file(self._sandbox.id, path)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The guest file at ``path``, decoded."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Union[bytes, str], mode: Union[int, str, None] = None) -> models.FileWritten:
        """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically.

        ``mode`` is an int such as ``0o755`` or an octal string; default 644.
        """
        return self._sandbox.client.write_file(self._sandbox.id, path, data, mode=mode)


class Sandbox:
    """A running microVM.

    ``Sandbox()`` spawns one from the default image and waits until its agent
    answers; ``image``, ``memory_mib`` and ``cpus`` choose another shape, and
    ``snapshot`` (an id or tag) spawns from a snapshot instead. Use it as a
    context manager, or call :meth:`close`, to remove it.

    Networking: ``network="none"`` gives the sandbox no way out (the default
    is ``"nat"`` where the host allows it); ``ports=[8000]`` publishes guest
    port 8000 on a free host loopback port (see :meth:`ports`), and
    ``ports=[(8000, 18000)]`` or ``[{"guest": 8000, "host": 18000}]`` on a
    given one; ``egress=["10.0.0.0/8", {"cidr": "1.2.3.4", "ports": [443]}]``
    allows connections only to those destinations.
    ``wait_for_network=False`` returns before the guest's network is proven
    to work.

    To wrap a sandbox that already exists, use :meth:`Sandbox.get`.
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
        wait_for_network: Optional[bool] = None,
        client: Optional[Client] = None,
    ) -> None:
        self._client = client or default_client()
        self._closed = False
        info = self._client.create_sandbox(
            image=image,
            memory_mib=memory_mib,
            cpus=cpus,
            snapshot=snapshot,
            use_template=use_template,
            network=network,
            ports=ports,
            egress=egress,
            wait_for_network=wait_for_network,
        )
        assert isinstance(info, models.Sandbox)
        self._info = info

    @classmethod
    def _wrap(cls, client: Client, info: models.Sandbox) -> "Sandbox":
        sandbox = cls.__new__(cls)
        sandbox._client = client
        sandbox._info = info
        sandbox._closed = False
        return sandbox

    @classmethod
    def get(cls, id: str, *, client: Optional[Client] = None) -> "Sandbox":
        """The existing sandbox ``id`` (raises :class:`~forkvm.NotFound`)."""
        client = client or default_client()
        return cls._wrap(client, client.get_sandbox(id))

    @classmethod
    def list(cls, *, client: Optional[Client] = None) -> List["Sandbox"]:
        """Every sandbox the daemon knows, in any state."""
        client = client or default_client()
        return [cls._wrap(client, info) for info in client.list_sandboxes().sandboxes]

    # -- state -------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def client(self) -> Client:
        return self._client

    @property
    def info(self) -> models.Sandbox:
        """The sandbox as last seen (see :meth:`refresh`)."""
        return self._info

    @property
    def state(self) -> Union[models.SandboxState, str]:
        return self._info.state

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    @property
    def files(self) -> SandboxFiles:
        return SandboxFiles(self)

    @property
    def network(self) -> Optional[models.NetworkInfo]:
        """Its network as last seen: mode, addresses, published ports (``None`` without a NIC)."""
        return self._info.network

    def refresh(self) -> models.Sandbox:
        """Fetch the sandbox again (with its memory use) and return it."""
        self._info = self._client.get_sandbox(self.id)
        return self._info

    def ports(self) -> List[models.PortForward]:
        """Its published ports: each ``guest`` port and the ``host`` port on 127.0.0.1 that reaches it.

        ::

            with Sandbox(ports=[8000]) as sb:
                (port,) = sb.ports()
                url = f"http://127.0.0.1:{port.host}/"
        """
        return self._client.ports(self.id)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.state}{' closed' if self._closed else ''}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    # -- commands ----------------------------------------------------------

    def exec(
        self,
        cmd: Command,
        *,
        stdin: Union[str, bytes, None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        encoding: Union[models.OutputEncoding, str, None] = None,
        max_output_bytes: Optional[int] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
    ) -> models.ExecResult:
        """Run ``cmd`` and wait for it.

        ``cmd`` is an argv list, or a string run with ``sh -c``. ``stdin`` is
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
                result = self.exec_stream(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout).collect(
                    on_stdout, on_stderr
                )
            except StreamingUnsupported:
                result = self._client.exec(self.id, cmd, stdin=stdin, env=env, cwd=cwd, timeout_ms=timeout_ms)
                if on_stdout is not None and result.stdout:
                    on_stdout(result.stdout)
                if on_stderr is not None and result.stderr:
                    on_stderr(result.stderr)
        else:
            result = self._client.exec(
                self.id,
                cmd,
                stdin=stdin,
                env=env,
                cwd=cwd,
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
        timeout: Optional[float] = None,
    ) -> ExecStream:
        """Run ``cmd``, yielding :class:`~forkvm.OutputEvent` chunks and a final :class:`~forkvm.ExitEvent`.

        ::

            for event in sb.exec_stream(["python3", "train.py"]):
                if event.type == "stdout":
                    print(event.text, end="")
        """
        return self._client.exec_stream(
            self.id, cmd, stdin=stdin, env=env, cwd=cwd, timeout_ms=_ops.seconds_to_ms(timeout)
        )

    def logs(self) -> str:
        """The serial console (the last 1 MiB)."""
        return self._client.logs(self.id)

    # -- snapshots and branches -------------------------------------------

    def snapshot(self, tag: Optional[str] = None) -> "Snapshot":
        """Snapshot the sandbox now; it keeps running."""
        return Snapshot._wrap(self._client, self._client.snapshot_sandbox(self.id, tag=tag))

    def branch(
        self,
        mode: Union[models.BranchMode, str, None] = None,
        *,
        count: Optional[int] = None,
        tag: Optional[str] = None,
        wait: bool = True,
        ports: Optional[Iterable[PortSpec]] = None,
        wait_for_network: Optional[bool] = None,
    ) -> "Branch":
        """Snapshot the sandbox at this instant and spawn ``count`` children from it.

        ``mode`` is ``"live"`` (the daemon's default: shortest pause),
        ``"diff"`` or ``"full"``; ``count`` defaults to 1. The sandbox keeps
        running. With ``wait=False`` the call returns once the source has
        resumed: the snapshot is still ``writing`` and ``children`` is empty;
        :meth:`Branch.wait` waits for them.

        Children keep the source's network mode and egress allow-list. Each
        publishes ``ports`` (as for :class:`Sandbox`), by default the
        source's guest ports on host ports of its own.
        """
        result = self._client.branch_sandbox(
            self.id,
            mode=mode,
            count=count,
            tag=tag,
            wait=None if wait else False,
            ports=ports,
            wait_for_network=wait_for_network,
        )
        return Branch._from_result(self._client, result, count)

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Remove the sandbox (stop QEMU, delete its files). Safe to call twice."""
        if self._closed:
            return
        try:
            self._client.delete_sandbox(self.id)
        except NotFound:
            pass
        self._closed = True

    delete = close

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Snapshot:
    """A snapshot: a frozen sandbox (memory, devices, disk) to spawn children from."""

    def __init__(self, ref: str, *, client: Optional[Client] = None) -> None:
        """The existing snapshot ``ref`` (an id or a tag)."""
        self._client = client or default_client()
        self._info = self._client.get_snapshot(ref)

    @classmethod
    def _wrap(cls, client: Client, info: models.Snapshot) -> "Snapshot":
        snapshot = cls.__new__(cls)
        snapshot._client = client
        snapshot._info = info
        return snapshot

    @classmethod
    def get(cls, ref: str, *, client: Optional[Client] = None) -> "Snapshot":
        """The existing snapshot ``ref`` (an id or a tag)."""
        return cls(ref, client=client)

    @classmethod
    def list(cls, *, client: Optional[Client] = None) -> List["Snapshot"]:
        """Every snapshot."""
        client = client or default_client()
        return [cls._wrap(client, info) for info in client.list_snapshots().snapshots]

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def tag(self) -> Optional[str]:
        return self._info.tag

    @property
    def client(self) -> Client:
        return self._client

    @property
    def info(self) -> models.Snapshot:
        """The snapshot as last seen (see :meth:`refresh`)."""
        return self._info

    def refresh(self) -> models.Snapshot:
        self._info = self._client.get_snapshot(self.id)
        return self._info

    def __repr__(self) -> str:
        tag = f" tag={self.tag!r}" if self.tag else ""
        return f"<Snapshot {self.id}{tag} {self._info.kind} {self._info.state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def spawn(
        self,
        count: int = 1,
        *,
        network: Union[models.NetworkMode, str, None] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        egress: Optional[Iterable[EgressSpec]] = None,
        wait_for_network: Optional[bool] = None,
    ) -> List[Sandbox]:
        """Spawn ``count`` sandboxes from this snapshot (all or nothing).

        The network arguments are those of :class:`Sandbox`; with ``count``
        above 1, published ports need host port 0 (one allocated for each).
        """
        batch = self._client.create_sandbox(
            snapshot=self.id,
            count=count,
            network=network,
            ports=ports,
            egress=egress,
            wait_for_network=wait_for_network,
        )
        assert isinstance(batch, models.SandboxBatch)
        return [Sandbox._wrap(self._client, info) for info in batch.sandboxes]

    def sandboxes(self) -> List[Sandbox]:
        """The sandboxes spawned from this snapshot that still exist."""
        out = []
        for id in self.refresh().sandboxes:
            try:
                out.append(Sandbox.get(id, client=self._client))
            except NotFound:
                pass
        return out

    def flatten(self, tag: Optional[str] = None) -> "Snapshot":
        """Merge this diff snapshot's chain into a new standalone snapshot."""
        return Snapshot._wrap(self._client, self._client.flatten_snapshot(self.id, tag=tag))

    def set_pool(self, size: Optional[int]) -> "Snapshot":
        """Keep ``size`` QEMU processes waiting for this snapshot (0 turns the pool off,
        ``None`` follows the daemon's default)."""
        self._info = self._client.set_pool(self.id, size)
        return self

    def pin(self) -> "Snapshot":
        """Keep it (and what it builds on) from garbage collection."""
        self._info = self._client.pin_snapshot(self.id)
        return self

    def unpin(self) -> "Snapshot":
        """Let garbage collection take it once nothing needs it."""
        self._info = self._client.unpin_snapshot(self.id)
        return self

    @property
    def pinned(self) -> bool:
        return self._info.pinned

    @classmethod
    def prune(cls, *, all: bool = False, dry_run: bool = False, client: Optional[Client] = None) -> models.PruneResult:
        """Remove the branch points nothing needs (see :meth:`forkvm.Client.prune_snapshots`)."""
        client = client or default_client()
        return client.prune_snapshots(all=all, dry_run=dry_run)

    def wait(self, timeout: float = 300.0, interval: float = 0.2) -> "Snapshot":
        """Wait until the snapshot is no longer ``writing`` (after ``branch(wait=False)``).

        Raises :class:`~forkvm.ForkvmError` if it ``failed``.
        """
        deadline = time.monotonic() + timeout
        while self.refresh().state == "writing":
            if time.monotonic() > deadline:
                raise ClientTimeout(f"snapshot {self.id} still writing after {timeout:g} s", code="client_timeout")
            time.sleep(interval)
        if self._info.state == "failed":
            raise ForkvmError(f"snapshot {self.id} failed: {self._info.failure}", code="snapshot_failed")
        return self

    def delete(self, force: bool = False) -> None:
        """Remove the snapshot; with ``force``, also what depends on it (else 409)."""
        self._client.delete_snapshot(self.id, force=force)


@dataclass
class Branch:
    """What :meth:`Sandbox.branch` returns: the snapshot of the branch point and the children."""

    snapshot: Snapshot
    children: List[Sandbox]
    result: models.BranchResult
    #: The ``count`` asked for (``None``: the daemon's default, 1).
    requested: Optional[int] = None

    @classmethod
    def _from_result(cls, client: Client, result: models.BranchResult, requested: Optional[int]) -> "Branch":
        return cls(
            snapshot=Snapshot._wrap(client, result.snapshot),
            children=[Sandbox._wrap(client, info) for info in result.children],
            result=result,
            requested=requested,
        )

    @property
    def mode(self) -> Union[models.BranchMode, str]:
        return self.result.mode

    @property
    def pause_ms(self) -> float:
        """How long the source's vCPUs were stopped."""
        return self.result.pause_ms

    @property
    def total_ms(self) -> float:
        return self.result.total_ms

    def wait(self, timeout: float = 300.0, interval: float = 0.2) -> "Branch":
        """After ``branch(wait=False)``: wait for the snapshot and its children, then fill :attr:`children`."""
        deadline = time.monotonic() + timeout
        self.snapshot.wait(timeout=timeout, interval=interval)
        want = 1 if self.requested is None else self.requested
        while len(self.snapshot.info.sandboxes) < want:
            if time.monotonic() > deadline:
                raise ClientTimeout(
                    f"{len(self.snapshot.info.sandboxes)} of {want} children of {self.snapshot.id} after {timeout:g} s",
                    code="client_timeout",
                )
            time.sleep(interval)
            self.snapshot.refresh()
        children = self.snapshot.sandboxes()
        for child in children:  # listed from the start of their spawn
            while child.state == "starting":
                if time.monotonic() > deadline:
                    raise ClientTimeout(f"child {child.id} still starting after {timeout:g} s", code="client_timeout")
                time.sleep(interval)
                try:
                    child.refresh()
                except NotFound as e:
                    raise ForkvmError(
                        f"child {child.id} of {self.snapshot.id} failed to spawn", code="spawn_failed"
                    ) from e
        self.children = children
        return self

    def close(self, keep: Sequence[Sandbox] = ()) -> None:
        """Remove the children, except those in ``keep``."""
        kept = {sb.id for sb in keep}
        for child in self.children:
            if child.id not in kept:
                child.close()
