"""Fixtures: a real forkvm daemon for the whole session, and shared sandboxes.

Unless ``FORKVM_URL`` is set, the session starts its own daemon with the one
test launcher, ``$FORKVM_BIN serve --ephemeral`` (default binary
``<repo>/target/debug/forkvm``; tests/launch/forkvm_launch.py and
docs/testing.md): a temporary home linking the guest and each image of
``$FORKVM_IMAGES_HOME`` (default ``/var/lib/forkvm``), so images the tests
import land in that home; the unix socket, and TCP on a free port with a
random token. The daemon keeps running while the session holds its stdin:
at the end, or if pytest is killed, it removes every sandbox and its home.
With ``FORKVM_URL`` set, that daemon is used as it is (``FORKVM_TOKEN`` for
TCP), and only what the session added is removed.

Booting a VM costs seconds under TCG, so tests share sandboxes where they can.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Optional, Set

import pytest

import forkvm
from forkvm import Client, Sandbox

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "launch"))
import forkvm_launch  # noqa: E402
OPENAPI = Path(os.environ.get("FORKVM_OPENAPI", REPO / "docs" / "openapi.json"))


@dataclass
class Daemon:
    """The daemon under test."""

    url: str
    token: Optional[str]
    #: ``http://127.0.0.1:PORT`` when the daemon also serves TCP.
    tcp_url: Optional[str] = None
    #: The daemon process, when the session started it.
    process: Optional[subprocess.Popen] = None
    home: Optional[Path] = None
    launched: Optional["forkvm_launch.Launched"] = None

    @property
    def managed(self) -> bool:
        return self.process is not None

    def client(self, **kwargs) -> Client:
        return Client(self.url, self.token, **kwargs)

    def env(self) -> dict:
        """Environment for a subprocess that should talk to this daemon."""
        env = dict(os.environ, FORKVM_URL=self.url)
        if self.token:
            env["FORKVM_TOKEN"] = self.token
        return env

    def log(self) -> str:
        return self.launched.log(4000) if self.launched is not None else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_session(message: str) -> NoReturn:
    pytest.exit(message, returncode=2)


def _start_daemon(extra_env: Optional[dict] = None, abort: Callable[[str], NoReturn] = _exit_session) -> Daemon:
    """Start a daemon with the launcher (see the module's docstring).

    ``extra_env`` is added to its environment; ``abort`` is called with the
    reason when it cannot start (default: end the session; a test's own
    daemon passes ``pytest.fail``).
    """
    binary = Path(os.environ.get("FORKVM_BIN", REPO / "target" / "debug" / "forkvm"))
    if not binary.exists():
        abort(f"no forkvm binary at {binary}: build it (cargo build) or set FORKVM_BIN")
    images_home = Path(os.environ.get("FORKVM_IMAGES_HOME", "/var/lib/forkvm"))
    try:
        launched = forkvm_launch.launch(binary, env=extra_env, artifacts=images_home)
    except forkvm_launch.LaunchError as e:
        abort(str(e))
    return Daemon(
        url=f"unix://{launched.socket}",
        token=launched.token,
        tcp_url=launched.url,
        process=launched.process,
        home=launched.home,
        launched=launched,
    )


def _stop(daemon: Daemon) -> None:
    if daemon.launched is not None:
        problem = daemon.launched.stop()
        if problem:
            print(f"forkvm tests: {problem}")


def _cleanup(client: Client, sandboxes_before: Set[str], snapshots_before: Set[str]) -> None:
    """Remove the sandboxes and snapshots created since the session started."""
    for info in client.list_sandboxes().sandboxes:
        if info.id not in sandboxes_before:
            for _ in range(100):  # a sandbox still starting cannot be removed yet
                try:
                    client.delete_sandbox(info.id)
                    break
                except forkvm.NotFound:
                    break
                except forkvm.Conflict:
                    time.sleep(0.2)
    for snap in client.list_snapshots().snapshots:
        if snap.id not in snapshots_before and not snap.template:
            try:
                client.delete_snapshot(snap.id, force=True)
            except forkvm.ForkvmError:
                pass


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    url = os.environ.get("FORKVM_URL")
    if url:
        token = os.environ.get("FORKVM_TOKEN")
        d = Daemon(url=url, token=token, tcp_url=url if url.startswith("http") else None)
    else:
        d = _start_daemon()
    try:
        with d.client() as client:
            before_sb = set() if d.managed else {s.id for s in client.list_sandboxes().sandboxes}
            before_sn = set() if d.managed else {s.id for s in client.list_snapshots().snapshots}
            try:
                yield d
            finally:
                _cleanup(client, before_sb, before_sn)
    finally:
        _stop(d)


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


@pytest.fixture(scope="session")
def sandbox(client: Client) -> Iterator[Sandbox]:
    """One running sandbox shared by the tests that only run commands and files in it."""
    with Sandbox(client=client) as sb:
        yield sb


@pytest.fixture(scope="session")
def template(client: Client, sandbox: Sandbox) -> str:
    """The id of the default image's boot template (made by the first spawn)."""
    for snap in client.list_snapshots().snapshots:
        if snap.template and snap.image == "default" and snap.memory_mib == sandbox.info.memory_mib:
            return snap.id
    pytest.fail("no boot template after a spawn of the default image")


@pytest.fixture(scope="session")
def source(client: Client) -> Iterator[Sandbox]:
    """A sandbox that tests snapshot and branch (kept apart from ``sandbox``)."""
    with Sandbox(client=client) as sb:
        sb.exec("echo from-the-source > /root/marker", check=True)
        yield sb


@pytest.fixture
def fresh(client: Client) -> Iterator[Sandbox]:
    """A sandbox of the test's own (spawned from the boot template: under a second or two)."""
    with Sandbox(client=client) as sb:
        yield sb


@pytest.fixture
def tag() -> str:
    """A unique snapshot tag."""
    return f"pytest-{secrets.token_hex(4)}"
