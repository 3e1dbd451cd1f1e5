"""The low-level client: one method per API operation.

Each method of :class:`AsyncClient` is named after an ``operationId`` of the
daemon's OpenAPI document, takes the path parameters positionally and the
body fields as keyword arguments, and returns the typed model of the answer::

    from forkvm import AsyncClient

    async with AsyncClient() as api:            # FORKVM_URL, or the local socket
        sb = await api.create_sandbox(memory_mib=256)
        print((await api.exec(sb.id, ["uname", "-a"])).stdout)
        await api.delete_sandbox(sb.id)

Errors are raised as :class:`~forkvm.ForkvmError` subclasses. For the
object-oriented interface, see :class:`forkvm.AsyncSandbox`. The blocking and
the asyncio flavours are one code: ``sdk/python/scripts/unasync.py`` writes
the blocking module from the asyncio one.
"""

from __future__ import annotations

import asyncio  # async-only
import os
from typing import Any, AsyncIterator, Iterable, List, Mapping, Optional, Sequence, Type, Union

import httpx

from . import _images, _ops, _transfer, models
from ._base import _CHUNK, TimeoutTypes, _BaseClient, _streaming_refused
from ._async_events import AsyncEventStream
from ._async_proc_client import AsyncProcessOps
from ._default import default_async_client
from ._images import ImageEventCallback
from ._ops import EgressSpec, LimitsSpec, PortSpec
from ._transfer import R, TransferEventCallback
from ._volume_models import VolumeSpec
from .errors import error_from_response
from .streaming import AsyncExecStream, _is_json

# After .streaming, which loads this module at its end (they import each other).
from ._async_stream import _settle  # noqa: E402, I001

__all__ = ["AsyncClient", "default_async_client"]


