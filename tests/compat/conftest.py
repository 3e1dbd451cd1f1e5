"""The daemon the compatibility suites drive, shared by the E2B and MCP suites.

These suites run in ``.venv-compat``, which holds the unmodified client SDKs
(``e2b``, ``mcp``) pinned in ``tests/compat/requirements.txt`` and not the
forkvm SDK, so the daemon is started and cleaned up over plain HTTP here.

The session starts one ``forkvm serve`` of its own:

* the binary is ``$FORKVM_BIN`` (default ``<repo>/target/debug/forkvm``);
* its home is a temporary directory whose ``guest`` links to that of
  ``$FORKVM_IMAGES_HOME`` (default ``/var/lib/forkvm``), with the images there
  linked in one by one (images a suite builds stay in the temporary home);
* it serves its unix socket and TCP on a free loopback port, behind a random
  token.

At the end every sandbox is removed and the daemon is stopped by its PID.
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
from typing import Iterator

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Daemon:
    """A running ``forkvm serve`` of this session."""

    binary: Path
    home: Path
    token: str
    #: ``http://127.0.0.1:PORT``: the TCP listener (REST, E2B, /mcp).
    url: str
    process: subprocess.Popen

    @property
    def socket(self) -> Path:
        return self.home / "forkvm.sock"

    def http(self) -> httpx.Client:
        """A client of the REST API over TCP, with the token."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=300
        )

    def env(self) -> dict:
        """Environment for a ``forkvm`` subprocess that should use this daemon."""
        return dict(os.environ, FORKVM_URL=f"unix://{self.socket}", FORKVM_HOME=str(self.home))

    def log(self) -> str:
        path = self.home / "daemon.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    binary = Path(os.environ.get("FORKVM_BIN", REPO / "target" / "debug" / "forkvm"))
    if not binary.exists():
        pytest.exit(f"no forkvm binary at {binary}: run cargo build or set FORKVM_BIN", returncode=2)
    images_home = Path(os.environ.get("FORKVM_IMAGES_HOME", "/var/lib/forkvm"))
    for sub in ("guest", "images"):
        if not (images_home / sub).is_dir():
            pytest.exit(f"{images_home / sub} is missing: run scripts/setup.sh", returncode=2)
    home = Path(tempfile.mkdtemp(prefix="forkvm-compat-"))
    (home / "guest").symlink_to(images_home / "guest")
    (home / "images").mkdir()
    for image in sorted((images_home / "images").iterdir()):
        if not image.name.startswith("."):
            (home / "images" / image.name).symlink_to(image)
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ, FORKVM_HOME=str(home), FORKVM_TOKEN=token)
    env.pop("FORKVM_URL", None)
    with open(home / "daemon.log", "wb") as log:
        process = subprocess.Popen(
            [str(binary), "serve", "--listen", f"127.0.0.1:{port}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    d = Daemon(binary=binary, home=home, token=token, url=f"http://127.0.0.1:{port}", process=process)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            log = d.log()
            shutil.rmtree(home, ignore_errors=True)
            pytest.exit(f"forkvm serve exited with {process.returncode}:\n{log}", returncode=2)
        try:
            if httpx.get(f"{d.url}/v1/health", headers={"Authorization": f"Bearer {token}"}, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            _stop(process)
            log = d.log()
            shutil.rmtree(home, ignore_errors=True)
            pytest.exit(f"forkvm serve did not answer within 60 s:\n{log}", returncode=2)
        time.sleep(0.1)
    try:
        yield d
    finally:
        try:
            with d.http() as http:
                for sb in http.get("/v1/sandboxes").json().get("sandboxes", []):
                    http.delete(f"/v1/sandboxes/{sb['id']}")
        except httpx.HTTPError:
            pass
        _stop(process)
        shutil.rmtree(home, ignore_errors=True)
