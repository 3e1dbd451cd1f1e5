"""Fixtures: a real forkvm daemon for the whole session, and shared sandboxes.

Unless ``FORKVM_URL`` is set, the session starts its own daemon:

* the binary is ``$FORKVM_BIN`` (default ``<repo>/target/debug/forkvm``);
* its home is a temporary directory whose ``guest`` links to that of
  ``$FORKVM_IMAGES_HOME`` (default ``/var/lib/forkvm``), and whose own
  ``images`` directory links to each image there (images the tests import
  land in the temporary home, never in the shared directory);
* it serves the unix socket and, with a random token, TCP on a free port.

At the end, the sandboxes and snapshots the session created are removed and
the daemon is stopped by its PID. With ``FORKVM_URL`` set, that daemon is
used as it is (``FORKVM_TOKEN`` for TCP), and only what the session added is
removed.

Booting a VM costs seconds under TCG, so tests share sandboxes where they can.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Optional, Set

import pytest

import forkvm
from forkvm import Client, Sandbox

REPO = Path(__file__).resolve().parents[3]
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
        if self.home is None:
            return ""
        path = self.home / "pytest-daemon.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_session(message: str) -> NoReturn:
    pytest.exit(message, returncode=2)


def _start_daemon(extra_env: Optional[dict] = None, abort: Callable[[str], NoReturn] = _exit_session) -> Daemon:
    """Start a daemon in a home of its own (see the module's docstring).

    ``extra_env`` is added to its environment (e.g. ``FORKVM_NET_POOL`` for
    a second daemon, whose sandbox networks must not overlap the first's);
    ``abort`` is called with the reason when it cannot start (default: end
    the session; a test's own daemon passes ``pytest.fail``).
    """
    binary = Path(os.environ.get("FORKVM_BIN", REPO / "target" / "debug" / "forkvm"))
    if not binary.exists():
        abort(f"no forkvm binary at {binary}: build it (cargo build) or set FORKVM_BIN")
    images_home = Path(os.environ.get("FORKVM_IMAGES_HOME", "/var/lib/forkvm"))
    for sub in ("guest", "images"):
        if not (images_home / sub).is_dir():
            abort(f"{images_home / sub} is missing: run scripts/setup.sh or set FORKVM_IMAGES_HOME")

    home = Path(tempfile.mkdtemp(prefix="forkvm-pytest-"))
    (home / "guest").symlink_to(images_home / "guest")
    # Images: a directory of this daemon's own with the built ones linked in,
    # so that the images the tests import stay in its home.
    (home / "images").mkdir()
    for image in sorted((images_home / "images").iterdir()):
        if not image.name.startswith("."):
            (home / "images" / image.name).symlink_to(image)
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ, FORKVM_HOME=str(home), FORKVM_TOKEN=token, **(extra_env or {}))
    env.pop("FORKVM_URL", None)
    log = open(home / "pytest-daemon.log", "wb")
    process = subprocess.Popen(
        [str(binary), "serve", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    daemon = Daemon(
        url=f"unix://{home / 'forkvm.sock'}",
        token=token,
        tcp_url=f"http://127.0.0.1:{port}",
        process=process,
        home=home,
    )
    deadline = time.monotonic() + 60
    with daemon.client() as client:
        while True:
            if process.poll() is not None:
                log = daemon.log()
                _stop(daemon)
                abort(f"forkvm serve exited with {process.returncode}:\n{log}")
            try:
                client.health()
                break
            except forkvm.DaemonUnreachable:
                if time.monotonic() > deadline:
                    log = daemon.log()
                    _stop(daemon)
                    abort(f"forkvm serve did not answer within 60 s:\n{log}")
                time.sleep(0.1)
    return daemon


def _stop(daemon: Daemon) -> None:
    process = daemon.process
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    if daemon.home is not None:
        shutil.rmtree(daemon.home, ignore_errors=True)


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