class AsyncClient(_BaseClient, AsyncProcessOps):
    """A connection to a forkvm daemon.

    ``url`` and ``token`` default to ``FORKVM_URL`` and ``FORKVM_TOKEN``; with
    neither, the client uses the unix socket ``$FORKVM_HOME/forkvm.sock``.
    ``timeout`` (seconds or an :class:`httpx.Timeout`) applies to every
    request but exec, which waits as long as the command may run.

    The background process and filesystem operations (``start_process``,
    ``attach_process``, ``stat_file``, ``watch_dir``, ``download_archive``...)
    come from :class:`~forkvm._async_proc_client.AsyncProcessOps`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: TimeoutTypes = None,
    ) -> None:
        kwargs = self._httpx_kwargs(url, token, timeout)
        transport = httpx.AsyncHTTPTransport(uds=self.endpoint.uds) if self.endpoint.uds else None
        self._http = httpx.AsyncClient(transport=transport, **kwargs)

    # -- plumbing ----------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    @property
    def is_closed(self) -> bool:
        return self._http.is_closed

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _chunks(self, body: bytes) -> AsyncIterator[bytes]:
        view = memoryview(body)
        for start in range(0, len(body), _CHUNK):
            yield bytes(view[start : start + _CHUNK])

    async def _file_chunks(self, path: str) -> AsyncIterator[bytes]:
        with open(path, "rb") as f:
            while True:
                chunk = await asyncio.to_thread(f.read, _CHUNK)  # async-only
                # sync-only: chunk = f.read(_CHUNK)
                if not chunk:
                    return
                yield chunk

    def _build(self, request: _ops.Request) -> httpx.Request:
        return self._http.build_request(
            request.method,
            request.path,
            timeout=request.timeout if request.timeout is not None else httpx.USE_CLIENT_DEFAULT,
            **self._request_kwargs(request),
        )

    async def _send(self, request: _ops.Request) -> Any:
        try:
            response = await self._http.send(self._build(request))
        except httpx.TransportError as e:
            raise self._transport_error(request, e) from e
        return self._finish(request, response)

    async def _open_stream(self, request: _ops.Request) -> httpx.Response:
        try:
            response = await self._http.send(self._build(request), stream=True)
        except httpx.TransportError as e:
            raise self._transport_error(request, e) from e
        if response.is_error:
            try:
                await response.aread()
            finally:
                await response.aclose()
            raise _streaming_refused(error_from_response(response))
        return response

    async def _image_stream(self, request: _ops.Request, on_event: Optional[ImageEventCallback]) -> models.Image:
        """Send an image operation and read its progress stream to the image (see :mod:`forkvm._images`)."""
        response = await self._open_stream(request)
        try:
            if _is_json(response):  # the image itself, from a daemon that did not stream
                await response.aread()
                return _ops._model(models.Image)(response)
            async for line in response.aiter_lines():
                event = _images.parse_image_event(line)
                if event is None:
                    continue
                if on_event is not None:
                    await _settle(on_event(event))
                image = _images.image_outcome(event)
                if image is not None:
                    return image
            raise _images.stream_ended()
        finally:
            await response.aclose()

    async def _transfer_stream(
        self, request: _ops.Request, result_type: Type[R], on_event: Optional[TransferEventCallback]
    ) -> R:
        """Send a push or a pull and read its progress stream to its result (see :mod:`forkvm._transfer`)."""
        response = await self._open_stream(request)
        try:
            if _is_json(response):  # the result itself, from a daemon that did not stream
                await response.aread()
                return _ops._model(result_type)(response)
            async for line in response.aiter_lines():
                event = _transfer.parse_transfer_event(line)
                if event is None:
                    continue
                if on_event is not None:
                    await _settle(on_event(event))
                result = _transfer.transfer_outcome(event, result_type)
                if result is not None:
                    return result
            raise _transfer.stream_ended(result_type)
        finally:
            await response.aclose()

    # -- daemon ------------------------------------------------------------

    async def health(self) -> models.Health:
        """``GET /v1/health``: liveness."""
        return await self._send(_ops.health())

    async def info(self) -> models.Info:
        """``GET /v1/info``: version, accelerator, QEMU, limits, images, pools, networking, capacity."""
        return await self._send(_ops.info())

    async def metrics(self) -> str:
        """``GET /metrics``: the daemon's Prometheus metrics, as text (``forkvm_spawns_total``, ...)."""
        return await self._send(_ops.metrics())

    async def events(self, *, last_event_id: Optional[int] = None) -> AsyncEventStream:
        """``GET /v1/events``: the daemon's changes as they happen (docs/events.md).

        Returns once the stream's ``ready`` message came, with the stream
        open (:attr:`~forkvm.AsyncEventStream.ready_seq` set); iterate it
        for :class:`~forkvm.models.Event` s and close it when done (or use it
        as a context manager). ``last_event_id`` (an event's ``seq``) resumes
        after that event: the daemon first sends the later ones it kept (the
        last 1,024), or an Event of kind ``reset`` when some are gone.
        """
        return await AsyncEventStream(self, _ops.events(last_event_id)).open()

    # -- sandboxes ---------------------------------------------------------

    async def list_sandboxes(self, *, metadata: Optional[Mapping[str, str]] = None) -> models.SandboxList:
        """``GET /v1/sandboxes``: all sandboxes, in any state.

        With ``metadata`` (``{"team": "a"}``: ``?metadata.team=a``), only
        those that have every given pair.
        """
        return await self._send(_ops.list_sandboxes(metadata))

    async def create_sandbox(
        self,
        *,
        image: Optional[str] = None,
        memory_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        snapshot: Optional[str] = None,
        count: Optional[int] = None,
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
    ) -> Union[models.Sandbox, models.SandboxBatch]:
        """``POST /v1/sandboxes``: start a sandbox, or ``count`` of them.

        Returns a :class:`~forkvm.models.Sandbox`, or a
        :class:`~forkvm.models.SandboxBatch` when ``count`` is given.

        ``network`` is ``"nat"`` (the daemon's default where the host allows
        it) or ``"none"``. ``ports`` publishes guest TCP ports on host
        loopback ports: ``[8000]``, ``[(8000, 18000)]`` or
        ``[{"guest": 8000, "host": 18000}]`` (host 0 or omitted: allocated;
        see ``network.ports`` of the answer). ``egress`` allows connections
        only to these destinations: ``["10.0.0.0/8", {"cidr": "1.2.3.4",
        "ports": [443]}]``. Both need ``nat``. The allow-list never opens the
        host itself unless ``allow_host=True`` (which needs ``egress``).
        ``wait_for_network=False``
        answers before the guest's network is proven to work. ``disk_size``
        (bytes) gives the sandbox a root disk larger than its image's.

        ``metadata`` labels the sandbox (see :meth:`list_sandboxes`); ``env``
        is the default environment of every exec in it (an exec's own ``env``
        wins). ``timeout`` (seconds, 1 to 2,592,000) removes it when it runs
        out, or pauses it with ``on_timeout="pause"``.

        ``limits`` (a :class:`~forkvm.models.SandboxLimits` or a mapping of
        its fields, e.g. ``{"disk_iops": 100, "net_kbps": 10000}``) bounds
        its resources; a branch's children inherit them.

        ``volumes`` mounts host directories and named volumes
        (docs/volumes.md), each a :class:`~forkvm.models.VolumeMount`, its
        fields as a dict, or the CLI string ``"SOURCE:GUEST_PATH[:OPTIONS]"``
        (``["/srv/repo:/work:ro", "data:/data:copy"]``). A snapshot taken
        with volumes fixes them: its clones get the same ones.
        """
        body = _ops.create_request(
            image=image,
            memory_mib=memory_mib,
            cpus=cpus,
            snapshot=snapshot,
            count=count,
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
        return await self._send(_ops.create_sandbox(body))

    async def get_sandbox(self, id: str) -> models.Sandbox:
        """``GET /v1/sandboxes/{id}``: one sandbox, with its memory use."""
        return await self._send(_ops.get_sandbox(id))

    async def delete_sandbox(self, id: str) -> None:
        """``DELETE /v1/sandboxes/{id}``: stop it and delete everything it had."""
        await self._send(_ops.delete_sandbox(id))

    async def set_timeout(
        self, id: str, timeout: Optional[int], *, on_timeout: Union[models.OnTimeout, str, None] = None
    ) -> models.Sandbox:
        """``PUT /v1/sandboxes/{id}/timeout``: a new timeout in seconds, counted from now.

        ``None`` removes the timeout. ``on_timeout`` (``"kill"`` or
        ``"pause"``) also changes what happens when it runs out. On a paused
        sandbox it is the time the sandbox will have once resumed.
        """
        body = models.SetTimeout(timeout=timeout, on_timeout=_ops.on_timeout_mode(on_timeout))
        return await self._send(_ops.set_timeout(id, body))

    async def set_network(
        self,
        id: str,
        *,
        egress: Optional[Iterable[EgressSpec]] = None,
        allow_host: Optional[bool] = None,
    ) -> models.NetworkInfo:
        """``PUT /v1/sandboxes/{id}/network``: replace a running sandbox's egress allow-list, in place.

        ``egress`` ``None`` lets it reach anything (but the host and other
        sandboxes); a list of rules, as ``create``'s ``egress`` takes them,
        allows only those destinations. ``allow_host=True`` applies the entries
        to the host too. New connections follow the new list at once;
        established ones are kept. The answer is the sandbox's network.
        """
        body = models.SetNetwork(egress=_ops.egress_rules(egress), allow_host=allow_host)
        return await self._send(_ops.set_network(id, body))

    async def pause(self, id: str, *, memory: Optional[bool] = None) -> models.Sandbox:
        """``POST /v1/sandboxes/{id}/pause``: save a running sandbox to disk and free its RAM and QEMU.

        The answer is the sandbox, ``paused``, with ``paused`` saying what was stored.
        ``memory=False`` keeps only the disk: the resume cold-boots from it.
        """
        body = models.PauseRequest(memory=memory) if memory is not None else None
        return await self._send(_ops.pause(id, body))

    async def resume(
        self, id: str, *, timeout: Optional[int] = None, memory: Optional[bool] = None
    ) -> models.Sandbox:
        """``POST /v1/sandboxes/{id}/resume``: bring a paused sandbox back, ``running``, with the same id.

        ``timeout`` sets a new timeout (seconds from now); without it the
        sandbox gets the time it had left (or, when its timeout paused it,
        its whole timeout again). ``memory=False`` cold-boots from the saved
        disk even when memory was saved.
        """
        return await self._send(_ops.resume(id, models.ResumeRequest(timeout=timeout, memory=memory)))

    # -- time travel (docs/timetravel.md) ----------------------------------

    async def checkpoint(self, id: str, *, tag: Optional[str] = None) -> models.Checkpoint:
        """``POST /v1/sandboxes/{id}/checkpoints``: save a running sandbox as the next step of its timeline.

        It stores only what changed since the previous checkpoint and the
        guest stops only for the last copy pass; it keeps running. ``tag``
        names it (unique); tagged checkpoints are never pruned. The
        sandbox's retention policy is applied afterwards.
        """
        return await self._send(_ops.checkpoint(id, models.CheckpointRequest(tag=tag)))

    async def get_timeline(self, id: str) -> models.Timeline:
        """``GET /v1/sandboxes/{id}/timeline``: its kept checkpoints, oldest first, and its retention."""
        return await self._send(_ops.get_timeline(id))

    async def set_retention(
        self, id: str, *, keep_last: Optional[int] = None, keep_every: Optional[int] = None
    ) -> models.Timeline:
        """``PUT /v1/sandboxes/{id}/timeline/retention``: how many checkpoints to keep; prunes now.

        ``keep_last`` N (``None``: all) and also every ``keep_every``-th by
        step number; tagged ones and the newest are always kept. The policy
        replaces the previous one. The answer is the pruned timeline.
        """
        return await self._send(_ops.set_retention(id, models.Retention(keep_last=keep_last, keep_every=keep_every)))

    async def rewind(self, id: str, to: str, *, checkpoint_first: Optional[bool] = None) -> models.Rewound:
        """``POST /v1/sandboxes/{id}/rewind``: bring a running sandbox back to a checkpoint, as the same sandbox.

        ``to`` is one of its checkpoints or a snapshot of its lineage (id or
        tag). Same id, metadata, network and ports; the memory, processes
        and disk of ``to``. ``checkpoint_first=True`` saves the present
        first (``undo`` in the answer), so the rewind can be undone.
        """
        return await self._send(_ops.rewind(id, models.RewindRequest(to=to, checkpoint_first=checkpoint_first)))

    async def diff(
        self, id: str, *, b: str, path: Optional[str] = None, text: Optional[bool] = None
    ) -> models.Diff:
        """``POST /v1/diff/{id}``: the filesystem differences between ``id`` and ``b``.

        Either side is a sandbox, a snapshot or a checkpoint (id or tag), of
        one lineage. Added, deleted, modified paths, mode and type changes,
        sorted by path, under ``path`` (absolute; default ``/`` without
        /proc, /sys, /dev and /run). ``text=True`` adds a unified diff of
        each text file (up to 1 MiB a side). Read through the guests: a
        snapshot through a temporary clone.
        """
        return await self._send(_ops.diff(id, models.DiffRequest(b=b, path=path, text=text)))

    async def merge(
        self,
        id: str,
        *,
        into: str,
        path: Optional[str] = None,
        strategy: Optional[Union[str, models.MergeStrategy]] = None,
        dry_run: Optional[bool] = None,
    ) -> models.Merged:
        """``POST /v1/sandboxes/{id}/merge``: apply sandbox ``id``'s file changes since its branch point to ``into``.

        Three-way against the branch point: a path both changed differently
        is a conflict, and a merge with any is refused whole with
        :class:`~forkvm.Conflict` (its message lists them) unless
        ``strategy`` (``"ours"``, ``"theirs"`` or ``"text"``) settles them.
        ``dry_run=True`` changes nothing and lists the conflicts in the
        answer. Memory is not merged: processes of ``into`` keep what they
        had read.
        """
        req = models.MergeRequest(
            into=into, path=path, strategy=models.MergeStrategy(strategy) if strategy else None, dry_run=dry_run
        )
        return await self._send(_ops.merge(id, req))

    async def branch_sandbox(
        self,
        id: str,
        *,
        mode: Union[models.BranchMode, str, None] = None,
        count: Optional[int] = None,
        tag: Optional[str] = None,
        wait: Optional[bool] = None,
        ports: Optional[Iterable[PortSpec]] = None,
        wait_for_network: Optional[bool] = None,
        limits: Optional[LimitsSpec] = None,
        timeout: Optional[int] = None,
    ) -> models.BranchResult:
        """``POST /v1/sandboxes/{id}/branch``: snapshot it now and spawn ``count`` children.

        Each child publishes ``ports`` (as for :meth:`create_sandbox`);
        without them, the source's guest ports on newly allocated host ports.
        Children keep the source's network mode and egress allow-list, and
        its limits with the fields of ``limits`` replaced. ``timeout`` (seconds,
        from each child's start) replaces the source's timeout for the children.
        """
        body = _ops.branch_request(
            mode=mode,
            count=count,
            tag=tag,
            wait=wait,
            ports=ports,
            wait_for_network=wait_for_network,
            limits=limits,
            timeout=timeout,
        )
        return await self._send(_ops.branch_sandbox(id, body))

    async def exec(
        self,
        id: str,
        argv: Union[str, Sequence[str], None] = None,
        *,
        cmd: Optional[Sequence[str]] = None,
        entrypoint: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        stdin_base64: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        encoding: Union[models.OutputEncoding, str, None] = None,
    ) -> models.ExecResult:
        """``POST /v1/sandboxes/{id}/exec``: run a command and wait for it.

        ``argv`` is a list, or a string run with ``sh -c``; an empty list runs
        the image's default command (its ``Entrypoint`` and ``Cmd``). Instead
        of ``argv``, ``cmd`` and ``entrypoint`` follow ``docker run
        [--entrypoint E] IMAGE ARGS``: ``cmd`` replaces the image's ``Cmd``
        after its ``Entrypoint``, ``entrypoint`` replaces the ``Entrypoint``
        (``[]``: none) and drops the ``Cmd``. ``user`` is ``name``, ``uid``,
        ``name:group`` or ``uid:gid`` (default: the image's ``User``, else
        root). Bytes ``stdin`` is sent as ``stdin_base64``.
        """
        body = _ops.exec_request(
            argv,
            cmd=cmd,
            entrypoint=entrypoint,
            env=env,
            cwd=cwd,
            user=user,
            stdin=stdin,
            stdin_base64=stdin_base64,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            encoding=encoding,
        )
        return await self._send(_ops.exec_(id, body))

    def exec_stream(
        self,
        id: str,
        argv: Union[str, Sequence[str]],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        stdin_base64: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> AsyncExecStream:
        """``POST /v1/sandboxes/{id}/exec`` with ``"stream": true``: iterate over output events.

        Raises :class:`~forkvm.StreamingUnsupported` (when iterated) against a
        daemon without streaming exec.
        """
        body = _ops.exec_request(
            argv, env=env, cwd=cwd, user=user, stdin=stdin, stdin_base64=stdin_base64, timeout_ms=timeout_ms
        )
        return AsyncExecStream(self, _ops.exec_stream(id, body))

    async def read_file(self, id: str, path: str) -> bytes:
        """``GET /v1/sandboxes/{id}/files?path=``: a guest file's bytes."""
        return await self._send(_ops.read_file(id, path))

    async def write_file(
        self, id: str, path: str, data: Union[bytes, str], *, mode: Union[int, str, None] = None
    ) -> models.FileWritten:
        """``PUT /v1/sandboxes/{id}/files?path=&mode=``: write a guest file atomically.

        ``mode`` is an int (``0o755``) or an octal string (``"755"``); default 644.
        """
        return await self._send(_ops.write_file(id, path, data, mode))

    async def logs(self, id: str) -> str:
        """``GET /v1/sandboxes/{id}/logs``: the serial console (the last 1 MiB)."""
        return await self._send(_ops.logs(id))

    async def ports(self, id: str) -> List[models.PortForward]:
        """``GET /v1/sandboxes/{id}/ports``: its published ports, guest port and host loopback port.

        Empty for a sandbox without a ``nat`` network.
        """
        return await self._send(_ops.ports(id))

    async def snapshot_sandbox(self, id: str, *, tag: Optional[str] = None) -> models.Snapshot:
        """``POST /v1/sandboxes/{id}/snapshot``: snapshot a running sandbox; it keeps running."""
        return await self._send(_ops.snapshot_sandbox(id, models.CreateSnapshot(tag)))

    # -- snapshots ---------------------------------------------------------

    async def list_snapshots(self) -> models.SnapshotList:
        """``GET /v1/snapshots``: all snapshots."""
        return await self._send(_ops.list_snapshots())

    async def get_snapshot(self, id: str) -> models.Snapshot:
        """``GET /v1/snapshots/{id}``: one snapshot, by id or tag."""
        return await self._send(_ops.get_snapshot(id))

    async def delete_snapshot(self, id: str, *, force: bool = False) -> None:
        """``DELETE /v1/snapshots/{id}``: 409 while others depend on it, unless ``force``."""
        await self._send(_ops.delete_snapshot(id, force))

    async def flatten_snapshot(self, id: str, *, tag: Optional[str] = None) -> models.Snapshot:
        """``POST /v1/snapshots/{id}/flatten``: merge a diff chain into one standalone snapshot."""
        return await self._send(_ops.flatten_snapshot(id, models.FlattenRequest(tag)))

    async def set_pool(self, id: str, size: Optional[int]) -> models.Snapshot:
        """``PUT /v1/snapshots/{id}/pool``: keep ``size`` QEMU processes waiting (0: off;
        ``None``: follow the daemon's default, ``serve --pool-size``)."""
        return await self._send(_ops.set_pool(id, models.PoolConfig(size)))

    async def pin_snapshot(self, id: str) -> models.Snapshot:
        """``PUT /v1/snapshots/{id}/pin``: garbage collection keeps it and what it builds on."""
        return await self._send(_ops.pin_snapshot(id))

    async def unpin_snapshot(self, id: str) -> models.Snapshot:
        """``DELETE /v1/snapshots/{id}/pin``: garbage collection may take it once nothing needs it."""
        return await self._send(_ops.unpin_snapshot(id))

    async def prune_snapshots(self, *, all: Optional[bool] = None, dry_run: Optional[bool] = None) -> models.PruneResult:
        """``POST /v1/snapshots/prune``: remove the branch points nothing needs, past the grace
        period (or however young, with ``all``); ``dry_run`` only lists them."""
        return await self._send(_ops.prune_snapshots(models.PruneRequest(all=all, dry_run=dry_run)))

    async def push_snapshot(
        self,
        id: str,
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        insecure: Optional[bool] = None,
        on_event: Optional[TransferEventCallback] = None,
    ) -> models.PushResult:
        """``POST /v1/snapshots/{id}/push`` (streamed): push a snapshot, its chain and base image to a registry.

        ``id`` is the snapshot's id or tag. ``reference`` says where to:
        ``host[:port]/repo[:tag]`` (the tag defaults to ``latest``), e.g.
        ``127.0.0.1:5000/team/warm:v1``. ``username`` and ``password``
        (give both) log in to the registry; without them the daemon uses its
        host's ``~/.docker/config.json``, else pushes anonymously.
        ``insecure`` speaks plain HTTP to a registry that is not on loopback
        (loopback registries always may). What the registry already has is
        not sent again.

        ``on_event`` is called with each :class:`~forkvm.models.TransferEvent`
        of the progress stream (phases, bytes per file, cached links, the
        last ``pushed`` or ``error``). Returns the
        :class:`~forkvm.models.PushResult`; a failure is raised as its
        :class:`~forkvm.ForkvmError` subclass (:class:`~forkvm.NotFound` for
        no such snapshot, :class:`~forkvm.RegistryAuthFailed`,
        :class:`~forkvm.RegistryUnreachable`...).
        """
        body = models.PushSnapshot(reference=reference, username=username, password=password, insecure=insecure)
        return await self._transfer_stream(_ops.push_snapshot(id, body), models.PushResult, on_event)

    async def pull_snapshot(
        self,
        reference: str,
        *,
        tag: Optional[str] = None,
        username: Optional[str] = None,
        password: Optional[str] = None,
        insecure: Optional[bool] = None,
        on_event: Optional[TransferEventCallback] = None,
    ) -> models.PullResult:
        """``POST /v1/snapshots/pull`` (streamed): pull a pushed snapshot and publish it on this host.

        ``reference`` is ``host[:port]/repo[:tag]``, or
        ``host[:port]/repo@sha256:<digest>`` for exactly one push (its
        :attr:`~forkvm.models.PushResult.digest`). ``tag`` tags the pulled
        snapshot here (its ancestors get none). The credentials and
        ``insecure`` are those of :meth:`push_snapshot`. Only the links and
        the image this host lacks are fetched; every blob is verified, and
        nothing is written unless this host can restore the snapshot.

        ``on_event`` sees the progress as for :meth:`push_snapshot` (the
        last event ``pulled`` or ``error``). Returns the
        :class:`~forkvm.models.PullResult`, whose ``snapshot`` can be spawned
        from at once. Raises :class:`~forkvm.ImageNotFound` when the
        registry has no such repository, tag or digest,
        :class:`~forkvm.Conflict` when ``tag`` is taken here,
        :class:`~forkvm.IncompatibleSnapshot` when this host cannot restore
        it, :class:`~forkvm.InvalidImage` when a blob fails verification,
        and :class:`~forkvm.RegistryAuthFailed` or
        :class:`~forkvm.RegistryUnreachable` for registry trouble.
        """
        body = models.PullSnapshot(
            reference=reference, tag=tag, username=username, password=password, insecure=insecure
        )
        return await self._transfer_stream(_ops.pull_snapshot(body), models.PullResult, on_event)

    # -- volumes -----------------------------------------------------------

    async def list_volumes(self) -> models.VolumeList:
        """``GET /v1/volumes``: the named volumes, with the sandboxes that mount each."""
        return await self._send(_ops.list_volumes())

    async def create_volume(self, name: str) -> models.Volume:
        """``POST /v1/volumes``: create the named volume ``name`` (an empty directory under the daemon's home).

        ``name`` is 1 to 64 letters, digits, ``.``, ``_`` or ``-``, not
        starting with ``.`` or ``-``. Raises :class:`~forkvm.Conflict` when it
        exists.
        """
        return await self._send(_ops.create_volume(models.CreateVolume(name=name)))

    async def delete_volume(self, name: str) -> None:
        """``DELETE /v1/volumes/{name}``: remove a named volume and its files.

        Raises :class:`~forkvm.Conflict` while a sandbox mounts it, and
        :class:`~forkvm.NotFound` when there is none.
        """
        await self._send(_ops.delete_volume(name))

    # -- images ------------------------------------------------------------

    async def list_images(self) -> models.ImageList:
        """``GET /v1/images``: the installed images."""
        return await self._send(_ops.list_images())

    async def get_image(self, name: str) -> models.Image:
        """``GET /v1/images/{name}``: one image, with the sandboxes and snapshots that use it."""
        return await self._send(_ops.get_image(name))

    async def delete_image(self, name: str) -> None:
        """``DELETE /v1/images/{name}``: remove an image and its boot templates.

        Raises :class:`~forkvm.Conflict` (naming them) while sandboxes or
        snapshots use it.
        """
        await self._send(_ops.delete_image(name))

    async def pull_image(
        self,
        reference: str,
        *,
        name: Optional[str] = None,
        username: Optional[str] = None,
        password: Optional[str] = None,
        insecure: Optional[bool] = None,
        disk_size: Optional[int] = None,
        replace: Optional[bool] = None,
        start: Union[models.StartCommand, Mapping[str, Any], Sequence[str], None] = None,
        on_event: Optional[ImageEventCallback] = None,
    ) -> models.Image:
        """``POST /v1/images`` (streamed): pull ``reference`` from an OCI registry and return the image.

        ``on_event`` is called with each :class:`~forkvm.models.ImageEvent`
        of the progress stream (phases, bytes per blob, the last ``done``
        or ``error``). A failure is raised as its
        :class:`~forkvm.ForkvmError` subclass (:class:`~forkvm.RegistryAuthFailed`,
        :class:`~forkvm.RegistryUnreachable`, :class:`~forkvm.InvalidImage`...).
        ``start`` is the command the image's boot template starts: a
        :class:`~forkvm.models.StartCommand`, its fields as a dict, or an argv.
        """
        body = models.PullImage(
            reference=reference,
            name=name,
            username=username,
            password=password,
            insecure=insecure,
            disk_size=disk_size,
            replace=replace,
            start=_images.start_command(start),
        )
        return await self._image_stream(_ops.pull_image(body), on_event)

    async def import_image(
        self,
        path: Union[str, "os.PathLike[str]"],
        name: str,
        *,
        disk_size: Optional[int] = None,
        replace: bool = False,
        on_event: Optional[ImageEventCallback] = None,
    ) -> models.Image:
        """``POST /v1/images/import``: install the archive at ``path`` as the image ``name``.

        ``path`` is a ``docker save`` tar, an OCI image layout (a tar, or a
        directory, which is packed into a temporary tar first) or a root
        filesystem tarball (plain, gzip or zstd); a file is streamed from
        disk. ``disk_size`` is the root filesystem's size in bytes (default:
        its content plus room); ``replace`` replaces an image of that name
        (else :class:`~forkvm.Conflict`). ``on_event`` sees the progress, as
        for :meth:`pull_image`.
        """
        query = _images.import_query(path, name, disk_size=disk_size, replace=replace)
        file, temporary = await asyncio.to_thread(_images.prepare_import, path)  # async-only
        # sync-only: file, temporary = _images.prepare_import(path)
        try:
            return await self._image_stream(_ops.import_image(query, file), on_event)
        finally:
            _images.remove_temporary(temporary)

    async def build_image(
        self,
        context: Union[str, "os.PathLike[str]"],
        tag: str,
        *,
        dockerfile: Union[str, "os.PathLike[str]", None] = None,
        build_args: Optional[Mapping[str, str]] = None,
        no_cache: bool = False,
        target: Optional[str] = None,
        disk_size: Optional[int] = None,
        memory_mib: Optional[int] = None,
        on_event: Optional[ImageEventCallback] = None,
    ) -> models.Image:
        """``POST /v1/images/build``: build the image ``tag`` from a Dockerfile.

        The directory ``context`` is packed into a temporary tar with the
        Dockerfile (default ``context/Dockerfile``; ``dockerfile`` is a path
        on this machine) and uploaded; the steps run in a sandbox of the
        base image. ``build_args`` are the ``ARG`` values, ``no_cache`` runs
        every step again, ``target`` builds that stage of a multi-stage
        Dockerfile, ``memory_mib`` sizes the build sandbox. A failed
        step raises :class:`~forkvm.BuildFailed` (its output came as ``log``
        events to ``on_event``).
        """
        query = _images.build_query(
            tag,
            build_args=build_args,
            no_cache=no_cache,
            target=target,
            disk_size=disk_size,
            memory_mib=memory_mib,
        )
        tar = await asyncio.to_thread(_images.prepare_build, context, dockerfile)  # async-only
        # sync-only: tar = _images.prepare_build(context, dockerfile)
        try:
            return await self._image_stream(_ops.build_image(query, tar), on_event)
        finally:
            _images.remove_temporary(tar)
